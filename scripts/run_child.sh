# Sourced by hosts.sh and slurm.sh for their "with" command (each defines `die`).
#
# with_args USAGE ARGS...: splits ARGS at the first "--" into up_args (before it) and cmd (after it); dies
# with USAGE when there is no "--", and when nothing follows it.
with_args() {
  local usage=$1
  shift
  up_args=()
  while (($#)) && [[ $1 != -- ]]; do up_args+=("$1"); shift; done
  (($#)) && shift || die "$usage"
  (($#)) || die "with: no command after --"
  cmd=("$@")
}

# run_child CMD...: runs CMD in the background, passes INT, TERM and HUP on to it as TERM, and exits with
# CMD's status once CMD has ended. A signal interrupts `wait`, so it waits again until CMD is gone: the
# caller's EXIT trap (which takes the bed or the cluster down) runs only after CMD has finished.
run_child() {
  local child rc=0
  "$@" &
  child=$!
  trap 'kill -TERM "$child" 2> /dev/null || true' INT TERM HUP
  wait "$child" || rc=$?
  while kill -0 "$child" 2> /dev/null; do wait "$child" || rc=$?; done
  exit "$rc"
}
