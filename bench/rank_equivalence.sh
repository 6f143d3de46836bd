#!/usr/bin/env bash
# How far N ranks are from one rank, and a run from itself at another thread count, under each cut of the CPU
# kernels' rows (Note [Cutting the rows]): the final weights of issue 50's case (a small ConvNeXt: depths
# 1,1,2,1, dims 24,48,96,200, 7 classes, 32 px, the embedded synthetic data, AdamW lr 2e-3, 8 steps), max|a-b| /
# max|b| over the tensors (tests/dist/train/compare_weights.py).
#
#   bench/rank_equivalence.sh [APP] [SEEDS...]     # APP: build/apps/convnext_zero; SEEDS: 1 2 3
#
# Prints one line per comparison: cut, library, seed, what is compared, the largest relative difference and
# how many tensors differ in any bit. Each run takes a second or two; about 4 minutes in all on 2 cores.
set -uo pipefail
app=${1:-build/apps/convnext_zero}
seeds=("${@:2}")
[[ ${#seeds[@]} -gt 0 ]] || seeds=(1 2 3)
here=$(cd "$(dirname "$0")/.." && pwd)
py=${CZ_PYTHON:-/usr/bin/python3}  # the system Python has h5py (python3-h5py)
mpirun=(mpirun --allow-run-as-root --oversubscribe)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=(--depths 1,1,2,1 --dims 24,48,96,200 --num-classes 7 --image-size 32 --data synthetic:classes=7 --lr 2e-3
       --steps 8 --loader-threads 1 --no-progress --eval-batches 0)
cmp() {  # cmp LABEL A B
  "$py" "$here/tests/dist/train/compare_weights.py" "$2" "$3" 1 "$1" | head -1
}
for split in fast fixed rows:8; do
  for lib in onednn openblas blis libxsmm; do
    [[ $split == fast || $lib == onednn || $split == rows:8 ]] || continue
    for seed in "${seeds[@]}"; do
      run=("${model[@]}" --seed "$seed" --cpu-gemm "$lib" --cpu-row-split "$split")
      "$app" "${run[@]}" --micro-batch 16 --export-weights "$work/one.h5" > /dev/null 2>&1 || echo "FAILED: 1 rank"
      OMP_NUM_THREADS=1 "$app" "${run[@]}" --micro-batch 16 --export-weights "$work/one_t1.h5" > /dev/null 2>&1
      "${mpirun[@]}" -np 2 "$app" "${run[@]}" --micro-batch 8 --stage 3 --export-weights "$work/two.h5" \
        > /dev/null 2>&1 || echo "FAILED: 2 ranks"
      cmp "$split $lib seed $seed: 1 rank, 1 thread vs 2" "$work/one_t1.h5" "$work/one.h5"
      cmp "$split $lib seed $seed: 2 ranks stage 3 vs 1 rank" "$work/two.h5" "$work/one.h5"
    done
  done
done
