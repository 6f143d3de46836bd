#!/usr/bin/env bash
# Several ranks on one GPU (Note [Choosing the comm backend]): NCCL refuses two ranks on one device, so the
# engine's multi-rank CUDA paths run over the MPI backend, which stages CUDA buffers through pinned host
# memory. Each case runs convnext_zero on CUDA ranks and the same flags on CPU ranks and compares them step by
# step. Exit 77 (ctest: skipped) without a GPU or without the CUDA build.
#
#   run_cuda_rank_tests.sh CASE APP MPIEXEC
#     stages2     2 ranks at stages 0-3: fp32 against CPU ranks, bf16 against one GPU rank
#     stages4     the same with 4 ranks
#     offload     --offload-optimizer at stages 1-3, 2 ranks
#     quant       --gather-dtype int8 --reduce-dtype int8 at stages 0-3, 4 ranks
#     mesh        --shard-group 2 / host and --hpz on 2 simulated hosts x 2 ranks
#     checkpoint  saved at 4 GPU ranks, resumed at 2 GPU ranks and at 2 CPU ranks
#     nccl_one    --comm-backend nccl at 1 rank (a communicator of one) at stages 0-3
#     bf16_repeat bf16 runs repeat to the bit in two processes (1 rank, and 2 ranks at stage 3)
#
# Tolerances (relative, plus 1e-7): fp32 step 1 2e-5 (the stage-equality bound of run_app_tests.sh: same
# batch, same weights, only the order of float sums differs), later steps 1e-3 (test_trainer_cuda's
# F32FollowsTheCpuRun: AdamW normalises tiny gradient differences); the INT8 runs 1e-3 throughout (a master
# weight that differs in its last bit can flip one INT8 code); bf16 losses 2e-2 (test_trainer_cuda's
# ZeroStagesAndOffloadAgreeOnOneGpu). Every comparison prints its largest differences ("maxdiff ...").
set -uo pipefail
case_name=$1 app=$2 mpiexec=$3
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
tiny_model 4
common=("${tiny[@]}" --drop-path 0.2 --eval-batches 1 --seed 3
        --grad-accum 2 --clip-grad 1 --bucket-mb 0.01)

# $CZ_REHEARSE=1 checks this script without a GPU: the "GPU" runs go to the CPU in fp32 (bf16 becomes fp32,
# NCCL becomes MPI), and the backend lines are not checked. Nothing is learnt about the GPU that way.
rehearse=${CZ_REHEARSE:-0}
# Skips (77) unless this build has CUDA and a GPU is visible.
((rehearse)) || "$app" "${common[@]}" --steps 1 --micro-batch 4 --device cuda > "$work/probe" 2>&1 || {
  if grep -qE "no CUDA GPU is available|no CUDA backend" "$work/probe"; then
    echo "SKIP: $(grep -oE "no CUDA GPU is available.*" "$work/probe" | head -1)"
    exit 77
  fi
  cat "$work/probe"
  fail "one rank on the GPU failed"
}


# run NP LOG ARGS...: 16 images per micro-step in total; NP 1 runs without mpirun. $SIM: simulated hosts.
run() {
  local np=$1 log=$2 a args=()
  shift 2
  if ((rehearse)); then
    for a in "$@"; do
      case "$a" in cuda) args+=(cpu) ;; bf16) args+=(fp32) ;; nccl) args+=(mpi) ;; *) args+=("$a") ;; esac
    done
    set -- "${args[@]}"
  fi
  if ((np == 1)); then
    "$app" "${common[@]}" --micro-batch 16 --log "$log" "$@" > "$log.out" 2>&1
  else
    CZ_SIMULATE_HOSTS=${SIM:-} "${mpirun[@]}" -x CZ_SIMULATE_HOSTS -np "$np" "$app" "${common[@]}" \
      --micro-batch $((16 / np)) --log "$log" "$@" > "$log.out" 2>&1
  fi || { cat "$log.out"; fail "$np ranks: $* failed"; }
}

# compare A B LINES WHAT TOL1 TOL COLS: steps, losses and (COLS 3) gradient norms of two logs; TOL1 for the
# first step, TOL after it. Prints the largest relative differences.
compare() {
  local a=$1 b=$2 lines=$3 what=$4 tol1=$5 tol=$6 cols=${7:-3}
  paste -d' ' <(steps_of "$a") <(steps_of "$b") > "$work/both"
  [[ $(wc -l < "$work/both") -eq $lines ]] || { cat "$work/both"; fail "$what: expected $lines step records"; }
  awk -v what="$what" -v tol1="$tol1" -v tol="$tol" -v cols="$cols" '
    function rel(a, b,   d) { d = a - b; if (d < 0) d = -d; return d / ((a < 0 ? -a : a) + 1e-30) }
    {
      if ($1 != $4) { print "step " $1 " vs " $4; bad = 1 }
      t = NR == 1 ? tol1 : tol
      for (c = 2; c <= cols; ++c) {
        r = rel($c, $(c + 3))
        if (r > m[c]) m[c] = r
        d = $c - $(c + 3); if (d < 0) d = -d
        if (d > t * ($c < 0 ? -$c : $c) + 1e-7) { print what ": step " $1 ": " $c " vs " $(c + 3); bad = 1 }
      }
    }
    END { printf "maxdiff %s: loss %.2e%s\n", what, m[2], cols == 3 ? sprintf(" grad_norm %.2e", m[3]) : "";
          exit bad }' "$work/both" || { cat "$work/both"; fail "$what"; }
}

# The backend the run chose, from its header; fails unless it is WANT.
expect_backend() {  # LOG WANT
  ((rehearse)) && return 0
  grep -q "collectives over $2" "$1.out" || { cat "$1.out"; fail "expected the collectives over $2"; }
}

case $case_name in
stages2 | stages4)
  np=${case_name#stages}
  run 1 "$work/gpu1_bf16.jsonl" --steps 3 --device cuda --precision bf16
  for stage in 0 1 2 3; do
    run "$np" "$work/cpu.jsonl" --steps 3 --stage $stage
    run "$np" "$work/gpu.jsonl" --steps 3 --stage $stage --device cuda
    expect_backend "$work/gpu.jsonl" "mpi (auto: $np ranks share 1 GPU"
    compare "$work/cpu.jsonl" "$work/gpu.jsonl" 3 "fp32 $np ranks stage $stage, GPU vs CPU" 2e-5 1e-3
    run "$np" "$work/gpu_bf16.jsonl" --steps 3 --stage $stage --device cuda --precision bf16
    compare "$work/gpu1_bf16.jsonl" "$work/gpu_bf16.jsonl" 3 "bf16 $np ranks stage $stage vs 1 GPU rank" \
      2e-2 2e-2 2
  done
  ;;
offload)
  for stage in 1 2 3; do
    run 2 "$work/cpu.jsonl" --steps 3 --stage $stage --offload-optimizer
    run 2 "$work/gpu.jsonl" --steps 3 --stage $stage --offload-optimizer --device cuda
    compare "$work/cpu.jsonl" "$work/gpu.jsonl" 3 "fp32 2 ranks stage $stage offload, GPU vs CPU" 2e-5 1e-3
  done
  run 2 "$work/gpu_bf16.jsonl" --steps 3 --stage 3 --offload-optimizer --device cuda --precision bf16
  run 1 "$work/gpu1_bf16.jsonl" --steps 3 --device cuda --precision bf16
  compare "$work/gpu1_bf16.jsonl" "$work/gpu_bf16.jsonl" 3 "bf16 2 ranks stage 3 offload vs 1 GPU rank" \
    2e-2 2e-2 2
  ;;
quant)
  for stage in 0 1 2 3; do
    gather=(--gather-dtype int8)
    ((stage == 0)) && gather=()  # stage 0 gathers nothing
    run 4 "$work/cpu.jsonl" --steps 3 --stage $stage "${gather[@]}" --reduce-dtype int8
    run 4 "$work/gpu.jsonl" --steps 3 --stage $stage "${gather[@]}" --reduce-dtype int8 --device cuda
    compare "$work/cpu.jsonl" "$work/gpu.jsonl" 3 "int8 4 ranks stage $stage, GPU vs CPU" 1e-3 1e-3
  done
  ;;
mesh)
  for flags in "--stage 2 --shard-group 2" "--stage 3 --shard-group host" "--stage 3 --hpz" \
               "--stage 1 --shard-group host"; do
    # shellcheck disable=SC2086
    SIM=2 run 4 "$work/cpu.jsonl" --steps 3 $flags
    # shellcheck disable=SC2086
    SIM=2 run 4 "$work/gpu.jsonl" --steps 3 $flags --device cuda
    grep -q '"comm_cross_bytes":[1-9]' "$work/gpu.jsonl" || fail "$flags: no cross-host bytes logged"
    compare "$work/cpu.jsonl" "$work/gpu.jsonl" 3 "fp32 2 hosts x 2 ranks $flags, GPU vs CPU" 2e-5 1e-3
  done
  # Two-level collectives over MPI take host buffers: refused at start, naming both flags (the first GPU run
  # met the refusal only at the first bucket).
  if ((!rehearse)); then
    CZ_SIMULATE_HOSTS=2 "${mpirun[@]}" -x CZ_SIMULATE_HOSTS -np 4 "$app" "${common[@]}" --micro-batch 4 --steps 1 \
      --stage 1 --shard-group host --comm-impl hier --device cuda > "$work/hier.out" 2>&1 &&
      { cat "$work/hier.out"; fail "--comm-impl hier over MPI on CUDA ranks was not refused"; }
    grep -q "comm-impl hier: two-level collectives over the mpi backend take host buffers" "$work/hier.out" ||
      { cat "$work/hier.out"; fail "--comm-impl hier over MPI: no message naming it"; }
    ! grep -q "^convnext_zero: custom" "$work/hier.out" || fail "--comm-impl hier over MPI: refused only after start"
  fi
  ;;
checkpoint)
  run 4 "$work/first.jsonl" --steps 8 --stage 3 --device cuda --checkpoint-dir "$work/ck" --checkpoint-every 4
  [[ -d "$work/ck/step_4" ]] || { ls -la "$work/ck"; fail "no step_4"; }
  grep '"split":"train"' "$work/first.jsonl" | tail -n 4 > "$work/first_tail.jsonl"
  run 2 "$work/gpu2.jsonl" --steps 8 --stage 2 --device cuda --resume "$work/ck/step_4"
  compare "$work/first_tail.jsonl" "$work/gpu2.jsonl" 4 "4 GPU ranks stage 3 -> 2 GPU ranks stage 2" 1e-3 1e-3
  run 2 "$work/cpu2.jsonl" --steps 8 --stage 3 --resume "$work/ck/step_4"
  compare "$work/first_tail.jsonl" "$work/cpu2.jsonl" 4 "4 GPU ranks stage 3 -> 2 CPU ranks stage 3" 1e-3 1e-3
  ;;
nccl_one)
  for stage in 0 1 2 3; do
    run 1 "$work/cpu.jsonl" --steps 3 --stage $stage
    run 1 "$work/gpu.jsonl" --steps 3 --stage $stage --device cuda
    run 1 "$work/nccl.jsonl" --steps 3 --stage $stage --device cuda --comm-backend nccl
    expect_backend "$work/nccl.jsonl" "nccl (--comm-backend nccl)"
    compare "$work/cpu.jsonl" "$work/nccl.jsonl" 3 "fp32 1 rank over NCCL stage $stage, GPU vs CPU" 2e-5 1e-3
    compare "$work/gpu.jsonl" "$work/nccl.jsonl" 3 "fp32 1 rank over NCCL stage $stage vs no communicator" \
      2e-5 2e-5
  done
  ;;
bf16_repeat)
  # Note [Reproducible runs] across processes: the same seed in two processes gives the same losses and
  # gradient norms to the bit (the log keeps every digit), and the same exported weights; on one rank and on
  # 2 ranks over MPI (test_trainer_cuda's SameSeedRepeatsBitForBit covers cuDNN's depthwise in one process).
  for variant in "1" "2 --stage 3"; do
    read -r np flags <<< "$variant"
    for k in a b; do
      # shellcheck disable=SC2086
      run "$np" "$work/$k.jsonl" --steps 30 --device cuda --precision bf16 --export-weights "$work/$k.h5" $flags
    done
    [[ $(steps_of "$work/a.jsonl" | wc -l) -eq 30 ]] || fail "bf16 $variant: expected 30 step records"
    diff <(steps_of "$work/a.jsonl") <(steps_of "$work/b.jsonl") || fail "bf16 $variant: two processes differ"
    evals() { grep '"split":"eval"' "$1" | grep -oE '"(loss|top1)":[^,}]+'; }
    [[ -n "$(evals "$work/a.jsonl")" ]] || fail "bf16 $variant: no eval record"
    diff <(evals "$work/a.jsonl") <(evals "$work/b.jsonl") || fail "bf16 $variant: the evaluations differ"
    if "$py" -c "import h5py, numpy" 2>/dev/null; then
      "$py" - "$work/a.h5" "$work/b.h5" <<'PY' || fail "bf16 $variant: the exported weights differ"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
bad = [n for n in names if n not in b or a[n][()].tobytes() != b[n][()].tobytes()]
print(f"{len(names)} tensors, {len(bad)} differ {bad[:3]}")
sys.exit(1 if bad or not names else 0)
PY
    fi
    echo "bf16 ranks/flags $variant: 30 steps repeat to the bit in two processes"
  done
  ;;
*) fail "unknown case $case_name" ;;
esac
echo "$case_name: OK"
