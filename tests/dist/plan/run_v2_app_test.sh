#!/usr/bin/env bash
# ConvNeXt V2 from the outside: `convnext_zero --model convnextv2_atto` on 2 CPU ranks at ZeRO stage 3 learns
# a synthetic 4-class set (its loss falls, eval top-1 well above chance) and ends cleanly, and its closing
# summary's planned peak is the measured one, as for V1 (run_plan_summary_tests.sh); again with activation
# checkpointing and drop path, whose GRN blocks the planner walks differently. Usage: run_v2_app_test.sh APP
# MPIEXEC
set -uo pipefail
app=$1
mpiexec=$2
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"

run() {  # run NAME ARGS...: 2 ranks, stage 3; checks the summary and that the run learned
  local name=$1; shift
  out=$(timeout 240 "${mpirun[@]}" -np 2 "$app" --no-progress --model convnextv2_atto --stage 3 --image-size 32 \
    --micro-batch 8 --steps 30 --lr 2e-3 --data synthetic:n=256,classes=4 --num-classes 4 \
    --log "$work/$name.jsonl" "$@" 2>&1) || fail "$name: exited $?: $out"
  line=$(grep "^done: " <<<"$out") || fail "$name: no summary: $out"
  [[ $line =~ peak\ memory\ ([0-9.]+\ MiB)\ per\ rank\ \(planned\ ([0-9.]+\ MiB)([^;]*)\; ]] ||
    fail "$name: no planned beside measured: $line"
  [[ ${BASH_REMATCH[1]} == "${BASH_REMATCH[2]}" && -z ${BASH_REMATCH[3]} ]] ||
    fail "$name: measured ${BASH_REMATCH[1]}, planned ${BASH_REMATCH[2]}${BASH_REMATCH[3]}"
  "$py" - "$work/$name.jsonl" <<'PY' || fail "$name: did not learn"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = [r["loss"] for r in recs if r.get("split") == "train"]
evals = [r for r in recs if r.get("split") == "eval"]
assert len(train) == 30, len(train)
first, last = sum(train[:5]) / 5, sum(train[-5:]) / 5
assert last < 0.8 * first, (first, last)
assert evals and evals[-1]["top1"] > 0.4, evals[-1:]  # chance is 0.25
print(f"loss {first:.3f} -> {last:.3f}, eval top1 {evals[-1]['top1']:.3f}")
PY
  echo "ok: $name: measured ${BASH_REMATCH[1]}, planned ${BASH_REMATCH[2]}"
}

run plain
run checkpointed --activation-checkpointing --drop-path 0.1
echo PASS
