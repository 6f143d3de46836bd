#!/usr/bin/env bash
# The closing summary's planned peak against the measured one, from the outside (issue 30, item 9): runs as
# users start them, with --checkpoint-dir alone (the only save after the last step) and on a folder: data set
# whose epoch is shorter than the loader's prefetch window, and on the same images as wds: shards, print the
# same figure twice and no reason for a difference. Usage: run_plan_summary_tests.sh APP
set -uo pipefail
app=$1
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"

summary() {  # summary NAME ARGS...: runs the app, checks "peak memory X per rank (planned X;" and no reason
  local name=$1; shift
  out=$("$app" --no-progress "$@" 2>&1) || fail "$name: exited $?: $out"
  line=$(grep "^done: " <<<"$out") || fail "$name: no summary: $out"
  [[ $line =~ peak\ memory\ ([0-9.]+\ MiB)\ per\ rank\ \(planned\ ([0-9.]+\ MiB)([^;]*)\; ]] ||
    fail "$name: no planned beside measured: $line"
  [[ ${BASH_REMATCH[1]} == "${BASH_REMATCH[2]}" && -z ${BASH_REMATCH[3]} ]] ||
    fail "$name: measured ${BASH_REMATCH[1]}, planned ${BASH_REMATCH[2]}${BASH_REMATCH[3]}"
  echo "ok: $name: measured ${BASH_REMATCH[1]}, planned ${BASH_REMATCH[2]}"
}

summary "--checkpoint-dir alone" --model atto --image-size 32 --micro-batch 4 --steps 3 --checkpoint-dir "$work/ck"
summary "--checkpoint-dir, --checkpoint-every 2 of 3 steps" --model atto --image-size 32 --micro-batch 4 --steps 3 \
  --checkpoint-dir "$work/ck2" --checkpoint-every 2

# A folder of 2 classes of 6 PNG files: 12 images, one micro-batch of 8 an epoch, so the loader's 2 threads
# have no batch to prefetch beyond it.
"$py" - "$work/folder" <<'PY' || fail "writing the folder"
import os, struct, sys, zlib
def png(path, w, h, seed):
    rows = b"".join(b"\0" + bytes((x * 7 + y * 3 + seed * 40 + c * 80) % 256 for x in range(w) for c in range(3))
                    for y in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
for c in ("cat", "rocket"):
    os.makedirs(os.path.join(sys.argv[1], c))
    for i in range(6):
        png(os.path.join(sys.argv[1], c, f"{i}.png"), 40, 36, i + (c == "cat") * 10)
PY
summary "folder data, one batch an epoch" --model atto --data "folder:$work/folder" --num-classes 2 --image-size 32 \
  --micro-batch 8 --steps 3
# The same images as wds: shards of 7 and 5 (issue 52): the index and the read buffers are host memory outside
# the training allocator (docs/planning.md), so the plan is the folder's.
"$py" "$(dirname "${BASH_SOURCE[0]}")/../../../tools/make_shards.py" "$work/folder" "$work/shards" --shard-sizes 7,5 \
  > /dev/null || fail "make_shards.py"
summary "wds: shards, one batch an epoch" --model atto --data "wds:$work/shards/train-{000000..000001}.tar" \
  --num-classes 2 --image-size 32 --micro-batch 8 --steps 3
echo PASS
