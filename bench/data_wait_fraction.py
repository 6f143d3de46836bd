#!/usr/bin/env python3
"""The fraction of a CPU training step spent waiting for data, with 1 and 2 loader threads (issue 32).

Runs `convnext_zero --model atto --data folder:DIR --image-size S --micro-batch B --augment --steps N
--loader-threads T --log LOG` (one rank, CPU) --repeats times per T, the runs of each T taking turns, and
reads each run's JSON-lines log: over the steps after the first (whose wait is the pipeline's fill, Note
[Data wait] in src/io/log/train_log.h), sum(data_wait_s) / sum(step_time_s). Prints each run's fraction and
median step time and, per T, the median and min-max of the fractions; --json OUT writes them.

Usage: bench/data_wait_fraction.py --build build --data /tmp/inl [--threads 1 2] [--image-size 128]
       [--micro-batch 32] [--steps 20] [--repeats 3] [--extra '--aa rand-m9-mstd0.5-inc1'] [--json OUT]
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

from runs import log_records


def one_run(a, threads, classes, log):
    cmd = [os.path.join(a.build, "apps", "convnext_zero"), "--model", "atto", "--data", f"folder:{a.data}",
           "--num-classes", str(classes), "--image-size", str(a.image_size), "--micro-batch",
           str(a.micro_batch), "--augment", "--steps", str(a.steps), "--loader-threads", str(threads),
           "--log", log] + shlex.split(a.extra)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"data_wait_fraction.py: {' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    steps = sorted(log_records(log), key=lambda r: r["step"])[1:]
    if not steps:
        sys.exit(f"data_wait_fraction.py: {log}: no training steps after the first")
    wait = sum(r["data_wait_s"] for r in steps)
    total = sum(r["step_time_s"] for r in steps)
    return {"fraction": wait / total, "median_step_s": statistics.median(r["step_time_s"] for r in steps),
            "median_wait_s": statistics.median(r["data_wait_s"] for r in steps), "command": " ".join(cmd)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--data", required=True, help="folder of class folders of JPEGs")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--extra", default="", help="more convnext_zero flags, e.g. '--aa rand-m9-mstd0.5-inc1'")
    ap.add_argument("--json")
    a = ap.parse_args()
    if not os.path.isdir(a.data):
        sys.exit(f"data_wait_fraction.py: --data {a.data}: not a directory")
    if a.steps < 2:
        sys.exit("data_wait_fraction.py: --steps: at least 2 (the first step's wait is the fill)")
    classes = sum(os.path.isdir(os.path.join(a.data, d)) for d in os.listdir(a.data))
    runs = {t: [] for t in a.threads}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            for t in a.threads:
                r = one_run(a, t, classes, os.path.join(tmp, f"log_{t}_{rep}.jsonl"))
                runs[t].append(r)
                print(f"  run {rep + 1}/{a.repeats}, {t} loader thread(s): {100 * r['fraction']:.1f}% waiting, "
                      f"median step {r['median_step_s']:.3f} s, median wait {r['median_wait_s']:.3f} s",
                      file=sys.stderr, flush=True)
    print(f"ConvNeXt-atto, 1 rank, {a.image_size} px, micro-batch {a.micro_batch}, --augment {a.extra}, "
          f"{a.steps} steps (fraction over steps 2..{a.steps}), {a.repeats} runs")
    print("| loader threads | data wait, % of step time: median [min-max] | median step time, s |\n| --- | --- | --- |")
    for t in a.threads:
        f = [100 * r["fraction"] for r in runs[t]]
        s = statistics.median(r["median_step_s"] for r in runs[t])
        print(f"| {t} | {statistics.median(f):.1f} [{min(f):.1f}-{max(f):.1f}] | {s:.3f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "runs": {str(t): v for t, v in runs.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
