#!/usr/bin/env bash
# The test bed's figures in docs/comm.md ("Running across hosts"): commbench's 4 MiB ring all-reduce between
# 2 hosts x 1 rank unshaped, at 1 Gbit/s and at 200 Mbit/s; convnext_zero (atto, 64 px, micro-batch 16) on
# 2 hosts x 2 ranks at 1 Gbit/s, stages 0 and 3 flat, HSDP (--stage 3 --shard-group host) and hpZ (--stage 3
# --hpz): img/s, the engine's comm_bytes and comm_cross_bytes (rank 0's; x 2 ranks per host: what the engine
# says leaves host 1), and what host 1's veth sent per step. Run as root: bench/hosts_figures.sh [BUILD_DIR]
# [REPS]; "train" or "links" as a third argument runs only that part.
#
# Bytes per step: two runs of A and B steps, (veth tx after B-run - veth tx after A-run) / (B - A), so that
# start-up (wire-up, the initial broadcast) and the final evaluation cancel.
set -euo pipefail
source "$(dirname "$0")/bed_common.sh"
bed_common fig 5 "${@:1:2}"

links() {
  local rate i
  echo "# commbench -o all_reduce -b 4M -e 4M --impl ring, 2 hosts x 1 rank; busbw GB/s (out of place), $reps runs"
  printf "%-10s %8s %8s %8s  %s\n" rate median min max runs
  for rate in none 1gbit 200mbit; do
    "$hosts" shape "$rate" 2> /dev/null
    local n=20
    [[ $rate == 200mbit ]] && n=8
    : > "$work/bw"
    for ((i = 0; i < reps; ++i)); do
      "$hosts" run "$build/apps/commbench" -o all_reduce -b 4M -e 4M --impl ring -n $n -w 2 2> /dev/null |
        awk '$1 == 4194304 { printf "%.4f\n", $1 / $6 / 1000 }' >> "$work/bw"
    done
    printf "%-10s %8s %8s %8s  %s\n" "${rate/none/unshaped}" "$(median < "$work/bw")" "$(sort -g "$work/bw" | head -1)" \
      "$(sort -g "$work/bw" | tail -1)" "$(tr '\n' ' ' < "$work/bw")"
  done
}
export -f links

train() {
  local run name steps a=4 b=14
  local flags=(--model atto --image-size 64 --micro-batch 16 --data synthetic:n=4096,eval_n=64 --no-progress
               --loader-threads 1)
  echo "# convnext_zero ${flags[*]}, 2 hosts x 2 ranks at 1 Gbit/s"
  echo "# img/s: mean over steps 3-$b; host 1 tx: veth bytes per step from runs of $a and $b steps;"
  echo "# cross_host: comm_cross_bytes x 2 ranks per host (the engine's count of what leaves host 1)"
  printf "%-6s %8s %10s %10s %14s %14s %16s %8s\n" run img_s comm_s exposed_s comm_bytes_rank cross_host \
    host1_tx_step tx/cross
  for run in "s0:--stage 0" "s3:--stage 3" "hsdp:--stage 3 --shard-group host" "hpz:--stage 3 --hpz"; do
    name=${run%%:*}
    for steps in $a $b; do
      local before after
      before=$("$hosts" bytes 1 | awk '{ print $3 }')
      # shellcheck disable=SC2086
      "$hosts" run "$build/apps/convnext_zero" "${flags[@]}" ${run#*:} --steps $steps \
        --log "$work/${name}_$steps.jsonl" > "$work/out" 2>&1 || { cat "$work/out"; return 1; }
      after=$("$hosts" bytes 1 | awk '{ print $3 }')
      echo $((after - before)) > "$work/tx_${name}_$steps"
    done
    local log="$work/${name}_$b.jsonl"
    local tx=$((($(cat "$work/tx_${name}_$b") - $(cat "$work/tx_${name}_$a")) / (b - a)))
    grep '"split":"train"' "$log" | awk -v tx="$tx" -v name="$name" '
      { match($0, /"img_per_s":[^,}]+/); img = substr($0, RSTART + 12, RLENGTH - 12)
        match($0, /"comm_s":[^,}]+/); cs = substr($0, RSTART + 9, RLENGTH - 9)
        match($0, /"comm_exposed_s":[^,}]+/); ce = substr($0, RSTART + 17, RLENGTH - 17)
        match($0, /"comm_bytes":[^,}]+/); cb = substr($0, RSTART + 13, RLENGTH - 13)
        match($0, /"comm_cross_bytes":[^,}]+/); cx = 2 * substr($0, RSTART + 19, RLENGTH - 19)
        if (NR >= 3) { n++; si += img; sc += cs; se += ce } }
      END { printf "%-6s %8.1f %10.3f %10.3f %14.0f %14.0f %16.0f %8.3f\n", name, si / n, sc / n, se / n, cb, cx, tx,
                   (cx > 0 ? tx / cx : 0) }'
  done
}
export -f train

part=${3:-all}
if [[ $part == all || $part == links ]]; then "$hosts" with 2 1 -- bash -c links; fi
if [[ $part == all || $part == train ]]; then "$hosts" with 2 2 --rate 1gbit -- bash -c train; fi
