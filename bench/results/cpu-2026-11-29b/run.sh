#!/usr/bin/env bash
# 2026-11-29, second run (AMD EPYC family 23, 2 cores, AVX2): the same measurement as cpu-2026-11-29 (the CPU
# step, and against PyTorch in the same run), after one list of element types (DTypeTypes), into this folder.
#   TORCH_PY=/work/torchenv/bin/python bench/results/cpu-2026-11-29b/run.sh
exec "$(dirname "$0")/../cpu-2026-11-29/run.sh" bench/results/cpu-2026-11-29b
