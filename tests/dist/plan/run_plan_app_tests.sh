#!/usr/bin/env bash
# convnext_zero --plan from the outside. Usage: run_plan_app_tests.sh APP TOPOLOGY.json
# Good flags print a table or one JSON object quickly, without mpirun; bad ones exit non-zero naming the flag.
set -uo pipefail
app=$1
topo=$2
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"

start=$(date +%s%N)
"$app" --plan --model large --image-size 224 --micro-batch 16 --device cuda --precision bf16 --stage 2 \
    --ranks 8 --gpu-mem 24GB > "$work/table" 2>&1 || { cat "$work/table"; fail "--plan exited with $?"; }
ms=$(( ($(date +%s%N) - start) / 1000000 ))
cat "$work/table"
grep -q "total: the allocator's planned peak" "$work/table" || fail "no total in the table"
grep -q "Largest micro-batch that fits" "$work/table" || fail "no largest micro-batch table"
(( ms < 2000 )) || fail "--plan took $ms ms"

OMPI_COMM_WORLD_SIZE=4 "$app" --plan --json --model atto --stage 3 --gpu-mem 2GiB > "$work/json" 2>&1 ||
  { cat "$work/json"; fail "--plan --json exited with $?"; }
"$py" - "$work/json" <<'PY' || fail "--plan --json"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["world"] == 4, j["world"]  # from the launcher's environment
assert isinstance(j["total_bytes"], int) and j["total_bytes"] > 0
assert j["fits"] in (True, False)
rows = [k for k in j if k.endswith("_bytes") and k not in
        ("total_bytes", "fragmentation_bytes", "device_overhead_bytes", "required_bytes", "reserved_bytes", "gpu_mem_bytes")]
assert sum(j[k] for k in rows) == j["total_bytes"], "rows do not add up to total_bytes"
assert j["gather_buffers_bytes"] > 0
print("json: %d rows, total %d, fits %s" % (len(rows), j["total_bytes"], j["fits"]))
PY

# The what-if on the 8-GPU test box: every stage at 1, 2, 4 and 8 ranks, the compute table named.
"$app" --plan --what-if "$topo" --model tiny --image-size 224 --micro-batch 32 --device cuda --precision bf16 \
    --gpu-mem 24GB > "$work/whatif" 2>&1 || { cat "$work/whatif"; fail "--what-if exited with $?"; }
cat "$work/whatif"
grep -q "^Compute: planned: RTX 4090 rates, bf16" "$work/whatif" || fail "--what-if does not say where its rates come from"
grep -q "8 ranks: ring 0 2 4 6 1 3 5 7; 64 MiB reduce-scatter 19\.76 GB/s bus" "$work/whatif" ||
  fail "--what-if's 8-rank ring is not commbench --show-ring's"
"$app" --plan --what-if "$topo" --json --model atto --stage 3 > "$work/whatif.json" 2>&1 ||
  { cat "$work/whatif.json"; fail "--what-if --json exited with $?"; }
"$py" - "$work/whatif.json" <<'PY' || fail "--what-if --json"
import json, sys
j = json.load(open(sys.argv[1]))
rows = j["rows"]
assert len(rows) == 16, len(rows)  # stages 0-3 x 1, 2, 4, 8 ranks
assert all(r["img_per_s"] > 0 and r["step_s"] >= r["compute_s"] for r in rows)
assert j["compute"]["provenance"].startswith("planned:")
print("what-if json: %d rows" % len(rows))
PY

# The exit code: 0 when the plan fits --gpu-mem, 3 (and why, on stderr) when it does not, with or without
# --json; 0 without --gpu-mem.
"$app" --plan --model atto --image-size 64 --micro-batch 8 --gpu-mem 4GiB > "$work/fit" 2>&1 ||
  { cat "$work/fit"; fail "a plan that fits exited with $?"; }
grep -q "fits, " "$work/fit" || { cat "$work/fit"; fail "the table does not say it fits"; }
for json in "" --json; do
  "$app" --plan $json --model atto --image-size 64 --micro-batch 8 --gpu-mem 8MiB > "$work/nofit" 2> "$work/why"
  rc=$?
  [[ $rc -eq 3 ]] || { cat "$work/nofit" "$work/why"; fail "a plan that does not fit exited with $rc, not 3"; }
  grep -q "does not fit: .* B required per rank .* but --gpu-mem is 8388608 B, .* MiB short; exit code 3" \
    "$work/why" || { cat "$work/why"; fail "no reason on stderr"; }
  [[ -z $json ]] || "$py" -c "import json, sys; assert json.load(open(sys.argv[1]))['fits'] is False" \
    "$work/nofit" || fail "--json: not one JSON object with fits false on stdout"
done
"$app" --plan --model atto --image-size 64 --micro-batch 8 > /dev/null 2>&1 || fail "no --gpu-mem: exit $?"
out=$(OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1 "$app" --plan --model atto --gpu-mem 8MiB 2>&1)
rc=$?
[[ $rc -eq 3 && -z $out ]] || fail "rank 1 of 2: exit $rc (want 3, silently): $out"
echo "exit codes: 0 fits, 3 does not fit"

# Under a launcher only rank 0 prints.
out=$(OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=2 "$app" --plan --model atto) || fail "--plan on rank 2 exited with $?"
[[ -z $out ]] || fail "rank 2 printed the plan too"

# The device a plan is for (issue 30, Note [The device a plan is for]): a plan asked about GPU memory
# (--gpu-mem), or for a topology of GPUs (--what-if), is a CUDA plan unless --device says otherwise, and
# every plan says which device it is for and why.
plan_json() {  # plan_json FILE ARGS...: --plan --json ARGS into FILE
  local out=$1; shift
  "$app" --plan --json --model atto --image-size 64 --micro-batch 8 "$@" > "$out" 2>&1 ||
    [[ $? -eq 3 ]] || { cat "$out"; fail "--plan --json $* exited with $?"; }
}
"$app" --plan --model atto --image-size 64 --micro-batch 8 --gpu-mem 24GB > "$work/dev" 2>&1 ||
  { cat "$work/dev"; fail "--plan --gpu-mem exited with $?"; }
grep -q "micro-batch 8, fp32 on cuda," "$work/dev" || { cat "$work/dev"; fail "--gpu-mem without --device: not a CUDA plan"; }
grep -q "^Planned for the CUDA backend: --gpu-mem asks about GPU memory and no --device was given" "$work/dev" ||
  { cat "$work/dev"; fail "--gpu-mem without --device: the plan does not say why CUDA"; }
grep -q "CUDA context, NCCL (allowance)" "$work/dev" || fail "--gpu-mem without --device: no CUDA context row"
plan_json "$work/gpu.json" --gpu-mem 24GB
plan_json "$work/cuda.json" --gpu-mem 24GB --device cuda
plan_json "$work/cpu.json" --gpu-mem 24GB --device cpu
plan_json "$work/default.json"
"$py" - "$work" <<'PY' || fail "the device of --plan --json"
import json, sys
j = {k: json.load(open(f"{sys.argv[1]}/{k}.json")) for k in ("gpu", "cuda", "cpu", "default")}
assert j["gpu"]["device"] == "cuda" and "--gpu-mem asks about GPU memory" in j["gpu"]["device_reason"], j["gpu"]
assert j["gpu"]["required_bytes"] == j["cuda"]["required_bytes"] > j["gpu"]["total_bytes"], "not the CUDA plan"
assert j["cuda"]["device_reason"] == "as --device says", j["cuda"]["device_reason"]
assert j["cpu"]["device"] == "cpu" and j["cpu"]["device_reason"] == "as --device says", j["cpu"]
assert j["cpu"]["required_bytes"] == j["cpu"]["total_bytes"] < j["gpu"]["required_bytes"]
assert j["default"]["device"] == "cpu" and "the default --device" in j["default"]["device_reason"], j["default"]
print("devices: --gpu-mem plans cuda (required %d B), --device cpu cpu (%d B), neither cpu"
      % (j["gpu"]["required_bytes"], j["cpu"]["required_bytes"]))
PY
"$app" --plan --what-if "$topo" --model atto --image-size 64 --micro-batch 8 > "$work/wdev" 2>&1 ||
  { cat "$work/wdev"; fail "--what-if without --device exited with $?"; }
grep -q "^Memory planned for the CUDA backend: the --what-if topology's ranks are GPUs and no --device was given" \
  "$work/wdev" || { cat "$work/wdev"; fail "--what-if on GPUs without --device: not said to be a CUDA plan"; }
cpu_topo=$(dirname "$topo")/two_hosts_2x2_cpu_1gbit.json
for d in "" "--device cpu" "--device cuda"; do
  for t in "$topo" "$cpu_topo"; do
    "$app" --plan --json --what-if "$t" --model atto --image-size 64 --micro-batch 8 --stage 0 $d \
      > "$work/w$(basename "$t")${d// /}.json" 2>&1 || { cat "$work/w$(basename "$t")${d// /}.json"; fail "--what-if $d exited $?"; }
  done
done
"$py" - "$work" "$(basename "$topo")" "$(basename "$cpu_topo")" "$work/gpu.json" "$work/cpu.json" <<'PY' ||
import json, sys
w, gpus, cpus = sys.argv[1:4]
plan_cuda, plan_cpu = (json.load(open(f)) for f in sys.argv[4:6])
j = lambda t, d: json.load(open(f"{w}/w{t}{d}.json"))
def one_rank(r):
    return next(x for x in r["rows"] if x["ranks"] == 1 and x["stage"] == 0)["memory_bytes"]
assert j(gpus, "")["device"] == "cuda" and "ranks are GPUs" in j(gpus, "")["device_reason"], j(gpus, "")["device_reason"]
assert one_rank(j(gpus, "")) == plan_cuda["required_bytes"], (one_rank(j(gpus, "")), plan_cuda["required_bytes"])
assert j(gpus, "--devicecpu")["device"] == "cpu" and one_rank(j(gpus, "--devicecpu")) == plan_cpu["required_bytes"]
assert j(cpus, "")["device"] == "cpu" and "CPU processes" in j(cpus, "")["device_reason"], j(cpus, "")
assert j(cpus, "--devicecuda")["device"] == "cuda" and j(cpus, "--devicecuda")["device_reason"] == "as --device says"
print("what-if devices: GPU topology cuda (one rank %d B), --device cpu cpu (%d B), CPU topology cpu"
      % (one_rank(j(gpus, "")), one_rank(j(gpus, "--devicecpu"))))
PY
  fail "the device of --what-if"

refused "--gpu-mem must be positive" --plan --gpu-mem 0
refused "--gpu-mem must be positive" --plan --gpu-mem 0GiB
refused "--gpu-mem: unknown unit 'XB'" --plan --gpu-mem 24XB
refused "--gpu-mem: 'lots' is not a memory size" --plan --gpu-mem lots
refused "--gpu-mem goes with --plan" --gpu-mem 24GB --steps 1
refused "--json goes with --plan" --json --steps 1
refused "--ranks must be at least 1" --plan --ranks 0
refused "--precision fp16 needs --device cuda" --plan --precision fp16
"$app" --plan --precision bf16 > "$work/cpu_bf16" 2>&1 || { cat "$work/cpu_bf16"; fail "--plan --precision bf16 on the CPU failed"; }
grep -q "^bf16 on the CPU is the GEMMs' precision" "$work/cpu_bf16" || fail "the CPU bf16 plan does not say what bf16 is there"
"$app" --plan --precision fp32 > "$work/cpu_fp32" 2>&1 || fail "--plan on the CPU failed"
diff <(grep "total: the allocator" "$work/cpu_fp32") <(grep "total: the allocator" "$work/cpu_bf16") ||
  fail "a CPU bf16 run's plan differs from fp32's (no 16-bit copies on the CPU)"
refused "--stage" --plan --stage 5
refused "--compute-table goes with --plan --what-if" --plan --compute-table x.json
refused "--what-if goes with --plan" --what-if "$topo" --steps 1
refused "--ranks does not go with --what-if" --plan --what-if "$topo" --ranks 4
refused "cannot" --plan --what-if /nonexistent/topo.json
refused "--compute-table /nonexistent.json: cannot read it" --plan --what-if "$topo" --compute-table /nonexistent.json
echo "app_plan_flags: OK"
