#!/usr/bin/env bash
# --trace's timeline from the outside (issue 33 item 2). Usage: run_trace_tests.sh CASE APP MPIEXEC
#   stage2      2 ranks at stage 2, --trace-steps 2:3 of 5 steps with a checkpoint inside: check_trace.py
#               finds the Trace Event format, nesting per lane, steps 2-3 only, each step's span = the log's
#               step_time_s within 2%, and reduce-scatters overlapping backward
#   bad         --trace-steps 5:2, 0:1 and x, and an unwritable --trace FILE: a message naming the flag, exit 1
#   plot        2 ranks at stage 3, then scripts/plot_run.py --trace draws the traced step's lanes into a PNG
#   offload     2 ranks at stage 2 with --offload-optimizer: the offload worker's jobs on a lane of their own
set -uo pipefail
case_name=$1 app=$2 mpiexec=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
tiny_model 5
tiny+=(--micro-batch 8 --bucket-mb 0.01)

case $case_name in
stage2)
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --stage 2 --steps 5 --log "$work/run.jsonl" --trace "$work/t.json" \
    --trace-steps 2:3 --checkpoint-dir "$work/ck" --checkpoint-every 2 > "$work/out" 2>&1 ||
    { cat "$work/out"; fail "2-rank run failed"; }
  "$py" "$here/check_trace.py" "$work/t.json" "$work/run.jsonl" 2 3 2 --overlap || fail "trace"
  grep -q '"checkpoint save' "$work/t.json" || fail "the save at step 2 is not on the timeline"
  ls "$work" | grep -q 'rank' && fail "the ranks' parts were left behind: $(ls "$work")"
  echo "stage2: OK"
  ;;
bad)
  for steps in 5:2 0:1 x 3; do
    "$app" "${tiny[@]}" --steps 1 --trace "$work/t.json" --trace-steps "$steps" > "$work/out" 2>&1
    rc=$?
    [[ $rc -eq 1 ]] || { cat "$work/out"; fail "--trace-steps $steps exited with $rc, expected 1"; }
    grep -qF -- "--trace-steps" "$work/out" && grep -qF -- "'$steps'" "$work/out" ||
      { cat "$work/out"; fail "the message does not name --trace-steps and '$steps'"; }
  done
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --steps 1 --trace "$work/no/such/dir/t.json" > "$work/out" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] || { cat "$work/out"; fail "an unwritable --trace was accepted"; }
  grep -qF -- "--trace $work/no/such/dir/t.json: rank 0 cannot write" "$work/out" ||
    { cat "$work/out"; fail "the message does not name --trace, the rank and the file"; }
  echo "bad: OK"
  ;;
plot)
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --stage 3 --steps 3 --log "$work/run.jsonl" --trace "$work/t.json" \
    --trace-steps 2:2 > "$work/out" 2>&1 || { cat "$work/out"; fail "2-rank stage-3 run failed"; }
  "$py" "$here/check_trace.py" "$work/t.json" "$work/run.jsonl" 2 2 2 --stage3 || fail "trace"
  "$py" "$here/../../../scripts/plot_run.py" --trace "$work/t.json" -o "$work/t.png" > "$work/plot.out" 2>&1 ||
    { cat "$work/plot.out"; fail "plot_run.py --trace"; }
  cat "$work/plot.out"
  grep -q "t.png: step 2, 2 ranks" "$work/plot.out" || fail "the closing line does not say step 2, 2 ranks"
  "$py" -c "
import matplotlib.image as m, sys
a = m.imread(sys.argv[1])
assert a.shape[1] == 1500, a.shape
assert a[..., :3].std() > 0.05, 'blank picture'
" "$work/t.png" || fail "t.png is not a 1500-pixel-wide picture with something drawn"
  "$py" "$here/../../../scripts/plot_run.py" --trace "$work/run.jsonl" -o "$work/x.png" > "$work/plot.out" 2>&1 &&
    fail "a log was accepted as a trace"
  grep -q "run.jsonl: not a trace" "$work/plot.out" || { cat "$work/plot.out"; fail "message"; }
  echo "plot: OK"
  ;;
offload)
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --stage 2 --offload-optimizer --steps 3 --log "$work/run.jsonl" \
    --trace "$work/t.json" --trace-steps 2:3 > "$work/out" 2>&1 || { cat "$work/out"; fail "offload run failed"; }
  "$py" "$here/check_trace.py" "$work/t.json" "$work/run.jsonl" 2 3 2 || fail "trace"
  "$py" - "$work/t.json" <<'PY' || fail "offload lane"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
for rank in (0, 1):
    jobs = [e for e in ev if e["pid"] == rank and e["name"] == "offload job"]
    assert jobs, f"rank {rank}: no offload job on the timeline"
    assert all(lanes[(rank, e["tid"])] == "offload worker" for e in jobs), "offload jobs off their lane"
print("offload: jobs per rank", [sum(e["pid"] == r and e["name"] == "offload job" for e in ev) for r in (0, 1)])
PY
  echo "offload: OK"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
