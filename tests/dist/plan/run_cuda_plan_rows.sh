#!/usr/bin/env bash
# The memory plan on CUDA against the peak the caching allocator measured (issue 40 item 6): one short run
# per row, whose closing summary prints both ("peak memory A per rank (planned B"); the row passes when they
# are within 1%. A row that passes on a GPU goes into checked_cuda_rows() (src/dist/plan/planner.cpp), which
# takes the "not yet checked against a GPU" caveat off that row's summaries. Exit 77 (ctest: skipped) without a
# GPU or without the CUDA build.
#
#   run_cuda_plan_rows.sh ROW APP MPIEXEC
#     tiny_b64    ConvNeXt-T, 224 px, bf16, micro-batch 64, one rank
#     tiny_b128   the same at micro-batch 128
#     atto_np1    ConvNeXt-atto, 64 px, bf16, micro-batch 32, one rank (its step in CUDA graphs)
#     atto_np1_eager  the same with --cuda-graphs off: what of atto_np1's difference the graphs make
#     atto_np2    the same, 2 ranks sharing the GPU at stage 3 (over the MPI backend)
#     atto_np4    4 ranks at stage 3
#
# $CZ_REHEARSE=1 checks this script without a GPU: the row's ranks and stage with a small model on the CPU in
# fp32, where planned = measured holds exactly (tests/dist/plan); nothing is learnt about the GPU that way.
set -uo pipefail
row=$1 app=$2 mpiexec=$3
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
rehearse=${CZ_REHEARSE:-0}
np=1 args=()
case $row in
  tiny_b64 | tiny_b128)
    args=(--model tiny --image-size 224 --micro-batch "${row#tiny_b}" --data synthetic:n=512,eval_n=64,size=224) ;;
  atto_np1 | atto_np1_eager | atto_np2 | atto_np4)
    np=${row#atto_np}
    np=${np%_eager}
    args=(--model atto --image-size 64 --micro-batch 32 --data synthetic:n=1024,eval_n=64,size=64)
    ((np > 1)) && args+=(--stage 3)
    [[ $row == *_eager ]] && args+=(--cuda-graphs off) ;;
  *) fail "unknown row '$row' (tiny_b64, tiny_b128, atto_np1, atto_np1_eager, atto_np2, atto_np4)" ;;
esac
device=(--device cuda --precision bf16)
if ((rehearse)); then
  device=(--device cpu --precision fp32)
  args=(--depths 1,1,1,1 --dims 8,16,24,32 --image-size 32 --micro-batch 4 --data synthetic:n=64,eval_n=16,size=32)
  ((np > 1)) && args+=(--stage 3)
fi
common=("${args[@]}" "${device[@]}" --steps 3 --eval-batches 1 --loader-threads 1 --no-progress)
if ((np == 1)); then
  "$app" "${common[@]}" >"$work/out" 2>&1
else
  "$mpiexec" --allow-run-as-root --oversubscribe -np "$np" "$app" "${common[@]}" >"$work/out" 2>&1
fi
rc=$?
if ((rc != 0)); then
  if grep -qE "no CUDA GPU is available|no CUDA backend" "$work/out"; then
    echo "SKIP: $(grep -oE "no CUDA GPU is available.*|[^:]*no CUDA backend.*" "$work/out" | head -1)"
    exit 77
  fi
  cat "$work/out"
  fail "$row: the run exited $rc"
fi
line=$(grep -E "^done: " "$work/out") || { cat "$work/out"; fail "$row: no closing summary"; }
read -r measured planned < <(sed -nE 's/.*peak memory ([0-9.]+) MiB per rank \(planned ([0-9.]+) MiB.*/\1 \2/p' <<<"$line")
[[ -n "${measured:-}" && -n "${planned:-}" ]] || fail "$row: no 'peak memory A MiB per rank (planned B MiB' in: $line"
verdict=$(awk -v m="$measured" -v p="$planned" 'BEGIN { d = (p - m) / m; printf "%+.2f%% %s", 100 * d, (d <= 0.01 && d >= -0.01) ? "ok" : "off" }')
# One line per row, for the GPU check's summary (gpu-check.sh greps "plan row").
echo "plan row $row: planned $planned MiB, measured $measured MiB ($np rank(s)): ${verdict% *}"
grep -oE "peak memory [^;]*" <<<"$line"
# What cuDNN's heuristics asked for: the walk holds the largest patchify convolution's input plus output bytes
# (Note [The cuDNN workspace in the plan]); a row planned low by about the difference points there.
grep -E "^cuDNN workspace: " "$work/out" || true
[[ $verdict == *" ok" ]] || fail "$row: planned $planned MiB is not within 1% of the measured $measured MiB"
echo PASS
