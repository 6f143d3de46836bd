#!/usr/bin/env bash
# Runs across the test bed of hosts (scripts/hosts.sh). Usage: run_hosts_tests.sh CASE HOSTS_SH PROBE APP COMMBENCH MPIEXEC
#   bed                    2 hosts x 2 ranks: each host has its own host name and shared-memory group, both paths
#                          carry data; down (and down after a killed "with") leaves no namespace, link, mount,
#                          file or process behind
#   zero_matches_one_host  convnext_zero on 2 hosts x 2 ranks at ZeRO stages 0 and 3 logs the losses and gradient
#                          norms of 4 ranks on one host, to the bit, with --comm-impl flat, and with hier against
#                          2 hosts simulated on one
#   shaped_link            commbench's all-reduce bus bandwidth between 2 hosts at 100 Mbit/s is a small fraction
#                          of the unshaped figure
#   hier_commbench         commbench --impl hier on 2 hosts x 2 ranks: right values for every op, and about 2/3
#                          of the flat ring's bytes on host 1's link per all-reduce
# Exits 77 (ctest: skipped) with a SKIP line where namespaces cannot be made (not root).
set -uo pipefail
case_name=$1 hosts_sh=$2 probe=$3 app=$4 commbench=$5 mpiexec=$6
work=$(mktemp -d)
# A bed of its own (CZ_HOSTS_BED), so that a bed someone is using by hand is never touched.
export CZ_HOSTS_BED=t$$
trap '"$hosts_sh" down > /dev/null 2>&1; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Skip where namespaces cannot be made: hosts.sh up exits 77 with the reason.
"$hosts_sh" up 1 1 > "$work/probe.out" 2>&1
rc=$?
if ((rc == 77)); then cat "$work/probe.out"; exit 77; fi
((rc == 0)) || { cat "$work/probe.out"; fail "hosts.sh up 1 1 exited with $rc"; }
"$hosts_sh" down || fail "hosts.sh down"

# Everything of a bed that could be left behind, one item a line.
leftovers() {
  local b=$1
  ip netns list | awk '{ print "netns " $1 }' | grep -E "czhosts-$b-"
  grep -F "/run/cz-hosts/$b" /proc/self/mountinfo | awk '{ print "mount " $5 }'
  [[ -e /run/cz-hosts/$b ]] && echo "file /run/cz-hosts/$b"
  local p
  for p in $(cat "$work"/holders 2> /dev/null); do
    [[ -r /proc/$p/stat ]] && awk '$3 != "Z" { print "process " $1 " " $2 }' "/proc/$p/stat"
  done
  return 0
}

# Prints "<step> <loss> <grad_norm>" for each step record of a JSON-lines log, the numbers' text as logged.
steps_of() {
  grep -v '"split"' "$1" | sed -E 's/.*"grad_norm":([^,}]+).*"loss":([^,}]+).*"step":([^,}]+).*/\3 \2 \1/'
}

case $case_name in
bed)
  links_before=$(ip -o link show | awk -F': ' '{ print $2 }' | sort)
  # Inside the bed: record the holders, run the probe, copy the bed's files for inspection.
  inside() {
    cat /run/cz-hosts/$CZ_HOSTS_BED/h*.pid > "$work/holders"
    "$hosts_sh" run "$probe" > "$work/probe.out" 2> "$work/probe.err" || { cat "$work/probe.err"; return 1; }
    "$hosts_sh" exec 2 hostname > "$work/h2.name" && "$hosts_sh" bytes 1 > "$work/bytes"
  }
  export -f inside
  export hosts_sh probe work
  "$hosts_sh" with 2 2 -- bash -c inside || fail "the probe failed on 2 hosts x 2 ranks"
  cat "$work/probe.out" "$work/probe.err" "$work/bytes"
  [[ $(wc -l < "$work/probe.out") -eq 4 ]] || fail "expected 4 ranks' lines"
  grep -q "OMP_NUM_THREADS=1 per rank" "$work/probe.err" || fail "run did not say which thread count it used"
  awk '{ host[$2] = $4; lr[$2] = $6; ls[$2] = $8; grp[$2] = $10; sums[$2] = $12 }
       END {
         b = ENVIRON["CZ_HOSTS_BED"]
         for (r = 0; r < 4; ++r) {
           h = (r < 2) ? 1 : 2
           if (host[r] != b "-h" h) { print "rank " r " on host " host[r] ", expected " b "-h" h; bad = 1 }
           if (ls[r] != 2 || lr[r] != r % 2 || grp[r] != 2 * (h - 1)) {
             print "rank " r ": shared group " grp[r] " local " lr[r] "/" ls[r] ", expected group " 2 * (h - 1) " local " r % 2 "/2"; bad = 1 }
           if (sums[r] != "ok") { print "rank " r ": wrong all-reduce sums"; bad = 1 }
         }
         exit bad }' "$work/probe.out" || fail "hosts or shared-memory groups are not per host"
  [[ $(cat "$work/h2.name") == "$CZ_HOSTS_BED-h2" ]] || fail "hosts.sh exec 2 hostname gave $(cat "$work/h2.name")"
  tx=$(awk '{ print $3 }' "$work/bytes")
  ((tx > 1000000)) || fail "host 1 sent $tx bytes, expected at least its half of the 1 MiB world all-reduce"
  left=$(leftovers "$CZ_HOSTS_BED")
  [[ -z $left ]] || fail "left behind after down: $left"
  [[ $(ip -o link show | awk -F': ' '{ print $2 }' | sort) == "$links_before" ]] || fail "the machine's links changed"
  # A crash: the "with" process killed outright cannot clean up; "down" removes what it left.
  "$hosts_sh" with 2 1 -- sleep 60 > /dev/null 2>&1 &
  with_pid=$!
  for ((i = 0; i < 100; ++i)); do [[ -s /run/cz-hosts/$CZ_HOSTS_BED/settings ]] && break; sleep 0.1; done
  cat /run/cz-hosts/$CZ_HOSTS_BED/h*.pid > "$work/holders" || fail "the bed did not come up"
  kill -KILL "$with_pid"
  wait "$with_pid" 2> /dev/null
  [[ -n $(leftovers "$CZ_HOSTS_BED") ]] || fail "nothing left after SIGKILL: the crash case tests nothing"
  "$hosts_sh" down || fail "down after a crash"
  left=$(leftovers "$CZ_HOSTS_BED")
  [[ -z $left ]] || fail "left behind after down following a crash: $left"
  [[ $(ip -o link show | awk -F': ' '{ print $2 }' | sort) == "$links_before" ]] || fail "the machine's links changed"
  echo "bed: OK"
  ;;
zero_matches_one_host)
  tiny=(--depths 1,1,1,1 --dims 8,16,24,32 --num-classes 4 --image-size 32 --data synthetic:n=256,eval_n=64,classes=4
        --steps 3 --micro-batch 4 --loader-threads 1 --no-progress)
  # Each algorithm against itself: the flat ring, and two levels (Note [Two-level collectives]), which sum in
  # another order than the ring, on 2 hosts simulated on one ($CZ_SIMULATE_HOSTS). 4 ranks on 2 cores give
  # each rank one thread both ways (the kernels' sums do not depend on it, but the comparison should not rest
  # on that).
  for impl in flat hier; do
    sim=
    [[ $impl == hier ]] && sim=2
    for stage in 0 3; do
      CZ_SIMULATE_HOSTS=$sim OMP_NUM_THREADS=1 "$mpiexec" --allow-run-as-root --oversubscribe -np 4 "$app" "${tiny[@]}" \
        --stage $stage --comm-impl $impl --log "$work/one_${impl}_s$stage.jsonl" > "$work/one.out" 2>&1 ||
        { cat "$work/one.out"; fail "4 ranks on one host, stage $stage, --comm-impl $impl"; }
    done
  done
  across() {
    local stage impl
    for impl in flat hier; do
      for stage in 0 3; do
        "$hosts_sh" run "$app" "${tiny[@]}" --stage $stage --comm-impl $impl --log "$work/two_${impl}_s$stage.jsonl" \
          > "$work/two.out" 2>&1 || { cat "$work/two.out"; return 1; }
      done
    done
  }
  export -f across
  export hosts_sh app work
  export tiny_flags="${tiny[*]}"
  "$hosts_sh" with 2 2 -- bash -c 'tiny=($tiny_flags); across' || fail "2 hosts x 2 ranks failed"
  for impl in flat hier; do
    for stage in 0 3; do
      one=$work/one_${impl}_s$stage.jsonl two=$work/two_${impl}_s$stage.jsonl
      paste -d' ' <(steps_of "$one") <(steps_of "$two") > "$work/both"
      echo "--comm-impl $impl, stage $stage: step loss grad_norm (1 host x 4) | step loss grad_norm (2 hosts x 2)"
      cat "$work/both"
      [[ $(wc -l < "$work/both") -eq 3 ]] || fail "expected 3 step records in each log"
      diff <(steps_of "$one") <(steps_of "$two") ||
        fail "--comm-impl $impl, stage $stage: 2 hosts x 2 ranks differ from 4 ranks on one host"
      diff <(grep '"split"' "$one") <(grep '"split"' "$two") ||
        fail "--comm-impl $impl, stage $stage: the evaluations differ"
    done
  done
  echo "zero_matches_one_host: OK"
  ;;
shaped_link)
  # 2 hosts x 1 rank, 4 MiB ring all-reduce: unshaped, then the same bed at 100 Mbit/s (12.5 MB/s, so about
  # 0.34 s per all-reduce). Bus bandwidth from the out-of-place time (commbench's busbw column has 2 decimals).
  bench() {
    "$hosts_sh" run "$commbench" -o all_reduce -b 4M -e 4M --impl ring "$@" 2> "$work/bench.err" |
      awk '$1 == 4194304 { printf "%.4f\n", $1 / $6 / 1000 }'  # 2 ranks: busbw = algbw = bytes / time
  }
  measure() {
    bench -n 20 -w 3 > "$work/unshaped" && "$hosts_sh" shape 100mbit && bench -n 4 -w 1 > "$work/shaped"
  }
  export -f bench measure
  export hosts_sh commbench work
  "$hosts_sh" with 2 1 -- bash -c measure || { cat "$work/bench.err"; fail "commbench on the bed failed"; }
  unshaped=$(cat "$work/unshaped") shaped=$(cat "$work/shaped")
  echo "all_reduce 4 MiB ring, 2 hosts x 1 rank: busbw unshaped $unshaped GB/s, at 100 Mbit/s $shaped GB/s"
  [[ -n $unshaped && -n $shaped ]] || { cat "$work/bench.err"; fail "no 4 MiB row in commbench's output"; }
  # The link is 0.0125 GB/s; unshaped veth links on this machine give 0.1-1 GB/s, depending on load.
  awk -v u="$unshaped" -v s="$shaped" 'BEGIN { exit !(s > 0 && s < 0.25 * u && s < 0.0125 * 1.5) }' ||
    fail "the shaped link is not slow: $shaped GB/s against $unshaped GB/s unshaped"
  echo "shaped_link: OK (ratio $(awk -v u="$unshaped" -v s="$shaped" 'BEGIN { printf "%.3f", s / u }'))"
  ;;
hier_commbench)
  # 2 hosts x 2 ranks, --impl hier: every op's values are right at an uneven size (1030 B of halves: 515
  # elements over 4 ranks) and at 4 MiB, commbench says it ran two levels, and host 1's veth sends about 2/3
  # of the flat ring's bytes per all-reduce (Note [Two-level cost model]: 2(H-1)/H of the buffer against
  # 2(HR-1)/(HR)), measured over runs of equal length so that start-up is in both.
  check() {
    local op impl
    for op in all_reduce reduce_scatter all_gather; do
      "$hosts_sh" run "$commbench" -o $op --impl hier -d half -b 1030 -e 5M -f 4096 -n 2 -w 1 > "$work/$op.out" \
        2> "$work/err" || { cat "$work/$op.out" "$work/err"; return 1; }
    done
    for impl in ring hier; do
      local before after
      before=$("$hosts_sh" bytes 1 | awk '{ print $3 }')
      "$hosts_sh" run "$commbench" -o all_reduce --impl $impl -b 4M -e 4M -n 8 -w 1 > /dev/null 2> "$work/err" ||
        { cat "$work/err"; return 1; }
      after=$("$hosts_sh" bytes 1 | awk '{ print $3 }')
      echo $((after - before)) > "$work/tx_$impl"
    done
  }
  export -f check
  export hosts_sh commbench work
  "$hosts_sh" with 2 2 -- bash -c check || fail "commbench --impl hier on 2 hosts x 2 ranks failed"
  for op in all_reduce reduce_scatter all_gather; do
    grep -E "^# hier|^ +[0-9]+ |Out of bounds" "$work/$op.out"
    grep -q "^# hier: as asked (2 hosts x 2 ranks)" "$work/$op.out" || fail "$op: commbench did not run two levels"
    grep -q "Out of bounds values : 0 OK" "$work/$op.out" || fail "$op: wrong values"
    [[ $(grep -cE '^ +(1030|4218880) ' "$work/$op.out") -eq 2 ]] || fail "$op: expected the 1030 and 4218880 byte rows"
  done
  ring=$(cat "$work/tx_ring") hier=$(cat "$work/tx_hier")
  ratio=$(awk -v h="$hier" -v r="$ring" 'BEGIN { printf "%.3f", h / r }')
  echo "host 1 veth tx for 18 all-reduces of 4 MiB: ring $ring bytes, hier $hier bytes, ratio $ratio"
  awk -v x="$ratio" 'BEGIN { exit !(x > 0.55 && x < 0.8) }' || fail "hier should send about 2/3 of the ring's bytes, got $ratio"
  echo "hier_commbench: OK"
  ;;
*) fail "unknown case $case_name" ;;
esac
