#!/usr/bin/env python3
"""Does training learn as well with --precision bf16 on the CPU (issue 43, item 3)? ConvNeXt-atto on the
embedded synthetic task (10 classes) and its harder form (100 classes: neighbouring hues, so the hidden texture
is needed, docs/data.md), fp32 against bf16 GEMMs (Note [bf16 on the CPU]), one process, several seeds.

Prints a table of final eval top-1 (mean, std, min-max over seeds), eval loss, the mean training loss of the
last 20 steps and the largest per-step training-loss gap to the same seed's fp32 run, with a two-sided exact
permutation test of bf16's mean top-1 against fp32's; writes bench/results/bf16-learning-<date>/<tag>.csv (one row per run);
--from-csv prints the table of earlier runs' CSVs (several: their rows together). With
--time it also times one training step (bench_train_step: atto 64 px batch 32, and ConvNeXt-T 224 px batch 16
with --time-tiny), fp32 and bf16 interleaved, the median of --time-repeats runs each. Not part of the test
suite (minutes).

  python3 bench/bf16_learning.py [--build build] [--steps 300] [--seeds 4] [--first-seed 0] [--tasks ...]
                                 [--time] [--quick] [--from-csv A.csv,B.csv]
"""
import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile

from runs import dated_results, learning_outcome, permutation_p, run_or_exit

TASKS = {
    "synthetic 10 classes": "synthetic:n=4096,eval_n=512,classes=10",
    "synthetic 100 classes": "synthetic:n=8192,eval_n=1000,classes=100",
}
PRECISIONS = ["fp32", "bf16"]


def run(args, task, precision, seed, log):
    cmd = [os.path.join(args.build, "apps", "convnext_zero"), "--model", "atto", "--image-size", str(args.image),
           "--num-classes", TASKS[task].split("classes=")[1], "--data", TASKS[task], "--micro-batch",
           str(args.batch), "--steps", str(args.steps), "--warmup-steps", "20", "--lr", "3e-3", "--seed",
           str(seed), "--precision", precision, "--eval-every", "0", "--loader-threads", "1", "--no-progress",
           "--log", log]
    if os.path.exists(log):
        os.remove(log)
    out = run_or_exit(cmd)
    header = [l for l in out.stdout.splitlines() if "bf16 on the CPU" in l]
    losses, top1, eval_loss = learning_outcome(log)
    return losses, top1, eval_loss, header


def time_steps(args, model, image, batch):
    """Median ms/step of bench_train_step, fp32 and bf16 interleaved."""
    times = {p: [] for p in PRECISIONS}
    for _ in range(args.time_repeats):
        for p in PRECISIONS:
            cmd = [os.path.join(args.build, "bench", "bench_train_step"), "--model", model, "--image", str(image),
                   "--batch", str(batch), "--dtype", "f32" if p == "fp32" else "bf16", "--warmup", "3",
                   "--steps", str(args.time_steps)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
            times[p].append(float(re.search(r"([0-9.]+) ms/step", out.stdout).group(1)))
    return {p: statistics.median(v) for p, v in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--from-csv", help="comma-separated CSVs of earlier runs: print their table only")
    ap.add_argument("--gap-steps", type=int, default=50,
                    help="the gap to fp32 is taken over the first N steps (later, runs part ways)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image", type=int, default=32)
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated task names")
    ap.add_argument("--time", action="store_true", help="also time one step, fp32 and bf16 (bench_train_step)")
    ap.add_argument("--time-tiny", action="store_true", help="with --time: ConvNeXt-T 224 px batch 16 too")
    ap.add_argument("--time-repeats", type=int, default=3)
    ap.add_argument("--time-steps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="60 steps, 2 seeds, the 10-class task")
    ap.add_argument("--out", default=dated_results("bf16-learning"))
    ap.add_argument("--tag", default="bf16_learning", help="the CSV's file name")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.seeds, args.tasks = 60, 2, "synthetic 10 classes"
    cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if l.startswith("Model name")), "unknown CPU")
    isa = "AMX-BF16 or AVX512_BF16"
    if args.from_csv:
        rows = []
        for path in args.from_csv.split(","):
            for r in csv.DictReader(open(path)):
                r.update(seed=int(r["seed"]), top1=float(r["top1"]), eval_loss=float(r["eval_loss"]),
                         train_loss_last20=float(r["train_loss_last20"]))
                rows.append(r)
        args.tasks = ",".join(dict.fromkeys(r["task"] for r in rows))
        args.seeds = len({r["seed"] for r in rows})
        args.steps = len(rows[0]["losses"].split())
    else:
        os.makedirs(args.out, exist_ok=True)
        rows, work, isa = [], tempfile.mkdtemp(), ""
        for task in args.tasks.split(","):
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                for p in PRECISIONS:
                    log = os.path.join(work, "run.jsonl")
                    losses, top1, eval_loss, header = run(args, task, p, seed, log)
                    isa = isa or (header[0].split("operands on ")[1].split(" with")[0] if header else "")
                    rows.append({"task": task, "precision": p, "seed": seed, "top1": top1,
                                 "eval_loss": eval_loss, "train_loss_last20": statistics.mean(losses[-20:]),
                                 "losses": " ".join(f"{x:.5f}" for x in losses)})
                    print(f"{task}, {p}, seed {seed}: top-1 {top1:.4f}, eval loss {eval_loss:.4f}", flush=True)
        with open(os.path.join(args.out, args.tag + ".csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print(f"\nConvNeXt-atto, {args.image} px, batch {args.batch}, {args.steps} steps, {args.seeds} seeds, one "
          f"process; CPU: {cpu}; bf16 GEMMs on {isa}. p: two-sided exact permutation test of the mean top-1 "
          "against fp32's; gap: the largest |loss_bf16 - loss_fp32| / loss_fp32 over the first "
          f"{args.gap_steps} steps of a seed (later, the runs part ways as any two runs do), the mean over seeds")
    print("| task | precision | top-1 mean ± std | min-max | eval loss | train loss (last 20) | gap to fp32 "
          f"(first {args.gap_steps} steps) | p |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for task in args.tasks.split(","):
        ref = {r["seed"]: r for r in rows if r["task"] == task and r["precision"] == "fp32"}
        for p in PRECISIONS:
            sel = [r for r in rows if r["task"] == task and r["precision"] == p]
            t = [r["top1"] for r in sel]
            sd = statistics.stdev(t) if len(t) > 1 else 0.0
            gaps = []
            for r in sel:
                a = [float(x) for x in ref[r["seed"]]["losses"].split()]
                b = [float(x) for x in r["losses"].split()]
                gaps.append(max(abs(x - y) / x for x, y in list(zip(a, b))[:args.gap_steps]))
            gap = "-" if p == "fp32" else f"{100 * statistics.mean(gaps):.2f}%"
            pv = "-" if p == "fp32" else f"{permutation_p(t, [r['top1'] for r in ref.values()]):.2f}"
            print(f"| {task} | {p} | {100 * statistics.mean(t):.2f} ± {100 * sd:.2f}% | "
                  f"{100 * min(t):.2f}-{100 * max(t):.2f}% | {statistics.mean(r['eval_loss'] for r in sel):.4f} | "
                  f"{statistics.mean(r['train_loss_last20'] for r in sel):.4f} | {gap} | {pv} |")
    if args.time:
        shapes = [("atto", 64, 32)] + ([("tiny", 224, 16)] if args.time_tiny else [])
        print(f"\nOne training step (bench_train_step, one process, median of {args.time_repeats} runs of "
              f"{args.time_steps} steps, fp32 and bf16 interleaved); CPU: {cpu}")
        print("| model | image | batch | fp32 ms/step | bf16 ms/step | fp32 / bf16 |")
        print("| --- | --- | --- | --- | --- | --- |")
        for model, image, batch in shapes:
            t = time_steps(args, model, image, batch)
            print(f"| {model} | {image} | {batch} | {t['fp32']:.1f} | {t['bf16']:.1f} | "
                  f"{t['fp32'] / t['bf16']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
