#!/usr/bin/env bash
# The main job behind `./build.sh run`: a short ConvNeXt-atto training run on the embedded synthetic data, about a
# minute on 2 cores, evaluated on the synthetic eval split. Extra arguments go to convnext_zero.
set -euo pipefail
build_dir=${1:-build}
shift || true
mkdir -p runs
exec "$build_dir/apps/convnext_zero" --model atto --image-size 64 --num-classes 10 --data synthetic \
  --micro-batch 32 --steps 300 --warmup-steps 20 --lr 3e-3 --eval-every 100 --log runs/main_job.jsonl "$@"
