#!/usr/bin/env bash
# Issue 43, second session of 2026-11-28: this session's build against the session's starting point (eeacab6,
# built in a worktree at $BEFORE) and PyTorch, in turns, in one run. Sequential, on a quiet machine.
set -x
cd /work/main
P=/work/torchenv/bin/python
BEFORE=${BEFORE:-/work/old/build/apps/convnext_zero}
o=${OUT:-bench/results/cpu-2026-11-28b}
mkdir -p $o
date > $o/start
lscpu > $o/lscpu.txt
# One process, 2 threads: after, before and PyTorch in turns.
$P bench/train_step_vs_torch.py --app build/apps/convnext_zero --before $BEFORE --rounds 3 --steps 20 --json $o/step_atto_f32.json > $o/step_atto_f32.txt 2>&1
# 2 ranks x 1 thread against DDP and FSDP2, this build (twice), and the before build once.
python3 bench/zero_vs_torch.py --app build/apps/convnext_zero --torch-python $P --steps 40 --json $o/zero.json > $o/zero.txt 2>&1
python3 bench/zero_vs_torch.py --app $BEFORE --torch-python $P --steps 40 --json $o/zero_before.json > $o/zero_before.txt 2>&1
python3 bench/zero_vs_torch.py --app build/apps/convnext_zero --torch-python $P --steps 40 --json $o/zero_2.json > $o/zero_2.txt 2>&1
# ConvNeXt-T 224 px batch 16, one process, 2 threads.
$P bench/train_step_vs_torch.py --app build/apps/convnext_zero --before $BEFORE --model tiny --image-size 224 --batch 16 --rounds 3 --steps 3 --warmup 1 --json $o/step_tiny_f32.json > $o/step_tiny_f32.txt 2>&1
date > $o/end
# A second set at 05:00-05:10 UTC, when the host had become ~30% faster (both sides), with zero_vs_torch.py's
# --rounds (PyTorch and ours in turns, medians): the before build, then this one twice, and the one-process
# comparisons again.
#   python3 bench/zero_vs_torch.py --torch-python $P --rounds 3 --steps 40 --json $o/zero_r3.json
#   python3 bench/zero_vs_torch.py --app $BEFORE --torch-python $P --rounds 3 --steps 40 --json $o/zero_before_r3.json > $o/zero_before_r3.txt
#   $P bench/train_step_vs_torch.py --app build/apps/convnext_zero --before $BEFORE --rounds 3 --steps 20 --json $o/step_atto_f32_r3b.json > $o/step_atto_f32_r3b.txt
#   $P bench/train_step_vs_torch.py --app build/apps/convnext_zero --before $BEFORE --model tiny --image-size 224 --batch 16 --rounds 3 --steps 3 --warmup 1 --json $o/step_tiny_f32_r3b.json > $o/step_tiny_f32_r3b.txt
#   python3 bench/zero_vs_torch.py --torch-python $P --rounds 3 --steps 40 --json $o/zero_r3_2.json > $o/zero_r3_2.txt
