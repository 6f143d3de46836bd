#!/usr/bin/env bash
# wds: shards against the same images as a folder (issue 52 item 5): the loader's img/s (convnext_zero
# --loader-only, steady state, one loader thread, 224 px, --augment), its CPU seconds, with the page cache warm
# and with the files' pages dropped (posix_fadvise DONTNEED on each file: no root needed, nothing else evicted),
# and the system calls and file opens per image (strace -c -f). The two take turns, REPS times each.
# Usage: bench/wds_vs_folder.sh BUILD_DIR WORK_DIR [REPS=3] [STEPS=94]
#   WORK_DIR/folder is made by tools/make_imagenet_like.py (10 classes x 100) and WORK_DIR/shards from it by
#   tools/make_shards.py (100 samples a shard) unless they are there. Prints a table; writes WORK_DIR/wds.csv.
set -euo pipefail
build=$1 work=$2 reps=${3:-3} steps=${4:-94}
root=$(cd "$(dirname "$0")/.." && pwd)
app=$build/apps/convnext_zero
[[ -d $work/folder ]] || python3 "$root/tools/make_imagenet_like.py" "$work/folder" --classes 10 --per-class 100
[[ -d $work/shards ]] || python3 "$root/tools/make_shards.py" "$work/folder" "$work/shards" --samples-per-shard 100
n_shards=$(ls "$work"/shards/*.tar | wc -l)
folder="folder:$work/folder"
shards="wds:$work/shards/train-{000000..$(printf '%06d' $((n_shards - 1)))}.tar"
args=(--loader-only --image-size 224 --micro-batch 32 --loader-threads 1 --augment --no-progress)

drop() {  # the files' pages out of the page cache
  python3 - "$work" << 'EOF'
import os, sys
for d, _, files in os.walk(sys.argv[1]):
    for f in files:
        fd = os.open(os.path.join(d, f), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
EOF
}
warm() { cat "$work"/shards/*.tar > /dev/null; find "$work/folder" -type f -exec cat {} + > /dev/null; }

echo "source,cache,rep,img_per_s,user_s,sys_s,wall_s" > "$work/wds.csv"
for cache in warm cold; do
  for ((r = 1; r <= reps; ++r)); do
    for spec in "$folder" "$shards"; do
      if [[ $cache == warm ]]; then warm; else drop; fi
      /usr/bin/time -f "%U,%S,%e" -o "$work/time" "$app" "${args[@]}" --steps "$steps" --data "$spec" > "$work/out" 2>&1
      rate=$(grep 'steady state' "$work/out" | sed -E 's/.*s: ([0-9.]+) img\/s.*/\1/')
      echo "${spec%%:*},$cache,$r,$rate,$(cat "$work/time")" | tee -a "$work/wds.csv"
    done
  done
done

# System calls: a run of STEPS batches less a run of one, per image of the difference.
echo "source,syscalls_per_image,opens_per_image,preads_per_image" > "$work/syscalls.csv"
warm
for spec in "$folder" "$shards"; do
  for s in 1 "$steps"; do
    strace -c -f -o "$work/strace.$s" "$app" "${args[@]}" --steps "$s" --data "$spec" \
      > /dev/null 2>&1 || true
  done
  python3 - "$work/strace.1" "$work/strace.$steps" "$((32 * (steps - 1)))" "${spec%%:*}" \
    >> "$work/syscalls.csv" << 'EOF'
import sys
def calls(path):
    out = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            out[f[-1]] = int(f[3])
    return out
a, b, n = calls(sys.argv[1]), calls(sys.argv[2]), int(sys.argv[3])
d = {k: b.get(k, 0) - a.get(k, 0) for k in b}
print(f"{sys.argv[4]},{sum(d.values()) / n:.2f},{(d.get('openat', 0) + d.get('open', 0)) / n:.3f},"
      f"{d.get('pread64', 0) / n:.2f}")
EOF
done
cat "$work/syscalls.csv"
