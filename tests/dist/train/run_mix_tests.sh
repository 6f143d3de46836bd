#!/usr/bin/env bash
# Mixup/CutMix and --dump-batches from the outside: real runs, real files, real mpirun.
# Usage: run_mix_tests.sh CASE APP MPIEXEC
#   ranks_pairing  Note [Mixing within a micro-batch]: 2 and 4 ranks x micro-batch m receive, position by
#                  position, the images, targets and mixing one rank receives with micro-batch m and
#                  --grad-accum 2 / 4 (their dumps, bit for bit), and log the same losses and gradient norms;
#                  one rank with micro-batch 4m pairs within its 4m images instead
#   dump_stats     a mixed run's dump against the same run's unmixed dump: pixels, targets and lam as timm
#                  makes them, row by row, and lam's distribution
#   resume         a run resumed from a checkpoint mixes its batches as the uninterrupted run did, from mid-epoch,
#                  from an epoch's end and from one batch past it (the loader's workers run ahead across
#                  epochs: Note [Running ahead]; the checkpoint holds the batches used)
#   png            --dump-batches FILE.png: a PNG picture of the first batch (rank 0 under mpirun)
#   bad_input      each bad mixing or dump flag: non-zero exit and a message naming it
set -uo pipefail
case_name=$1 app=$2 mpiexec=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
tiny_model 4 512 64
tiny+=(--eval-batches 1)

check_dump() { "$py" "$here/check_mix_dump.py" "$@" || fail "check_mix_dump.py $*"; }
need_h5py() {
  "$py" -c "import h5py, numpy" 2>/dev/null && return
  [[ ${CI:-} == true ]] && fail "$py cannot import h5py and numpy (apt-get install python3-h5py)"
  echo "h5py is not installed: skipped"
  exit 77
}

run() {  # run LOG_NAME ARGS...: one process
  local name=$1; shift
  "$app" "$@" > "$work/$name.out" 2>&1 || { cat "$work/$name.out"; fail "run $name failed"; }
}

case $case_name in
ranks_pairing)
  need_h5py
  mix=(--mixup 0.8 --cutmix 1.0 --label-smoothing 0.1 --augment --drop-path 0.1 --seed 5 --steps 3)
  for mode in batch pair elem; do
    run one "${tiny[@]}" "${mix[@]}" --mixup-mode $mode --micro-batch 4 --grad-accum 4 \
      --log "$work/one.jsonl" --dump-batches "$work/one.h5"
    for np in 2 4; do
      rm -f "$work"/ranks*.h5
      "${mpirun[@]}" -np $np "$app" "${tiny[@]}" "${mix[@]}" --mixup-mode $mode --micro-batch 4 \
        --grad-accum $((4 / np)) --log "$work/np$np.jsonl" --dump-batches "$work/ranks.h5" > "$work/np.out" 2>&1 ||
        { cat "$work/np.out"; fail "$np ranks ($mode) failed"; }
      echo "$mode: $np ranks x micro-batch 4 x accumulation $((4 / np)) against 1 rank x 4 x 4:"
      check_dump same "$work/one.h5" "$work"/ranks.rank*.h5
      compare "$work/one.jsonl" "$work/np$np.jsonl" 3 "$np ranks ($mode) against 1 rank"
    done
    check_dump pairs "$work/one.h5" 4
  done
  # One rank with micro-batch 16 pairs image i with image 15-i: groups of 16, not of 4.
  run big "${tiny[@]}" "${mix[@]}" --micro-batch 16 --dump-batches "$work/big.h5"
  check_dump pairs "$work/big.h5" 16
  ! "$py" "$here/check_mix_dump.py" pairs "$work/big.h5" 4 > /dev/null || fail "micro-batch 16 paired in groups of 4"
  echo "ranks_pairing: OK"
  ;;
dump_stats)
  need_h5py
  common=("${tiny[@]}" --augment --label-smoothing 0.1 --seed 9 --micro-batch 16 --steps 32)
  for mode in batch elem; do
    run mixed "${common[@]}" --mixup 0.8 --cutmix 1.0 --mixup-mode $mode --dump-batches "$work/mixed.h5"
    run unmixed "${common[@]}" --dump-batches "$work/unmixed.h5"
    echo "$mode:"
    check_dump stats "$work/mixed.h5" "$work/unmixed.h5"
  done
  echo "dump_stats: OK"
  ;;
resume)
  need_h5py
  common=("${tiny[@]}" --mixup 0.8 --cutmix 1.0 --mixup-mode elem --augment --seed 4 --micro-batch 8 --steps 6)
  run straight "${common[@]}" --log "$work/a.jsonl" --dump-batches "$work/a.h5"
  run first "${common[@]}" --checkpoint-dir "$work/ck" --checkpoint-every 3 --checkpoint-sync
  run resumed "${common[@]}" --resume "$work/ck/step_3" --log "$work/b.jsonl" --dump-batches "$work/b.h5"
  check_dump from_step "$work/a.h5" "$work/b.h5" 4
  diff <(steps_of "$work/a.jsonl" | tail -n 3) <(steps_of "$work/b.jsonl") ||
    fail "the resumed steps' losses differ from the uninterrupted run's"
  # Epochs of 3 steps (24 images at 8, two loader threads: a window of 4 batches, the next epoch's): saved
  # at step 3 (the epoch's end) and 4 (one batch into the next).
  short=("${model[@]}" --data synthetic:n=24,eval_n=16,classes=4 --eval-batches 1 --mixup 0.8 --cutmix 1.0
         --mixup-mode elem --augment --seed 4 --micro-batch 8 --steps 7 --loader-threads 2)
  run straight_short "${short[@]}" --log "$work/c.jsonl" --dump-batches "$work/c.h5"
  run first_short "${short[@]}" --checkpoint-dir "$work/ck_short" --checkpoint-every 1 --checkpoint-sync \
    --keep-checkpoints 0
  for at in 3 4; do
    run "resumed_$at" "${short[@]}" --resume "$work/ck_short/step_$at" --log "$work/r$at.jsonl" \
      --dump-batches "$work/r$at.h5"
    check_dump from_step "$work/c.h5" "$work/r$at.h5" $((at + 1))
    diff <(steps_of "$work/c.jsonl" | tail -n $((7 - at))) <(steps_of "$work/r$at.jsonl") ||
      fail "resumed at step $at (epochs of 3 steps): the losses differ from the uninterrupted run's"
  done
  echo "resume: OK"
  ;;
png)
  run pic "${tiny[@]}" --mixup 0.8 --cutmix 1.0 --micro-batch 6 --steps 2 --dump-batches "$work/first.png"
  head -c 8 "$work/first.png" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || fail "not a PNG"
  # 6 images of 32 px in 3 x 2 cells of 34 x (32 + 2 x 6 + 4) pixels, 2 more of margin.
  size=$(od -An -tu1 -j16 -N8 "$work/first.png" | awk '{ print $3 * 256 + $4, $7 * 256 + $8 }')
  [[ $size == "104 98" ]] || fail "picture is $size pixels, expected 104 98"
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --micro-batch 2 --steps 1 --dump-batches "$work/np2.png" \
    > "$work/np2.out" 2>&1 || { cat "$work/np2.out"; fail "2 ranks failed"; }
  [[ -s $work/np2.png && $(ls "$work" | grep -c 'np2.*png') -eq 1 ]] || { ls "$work"; fail "expected one picture"; }
  echo "png: OK"
  ;;
bad_input)
  refused "--mixup must be a finite number >= 0" "${tiny[@]}" --steps 1 --mixup -1
  refused "--cutmix must be a finite number >= 0" "${tiny[@]}" --steps 1 --cutmix nan
  refused "--mixup-prob must be in [0, 1], got 2" "${tiny[@]}" --steps 1 --mixup 1 --mixup-prob 2
  refused "--mixup-switch-prob must be in [0, 1]" "${tiny[@]}" --steps 1 --mixup-switch-prob -0.5
  refused "--mixup-mode must be batch, pair or elem, got 'rows'" "${tiny[@]}" --steps 1 --mixup-mode rows
  refused "--cutmix-minmax must be LO,HI" "${tiny[@]}" --steps 1 --cutmix-minmax 0.8,0.2
  refused "--cutmix-minmax must be LO,HI" "${tiny[@]}" --steps 1 --cutmix-minmax 0.5
  refused "--cutmix-minmax 0.3,0.31 with --image-size 32" "${tiny[@]}" --steps 1 --cutmix-minmax 0.3,0.31
  refused "--micro-batch 7: Mixup/CutMix mixes image i with image n-1-i" "${tiny[@]}" --steps 1 --mixup 0.8 \
    --micro-batch 7
  refused "--dump-batches $work/x.txt: the file must end in .h5" "${tiny[@]}" --steps 1 --dump-batches "$work/x.txt"
  touch "$work/file"
  refused "--dump-batches $work/file/x.h5" "${tiny[@]}" --steps 1 --dump-batches "$work/file/x.h5"
  echo "bad_input: OK"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
