#!/usr/bin/env bash
# Checks of Note [Back-pressure] and Note [Failure handling] (communicator.h) on real jobs under mpirun, with
# every rank started through this script's `wrap` mode, so that the tests know each rank's own pid and the
# launcher watches a shell instead of the rank (a stopped rank then looks to it like a real hang).
#
#   memory MPIRUN NP SECONDS LIMIT_MB READY PROGRESS CMD...
#     CMD (a benchmark with a huge -n, or a flood of collectives) runs for SECONDS after its output matched
#     READY (it got past start-up); every rank's peak resident memory (VmHWM) must stay under LIMIT_MB, and
#     the output must then match PROGRESS (when not empty), so that a job that stopped communicating cannot
#     pass. The job is stopped either way.
#   stall MPIRUN NP VICTIM COMM_TIMEOUT READY WHAT CMD...
#     Two seconds after the output matched READY, rank VICTIM is stopped with SIGSTOP. The job must exit non-zero within
#     COMM_TIMEOUT plus a slack, and a surviving rank must have printed "comm timeout: WHAT after COMM_TIMEOUT
#     s (waiting for rank K)": with 2 ranks K must be the victim; with more, the survivor that times out first
#     may be waiting for another survivor that waits for the victim.
#
# The stopped rank and every other process of the job are killed on the way out, whatever happened.
set -u

if [[ $1 == wrap ]]; then  # wrap DIR CMD...: one rank
  dir=$2
  shift 2
  "$@" &
  child=$!
  echo "$child" >"$dir/pid.${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-0}}"
  wait "$child"
  exit
fi

mode=$1 mpirun=$2 np=$3
shift 3
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
dir=$(mktemp -d "${TMPDIR:-/tmp}/cz_limits_test.XXXXXX")
mpid=

now_ms() { echo $(($(date +%s%N) / 1000000)); }
t_start=$(now_ms)
log() {  # with the time since the start, to see where a slow run spent it
  local ms=$(($(now_ms) - t_start))
  echo "[$((ms / 1000)).$((ms % 1000 / 100))s] $*"
}

# True while the process runs; gone or a zombie counts as ended.
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat:0:1} != [ZX] ]]
}

cleanup() {
  local f
  # The launcher first (killing its ranks under it makes Open MPI's mpirun crash), then whatever it left: a
  # stopped rank ignores everything but SIGKILL.
  if [[ -n $mpid ]] && alive "$mpid"; then
    log "stopping the job"
    kill -TERM "$mpid" 2>/dev/null
    for _ in $(seq 50); do alive "$mpid" || break; sleep 0.1; done
    kill -KILL "$mpid" 2>/dev/null
  fi
  for f in "$dir"/pid.*; do [[ -e $f ]] && kill -KILL "$(cat "$f")" 2>/dev/null; done
  wait 2>/dev/null
  # A killed rank with a large heap takes a moment to exit; the next test should not share the cores with it.
  for f in "$dir"/pid.*; do
    [[ -e $f ]] || continue
    for _ in $(seq 50); do alive "$(cat "$f")" || break; sleep 0.1; done
  done
  rm -rf "$dir"
  log "cleaned up"
}
on_exit cleanup

on_fail() {  # before the preamble's FAIL line: what the job printed
  echo "--- output"
  cat "$dir/out"
  log "failing"
}

# Starts CMD on np ranks and waits (up to 90 s: start-up is slow on a loaded machine) until every rank runs.
start() {
  "$mpirun" --allow-run-as-root --oversubscribe -np "$np" "$self" wrap "$dir" "$@" >"$dir/out" 2>&1 &
  mpid=$!
  local r
  for _ in $(seq 900); do
    for ((r = 0; r < np; ++r)); do [[ -s $dir/pid.$r ]] || break; done
    if ((r == np)); then
      log "ranks started"
      return
    fi
    alive "$mpid" || fail "the job ended before all ranks started"
    sleep 0.1
  done
  fail "the ranks did not start within 90 s"
}

wait_for_output() {
  for _ in $(seq 900); do
    if grep -qE "$1" "$dir/out"; then
      log "output matched '$1'"
      return
    fi
    alive "$mpid" || fail "the job ended before its output matched '$1'"
    sleep 0.1
  done
  fail "no output matching '$1' within 90 s"
}

case $mode in
  memory)
    seconds=$1 limit_mb=$2 ready=$3 progress=$4
    shift 4
    start "$@"
    wait_for_output "$ready"
    sleep "$seconds"
    for ((r = 0; r < np; ++r)); do
      pid=$(cat "$dir/pid.$r")
      hwm_kb=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
      [[ -n $hwm_kb ]] || fail "rank $r (pid $pid) is gone after ${seconds}s"
      log "rank $r: peak resident memory $((hwm_kb / 1024)) MiB, ${seconds}s into the run (limit $limit_mb MiB)"
      ((hwm_kb <= limit_mb * 1024)) || fail "rank $r grew to $((hwm_kb / 1024)) MiB"
    done
    if [[ -n $progress ]]; then
      grep -qE "$progress" "$dir/out" || fail "no output line matching '$progress'"
      grep -E "$progress" "$dir/out" | tail -1
    fi
    ;;
  stall)
    victim=$1 timeout=$2 ready=$3 what=$4
    shift 4
    slack=12  # start of the collective to its timeout, die(), MPI_Abort and tear-down, on 2 loaded cores
    start "$@"
    wait_for_output "$ready"
    sleep 2  # well inside the collectives (commbench: past the warm-up, in the timed loop)
    victim_pid=$(cat "$dir/pid.$victim")
    kill -STOP "$victim_pid" || fail "cannot stop rank $victim (pid $victim_pid)"
    log "stopped rank $victim (pid $victim_pid)"
    t0=$(now_ms)
    while alive "$mpid" && (($(now_ms) - t0 < (timeout + slack + 30) * 1000)); do sleep 0.1; done
    elapsed_ms=$(($(now_ms) - t0))
    alive "$mpid" && fail "the job still runs $((elapsed_ms / 1000)) s after rank $victim was stopped"
    wait "$mpid"
    rc=$?
    mpid=
    cat "$dir/out"
    log "exit code $rc, $((elapsed_ms / 1000)).$((elapsed_ms % 1000 / 100)) s after rank $victim was stopped"
    ((rc != 0)) || fail "the job exited 0"
    ((elapsed_ms <= (timeout + slack) * 1000)) || fail "the job took longer than the comm timeout + ${slack}s"
    pattern="^\[rank ([0-9]+)\] .*comm timeout: $what after $timeout\.0 s \(waiting for rank ([0-9]+)\)"
    found=
    while IFS= read -r line; do
      [[ $line =~ $pattern ]] || continue
      s=${BASH_REMATCH[1]} k=${BASH_REMATCH[2]}
      ((s != victim)) || continue  # the stopped rank, resumed by the launcher, may find its own deadline past
      if ((np == 2 ? k == victim : k != s)); then found=$line; fi
    done <"$dir/out"
    [[ -n $found ]] || fail "no surviving rank reported a comm timeout of $what naming the rank it waited for"
    log "survivor: $found"
    ;;
  *)
    echo "usage: $0 memory|stall ..." >&2
    exit 2
    ;;
esac
log "PASS"
