#!/usr/bin/env bash
# The main job behind `./build.sh run`: convnext_zero's default run (ConvNeXt-atto on the embedded synthetic data,
# 300 steps, evaluated on the synthetic eval split; docs/training.md), logged to runs/main_job.jsonl. Extra
# arguments go to convnext_zero.
set -euo pipefail
build_dir=${1:-build}
shift || true
mkdir -p runs
exec "$build_dir/apps/convnext_zero" --log runs/main_job.jsonl "$@"
