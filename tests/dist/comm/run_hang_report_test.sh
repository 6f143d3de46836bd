#!/usr/bin/env bash
# A hang explained (Note [Collective log]) on a real job: convnext_zero at ZeRO stage 2 with --comm-timeout 3
# and --trace over every step; once it logs steps, one rank is stopped with SIGSTOP. Every live rank must print
# its own collectives and a timeout message naming the stopped rank, its pid, "stopped" and the collective it
# last did, within the timeout plus 5 s of the stop; the job must end non-zero; rank 0's --trace file and
# every other live rank's FILE.rankN must be valid JSON (Note [Trace after a failure]).
#
#   run_hang_report_test.sh cpu MPIEXEC APP           3 CPU ranks on this machine; rank 1 stopped
#   run_hang_report_test.sh hosts MPIEXEC APP HOSTS_SH  2 hosts x 2 ranks of scripts/hosts.sh; rank 3 (host 2)
#                                                     stopped: rank 0 and 1 on host 1 learn its log from rank
#                                                     2's responder (Note [Logs across hosts]); exits 77
#                                                     where namespaces cannot be made
set -u

if [[ $1 == wrap ]]; then  # wrap DIR CMD...: one rank, its pid noted for the test
  dir=$2
  shift 2
  "$@" &
  child=$!
  echo "$child" > "$dir/pid.${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-0}}"
  wait "$child"
  exit
fi

mode=$1 mpiexec=$2 app=$3 hosts_sh=${4:-}
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
timeout_s=3
slack=5
mpid=

if [[ $mode == hosts && ${CZ_HANG_INNER:-} != 1 ]]; then
  export CZ_HOSTS_BED=g$$ CZ_HANG_INNER=1
  "$hosts_sh" with 2 2 -- bash "$self" "$@"
  rc=$?
  ((rc == 77)) && exit 77
  exit $rc
fi

now_ms() { echo $(($(date +%s%N) / 1000000)); }
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat:0:1} != [ZX] ]]
}
cleanup() {  # the launcher first, then whatever it left: a stopped rank ignores all but SIGKILL
  local f
  if [[ -n $mpid ]] && alive "$mpid"; then
    kill -TERM "$mpid" 2> /dev/null
    for _ in $(seq 50); do alive "$mpid" || break; sleep 0.1; done
    kill -KILL "$mpid" 2> /dev/null
  fi
  for f in "$work"/pid.*; do [[ -e $f ]] && kill -KILL "$(cat "$f")" 2> /dev/null; done
  wait 2> /dev/null
}
on_exit cleanup
on_fail() {
  echo "--- output"
  cat "$work/out"
}

run=("$app" --depths 1,1,1,1 --dims 8,16,24,32 --num-classes 5 --image-size 32 --loader-threads 1 --no-progress
  --data synthetic:n=256,eval_n=64,classes=5 --micro-batch 8 --bucket-mb 0.01 --stage 2 --steps 100000
  --comm-timeout "$timeout_s" --log "$work/run.jsonl" --trace "$work/t.json" --trace-steps 1:100000)
if [[ $mode == cpu ]]; then
  np=3 victim=1 live=(0 2)
  "$mpiexec" --allow-run-as-root --oversubscribe -np $np bash "$self" wrap "$work" "${run[@]}" > "$work/out" 2>&1 &
else
  np=4 victim=3 live=(0 1 2)
  export CZ_HOSTS_THREADS=1
  "$hosts_sh" run -- "${run[@]}" > "$work/out" 2>&1 &
fi
mpid=$!

for _ in $(seq 900); do  # a few steps logged (start-up is slow on a loaded machine)
  steps=$(grep -c '"split":"train"' "$work/run.jsonl" 2> /dev/null); ((${steps:-0} >= 5)) && break
  alive "$mpid" || fail "the job ended before it logged 5 steps"
  sleep 0.1
done
steps=$(grep -c '"split":"train"' "$work/run.jsonl" 2> /dev/null); ((${steps:-0} >= 5)) || fail "no 5 steps within 90 s"

if [[ $mode == cpu ]]; then
  victim_pid=$(cat "$work/pid.$victim")
else  # rank 3 runs on host 2, found by its environment among the host's processes
  victim_pid=
  for p in $(ip netns pids "czhosts-$CZ_HOSTS_BED-h2"); do
    [[ $(readlink "/proc/$p/exe" 2> /dev/null) == */convnext_zero ]] || continue
    tr '\0' '\n' < "/proc/$p/environ" | grep -qx "OMPI_COMM_WORLD_RANK=$victim" && victim_pid=$p
  done
  [[ -n $victim_pid ]] || fail "rank $victim not found on host 2"
  echo "$victim_pid" > "$work/pid.$victim"
fi
kill -STOP "$victim_pid" || fail "cannot stop rank $victim (pid $victim_pid)"
t0=$(now_ms)
echo "stopped rank $victim (pid $victim_pid) after $(grep -c '"split":"train"' "$work/run.jsonl") steps"

# Each live rank's report: the stopped rank, its pid, its state and its last collective.
report="comm timeout: .* rank $victim \(host [^,]+, pid $victim_pid, stopped\) last did [a-z_]+ #[0-9]+ of [0-9.]+ [KMG]?i?B on [a-z_.-]+, started [0-9.]+ s ago, state (running|done)"
declare -A seen=()
while (($(now_ms) - t0 < (timeout_s + slack + 20) * 1000)); do
  for r in "${live[@]}"; do
    [[ -z ${seen[$r]:-} ]] && grep -qE "^\[rank $r\] .*$report" "$work/out" && seen[$r]=$(($(now_ms) - t0))
  done
  ((${#seen[@]} == ${#live[@]})) && ! alive "$mpid" && break
  sleep 0.05
done
wait "$mpid"
rc=$?
mpid=
cat "$work/out"
((rc != 0)) || fail "the job exited 0"
for r in "${live[@]}"; do
  [[ -n ${seen[$r]:-} ]] || fail "rank $r printed no report naming rank $victim and its last collective"
  echo "rank $r reported $((seen[$r] / 1000)).$((seen[$r] % 1000 / 100)) s after the stop"
  ((seen[$r] <= (timeout_s + slack) * 1000)) || fail "rank $r reported later than the timeout + ${slack} s"
  grep -qE "^\[rank $r\] collectives of this rank, newest first" "$work/out" ||
    grep -qE "^\[rank $r\] comm failure: .*failed earlier" "$work/out" || fail "rank $r printed no log"
done
grep -E "^\[rank [0-9]+\] .*$report" "$work/out" | head -1 | sed 's/^/report: /'

# --trace: rank 0's file and the other live ranks' parts are whole JSON documents.
for r in "${live[@]}"; do
  f=$work/t.json
  ((r == 0)) || f=$work/t.json.rank$r
  [[ -e $f ]] || fail "rank $r left no trace $f"
  "$py" -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["traceEvents"], "no events"' "$f" ||
    fail "$f is not a valid trace"
done
echo "PASS"
