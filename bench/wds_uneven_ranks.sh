#!/usr/bin/env bash
# wds: shards of very unequal sizes trained on 2 and 4 ranks (issue 52 item 5): every rank must finish the same
# number of steps and read the same number of images (Note [Sampling]: one global order cut into equal shares,
# whatever the shards), with no rank left waiting in a collective. Per world size: the steps each rank's
# --dump-batches holds, the images it read, the run's wall time and img/s, and whether it ended (timeout 600 s).
# Usage: bench/wds_uneven_ranks.sh BUILD_DIR WORK_DIR [EPOCHS=2] [RANKS="2 4"]
#   WORK_DIR/folder: tools/make_imagenet_like.py (10 classes x 50, median 500x375 JPEGs) unless there;
#   WORK_DIR/shards: tools/make_shards.py --shard-sizes 250,25,200,25 (10x apart). Writes WORK_DIR/uneven.csv.
set -euo pipefail
build=$1 work=$2 epochs=${3:-2} ranks=${4:-"2 4"}
root=$(cd "$(dirname "$0")/.." && pwd)
app=$build/apps/convnext_zero
[[ -d $work/folder ]] || python3 "$root/tools/make_imagenet_like.py" "$work/folder" --classes 10 --per-class 50 \
  > /dev/null
[[ -d $work/shards ]] || python3 "$root/tools/make_shards.py" "$work/folder" "$work/shards" \
  --shard-sizes 250,25,200,25 > /dev/null
shards="wds:$work/shards/train-{000000..000003}.tar"
args=(--depths 1,1,2,1 --dims 16,32,48,64 --image-size 64 --micro-batch 8 --epochs "$epochs" --augment
  --loader-threads 1 --no-progress --seed 1 --data "$shards")
column() { h5dump -d "$2" -y -w 0 -O "$1" | tr ',' '\n' | tr -d ' ' | grep -v '^$'; }

echo "ranks,rank,steps,images,exit,wall_s,img_per_s" > "$work/uneven.csv"
for np in $ranks; do
  rm -f "$work"/d.rank*.h5
  start=$(date +%s.%N)
  rc=0
  timeout 600 mpirun --allow-run-as-root --oversubscribe -np "$np" "$app" "${args[@]}" \
    --dump-batches "$work/d.h5" > "$work/out.$np" 2>&1 || rc=$?
  wall=$(echo "$(date +%s.%N) - $start" | bc)
  rate=$(grep '^done:' "$work/out.$np" | sed -E 's/.* s, ([0-9.]+) img\/s.*/\1/')
  for ((r = 0; r < np; ++r)); do
    images=$(column "$work/d.rank$r.h5" sources | wc -l)
    steps=$(column "$work/d.rank$r.h5" steps | sort -un | wc -l)
    printf '%s,%s,%s,%s,%s,%.1f,%s\n' "$np" "$r" "$steps" "$images" "$rc" "$wall" "${rate:-}" |
      tee -a "$work/uneven.csv"
  done
  grep '^done:' "$work/out.$np" | cut -c1-80
done
