#!/usr/bin/env bash
# Quiet-machine measurements for issues 43 and 40 (lead, 2026-11-27). Sequential.
set -x
cd /work/main
P=/work/torchenv/bin/python
B=build
o=/work/meas
date > $o/start
python3 bench/machine_info.py > $o/machine.txt
$P bench/machine_info.py >> $o/machine.txt
lscpu > $o/lscpu.txt
# 1. GEMM table
$B/bench/bench_gemm_cpu > $o/gemm_cpu.md 2> $o/gemm_cpu.err
# 2. one-process step, atto 64 b32, before/after/PyTorch in turns
$P bench/train_step_vs_torch.py --app $B/apps/convnext_zero --before /work/baseline/convnext_zero --rounds 3 --steps 20 --json $o/step_atto_f32.json > $o/step_atto_f32.txt 2>&1
$P bench/train_step_vs_torch.py --app $B/apps/convnext_zero --dtype bf16 --rounds 3 --steps 20 --json $o/step_atto_bf16.json > $o/step_atto_bf16.txt 2>&1
# 3. fused vs unfused block MLP
$B/bench/bench_kernels --benchmark_filter='^block_mlp(_fwd)?/(un)?fused/' --benchmark_repetitions=5 --benchmark_report_aggregates_only=true > $o/block_mlp.txt 2>&1
# 4. two ranks against DDP and FSDP2 (after, then before)
python3 bench/zero_vs_torch.py --app $B/apps/convnext_zero --torch-python $P --steps 20 --json $o/zero_after.json > $o/zero_after.txt 2>&1
python3 bench/zero_vs_torch.py --app /work/baseline/convnext_zero --torch-python $P --steps 20 --json $o/zero_before.json > $o/zero_before.txt 2>&1
# 5. ConvNeXt-T 224 b16
$P bench/train_step_vs_torch.py --app $B/apps/convnext_zero --before /work/baseline/convnext_zero --model tiny --image-size 224 --batch 16 --steps 3 --warmup 1 --json $o/step_tiny_f32.json > $o/step_tiny_f32.txt 2>&1
$P bench/train_step_vs_torch.py --app $B/apps/convnext_zero --dtype bf16 --model tiny --image-size 224 --batch 16 --steps 3 --warmup 1 --json $o/step_tiny_bf16.json > $o/step_tiny_bf16.txt 2>&1
# 6. loader scaling with PyTorch columns (issue 40)
for r in crop full; do
  $P bench/loader_scaling.py --build $B --data /tmp/i40/inl --threads 1,2 --recipe $r --batches 20 --repeats 3 --torch --out $o/loader_$r.csv > $o/loader_$r.txt 2>&1
done
date > $o/end
