#!/usr/bin/env python3
"""Side-by-side: one ConvNeXt training step in convnext_zero and in PyTorch on this machine's CPU, in one run.

Our side runs the real app (`convnext_zero --steps N --log ...`) on the embedded synthetic data (data loading
runs ahead in loader threads, as in training); PyTorch's side is bench/train_step_torch.py (timm's model of the
same variant, channels_last, AdamW with timm's weight-decay rule) on the CPU in f32 (or, with --dtype bf16,
ours with --precision bf16 against PyTorch under CPU autocast bf16). Both use the same batch,
image size, classes, label smoothing and thread count, and report the mean step time over the steps after the
warm-up ones. Ratio = PyTorch time / our time: above 1 means convnext_zero is faster. Each side runs with the
OpenMP defaults a user gets unless --omp-wait-policy sets OMP_WAIT_POLICY for both.

  python3 bench/train_step_vs_torch.py                              # atto, 64 px, micro-batch 32
  python3 bench/train_step_vs_torch.py --model femto --steps 30 --app build/apps/convnext_zero
  python3 bench/train_step_vs_torch.py --before old/convnext_zero --rounds 3   # before, after and PyTorch in turns

Run it with a Python that has torch and timm (not part of the build).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine_info  # noqa: E402
from runs import add_torch_heap_flag  # noqa: E402


def time_ours(args, env, tmp, app=None, extra=()):
    # A fresh log per run: the app keeps (and says it kept) a log file it finds, so one name would make noise.
    fd, log = tempfile.mkstemp(suffix=".jsonl", dir=tmp)
    os.close(fd)
    os.unlink(log)
    cmd = [app or args.app, "--model", args.model, "--image-size", str(args.image_size), "--micro-batch",
           str(args.batch), "--steps", str(args.warmup + args.steps), "--num-classes", str(args.classes),
           "--label-smoothing", str(args.label_smoothing), "--data", f"synthetic:classes={args.classes}",
           "--schedule", "constant", "--eval-batches", "1", "--no-progress", "--log", log,
           "--precision", {"f32": "fp32", "bf16": "bf16"}[args.dtype]] + list(extra)
    print("running:", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    with open(log) as f:
        steps = [json.loads(line) for line in f if '"split":"train"' in line]
    return statistics.mean(s["step_time_s"] for s in steps[args.warmup:]), steps[-1]["peak_mem_bytes"]


def time_torch(args, env, tmp):
    out = os.path.join(tmp, "torch.json")
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_step_torch.py"),
           "--model", args.model, "--device", "cpu", "--dtype", args.dtype, "--batch", str(args.batch), "--image",
           str(args.image_size), "--classes", str(args.classes), "--label-smoothing", str(args.label_smoothing),
           "--threads", str(args.threads), "--warmup", str(args.warmup), "--steps", str(args.steps),
           "--json", out]
    print("running:", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    with open(out) as f:
        result = json.load(f)
    return result["ms_per_step"] / 1e3, result["torch"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", default="build/apps/convnext_zero")
    ap.add_argument("--before", metavar="APP",
                    help="also time this convnext_zero (an older build) in the same run: the step before and after")
    ap.add_argument("--model", default="atto")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                    help="bf16: ours with --precision bf16, PyTorch under CPU autocast bf16")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per side")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="time the sides in turns this many times and report each side's median")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--omp-wait-policy", choices=["active", "passive"],
                    help="OMP_WAIT_POLICY for both sides (default: the environment's, usually unset)")
    add_torch_heap_flag(ap)
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("extra", nargs="*", help="after --: more flags for our side (the after build only)")
    args = ap.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy
    runs = {"ours": [], "before": [], "torch": [], "torch_heap": []}
    heap_env = machine_info.heap_env_like_ours(env)
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            runs["ours"].append(time_ours(args, env, tmp, extra=args.extra))
            if args.before:
                runs["before"].append(time_ours(args, env, tmp, app=args.before))
            runs["torch"].append(time_torch(args, env, tmp))
            if args.torch_heap_like_ours:
                runs["torch_heap"].append(time_torch(args, heap_env, tmp))
    ours, ours_mem = sorted(runs["ours"])[len(runs["ours"]) // 2]
    theirs, torch_version = sorted(runs["torch"])[len(runs["torch"]) // 2]
    ratio = theirs / ours
    print(f"ConvNeXt-{args.model}, {args.image_size}x{args.image_size}, batch {args.batch}, {args.dtype}, "
          f"{args.threads} threads, mean of {args.steps} steps, median of {args.rounds} rounds, "
          f"OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY', 'unset')}")
    print(machine_info.describe())
    print(f"  convnext_zero   {ours * 1e3:8.1f} ms/step  {args.batch / ours:8.1f} img/s  "
          f"(peak {ours_mem / 2**20:.0f} MiB)  {' '.join(args.extra)}")
    result = {"model": args.model, "image_size": args.image_size, "batch": args.batch, "dtype": args.dtype,
              "threads": args.threads, "ours_s": ours, "torch_s": theirs, "ratio": ratio,
              "torch_version": torch_version, "omp_wait_policy": env.get("OMP_WAIT_POLICY"),
              "machine": machine_info.describe(), "extra": args.extra,
              "runs_s": {k: [r[0] for r in v] for k, v in runs.items()}}
    if args.before:
        before = sorted(runs["before"])[len(runs["before"]) // 2][0]
        result["before_s"] = before
        print(f"  before          {before * 1e3:8.1f} ms/step  {args.batch / before:8.1f} img/s  ({args.before}; "
              f"after / before speed {before / ours:.2f}x, PyTorch / before {theirs / before:.2f}x)")
    print(f"  PyTorch {torch_version:<8}{theirs * 1e3:8.1f} ms/step  {args.batch / theirs:8.1f} img/s")
    print(f"  speedup (PyTorch time / ours): {ratio:.2f}x")
    if args.torch_heap_like_ours:
        heap = sorted(runs["torch_heap"])[len(runs["torch_heap"]) // 2][0]
        result["torch_heap_s"] = heap
        result["ratio_torch_heap"] = heap / ours
        print(f"  PyTorch with our heap settings (MALLOC_MMAP_THRESHOLD_={heap_env['MALLOC_MMAP_THRESHOLD_']} "
              f"MALLOC_TRIM_THRESHOLD_={heap_env['MALLOC_TRIM_THRESHOLD_']}) {heap * 1e3:8.1f} ms/step: "
              f"{heap / ours:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
