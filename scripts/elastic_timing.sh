#!/usr/bin/env bash
# Time from a lost host to the first step after czrun's restart, split into its parts, on the test bed
# (scripts/hosts.sh; needs root). docs/training.md, "When a host dies", quotes its output.
#
#   scripts/elastic_timing.sh BUILD MODEL [MODE] [IMAGE_SIZE]
#     BUILD       the build folder (apps/czrun, apps/convnext_zero)
#     MODEL       convnext_zero --model (atto, tiny, ...)
#     MODE        how host 3 goes: link (ip link set eth0 down inside it, default) or kill (its rank, kill -9)
#     IMAGE_SIZE  default 32
#
# 3 hosts x 1 rank, ZeRO stage 3, micro-batch 2, a checkpoint every 4 steps (--checkpoint-sync), --comm-timeout
# 10, czrun --daemon-timeout 10 --probe-timeout 5; host 3 goes once step 6 is logged. Prints one line: the
# time from the failure (as injected) to the step that ended it being noticed (detection), to mpirun's exit
# (teardown), the probe of the hosts, the relaunch with the first step, the checkpoint load (from the page cache here); the
# sum; and the steps lost with the time the old world took for them.
set -euo pipefail
build=$(cd "${1:?usage: elastic_timing.sh BUILD MODEL [MODE] [IMAGE_SIZE]}" && pwd)
model=${2:?usage: elastic_timing.sh BUILD MODEL [MODE] [IMAGE_SIZE]}
mode=${3:-link}
size=${4:-32}
[[ $mode == link || $mode == kill ]] || { echo "elastic_timing.sh: MODE must be link or kill, got '$mode'" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
export CZ_HOSTS_BED=${CZ_HOSTS_BED:-eltime}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export work build model mode size here

inside() {
  local hs=$here/hosts.sh ck=$work/ck
  "$hs" exec 1 "$build/apps/czrun" --hostfile "/run/cz-hosts/$CZ_HOSTS_BED/hostfile" --mpirun-args "$("$hs" flags)" \
    --probe-timeout 5 --daemon-timeout 10 --max-restarts 1 -- "$build/apps/convnext_zero" --model "$model" \
    --image-size "$size" --num-classes 10 --data "synthetic:n=512,eval_n=16" --micro-batch 2 --steps 12 --stage 3 \
    --loader-threads 1 --progress-interval 1 --eval-batches 1 --comm-timeout 10 --checkpoint-dir "$ck" \
    --checkpoint-every 4 --checkpoint-sync --log "$work/log.jsonl" > "$work/out" 2>&1 &
  local cz=$! n=0
  while ((n < 6)); do
    n=$(grep -c '"img_per_s"' "$ck/czrun/attempt-0.jsonl" 2> /dev/null || true)
    kill -0 "$cz" 2> /dev/null || { cat "$work/out"; return 1; }
    sleep 0.05
  done
  date +%s.%N > "$work/t_fail"
  if [[ $mode == link ]]; then
    "$hs" exec 3 ip link set eth0 down
  else
    local p
    for p in $(ip netns pids "czhosts-$CZ_HOSTS_BED-h3"); do
      [[ $(readlink "/proc/$p/exe") == */convnext_zero ]] && kill -KILL "$p"
    done
  fi
  wait "$cz" || { cat "$work/out"; return 1; }
}
export -f inside
"$here/hosts.sh" with 3 1 -- bash -c inside > "$work/bed.out" 2>&1 || { cat "$work/bed.out" "$work/out"; exit 1; }
python3 - "$work" "$model" "$mode" <<'PY'
import json, sys
work, model, mode = sys.argv[1:]
t_fail = float(open(f"{work}/t_fail").read())
recs = [json.loads(l) for l in open(f"{work}/log.jsonl")]
r = next(e for e in recs if e.get("event") == "restart")
steps = [e for e in recs if "img_per_s" in e]
step_s = sum(e["step_time_s"] for e in steps if e["step"] <= r["resume_step"]) / max(1, r["resume_step"])
t_seen = r["t_last_step"] + r["detection_s"]
t_exit = t_seen + r["teardown_s"]
t_first = r["t_last_step"] + r["failure_to_first_step_s"]
relaunch = r["relaunch_and_load_s"] - r["checkpoint_load_s"]
import os
ck = f"{work}/ck/step_{r['resume_step']}"
mb = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ck) for f in fs) / 1e6
print(f"{model} ({mode}, checkpoint {mb:.0f} MB): failure to first step {t_first - t_fail:.1f} s = detection {t_seen - t_fail:.1f} + "
      f"teardown {t_exit - t_seen:.1f} + probe {r['probe_s']:.1f} + relaunch and first step {relaunch:.1f} + checkpoint load "
      f"{r['checkpoint_load_s']:.2f}; "
      f"{r['steps_lost']} steps lost = {r['steps_lost'] * step_s:.1f} s at {step_s:.2f} s/step on 3 ranks; "
      f"resumed on {r['new_world']} ranks")
PY
