#!/usr/bin/env bash
# convnext_zero on wds: tar shards (issue 52) made by tools/make_shards.py from a folder of real JPEGs, from the
# outside.
# Usage: run_wds_app_tests.sh CASE APP MPIEXEC MAKE_IMAGE_FOLDER
#   same_as_folder  shards written in the folder's order train as the folder does: the same losses, bit for bit,
#                   with the whole recipe's augmentation
#   uneven_ranks    2 ranks on shards of 60 and 6 samples: every rank the same batches for two epochs, no hang
#   resume_world    a 2-rank run stopped mid-epoch and resumed on 1 rank: the epoch's positions each read once
#   resume_any_world_{wds,folder}
#                   2 ranks x 4 stopped 16 positions into the epoch, resumed on 3 ranks x 2 and on 1 rank x 5
#                   (global batches of 6 and 5, neither dividing 16): each position of the epoch read once; on
#                   wds: also resumed at the same world size, the losses bit for bit those of a run not stopped
#   bad_shards      under mpirun, each bad input (truncated, gzip, missing shard, no label, label out of range,
#                   corrupt image) is an exit 1 naming the shard and member, on every rank, no hang; with
#                   --skip-bad-samples the run trains and says what it left out
set -uo pipefail
case_name=$1 app=$2 mpiexec=$3 make_folder=$4
root=$(cd "$(dirname "$0")/../../.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
base=(--depths 1,1,2,1 --dims 16,32,48,64 --image-size 32 --lr 3e-3 --loader-threads 1 --no-progress --seed 1)

# 66 JPEGs of 32 px in 3 classes, as shards of 60 and 6 samples in the folder's order.
"$make_folder" "$work/folder" 32 22 1 cat=0 coffee=120 rocket=240 > /dev/null || fail "make_image_folder"
"$py" "$root/tools/make_shards.py" "$work/folder" "$work/shards" --no-shuffle --shard-sizes 60,6 ||
  fail "make_shards.py"
shards="wds:$work/shards/train-{000000..000001}.tar"

ok() {
  local log=$1; shift
  "$@" --log "$log" > "$work/out" 2>&1
  local rc=$?
  [[ $rc -eq 0 ]] || { cat "$work/out"; fail "'$*' exited with $rc"; }
}
# An integer dataset of a --dump-batches file, one value a line.
column() { h5dump -d "$2" -y -w 0 -O "$1" | tr ',' '\n' | tr -d ' ' | grep -v '^$'; }

case $case_name in
same_as_folder)
  recipe=(--augment --aa rand-m9-mstd0.5-inc1 --reprob 0.25 --mixup 0.8 --cutmix 1.0 --steps 8 --micro-batch 8)
  ok "$work/folder.jsonl" "$app" "${base[@]}" "${recipe[@]}" --data "folder:$work/folder"
  ok "$work/wds.jsonl" "$app" "${base[@]}" "${recipe[@]}" --data "$shards"
  grep -F "data wds:" "$work/out"
  compare "$work/folder.jsonl" "$work/wds.jsonl" 8 "folder vs wds" 0
  ;;
uneven_ranks)
  ok "$work/np2.jsonl" timeout 120 "${mpirun[@]}" -np 2 "$app" "${base[@]}" --epochs 2 --micro-batch 4 --data "$shards" \
    --dump-batches "$work/d.h5"
  steps=$(steps_of "$work/np2.jsonl" | wc -l)
  [[ $steps -eq 16 ]] || fail "expected 16 steps (2 epochs of floor(66 / 8)), got $steps"
  for r in 0 1; do
    n=$(column "$work/d.rank$r.h5" sources | wc -l)
    [[ $n -eq 64 ]] || fail "rank $r read $n images, expected 64 (16 batches of 4)"
  done
  echo "ok: 2 ranks on shards of 60 and 6 samples: 16 steps, 64 images each"
  ;;
resume_world)
  # 2 ranks x 4 (global 8) stop after 3 steps, 24 positions into the epoch; 1 rank x 4 continues to the
  # epoch's end (66 // 4 = 16 batches: 10 more).
  ok "$work/a.jsonl" timeout 120 "${mpirun[@]}" -np 2 "$app" "${base[@]}" --steps 3 --micro-batch 4 --data "$shards" \
    --checkpoint-dir "$work/ck" --dump-batches "$work/a.h5"
  ok "$work/b.jsonl" "$app" "${base[@]}" --steps 13 --micro-batch 4 --data "$shards" --checkpoint-dir "$work/ck" \
    --resume "$work/ck" --dump-batches "$work/b.h5"
  { column "$work/a.rank0.h5" positions; column "$work/a.rank1.h5" positions; column "$work/b.h5" positions; } |
    sort -n > "$work/positions"
  seq 0 63 > "$work/want"
  diff "$work/want" "$work/positions" > /dev/null || fail "positions of epoch 0 over the two runs: $(
    uniq -d "$work/positions" | head -3 | tr '\n' ' ') repeated, $(wc -l < "$work/positions") in all"
  { column "$work/a.rank0.h5" sources; column "$work/a.rank1.h5" sources; column "$work/b.h5" sources; } |
    sort -n | uniq -d | grep -q . && fail "a sample read twice in the epoch"
  echo "ok: 2 ranks to position 24, 1 rank from there: positions 0..63 of epoch 0 each once"
  ;;
resume_any_world_wds | resume_any_world_folder)
  # Note [Resuming at another global batch] (io/data/loader.h). 66 samples; 2 ranks x 4 stop after 2 steps.
  data=$shards
  [[ $case_name == *folder ]] && data="folder:$work/folder"
  ok "$work/a.jsonl" timeout 120 "${mpirun[@]}" -np 2 "$app" "${base[@]}" --steps 2 --micro-batch 4 --data "$data" \
    --checkpoint-dir "$work/ck" --dump-batches "$work/a.h5"
  # resumed NAME RANKS MICRO STEPS ARGS...: from a copy of the stopped run's checkpoint.
  resumed() {
    local name=$1 np=$2 micro=$3 steps=$4; shift 4
    cp -r "$work/ck" "$work/ck_$name"
    ok "$work/$name.jsonl" timeout 120 "${mpirun[@]}" -np "$np" "$app" "${base[@]}" --steps "$steps" \
      --micro-batch "$micro" --data "$data" --checkpoint-dir "$work/ck_$name" --resume "$work/ck_$name" "$@"
  }
  # positions NAME RANKS: every position of epoch 0 that run NAME's --dump-batches holds, one a line.
  positions() {
    if [[ $2 -eq 1 ]]; then column "$work/$1.h5" positions; return; fi
    for ((r = 0; r < $2; r++)); do column "$work/$1.rank$r.h5" positions; done
  }
  # 3 ranks x 2: positions 16..63 in 8 steps (66 - 16 = 50: 8 batches of 6, 2 dropped as the epoch's last).
  # 1 rank x 5: positions 16..65 in 10 steps. Both to the epoch's end and not beyond.
  for run in "b 3 2 10 63" "c 1 5 12 65"; do
    read -r name np micro steps last <<< "$run"
    resumed "$name" "$np" "$micro" "$steps" --dump-batches "$work/$name.h5"
    { positions a 2; positions "$name" "$np"; } | sort -n > "$work/positions"
    seq 0 "$last" > "$work/want"
    diff "$work/want" "$work/positions" > /dev/null || fail "$np rank(s) x $micro from position 16: positions $(
      uniq -d "$work/positions" | head -3 | tr '\n' ' ')repeated, $(wc -l < "$work/positions") in all, want 0..$last"
    echo "ok: 2 ranks x 4 to position 16, $np rank(s) x $micro from there: positions 0..$last of epoch 0 each once"
  done
  [[ $case_name == *folder ]] && exit 0
  # The same world size: bit for bit the run that was not stopped (its step-2 checkpoint, the same schedule).
  ok "$work/whole.jsonl" timeout 120 "${mpirun[@]}" -np 2 "$app" "${base[@]}" --steps 5 --micro-batch 4 --data "$data" \
    --checkpoint-dir "$work/ckw" --checkpoint-every 2
  ok "$work/d.jsonl" timeout 120 "${mpirun[@]}" -np 2 "$app" "${base[@]}" --steps 5 --micro-batch 4 --data "$data" \
    --checkpoint-dir "$work/ck_d" --resume "$work/ckw/step_2"
  diff <(steps_of "$work/whole.jsonl" | tail -n 3) <(steps_of "$work/d.jsonl") ||
    fail "2 ranks resumed at step 2 differ from the run not stopped"
  echo "ok: 2 ranks resumed at step 2: steps 3-5 bit for bit those of the run not stopped"
  ;;
bad_shards)
  # bad NAME PYTHON: a copy of the shards with the second shard rewritten by PYTHON (tarfile `t` open for
  # writing; `add(name, bytes)`); prints the spec.
  bad() {
    local dir="$work/bad_$1"
    mkdir -p "$dir"
    cp "$work/shards/train-000000.tar" "$work/shards/classes.txt" "$dir/"
    "$py" - "$dir/train-000001.tar" "$work/folder/cat/img_000.jpg" "$2" << 'EOF' || fail "writing $1"
import io, sys, tarfile
out, jpg, code = sys.argv[1], open(sys.argv[2], "rb").read(), sys.argv[3]
t = tarfile.open(out, "w")
def add(name, data):
    info = tarfile.TarInfo(name); info.size = len(data); t.addfile(info, io.BytesIO(data))
exec(code)
t.close()
EOF
    echo "wds:$dir/train-000001.tar,$dir/train-000000.tar"  # the bad one first: read in the first batch
  }
  run=("${mpirun[@]}" -np 2 "$app" "${base[@]}" --steps 9 --micro-batch 4 --no-shuffle)
  # app_refused EXPECTED ARGS...: 2 ranks end with a non-zero exit (not 124: a hang), the message named.
  app_refused() {
    local want=$1; shift
    timeout 120 "${run[@]}" "$@" > "$work/out" 2>&1
    local rc=$?
    [[ $rc -ne 0 && $rc -ne 124 ]] || { cat "$work/out"; fail "'$*': exit $rc (124: hung)"; }
    grep -qF -- "$want" "$work/out" || { cat "$work/out"; fail "'$*': message lacks '$want'"; }
    ! grep -qiE 'segmentation|core dumped|terminate called' "$work/out" || { cat "$work/out"; fail "crashed"; }
    echo "ok ($rc): $(grep -F -- "$want" "$work/out" | head -1)"
  }
  app_refused "train-000001.tar: member x.jpg: no label member" --data "$(bad nolabel 'add("x.jpg", jpg)')"
  app_refused "train-000001.tar: member x.cls: label 7 out of range [0, 3)" \
    --data "$(bad range 'add("x.cls", b"7"); add("x.jpg", jpg)')"
  spec=$(bad corrupt 'add("x.cls", b"1"); add("x.jpg", jpg[:len(jpg) // 2])')
  app_refused "train-000001.tar: member x.jpg: " --data "$spec"
  app_refused "train-000002.tar does not exist" --data "wds:$work/shards/train-{000000..000002}.tar"
  gzip -c "$work/shards/train-000001.tar" > "$work/g.tar"
  app_refused "g.tar: a gzip-compressed tar" --data "wds:$work/shards/train-000000.tar,$work/g.tar"
  head -c 5000 "$work/shards/train-000000.tar" > "$work/cut.tar"
  app_refused "cut.tar: truncated: the file ends inside the header at byte 4608, after member" \
    --data "wds:$work/cut.tar"
  # Within a budget: the corrupt image is replaced and said, the unlabelled sample left out and named.
  ok "$work/skip.jsonl" timeout 120 "${run[@]}" --data "$spec" --skip-bad-samples 1
  grep -F "skipped bad sample 1 of at most 1" "$work/out" || { cat "$work/out"; fail "no skip reported"; }
  # Counted in the log (a record of its own, every rank's count) and in the closing summary: rank 0 read it.
  grep -F '"split":"data"' "$work/skip.jsonl" | grep -F '"skipped_on_ranks":[1,0],"skipped_samples":1' ||
    fail "no skipped-samples record: $(grep -F '"split":"data"' "$work/skip.jsonl")"
  grep -F "1 bad sample(s) skipped (0 at open, 1 failed to decode: 1, 0 by rank)" "$work/out" ||
    { cat "$work/out"; fail "the summary does not count the skipped sample"; }
  ok "$work/skip2.jsonl" timeout 120 "${run[@]}" --data "$(bad nolabel 'add("x.jpg", jpg)')" --skip-bad-samples 1
  grep -F "skipped 1 bad sample(s): 1 no label member" "$work/out" || { cat "$work/out"; fail "no skip said"; }
  grep -F '"skipped_at_open":1,"skipped_on_ranks":[0,0],"skipped_samples":1' "$work/skip2.jsonl" ||
    fail "no skipped-samples record: $(grep -F '"split":"data"' "$work/skip2.jsonl")"
  grep -F "1 bad sample(s) skipped (1 at open, 0 failed to decode: 0, 0 by rank)" "$work/out" ||
    { cat "$work/out"; fail "the summary does not count the sample left out"; }
  ;;
*) fail "unknown case $case_name" ;;
esac
