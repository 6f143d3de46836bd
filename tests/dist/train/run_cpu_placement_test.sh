#!/usr/bin/env bash
# Each rank's CPUs from the masks mpirun really gave the ranks of this host (issue 51; Note [A rank's CPUs
# on a node], tensor/cpu_share.h), from the outside: the header's "CPUs of the ranks on this host" line
# (every local rank's mask, its share and why) and rank 0's threads, under --bind-to core, --map-by
# ppr:N:node:PE=1, --bind-to socket, --bind-to none, and more ranks than cores.
#   run_cpu_placement_test.sh CONVNEXT_ZERO MPIEXEC
set -u
app=$1 mpiexec=$2
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
cores=$(nproc)
((cores >= 2)) || { echo "SKIP: one CPU: nothing to place"; exit 77; }
"$py" -c "import os, sys; sys.exit(sorted(os.sched_getaffinity(0)) != list(range($cores)))" ||
  { echo "SKIP: this shell's mask is not CPUs 0-$((cores - 1))"; exit 77; }

run() {  # run NP [MPIRUN OPTIONS...]: the header of a one-step CPU run on NP ranks
  local np=$1
  shift
  env -u OMP_WAIT_POLICY -u OMP_NUM_THREADS "${mpirun[@]}" -np "$np" "$@" "$app" --depths 1,1,1,1 --dims 8,16,24,32 \
    --image-size 32 --micro-batch 2 --steps 1 --eval-batches 0 --no-progress --device cpu 2>&1 ||
    echo "FAIL: mpirun -np $np $* exited $?"
}
expect() {  # expect LABEL OUTPUT WORDS...: every WORDS in OUTPUT's header
  local label=$1 out=$2
  shift 2
  [[ $out == *"FAIL: "* ]] && fail "$label: $out"
  for w in "$@"; do grep -qF -- "$w" <<<"$out" || fail "$label: expected '$w' in: $(grep '^convnext_zero: C' <<<"$out")"; done
  echo "ok: $label"
}

all="0-$((cores - 1))"
# Bound to a core each (mpirun's default for 2 ranks): each rank keeps its one CPU, not 1 / 2 of it.
expect "--bind-to core" "$(run 2 --bind-to core)" \
  "local rank 0: mask 0 -> 0 (1 CPU, 1 core; its mask is its own); local rank 1: mask 1 -> 1 (1 CPU, 1 core; its mask is its own)" \
  "CPU threads per rank (1 CPU, 1 core: its own; 1 in the mask, 2 ranks on this host)"
expect "--map-by ppr:2:node:PE=1" "$(run 2 --map-by ppr:2:node:PE=1 --bind-to core)" \
  "local rank 0: mask 0 -> 0 (1 CPU, 1 core; its mask is its own); local rank 1: mask 1 -> 1"
# One rank bound to one core of two: that core alone.
expect "one rank --bind-to core" "$(run 1 --bind-to core)" \
  "local rank 0: mask 0 -> 0 (1 CPU, 1 core; its mask is its own)" "OpenMP 1 thread"
# One rank, unbound: the whole machine, OpenMP on every core.
expect "one rank --bind-to none" "$(run 1 --bind-to none)" \
  "local rank 0: mask $all -> $all ($cores CPUs, $cores cores; its mask is its own)" "OpenMP $cores threads"
# Two ranks holding one mask (a socket, or no binding): split by cores.
half=$((cores / 2))
for bind in socket none; do
  expect "--bind-to $bind" "$(run 2 --bind-to $bind)" \
    "local rank 0: mask $all -> $( ((half == 1)) && echo 0 || echo "0-$((half - 1))")" \
    "its mask is shared by 2 ranks: split by cores" \
    "CPU threads per rank ($half CPU$( ((half > 1)) && echo s), $half core$( ((half > 1)) && echo s): its split of a mask 2 ranks share"
done
# More ranks than cores: crowded, one thread each, nothing pinned.
np=$((2 * cores))
expect "$np ranks on $cores cores" "$(run $np --bind-to none)" \
  "its mask is shared by $np ranks with fewer cores than ranks: CPUs shared, nothing pinned" \
  "OpenMP 1 thread waiting passively"
echo PASS
