#!/usr/bin/env bash
# Issue 50, 2026-11-28 (AMD EPYC, family 23, 2 cores, AVX2; no AVX-512): the cuts of Note [Cutting the rows]
# against the session's starting point (def7c7b, $BEFORE), in turns, in one run; then how far ranks and thread
# counts separate under each cut (bench/rank_equivalence.sh).
#   BEFORE=/tmp/base/bench_train_step AFTER=build-dev/bench/bench_train_step bench/results/cpu-2026-11-28e/run.sh
set -u
cd "$(dirname "$0")/../../.."
BEFORE=${BEFORE:-/tmp/base/bench_train_step}
AFTER=${AFTER:-build/bench/bench_train_step}
APP=${APP:-build/apps/convnext_zero}
o=bench/results/cpu-2026-11-28e
lscpu > $o/lscpu.txt
step() {  # step LABEL ENV BIN ARGS...
  local label=$1 env=$2 bin=$3; shift 3
  printf '%-22s ' "$label"
  env $env "$bin" "$@" 2>&1 | grep -oE "[0-9.]+ ms/step"
}
{
  echo "# ConvNeXt-atto 64 px, batch 32, f32, 2 threads: 3 warm-up steps, mean of 15 (bench_train_step)"
  for r in 1 2 3; do
    for cut in before fast fixed rows:8; do
      if [[ $cut == before ]]; then step "round $r before" "" "$BEFORE" --model atto --image 64 --batch 32 --warmup 3 --steps 15
      else step "round $r $cut" "" "$AFTER" --model atto --image 64 --batch 32 --warmup 3 --steps 15 --cpu-row-split $cut; fi
    done
  done
  echo "# ConvNeXt-T 224 px, batch 16, f32, 2 threads: 1 warm-up step, mean of 2"
  for r in 1 2; do
    for cut in before fast fixed; do
      if [[ $cut == before ]]; then step "round $r before" "" "$BEFORE" --model tiny --image 224 --batch 16 --warmup 1 --steps 2
      else step "round $r $cut" "" "$AFTER" --model tiny --image 224 --batch 16 --warmup 1 --steps 2 --cpu-row-split $cut; fi
    done
  done
} 2>&1 | tee $o/step_times.txt
