#!/usr/bin/env bash
# Stopping runs with real signals, to a real process or a real mpirun, and what is on disk afterwards
# (Note [Stopping on request]). Usage: run_stop_tests.sh CASE APP MPIEXEC CZ_WEIGHTS
#   single_sigint     Ctrl-C (SIGINT) to one process: exit 75, one message naming the step, `latest` = that
#                     step, the export written; the printed resume command, run as printed, continues the log
#                     (each step once) with the uninterrupted run's losses to the bit
#   mpirun_sigterm    SIGTERM to mpirun (4 ranks, stage 3, a grace period set): the same, at 4 ranks; the
#                     printed resume command repeats mpirun's options (--allow-run-as-root ...) and runs as
#                     printed with --steps N appended
#   mpirun_sigint     Ctrl-C to mpirun with Open MPI's default 1 s grace: whatever happens, `latest` names a
#                     complete, loadable checkpoint no older than the last one the run reported saved
#   second_signal     two SIGINTs: exit 130 at once; the newest published checkpoint still loads; no stop record
#   usr1_repeated     three SIGUSR1s, as a launcher and a job script relaying one stop send them: one stop, exit
#                     75, the final checkpoint and its stop record (Note [The stop record])
#   published         a background save is published within steps of being written, not at the next save
#   bare_headline     `mpirun -np 2 convnext_zero --stage 3` runs the default run, prints plain progress lines
#                     under mpirun, and stops on SIGUSR1 (forwarded by mpirun) with exit 75
#   outputs_first     unwritable --export-weights / --log / read-only --checkpoint-dir fail before step 1
#   disk_full         a save that cannot fit in the free space stops the run with a message and leaves nothing
#   log_resume        a run killed (SIGKILL) past its checkpoint, resumed: its --log holds every step once (the
#                     records past the checkpoint dropped); a fresh run keeps the old log as LOG.1 and says so
#   stop_order        under mpirun, rank 0's stop lines are on one stream (stderr), in order: "stopping after
#                     this step", "stopped by", "resume with"; through a wrapper, whose command line is not
#                     mpirun's, the resume command says which launcher options to add
#   bar_messages      on a terminal (a pseudo-terminal from script(1)): checkpoint, evaluation and stop lines
#                     never land on the progress bar's line
set -uo pipefail
case_name=$1 app=$2 mpiexec=$3 cz_weights=$4
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
}
on_exit cleanup
# Steps of ~10-20 ms on 2 cores: enough of them that a signal lands mid-run.
model=(--depths 1,1,1,1 --dims 8,16,24,32 --num-classes 4 --image-size 32 --loader-threads 1
       --data synthetic:n=512,eval_n=64,classes=4 --eval-batches 1 --drop-path 0.1 --augment --seed 5)

# "<step> <loss> <grad_norm>" per step record of a JSON-lines log, the numbers exactly as written.
last_step() { steps_of "$1" | tail -n 1 | cut -d' ' -f1; }

# wait_for_step LOG N PID: until LOG has a step record >= N (or PID is gone, or 120 s pass).
wait_for_step() {
  local log=$1 n=$2 pid=$3
  for _ in $(seq 1200); do
    [[ -s "$log" ]] && (($(last_step "$log" || echo 0) >= n)) && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# started: the background job just launched is the run under test: its pid in $pid, killed at exit if it
# still runs.
started() {
  pid=$!
  pids+=("$pid")
}

# stopping_after SIG: sends SIG to $pid, then waits (up to 1 s) until the run says it stops after this step.
stopping_after() {
  kill -"$1" "$pid"
  for _ in $(seq 100); do grep -q "stopping after this step" "$work/out" && break; sleep 0.01; done
}

# wait_exit PID SECONDS: the exit code of a background job, or 124 after SECONDS (then it is killed).
wait_exit() {
  local pid=$1 limit=$2
  for _ in $(seq $((limit * 10))); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid"; return $?; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid"
  return 124
}

latest_of() { cat "$1/latest" 2>/dev/null; }

# check_resumed_equal LOG_STRAIGHT LOG_RESUMED FROM: the resumed steps equal the straight run's, to the bit
# (the log's decimal text), from step FROM + 1 to the end. LOG_RESUMED may also hold the steps before (a log
# continued by the resumed run): each step must be there once.
check_resumed_equal() {
  local straight=$1 resumed=$2 from=$3
  steps_of "$straight" | awk -v f="$from" '$1 > f' > "$work/want"
  steps_of "$resumed" | awk -v f="$from" '$1 > f' > "$work/got"
  [[ $(head -n 1 "$work/got" | cut -d' ' -f1) == $((from + 1)) ]] || fail "the resumed run did not start at step $((from + 1))"
  diff "$work/want" "$work/got" > /dev/null || { diff "$work/want" "$work/got" | head; fail "resumed losses differ"; }
  echo "resumed steps $((from + 1))-$(last_step "$resumed") equal the uninterrupted run's to the bit"
}

# check_each_step_once LOG N: the log's step records are steps 1..N, each once, in order.
check_each_step_once() {
  local got
  got=$(steps_of "$1" | cut -d' ' -f1 | tr '\n' ' ')
  [[ $got == "$(seq -s ' ' 1 "$2") " ]] || fail "$1 does not hold steps 1..$2 once each: $got"
  echo "$1 holds steps 1..$2, each once"
}

# stop_and_check RUN_PREFIX... : shared by single_sigint and mpirun_sigterm. Globals: signal, target, extra.
case $case_name in
single_sigint | mpirun_sigterm)
  if [[ $case_name == single_sigint ]]; then
    # Ctrl-C reaches the process at once: a cosine schedule over a fixed 400 steps.
    run=("$app" "${model[@]}" --micro-batch 16)
    sig=INT name=SIGINT steps=400 straight_steps=400
  else
    # Open MPI's mpirun waits odls_base_sigkill_timeout (T) before it sends the ranks SIGTERM, and T again before
    # SIGKILL (docs/training.md): with T = 3 the run goes on ~3 s past the signal, so its length is open-ended
    # and the schedule constant, and the uninterrupted run is made afterwards, as long as needed.
    run=("${mpirun[@]}" --mca odls_base_sigkill_timeout 3 -np 4 "$app" "${model[@]}" --micro-batch 4 --stage 3
         --schedule constant)
    sig=TERM name=SIGTERM steps=100000 straight_steps=
  fi
  [[ -n $straight_steps ]] && { "${run[@]}" --steps $straight_steps --log "$work/straight.jsonl" > "$work/straight.out" 2>&1 ||
    { cat "$work/straight.out"; fail "the uninterrupted run failed"; }; }
  "${run[@]}" --steps $steps --checkpoint-dir "$work/ck" --checkpoint-every 25 --export-weights "$work/w.h5" \
    --log "$work/stopped.jsonl" > "$work/stopped.out" 2>&1 &
  started
  wait_for_step "$work/stopped.jsonl" 60 "$pid" || { cat "$work/stopped.out"; fail "the run did not reach step 60"; }
  sent_ns=$(date +%s%N)
  sent_at=$(last_step "$work/stopped.jsonl")
  kill -$sig "$pid"
  wait_exit "$pid" 60
  rc=$?
  done_ns=$(date +%s%N)
  cat "$work/stopped.out"
  stopped_at=$(last_step "$work/stopped.jsonl")
  echo "== $name at step $sent_at: exit $rc $(((done_ns - sent_ns) / 1000000)) ms after the signal, after step $stopped_at, latest = $(latest_of "$work/ck")"
  # Open MPI's mpirun exits 1 after a SIGTERM or Ctrl-C whatever its ranks return (they return 75 here).
  [[ $rc -eq 75 || ($name == SIGTERM && $rc -eq 1) ]] || fail "exit code $rc, expected 75 (stopped on request)"
  ((stopped_at < steps)) || fail "the run finished before the signal"
  [[ $(grep -c "stopped by $name after step $stopped_at of $steps" "$work/stopped.out") -eq 1 ]] ||
    fail "expected one 'stopped by $name after step $stopped_at' line for the job"
  grep -qF "resume with: " "$work/stopped.out" || fail "no resume command"
  ! grep -qE 'another rank failed|terminated by the launcher|aborting' "$work/stopped.out" ||
    fail "the stop was reported as a failure"
  [[ $(latest_of "$work/ck") == "step_$stopped_at" && -d "$work/ck/step_$stopped_at" ]] ||
    fail "latest is '$(latest_of "$work/ck")', expected step_$stopped_at"
  [[ $(cat "$work/ck/stopped" 2> /dev/null) == "step_$stopped_at"$'\n'"stopped by $name after step $stopped_at" ]] ||
    fail "the stop record is '$(cat "$work/ck/stopped" 2> /dev/null)', expected step_$stopped_at and its line"
  [[ -s "$work/w.h5" ]] || fail "no --export-weights file"
  "$cz_weights" "$work/ck" "$work/from_ck.h5" > /dev/null || fail "the final checkpoint does not export"
  ls "$work/ck" | grep -q '^\.tmp' && fail "an unfinished save was left behind"
  # Retention: the default keeps 3 complete checkpoints.
  [[ $(ls -d "$work/ck"/step_* | wc -l) -le 3 ]] || { ls "$work/ck"; fail "more than 3 checkpoints kept"; }
  cmd=$(sed -n 's/^resume with: //p' "$work/stopped.out")
  [[ $cmd == *"--resume $work/ck" ]] || fail "the resume command does not end in --resume $work/ck: $cmd"
  # Note [Resume command]: mpirun's own options as given (root needs --allow-run-as-root).
  [[ $name == SIGTERM && $cmd != "${mpirun[*]} --mca odls_base_sigkill_timeout 3 -np 4 $app "* ]] &&
    fail "the resume command does not repeat the launcher's options: $cmd"
  # Resumed as printed (an open-ended run with `--steps N` appended: the last value wins, Note [Flags given
  # twice]), it continues the same --log (Note [One log across resumes]): every step once, and the resumed
  # steps' losses and gradient norms are the uninterrupted run's to the bit.
  if [[ -z $straight_steps ]]; then
    straight_steps=$((stopped_at + 20))
    "${run[@]}" --steps $straight_steps --log "$work/straight.jsonl" > "$work/straight.out" 2>&1 ||
      { cat "$work/straight.out"; fail "the uninterrupted run failed"; }
    cmd+=" --steps $straight_steps"
  fi
  echo "== resuming as printed: $cmd"
  eval "$cmd" > "$work/resumed.out" 2>&1 || { cat "$work/resumed.out"; fail "the printed resume command failed"; }
  check_each_step_once "$work/stopped.jsonl" "$straight_steps"
  check_resumed_equal "$work/straight.jsonl" "$work/stopped.jsonl" "$stopped_at"
  echo "$case_name: OK"
  ;;
mpirun_sigint)
  # Open MPI SIGKILLs the ranks 1 s after its SIGTERM: the final save may or may not make it; either way the
  # newest checkpoint is complete and at least as new as the last one reported.
  "${mpirun[@]}" -np 4 "$app" "${model[@]}" --micro-batch 4 --stage 3 --steps 2000 --checkpoint-dir "$work/ck" \
    --checkpoint-every 10 --log "$work/run.jsonl" > "$work/out" 2>&1 &
  started
  wait_for_step "$work/run.jsonl" 45 "$pid" || { cat "$work/out"; fail "the run did not reach step 45"; }
  kill -INT "$pid"
  wait_exit "$pid" 60
  rc=$?
  cat "$work/out"
  reported=$(sed -n 's|.*checkpoint .*/step_\([0-9]*\) (.*MB)$|\1|p' "$work/out" | tail -n 1)
  latest=$(latest_of "$work/ck")
  echo "== mpirun exit $rc; last reported save step_${reported:-none}; latest = $latest"
  [[ $rc -ne 0 && $rc -ne 124 ]] || fail "mpirun exited $rc"
  grep -q 'note: Open MPI kills the ranks 1 s after' "$work/out" || fail "no note on mpirun's 1 s kill deadline"
  [[ -n $reported && -n $latest ]] || fail "nothing was reported saved, or no latest"
  ((${latest#step_} >= reported)) || fail "latest ($latest) is older than the reported step_$reported"
  "$cz_weights" "$work/ck" "$work/w.h5" > /dev/null || fail "the newest checkpoint does not load"
  echo "mpirun_sigint: OK"
  ;;
second_signal)
  # ConvNeXt-atto steps (~0.3 s) leave time for the second signal while the first stop waits for its step.
  "$app" --model atto --steps 5000 --loader-threads 1 --checkpoint-dir "$work/ck" --checkpoint-every 4 \
    --log "$work/run.jsonl" > "$work/out" 2>&1 &
  started
  wait_for_step "$work/run.jsonl" 10 "$pid" || { cat "$work/out"; fail "the run did not reach step 10"; }
  stopping_after INT
  kill -INT "$pid"
  wait_exit "$pid" 20
  rc=$?
  cat "$work/out"
  echo "== exit $rc; latest = $(latest_of "$work/ck")"
  [[ $rc -eq 130 ]] || fail "exit $rc, expected 130 (128 + SIGINT)"
  grep -q "again: stopping now without saving; the newest checkpoint on disk is $work/ck/step_" "$work/out" ||
    fail "no message naming the newest checkpoint"
  "$cz_weights" "$work/ck" "$work/w.h5" > /dev/null || fail "the newest checkpoint does not load"
  [[ ! -e $work/ck/stopped ]] || fail "a stop record, but the run stopped without its final checkpoint"
  echo "second_signal: OK"
  ;;
usr1_repeated)
  # ConvNeXt-atto steps (~0.3 s): the copies arrive while the first stop waits for its step.
  "$app" --model atto --steps 5000 --loader-threads 1 --checkpoint-dir "$work/ck" --log "$work/run.jsonl" \
    > "$work/out" 2>&1 &
  started
  wait_for_step "$work/run.jsonl" 3 "$pid" || { cat "$work/out"; fail "the run did not reach step 3"; }
  stopping_after USR1
  kill -USR1 "$pid"
  kill -USR1 "$pid"
  wait_exit "$pid" 60
  rc=$?
  cat "$work/out"
  stopped_at=$(last_step "$work/run.jsonl")
  echo "== exit $rc; latest = $(latest_of "$work/ck"); stop record: $(head -n 1 "$work/ck/stopped" 2> /dev/null)"
  [[ $rc -eq 75 ]] || fail "exit $rc, expected 75 (one stop)"
  grep -q "SIGUSR1: stopping after this step (SIGINT or SIGTERM stops it at once)" "$work/out" ||
    fail "no stop line for SIGUSR1"
  ! grep -q "again" "$work/out" || fail "a repeated SIGUSR1 was taken for a second request"
  [[ $(latest_of "$work/ck") == "step_$stopped_at" ]] || fail "latest is not step_$stopped_at"
  [[ $(head -n 1 "$work/ck/stopped" 2> /dev/null) == "step_$stopped_at" ]] || fail "no stop record naming step_$stopped_at"
  echo "usr1_repeated: OK"
  ;;
published)
  # Saves every 20 steps of a long run. Frozen (SIGSTOP) 15-19 steps past a save, `latest` must already name
  # that save: published once it is durable, not when the next save begins (which would still show the one
  # before). A ~1 MB save takes a few steps here; under load it can take longer than 15, so the run is looked
  # at again later in the same window and in later ones, and fails only where no window of 8 showed its save
  # published before the next began. Then killed (SIGKILL): what `latest` names loads.
  "$app" "${model[@]}" --micro-batch 16 --steps 5000 --checkpoint-dir "$work/ck" --checkpoint-every 20 \
    --log "$work/run.jsonl" > "$work/out" 2>&1 &
  started
  wait_for_step "$work/run.jsonl" 50 "$pid" || { cat "$work/out"; fail "the run did not reach step 50"; }
  published=0 windows=0 last_want=-1 looks=""
  for _ in $(seq 3000); do
    kill -STOP "$pid" 2> /dev/null || break
    at=$(last_step "$work/run.jsonl")
    if ((at % 20 >= 15)); then
      latest=$(latest_of "$work/ck")
      want=$((20 * ((at - 15) / 20)))
      n=${latest#step_}
      ((${n:-0} >= want)) && { published=1; break; }
      ((want != last_want)) && { last_want=$want windows=$((windows + 1)); }
      ((windows > 8)) && break
      looks+=" $at:${latest:-none}"
    fi
    kill -CONT "$pid"
    sleep 0.02
  done
  kill -KILL "$pid"
  wait "$pid"
  ((published)) || { cat "$work/out"; fail "no save was published before the next one began (step:latest where looked):$looks"; }
  echo "== frozen at step $at: latest = $latest (at least step_$want)${looks:+; earlier looks (step:latest):$looks}"
  "$cz_weights" "$work/ck" "$work/w.h5" > /dev/null || fail "$latest does not load"
  echo "published: OK"
  ;;
bare_headline)
  "${mpirun[@]}" -np 2 "$app" --stage 3 --loader-threads 1 --progress-interval 0 > "$work/out" 2>&1 &
  started
  for _ in $(seq 1800); do
    grep -q '^step 2/300 ' "$work/out" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -USR1 "$pid"
  wait_exit "$pid" 120
  rc=$?
  cat "$work/out"
  [[ $rc -eq 75 ]] || fail "mpirun exited $rc, expected 75 (stopped on request)"
  head -n 1 "$work/out" | grep -q "the default run (300 steps on the embedded synthetic data" ||
    fail "the first line does not say what the bare command does"
  grep -q "for real data give --data" "$work/out" || fail "no pointer to real data"
  [[ $(grep -c '^step 1/300  loss' "$work/out") -eq 1 ]] || fail "expected one plain progress line for step 1"
  grep -q "stopped by SIGUSR1 after step" "$work/out" || fail "no stop message"
  echo "bare_headline: OK"
  ;;
outputs_first)
  quick=("$app" "${model[@]}" --micro-batch 16 --steps 1000 --no-progress)
  # check_first EXPECTED COMMAND...: exits 1 naming EXPECTED before the model is built (no header line).
  check_first() {
    local want=$1; shift
    timeout 120 "$@" > "$work/out" 2>&1
    local rc=$?
    cat "$work/out"
    [[ $rc -eq 1 || ($rc -ne 0 && $rc -ne 124 && $1 == "${mpirun[0]}") ]] || fail "exit $rc for $*"
    grep -qF -- "$want" "$work/out" || fail "the message lacks '$want'"
    ! grep -qE "params, [0-9]+ classes[^)]*\) on cpu" "$work/out" || fail "it set up training before failing"
  }
  check_first "--export-weights $work/nosuchdir/w.h5: the folder $work/nosuchdir does not exist" \
    "${quick[@]}" --export-weights "$work/nosuchdir/w.h5"
  check_first "--log $work/nosuchdir/l.jsonl: the folder" "${quick[@]}" --log "$work/nosuchdir/l.jsonl"
  check_first "--export-weights $work: is a folder" "${quick[@]}" --export-weights "$work"
  mkdir -p "$work/ro"
  if unshare -m true 2>/dev/null; then
    ro=(unshare -m bash -c 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"' "$work/ro")
    check_first "--checkpoint-dir $work/ro/ck: cannot" "${ro[@]}" "${quick[@]}" --checkpoint-dir "$work/ro/ck"
    # Under mpirun every rank checks, and the job stops before training.
    check_first "--checkpoint-dir $work/ro/ck2: cannot" "${ro[@]}" "${mpirun[@]}" -np 2 "${quick[@]}" \
      --checkpoint-dir "$work/ro/ck2"
  else
    echo "no mount namespaces here (not root?): read-only checkpoint folder not checked"
  fi
  echo "outputs_first: OK"
  ;;
disk_full)
  unshare -m true 2>/dev/null || { echo "SKIP: needs mount namespaces (root)"; exit 0; }
  mkdir -p "$work/small"
  # 2.5 MB of tmpfs: the first checkpoints of this model (~0.85 MB each with AdamW) fit, a later one does not;
  # its check must refuse it before anything is written.
  unshare -m bash -c "mount -t tmpfs -o size=2500k tmpfs '$work/small' &&
    $(printf '%q ' "$app" "${model[@]}") --micro-batch 16 --steps 200 --ema-decay 0.99 --keep-checkpoints 0 \
      --checkpoint-dir '$work/small/ck' --checkpoint-every 2 --no-progress; rc=\$?;
    ls -la '$work/small/ck'; ls '$work/small/ck' | grep -q '^\.tmp' && echo LEFTOVER; exit \$rc" > "$work/out" 2>&1
  rc=$?
  cat "$work/out"
  [[ $rc -eq 1 ]] || fail "exit $rc, expected 1"
  grep -qE "checkpoint .*/step_[0-9]+ not saved: rank 0: it needs about .* MB and .* has .* MB free" "$work/out" ||
    fail "no message about free space"
  ! grep -q LEFTOVER "$work/out" || fail "a half-written save was left behind"
  echo "disk_full: OK"
  ;;
log_resume)
  # A checkpoint every 10 steps, published before the next step (--checkpoint-sync); killed outright 3-9 steps
  # past one (step 35 or later), so that the log holds steps past the newest checkpoint.
  run=("$app" "${model[@]}" --micro-batch 16 --steps 120 --checkpoint-dir "$work/ck" --checkpoint-every 10
       --checkpoint-sync --log "$work/run.jsonl")
  "$app" "${model[@]}" --micro-batch 16 --steps 120 --log "$work/straight.jsonl" > "$work/straight.out" 2>&1 ||
    { cat "$work/straight.out"; fail "the uninterrupted run failed"; }
  "${run[@]}" > "$work/killed.out" 2>&1 &
  started
  wait_for_step "$work/run.jsonl" 35 "$pid" || { cat "$work/killed.out"; fail "the run did not reach step 35"; }
  for _ in $(seq 200); do
    kill -STOP "$pid"
    at=$(last_step "$work/run.jsonl")
    ((at % 10 >= 3)) && break
    kill -CONT "$pid"
    sleep 0.01
  done
  kill -KILL "$pid"
  wait "$pid"
  latest=$(latest_of "$work/ck")
  from=${latest#step_}
  echo "== killed at step $at; latest = $latest"
  ((at > from)) || fail "the log (step $at) is not past the checkpoint ($latest)"
  "${run[@]}" --resume "$work/ck" > "$work/resumed.out" 2>&1 || { cat "$work/resumed.out"; fail "resuming failed"; }
  cat "$work/resumed.out"
  grep -qF -- "--log $work/run.jsonl: continued after step $from; $((at - from)) record(s) of steps $((from + 1))-$at" \
    "$work/resumed.out" || fail "no note on the records dropped"
  check_each_step_once "$work/run.jsonl" 120
  check_resumed_equal "$work/straight.jsonl" "$work/run.jsonl" "$from"
  diff <(steps_of "$work/straight.jsonl" | head -n "$from") <(steps_of "$work/run.jsonl" | head -n "$from") ||
    fail "the steps before the checkpoint differ from the uninterrupted run's"
  [[ $(grep -c '"event":"start"' "$work/run.jsonl") -eq 2 ]] || fail "expected a start record for each start"
  grep '"event":"start"' "$work/run.jsonl" | tail -1 | grep -qF "\"resumed_from\":\"$work/ck/$latest\"" ||
    fail "the second start record does not name the checkpoint"
  # Started afresh on the same log: the old one is kept, and the run says where.
  cp "$work/run.jsonl" "$work/before.jsonl"
  "${run[@]}" --steps 3 --no-progress > "$work/again.out" 2>&1 || { cat "$work/again.out"; fail "the fresh run failed"; }
  cat "$work/again.out"
  grep -qF -- "--log $work/run.jsonl: the file held an earlier run's log" "$work/again.out" &&
    grep -qF "kept as $work/run.jsonl.1" "$work/again.out" || fail "no note on the earlier log"
  cmp -s "$work/before.jsonl" "$work/run.jsonl.1" || fail "the earlier log was not kept as it was"
  check_each_step_once "$work/run.jsonl" 3
  echo "log_resume: OK"
  ;;
stop_order)
  # stdout and stderr into separate files: rank 0's three stop lines must all be on stderr (mpirun forwards the
  # two streams through separate pipes and interleaves them as it reads them: "stopped by" came before
  # "stopping after this step" in 1 run of 3 here), in the order written; then merged, as a user sees them.
  # A 3 s grace (odls_base_sigkill_timeout) so that a loaded machine still finishes the stop before SIGKILL.
  job=("${mpirun[@]}" --mca odls_base_sigkill_timeout 3 -np 2 "$app" "${model[@]}" --micro-batch 4 --stage 3
       --steps 100000 --checkpoint-dir "$work/ck" --log "$work/run.jsonl")
  for merged in 0 1; do
    rm -rf "$work/ck" "$work"/run.jsonl*  # wait_for_step reads the new run's log, not the last one's
    if ((merged)); then "${job[@]}" > "$work/err" 2>&1 & else "${job[@]}" > "$work/out" 2> "$work/err" & fi
    started
    wait_for_step "$work/run.jsonl" 20 "$pid" || { cat "$work/err"; fail "the run did not reach step 20"; }
    kill -TERM "$pid"
    wait_exit "$pid" 60
    echo "== merged=$merged: mpirun exit $?"
    ((merged)) || { echo "-- stdout:"; cat "$work/out"; echo "-- stderr:"; }
    cat "$work/err"
    a=$(grep -n "SIGTERM: stopping after this step" "$work/err" | cut -d: -f1)
    b=$(grep -n "^stopped by SIGTERM after step" "$work/err" | cut -d: -f1)
    c=$(grep -n "^resume with: " "$work/err" | cut -d: -f1)
    [[ $a =~ ^[0-9]+$ && $b =~ ^[0-9]+$ && $c =~ ^[0-9]+$ ]] ||
      fail "expected each stop line once on stderr (stopping: '$a', stopped: '$b', resume: '$c')"
    ((a < b && b < c)) || fail "the stop lines are out of order: stopping at line $a, stopped at $b, resume at $c"
    ! grep -q "^$" "$work/err" || fail "an empty line on stderr (a new line for a bar that is not there)"
  done
  # Started through a wrapper (a bash that is not replaced by the rank), rank 0's parent is not mpirun: the
  # command cannot be read back, and the message says which options to add (Note [Resume command]). mpirun
  # sends SIGUSR1 to the wrapper's whole process group, so the rank hears it directly; bash ignores it.
  rm -rf "$work/ck" "$work"/run.jsonl*
  "${mpirun[@]}" -np 2 bash -c 'trap "" USR1; "$0" "$@"; exit $?' "$app" "${model[@]}" \
    --micro-batch 4 --steps 100000 --checkpoint-dir "$work/ck" --log "$work/run.jsonl" > "$work/err" 2>&1 &
  started
  wait_for_step "$work/run.jsonl" 10 "$pid" || { cat "$work/err"; fail "the wrapped run did not reach step 10"; }
  kill -USR1 "$pid"
  wait_exit "$pid" 60
  echo "== through a wrapper: mpirun exit $?"
  cat "$work/err"
  want="mpirun $([[ $(id -u) == 0 ]] && echo '--allow-run-as-root ')-np 2 $app "
  grep -qF "resume with: $want" "$work/err" || fail "the resume command does not start with '$want'"
  grep -qF "(the launcher's own options could not be read from here: add those the job was started with" \
    "$work/err" || fail "no line saying which options to add"
  echo "stop_order: OK"
  ;;
bar_messages)
  command -v script > /dev/null || { echo "SKIP: no script(1)"; exit 0; }
  # In a pseudo-terminal, so that stderr is a terminal and the bar is drawn; stopped with Ctrl-C (SIGINT) once
  # 40 steps are logged.
  {
    printf '%q ' "$app" "${model[@]}" --micro-batch 16 --steps 100000 --eval-every 7 --checkpoint-dir "$work/ck" \
      --checkpoint-every 5 --log "$work/run.jsonl"
    echo '&'
    echo 'pid=$!'
    printf 'until [[ $(grep -c %q %q 2>/dev/null) -ge 40 ]]; do sleep 0.05; done\n' '"img_per_s"' "$work/run.jsonl"
    echo 'kill -INT $pid; wait $pid'
  } > "$work/in_pty.sh"
  timeout 120 script -qfec "bash $work/in_pty.sh" /dev/null > "$work/typescript" 2>&1
  rc=$?
  # What a terminal shows: a '\r' returns to the line's start, a line ends at '\n'. Each piece between them is
  # one drawing; a message in the same piece as a bar is what the user saw glued to the bar.
  tr '\r' '\n' < "$work/typescript" > "$work/pieces"
  echo "== exit $rc; $(grep -c 'ETA' "$work/pieces") bar drawings; the other lines:"
  grep -v ETA "$work/pieces" | grep -v '^ *$' | head -30
  [[ $rc -eq 75 ]] || { tail -c 2000 "$work/typescript"; fail "exit $rc, expected 75"; }
  grep -q "ETA" "$work/pieces" || fail "no progress bar drawn"
  for msg in "checkpoint $work/ck/step_" "eval @ step" "SIGINT: stopping after this step" "stopped by SIGINT" \
    "resume with:"; do
    grep -qF "$msg" "$work/pieces" || fail "no '$msg' line"
    ! grep -F "$msg" "$work/pieces" | grep -q "ETA" ||
      { grep -F "$msg" "$work/pieces" | grep ETA | head -3; fail "'$msg' printed onto the progress bar"; }
  done
  echo "bar_messages: OK"
  ;;
*) fail "unknown case $case_name" ;;
esac
