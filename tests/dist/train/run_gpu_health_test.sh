#!/usr/bin/env bash
# GPU health in the log from the outside (issue 53), on CPU ranks against the stand-in NVML (fake_nvml.c):
# 2 ranks with CZ_NVML_LIBRARY set sample their "GPU 0" every 0.05 s; the stand-in starts throttling (power
# cap) 1 s after it is opened. The log's train records carry the gpu_* fields (Note [GPU health fields]), first
# unthrottled and later throttled; each rank prints one "started throttling" line with the step time before and
# after; TensorBoard gets train/gpu_*. Without the variable a CPU run has no gpu_* field and prints no line.
# Usage: run_gpu_health_test.sh APP MPIEXEC FAKE_NVML
set -uo pipefail
app=$1 mpiexec=$2 fake=$3
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
tiny=(--depths 1,1,1,1 --dims 8,16,24,32 --num-classes 5 --image-size 64 --loader-threads 1 --no-progress
  --data synthetic:n=4096,classes=5 --micro-batch 16 --stage 1)

CZ_NVML_LIBRARY=$fake CZ_GPU_HEALTH_PERIOD_S=0.05 \
  CZ_FAKE_NVML="util=93,temp=66,power_mw=310000,after_s=0.5,reasons_after=4,power_mw_after=449000,sm_mhz_after=2100" \
  "${mpirun[@]}" -x CZ_NVML_LIBRARY -x CZ_GPU_HEALTH_PERIOD_S -x CZ_FAKE_NVML -np 2 "$app" "${tiny[@]}" \
  --steps 300 --log "$work/run.jsonl" --tensorboard "$work/tb" > "$work/out" 2>&1 || { cat "$work/out"; fail "run failed"; }
grep "throttling" "$work/out"
for r in 0 1; do
  [[ $(grep -c "rank $r: GPU 0 started throttling by step [0-9]*: sw_power_cap (power 449 W of its 450 W cap, 66 C, SM 2100 MHz); step time [0-9.]* s before, [0-9.]* s after" "$work/out") -eq 1 ]] ||
    { cat "$work/out"; fail "rank $r did not print one throttling line"; }
done
"$py" - "$work/run.jsonl" <<'PY' || fail "the log's gpu fields"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = [r for r in recs if r.get("split") == "train"]
gpu = [r for r in train if "gpu_samples" in r]
assert len(gpu) >= 3, f"{len(gpu)} of {len(train)} records have gpu fields"
for r in gpu:
    assert r["gpu_util_pct"] == 93 and r["gpu_temp_c"] == 66 and r["gpu_power_limit_w"] == 450, r
    assert abs(r["gpu_mem_used_gb"] - 10240 * 2**20 / 1e9) < 1e-9, r
flags = [r["gpu_throttle"] for r in gpu]
assert flags[0] == 0 and flags[-1] == 1, flags
first = flags.index(1)
assert all(flags[first:]), flags  # once throttling, it stays so here
assert gpu[first]["gpu_clock_reasons"] == "sw_power_cap" and gpu[first - 1]["gpu_clock_reasons"] == "none"
print(f"{len(gpu)} of {len(train)} records with gpu fields; throttled from step {gpu[first]['step']}:",
      json.dumps({k: v for k, v in gpu[first].items() if k.startswith("gpu_")}))
PY
"$py" "$(dirname "$0")/check_tensorboard.py" "$work/tb" "$work/run.jsonl" 1 train/gpu_util_pct train/gpu_throttle \
  train/gpu_power_w || fail "TensorBoard lacks the gpu fields"
# A CPU run without the variable: nothing sampled, nothing said.
"$app" "${tiny[@]}" --steps 3 --log "$work/cpu.jsonl" > "$work/cpu_out" 2>&1 || { cat "$work/cpu_out"; fail "CPU run"; }
! grep -q "gpu_" "$work/cpu.jsonl" || fail "a CPU run logged gpu fields"
! grep -qi "GPU health" "$work/cpu_out" || fail "a CPU run spoke of GPU health"
echo "PASS gpu_health"
