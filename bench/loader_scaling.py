#!/usr/bin/env python3
"""How the loader scales with threads: steady-state img/s at each thread count, per thread, and as a fraction
of linear (issue 40 item 4), with PyTorch's DataLoader + PIL + timm's transforms beside it (--torch).

Ours: `convnext_zero --loader-only --data folder:DIR --image-size 224 --micro-batch BATCH --loader-threads N
--steps B+1` and the recipe's flags; the figure is its "steady state" line (the batches after the first, whose
wait is the pipeline's fill, timed from that first batch on). Recipes (--recipe):
  crop  --augment: RandomResizedCrop 224 + flip
  full  crop + --aa rand-m9-mstd0.5-inc1 --reprob 0.25 --remode pixel --mixup 0.8 --cutmix 1.0 (the loader
        draws the mixing and makes the soft targets; the mixing itself is the step's, on the device)
Peer (--torch): torchvision.datasets.ImageFolder (PIL) with timm's training transforms as
bench/loader_vs_torchvision.py builds them (crop: its (b); full: its (c), timm's create_transform with the
same RandAugment and erasing), in a torch.utils.data.DataLoader with num_workers=N, batch BATCH, pin_memory
off, an endless sampler (no epoch's end in the timed span); its first max(3, N) batches (the workers' start
and first batches) are not timed, the next B are. Its Python is --torch-python (default: this one); when that
cannot import torch, torchvision, timm and PIL the torch columns are skipped with a line saying why.

Each thread count runs --repeats times, the thread counts (and ours and the peer) taking turns so a
neighbour's load spreads over all of them; the table gives medians. Fraction of linear: img/s per thread at N
over img/s per thread at 1 thread (or the fewest threads asked for).

Usage: python3 bench/loader_scaling.py --build BUILD_DIR --data DIR --threads 1,2,4,8,16 [--recipe crop|full]
       [--batch 128] [--batches 30] [--repeats 3] [--torch] [--torch-python PY] --out CSV
--data: class folders of JPEGs (tools/make_imagenet_like.py OUT writes one).
"""
import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = 224
RECIPES = {
    "crop": ["--augment"],
    "full": ["--augment", "--aa", "rand-m9-mstd0.5-inc1", "--reprob", "0.25", "--remode", "pixel", "--mixup",
             "0.8", "--cutmix", "1.0"],
}


def fail(msg):
    sys.exit(f"loader_scaling.py: {msg}")


# ---------------------------------------------------------------- the peer (run under --torch-python)

def run_peer(recipe, root, workers, batch, batches):
    import torch
    sys.path.insert(0, HERE)
    import loader_vs_torchvision as lvt  # its timm/torchvision transforms, as its (b) and (c)
    torch.set_num_threads(1)  # each worker one core, as ours
    ds = lvt.peer_dataset("pil", "b" if recipe == "crop" else "c", root)
    warmup = max(3, workers)
    sampler = torch.utils.data.RandomSampler(ds, num_samples=(warmup + batches) * batch)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers,
                                     pin_memory=False, drop_last=True)
    return lvt.timed_batches(dl, warmup, batches) * batch


def torch_missing(python):
    """None when `python` imports what the peer needs, else why not."""
    try:
        p = subprocess.run([python, "-c", "import torch, torchvision, timm, PIL"], capture_output=True, text=True)
    except OSError as e:
        return str(e)
    if p.returncode == 0:
        return None
    return (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]


# ---------------------------------------------------------------- ours

def run_ours(build, recipe, root, threads, batch, batches, classes):
    exe = os.path.join(build, "apps", "convnext_zero")
    if not os.access(exe, os.X_OK):
        fail(f"{exe}: not built (cmake --build {build} --target convnext_zero)")
    cmd = [exe, "--loader-only", "--data", f"folder:{root}", "--num-classes", str(classes), "--image-size",
           str(SIZE), "--micro-batch", str(batch), "--loader-threads", str(threads), "--steps", str(batches + 1)]
    cmd += RECIPES[recipe]
    p = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"^loader only, steady state: .* ([0-9.]+) img/s, [0-9.]+ img/s per thread", p.stdout, re.M)
    if p.returncode != 0 or not m:
        fail(f"{' '.join(cmd)} failed or printed no steady state (exit {p.returncode}):\n{p.stdout}{p.stderr}")
    return float(m.group(1)), cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="CMake build folder holding apps/convnext_zero")
    ap.add_argument("--data", required=True, help="folder of class folders of JPEGs")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts, e.g. 1,2,4,8,16")
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="crop")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--batches", type=int, default=30, help="timed batches per run (after the fill)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--torch", action="store_true", help="PyTorch DataLoader + PIL + timm's transforms beside")
    ap.add_argument("--torch-python", default=sys.executable)
    ap.add_argument("--out", required=True, help="CSV file for the table")
    ap.add_argument("--peer", nargs=2, metavar=("RECIPE", "WORKERS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not os.path.isdir(a.data):
        fail(f"--data {a.data}: not a directory")
    if a.batch < 2 or a.batch % 2 or a.batches < 1 or a.repeats < 1:
        fail(f"--batch must be even and >= 2, --batches and --repeats >= 1; got {a.batch}, {a.batches}, "
             f"{a.repeats}")
    try:
        threads = [int(t) for t in a.threads.split(",")]
    except ValueError:
        fail(f"--threads {a.threads}: not a comma-separated list of integers")
    if not threads or any(t < 1 for t in threads):
        fail(f"--threads {a.threads}: each at least 1")
    if a.peer:
        print(json.dumps({"img_s": run_peer(a.peer[0], a.data, int(a.peer[1]), a.batch, a.batches)}))
        return
    classes = sum(os.path.isdir(os.path.join(a.data, d)) for d in os.listdir(a.data))
    if classes < 1:
        fail(f"--data {a.data}: no class folders")
    torch_why = None
    if a.torch:
        torch_why = torch_missing(a.torch_python)
        if torch_why:
            print(f"torch columns skipped: {a.torch_python} cannot import torch, torchvision, timm and PIL "
                  f"({torch_why})", flush=True)
    with_torch = a.torch and not torch_why
    ours, peer, command = {}, {}, None
    for rep in range(a.repeats):
        for t in threads:
            v, command = run_ours(a.build, a.recipe, a.data, t, a.batch, a.batches, classes)
            ours.setdefault(t, []).append(v)
            line = f"  run {rep + 1}/{a.repeats}, {t} thread(s): ours {v:8.1f} img/s"
            if with_torch:
                cmd = [a.torch_python, os.path.abspath(__file__), "--build", a.build, "--data", a.data, "--out",
                       os.devnull, "--batch", str(a.batch), "--batches", str(a.batches), "--peer", a.recipe,
                       str(t)]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    fail(f"the torch peer ({a.torch_python}) failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
                pv = json.loads(p.stdout.strip().splitlines()[-1])["img_s"]
                peer.setdefault(t, []).append(pv)
                line += f", torch {pv:8.1f} img/s"
            print(line, file=sys.stderr, flush=True)

    base = 1 if 1 in threads else min(threads)

    def figures(runs, t):
        med = statistics.median(runs[t])
        return med, med / t, (med / t) / (statistics.median(runs[base]) / base)

    print(f"loader scaling, recipe {a.recipe}, batch {a.batch}, {SIZE} px, {a.batches} timed batches, median of "
          f"{a.repeats}; fraction of linear = img/s per thread / that at {base} thread(s); data {a.data}")
    shown = list(command)
    shown[shown.index("--loader-threads") + 1] = "N"
    print("ours: " + " ".join(shown))
    head = "| threads | ours img/s | ours per thread | ours of linear |"
    if with_torch:
        head += " torch img/s | torch per worker | torch of linear | ours / torch |"
    print(head)
    print("|" + " --- |" * head.count(" |"))
    rows = []
    for t in threads:
        o = figures(ours, t)
        row = {"threads": t, "ours_img_s": round(o[0], 1), "ours_per_thread": round(o[1], 1),
               "ours_of_linear": round(o[2], 3), "ours_runs": ";".join(f"{v:.1f}" for v in ours[t])}
        cells = f"| {t} | {o[0]:.1f} | {o[1]:.1f} | {o[2]:.2f} |"
        if with_torch:
            q = figures(peer, t)
            row.update({"torch_img_s": round(q[0], 1), "torch_per_worker": round(q[1], 1),
                        "torch_of_linear": round(q[2], 3), "torch_runs": ";".join(f"{v:.1f}" for v in peer[t]),
                        "ours_over_torch": round(o[0] / q[0], 3)})
            cells += f" {q[0]:.1f} | {q[1]:.1f} | {q[2]:.2f} | {o[0] / q[0]:.2f}x |"
        print(cells)
        rows.append(row)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print(f"written {a.out}")


if __name__ == "__main__":
    main()
