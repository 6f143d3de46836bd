#!/usr/bin/env bash
# Quiet-machine measurements for issue 43, session of 2026-11-28. Sequential.
set -x
cd /work/main
P=/work/torchenv/bin/python
o=${OUT:-bench/results/cpu-2026-11-28}
mkdir -p $o
date > $o/start
lscpu > $o/lscpu.txt
$P bench/train_step_vs_torch.py --app build/apps/convnext_zero --rounds 3 --steps 20 --json $o/step_atto_f32.json > $o/step_atto_f32.txt 2>&1
$P bench/train_step_vs_torch.py --app build/apps/convnext_zero --model tiny --image-size 224 --batch 16 --rounds 2 --steps 3 --warmup 1 --json $o/step_tiny_f32.json > $o/step_tiny_f32.txt 2>&1
python3 bench/zero_vs_torch.py --app build/apps/convnext_zero --torch-python $P --steps 20 --json $o/zero.json > $o/zero.txt 2>&1
date > $o/end
# The two profiles (ConvNeXt-T 224 px batch 16, 2 threads), run before the above:
#   build/bench/bench_train_step --model tiny --image 224 --batch 16 --steps 2 --warmup 1 --profile 2 > $o/profile_tiny_f32.txt
#   $P bench/train_step_torch.py --model tiny --device cpu --dtype f32 --batch 16 --image 224 --warmup 1 --steps 2 --threads 2 --profile 2 > $o/profile_tiny_torch.txt
# The GEMM table: build/bench/bench_gemm_cpu > $o/gemm_cpu.md
# A second run of each, later the same morning:
#   python3 bench/zero_vs_torch.py --app build/apps/convnext_zero --torch-python $P --steps 40 --json $o/zero_40.json > $o/zero_40.txt
#   $P bench/train_step_vs_torch.py --app build/apps/convnext_zero --model tiny --image-size 224 --batch 16 --rounds 3 --steps 3 --warmup 1 --json $o/step_tiny_f32_r3.json > $o/step_tiny_f32_r3.txt
