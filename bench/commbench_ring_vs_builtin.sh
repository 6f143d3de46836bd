#!/usr/bin/env bash
# Ring vs builtin on the CPU, as the communication issue reports it: commbench at one size for each op, both
# implementations alternating, REPS times each; prints the median out-of-place and in-place busbw (GB/s) and
# the ring/builtin ratio. Usage: bench/commbench_ring_vs_builtin.sh [BUILD_DIR] [NP] [SIZE] [REPS]
set -euo pipefail
build=${1:-build} np=${2:-2} size=${3:-16M} reps=${4:-5}
mpirun=(mpirun --allow-run-as-root --oversubscribe -np "$np")
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo "# $np ranks, $size, $reps runs each (-n 20 -w 5), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-15s %-8s %10s %10s\n" op impl oop_busbw ip_busbw
for op in reduce_scatter all_reduce all_gather; do
  declare -A oop=() ip=()
  for ((r = 0; r < reps; r++)); do
    for impl in builtin ring; do
      line=$("${mpirun[@]}" "$build/apps/commbench" -o "$op" --impl "$impl" -b "$size" -e "$size" -n 20 -w 5 -c 0 |
        grep -E '^ +[0-9]')
      oop[$impl]+="$(awk '{print $8}' <<<"$line") "
      ip[$impl]+="$(awk '{print $12}' <<<"$line") "
    done
  done
  for impl in builtin ring; do
    o=$(tr ' ' '\n' <<<"${oop[$impl]}" | grep . | median)
    i=$(tr ' ' '\n' <<<"${ip[$impl]}" | grep . | median)
    printf "%-15s %-8s %10s %10s\n" "$op" "$impl" "$o" "$i"
    eval "m_${impl}_o=$o m_${impl}_i=$i"
  done
  awk -v op="$op" -v ro="$m_ring_o" -v bo="$m_builtin_o" -v ri="$m_ring_i" -v bi="$m_builtin_i" \
    'BEGIN { printf "%-15s %-8s %9.2fx %9.2fx\n", op, "ratio", ro / bo, ri / bi }'
done
