#!/usr/bin/env bash
# Checkpoints across processes (usage: run_checkpoint_tests.sh CASE MPIRUN DRIVER [CZ_WEIGHTS]):
#   reshard   saved at 4, 2 (background writer) and 1 ranks, read at 1, 3 and 4 (all but the writers' sizes)
#   kill      a rank SIGKILLed at each point of a save; the previous checkpoint (or the new one, once `latest`
#             names it) loads complete, and the next save succeeds and leaves nothing temporary behind
#   ulimit    a file-size limit (ulimit -f) while saving: a non-zero exit naming the rank file and the reason,
#             and the previous checkpoint stays
#   h5py      h5py reads names, shapes, values and attributes (skipped, exit 77, without h5py; a failure
#             instead where h5py is promised: CZ_REQUIRE_H5PY=1, as ./build.sh test sets, or CI=true)
#   h5dump    h5dump shows the datasets in PyTorch shape with the values written (skipped without h5dump)
#   cz_weights  a checkpoint exported as a weight file that cz_weights then checks against the model
set -u
case=$1 mpirun=$2 driver=$3 cz_weights=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../lib/preamble.sh"
run() {  # run NP ARGS...: the driver at NP ranks; output shown, exit code returned
  local np=$1
  shift
  timeout 120 "$mpirun" --allow-run-as-root --oversubscribe -np "$np" "$driver" "$@" 2>&1
}
expect_ok() { out=$(run "$@") || fail "driver $* exited non-zero: $out"; echo "$out"; }

case $case in
reshard)
  expect_ok 4 save "$work/a" 1
  expect_ok 2 save "$work/b" 2 --background
  expect_ok 1 save "$work/c" 3
  expect_ok 1 check "$work/a" 1
  expect_ok 3 check "$work/a" 1 "$work/c" 3
  expect_ok 4 check "$work/b" 2 "$work/c" 3
  ;;
kill)
  expect_ok 2 save "$work/base" 1 --keep 1
  # phase kill-rank kill-count expected-step-afterwards [mode]
  points=(
    "prepared 1 1 1" "slice 1 5 1" "slice 0 2 1 --background" "rank_file 1 1 1" "agreed 1 1 1" "index 0 1 1"
    "renamed 0 1 1" "latest 0 1 2" "pruned 0 1 2"
  )
  checks=()
  for p in "${points[@]}"; do
    read -r phase rank count expect mode <<<"$p"
    dir="$work/k_${phase}_${rank}${mode:-}"
    cp -a "$work/base" "$dir"
    out=$(run 2 save "$dir" 2 --keep 1 --kill-at "$phase" --kill-rank "$rank" --kill-count "$count" ${mode:-})
    rc=$?
    echo "== killed rank $rank at '$phase' #$count ${mode:-}: exit $rc"
    ((rc != 0 && rc != 124)) || fail "the save with a rank killed at $phase exited $rc: $out"
    checks+=("$dir" "$expect")
  done
  # Each folder loads complete (checksums verified) as the expected step, at another world size.
  expect_ok 1 check "${checks[@]}"
  # The next save succeeds, clears what the killed one left, and keeps only itself (keep 1).
  for dir in "$work/k_slice_1" "$work/k_renamed_0"; do
    expect_ok 2 save "$dir" 3 --keep 1
    [[ $(ls -A "$dir") == $'latest\nstep_3' ]] || fail "after the next save with keep 1: $(ls -A "$dir")"
  done
  ;;
ulimit)
  expect_ok 2 save "$work/c" 1 --model atto
  # 16 MiB for the ranks only (MPI's own shared-memory files are a few MiB): the rank files (~28 MB each)
  # cannot be written.
  out=$(timeout 120 "$mpirun" --allow-run-as-root --oversubscribe -np 2 bash -c \
    'ulimit -f 16384 && exec "$0" "$@"' "$driver" save "$work/c" 2 --model atto 2>&1)
  rc=$?
  echo "$out"
  ((rc != 0)) || fail "the save under ulimit -f exited 0"
  grep -q "step_2 not saved: rank [01]: .*rank_0000[01].h5.*File too large" <<<"$out" || fail "no clear message"
  expect_ok 2 check "$work/c" 1 --model atto
  [[ ! -e $work/c/step_2 ]] || fail "a step_2 appeared"
  ;;
h5py)
  if ! "$py" -c "import h5py" 2>/dev/null; then
    [[ ${CZ_REQUIRE_H5PY:-} == 1 || ${CI:-} == true ]] &&
      fail "$py does not import h5py, and this run promises it" \
        "(CZ_REQUIRE_H5PY=1 or CI=true): apt-get install python3-h5py"
    echo "h5py is not installed: skipped"
    exit 77
  fi
  expect_ok 3 save "$work/d" 4
  "$py" "$here/check_checkpoint_h5py.py" "$work/d" 4 || fail "h5py check ($py)"
  ;;
h5dump)
  command -v h5dump >/dev/null || { echo "h5dump is not installed: skipped"; exit 77; }
  expect_ok 3 save "$work/e" 4
  index="$work/e/step_4/checkpoint.h5"
  header=$(cd / && h5dump -H "$index") || fail "h5dump -H"
  for want in 'GROUP "params"' 'GROUP "ema"' 'DATASET "stem.0.weight"' 'SIMPLE { ( 8, 3, 4, 4 ) / ( 8, 3, 4, 4 ) }' \
    'DATASET "stages.0.blocks.0.mlp.fc1.weight"' 'SIMPLE { ( 32, 8 ) / ( 32, 8 ) }' 'ATTRIBUTE "world_size"'; do
    grep -qF "$want" <<<"$header" || fail "h5dump -H lacks: $want"
  done
  # head.fc.bias of "params" (tensor 9, group 0) at step 4: ((4*7919 + 9*1299709 + 31 i) mod 4e6) / 2.
  data=$(cd / && h5dump -d params/head.fc.bias -m %.1f "$index") || fail "h5dump -d"
  values=$(sed -n '/DATA {/,/}/p' <<<"$data" | grep -oE '[0-9]+\.[0-9]' | tr '\n' ' ')
  want=""
  for i in $(seq 0 9); do want+="$(((4 * 7919 + 9 * 1299709 + 31 * i) % 4000000 / 2)).$(((4 * 7919 + 9 * 1299709 + 31 * i) % 4000000 % 2 * 5)) "; done
  [[ $values == "$want" ]] || fail "h5dump values: $values; expected $want"
  echo "h5dump: names, shapes and values as written"
  ;;
cz_weights)
  expect_ok 2 save "$work/f" 5 --model atto
  # Atto, known by its depths and dims, is exported in timm's layout for it (1x1-convolution MLP weights)
  # without --conv-mlp.
  out=$("$cz_weights" "$work/f" "$work/ema.h5" --checkpoint-group ema 2>&1) || fail "export: $out"
  grep -q "MLP weights as timm's 1x1 convolutions (out, in, 1, 1) (convnext_atto, by the checkpoint's depths and dims)" \
    <<<"$out" || fail "export: not in atto's timm layout: $out"
  out=$("$cz_weights" "$work/ema.h5" --model atto --num-classes 10 2>&1) || fail "import: $out"
  grep -q "128 tensors" <<<"$out" || fail "import: $out"
  # Without --model: the file says it is atto with 10 classes (its attributes), not tiny with 1000.
  out=$("$cz_weights" "$work/ema.h5" 2>&1) || fail "import without --model: $out"
  grep -q "depths (2, 2, 6, 2) dims (40, 80, 160, 320), 10 classes (from the file's attributes)" <<<"$out" &&
    grep -q "128 tensors" <<<"$out" || fail "import without --model: $out"
  "$cz_weights" "$work/f/step_5" 2>&1 | grep -q "give the weight file to write" || fail "no output named"
  ;;
*)
  fail "unknown case $case"
  ;;
esac
echo PASS
