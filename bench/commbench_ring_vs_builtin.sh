#!/usr/bin/env bash
# Ring vs builtin on the CPU, as the communication issue reports it: commbench at one size for each op, both
# implementations alternating, REPS times each; prints the median and the best out-of-place and in-place
# busbw (GB/s) and the ring/builtin ratios of both. The best run is the least disturbed one when other
# work shares the cores. Usage: bench/commbench_ring_vs_builtin.sh [BUILD_DIR] [NP] [SIZE] [REPS]
set -euo pipefail
build=${1:-build} np=${2:-2} size=${3:-16M} reps=${4:-5}
mpirun=(mpirun --allow-run-as-root --oversubscribe -np "$np")
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
best() { sort -g | tail -1; }
echo "# $np ranks, $size, $reps runs each (-n 20 -w 5), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-15s %-8s %10s %10s %10s %10s\n" op impl oop_median ip_median oop_best ip_best
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
    ob=$(tr ' ' '\n' <<<"${oop[$impl]}" | grep . | best)
    ib=$(tr ' ' '\n' <<<"${ip[$impl]}" | grep . | best)
    printf "%-15s %-8s %10s %10s %10s %10s\n" "$op" "$impl" "$o" "$i" "$ob" "$ib"
    eval "m_${impl}_o=$o m_${impl}_i=$i m_${impl}_ob=$ob m_${impl}_ib=$ib"
  done
  awk -v op="$op" -v ro="$m_ring_o" -v bo="$m_builtin_o" -v ri="$m_ring_i" -v bi="$m_builtin_i" \
    -v rob="$m_ring_ob" -v bob="$m_builtin_ob" -v rib="$m_ring_ib" -v bib="$m_builtin_ib" \
    'BEGIN { printf "%-15s %-8s %9.2fx %9.2fx %9.2fx %9.2fx\n", op, "ratio", ro / bo, ri / bi, rob / bob, rib / bib }'
done
