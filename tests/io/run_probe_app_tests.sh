#!/usr/bin/env bash
# HDF5 files that crash libhdf5, given to the programs (Note [Probing HDF5 files], src/io/h5/h5_probe.h): each
# must exit 1 with a message naming the file, never die by a signal.
# Usage: run_probe_app_tests.sh APP CZ_WEIGHTS MPIEXEC KNOWN_CRASHES_DIR
#   every file in KNOWN_CRASHES_DIR as --data h5:FILE, as --init-weights FILE, to cz_weights, and as a
#   checkpoint's index and rank file under --resume; one of them under mpirun at 2 ranks.
set -uo pipefail
app=$1 cz_weights=$2 mpiexec=$3 crashes=$4
source "$(dirname "${BASH_SOURCE[0]}")/../lib/preamble.sh"
tiny_model 4 64 16

expect_named() {  # expect_named FILE COMMAND...: exit status 1, FILE and "the file is corrupt" in the output
  local file=$1; shift
  timeout 120 "$@" > "$work/out" 2>&1
  local rc=$?
  [[ $rc -eq 1 ]] || { cat "$work/out"; fail "'$*' exited with $rc, expected 1"; }
  grep -F -- "$file" "$work/out" | grep -qF "the file is corrupt" ||
    { cat "$work/out"; fail "'$*': no message naming $file"; }
  ! grep -qiE 'segmentation|core dumped|terminate called' "$work/out" || { cat "$work/out"; fail "'$*' crashed"; }
  echo "ok: ${*:1:3} ... -> $(grep -F -- "$file" "$work/out" | head -1)"
}

"$app" "${tiny[@]}" --steps 2 --checkpoint-dir "$work/ck" > "$work/out" 2>&1 || { cat "$work/out"; fail "saving failed"; }
files=("$crashes"/*.h5)
[[ ${#files[@]} -ge 2 ]] || fail "no files in $crashes"
for f in "${files[@]}"; do
  expect_named "$f" "$app" "${model[@]}" --steps 1 --data "h5:$f"
  expect_named "$f" "$app" "${tiny[@]}" --steps 1 --init-weights "$f"
  expect_named "$f" "$cz_weights" "$f" --model atto
  # The index replaced; then a rank file, padded to the size the manifest records so only the probe can tell.
  rm -rf "$work/ck2" && cp -r "$work/ck" "$work/ck2"
  cp "$f" "$work/ck2/step_2/checkpoint.h5"
  expect_named "$work/ck2/step_2/checkpoint.h5" "$app" "${tiny[@]}" --steps 3 --resume "$work/ck2"
  rm -rf "$work/ck2" && cp -r "$work/ck" "$work/ck2"
  rank0="$work/ck2/step_2/rank_00000.h5"
  size=$(stat -c %s "$rank0")
  cp "$f" "$rank0" && truncate -s "$size" "$rank0"
  expect_named "$rank0" "$app" "${tiny[@]}" --steps 3 --resume "$work/ck2"
done
# Under Open MPI: each rank spawns its own probe, and every rank exits instead of hanging.
timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$app" "${model[@]}" --steps 1 \
  --data "h5:${files[0]}" > "$work/out" 2>&1
rc=$?
[[ $rc -ne 0 && $rc -ne 124 ]] || { cat "$work/out"; fail "mpirun exited with $rc (124: hung)"; }
grep -F -- "${files[0]}" "$work/out" | grep -qF "the file is corrupt" || { cat "$work/out"; fail "mpirun: no message"; }
echo "ok: mpirun -np 2 -> $rc"
echo "probe app tests: OK"
