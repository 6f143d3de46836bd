#!/usr/bin/env python3
"""Writes a `folder:` data set (DIR/<class>/<image>) as tar shards in WebDataset's layout, for `--data wds:...`.

Each sample is two tar members, KEY.cls (the label as decimal text) then KEY.jpg (or .png: the image's bytes as
stored, or re-encoded with --reencode), in that order because webdataset's TarWriter writes a sample's fields
sorted by extension; members are regular files of mode 0444 owned by user and group "bigdata", as its writer
makes them. A new shard starts, as webdataset's ShardWriter starts one, when the current one holds
--samples-per-shard samples or --bytes-per-shard bytes of members' data (checked before each sample).
--shard-sizes N1,N2,... gives each shard's sample count instead (tests: shards of very different sizes).
classes.txt (one class name a line, label i on line i+1) is written beside the shards: the class folders
sorted by name, as `folder:` numbers them, so the same images give the same labels either way.

The samples are in the folder's order (classes by name, files by name) or, with --shuffle SEED (the default,
seed 0), in an order drawn from SEED, so that each shard holds every class (what readers that read a shard at
a time need; convnext_zero's wds: reader draws its own global order either way). KEY is the class folder and
the file's stem joined by "_", dots made "_" (webdataset splits KEY from the extension at the first dot).
The tars are written with Python's tarfile (no webdataset needed); the same folder and flags give the same
bytes (member times are fixed at --mtime).

Usage: python3 tools/make_shards.py FOLDER OUT_DIR [--prefix train] [--samples-per-shard 1000]
       [--bytes-per-shard 0] [--shard-sizes N1,N2,...] [--shuffle SEED | --no-shuffle]
       [--reencode QUALITY [--max-side S]] [--mtime T]
Writes OUT_DIR/PREFIX-000000.tar ... and OUT_DIR/classes.txt and prints the pattern for --data, e.g.
wds:OUT_DIR/train-{000000..000012}.tar. --reencode needs Pillow (python3-pil).
"""
import argparse
import io
import os
import random
import sys
import tarfile

IMAGE_EXTS = (".jpg", ".jpeg", ".png")


def scan(folder):
    """(class names, [(class index, path)]) of a folder: data set, both sorted by name as convnext_zero's."""
    classes = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        sys.exit(f"make_shards.py: {folder}: no class sub-folders (expected FOLDER/<class>/<image>.jpg)")
    samples = []
    for c, name in enumerate(classes):
        files = sorted(e.name for e in os.scandir(os.path.join(folder, name))
                       if e.is_file() and not e.name.startswith(".") and e.name.lower().endswith(IMAGE_EXTS))
        if not files:
            sys.exit(f"make_shards.py: {folder}/{name}: no .jpg, .jpeg or .png files")
        samples += [(c, os.path.join(folder, name, f)) for f in files]
    return classes, samples


def image_bytes(path, reencode, max_side):
    """(extension, bytes): the file as stored, or re-encoded as a JPEG of quality `reencode`."""
    with open(path, "rb") as f:
        data = f.read()
    if reencode is None:
        return ("png" if data[:8] == b"\x89PNG\r\n\x1a\n" else "jpg"), data
    from PIL import Image
    img = Image.open(io.BytesIO(data)).convert("RGB")
    if max_side and max(img.size) > max_side:
        scale = max_side / max(img.size)
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.BICUBIC)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=reencode)
    return "jpg", out.getvalue()


def add_member(tar, name, data, mtime):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = mtime
    info.mode = 0o444
    info.uname = info.gname = "bigdata"
    tar.addfile(info, io.BytesIO(data))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder")
    p.add_argument("out")
    p.add_argument("--prefix", default="train")
    p.add_argument("--samples-per-shard", type=int, default=1000)
    p.add_argument("--bytes-per-shard", type=float, default=0, help="0: no limit")
    p.add_argument("--shard-sizes", default="", help="N1,N2,...: each shard's sample count (their sum: all)")
    p.add_argument("--shuffle", type=int, default=0, metavar="SEED")
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--reencode", type=int, default=None, metavar="QUALITY")
    p.add_argument("--max-side", type=int, default=0)
    p.add_argument("--mtime", type=int, default=1700000000)
    a = p.parse_args()

    classes, samples = scan(a.folder)
    if not a.no_shuffle:
        random.Random(a.shuffle).shuffle(samples)
    sizes = [int(n) for n in a.shard_sizes.split(",") if n] if a.shard_sizes else None
    if sizes is not None and (sum(sizes) != len(samples) or min(sizes) < 1):
        sys.exit(f"make_shards.py: --shard-sizes {a.shard_sizes} adds up to {sum(sizes)}, "
                 f"but {a.folder} has {len(samples)} images (each size at least 1)")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "classes.txt"), "w") as f:
        f.write("".join(n + "\n" for n in classes))

    shards, tar, count, size = [], None, 0, 0
    total_bytes = 0

    def next_shard():
        nonlocal tar, count, size
        if tar is not None:
            tar.close()
        path = os.path.join(a.out, f"{a.prefix}-{len(shards):06d}.tar")
        shards.append(path)
        tar = tarfile.open(path, "w", format=tarfile.PAX_FORMAT)
        count, size = 0, 0

    for label, path in samples:
        full = (count >= sizes[len(shards) - 1] if sizes else
                count >= a.samples_per_shard or (a.bytes_per_shard > 0 and size >= a.bytes_per_shard))
        if tar is None or full:
            next_shard()
        stem = os.path.splitext(os.path.basename(path))[0]
        key = f"{classes[label]}_{stem}".replace(".", "_")
        ext, data = image_bytes(path, a.reencode, a.max_side)
        cls = str(label).encode("ascii")
        add_member(tar, f"{key}.cls", cls, a.mtime)  # sorted by extension, as webdataset's TarWriter
        add_member(tar, f"{key}.{ext}", data, a.mtime)
        count += 1
        size += len(cls) + len(data)
        total_bytes += len(cls) + len(data)
    tar.close()
    last = len(shards) - 1
    pattern = (f"{a.prefix}-{0:06d}.tar" if last == 0 else f"{a.prefix}-{{{0:06d}..{last:06d}}}.tar")
    print(f"make_shards.py: {len(samples)} samples, {len(classes)} classes, {len(shards)} shard(s), "
          f"{total_bytes / 1e6:.1f} MB of members: --data wds:{os.path.join(a.out, pattern)}")


if __name__ == "__main__":
    main()
