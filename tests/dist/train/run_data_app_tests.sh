#!/usr/bin/env bash
# convnext_zero on folder: data sets of real JPEG files (made by make_image_folder), from the outside.
# Usage: run_data_app_tests.sh CASE APP MPIEXEC MAKE_IMAGE_FOLDER CZ_WEIGHTS
#   eval_classes    issue 30's case: trained on cat, coffee, rocket, evaluated on a folder of cat and rocket (or
#                   rocket alone): scored against the training labels of those names; an eval class the
#                   training set lacks is an error naming it
#   class_names     the class names in checkpoints and weight files (--export-weights, cz_weights' exports): a
#                   resume whose class folder was renamed, and a fine-tune on other classes without --reset-head,
#                   are refused naming the difference
#   skipped_files   macOS `._x.jpg` files, .webp/.bmp files and a CMYK JPEG among the images: the run trains, and
#                   its start line says what it skipped; --num-classes above the folder's classes is a warning
#   eval_split      --eval-every without an eval set is an error naming --eval-data; --eval-split F holds out F
#                   of each class, the same on 1 and 2 ranks
#   num_classes     without --num-classes, the training data's classes (a folder's, synthetic's classes=,
#                   cifar10's 10, an h5 file's largest label + 1 or num_classes attribute), said in the start line
#                   and the log, kept by a resume, used by --plan, --print-param-groups, --loader-only with Mixup
#                   and --init-weights --reset-head; a given value still wins, with a warning when it differs
set -uo pipefail
case_name=$1 app=$2 mpiexec=$3 make_folder=$4 cz_weights=$5
root=$(cd "$(dirname "$0")/../../.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
# The issue's run, on a smaller model: 3 classes of 32 px images, 30 steps of 16. (Each flag once: a command
# line may not repeat one.)
base=(--depths 1,1,2,1 --dims 16,32,48,64 --image-size 32 --lr 3e-3 --loader-threads 1 --no-progress --seed 1)
run=("${base[@]}" --num-classes 3 --steps 30 --micro-batch 16)

# make DIR COUNT SEED CLASS=HUE...: COUNT 32-px JPEGs per class; a class looks the same in every folder.
make() { "$make_folder" "$1" 32 "$2" "$3" "${@:4}" || fail "make_image_folder $*"; }
# ok LOG ARGS...: a run that must succeed; its output in $work/out.
ok() {
  local log=$1; shift
  "$app" "$@" --log "$log" > "$work/out" 2>&1
  local rc=$?
  [[ $rc -eq 0 ]] || { cat "$work/out"; fail "'$*' exited with $rc"; }
}
# The final evaluation's top-1 (percent, integer) and example count of a JSON-lines log.
final_eval() {
  grep '"split":"eval"' "$1" | tail -1 | sed -E 's/.*"examples":([0-9]+).*"top1":([^,}]+).*/\2 \1/' |
    awk '{ printf "%d %d\n", $1 * 100 + 0.5, $2 }'
}

case $case_name in
eval_classes)
  make "$work/train" 24 1 cat=0 coffee=120 rocket=240
  make "$work/eval" 8 2 cat=0 coffee=120 rocket=240
  mkdir -p "$work/eval2" "$work/eval_rocket"
  cp -r "$work/eval/cat" "$work/eval/rocket" "$work/eval2/"
  cp -r "$work/eval/rocket" "$work/eval_rocket/"
  ok "$work/full.jsonl" "${run[@]}" --data "folder:$work/train" --eval-data "folder:$work/eval"
  read -r full n_full <<< "$(final_eval "$work/full.jsonl")"
  ok "$work/two.jsonl" "${run[@]}" --data "folder:$work/train" --eval-data "folder:$work/eval2"
  cp "$work/out" "$work/two.out"
  read -r two n_two <<< "$(final_eval "$work/two.jsonl")"
  ok "$work/one.jsonl" "${run[@]}" --data "folder:$work/train" --eval-data "folder:$work/eval_rocket"
  read -r one n_one <<< "$(final_eval "$work/one.jsonl")"
  echo "top1: full eval $full% of $n_full, cat+rocket $two% of $n_two, rocket $one% of $n_one"
  [[ $n_full -eq 24 && $n_two -eq 16 && $n_one -eq 8 ]] || fail "wrong eval sizes"
  # The model tells the three colours apart; by folder position rocket was scored as coffee (50% and 0%).
  ((full >= 90)) || fail "the model did not learn the classes ($full%): the test says nothing"
  ((two >= 90 && one >= 90)) || fail "eval folders with fewer classes scored against the wrong labels"
  grep -F "eval folder:$work/eval2 (16 images, 2 classes: cat, rocket); labelled by name as 2 of the 3 training classes" \
    "$work/two.out" || { cat "$work/two.out"; fail "the start line does not say how eval2's classes are labelled"; }
  mkdir -p "$work/eval_dog" && cp -r "$work/eval/cat" "$work/eval_dog/" && make "$work/eval_dog" 2 3 dog=60
  refused_exit 1 "--eval-data 'folder:$work/eval_dog': class 'dog' is not among the 3 classes of --data 'folder:$work/train' (cat, coffee, rocket)" \
    "${run[@]}" --data "folder:$work/train" --eval-data "folder:$work/eval_dog"
  echo "eval_classes: OK"
  ;;
class_names)
  make "$work/train" 8 1 cat=0 coffee=120 rocket=240
  short=("${base[@]}" --num-classes 3 --steps 4 --micro-batch 8 --data "folder:$work/train")
  ok "$work/a.jsonl" "${short[@]}" --checkpoint-dir "$work/ck" --checkpoint-every 2 --export-weights "$work/w.h5"
  # A resume where a class folder was renamed since (the same --data, the same class count, other labels for
  # rocket): refused, naming the difference; as it was, it resumes.
  mv "$work/train/coffee" "$work/train/tea"
  refused_exit 1 "--resume $work/ck/step_2 was trained on 3 classes (cat, coffee, rocket) but --data folder:$work/train has 3 (cat, rocket, tea): 'tea' is new, 'coffee' is missing" \
    "${short[@]}" --resume "$work/ck/step_2"
  mv "$work/train/tea" "$work/train/coffee"
  ok "$work/r.jsonl" "${short[@]}" --resume "$work/ck/step_2"
  # A fine-tune from the exported weights (and from cz_weights' export of the checkpoint) on other classes:
  # refused without --reset-head, which trains a new classifier.
  make "$work/pets" 8 4 cat=0 dog=60
  "$cz_weights" "$work/ck" "$work/from_ck.h5" > "$work/out" 2>&1 || { cat "$work/out"; fail "cz_weights export"; }
  "$cz_weights" "$work/w.h5" "$work/converted.h5" > "$work/out" 2>&1 || { cat "$work/out"; fail "cz_weights convert"; }
  if "$py" -c "import h5py" 2> /dev/null; then  # the attribute as h5py users read it
    "$py" - "$work"/{w,from_ck,converted}.h5 <<'PY' || fail "class_names attribute"
import json, sys, h5py
for path in sys.argv[1:]:
    names = json.loads(h5py.File(path, "r").attrs["class_names"])
    assert names == ["cat", "coffee", "rocket"], (path, names)
    print(f"{path}: class_names {names}")
PY
  fi
  pets=("${base[@]}" --steps 2 --micro-batch 8 --num-classes 3 --data "folder:$work/pets")
  for w in "$work/w.h5" "$work/from_ck.h5" "$work/converted.h5"; do
    refused_exit 1 "--init-weights $w was trained on 3 classes (cat, coffee, rocket) but --data folder:$work/pets has 2 (cat, dog): 'dog' is new, 'coffee', 'rocket' are missing; give --reset-head" \
      "${pets[@]}" --init-weights "$w"
  done
  ok "$work/p.jsonl" "${pets[@]}" --init-weights "$work/w.h5" --reset-head
  ok "$work/s.jsonl" "${base[@]}" --steps 2 --micro-batch 8 --num-classes 3 --data "folder:$work/train" \
    --init-weights "$work/w.h5"
  echo "class_names: OK"
  ;;
skipped_files)
  make "$work/mixed" 16 1 cat=0 coffee=120 rocket=240
  for f in "$work"/mixed/cat/img_00[0-3].jpg; do  # what a copy from a Mac leaves: AppleDouble, not JPEG
    head -c 4096 /dev/zero | tr '\0' '\7' > "$(dirname "$f")/._$(basename "$f")"
  done
  printf 'RIFF\0\0\0\0WEBPVP8 ' > "$work/mixed/coffee/photo.webp"
  printf 'BM' > "$work/mixed/rocket/scan.bmp"
  cp "$root/tests/data/cmyk_adobe.jpg" "$work/mixed/coffee/zz_cmyk.jpg"
  cp "$root/tests/data/ycck_adobe.jpg" "$work/mixed/rocket/zz_ycck.jpg"
  ok "$work/m.jsonl" "${base[@]}" --steps 6 --micro-batch 16 --num-classes 5 --data "folder:$work/mixed" \
    --eval-data "folder:$work/mixed"
  cat "$work/out"
  line=$(grep -F "convnext_zero: data folder:$work/mixed" "$work/out") || fail "no data line"
  for want in "50 images, 3 classes: cat, coffee, rocket" "skipped 6" \
              "4 hidden (cat/._img_000.jpg, cat/._img_001.jpg, cat/._img_002.jpg, ...)" \
              "1 .bmp, not JPEG or PNG (rocket/scan.bmp)" "1 .webp, not JPEG or PNG (coffee/photo.webp)"; do
    [[ $line == *"$want"* ]] || fail "the data line lacks '$want': $line"
  done
  grep -qF "warning: --num-classes 5 but --data folder:$work/mixed has 3 classes" "$work/out" ||
    fail "no warning about --num-classes"
  read -r top n <<< "$(final_eval "$work/m.jsonl")"
  [[ $n -eq 50 ]] || fail "evaluated $n images, expected 50 (the CMYK and YCCK files included)"
  refused_exit 1 "--num-classes 2 is smaller than the 3 classes of --data folder:$work/mixed" \
    "${base[@]}" --steps 6 --data "folder:$work/mixed" --num-classes 2
  echo "skipped_files: OK"
  ;;
eval_split)
  make "$work/train" 20 1 cat=0 coffee=120 rocket=240
  common=("${base[@]}" --num-classes 3 --data "folder:$work/train")
  refused_exit 1 "--eval-every 10 needs an eval set, and --data folder:$work/train has no eval split of its own: give --eval-data SPEC, or --eval-split F" \
    "${common[@]}" --steps 20 --micro-batch 16 --eval-every 10
  refused_exit 1 "--eval-split holds out part of --data as the eval set, so it does not go with --eval-data folder:$work/train" \
    "${common[@]}" --steps 20 --eval-split 0.2 --eval-data "folder:$work/train"
  refused_exit 1 "--eval-split must be in [0, 1), got 1" "${common[@]}" --steps 20 --eval-split 1
  refused_exit 1 "--eval-split 0.01: holds out no example" "${common[@]}" --steps 20 --eval-split 0.01
  # 4 of each class's 20 held out: 48 to train on, 12 to evaluate, at step 10 and at the end.
  ok "$work/one.jsonl" "${common[@]}" --steps 20 --micro-batch 16 --eval-split 0.2 --eval-every 10
  grep -F "held out by --eval-split 0.2" "$work/out" || { cat "$work/out"; fail "the start line does not say so"; }
  [[ $(grep -c '"split":"eval"' "$work/one.jsonl") -eq 2 ]] || fail "expected 2 eval records"
  read -r top n <<< "$(final_eval "$work/one.jsonl")"
  echo "1 rank: top1 $top% of $n held-out images"
  [[ $n -eq 12 ]] || fail "evaluated $n images, expected 12"
  # Every rank makes the same split: 2 ranks x 8 train on what 1 rank x 16 does (same losses) and are scored
  # on the same held-out images.
  "${mpirun[@]}" -np 2 "$app" "${common[@]}" --steps 20 --micro-batch 8 --eval-split 0.2 --eval-every 10 \
    --log "$work/two.jsonl" > "$work/out" 2>&1 || { cat "$work/out"; fail "2 ranks failed"; }
  paste -d' ' <(grep '"split":"train"' "$work/one.jsonl" | sed -E 's/.*"loss":([^,}]+).*/\1/') \
              <(grep '"split":"train"' "$work/two.jsonl" | sed -E 's/.*"loss":([^,}]+).*/\1/') > "$work/both"
  [[ $(wc -l < "$work/both") -eq 20 ]] || fail "expected 20 step records in each log"
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 2e-5 * ($1 < 0 ? -$1 : $1) + 1e-6) { print NR ": " $0; bad = 1 } }
       END { exit bad }' "$work/both" || fail "2 ranks trained on other examples than 1 rank"
  read -r top2 n2 <<< "$(final_eval "$work/two.jsonl")"
  [[ $n2 -eq 12 && $top2 -eq $top ]] || fail "2 ranks: top1 $top2% of $n2, 1 rank: $top% of $n"
  # The split is part of what a checkpoint trained on: a resume must hold out the same.
  ok "$work/c.jsonl" "${common[@]}" --steps 4 --micro-batch 16 --eval-split 0.2 --checkpoint-dir "$work/ck"
  refused_exit 1 "the checkpoint was saved with --eval-split 0.2 but this run has --eval-split 0.1" \
    "${common[@]}" --steps 8 --micro-batch 16 --eval-split 0.1 --resume "$work/ck"
  echo "eval_split: OK"
  ;;
num_classes)
  start_line() { grep -E "^convnext_zero: custom \(" "$work/out" || { cat "$work/out"; fail "no start line"; }; }
  # expect_classes N FROM ARGS...: a run whose start line says N classes, FROM "data" (": the data's") or
  # "flag" (given), and whose log's start record has num-classes N.
  expect_classes() {
    local n=$1 from=$2; shift 2
    rm -f "$work/n.jsonl"
    ok "$work/n.jsonl" "${short[@]}" "$@"
    local line
    line=$(start_line)
    if [[ $from == data ]]; then
      [[ $line == *"params, $n classes: the data's) on "* ]] || fail "'$*': not '$n classes: the data's': $line"
    else
      [[ $line == *"params, $n classes) on "* ]] || fail "'$*': not '$n classes': $line"
    fi
    "$py" -c 'import json, sys; f = json.loads(open(sys.argv[1]).readline())["flags"]; sys.exit(int(f["num-classes"]) != int(sys.argv[2]))' \
      "$work/n.jsonl" "$n" || fail "'$*': the log's start record does not say num-classes $n"
    echo "ok: $line"
  }
  short=("${base[@]}" --steps 2 --micro-batch 8)
  make "$work/five" 8 1 a=0 b=70 c=140 d=210 e=280
  expect_classes 5 data --data "folder:$work/five" --checkpoint-dir "$work/ck"
  grep -q "warning: --num-classes" "$work/out" && { cat "$work/out"; fail "a warning without --num-classes"; }
  # The resume checks the class count the checkpoint was saved with: the data's again.
  expect_classes 5 data --data "folder:$work/five" --checkpoint-dir "$work/ck" --resume "$work/ck" --steps 3
  expect_classes 7 flag --data "folder:$work/five" --num-classes 7
  grep -qF "warning: --num-classes 7 but --data folder:$work/five has 5 classes" "$work/out" ||
    { cat "$work/out"; fail "no warning for --num-classes 7 on 5 classes"; }
  refused_exit 1 "--num-classes 3 is smaller than the 5 classes of --data folder:$work/five" \
    "${short[@]}" --data "folder:$work/five" --num-classes 3
  expect_classes 7 data --data synthetic:n=64,eval_n=16,classes=7
  # cifar10: always its 10 classes, whatever labels the files hold (here 0-2).
  mkdir "$work/cifar"
  "$py" - "$work/cifar" <<'PY' || fail "writing the cifar10 files"
import os, sys
for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        for r in range(8):
            f.write(bytes([r % 3]) + bytes((r * 37 + k) % 256 for k in range(3072)))
PY
  expect_classes 10 data --data "cifar10:$work/cifar"
  # h5: the largest label + 1 (labels 0-3: 4), or the file's num_classes attribute (6).
  if "$py" -c "import h5py, numpy" 2> /dev/null; then
    "$py" - "$work" <<'PY' || fail "writing the h5 files"
import sys, h5py, numpy as np
rng = np.random.default_rng(0)
for name, attr in (("plain.h5", None), ("attr.h5", 6)):
    with h5py.File(f"{sys.argv[1]}/{name}", "w") as f:
        f["images"] = rng.integers(0, 256, (32, 16, 16, 3), dtype=np.uint8)
        f["labels"] = np.arange(32, dtype=np.int64) % 4
        if attr is not None:
            f.attrs["num_classes"] = attr
PY
    expect_classes 4 data --data "h5:$work/plain.h5"
    expect_classes 6 data --data "h5:$work/attr.h5"
  else
    [[ ${CI:-} == true ]] && fail "$py cannot import h5py and numpy (apt-get install python3-h5py)"
    echo "note: $py has no h5py: the h5 sources are covered by test_io's H5Source tests only"
  fi
  # The paths that train nothing read the data's classes too: --plan (the head's size is in the plan) and
  # --print-param-groups give what --num-classes 5 gives, not what 10 gives; --loader-only mixes 5-wide targets.
  for what in "--plan --json" "--print-param-groups --json"; do
    # shellcheck disable=SC2086
    "$app" ${what} "${base[@]}" --data "folder:$work/five" > "$work/default.out" 2>&1 ||
      { cat "$work/default.out"; fail "$what without --num-classes"; }
    # shellcheck disable=SC2086
    "$app" ${what} "${base[@]}" --data "folder:$work/five" --num-classes 5 > "$work/five.out" 2>&1 ||
      fail "$what --num-classes 5"
    # shellcheck disable=SC2086
    "$app" ${what} "${base[@]}" --data "folder:$work/five" --num-classes 10 > "$work/ten.out" 2>&1 ||
      fail "$what --num-classes 10"
    cmp -s "$work/default.out" "$work/five.out" || { diff "$work/default.out" "$work/five.out"; fail "$what: not the data's 5 classes"; }
    cmp -s "$work/default.out" "$work/ten.out" && fail "$what: the class count does not show, so this check says nothing"
    echo "ok: $what without --num-classes is $what --num-classes 5"
  done
  "$app" --loader-only "${base[@]}" --data "folder:$work/five" --micro-batch 8 --steps 2 --mixup 0.8 \
    > "$work/out" 2>&1 || { cat "$work/out"; fail "--loader-only with --mixup and no --num-classes"; }
  # A fine-tune on other classes: the file's 5-way head does not fit the data's 3 classes unless --reset-head
  # makes a new one of the data's size.
  ok "$work/w.jsonl" "${short[@]}" --data synthetic:n=64,eval_n=16,classes=5 --export-weights "$work/w5.h5"
  "$app" "${short[@]}" --data synthetic:n=64,eval_n=16,classes=3 --init-weights "$work/w5.h5" > "$work/out" 2>&1 &&
    fail "a 5-class head was loaded for 3 classes"
  grep -q "head.fc.weight" "$work/out" || { cat "$work/out"; fail "the refusal does not name the head"; }
  expect_classes 3 data --data synthetic:n=64,eval_n=16,classes=3 --init-weights "$work/w5.h5" --reset-head
  grep -qF "(--reset-head): a new one for 3 classes" "$work/out" || { cat "$work/out"; fail "--reset-head's note"; }
  echo "num_classes: OK"
  ;;
*) fail "unknown case $case_name" ;;
esac
