#!/usr/bin/env bash
# Issue 43, third session of 2026-11-28 (07:24-07:29 UTC): ConvNeXt-T 224 px batch 16 on 2 threads, ours against
# PyTorch in turns, in bf16 (twice) and f32, at 1979e9f+ (no CPU-step change since 8e6af1c). Sequential, quiet.
set -x
cd /work/main
P=/work/torchenv/bin/python
o=${OUT:-bench/results/cpu-2026-11-28c}
mkdir -p $o
for r in "" _2; do
  $P bench/train_step_vs_torch.py --app build/apps/convnext_zero --model tiny --image-size 224 --batch 16 --dtype bf16 --rounds 3 --steps 3 --warmup 1 --json $o/step_tiny_bf16$r.json > $o/step_tiny_bf16$r.txt 2>&1
done
$P bench/train_step_vs_torch.py --app build/apps/convnext_zero --model tiny --image-size 224 --batch 16 --rounds 3 --steps 3 --warmup 1 --json $o/step_tiny_f32.json > $o/step_tiny_f32.txt 2>&1
