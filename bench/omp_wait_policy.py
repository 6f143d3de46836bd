#!/usr/bin/env python3
"""OpenMP wait policies measured where they matter (issue 30; Note [Choosing the OpenMP wait policy]):
convnext_zero's training img/s with OMP_WAIT_POLICY=passive, =active, and unset (the automatic choice, which
the header names), on an idle machine, beside CPU-bound processes, and with oversubscribed ranks; PyTorch's
training step (bench/train_step_torch.py, at its own OpenMP defaults, same threads) in the same conditions
when an interpreter with torch and timm is given.

    python3 bench/omp_wait_policy.py --build build --runs 3 [--torch-python /path/to/python3]

Situations: `idle` (nothing else running; on a shared machine each run waits up to --wait-idle s for a second
in which all cores but 0.2 of one are idle, and the CSV records it), `busy1` (one CPU-bound process beside
the run), `busy_all` (one per core), `ranks_2x2` (2 ranks under mpirun with OMP_NUM_THREADS=2 each, more
threads than cores; PyTorch not run). ConvNeXt-atto, 64 px, micro-batch 32, synthetic data; img/s is the global
batch over the mean step time of the steps after the warm-up (from the run's log). Writes a CSV (--csv) and
prints a markdown table of medians.
"""
import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from runs import dated_results

HERE = os.path.dirname(os.path.abspath(__file__))


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def idle_cores(seconds=1.0):
    """Cores idle over `seconds` (/proc/stat), as the runs' own measurement takes it."""
    def sample():
        with open("/proc/stat") as f:
            cpus = [list(map(int, l.split()[1:9])) for l in f if l.startswith("cpu") and l[3].isdigit()]
        return [(c[3] + c[4], sum(c)) for c in cpus]
    a = sample()
    time.sleep(seconds)
    b = sample()
    return sum((bi - ai) / max(1, bt - at) for (ai, at), (bi, bt) in zip(a, b))


def wait_for_quiet(limit_s, cores):
    """Waits (up to limit_s) for a second in which the machine's cores are idle but for 0.2 of one: on a
    shared machine, the "idle" situation is measured in its quiet moments. Returns the idle cores seen."""
    deadline = time.time() + limit_s
    idle = idle_cores()
    while idle < cores - 0.2 and time.time() < deadline:
        idle = idle_cores()
    return idle


NICE = 0  # --nice: the measured runs' and the busy processes' niceness


def niced():
    if NICE:
        os.nice(NICE)


def start_busy(n):
    """n CPU-bound processes (a compiler's kind of load, without its I/O), stopped by stop_busy."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=niced) for _ in range(n)]
    time.sleep(1.0)  # running before the measured run starts
    return procs


def stop_busy(procs):
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def ours(args, policy, ranks, threads, tmp):
    """img/s and the header's OpenMP line of one convnext_zero run."""
    log = os.path.join(tmp, "ours.jsonl")
    if os.path.exists(log):
        os.unlink(log)
    app = os.path.join(args.build, "apps", "convnext_zero")
    cmd = [app, "--model", "atto", "--image-size", "64", "--micro-batch", str(args.batch), "--steps",
           str(args.warmup + args.steps), "--data", "synthetic", "--schedule", "constant", "--eval-batches", "1",
           "--no-progress", "--log", log]
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("OMP_NUM_THREADS", None)
    if policy != "auto":
        env["OMP_WAIT_POLICY"] = policy
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if ranks > 1:
        cmd = [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] + \
              sum((["-x", k] for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS") if k in env), []) + cmd
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, timeout=1800,
                         preexec_fn=niced).stdout
    chose = re.search(r"^convnext_zero: OpenMP waits (\w+): (.*?) \(rank 0's choice", out, re.M)
    with open(log) as f:
        steps = [r for r in map(json.loads, f) if r.get("split", "train") == "train" and "step_time_s" in r]
    step_s = statistics.mean(r["step_time_s"] for r in steps[args.warmup:])
    return args.batch * ranks / step_s, (chose.group(1), chose.group(2)) if chose else ("?", "")


def peer(args, threads, tmp):
    out = os.path.join(tmp, "torch.json")
    cmd = [args.torch_python, os.path.join(HERE, "train_step_torch.py"), "--model", "atto", "--device", "cpu",
           "--dtype", "f32", "--batch", str(args.batch), "--image", "64", "--classes", "10", "--threads",
           str(threads), "--warmup", str(args.warmup), "--steps", str(args.steps), "--json", out]
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=1800, preexec_fn=niced)
    with open(out) as f:
        r = json.load(f)
    return 1e3 * args.batch / r["ms_per_step"], r.get("torch", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--runs", type=int, default=3, help="runs of each policy in each situation")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--situations", default="idle,busy1,busy_all,ranks_2x2")
    ap.add_argument("--wait-idle", type=float, default=120,
                    help="before each run of the idle situation, wait up to this many seconds for a quiet second")
    ap.add_argument("--torch-python", help="an interpreter with torch and timm for the PyTorch peer")
    ap.add_argument("--csv", default=os.path.join(dated_results("omp-wait-policy"), "omp_wait_policy.csv"))
    ap.add_argument("--nice", type=int, default=0,
                    help="niceness of the measured runs and the busy processes (root: e.g. -20, so that other "
                         "users' work on a shared machine yields to them; every situation alike)")
    args = ap.parse_args()
    global NICE
    NICE = args.nice
    cores = os.cpu_count()
    situations = {"idle": (0, 1, None), "busy1": (1, 1, None), "busy_all": (cores, 1, None),
                  "ranks_2x2": (0, 2, 2)}  # busy processes, ranks, OMP_NUM_THREADS
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.situations.split(","):
            n_busy, ranks, threads = situations[name]
            procs = start_busy(n_busy)
            try:
                for run in range(args.runs):
                    # Policies interleaved, so that a change in the machine's load touches each alike.
                    for policy in ("passive", "active", "auto"):
                        quiet = wait_for_quiet(args.wait_idle, cores) if name == "idle" else None
                        load = load1()
                        ips, (chose, why) = ours(args, policy, ranks, threads, tmp)
                        rows.append(dict(situation=name, run=run, side="convnext_zero", policy=policy,
                                         chose=chose, img_per_s=round(ips, 1), load1=load,
                                         idle_before="" if quiet is None else round(quiet, 2), note=why))
                        print(f"{name} run {run}: {policy:7s} {ips:7.1f} img/s (load {load:.2f}"
                              f"{'' if quiet is None else f', {quiet:.2f} cores idle before'}; chose {chose})",
                              flush=True)
                    if args.torch_python and ranks == 1:
                        quiet = wait_for_quiet(args.wait_idle, cores) if name == "idle" else None
                        load = load1()
                        ips, version = peer(args, cores, tmp)
                        rows.append(dict(situation=name, run=run, side="pytorch", policy="default", chose="",
                                         img_per_s=round(ips, 1), load1=load,
                                         idle_before="" if quiet is None else round(quiet, 2),
                                         note=f"torch {version}"))
                        print(f"{name} run {run}: pytorch {ips:7.1f} img/s (load {load:.2f})", flush=True)
            finally:
                stop_busy(procs)
    os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"\nwrote {args.csv}\n")

    def med(name, side, policy):
        v = [r["img_per_s"] for r in rows if (r["situation"], r["side"], r["policy"]) == (name, side, policy)]
        return statistics.median(v) if v else None

    print("| situation | load (1 min) | passive | active | automatic (chose) | PyTorch | automatic / PyTorch |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in args.situations.split(","):
        loads = [r["load1"] for r in rows if r["situation"] == name]
        chose = sorted({r["chose"] for r in rows if r["situation"] == name and r["policy"] == "auto"})
        p, a, u, t = (med(name, "convnext_zero", "passive"), med(name, "convnext_zero", "active"),
                      med(name, "convnext_zero", "auto"), med(name, "pytorch", "default"))
        fmt = lambda v: "-" if v is None else f"{v:.1f}"
        print(f"| {name} | {min(loads):.2f}-{max(loads):.2f} | {fmt(p)} | {fmt(a)} | {fmt(u)} ({'/'.join(chose)}) "
              f"| {fmt(t)} | {'-' if not t else f'{u / t:.2f}x'} |")


if __name__ == "__main__":
    main()
