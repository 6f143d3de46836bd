#!/usr/bin/env python3
"""Side-by-side: one ConvNeXt training step in convnext_zero and in PyTorch on this machine's CPU, in one run.

Our side runs the real app (`convnext_zero --steps N --log ...`) on the embedded synthetic data and takes the
median `step_time_s` of the logged steps after the warm-up ones (data loading runs ahead in loader threads, as in
training). PyTorch's side trains timm's model of the same variant (channels_last, AdamW, label-smoothed
cross-entropy; the same batch, image size and thread count) on random data and takes the median step time.
Ratio = PyTorch time / our time: above 1 means convnext_zero is faster.

  python3 bench/train_step_vs_torch.py                              # atto, 64 px, micro-batch 32
  python3 bench/train_step_vs_torch.py --model femto --steps 30 --app build/apps/convnext_zero

Needs torch and timm (not part of the build).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# Each side runs with its defaults, as a user gets them. --omp-wait-policy sets OMP_WAIT_POLICY for both; the
# OpenMP runtime reads it when it loads, so it is applied before torch is imported.
if "--omp-wait-policy" in sys.argv[:-1]:
    os.environ["OMP_WAIT_POLICY"] = sys.argv[sys.argv.index("--omp-wait-policy") + 1]

import timm  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def time_ours(args):
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log.jsonl")
        cmd = [args.app, "--model", args.model, "--image-size", str(args.image_size), "--micro-batch",
               str(args.batch), "--steps", str(args.warmup + args.steps), "--num-classes", str(args.classes),
               "--data", f"synthetic:classes={args.classes}", "--schedule", "constant", "--eval-batches", "1",
               "--no-progress", "--log", log]
        print("running:", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(log) as f:
            steps = [json.loads(line) for line in f if '"split"' not in line]
    times = [s["step_time_s"] for s in steps[args.warmup:]]
    return statistics.median(times), steps[args.warmup]["peak_mem_bytes"]


def time_torch(args):
    torch.manual_seed(0)
    model = timm.create_model(f"convnext_{args.model}", num_classes=args.classes)
    model = model.to(memory_format=torch.channels_last).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size).to(memory_format=torch.channels_last)
    y = torch.randint(0, args.classes, (args.batch,))
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", default="build/apps/convnext_zero")
    ap.add_argument("--model", default="atto")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per side")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--omp-wait-policy", choices=["active", "passive"],
                    help="OMP_WAIT_POLICY for both sides (default: the environment's, usually unset)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    ours, ours_mem = time_ours(args)
    theirs = time_torch(args)
    ratio = theirs / ours
    print(f"ConvNeXt-{args.model}, {args.image_size}x{args.image_size}, batch {args.batch}, "
          f"{args.threads} threads, median of {args.steps} steps, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    print(f"  convnext_zero   {ours * 1e3:8.1f} ms/step  {args.batch / ours:8.1f} img/s  "
          f"(peak {ours_mem / 2**20:.0f} MiB)")
    print(f"  PyTorch {torch.__version__:<8}{theirs * 1e3:8.1f} ms/step  {args.batch / theirs:8.1f} img/s")
    print(f"  speedup (PyTorch time / ours): {ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "image_size": args.image_size, "batch": args.batch,
                       "threads": args.threads, "ours_s": ours, "torch_s": theirs, "ratio": ratio,
                       "torch_version": torch.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
