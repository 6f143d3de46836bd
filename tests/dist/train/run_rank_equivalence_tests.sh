#!/usr/bin/env bash
# One rank against N ranks, and against itself at another thread count, from the outside (Note [Cutting the
# rows], tensor/cpu/row_tiles.h): the final weights of issue 50's case (depths 1,1,2,1, dims 24,48,96,200, 7
# classes, 32 px, AdamW lr 2e-3, 8 steps), tensor by tensor (compare_weights.py).
# Usage: run_rank_equivalence_tests.sh CASE APP MPIEXEC ARG
#   library LIB   f32 GEMMs on LIB (openblas, onednn, blis, libxsmm)
#   isa ISA       oneDNN held to ISA (ONEDNN_MAX_CPU_ISA: SSE41, AVX2, AVX512_CORE); skipped (77) where this
#                 CPU lacks it
#   bf16 ISA      --precision bf16 on AMX-BF16, AVX512_BF16 (AMX hidden) or emulated (CZ_CPU_BF16_EMULATE=1,
#                 any CPU); skipped (77) where this CPU lacks the ISA
#   stages -      2 ranks: stages 1-3 against stage 0, with clipping, EMA and drop-path, at grad-accum 1 and 2
# Each case checks, with its bound:
#   - --cpu-row-split fixed, 1 rank on 1 thread against 2: equal to the bit. Every call and every sum's blocks
#     follow the layer's shape alone, so the two runs make the same float operations in the same order.
#   - --cpu-row-split rows:8, 2 ranks (micro-batch 8) at stages 3 and 2 against 1 rank (micro-batch 16): equal
#     to the bit. 8 rows divide each rank's share of every layer (8 images x 1 pixel at the last stage), so
#     each rank's rows go through the very GEMM calls and sum blocks of the one-rank run, the per-sample loss
#     gradients differ by the exact factor 2 that the ranks' average takes back, and the ranks' sum is the root
#     of the one-rank run's pairwise tree.
set -uo pipefail
case_name=$1 app=$2 mpiexec=$3 arg=${4:-}
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
model=(--depths 1,1,2,1 --dims 24,48,96,200 --num-classes 7 --image-size 32 --data synthetic:classes=7 --lr 2e-3
       --steps 8 --seed 1 --loader-threads 1 --no-progress --eval-batches 0)
extra=()
env_args=()

has_flag() { grep -qw "$1" /proc/cpuinfo; }

same() {  # same A.h5 B.h5 LABEL: equal to the bit
  "$py" "$(dirname "${BASH_SOURCE[0]}")/compare_weights.py" "$1" "$2" 0 "$3" || fail "$3: the weights differ"
}

one_rank() {  # one_rank OUT.h5 [ARGS...]
  local out=$1; shift
  "$app" "${model[@]}" "${extra[@]}" "$@" --export-weights "$out" > "$work/run.out" 2>&1 ||
    { cat "$work/run.out"; fail "the run ($*) failed"; }
}

ranks() {  # ranks N OUT.h5 [ARGS...]
  local np=$1 out=$2; shift 2
  "${mpirun[@]}" -np "$np" "${env_args[@]}" "$app" "${model[@]}" "${extra[@]}" "$@" --export-weights "$out" \
    > "$work/run.out" 2>&1 || { cat "$work/run.out"; fail "$np ranks ($*) failed"; }
}

threads_and_split() {  # the two checks above, with extra=(...) and env_args=(...) set
  local what=$1
  OMP_NUM_THREADS=1 one_rank "$work/t1.h5" --micro-batch 16 --cpu-row-split fixed
  OMP_NUM_THREADS=2 one_rank "$work/t2.h5" --micro-batch 16 --cpu-row-split fixed
  same "$work/t1.h5" "$work/t2.h5" "$what, --cpu-row-split fixed: 1 rank on 1 thread vs 2"
  one_rank "$work/one.h5" --micro-batch 16 --cpu-row-split rows:8
  for stage in 3 2; do
    ranks 2 "$work/two.h5" --micro-batch 8 --stage "$stage" --cpu-row-split rows:8
    same "$work/one.h5" "$work/two.h5" "$what, --cpu-row-split rows:8: 2 ranks at stage $stage vs 1 rank"
  done
}

case $case_name in
library)
  extra=(--cpu-gemm "$arg")
  threads_and_split "$arg"
  ;;
isa)
  case $arg in
  SSE41) has_flag sse4_1 ;;
  AVX2) has_flag avx2 ;;
  AVX512_CORE) has_flag avx512f && has_flag avx512bw && has_flag avx512vl && has_flag avx512dq ;;
  *) fail "unknown ISA $arg" ;;
  esac || { echo "SKIP: this CPU has no $arg"; exit 77; }
  export ONEDNN_MAX_CPU_ISA=$arg
  env_args=(-x ONEDNN_MAX_CPU_ISA)
  extra=(--cpu-gemm onednn)
  threads_and_split "oneDNN held to $arg"
  ;;
bf16)
  case $arg in
  AMX-BF16) has_flag amx_bf16 || { echo "SKIP: this CPU has no AMX"; exit 77; } ;;
  AVX512_BF16)
    has_flag avx512_bf16 || { echo "SKIP: this CPU has no AVX512_BF16"; exit 77; }
    export CZ_CPU_DISABLE=amx_bf16
    env_args=(-x CZ_CPU_DISABLE)
    ;;
  emulated)
    export CZ_CPU_BF16_EMULATE=1
    env_args=(-x CZ_CPU_BF16_EMULATE)
    ;;
  *) fail "unknown bf16 ISA $arg" ;;
  esac
  extra=(--precision bf16)
  "$app" "${model[@]}" "${extra[@]}" --steps 1 > "$work/header" 2>&1 || { cat "$work/header"; fail "bf16 run"; }
  grep -F "GEMMs multiply bf16-rounded operands on $arg" "$work/header" ||
    { cat "$work/header"; fail "the header does not say that $arg runs the bf16 GEMMs"; }
  threads_and_split "bf16 on $arg"
  ;;
stages)
  # Clipping, EMA and drop-path on; at grad-accum 1 every stage adds the same gradients in the same order. At
  # grad-accum 2 stages 2 and 3 reduce each micro-batch as it ends and add the reduced ones (as one rank adds
  # its micro-batches), while stages 0 and 1 add their micro-batches first and reduce once: the same four
  # gradients in another association, which agree to rounding only (not checked here; app_ranks_match_one_process
  # holds the logs to 2e-5).
  extra=(--clip-grad 1 --ema-decay 0.9 --drop-path 0.1 --cpu-row-split rows:8)
  for accum in 1 2; do
    one_rank "$work/one.h5" --micro-batch 16 --grad-accum "$accum"
    stages=(0 1 2 3)
    [[ $accum -eq 2 ]] && stages=(2 3)
    for stage in "${stages[@]}"; do
      ranks 2 "$work/s$stage.h5" --micro-batch 8 --grad-accum "$accum" --stage "$stage"
      same "$work/one.h5" "$work/s$stage.h5" "grad-accum $accum, clip, EMA, drop-path: 2 ranks at stage $stage vs 1 rank"
    done
  done
  ;;
*) fail "unknown case $case_name" ;;
esac
echo "$case_name $arg: OK"
