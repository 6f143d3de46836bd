#!/usr/bin/env bash
# The OpenMP wait policy each rank chooses at start (issue 30; Note [Choosing the OpenMP wait policy]), from
# the outside: the header says it and why; alone, the threads spin when the idle cores it measured hold
# them; beside CPU-bound processes (one per core) they wait passively; one thread per rank, or too many
# threads, wait passively; OMP_WAIT_POLICY set by the user wins.
#   run_omp_policy_test.sh CONVNEXT_ZERO MPIRUN
set -u
app=$1 mpirun=$2
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
cores=$(nproc)
loops=()
stop_loops() { for p in "${loops[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; loops=(); }
on_exit stop_loops
run() {  # run [ENV=V...] [-- LAUNCHER...]: a short run's "OpenMP waits" line
  out=$(env -u OMP_WAIT_POLICY -u OMP_NUM_THREADS "$@" --depths 1,1,1,1 --dims 8,16,24,32 --image-size 32 \
    --micro-batch 2 --steps 1 --eval-batches 1 --no-progress 2>&1) || fail "'$*' exited $?: $out"
  line=$(grep "^convnext_zero: OpenMP waits " <<<"$out") || fail "'$*': the header does not say the policy: $out"
  echo "$line"
}
expect() {  # expect POLICY WORDS LINE (a failed run's FAIL line, from inside $(run ...), is passed on)
  [[ $3 == FAIL:* ]] && fail "${3#FAIL: }"
  [[ $3 == "convnext_zero: OpenMP waits $1: "* ]] || fail "expected $1: $3"
  grep -qF -- "$2" <<<"$3" || fail "expected '$2' in: $3"
  echo "ok: $1 ($2)"
}

# Alone: the choice follows the idle cores the run measured (on a quiet machine, all of them: active).
line=$(run "$app") || fail "${line#FAIL: }"
if ((cores >= 2)); then
  idle=$(sed -n 's/.* \([0-9.]*\) idle cores of the .*/\1/p; s/.*only \([0-9.]*\) of the .*/\1/p' <<<"$line")
  [[ -n $idle ]] || fail "alone on $cores cores: no idle figure in: $line"
  # The figure is printed to 0.1 of a core: the rule (idle + 0.3 >= threads) is checked within that rounding.
  if [[ $line == "convnext_zero: OpenMP waits active: "* ]]; then
    "$py" -c "import sys; sys.exit(0 if $idle + 0.3 >= $cores - 0.05 else 1)" ||
      fail "active on $idle idle cores of $cores: $line"
    expect active "$cores threads per rank x 1 rank sharing the mask fit the $idle idle cores of the $cores cores" "$line"
  else
    "$py" -c "import sys; sys.exit(0 if $idle + 0.3 < $cores + 0.05 else 1)" ||
      fail "passive on $idle idle cores of $cores: $line"
    expect passive "were idle at start" "$line"
    echo "note: the machine was busy ($idle of $cores cores idle): the active case was not seen"
  fi
else
  expect passive "1 thread per rank" "$line"
fi

# Beside one CPU-bound process per core: passive.
for ((i = 0; i < cores; ++i)); do
  bash -c 'while :; do :; done' &
  loops+=($!)
done
sleep 0.5
((cores >= 2)) && expect passive "were idle at start (spinning beside other work stalls)" "$(run "$app")"
# The user's setting wins, even there.
expect active "OMP_WAIT_POLICY is set in the environment" "$(run OMP_WAIT_POLICY=active "$app")"
stop_loops
expect passive "OMP_WAIT_POLICY is set in the environment" "$(run OMP_WAIT_POLICY=passive "$app")"

# One thread per rank, and more threads than cores.
expect passive "1 thread per rank x 1 rank sharing the mask: no thread waits" "$(run OMP_NUM_THREADS=1 "$app")"
expect passive "oversubscribe the $cores cores" "$(run OMP_NUM_THREADS=$((2 * cores)) "$app")"
# Under mpirun unbound ranks share the mask's cores: 2 ranks on 2 cores are one thread each (bound ranks:
# run_cpu_placement_test.sh).
if ((cores == 2)); then
  expect passive "1 thread per rank x 2 ranks sharing the mask" \
    "$(run "$mpirun" --allow-run-as-root --oversubscribe --bind-to none -np 2 "$app")"
fi

# A CUDA rank's threads (Note [CPU threads on a CUDA rank]), as --plan states them for this host: the same
# rule and words as a CUDA run's header, without a GPU (issue 40).
plan_line() {  # plan_line [ENV=V...] APP [FLAGS...]
  local out
  out=$(env -u OMP_WAIT_POLICY -u OMP_NUM_THREADS "$@" --plan --device cuda --model atto --image-size 64 \
    --micro-batch 8 2>&1) || { echo "FAIL: '$*' exited $?: $out"; return; }
  grep "^On this host, a run would take CPU threads per rank (a CUDA rank, " <<<"$out" ||
    echo "FAIL: '$*': no CUDA rank's threads in: $out"
}
has() {  # has LINE WORDS...
  [[ $1 == FAIL:* ]] && fail "${1#FAIL: }"
  local line=$1
  shift
  for w in "$@"; do grep -qF -- "$w" <<<"$line" || fail "expected '$w' in: $line"; done
  echo "ok: ${*: -1}"
}
if ((cores >= 2)); then
  has "$(plan_line "$app")" \
    "$cores CPUs, $cores cores: its own, estimated; $cores in the mask, 1 rank on this host): $((cores - 1)) loader thread" \
    "left to the thread that launches kernels" "OpenMP 1 thread (the step's math is on the GPU) waiting passively"
  has "$(plan_line "$app" --offload-optimizer)" \
    "OpenMP $((cores - 1)) thread$( ((cores > 2)) && echo s) (the host runs the offloaded optimizer) waiting passively"
  has "$(plan_line "$app" --ranks "$cores")" \
    "1 CPU, 1 core: its split of a mask $cores ranks share, estimated; $cores in the mask, $cores ranks on this host" \
    "sharing a CPU with the thread that launches kernels"
fi
has "$(plan_line OMP_NUM_THREADS=3 OMP_WAIT_POLICY=active "$app" --loader-threads 5)" \
  "5 loader threads (--loader-threads 5)" "OpenMP 3 threads (OMP_NUM_THREADS=3) waiting actively (OMP_WAIT_POLICY=active)"
echo PASS
