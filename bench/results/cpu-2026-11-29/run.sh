#!/usr/bin/env bash
# 2026-11-29 (AMD EPYC family 23, 2 cores, AVX2): the CPU step after issue 54's restructuring (one SIMD layer,
# the CPU kernels' shared pieces, the trainer's parts), against bench/results/cpu-2026-11-28e on the same
# machine type, and against PyTorch in the same run.
#   TORCH_PY=/work/torchenv/bin/python bench/results/cpu-2026-11-29/run.sh [OUT_DIR]
set -u
cd "$(dirname "$0")/../../.."
o=${1:-bench/results/cpu-2026-11-29}  # the folder its files go to
lscpu > $o/lscpu.txt
{
  echo "# ConvNeXt-atto 64 px b32 f32 and ConvNeXt-T 224 px b16 f32, 2 threads (bench_train_step, --cpu-row-split fast)"
  for r in 1 2 3; do printf "round $r fast "; build/bench/bench_train_step --model atto --image 64 --batch 32 --warmup 3 --steps 15 2>&1 | grep -oE "[0-9.]+ ms/step"; done
  for r in 1 2; do printf "round $r tiny fast "; build/bench/bench_train_step --model tiny --image 224 --batch 16 --warmup 1 --steps 2 2>&1 | grep -oE "[0-9.]+ ms/step"; done
} | tee $o/step_times.txt
"${TORCH_PY:-python3}" bench/train_step_vs_torch.py --app build/apps/convnext_zero 2>&1 | tail -6 | tee $o/vs_torch.txt
