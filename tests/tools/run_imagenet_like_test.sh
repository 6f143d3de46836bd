#!/usr/bin/env bash
# tools/make_imagenet_like.py as a user runs it: a folder of real-photograph JPEGs with ImageNet's spread of
# sizes and qualities, the same files for the same seed, other files for another; then the app reads it
# (--loader-only with the recipe's augmentations). Skipped (77) where no Python has NumPy, Pillow and a
# package that ships photographs.
# Usage: run_imagenet_like_test.sh PYTHON TOOL APP
set -uo pipefail
python=$1 tool=$2 app=$3
source "$(dirname "${BASH_SOURCE[0]}")/../lib/preamble.sh"
"$python" "$tool" "$work/a" --classes 3 --per-class 40 --seed 4 > "$work/out" 2>&1
rc=$?
if [[ $rc -ne 0 ]]; then
  cat "$work/out"
  grep -q "needs" "$work/out" && { echo "SKIP: no Python with the tool's packages"; exit 77; }
  fail "the tool exited with $rc"
fi
cat "$work/out"
"$python" "$tool" "$work/b" --classes 3 --per-class 40 --seed 4 > /dev/null 2>&1 || fail "second run"
"$python" "$tool" "$work/c" --classes 3 --per-class 40 --seed 5 > /dev/null 2>&1 || fail "third run"
diff -r "$work/a" "$work/b" > /dev/null || fail "the same seed wrote other files"
diff -r "$work/a" "$work/c" > /dev/null && fail "another seed wrote the same files"
[[ $(find "$work/a" -name '*.JPEG' | wc -l) -eq 120 ]] || fail "not 120 files"
# Sizes and qualities from the files themselves (JPEG SOF and quantisation tables through Pillow where the
# tool's Python has it; the tool just ran, so it has).
"$python" - "$work/a" <<'PY' || fail "the files' spread"
import glob, statistics, sys
from PIL import Image
sizes, quality = [], []
for p in glob.glob(sys.argv[1] + "/*/*.JPEG"):
    with Image.open(p) as im:
        assert im.format == "JPEG", p
        sizes.append(im.size)
        q = im.quantization[0][0]  # luminance DC step: 75 -> 8, 95 -> 2 with libjpeg's tables
        quality.append(q)
w = statistics.median(s[0] for s in sizes); h = statistics.median(s[1] for s in sizes)
print(f"median {w}x{h}, largest side {max(max(s) for s in sizes)}, DC steps {min(quality)}-{max(quality)}")
assert 400 <= w <= 520 and 300 <= h <= 420, (w, h)
assert min(quality) >= 2 and max(quality) <= 8 and len(set(quality)) > 2, quality
PY
"$app" --loader-only --data "folder:$work/a" --augment --aa rand-m9-mstd0.5-inc1 --reprob 0.25 --image-size 64 \
  --micro-batch 8 --steps 5 --loader-threads 2 > "$work/app" 2>&1 || { cat "$work/app"; fail "--loader-only"; }
grep -E "^loader only: 5 batches of 8 x 1 rank\(s\), 40 images" "$work/app" || { cat "$work/app"; fail "report"; }
echo "make_imagenet_like: OK"
