#!/usr/bin/env bash
# A real Slurm cluster on this machine, for tests and trials: munged (its own key and socket), slurmctld and N
# slurmd, each slurmd a node of its own (n1..nN, one host, one port each), all state in one folder. See
# docs/slurm.md.
#
#   slurm.sh up DIR [--nodes N] [--cpus C] [--gpus G] [--task-affinity]
#                    start the cluster (default 2 nodes x 2 CPUs, no GPUs; --gpus G: G GPUs per node as a gres
#                    without devices, so that --gpus-per-node allocations can be tested on a machine without
#                    GPUs; --task-affinity: TaskPlugin=task/affinity, which binds each task to its CPUs as a
#                    cluster's nodes do, instead of task/none); prints the environment the clients need
#                    (export SLURM_CONF=DIR/slurm.conf)
#   slurm.sh down DIR
#                    cancel every job, stop every daemon and step, remove nothing else; idempotent
#   slurm.sh env DIR print "export SLURM_CONF=..." for eval
#   slurm.sh node DIR NODE kill|start
#                    kill: SIGKILL to node NODE's slurmd and to the job tasks on it (a node lost at once, as a
#                    crash or a cut cable looks to Slurm); start: its slurmd again (it returns to service)
#   slurm.sh with DIR [up options] -- CMD...
#                    up, CMD with SLURM_CONF set, down on any exit; exits with CMD's status
#
# Needs: root, Debian's slurm-wlm (22.05) and munge. Exit status 77 from up/with means "cannot start Slurm
# here" (not root, a package missing, a daemon that would not start: the reason is printed), for tests to skip.
#
# Note [One-host cluster]: Debian 12's slurmd 22.05 runs several times on one host (whether its build has
# --enable-multiple-slurmd is not recorded with it) when each is started as `slurmd -N nI` and each node has a
# Port of its own: slurmctld reaches node nI at NodeAddr:Port, and the spool, pid, log and TmpFS paths of the
# nodes differ through %n. The nodes share the host's name (their tasks' `hostname`), /tmp and /dev/shm, so Open MPI's
# shared-memory transport must be off across them (OMPI_MCA_btl=self,tcp: docs/slurm.md).
# Every daemon started here carries CZ_SLURM_DIR=DIR in its environment; slurmstepd, which empties its
# environment, works in DIR/log: `down` finds them by these and kills them, and their descendants (the job
# tasks), by pid. (Checking the environment alone left a job step's slurmstepd running after `down`.)
set -euo pipefail

die() { echo "slurm.sh: $*" >&2; exit 1; }
skip() { echo "SKIP: slurm.sh: $*" >&2; exit 77; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2 i; shift 2
  for ((i = 0; i < limit * 10; ++i)); do "$@" > /dev/null 2>&1 && return 0; sleep 0.1; done
  echo "slurm.sh: timed out after ${limit} s waiting for $what" >&2
  return 1
}

# Pids of the cluster's processes: those that carry CZ_SLURM_DIR=DIR (the daemons), those whose working folder
# is in DIR (slurmstepd, which empties its environment and works in DIR/log), and their descendants (job tasks,
# whose environment is the submitter's); this shell excluded.
marked_pids() {
  local dir=$1 p
  local -a marked=()
  # One grep over every environment and one find over every working folder (a process per pid took seconds).
  for p in $( (grep -lzxF "CZ_SLURM_DIR=$dir" /proc/[0-9]*/environ
    find /proc/[0-9]*/cwd -maxdepth 0 -lname "$dir/*") 2> /dev/null | cut -d/ -f3 | sort -u); do
    [[ $p == "$$" || $p == "$BASHPID" ]] && continue
    # Not a zombie: one whose parent does not reap it (init, in some sandboxes) holds nothing.
    [[ $(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/$p/stat" 2> /dev/null) == [RSDTt] ]] && marked+=("$p")
  done
  ((${#marked[@]})) || return 0
  ps -e -o pid= -o ppid= | awk -v roots="${marked[*]}" '
    BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; ++i) keep[r[i]] = 1 }
    { parent[$1] = $2 }
    END { for (p in parent) { q = p; for (d = 0; d < 64 && q > 1; ++d) { if (q in keep) { print p; break } q = parent[q] } } }'
}

free_port() {  # free_port FROM: the first TCP port from FROM on that nothing listens on
  local p=$1
  while ss -Htln "sport = :$p" 2> /dev/null | grep -q .; do ((++p)); done
  echo "$p"
}

cmd_down() {
  (($# == 1)) || die "usage: slurm.sh down DIR"
  local dir
  dir=$(readlink -m "$1")
  [[ -d $dir ]] || return 0
  if [[ -f $dir/slurm.conf ]] && [[ -n $(marked_pids "$dir") ]]; then
    # Jobs first, so that slurmd ends their steps in the usual way.
    SLURM_CONF=$dir/slurm.conf timeout 5 scancel --full --signal=KILL --quiet --user=root 2> /dev/null || true
    SLURM_CONF=$dir/slurm.conf timeout 5 scontrol shutdown 2> /dev/null || true  # slurmctld and every slurmd
  fi
  local pids left i
  pids=$(marked_pids "$dir")
  if [[ -n $pids ]]; then
    # shellcheck disable=SC2086
    kill -TERM $pids 2> /dev/null || true
    for ((i = 0; i < 30; ++i)); do
      left=$(marked_pids "$dir")
      [[ -z $left ]] && break
      sleep 0.1
    done
    # shellcheck disable=SC2086
    [[ -n $left ]] && { kill -KILL $left 2> /dev/null || true; }
    wait_for 15 "the cluster's processes to exit" test -z "$(marked_pids "$dir")" ||
      die "processes left: $(marked_pids "$dir" | tr '\n' ' ')"
  fi
  rm -f "$dir"/*.pid "$dir"/run/*.pid 2> /dev/null || true
  return 0
}

cmd_up() {
  (($# >= 1)) || die "usage: slurm.sh up DIR [--nodes N] [--cpus C] [--gpus G]"
  local dir=$1 nodes=2 cpus=2 gpus=0 task_plugin=""
  shift
  while (($#)); do
    case $1 in
      --nodes) nodes=${2:?--nodes needs a value}; shift 2 ;;
      --cpus) cpus=${2:?--cpus needs a value}; shift 2 ;;
      --gpus) gpus=${2:?--gpus needs a value}; shift 2 ;;
      --task-affinity) task_plugin=task/affinity; shift ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  [[ $nodes =~ ^[0-9]+$ ]] && ((nodes >= 1 && nodes <= 16)) || die "--nodes must be 1-16, got '$nodes'"
  [[ $cpus =~ ^[0-9]+$ ]] && ((cpus >= 1)) || die "--cpus must be at least 1, got '$cpus'"
  [[ $gpus =~ ^[0-9]+$ ]] || die "--gpus must be a count, got '$gpus'"
  [[ $(id -u) -eq 0 ]] || skip "needs root (the daemons run as SlurmUser=root)"
  local t
  for t in munged slurmctld slurmd srun sbatch scontrol; do
    command -v "$t" > /dev/null || skip "'$t' is not installed (Debian: apt-get install slurm-wlm munge)"
  done
  mkdir -p "$dir"
  dir=$(readlink -f "$dir")
  cmd_down "$dir"
  up_done=0  # global: the EXIT trap runs after this function has returned
  trap '((up_done)) || cmd_down "$dir" > /dev/null 2>&1 || true' EXIT
  # A fresh cluster each time: no jobs or node states (a drain reason) carried over from an earlier one.
  rm -rf "${dir:?}"/{state,spool,log,run,dev,tmp}
  mkdir -p "$dir"/{munge,state,spool,log,run}
  chmod 700 "$dir" "$dir/munge"
  export CZ_SLURM_DIR=$dir

  # munged refuses a key or socket folder that others may write to; it runs as root here, hence --force.
  local sock=$dir/munge/munge.socket
  [[ -f $dir/munge/munge.key ]] || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge/munge.key"
  munged --force --key-file="$dir/munge/munge.key" --socket="$sock" --pid-file="$dir/munge/munged.pid" \
    --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" ||
    skip "munged would not start: $(tail -n 2 "$dir/log/munged.log" 2> /dev/null | tr '\n' ' ')"
  wait_for 5 "munged's socket" test -S "$sock" || skip "munged did not open its socket"

  local ctl_port node_port host
  ctl_port=$(free_port 17817)
  node_port=$(free_port $((ctl_port + 1)))
  host=$(hostname -s)
  local gres_line="" node_gres="" i
  if ((gpus > 0)); then
    gres_line="GresTypes=gpu"
    node_gres="Gres=gpu:$gpus"
    # slurmd counts a gpu gres only with a File per GPU, a character device: links to /dev/null do (no
    # cgroup device constraint here, and no program opens them).
    mkdir -p "$dir/dev"
    for ((i = 0; i < gpus; ++i)); do ln -sfn /dev/null "$dir/dev/gpu$i"; done
    echo "NodeName=n[1-$nodes] Name=gpu File=$dir/dev/gpu[0-$((gpus - 1))]" > "$dir/gres.conf"
  else
    : > "$dir/gres.conf"
  fi
  {
    echo "# Written by scripts/slurm.sh up: a test cluster on one host (docs/slurm.md)."
    echo "ClusterName=czs"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$ctl_port"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$sock"
    echo "StateSaveLocation=$dir/state"
    echo "SlurmdSpoolDir=$dir/spool/%n"
    # Each node's temporary folder: srun --mpi=pmix makes /tmp/spmix_appdir_UID_JOB.STEP on every node, and the
    # second node's stepd on this one host failed with "File exists".
    echo "TmpFS=$dir/tmp/%n"
    echo "SlurmctldPidFile=$dir/run/slurmctld.pid"
    echo "SlurmdPidFile=$dir/run/slurmd-%n.pid"
    echo "SlurmctldLogFile=$dir/log/slurmctld.log"
    echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=${task_plugin:-task/none}"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "SchedulerType=sched/backfill"
    echo "MpiDefault=none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/none"
    echo "SwitchType=switch/none"
    echo "ReturnToService=2"
    echo "SlurmdParameters=config_overrides"
    # A lost node is noticed within SlurmdTimeout; a cancelled step gets KillWait between SIGTERM and SIGKILL.
    echo "SlurmdTimeout=30"
    echo "KillWait=5"
    echo "MinJobAge=600"
    echo "InactiveLimit=0"
    echo "JobRequeue=1"
    [[ -n $gres_line ]] && echo "$gres_line"
    for ((i = 1; i <= nodes; ++i)); do
      echo "NodeName=n$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((node_port + i - 1)) CPUs=$cpus RealMemory=1000 $node_gres State=UNKNOWN"
    done
    echo "PartitionName=czs Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } > "$dir/slurm.conf"
  echo "# no cgroup plugins (ProctrackType=proctrack/linuxproc, TaskPlugin=task/none)" > "$dir/cgroup.conf"
  export SLURM_CONF=$dir/slurm.conf

  slurmctld -i -f "$dir/slurm.conf" ||
    skip "slurmctld would not start: $(tail -n 3 "$dir/log/slurmctld.log" 2> /dev/null | tr '\n' ' ')"
  wait_for 10 "slurmctld to answer" scontrol ping ||
    skip "slurmctld does not answer: $(tail -n 3 "$dir/log/slurmctld.log" 2> /dev/null | tr '\n' ' ')"
  for ((i = 1; i <= nodes; ++i)); do
    mkdir -p "$dir/spool/n$i" "$dir/tmp/n$i"
    slurmd -N "n$i" -f "$dir/slurm.conf" ||
      skip "slurmd n$i would not start: $(tail -n 3 "$dir/log/slurmd-n$i.log" 2> /dev/null | tr '\n' ' ')"
  done
  nodes_idle() { [[ $(sinfo -h -N -o '%t' | grep -c '^idle') -eq $nodes ]]; }
  wait_for 20 "$nodes nodes to be idle" nodes_idle ||
    skip "the nodes did not come up: $(sinfo -h -N -o '%N %t %E' | tr '\n' ';') $(tail -n 2 "$dir/log/slurmd-n1.log" | tr '\n' ' ')"
  # shellcheck disable=SC2034  # read by the EXIT trap above
  up_done=1
  echo "slurm.sh: cluster up in $dir: $nodes nodes x $cpus CPUs$( ((gpus)) && echo " x $gpus GPUs"), slurmctld port $ctl_port" >&2
  echo "export SLURM_CONF=$dir/slurm.conf"
}

cmd_env() {
  (($# == 1)) || die "usage: slurm.sh env DIR"
  local dir
  dir=$(readlink -f "$1")
  [[ -f $dir/slurm.conf ]] || die "no cluster in $dir (slurm.sh up $1)"
  echo "export SLURM_CONF=$dir/slurm.conf"
}

cmd_node() {
  (($# == 3)) || die "usage: slurm.sh node DIR NODE kill|start"
  local dir node=$2 pids p
  dir=$(readlink -f "$1")
  [[ -f $dir/slurm.conf ]] || die "no cluster in $dir"
  grep -q "^NodeName=$node " "$dir/slurm.conf" || die "no node '$node' in $dir/slurm.conf"
  case $3 in
    kill)
      # The tasks (Open MPI's daemon and ranks included) carry their node's name and the cluster's slurm.conf.
      pids=$(cat "$dir/run/slurmd-$node.pid" 2> /dev/null || true)
      for p in $(grep -lzxF "SLURMD_NODENAME=$node" /proc/[0-9]*/environ 2> /dev/null | cut -d/ -f3); do
        grep -qzxF "SLURM_CONF=$dir/slurm.conf" "/proc/$p/environ" 2> /dev/null && pids+=" $p"
      done
      # shellcheck disable=SC2086
      [[ -n ${pids// /} ]] && kill -KILL $pids 2> /dev/null
      echo "slurm.sh: node $node killed (pids$(printf ' %s' $pids))" >&2
      ;;
    start)
      export CZ_SLURM_DIR=$dir SLURM_CONF=$dir/slurm.conf
      slurmd -N "$node" -f "$dir/slurm.conf" || die "slurmd $node would not start"
      node_up() { [[ $(sinfo -h -n "$node" -o '%t') =~ ^(idle|mix|alloc)$ ]]; }
      wait_for 40 "node $node to return to service" node_up || die "node $node did not come back"
      ;;
    *) die "node: kill or start, got '$3'" ;;
  esac
}

cmd_with() {
  (($# >= 1)) || die "usage: slurm.sh with DIR [up options] -- CMD..."
  local dir=$1 self up_args cmd
  shift
  self=$(readlink -f "$0")
  source "$(dirname "$self")/run_child.sh"
  with_args "usage: slurm.sh with DIR [up options] -- CMD..." "$@"
  mkdir -p "$dir"
  dir=$(readlink -f "$dir")
  trap '"$self" down "$dir" >&2 || true' EXIT
  "$self" up "$dir" "${up_args[@]}" > /dev/null || exit $?
  export SLURM_CONF=$dir/slurm.conf
  run_child "${cmd[@]}"
}

sub=${1:-}
(($#)) && shift
case $sub in
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  env) cmd_env "$@" ;;
  node) cmd_node "$@" ;;
  with) cmd_with "$@" ;;
  *) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
