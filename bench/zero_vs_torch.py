#!/usr/bin/env python3
"""Multi-rank CPU training steps side by side, in one run: convnext_zero under mpirun at ZeRO stages 0-3
against PyTorch's DDP (the peer of stages 0-2: replicated optimizer state, gradients averaged) and FSDP2
(fully_shard per block: the peer of stage 3), same model, per-rank batch, image size, classes and threads per
rank (bench/train_step_dist_torch.py is PyTorch's side). Ratio = PyTorch time / ours: above 1 means
convnext_zero is faster. Every table names the CPU and OpenBLAS's kernels (bench/machine_info.py).

  python3 bench/zero_vs_torch.py --ranks 2 --stages 0,1,2,3 --torch-python /path/to/python-with-torch
  python3 bench/zero_vs_torch.py --rounds 3 --steps 40   # PyTorch and ours in turns, 3 times: the medians

Each round times PyTorch's peers, then our stages; with --rounds N every figure is the median of its N rounds
(on a shared machine a step's time moves by 5-20% from minute to minute: rounds in turns see the same drift).
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

HERE = os.path.dirname(os.path.abspath(__file__))


def time_ours(args, stage, env, tmp):
    # A fresh log per run (the app keeps, and says it kept, a log file it finds).
    fd, log = tempfile.mkstemp(prefix=f"ours_s{stage}_", suffix=".jsonl", dir=tmp)
    os.close(fd)
    os.unlink(log)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(args.ranks),
           "-x", "OMP_NUM_THREADS", args.app, "--model", args.model, "--image-size", str(args.image_size),
           "--micro-batch", str(args.batch), "--steps", str(args.warmup + args.steps), "--stage", str(stage),
           "--num-classes", str(args.classes), "--label-smoothing", str(args.label_smoothing), "--data",
           f"synthetic:classes={args.classes}", "--schedule", "constant", "--eval-batches", "1", "--no-progress",
           "--log", log] + args.extra
    print("running:", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    with open(log) as f:
        steps = [json.loads(line) for line in f if '"split":"train"' in line]
    return statistics.mean(s["step_time_s"] for s in steps[args.warmup:])


def time_torch(args, mode, env, tmp):
    out = os.path.join(tmp, f"torch_{mode}.json")
    cmd = [args.torch_python, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks),
           os.path.join(HERE, "train_step_dist_torch.py"), "--mode", mode, "--model", args.model, "--batch",
           str(args.batch), "--image", str(args.image_size), "--classes", str(args.classes), "--label-smoothing",
           str(args.label_smoothing), "--threads", str(args.threads), "--warmup", str(args.warmup), "--steps",
           str(args.steps), "--json", out]
    print("running:", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    with open(out) as f:
        r = json.loads(f.readline())
    return r["ms_per_step"] / 1e3, r["torch"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", default="build/apps/convnext_zero")
    ap.add_argument("--torch-python", default=sys.executable, help="a Python with torch and timm")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--stages", default="0,1,2,3")
    ap.add_argument("--model", default="atto")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1) // 2), help="per rank")
    ap.add_argument("--rounds", type=int, default=1, help="PyTorch and ours in turns this many times; medians")
    add_torch_heap_flag(ap)
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("extra", nargs="*", help="after --: more convnext_zero flags")
    args = ap.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    stages = [int(s) for s in args.stages.split(",")]
    if args.rounds < 1:
        sys.exit(f"zero_vs_torch.py: --rounds must be at least 1, got {args.rounds}")
    modes = sorted({"ddp" if s < 3 else "fsdp2" for s in stages})
    torch_runs = {m: [] for m in modes}
    heap_runs = {m: [] for m in modes}
    heap_env = machine_info.heap_env_like_ours(env)
    ours_runs = {s: [] for s in stages}
    version = None
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for mode in modes:
                t, version = time_torch(args, mode, env, tmp)
                torch_runs[mode].append(t)
                if args.torch_heap_like_ours:
                    heap_runs[mode].append(time_torch(args, mode, heap_env, tmp)[0])
            for s in stages:
                ours_runs[s].append(time_ours(args, s, env, tmp))
    rows = []
    for s in stages:
        mode = "ddp" if s < 3 else "fsdp2"
        ours, theirs = statistics.median(ours_runs[s]), statistics.median(torch_runs[mode])
        rows.append({"stage": s, "peer": mode, "ours_s": ours, "torch_s": theirs, "ratio": theirs / ours,
                     "torch_version": version, "runs_s": {"ours": ours_runs[s], "torch": torch_runs[mode]}})
        if args.torch_heap_like_ours:
            heap = statistics.median(heap_runs[mode])
            rows[-1].update(torch_heap_s=heap, ratio_torch_heap=heap / ours)
            rows[-1]["runs_s"]["torch_heap"] = heap_runs[mode]
    print(f"ConvNeXt-{args.model}, {args.image_size}x{args.image_size}, {args.ranks} ranks x batch {args.batch}, "
          f"{args.threads} threads per rank, mean of {args.steps} steps"
          + (f", median of {args.rounds} rounds" if args.rounds > 1 else ""))
    print(machine_info.describe())
    heap = args.torch_heap_like_ours
    print("| stage | peer | convnext_zero ms/step | PyTorch ms/step | PyTorch / ours |"
          + (" PyTorch, our heap settings | its / ours |" if heap else ""))
    print("| --- | --- | --- | --- | --- |" + (" --- | --- |" if heap else ""))
    for r in rows:
        peer = "DDP" if r["peer"] == "ddp" else "FSDP2"
        print(f"| {r['stage']} | {peer} {r['torch_version']} | {r['ours_s'] * 1e3:.1f} | {r['torch_s'] * 1e3:.1f} | "
              f"{r['ratio']:.2f}x |"
              + (f" {r['torch_heap_s'] * 1e3:.1f} | {r['ratio_torch_heap']:.2f}x |" if heap else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "image_size": args.image_size, "ranks": args.ranks, "batch": args.batch,
                       "threads_per_rank": args.threads, "rounds": args.rounds, "machine": machine_info.describe(),
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
