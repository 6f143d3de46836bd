#!/usr/bin/env bash
# Issue 43, fourth session of 2026-11-28: the heap policy (Note [Freed heap memory stays mapped], 1a010ad)
# against the session's starting point (1dbd67a, the clean clone's build at $BEFORE) and PyTorch 2.15, in turns,
# in one run; PyTorch also under the same glibc heap settings (--torch-heap-like-ours). Sequential, 2 threads.
set -x
cd /work/main
P=/work/torchenv/bin/python
BEFORE=${BEFORE:-/work/before_app_1dbd67a}
o=${OUT:-bench/results/cpu-2026-11-28d}
mkdir -p $o
date > $o/start
lscpu > $o/lscpu.txt
$P bench/train_step_vs_torch.py --app build/apps/convnext_zero --before $BEFORE --torch-heap-like-ours --model tiny --image-size 224 --batch 16 --rounds 3 --steps 3 --warmup 1 --json $o/step_tiny_f32.json > $o/step_tiny_f32.txt 2>&1
$P bench/train_step_vs_torch.py --app build/apps/convnext_zero --before $BEFORE --torch-heap-like-ours --rounds 3 --steps 20 --json $o/step_atto_f32.json > $o/step_atto_f32.txt 2>&1
python3 bench/zero_vs_torch.py --app build/apps/convnext_zero --torch-python $P --torch-heap-like-ours --rounds 3 --steps 40 --json $o/zero.json > $o/zero.txt 2>&1
python3 bench/zero_vs_torch.py --app $BEFORE --torch-python $P --stages 0,3 --steps 40 --json $o/zero_before.json > $o/zero_before.txt 2>&1
$P bench/train_step_vs_torch.py --app build/apps/convnext_zero --before $BEFORE --torch-heap-like-ours --model tiny --image-size 224 --batch 16 --dtype bf16 --rounds 2 --steps 3 --warmup 1 --json $o/step_tiny_bf16.json > $o/step_tiny_bf16.txt 2>&1
date > $o/end
# After run.sh: the profile (profile_tiny_f32.txt, 09:33 UTC) and a second ConvNeXt-T run (09:38-09:41 UTC):
#   build/bench/bench_train_step --model tiny --image 224 --batch 16 --profile 2
#   $P bench/train_step_vs_torch.py --app build/apps/convnext_zero --torch-heap-like-ours --model tiny --image-size 224 --batch 16 --rounds 3 --steps 3 --warmup 1 --json $o/step_tiny_f32_2.json > $o/step_tiny_f32_2.txt 2>&1
# A third ConvNeXt-T run with the before build (10:20-10:23 UTC):
#   $P bench/train_step_vs_torch.py --app build/apps/convnext_zero --before $BEFORE --torch-heap-like-ours --model tiny --image-size 224 --batch 16 --rounds 3 --steps 3 --warmup 1 --json $o/step_tiny_f32_3.json > $o/step_tiny_f32_3.txt 2>&1
