#!/usr/bin/env bash
# Quiet-machine measurements for issue 43, evening session of 2026-11-27 (lead). Sequential.
# before = bd7565d (the previous session's head), built at /work/ab/app_head.
set -x
cd /work/main
P=/work/torchenv/bin/python
o=${OUT:-/work/meas2/final}
mkdir -p $o
date > $o/start
python3 bench/machine_info.py > $o/machine.txt
$P bench/machine_info.py >> $o/machine.txt
lscpu > $o/lscpu.txt
$P bench/train_step_vs_torch.py --app build/apps/convnext_zero --before /work/ab/app_head --rounds 3 --steps 20 --json $o/step_atto_f32.json > $o/step_atto_f32.txt 2>&1
python3 bench/zero_vs_torch.py --app build/apps/convnext_zero --torch-python $P --steps 20 --json $o/zero_after.json > $o/zero_after.txt 2>&1
python3 bench/zero_vs_torch.py --app /work/ab/app_head --torch-python $P --steps 20 --json $o/zero_before.json > $o/zero_before.txt 2>&1
$P bench/train_step_vs_torch.py --app build/apps/convnext_zero --before /work/ab/app_head --model tiny --image-size 224 --batch 16 --steps 3 --warmup 1 --json $o/step_tiny_f32.json > $o/step_tiny_f32.txt 2>&1
$P bench/train_step_vs_torch.py --app build/apps/convnext_zero --dtype bf16 --rounds 2 --steps 20 --json $o/step_atto_bf16.json > $o/step_atto_bf16.txt 2>&1
build/bench/bench_kernels --benchmark_filter='^block_mlp(_fwd)?/(fused|one_op)/' --benchmark_repetitions=5 --benchmark_report_aggregates_only=true > $o/block_mlp.txt 2>&1
build/bench/bench_train_step --model atto --image 64 --batch 32 --steps 10 --warmup 3 --profile 10 > $o/profile_atto_f32.txt 2>&1
date > $o/end
