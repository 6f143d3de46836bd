#!/usr/bin/env bash
# The ConvNeXt recipe's augmentations from the outside (issue 31, item 2): --aa, --interpolation, --reprob,
# --remode and --recount on a folder of real JPEGs. Usage: run_augment_app_tests.sh CASE APP MPIEXEC MAKE_FOLDER
#   augment_ranks      2 ranks x micro-batch 8 log the losses of 1 rank x 16 with RandAugment and erasing on, a
#                      run resumed at 2 ranks from the 1-rank run's checkpoint continues it, and the flags
#                      change what is trained on
#   augment_bad_flags  malformed values: a non-zero exit and a message naming the flag and the bad part, from
#                      one process and from mpirun
set -uo pipefail
case_name=$1 app=$2 mpiexec=$3 make_folder=$4
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"

"$make_folder" "$work/d" 40 24 7 cat=20 coffee=140 rocket=260 > /dev/null || fail "make_image_folder failed"
model=(--depths 1,1,1,1 --dims 8,16,24,32 --num-classes 3 --image-size 32 --loader-threads 2 --no-progress
       --data "folder:$work/d" --eval-batches 1 --seed 11)
recipe=(--augment --aa rand-m9-mstd0.5-inc1 --interpolation bicubic --reprob 0.25 --remode pixel --recount 2)


case $case_name in
augment_ranks)
  "$app" "${model[@]}" "${recipe[@]}" --steps 4 --micro-batch 16 --checkpoint-dir "$work/ck" --checkpoint-every 2 \
    --log "$work/one.jsonl" > "$work/out" 2>&1 || { cat "$work/out"; fail "1-rank run failed"; }
  "${mpirun[@]}" -np 2 "$app" "${model[@]}" "${recipe[@]}" --steps 4 --micro-batch 8 --log "$work/two.jsonl" \
    > "$work/out" 2>&1 || { cat "$work/out"; fail "2-rank run failed"; }
  compare "$work/one.jsonl" "$work/two.jsonl" 4 "1 rank x 16 and 2 ranks x 8" 1e-5
  "${mpirun[@]}" -np 2 "$app" "${model[@]}" "${recipe[@]}" --steps 4 --micro-batch 8 --resume "$work/ck/step_2" \
    --log "$work/resumed.jsonl" > "$work/out" 2>&1 || { cat "$work/out"; fail "resuming at 2 ranks failed"; }
  grep -F '"split":"train"' "$work/one.jsonl" | tail -n 2 > "$work/tail.jsonl"
  compare "$work/tail.jsonl" "$work/resumed.jsonl" 2 "steps 3-4 straight and resumed at 2 ranks" 1e-5
  # Each flag changes the images (so the runs above compared augmented training, not a no-op).
  for off in --aa --reprob --interpolation; do  # the recipe without one flag (its default: off, bilinear)
    without=()
    for ((i = 0; i < ${#recipe[@]}; ++i)); do
      if [[ ${recipe[i]} == "$off" ]]; then ((++i)); else without+=("${recipe[i]}"); fi
    done
    "$app" "${model[@]}" "${without[@]}" --steps 2 --micro-batch 16 --log "$work/off.jsonl" > "$work/out" 2>&1 ||
      { cat "$work/out"; fail "run without $off failed"; }
    [[ "$(steps_of "$work/off.jsonl" | head -1)" != "$(steps_of "$work/one.jsonl" | head -1)" ]] ||
      fail "without $off the first step is the recipe's"
    echo "without $off: first step $(steps_of "$work/off.jsonl" | head -1), with it $(steps_of "$work/one.jsonl" | head -1)"
  done
  echo "augment_ranks: OK"
  ;;
augment_bad_flags)
  check() {  # check EXPECTED-SUBSTRING ARGS...: run by one process
    local want=$1; shift
    "$app" "${model[@]}" --steps 1 "$@" > "$work/out" 2>&1
    local rc=$?
    if [[ $rc -eq 0 || $rc -ge 128 ]]; then cat "$work/out"; fail "'$*' exited with $rc"; fi
    grep -qF -- "$want" "$work/out" || { cat "$work/out"; fail "'$*': message lacks '$want'"; }
    ! grep -qiE 'terminate called|segmentation|core dumped|abort' "$work/out" || { cat "$work/out"; fail "'$*' crashed"; }
    echo "ok ($rc): $* -> $(grep -F -- "$want" "$work/out" | head -1)"
  }
  check "--aa 'rand-m9-mstd0.5-inc1-q3': unknown key 'q' in section 'q3'" --aa rand-m9-mstd0.5-inc1-q3
  check "--aa 'original-mstd0.5': starts with 'original'" --aa original-mstd0.5
  check "--aa 'rand-m': section 'm' has no number" --aa rand-m
  check "--aa 'rand-n2.5': '2.5' in section 'n2.5' is not a whole number" --aa rand-n2.5
  check "--interpolation must be bilinear or bicubic, got 'lanczos'" --interpolation lanczos
  check "--remode must be const, rand or pixel, got 'noise'" --remode noise
  check "--reprob must be a probability in [0, 1], got 2" --reprob 2
  check "--recount must be in [1, 64], got 0" --recount 0
  timeout 120 "${mpirun[@]}" -np 2 "$app" "${model[@]}" --steps 1 --aa rand-m9-w0 > "$work/out" 2>&1
  rc=$?
  [[ $rc -ne 0 && $rc -ne 124 ]] || { cat "$work/out"; fail "mpirun exited with $rc (124: hung)"; }
  grep -qF -- "--aa 'rand-m9-w0': unknown key 'w' in section 'w0'" "$work/out" || { cat "$work/out"; fail "no message"; }
  echo "augment_bad_flags: OK"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
