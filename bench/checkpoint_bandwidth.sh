#!/usr/bin/env bash
# Save and load bandwidth of a ConvNeXt-T checkpoint at 1, 2 and 4 ranks against dd in the same run
# (bench_checkpoint.cpp). usage: bench/checkpoint_bandwidth.sh BUILD_DIR [SCRATCH_DIR] [MODEL] [REPS]
set -eu
build=$1 dir=${2:-${TMPDIR:-/tmp}/cz_ckpt_bench} model=${3:-convnext_tiny} reps=${4:-3}
for np in 1 2 4; do
  echo "== $np rank(s)"
  mpirun --allow-run-as-root --oversubscribe -np "$np" "$build/bench/bench_checkpoint" "$dir" --model "$model" \
    --reps "$reps"
done
