#!/usr/bin/env bash
# How long a stop on request takes, from the signal to the job's exit, and what it leaves on disk: ConvNeXt-atto
# (the default run's model) with a checkpoint folder, stopped at step STOP_AT by
#   - SIGINT to one process,
#   - SIGUSR1 to mpirun (forwarded at once; no deadline),
#   - SIGTERM to mpirun with --mca odls_base_sigkill_timeout T (Open MPI waits T, SIGTERMs the ranks, waits T,
#     SIGKILLs them),
# then resumes each from `latest` and checks that the resumed run's losses equal an uninterrupted run's to the
# bit (constant schedule, so the run's length does not change them).
# usage: bench/stop_latency.sh [BUILD_DIR] [RANKS] [STOP_AT] [T]     (defaults: build 4 20 10)
set -uo pipefail
build=${1:-build} ranks=${2:-4} stop_at=${3:-20} grace=${4:-10}
app=$build/apps/convnext_zero
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--model atto --image-size 64 --micro-batch 8 --stage 3 --schedule constant --loader-threads 1
        --data synthetic:n=2048,eval_n=64 --eval-batches 1)
steps_of() { grep '"split":"train"' "$1" | sed -E 's/.*"grad_norm":([^,}]+).*"loss":([^,}]+).*"step":([^,}]+).*/\3 \2 \1/'; }
last_step() { steps_of "$1" | tail -n 1 | cut -d' ' -f1; }

# measure NAME SIGNAL LAUNCHER...: one stopped run; prints a table row.
measure() {
  local name=$1 sig=$2; shift 2
  local dir=$work/$name
  mkdir -p "$dir"
  "$@" "$app" "${common[@]}" --steps 100000 --checkpoint-dir "$dir/ck" --checkpoint-every 10 --log "$dir/run.jsonl" > "$dir/out" 2>&1 &
  local pid=$!
  until [[ -s "$dir/run.jsonl" ]] && (($(last_step "$dir/run.jsonl") >= stop_at)); do
    kill -0 $pid 2>/dev/null || { cat "$dir/out"; echo "$name: the run died"; return 1; }
    sleep 0.05
  done
  local t0 at rc t1
  at=$(last_step "$dir/run.jsonl")
  t0=$(date +%s%N)
  kill -"$sig" $pid
  wait $pid
  rc=$?
  t1=$(date +%s%N)
  local stopped latest
  stopped=$(last_step "$dir/run.jsonl")
  latest=$(cat "$dir/ck/latest" 2>/dev/null)
  # Resume 5 steps past the stop; compare with an uninterrupted run of the same length.
  local n=$((stopped + 5)) same=no
  "$@" "$app" "${common[@]}" --steps $n --checkpoint-dir "$dir/ck" --resume "$dir/ck" --log "$dir/resumed.jsonl" \
    > "$dir/resumed.out" 2>&1
  "$@" "$app" "${common[@]}" --steps $n --log "$dir/straight.jsonl" > "$dir/straight.out" 2>&1
  from=${latest#step_}
  diff <(steps_of "$dir/straight.jsonl" | awk -v f="$from" '$1 > f') <(steps_of "$dir/resumed.jsonl") > /dev/null &&
    same="yes ($((from + 1))-$n)"
  printf '| %s | %s | %s | %d | %.2f | %s | %s |\n' "$name" "$at" "$stopped" "$rc" \
    "$(echo "($t1 - $t0) / 1000000000" | bc -l)" "$latest" "$same"
}

mpirun=(mpirun --allow-run-as-root --oversubscribe)
echo "| stop | signalled at step | stopped after step | exit | signal to exit (s) | latest | resumed = uninterrupted, to the bit |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
measure "SIGINT, 1 process" INT
measure "SIGUSR1 to mpirun, $ranks ranks" USR1 "${mpirun[@]}" -np "$ranks"
measure "SIGTERM to mpirun, $ranks ranks, T=$grace" TERM "${mpirun[@]}" --mca odls_base_sigkill_timeout "$grace" -np "$ranks"
measure "SIGTERM to mpirun, $ranks ranks, T=1 (default)" TERM "${mpirun[@]}" -np "$ranks"
