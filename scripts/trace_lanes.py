#!/usr/bin/env python3
"""plot_run.py --trace: one traced step of a convnext_zero --trace file drawn as lanes per rank.

Each rank is a band of rows, one per lane of its process in the trace (the step, data wait, compute with its
forward/backward/update phases, the model's blocks inside them as a band of alternating shades and the ops
as thin bars, each communication thread's collectives coloured by kind, checkpoint saves, other threads); the x axis is milliseconds from the step's start on rank 0 (the ranks' clocks are
aligned when the trace starts: Note [Trace clocks])."""
import json
import os
import sys

COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "update": "#55A868", "data wait": "#C44E52",
          "reduce_scatter": "#8172B3", "all_gather": "#937860", "all_reduce": "#DA8BC3", "broadcast": "#8C8C8C",
          "checkpoint": "#CCB974"}
LANE_ORDER = ["step", "data wait", "compute", "comm", "checkpoint"]


def read_trace(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        sys.exit(f"plot_run.py: {path}: {e.strerror}")
    except json.JSONDecodeError:
        sys.exit(f"plot_run.py: {path}: not a trace (not one JSON document; a --log file is JSON lines)")
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        sys.exit(f"plot_run.py: {path}: not a trace (no \"traceEvents\" list)")
    return doc["traceEvents"]


def lane_rank(name):
    for i, prefix in enumerate(LANE_ORDER):
        if name.startswith(prefix):
            return i
    return len(LANE_ORDER)


def draw(path, out, step=None):
    events = read_trace(path)
    steps = sorted({int(e["name"].split()[1]) for e in events if e.get("cat") == "step" and e.get("ph") == "X"})
    if not steps:
        sys.exit(f"plot_run.py: {path}: no traced step (\"cat\": \"step\" spans)")
    step = steps[0] if step is None else step
    if step not in steps:
        sys.exit(f"plot_run.py: {path}: step {step} is not traced (traced: {steps})")
    spans = {e["pid"]: e for e in events if e.get("cat") == "step" and e["name"] == f"step {step}"}
    t0 = min(e["ts"] for e in spans.values())
    t1 = max(e["ts"] + e["dur"] for e in spans.values())
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    rows = []  # (pid, tid, lane name), ranks in order, lanes in LANE_ORDER within each
    for pid in sorted(spans):
        lanes = sorted(((tid, n) for (p, tid), n in threads.items() if p == pid), key=lambda t: (lane_rank(t[1]), t[1]))
        rows += [(pid, tid, name) for tid, name in lanes]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(15, 0.45 * len(rows) + 1.5), constrained_layout=True)
    index = {(pid, tid): i for i, (pid, tid, _) in enumerate(rows)}
    drawn = 0
    blocks = {}  # lane -> the last block's shade
    for e in sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"]):
        if e.get("ph") != "X" or (e["pid"], e["tid"]) not in index:
            continue
        a, b = max(e["ts"], t0), min(e["ts"] + e["dur"], t1)
        if b <= a:
            continue
        y = len(rows) - 1 - index[(e["pid"], e["tid"])]
        x, w = (a - t0) / 1e3, (b - a) / 1e3
        if e.get("cat") == "op":  # thin, inside its phase's bar
            ax.broken_barh([(x, w)], (y - 0.12, 0.24), facecolor="black", alpha=0.35, linewidth=0,
                           zorder=3)
        elif e.get("cat") == "block":  # a band at the bar's foot, alternating shades per block
            blocks[(e["pid"], e["tid"])] = shade = 1 - blocks.get((e["pid"], e["tid"]), 0)
            ax.broken_barh([(x, w)], (y - 0.4, 0.16), facecolor="black", alpha=0.25 + 0.35 * shade,
                           linewidth=0, zorder=2)
        else:
            kind = e["name"].split()[0] if e.get("cat") == "comm" else e["name"]  # "all_gather unit 3"
            color = COLORS.get(kind, COLORS.get(e.get("cat"), "#999999"))
            ax.broken_barh([(x, w)], (y - 0.4, 0.8), facecolor=color, edgecolor="white", linewidth=0.3)
            if w > 0.06 * (t1 - t0) / 1e3 and e.get("cat") != "step":
                ax.text(x + w / 2, y, e["name"], ha="center", va="center", fontsize=7, color="white", clip_on=True)
        drawn += 1
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {pid}: {name}" for pid, _, name in reversed(rows)], fontsize=8)
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.set_xlabel("ms from the step's start")
    ax.grid(axis="x", alpha=0.3)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=c, label=n) for n, c in COLORS.items()] + [Patch(color="black", alpha=0.35,
              label="ops (inside a phase)"), Patch(color="black", alpha=0.45, label="blocks (forward, backward)")], fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    ax.set_title(f"{os.path.basename(path)}: step {step} on {len(spans)} rank{'s' if len(spans) > 1 else ''}")
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:
        sys.exit(f"plot_run.py: -o {out}: {e.strerror}")
    print(f"plot_run.py: {out}: step {step}, {len(spans)} ranks, {len(rows)} lanes, {drawn} spans")
