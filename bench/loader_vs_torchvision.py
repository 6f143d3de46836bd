#!/usr/bin/env python3
"""Our input pipeline side by side with torchvision's, in img/s per core (issue 32 item 5).

For 1 and 2 threads (--threads), three pipelines on the same folder of JPEGs, batch 64:
  (a) decode only: each file read and decoded whole to RGB
  (b) RandomResizedCrop 224 + horizontal flip (+ normalisation)
  (c) (b) + RandAugment rand-m9-mstd0.5-inc1 + random erasing 0.25 (mode pixel)
three ways:
  ours    (b), (c): `convnext_zero --loader-only --data folder:DIR --image-size 224 --micro-batch 64 --augment
          [--aa rand-m9-mstd0.5-inc1 --reprob 0.25] --loader-threads N --steps B` (its pipeline fill counts,
          as in a run); (a): `bench_decode_phases DIR --decode-only --threads N --images 64*B` (the loader has
          no decode-only mode; this is the same decode_image the loader's whole-image path calls)
  pil     torchvision.datasets.ImageFolder (PIL open + convert RGB) with timm's training transforms:
          (b) RandomResizedCrop(224, bilinear) + RandomHorizontalFlip + ToTensor + Normalize (torchvision v1,
          timm's recipe without colour jitter, which ours does not do); (c) timm.data.create_transform(224,
          is_training=True, auto_augment='rand-m9-mstd0.5-inc1', re_prob=0.25, re_mode='pixel',
          interpolation='bilinear'): timm's own RandAugment (on PIL images) and RandomErasing
  tvio    torchvision.io.read_file + decode_jpeg(mode RGB) to a uint8 tensor, then torchvision.transforms.v2 on
          tensors: (b) RandomResizedCrop(224, bilinear, antialias) + flip + ToDtype(float32, scale) + Normalize;
          (c) + v2.RandAugment(num_ops=2, magnitude=9) before the float conversion and
          v2.RandomErasing(0.25, value='random') after Normalize (torchvision's nearest to timm's; timm's ops
          take PIL images only)
The peers run in a torch.utils.data.DataLoader with num_workers=N (N worker processes; the main process only
collates), batch_size 64, shuffle on, pin_memory off; the first --warmup batches (worker start-up and fill)
are not timed, then --batches are. Ours is timed from its start (fill included), so the comparison is, if
anything, against ours. img/s per core = img/s / N. Each configuration runs --repeats times, the runs of
all configurations interleaved (round robin) so a neighbour's load spreads over all of them; the table gives
the median and the min-max spread, and ours/peer ratios of the medians.

Usage: bench/loader_vs_torchvision.py --build build --data /tmp/inl [--torch-python /root/torchenv/bin/python3]
       [--threads 1 2] [--batches 20] [--warmup 3] [--repeats 3] [--json OUT]
--data: a folder data set (class folders of JPEGs); tools/make_imagenet_like.py OUT writes one. This script
runs the peers in --torch-python (which needs torch, torchvision and timm) by re-invoking itself with --peer.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

AUGS = ("a", "b", "c")
AUG_NAMES = {"a": "decode only", "b": "RRC 224 + flip",
             "c": "RRC 224 + flip + rand-m9-mstd0.5-inc1 + reprob 0.25"}
IMPLS = ("ours", "pil", "tvio")
IMPL_NAMES = {"ours": "ours", "pil": "torchvision ImageFolder + PIL (timm transforms)",
              "tvio": "torchvision.io.decode_jpeg + v2 transforms"}
BATCH = 64
SIZE = 224


# ---------------------------------------------------------------- peers (run under --torch-python)

class Shape:
    """Decode-only: the decoded image's size, so the DataLoader collates ints, not images of many sizes."""

    def __call__(self, img):
        return tuple(img.size) if hasattr(img, "size") and not hasattr(img, "shape") else tuple(img.shape)


class TvioFolder:
    """ImageFolder's files, read with torchvision.io.read_file and decoded with decode_jpeg to RGB uint8."""

    def __init__(self, root, transform):
        import torchvision
        self.samples = torchvision.datasets.ImageFolder(root).samples
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        from torchvision.io import ImageReadMode, decode_jpeg, read_file
        path, label = self.samples[i]
        img = decode_jpeg(read_file(path), mode=ImageReadMode.RGB)
        return self.transform(img), label


def posterize_zero_bits(img, bits_to_keep, **kw):
    """timm's posterize, keeping Pillow <= 12's answer for 0 bits (a black image): timm's PosterizeIncreasing
    reaches 0 bits at magnitude 10 (m9 + mstd0.5 noise gets there), which Pillow 13 rejects with ValueError."""
    from PIL import Image
    from timm.data import auto_augment
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size, 0)
    return auto_augment.posterize(img, bits_to_keep, **kw)


def patch_timm_posterize():
    from timm.data import auto_augment
    for name, op in list(auto_augment.NAME_TO_OP.items()):
        if op is auto_augment.posterize:
            auto_augment.NAME_TO_OP[name] = posterize_zero_bits


def peer_dataset(impl, aug, root):
    import torch
    import torchvision
    from torchvision import transforms as T
    from torchvision.transforms import v2
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    if impl == "pil":
        if aug == "a":
            tf = Shape()
        elif aug == "b":
            tf = T.Compose([T.RandomResizedCrop(SIZE, interpolation=T.InterpolationMode.BILINEAR),
                            T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)])
        else:
            from timm.data import create_transform
            patch_timm_posterize()
            tf = create_transform(SIZE, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25,
                                  re_mode="pixel", re_count=1, interpolation="bilinear")
        return torchvision.datasets.ImageFolder(root, transform=tf)
    if aug == "a":
        tf = Shape()
    else:
        ops = [v2.RandomResizedCrop(SIZE, interpolation=v2.InterpolationMode.BILINEAR, antialias=True),
               v2.RandomHorizontalFlip()]
        if aug == "c":
            ops.append(v2.RandAugment(num_ops=2, magnitude=9))
        ops += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]
        if aug == "c":
            ops.append(v2.RandomErasing(p=0.25, value="random"))
        tf = v2.Compose(ops)
    return TvioFolder(root, tf)


def run_peer(impl, aug, root, threads, batches, warmup):
    import torch
    torch.set_num_threads(1)  # each worker one core, as ours
    ds = peer_dataset(impl, aug, root)
    dl = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=threads,
                                     pin_memory=False, drop_last=True, persistent_workers=False)
    need = warmup + batches
    if need * BATCH > len(ds):
        sys.exit(f"loader_vs_torchvision.py: {root} holds {len(ds)} images, fewer than the "
                 f"(--warmup + --batches) x {BATCH} = {need * BATCH} one pass needs")
    return timed_batches(dl, warmup, batches) * BATCH


def timed_batches(dl, warmup, batches):
    """Batches per second of DataLoader `dl` over `batches` batches after `warmup` untimed ones."""
    it = iter(dl)
    for _ in range(warmup):
        next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    s = time.perf_counter() - t0
    del it
    return batches / s


# ---------------------------------------------------------------- ours

def run_ours(build, aug, root, threads, batches, classes):
    if aug == "a":
        exe = os.path.join(build, "bench", "bench_decode_phases")
        cmd = [exe, root, "--decode-only", "--threads", str(threads), "--images", str(batches * BATCH)]
    else:
        exe = os.path.join(build, "apps", "convnext_zero")
        cmd = [exe, "--loader-only", "--data", f"folder:{root}", "--num-classes", str(classes), "--image-size",
               str(SIZE), "--micro-batch", str(BATCH), "--augment", "--loader-threads", str(threads),
               "--steps", str(batches)]
        if aug == "c":
            cmd += ["--aa", "rand-m9-mstd0.5-inc1", "--reprob", "0.25", "--remode", "pixel"]
    if not os.access(exe, os.X_OK):
        sys.exit(f"loader_vs_torchvision.py: {exe}: not built (cmake --build {build} --target "
                 f"{os.path.basename(exe)})")
    p = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"([0-9.]+) img/s,", p.stdout)
    if p.returncode != 0 or not m:
        sys.exit(f"loader_vs_torchvision.py: {' '.join(cmd)} failed (exit {p.returncode}):\n{p.stdout}{p.stderr}")
    return float(m.group(1)), " ".join(cmd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="CMake build folder holding apps/convnext_zero")
    ap.add_argument("--data", required=True, help="folder of class folders of JPEGs")
    ap.add_argument("--torch-python", default="/root/torchenv/bin/python3")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batches", type=int, default=20, help="timed batches of 64 per run")
    ap.add_argument("--warmup", type=int, default=3, help="peers' untimed first batches")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--augs", nargs="+", default=list(AUGS), choices=AUGS)
    ap.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    ap.add_argument("--json", help="write every run's figure and the table here")
    ap.add_argument("--peer", nargs=3, metavar=("IMPL", "AUG", "THREADS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not os.path.isdir(a.data):
        sys.exit(f"loader_vs_torchvision.py: --data {a.data}: not a directory")
    if a.peer:
        print(json.dumps({"img_s": run_peer(a.peer[0], a.peer[1], a.data, int(a.peer[2]), a.batches, a.warmup)}))
        return
    if any(t < 1 for t in a.threads):
        sys.exit("loader_vs_torchvision.py: --threads: each at least 1")
    classes = sum(os.path.isdir(os.path.join(a.data, d)) for d in os.listdir(a.data))
    runs = {}  # (impl, aug, threads) -> [img/s]
    commands = {}
    for rep in range(a.repeats):
        for t in a.threads:
            for aug in a.augs:
                for impl in a.impls:
                    if impl == "ours":
                        v, commands[("ours", aug)] = run_ours(a.build, aug, a.data, t, a.batches, classes)
                    else:
                        cmd = [a.torch_python, os.path.abspath(__file__), "--data", a.data, "--batches",
                               str(a.batches), "--warmup", str(a.warmup), "--peer", impl, aug, str(t)]
                        p = subprocess.run(cmd, capture_output=True, text=True)
                        if p.returncode != 0:
                            sys.exit(f"loader_vs_torchvision.py: peer {impl} ({a.torch_python}) failed "
                                     f"(exit {p.returncode}):\n{p.stderr[-3000:]}")
                        v = json.loads(p.stdout.strip().splitlines()[-1])["img_s"]
                    runs.setdefault((impl, aug, t), []).append(v)
                    print(f"  run {rep + 1}/{a.repeats}: {impl:4} ({aug}) {t} thread(s): {v:8.1f} img/s "
                          f"= {v / t:7.1f} per core", file=sys.stderr, flush=True)
    rows = []
    print(f"img/s per core, median [min-max] of {a.repeats} runs, {a.batches} batches of {BATCH}, {SIZE} px, "
          f"data {a.data}")
    head = "| aug | threads | " + " | ".join(IMPL_NAMES[i] for i in a.impls)
    ratios = [p for p in a.impls if p != "ours"] if "ours" in a.impls else []
    head += "".join(f" | ours / {p}" for p in ratios)
    print(head + " |\n|" + " --- |" * (2 + len(a.impls) + len(ratios)))
    for aug in a.augs:
        for t in a.threads:
            cells, med = [], {}
            for impl in a.impls:
                per_core = [v / t for v in runs[(impl, aug, t)]]
                med[impl] = statistics.median(per_core)
                cells.append(f"{med[impl]:.1f} [{min(per_core):.1f}-{max(per_core):.1f}]")
            rat = [med["ours"] / med[p] for p in ratios]
            print(f"| ({aug}) {AUG_NAMES[aug]} | {t} | " + " | ".join(cells)
                  + "".join(f" | {r:.2f}x" for r in rat) + " |")
            rows.append({"aug": aug, "threads": t,
                         "per_core_median": med,
                         "per_core_runs": {i: [v / t for v in runs[(i, aug, t)]] for i in a.impls},
                         "ratio_ours_over": dict(zip(ratios, rat))})
    for aug, goal in (("b", 2.5), ("c", 2.0)):
        for r in rows:
            if r["aug"] == aug and "pil" in r["ratio_ours_over"]:
                x = r["ratio_ours_over"]["pil"]
                print(f"goal ({aug}) >= {goal}x torchvision + PIL per core at {r['threads']} thread(s): "
                      f"{x:.2f}x {'met' if x >= goal else 'NOT met'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"data": a.data, "build": a.build, "batches": a.batches, "warmup": a.warmup,
                       "repeats": a.repeats, "batch": BATCH, "size": SIZE, "torch_python": a.torch_python,
                       "ours_commands": {aug: c for (_, aug), c in commands.items()},
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
