#!/usr/bin/env python3
"""Plots one or several convnext_zero runs from their --log files into one PNG.

  scripts/plot_run.py LOG.jsonl [LOG2.jsonl ...] [-o OUT.png]
  scripts/plot_run.py --trace TRACE.json [--step N] [-o OUT.png]

Six panels against the optimizer step: training loss, eval top-1, learning rate, img/s, data wait and peak memory
per rank; one line per run, labelled by its log's name. A panel whose quantity no run logged says so instead of
staying empty (data wait is logged only by builds that measure it). Default OUT: the first log's name with .png.
With --trace, one step of a --trace file (its first traced step, or --step N) as lanes per rank: compute
phases and ops, each collective, data wait, checkpoint saves (scripts/trace_lanes.py).
Needs matplotlib (Debian: python3-matplotlib); run from a pyenv or venv python3 without it, the script re-runs
itself under /usr/bin/python3 when that one has it (as tools/convert_weights.py does)."""
import argparse
import importlib.util
import json
import os
import sys

SYSTEM_PYTHON = "/usr/bin/python3"

# (title, split, key, scale, y label): what each panel draws.
PANELS = [
    ("training loss", "train", "loss", 1, "loss"),
    ("eval top-1", "eval", "top1", 100, "%"),
    ("learning rate", "train", "lr", 1, "lr"),
    ("throughput", "train", "img_per_s", 1, "img/s"),
    ("data wait", "train", "data_wait_s", 1000, "ms per step"),
    ("peak memory per rank", "train", "peak_mem_bytes", 1 / 2**20, "MiB"),
]


def ensure_matplotlib():
    if importlib.util.find_spec("matplotlib") is not None:
        return
    if os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON) and os.path.exists(SYSTEM_PYTHON):
        import subprocess
        probe = subprocess.run([SYSTEM_PYTHON, "-c", "import matplotlib"], capture_output=True)
        if probe.returncode == 0:
            os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])
    sys.exit("plot_run.py: needs matplotlib: apt-get install python3-matplotlib (or pip install matplotlib)")


def read_log(path):
    """{(split, key): ([steps], [values])} of a JSON-lines log; a resumed run's records are each step once."""
    series = {}
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        sys.exit(f"plot_run.py: {path}: {e.strerror}")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"plot_run.py: {path}:{n}: not a JSON object ({e.msg})")
        split, step = r.get("split"), r.get("step")
        if split not in ("train", "eval") or not isinstance(step, int):
            continue
        for key, value in r.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                xs, ys = series.setdefault((split, key), ([], []))
                xs.append(step)
                ys.append(value)
    if not any(split == "train" for split, _ in series):
        sys.exit(f"plot_run.py: {path}: no training step records (\"split\": \"train\"); is it a --log file?")
    return series


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="*", metavar="LOG.jsonl", help="convnext_zero --log files")
    parser.add_argument("--trace", metavar="TRACE.json", help="draw one step of a convnext_zero --trace file")
    parser.add_argument("--step", type=int, help="with --trace: the step to draw (default: the first traced)")
    parser.add_argument("-o", "--output", metavar="OUT.png", help="the picture (default: first log's name .png)")
    args = parser.parse_args()
    if bool(args.trace) == bool(args.logs):
        parser.error("give log files or --trace FILE, not both and not neither")
    if args.trace:
        ensure_matplotlib()
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import trace_lanes
        trace_lanes.draw(args.trace, args.output or os.path.splitext(args.trace)[0] + ".png", args.step)
        return
    out = args.output or os.path.splitext(args.logs[0])[0] + ".png"
    runs = [(os.path.basename(p), read_log(p)) for p in args.logs]
    ensure_matplotlib()
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8), constrained_layout=True)
    drawn = 0
    for ax, (title, split, key, scale, unit) in zip(axes.flat, PANELS):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(unit)
        lines = 0
        for name, series in runs:
            if (split, key) in series:
                xs, ys = series[(split, key)]
                ax.plot(xs, [y * scale for y in ys], marker="o" if split == "eval" else None, markersize=3,
                        label=name)
                lines += 1
        if lines:
            ax.grid(alpha=0.3)
            if len(runs) > 1:
                ax.legend(fontsize="small")
            drawn += lines
        else:
            ax.text(0.5, 0.5, f"not in the log{'s' if len(runs) > 1 else ''}\n({split} \"{key}\")",
                    ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.suptitle(", ".join(name for name, _ in runs))
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:
        sys.exit(f"plot_run.py: -o {out}: {e.strerror}")
    print(f"plot_run.py: {out}: {drawn} lines of {len(runs)} run{'s' if len(runs) > 1 else ''}")


if __name__ == "__main__":
    main()
