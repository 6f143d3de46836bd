#!/usr/bin/env bash
# Two-level against flat collectives on the test bed (docs/comm.md, "Two-level collectives"): commbench's 4 MiB
# all-reduce, reduce-scatter and all-gather with --impl ring and --impl hier on 2 hosts x 2 ranks, unshaped and
# at 1 Gbit/s, runs alternating between the two; and the bytes host 1's veth sent per 4 MiB all-reduce with
# each. Run as root: bench/hier_hosts.sh [BUILD_DIR] [REPS]
#
# Bus bandwidth (GB/s, out of place) from the time column, as nccl-tests defines it for 4 ranks (all-reduce
# 2(n-1)/n = 1.5, the others (n-1)/n = 0.75); commbench's own busbw column has two decimals only. Bytes per
# call: two runs of A and B timed iterations, (tx after the B-run - tx after the A-run) / (2 (B - A)) (each
# iteration runs out of place and in place), so that start-up and the warm-up cancel.
set -euo pipefail
source "$(dirname "$0")/bed_common.sh"
bed_common hier 3 "$@"

busbw() {  # OP IMPL ITERS -> busbw of the 4 MiB row
  local factor=0.75
  [[ $1 == all_reduce ]] && factor=1.5
  "$hosts" run "$build/apps/commbench" -o "$1" -b 4M -e 4M --impl "$2" -n "$3" -w 2 2> "$work/err" |
    awk -v f=$factor '$1 == 4194304 { printf "%.4f\n", $1 / $6 / 1000 * f } /^# (hier|auto)/ { print > "/dev/stderr" }'
}
export -f busbw

table() {
  local rate op impl i
  for rate in none 1gbit; do
    "$hosts" shape "$rate" 2> /dev/null
    local n=20
    [[ $rate == 1gbit ]] && n=8
    echo "# $rate: commbench -b 4M -e 4M -n $n -w 2, 2 hosts x 2 ranks; busbw GB/s (out of place), $reps runs each"
    printf "%-15s %8s %8s %8s %8s %7s\n" op ring_med ring_max hier_med hier_max ratio
    for op in all_reduce reduce_scatter all_gather; do
      : > "$work/ring"
      : > "$work/hier"
      for ((i = 0; i < reps; ++i)); do
        for impl in ring hier; do busbw $op $impl $n >> "$work/$impl" 2> /dev/null; done
      done
      local rm hm
      rm=$(median < "$work/ring") hm=$(median < "$work/hier")
      printf "%-15s %8s %8s %8s %8s %6.2fx\n" $op "$rm" "$(sort -g "$work/ring" | tail -1)" "$hm" \
        "$(sort -g "$work/hier" | tail -1)" "$(awk -v a="$hm" -v b="$rm" 'BEGIN { print a / b }')"
    done
  done
}
export -f table

bytes() {
  local impl iters a=10 b=30
  "$hosts" shape 1gbit 2> /dev/null
  echo "# host 1's veth tx per 4 MiB all-reduce (from runs of -n $a and -n $b), 2 hosts x 2 ranks at 1 Gbit/s"
  for impl in ring hier; do
    for iters in $a $b; do
      local before after
      before=$("$hosts" bytes 1 | awk '{ print $3 }')
      busbw all_reduce $impl $iters > /dev/null 2>&1
      after=$("$hosts" bytes 1 | awk '{ print $3 }')
      echo $((after - before)) > "$work/tx_$iters"
    done
    echo "$impl $((($(cat "$work/tx_$b") - $(cat "$work/tx_$a")) / (2 * (b - a))))"
  done | awk '{ tx[$1] = $2; printf "%-5s %12d bytes  %.3f x 4 MiB\n", $1, $2, $2 / 4194304 }
              END { printf "hier / ring %.3f\n", tx["hier"] / tx["ring"] }'
}
export -f bytes

"$hosts" with 2 2 -- bash -c 'table && bytes'
