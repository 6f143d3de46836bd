#!/usr/bin/env python3
"""Does training learn as well with quantized communication (issue 22)? Stage 3 with --gather-dtype int8,
--reduce-dtype int8 and both, against fp32, over several seeds, at 2 and 4 CPU ranks, on the embedded
synthetic task (10 classes) and a harder one (100 classes: neighbouring hues, so the texture is needed).

Prints a table of final eval top-1 (mean, std, min-max over seeds), eval loss and the mean training loss of
the last 20 steps, with a two-sided exact permutation test of each configuration's mean top-1 against fp32's
(all splits of the 2k seeds' values); writes bench/results/quant-learning-<date>/quant_learning.csv (one row per run) and, with
matplotlib, quant_learning.png (mean training-loss curves). Not part of the test suite (minutes).

  python3 bench/quant_learning.py [--build build] [--steps 200] [--seeds 5] [--ranks 2,4] [--quick]
  python3 bench/quant_learning.py --stage 0 --configs "fp32,int8 reductions" --tag quant_learning_s0
                                               # stage 0: the quantized all-reduce (two exchanges)
  python3 bench/quant_learning.py --hosts 2 --ranks 4 --configs "fp32,int8 both,int8 both two-hop" \
      --tag quant_learning_two_hop         # issue 34: 2 simulated hosts x 2 ranks, the two-hop reduction
"""
import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import tempfile

from runs import dated_results, learning_outcome, permutation_p, run_or_exit

CONFIGS = {  # name: (gather, reduce, --comm-impl)
    "fp32": ("fp32", "fp32", "flat"),
    "int8 gathers": ("int8", "fp32", "flat"),
    "int8 reductions": ("fp32", "int8", "flat"),
    "int8 both": ("int8", "int8", "flat"),
    # Note [Two-hop quantized reduction]: needs --hosts (several simulated hosts of several ranks).
    "int8 reductions two-hop": ("fp32", "int8", "hier"),
    "int8 both two-hop": ("int8", "int8", "hier"),
}
TASKS = {
    "synthetic 10 classes": "synthetic:n=4096,eval_n=512,classes=10",
    "synthetic 100 classes": "synthetic:n=8192,eval_n=1000,classes=100",
}


def run(args, task, ranks, gather, reduce, impl, seed, log):
    cmd = [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
           "-x", "OMP_NUM_THREADS=1", "-x", f"CZ_SIMULATE_HOSTS={ranks // args.hosts if args.hosts > 1 else ''}",
           os.path.join(args.build, "apps", "convnext_zero"),
           "--depths", "1,1,1,1", "--dims", "16,32,64,128", "--image-size", "32",
           "--num-classes", TASKS[task].split("classes=")[1], "--data", TASKS[task],
           "--micro-batch", str(args.batch // ranks), "--steps", str(args.steps), "--warmup-steps", "20",
           "--lr", "3e-3", "--stage", str(args.stage), "--gather-dtype", gather, "--reduce-dtype", reduce,
           "--seed", str(seed), "--eval-every", "0", "--loader-threads", "1", "--no-progress",
           "--comm-impl", impl, "--log", log]
    run_or_exit(cmd)
    return learning_outcome(log)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--batch", type=int, default=32, help="global batch")
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated task names")
    ap.add_argument("--stage", type=int, default=3, help="ZeRO stage (0: no gathers, so no int8 gathers)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configurations")
    ap.add_argument("--hosts", type=int, default=1,
                    help="simulated hosts (CZ_SIMULATE_HOSTS = ranks / hosts), for the two-hop configurations")
    ap.add_argument("--quick", action="store_true", help="40 steps, 2 seeds, 2 ranks, the 10-class task")
    ap.add_argument("--out", default=dated_results("quant-learning"))
    ap.add_argument("--tag", default="quant_learning", help="the CSV's and the plot's file name")
    ap.add_argument("--plot-only", metavar="CSV", help="only draw the loss curves of an earlier run's CSV")
    args = ap.parse_args()
    if args.plot_only:
        rows = list(csv.DictReader(open(args.plot_only)))
        curves = {}
        for r in rows:
            curves.setdefault((r["task"], int(r["ranks"]), r["config"]), []).append(
                [float(x) for x in r["losses"].split()])
        args.tasks = ",".join(dict.fromkeys(r["task"] for r in rows))
        args.ranks = ",".join(dict.fromkeys(r["ranks"] for r in rows))
        args.seeds = len({r["seed"] for r in rows})
        return plot(args, curves, os.path.splitext(args.plot_only)[0] + ".png")
    if args.quick:
        args.steps, args.seeds, args.ranks, args.tasks = 40, 2, "2", "synthetic 10 classes"
    os.makedirs(args.out, exist_ok=True)
    rows, curves = [], {}
    work = tempfile.mkdtemp()
    for task in args.tasks.split(","):
        for ranks in [int(r) for r in args.ranks.split(",")]:
            for name in args.configs.split(","):
                gather, reduce, impl = CONFIGS[name]
                if impl == "hier" and not (args.hosts > 1 and ranks % args.hosts == 0 and ranks > args.hosts):
                    sys.exit(f"{name}: needs --hosts H > 1 dividing the ranks ({ranks}) with several ranks per host")
                for seed in range(args.seeds):
                    log = os.path.join(work, "run.jsonl")
                    losses, top1, eval_loss = run(args, task, ranks, gather, reduce, impl, seed, log)
                    rows.append({"task": task, "ranks": ranks, "config": name, "seed": seed, "top1": top1,
                                 "eval_loss": eval_loss, "train_loss_last20": statistics.mean(losses[-20:]),
                                 "losses": " ".join(f"{x:.5f}" for x in losses)})
                    curves.setdefault((task, ranks, name), []).append(losses)
                    print(f"{task}, {ranks} ranks, {name}, seed {seed}: top-1 {top1:.4f}, eval loss "
                          f"{eval_loss:.4f}", flush=True)
    with open(os.path.join(args.out, args.tag + ".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"\n{args.steps} steps, global batch {args.batch}, stage {args.stage}, {args.seeds} seeds; p: two-sided exact "
          "permutation test of the mean top-1 against fp32's")
    print("| task | ranks | config | top-1 mean ± std | min-max | eval loss | train loss (last 20) | p vs fp32 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for task in args.tasks.split(","):
        for ranks in [int(r) for r in args.ranks.split(",")]:
            ref = [r["top1"] for r in rows if r["task"] == task and r["ranks"] == ranks and r["config"] == "fp32"]
            for name in args.configs.split(","):
                sel = [r for r in rows if r["task"] == task and r["ranks"] == ranks and r["config"] == name]
                t = [r["top1"] for r in sel]
                sd = statistics.stdev(t) if len(t) > 1 else 0.0
                p = "-" if name == "fp32" else f"{permutation_p(t, ref):.2f}"
                print(f"| {task} | {ranks} | {name} | {100 * statistics.mean(t):.2f} ± {100 * sd:.2f}% | "
                      f"{100 * min(t):.2f}-{100 * max(t):.2f}% | "
                      f"{statistics.mean(r['eval_loss'] for r in sel):.4f} | "
                      f"{statistics.mean(r['train_loss_last20'] for r in sel):.4f} | {p} |")
    plot(args, curves, os.path.join(args.out, args.tag + ".png"))


def plot(args, curves, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # a pyenv python3: Debian's has python3-matplotlib
        csv_path = os.path.splitext(path)[0] + ".csv"
        if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
            subprocess.call(["/usr/bin/python3", os.path.abspath(__file__), "--plot-only", csv_path])
        else:
            print("(no matplotlib: no plot)")
        return
    tasks, ranks_list = args.tasks.split(","), [int(r) for r in args.ranks.split(",")]
    fig, axes = plt.subplots(len(tasks), len(ranks_list), figsize=(6 * len(ranks_list), 4 * len(tasks)),
                             squeeze=False)
    for i, task in enumerate(tasks):
        for j, ranks in enumerate(ranks_list):
            ax = axes[i][j]
            for name in [c for c in CONFIGS if (task, ranks, c) in curves]:
                runs = curves[(task, ranks, name)]
                mean = [statistics.mean(v) for v in zip(*runs)]
                smooth = [statistics.mean(mean[max(0, k - 9):k + 1]) for k in range(len(mean))]
                ax.plot(range(1, len(smooth) + 1), smooth, label=name)
            ax.set_title(f"{task}, {ranks} ranks (mean of {args.seeds} seeds, 10-step average)")
            ax.set_xlabel("step")
            ax.set_ylabel("training loss")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
