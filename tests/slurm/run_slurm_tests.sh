#!/usr/bin/env bash
# convnext_zero under a real Slurm (scripts/slurm.sh; docs/slurm.md). Usage:
#   run_slurm_tests.sh CASE SLURM_SH CLUSTER_DIR APP CZRUN EXAMPLES
#   updown             a cluster of its own: up in seconds, `srun -n2 hostname` runs, down leaves no process of
#                      it, and a second down is fine
#   cluster            the shared cluster (fixture slurm_cluster): srun over 3 nodes, `srun --mpi=list` names
#                      pmix (printed), sbatch runs a job script to completion
#   srun_mpirun_train  examples/slurm/train.sbatch launched both ways on 2 nodes x 1 task: `srun --mpi=pmix` and
#                      `mpirun` (reading the allocation, no hostfile) log the losses of `mpirun -np 2` outside
#                      Slurm to the bit; start-up of srun and mpirun steps inside one allocation at 2 and 4 ranks
#   preempt_requeue    train.sbatch preempted twice (SIGUSR1 to the batch shell, as --signal=B:USR1 does): each
#                      time the run publishes a checkpoint, exits 75, the job requeues itself and resumes; the log
#                      holds steps 1..N once each and the final weights equal an unpreempted run's to the bit
#   end_margin         a job of 1 minute with --end-margin 45 stops by itself before its end with a checkpoint,
#                      exit 75, and requeues
#   sigterm_mpirun     train.sbatch (CZ_LAUNCH=mpirun) sent SIGTERM three times, each to a start of its own: to
#                      the job's steps (`scancel --signal=TERM`: mpirun's daemons), to the batch shell
#                      (`--batch`), and to both (`--full`: the shell and mpirun too; on this cluster a step's
#                      signal reaches its process group, so Open MPI's ranks, in groups of their own, hear of it
#                      from mpirun or its daemons). Each time the ranks publish a final checkpoint of the step
#                      they stopped after and its stop record, the job requeues itself whatever mpirun exits
#                      with (205, 75, 1) and resumes from that checkpoint; the log holds steps 1..N once each
#   sigterm_srun       the same with CZ_LAUNCH=srun: 75 from srun for the steps and the batch shell; for both,
#                      srun SIGKILLs its tasks on its own SIGTERM (exit 137), so the job requeues from the newest
#                      periodic checkpoint (--checkpoint-every 20) and the steps after it run again
#   czrun_node_lost    czrun in a job of 3 nodes (--no-kill) reads its nodes from Slurm; node n3 killed (its
#                      slurmd and the step's tasks on it): czrun drops it, relaunches on n1 and n2 from the newest
#                      checkpoint, and the run finishes with each step logged once; node n3 started again
#   czrun_node_lost_srun  the same with czrun --srun (each attempt an srun --mpi=pmix step)
#   cancel             train.sbatch (mpirun) cancelled (`scancel JOB`, which SIGTERMs every process of a job that
#                      is ending): the stop is not taken for a preemption; the job ends CANCELLED, not requeued
#   cpu_placement      a cluster of its own with task/affinity (1 node of 2 CPUs): srun -n2 --cpus-per-task=1
#                      binds each task to a CPU and each rank keeps its one CPU (the header's "CPUs of the ranks
#                      on this host": "its mask is its own"); with --cpu-bind=none the two ranks hold both CPUs
#                      and split them (issue 51; Note [A rank's CPUs on a node])
#   errors             one clear line each: mpirun -np disagreeing with the job's tasks, srun without --mpi, more
#                      ranks on a node than GPUs, a requeued job without --checkpoint-dir, the program started
#                      by the job script itself in a job of several tasks
# Exits 77 (ctest: skipped) with the reason where no cluster runs (scripts/slurm.sh up skipped: not root, Slurm
# or munge not installed, a daemon that would not start).
set -uo pipefail
# Run inside a Slurm job (a CI on a cluster), that job's variables would reach the test cluster's jobs (sbatch
# passes the environment on) and the runs outside Slurm: none of them.
unset "${!SLURM_@}" CZ_IGNORE_SLURM
case_name=$1 slurm_sh=$2 cluster=$3 app=$4 czrun=$5 examples=$6
source "$(dirname "${BASH_SOURCE[0]}")/../lib/preamble.sh"
work=$(mktemp -d /tmp/czs-test.XXXXXX)  # the nodes' jobs read it: a path every node shares
cleanup() {
  if [[ -n ${SLURM_CONF:-} && -f $work/jobs ]]; then
    while read -r j; do scancel "$j" 2> /dev/null; done < "$work/jobs"
  fi
  rm -rf "$work"
}
on_exit cleanup
t_start=$(date +%s.%N)
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }

# The tiny model of the stop tests: steps of ~10-20 ms on 2 cores.
# shellcheck disable=SC2054  # the commas are the flags' own
model=(--depths 1,1,1,1 --dims 8,16,24,32 --num-classes 4 --image-size 32 --loader-threads 1
       --data synthetic:n=512,eval_n=64,classes=4 --eval-batches 1 --eval-every 0 --drop-path 0.1 --augment
       --seed 5 --micro-batch 8 --stage 2)
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# The cluster's nodes are one host: they share /dev/shm, where Open MPI's shared-memory transport (vader) of two
# nodes' ranks collided (a segfault in MPI_Comm_split_type at 2 nodes x 2 ranks). TCP between all ranks; a real
# cluster needs no such setting. sbatch and srun pass it on to the jobs.
export OMPI_MCA_btl=self,tcp
# Open MPI's session folders of our own: mpiruns of other tests creating /tmp/ompi.HOST.0 at the same moment
# made ours fail ("mkdir /tmp/ompi.vm.0: File exists").
mkdir -p "$work/ompi"
export OMPI_MCA_orte_tmpdir_base=$work/ompi

use_cluster() {
  if [[ ! -f $cluster/slurm.conf ]] || ! SLURM_CONF=$cluster/slurm.conf timeout 5 scontrol ping > /dev/null 2>&1; then
    echo "SKIP: no Slurm cluster in $cluster (the fixture test slurm_up skipped or failed: see its output)"
    exit 77
  fi
  export SLURM_CONF=$cluster/slurm.conf
}

# submit ARGS...: sbatch --parsable; records the job for cleanup (in a file: submit runs in $(...)); prints
# its id.
# ompi_tcp_init_crash FILE: FILE shows Open MPI 4.1's crash in MPI_Init under srun (Note [Open MPI's TCP
# wire-up crash] in docs/slurm.md): a TCP connect to a peer failed during the wire-up, and the rank died of a
# call through a null pointer from the TCP transport. Open MPI's warning about the connect is not always
# printed before the rank dies; then the crash shows as that call ("Failing at address: (nil)") before any
# rank printed the program's header. A launch that shows it is tried once more, and said.
ompi_tcp_init_crash() {
  grep -q "Segmentation fault" "$1" || return 1
  grep -q "failed to TCP connect to a peer" "$1" && return 0
  grep -q "Failing at address: (nil)" "$1" && ! grep -q "^convnext_zero: " "$1"
}
# ompi_tcp_init_crash_lines FILE: the crash's lines, for the log of a launch that is tried again.
ompi_tcp_init_crash_lines() {
  grep -E "TCP connect|connect\(\)|Segmentation|Failing at address" "$1" | head -n 8
}

submit() {
  local id
  # The test cluster's nodes have 2 CPUs: train.sbatch's --cpus-per-task (12) would not fit them.
  id=$(sbatch --parsable --cpus-per-task=1 "$@") || fail "sbatch $* failed"
  echo "$id" >> "$work/jobs"
  echo "$id"
}
# release JOB: a requeued job may start now instead of after Slurm's 2-minute hold. Not within the second of
# the requeue: slurmd rejects a job credential issued in the same second as the revocation the requeue made
# ("Killing non-startable batch JobId=7: Job credential revoked"), which Slurm's own hold never meets. Nor
# while a step of the last start is still ending: an srun --mpi=pmix step's slurmstepd outlived the requeue
# by about 2 s, holding its PMIx socket (spool/NODE/stepd.slurm.pmix.JOB.0), and the new start's step 0
# failed to launch ("Cannot bind() UNIX socket ... Address already in use").
release() {
  local i
  sleep 2
  for ((i = 0; i < 300; ++i)); do pgrep -f "^slurmstepd: \[$1\." > /dev/null || break; sleep 0.1; done
  scontrol update JobId="$1" StartTime=now || fail "could not release job $1"
}
job_state() { squeue -h -j "$1" -o %T 2> /dev/null; }
# wait_state JOB STATE SECONDS: until squeue shows the state ("" for gone); 1 on timeout.
wait_state() {
  local i
  for ((i = 0; i < $3 * 10; ++i)); do [[ $(job_state "$1") == "$2" ]] && return 0; sleep 0.1; done
  return 1
}
# wait_requeued JOB N SECONDS: until the job has been requeued N times and waits to start again.
wait_requeued() {
  local i
  for ((i = 0; i < $3 * 10; ++i)); do
    [[ $(job_state "$1") == PENDING ]] && scontrol show job "$1" | grep -q "Restarts=$2 " && return 0
    sleep 0.1
  done
  return 1
}
last_step() { steps_of "$1" | tail -n 1 | cut -d' ' -f1; }
wait_for_step() {  # LOG N SECONDS
  local i
  for ((i = 0; i < $3 * 10; ++i)); do
    [[ -s $1 ]] && (($(last_step "$1" || echo 0) >= $2)) && return 0
    sleep 0.1
  done
  return 1
}
check_each_step_once() {
  local got
  got=$(steps_of "$1" | cut -d' ' -f1 | tr '\n' ' ')
  [[ $got == "$(seq -s ' ' 1 "$2") " ]] || fail "$1 does not hold steps 1..$2 once each: $got"
  echo "$1 holds steps 1..$2, each once"
}
# same_steps A B N WHAT: both logs hold steps 1..N with the same losses and gradient norms, to the bit (the
# decimal text as written).
same_steps() {
  [[ $(steps_of "$1" | wc -l) -eq $3 ]] || fail "$4: $1 has $(steps_of "$1" | wc -l) step records, not $3"
  diff <(steps_of "$1") <(steps_of "$2") > "$work/diff" || { head -n 6 "$work/diff"; fail "$4: the runs differ"; }
}
# The straight run: the same flags under mpirun -np 2 outside Slurm.
straight_run() {  # LOG STEPS [EXTRA...]
  local log=$1 steps=$2
  shift 2
  env -u SLURM_CONF mpirun -np 2 --bind-to none "$app" "${model[@]}" --steps "$steps" --log "$log" "$@" \
    > "$work/straight.out" 2>&1 || { cat "$work/straight.out"; fail "the run outside Slurm failed"; }
}

# sigterm_try LAUNCH: one run of the sigterm cases, in $work (a folder of its own). Three SIGTERMs, one per
# start of the job: to the steps, to the batch shell, to both; after each the job must have requeued itself
# from a published checkpoint, which is released at once; the last start finishes the run.
sigterm_try() {
  # Steps enough after the third stop that the run cannot finish within mpirun's 1 s before it passes a
  # SIGTERM on to the ranks.
  local launch=$1 steps=480 prev=0 round target how sent stopped latest n lost line
  id=$(CZ_APP=$app CZ_CHECKPOINT_DIR=$work/ck CZ_LOG=$work/run.jsonl CZ_LAUNCH=$launch \
    CZ_TRAIN_ARGS="${model[*]} --steps $steps --checkpoint-every 20" CZ_END_MARGIN=0 \
    submit -N2 --ntasks-per-node=1 -o "$work/job.out" "$examples/train.sbatch")
  round=0
  for target in "the steps" "the batch shell" both; do
    round=$((round + 1))
    case $target in
      "the steps") how=() ;;
      "the batch shell") how=(--batch) ;;
      both) how=(--full) ;;
    esac
    wait_for_step "$work/run.jsonl" $((prev + 40)) 60 || { cat "$work/job.out"; fail "$target: the run did not reach step $((prev + 40))"; }
    sent=$(last_step "$work/run.jsonl")
    scancel "${how[@]}" --signal=TERM "$id" || fail "scancel ${how[*]} --signal=TERM failed"
    wait_requeued "$id" $round 60 || { cat "$work/job.out"; fail "SIGTERM to $target: the job did not requeue itself (state $(job_state "$id"))"; }
    stopped=$(last_step "$work/run.jsonl")
    latest=$(cat "$work/ck/latest" 2> /dev/null)
    line=$(grep "^job $id: .*requeueing$" "$work/job.out" | tail -n 1)
    [[ $(grep -c "^job $id: .*requeueing$" "$work/job.out") -eq $round ]] || { cat "$work/job.out"; fail "SIGTERM to $target: the job script did not say it requeued"; }
    if [[ $launch == srun && $target == both ]]; then
      # srun answers its own SIGTERM by SIGKILLing its tasks: no final checkpoint, the newest periodic one.
      [[ $line == *"srun exited 137 after a stop request"* ]] || { cat "$work/job.out"; fail "SIGTERM to both under srun: $line"; }
      n=${latest#step_}
      [[ -n $latest && $n -le $stopped && $((n % 20)) -eq 0 ]] || fail "SIGTERM to both under srun: latest is '$latest', the run was at step $stopped"
      [[ ! -e $work/ck/stopped ]] || fail "SIGTERM to both under srun: a stop record, but the ranks were killed"
      lost=$((stopped - n))
    else
      [[ $latest == "step_$stopped" ]] || { cat "$work/job.out"; fail "SIGTERM to $target: latest is '$latest' but the run stopped after step $stopped"; }
      [[ $(head -n 1 "$work/ck/stopped" 2> /dev/null) == "$latest" ]] || { cat "$work/job.out"; fail "SIGTERM to $target: no stop record naming $latest"; }
      lost=0
    fi
    release "$id"
    wait_for_step "$work/run.jsonl" $((stopped + 1)) 60 || { cat "$work/job.out"; fail "SIGTERM to $target: the job did not resume"; }
    echo "SIGTERM to $target at step $sent: requeued (Restarts=$round) with $latest, steps lost $lost; the job script: ${line#job "$id": }"
    prev=$stopped
  done
  wait_state "$id" "" 90 || { cat "$work/job.out"; fail "the job did not finish"; }
  grep -q "finished with exit 0" "$work/job.out" || { cat "$work/job.out"; fail "the last start did not finish the run"; }
  [[ $(grep -c "resumed from" "$work/job.out") -eq 3 ]] || { cat "$work/job.out"; fail "the job did not resume three times"; }
  state=$(scontrol show job "$id" | grep -o 'JobState=[A-Z_]*')
  [[ $state == JobState=COMPLETED ]] || fail "the job ended $state"
  check_each_step_once "$work/run.jsonl" $steps
  echo "job $id: 3 SIGTERMs, 3 requeues, $state"
}

# czrun_node_lost_try: one run of the czrun_node_lost cases, in $work (a folder of its own).
czrun_node_lost_try() {
  steps=400
  launcher='--mpirun-args "--bind-to none"'
  [[ $case_name == czrun_node_lost_srun ]] && launcher=--srun
  # czrun in a job of 3 nodes x 1 task, with no hostfile: it reads the nodes from Slurm. --no-kill: the job
  # outlives a failed node (without it Slurm cancels the whole job when it notices the node is gone).
  printf '#!/bin/bash\n%s '"$launcher"' --min-ranks 2 --max-restarts 2 --probe-timeout 10 --start-timeout 60 -- %s %s --micro-batch 4 --steps %s --checkpoint-dir %s --checkpoint-every 20 --checkpoint-sync --comm-timeout 20 --log %s\necho "czrun exit $?"\n' \
    "$czrun" "$app" "${model[*]}" $steps "$work/ck" "$work/run.jsonl" > "$work/czrun.sh"
  id=$(submit --no-kill -N3 --ntasks-per-node=1 -o "$work/job.out" "$work/czrun.sh")
  wait_for_step "$work/ck/czrun/attempt-0.jsonl" 60 60 || { cat "$work/job.out"; fail "the first launch did not reach step 60"; }
  killed=$(date +%s.%N)
  at=$(last_step "$work/ck/czrun/attempt-0.jsonl")
  "$slurm_sh" node "$cluster" n3 kill
  wait_for_step "$work/ck/czrun/attempt-1.jsonl" 1 90 || { cat "$work/job.out"; "$slurm_sh" node "$cluster" n3 start; fail "czrun did not relaunch"; }
  relaunched=$(date +%s.%N)
  # Back now, not after the job: a job with a silent node stays COMPLETING until slurmctld gives the node up.
  t0=$(date +%s.%N)
  "$slurm_sh" node "$cluster" n3 start || fail "node n3 did not come back"
  echo "node n3 back in service $(elapsed "$t0") s after its slurmd was started again"
  wait_state "$id" "" 120 || { cat "$work/job.out"; fail "the job did not finish"; }
  grep -v '^step \|^checkpoint ' "$work/job.out"
  grep -q "^czrun: Slurm job $id: n1 (1 slot) n2 (1 slot) n3 (1 slot)" "$work/job.out" || fail "czrun did not read the job's nodes"
  grep -q "lost host n3 (ranks \[2\] of 3) did not answer" "$work/job.out" || fail "czrun did not drop n3"
  grep -q "restart 1 of 2 at 2 ranks" "$work/job.out" || fail "czrun did not relaunch on 2 ranks"
  grep -q "czrun exit 0" "$work/job.out" || fail "czrun did not finish the run"
  check_each_step_once "$work/run.jsonl" $steps
  summary=$(grep '"event":"summary"' "$work/ck/czrun/events.jsonl")
  restarts=$(sed -E 's/.*"restarts":([0-9]+).*/\1/' <<< "$summary")
  lost=$(sed -E 's/.*"steps_lost":([0-9]+).*/\1/' <<< "$summary")
  [[ $restarts == 1 ]] || fail "czrun's summary: $summary"
  echo "node n3 killed at step $at; czrun relaunched on n1, n2: first step of the relaunch $(awk -v a="$killed" -v b="$relaunched" 'BEGIN { printf "%.1f", b - a }') s after the kill; restarts $restarts, steps lost $lost"
}

case $case_name in
cpu_placement)
  "$slurm_sh" up "$cluster" --nodes 1 --cpus 2 --task-affinity > "$work/up.out" 2>&1
  rc=$?
  ((rc == 77)) && { cat "$work/up.out"; exit 77; }
  ((rc == 0)) || { cat "$work/up.out"; fail "slurm.sh up exited with $rc"; }
  on_exit "\"$slurm_sh\" down \"$cluster\" > /dev/null 2>&1"
  export SLURM_CONF=$cluster/slurm.conf
  header() {  # header SRUN_OPTIONS...: the header lines of a one-step run on 2 tasks
    timeout 120 srun -N1 -n2 --mpi=pmix "$@" "$app" "${model[@]}" --steps 1 --no-progress --device cpu \
      > "$work/run.out" 2>&1 || { cat "$work/run.out"; fail "srun $* failed"; }
    grep -E "^convnext_zero: (CPU threads|CPUs of the ranks)" "$work/run.out" || { cat "$work/run.out"; fail "no header"; }
  }
  out=$(header --cpus-per-task=1 --cpu-bind=cores) || fail "${out#FAIL: }"
  echo "$out"
  grep -qF "local rank 0: mask 0 -> 0 (1 CPU, 1 core; its mask is its own); local rank 1: mask 1 -> 1 (1 CPU, 1 core; its mask is its own)" <<< "$out" ||
    fail "srun --cpus-per-task=1 with task/affinity: each rank should keep its own CPU"
  out=$(header --cpus-per-task=1 --cpu-bind=none) || fail "${out#FAIL: }"
  echo "$out"
  grep -qF "its mask is shared by 2 ranks: split by cores" <<< "$out" || fail "--cpu-bind=none: the ranks should split the CPUs"
  echo "cpu_placement: OK"
  ;;
updown)
  t0=$(date +%s.%N)
  "$slurm_sh" up "$cluster" --nodes 2 > "$work/up.out" 2>&1
  rc=$?
  ((rc == 77)) && { cat "$work/up.out"; exit 77; }
  ((rc == 0)) || { cat "$work/up.out"; fail "slurm.sh up exited with $rc"; }
  echo "up in $(elapsed "$t0") s"
  export SLURM_CONF=$cluster/slurm.conf
  out=$(timeout 30 srun -N2 -n2 hostname) || fail "srun -n2 hostname failed"
  [[ $(wc -l <<< "$out") -eq 2 ]] || fail "srun -n2 hostname printed: $out"
  # A job still running when the cluster goes down.
  timeout 30 srun -N1 -n1 sleep 300 > /dev/null 2>&1 &
  for ((i = 0; i < 50; ++i)); do [[ -n $(squeue -h -t R) ]] && break; sleep 0.1; done
  t0=$(date +%s.%N)
  "$slurm_sh" down "$cluster" || fail "slurm.sh down failed"
  echo "down in $(elapsed "$t0") s"
  # The daemons (marked in their environment) and the steps' slurmstepd (working in the cluster's log folder).
  left=$( (grep -lzxF "CZ_SLURM_DIR=$cluster" /proc/[0-9]*/environ
    find /proc/[0-9]*/cwd -maxdepth 0 -lname "$cluster/*") 2> /dev/null | cut -d/ -f3 | sort -u | tr '\n' ' ')
  left=${left% }
  [[ -z $left ]] || { ps -o pid,cmd -p ${left// /,}; fail "processes of the cluster left after down: $left"; }
  wait  # the srun client ends with its job
  for p in /proc/[0-9]*; do
    { tr '\0' '\n' < "$p/environ"; } 2> /dev/null > "$work/env" || continue
    grep -qxF "SLURM_CONF=$cluster/slurm.conf" "$work/env" && grep -q "^SLURM_JOB_ID=" "$work/env" && left+=" ${p#/proc/}"
  done
  [[ -z $left ]] || { ps -o pid,cmd -p ${left// /,}; fail "a job's process was left after down:$left"; }
  "$slurm_sh" down "$cluster" || fail "a second slurm.sh down failed"
  echo "nothing left running; down twice is fine"
  ;;

cluster)
  use_cluster
  out=$(timeout 30 srun -N3 -n3 -l printenv SLURMD_NODENAME | sort) || fail "srun over 3 nodes failed"
  [[ $(echo $out) == "0: n1 1: n2 2: n3" ]] || fail "srun -N3 -n3 ran on: $out"
  echo "srun -N3 -n3: $(echo $out)"
  mpi=$(srun --mpi=list 2>&1)
  echo "srun --mpi=list: $(echo $mpi)"
  grep -qw pmix <<< "$mpi" || echo "note: this Slurm offers no pmix: srun launches of Open MPI programs are refused"
  printf '#!/bin/bash\nsrun -l hostname\necho "tasks $SLURM_NTASKS nodes $SLURM_JOB_NODELIST"\n' > "$work/job.sh"
  id=$(submit -N2 --ntasks-per-node=2 -o "$work/job.out" "$work/job.sh")
  wait_state "$id" "" 30 || fail "job $id did not finish"
  cat "$work/job.out"
  grep -q "tasks 4 nodes n\[1-2\]" "$work/job.out" || fail "the job script's output is not as expected"
  [[ $(grep -c '^[0-3]: ' "$work/job.out") -eq 4 ]] || fail "srun in the batch script did not run 4 tasks"
  ;;

srun_mpirun_train)
  use_cluster
  pmix=1
  srun --mpi=list 2>&1 | grep -qw pmix || pmix=0
  straight_run "$work/straight.jsonl" 30
  ways=(mpirun)
  ((pmix)) && ways=(srun mpirun)
  for launch in "${ways[@]}"; do
    for try in 1 2; do
      t0=$(date +%s.%N)
      id=$(CZ_APP=$app CZ_CHECKPOINT_DIR=$work/ck_$launch CZ_LOG=$work/$launch.jsonl CZ_LAUNCH=$launch \
        CZ_TRAIN_ARGS="${model[*]} --steps 30" CZ_END_MARGIN=0 \
        submit -N2 --ntasks-per-node=1 -o "$work/$launch.out" "$examples/train.sbatch")
      finished=1
      wait_state "$id" "" 90 || finished=0
      ((finished)) && grep -q "finished with exit 0" "$work/$launch.out" && break
      if ((try == 1)) && ompi_tcp_init_crash "$work/$launch.out"; then
        echo "the $launch job $id met Open MPI's TCP wire-up crash in MPI_Init (docs/slurm.md); once more:"
        ompi_tcp_init_crash_lines "$work/$launch.out"
        scancel "$id" 2> /dev/null
        wait_state "$id" "" 30 || true
        rm -rf "$work/ck_$launch" "$work/$launch.jsonl"
        continue
      fi
      cat "$work/$launch.out"
      ((finished)) || fail "the $launch job $id did not finish"
      fail "the $launch job failed"
    done
    grep -q "x2, fp32, ZeRO stage 2" "$work/$launch.out" || { cat "$work/$launch.out"; fail "the $launch job did not run 2 ranks"; }
    same_steps "$work/straight.jsonl" "$work/$launch.jsonl" 30 "$launch in train.sbatch vs mpirun -np 2 outside Slurm"
    echo "$launch in train.sbatch: 30 steps, losses and gradient norms equal to mpirun -np 2 outside Slurm to the bit (job $(elapsed "$t0") s)"
  done
  # Start-up cost inside an allocation of N tasks (N = 2, 4): convnext_zero --steps 0 (start, model, data, no
  # step) launched by srun and by mpirun in turn, 3 times each.
  # Each run's output is kept, and printed where the run failed.
  cat > "$work/startup.sh" << EOF
#!/bin/bash
$(declare -f ompi_tcp_init_crash)
for rep in 1 2 3; do for launch in ${ways[*]}; do
  log=$work/startup_\${launch}_\${SLURM_NTASKS}_\$rep.log
  for try in 1 2; do
    t0=\$(date +%s.%N)
    if [[ \$launch == srun ]]; then srun --mpi=pmix --kill-on-bad-exit=1 $app --steps 0 ${model[*]} > "\$log" 2>&1
    else mpirun --bind-to none $app --steps 0 ${model[*]} > "\$log" 2>&1; fi
    rc=\$?
    t=\$(awk -v a=\$t0 -v b=\$(date +%s.%N) 'BEGIN { print b - a }')
    if ((rc != 0 && try == 1)) && ompi_tcp_init_crash "\$log"; then
      mv "\$log" "\$log.tcp_crash"
      echo "retried \$launch \$SLURM_NTASKS \$log.tcp_crash"
      continue
    fi
    break
  done
  echo "startup \$launch \$SLURM_NTASKS \$rc \$t \$log"
done; done
EOF
  for n in 1 2; do
    id=$(submit -N2 --ntasks-per-node=$n -o "$work/startup$n.out" "$work/startup.sh")
    wait_state "$id" "" 120 || fail "the start-up job did not finish"
  done
  cat "$work"/startup[12].out > "$work/startup.out"
  grep -q "startup" "$work/startup.out" || { cat "$work/startup.out"; fail "no start-up times"; }
  # Start-ups that met Open MPI's TCP wire-up crash in MPI_Init and ran again (docs/slurm.md): said, not hidden.
  awk '$1 == "retried" { print $4 }' "$work/startup.out" | while read -r log; do
    echo "a start-up met Open MPI's TCP wire-up crash in MPI_Init and ran again ($log):"
    ompi_tcp_init_crash_lines "$log"
  done
  if ! awk '$1 == "startup" && $4 != 0 { bad = 1; print "failed: " $0 } END { exit bad }' "$work/startup.out"; then
    awk '$1 == "startup" && $4 != 0 { print $6 }' "$work/startup.out" | while read -r log; do
      echo "== $log"
      tail -n 40 "$log"
    done
    fail "a start-up run failed"
  fi
  for key in $(awk '$1 == "startup" { print $2 "_" $3 }' "$work/startup.out" | sort -u); do
    times=$(awk -v l="${key%_*}" -v n="${key#*_}" '$1 == "startup" && $2 == l && $3 == n { print $5 }' "$work/startup.out" | sort -g)
    echo "start-up inside the allocation, ${key%_*} at ${key#*_} ranks: median $(sed -n "$(( ($(wc -l <<< "$times") + 1) / 2 ))p" <<< "$times") s of $(echo $times) s"
  done
  ;;

preempt_requeue)
  use_cluster
  steps=400
  straight_run "$work/straight.jsonl" $steps --export-weights "$work/straight.h5"
  # Job script as in examples/slurm: mpirun in the batch step, SIGUSR1 to the batch shell.
  id=$(CZ_APP=$app CZ_CHECKPOINT_DIR=$work/ck CZ_LOG=$work/run.jsonl CZ_LAUNCH=mpirun \
    CZ_TRAIN_ARGS="${model[*]} --steps $steps --checkpoint-every 100 --export-weights $work/run.h5" CZ_END_MARGIN=0 \
    submit -N2 --ntasks-per-node=1 -o "$work/job.out" "$examples/train.sbatch")
  prev=0
  for round in 1 2; do
    wait_for_step "$work/run.jsonl" $((prev + 60)) 60 || { cat "$work/job.out"; fail "round $round: the run did not reach step $((prev + 60))"; }
    sent=$(date +%s.%N)
    at=$(last_step "$work/run.jsonl")
    scancel --batch --signal=USR1 "$id" || fail "scancel --batch --signal=USR1 failed"
    # The job requeues itself: PENDING (Slurm holds a requeued job for 2 minutes: released at once here).
    wait_requeued "$id" $round 60 || { cat "$work/job.out"; fail "round $round: the job did not requeue itself"; }
    published=$(date -r "$work/ck/latest" +%s.%N)
    stopped=$(last_step "$work/run.jsonl")
    ck=$(cat "$work/ck/latest")
    [[ $ck == "step_$stopped" ]] || fail "round $round: latest is $ck but the run stopped after step $stopped"
    restarts=$(scontrol show job "$id" | grep -o 'Restarts=[0-9]*')
    [[ $restarts == "Restarts=$round" ]] || fail "round $round: scontrol shows $restarts"
    release "$id"
    released=$(date +%s.%N)
    wait_for_step "$work/run.jsonl" $((stopped + 1)) 60 || { cat "$work/job.out"; fail "round $round: the job did not resume"; }
    first=$(date +%s.%N)
    echo "preemption $round: SIGUSR1 at step $at; stopped after step $stopped; checkpoint $ck published $(awk -v a="$sent" -v b="$published" 'BEGIN { printf "%.2f", b - a }') s after the signal; requeued; first step after the release $(awk -v a="$released" -v b="$first" 'BEGIN { printf "%.2f", b - a }') s later"
    prev=$stopped
  done
  wait_state "$id" "" 90 || { cat "$work/job.out"; fail "the job did not finish"; }
  cat "$work/job.out"
  grep -q "finished with exit 0" "$work/job.out" || fail "the last start did not finish the run"
  [[ $(grep -c "requeueing" "$work/job.out") -eq 2 ]] || fail "the job was not requeued twice"
  [[ $(grep -c "resumed from" "$work/job.out") -eq 2 ]] || fail "the job did not resume twice"
  check_each_step_once "$work/run.jsonl" $steps
  same_steps "$work/straight.jsonl" "$work/run.jsonl" $steps "preempted twice vs unpreempted"
  h5diff "$work/straight.h5" "$work/run.h5" > "$work/h5diff.out" 2>&1 || { head "$work/h5diff.out"; fail "the final weights differ"; }
  echo "steps 1..$steps each logged once, losses equal to the unpreempted run's, final weights equal (h5diff: no difference); steps lost: 0"
  ;;

end_margin)
  use_cluster
  # A 1-minute job with a 45 s margin stops by itself about 15 s in. The script's --signal=B:USR1@120 would
  # come first (slurmctld sends it at its next pass: seen 1-15 s into the job): 5 s before the end instead.
  id=$(CZ_APP=$app CZ_CHECKPOINT_DIR=$work/ck CZ_LOG=$work/run.jsonl CZ_LAUNCH=mpirun \
    CZ_TRAIN_ARGS="${model[*]} --steps 100000 --schedule constant" CZ_END_MARGIN=45 \
    submit -N1 --ntasks-per-node=2 --time=1 --signal=B:USR1@5 -o "$work/job.out" "$examples/train.sbatch")
  wait_state "$id" RUNNING 30 || fail "the job did not start"
  end=$(date -d "$(squeue -h -j "$id" -o %e)" +%s)
  wait_requeued "$id" 1 60 || { cat "$work/job.out"; fail "the job did not stop and requeue itself before its end"; }
  scancel "$id"
  cat "$work/job.out"
  grep -q "stopped by the job's end time (--end-margin) after step" "$work/job.out" || fail "no stop before the job's end"
  grep -q "stopped with a checkpoint (exit 75): requeueing" "$work/job.out" || fail "the job script did not requeue"
  published=$(date -r "$work/ck/latest" +%s)
  [[ $(cat "$work/ck/latest") == "step_$(last_step "$work/run.jsonl")" ]] || fail "latest is not the last step"
  echo "checkpoint $(cat "$work/ck/latest") published $((end - published)) s before the job's end (margin 45 s)"
  ((end - published >= 30)) || fail "published only $((end - published)) s before the end"
  ;;

errors)
  use_cluster
  # expect_line OUT WANT: the output holds WANT on its only error line.
  expect_line() {
    grep -qF -- "$2" "$1" || { cat "$1"; fail "the output lacks '$2'"; }
    local n
    n=$(grep -c "convnext_zero: error:" "$1")
    [[ $n -eq 1 ]] || { cat "$1"; fail "$n error lines, not one"; }
    ! grep -qiE 'terminate called|segmentation|core dumped|MPI_ABORT|PMI' <(grep -v "convnext_zero: error" "$1") ||
      { cat "$1"; fail "more than one clear line"; }
    echo "ok: $(grep "convnext_zero: error:" "$1")"
  }
  quick=("$app" "${model[@]}" --steps 2)
  # mpirun -np 1 in a job of 2 tasks.
  printf '#!/bin/bash\nmpirun -np 1 %s\necho "exit $?"\n' "${quick[*]}" > "$work/np.sh"
  id=$(submit -N2 --ntasks-per-node=1 -o "$work/np.out" "$work/np.sh")
  wait_state "$id" "" 60 || fail "job $id did not finish"
  expect_line "$work/np.out" "mpirun started 1 rank but job $id has 2 tasks (2 nodes x 1 --ntasks-per-node): leave -np out"
  grep -q "exit [1-9]" "$work/np.out" || fail "mpirun -np 1 did not fail"
  # srun without --mpi.
  timeout 60 srun -N2 -n2 "${quick[@]}" > "$work/srun.out" 2>&1 && fail "srun without --mpi succeeded"
  expect_line "$work/srun.out" "srun started 2 tasks without a PMI plugin"
  # 2 ranks on a node with 1 GPU, --device cuda (checked before any GPU is touched).
  if srun --mpi=list 2>&1 | grep -qw pmix; then
    timeout 60 srun --mpi=pmix -N1 --ntasks-per-node=2 --gpus-per-node=1 "${quick[@]}" --device cuda \
      > "$work/gpu.out" 2>&1 && fail "2 ranks on 1 GPU succeeded"
    expect_line "$work/gpu.out" "2 ranks run on one node but job"
    grep -qF "has 1 GPU per node (--gpus-per-node 1)" "$work/gpu.out" || fail "the GPU line lacks the count"
  fi
  # A requeued job without --checkpoint-dir: the job requeues itself once, then runs.
  printf '#!/bin/bash\nif [[ ${SLURM_RESTART_COUNT:-0} == 0 ]]; then scontrol requeue $SLURM_JOB_ID; sleep 30; fi\nsrun --mpi=pmix %s\necho "exit $?"\n' "${quick[*]}" > "$work/rq.sh"
  id=$(submit -N1 -n1 -o "$work/rq.out" --open-mode=append "$work/rq.sh")
  wait_requeued "$id" 1 30 || fail "job $id did not requeue"
  release "$id"
  wait_state "$id" "" 60 || fail "job $id did not finish"
  expect_line "$work/rq.out" "job $id has been requeued (1 time) but the run has no --checkpoint-dir"
  # The program started by the job script itself in a job of 2 tasks.
  printf '#!/bin/bash\n%s\necho "exit $?"\n' "${quick[*]}" > "$work/direct.sh"
  id=$(submit -N2 --ntasks-per-node=1 -o "$work/direct.out" "$work/direct.sh")
  wait_state "$id" "" 60 || fail "job $id did not finish"
  expect_line "$work/direct.out" "the job has 2 tasks but convnext_zero was started once"
  ;;

cancel)
  use_cluster
  id=$(CZ_APP=$app CZ_CHECKPOINT_DIR=$work/ck CZ_LOG=$work/run.jsonl CZ_LAUNCH=mpirun \
    CZ_TRAIN_ARGS="${model[*]} --steps 100000 --schedule constant --checkpoint-every 20" CZ_END_MARGIN=0 \
    submit -N2 --ntasks-per-node=1 -o "$work/job.out" "$examples/train.sbatch")
  wait_for_step "$work/run.jsonl" 40 60 || { cat "$work/job.out"; fail "the run did not reach step 40"; }
  scancel "$id" || fail "scancel failed"
  wait_state "$id" "" 60 || { cat "$work/job.out"; fail "the job did not end"; }
  state=$(scontrol show job "$id" | grep -oE 'JobState=[A-Z_]+|Restarts=[0-9]+' | tr '\n' ' ')
  grep "^job $id: " "$work/job.out"
  [[ $state == "JobState=CANCELLED Restarts=0 " ]] || { cat "$work/job.out"; fail "the cancelled job shows $state"; }
  grep -q "not requeued: the job is COMPLETING" "$work/job.out" || fail "the job script did not say why it did not requeue"
  echo "scancel $id: $state"
  ;;

sigterm_mpirun | sigterm_srun)
  use_cluster
  launch=${case_name#sigterm_}
  if [[ $launch == srun ]] && ! srun --mpi=list 2>&1 | grep -qw pmix; then
    echo "SKIP: this Slurm offers no pmix (srun --mpi=list), so srun cannot launch Open MPI ranks"
    exit 77
  fi
  # Under srun each of the four starts can meet Open MPI's wire-up crash (Note [Open MPI's TCP wire-up crash]
  # in docs/slurm.md): a try that failed and shows it runs once more, in a fresh folder.
  top=$work
  tries=1
  [[ $launch == srun ]] && tries=2
  for ((try = 1; try <= tries; ++try)); do
    mkdir -p "$top/try$try"
    (work=$top/try$try && sigterm_try "$launch")
    rc=$?
    [[ -f $top/try$try/jobs ]] && cat "$top/try$try/jobs" >> "$top/jobs"
    ((rc == 0)) && break
    if ((try < tries)) && ompi_tcp_init_crash "$top/try$try/job.out"; then
      while read -r j; do scancel "$j" 2> /dev/null; done < "$top/try$try/jobs"
      echo "try $try met Open MPI's TCP wire-up crash (Note [Open MPI's TCP wire-up crash] in docs/slurm.md); once more:"
      ompi_tcp_init_crash_lines "$top/try$try/job.out"
      continue
    fi
    exit 1
  done
  ;;

czrun_node_lost | czrun_node_lost_srun)
  use_cluster
  # Each srun step of the --srun variant can meet Open MPI's wire-up crash, which czrun would count as a
  # restart of its own: a try that failed and shows it (ompi_tcp_init_crash) runs once more, in a fresh folder.
  top=$work
  tries=1
  [[ $case_name == czrun_node_lost_srun ]] && tries=2
  for ((try = 1; try <= tries; ++try)); do
    mkdir -p "$top/try$try"
    (work=$top/try$try && czrun_node_lost_try)
    rc=$?
    [[ -f $top/try$try/jobs ]] && cat "$top/try$try/jobs" >> "$top/jobs"
    ((rc == 0)) && break
    if ((try < tries)) && ompi_tcp_init_crash "$top/try$try/job.out"; then
      while read -r j; do scancel "$j" 2> /dev/null; done < "$top/try$try/jobs"
      "$slurm_sh" node "$cluster" n3 start > /dev/null 2>&1 || true
      echo "try $try met Open MPI's TCP wire-up crash (Note [Open MPI's TCP wire-up crash] in docs/slurm.md); once more:"
      ompi_tcp_init_crash_lines "$top/try$try/job.out"
      continue
    fi
    exit 1
  done
  ;;

*) fail "unknown case $case_name" ;;
esac
echo "PASS $case_name in $(elapsed "$t_start") s"
