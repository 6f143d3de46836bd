#!/usr/bin/env bash
# The main job behind `./build.sh run`. Until the training app lands this runs the kernel benchmarks.
set -euo pipefail
build_dir=${1:-build}
exec "$build_dir/bench/bench_kernels" --benchmark_min_time=0.2
