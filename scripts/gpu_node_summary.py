#!/usr/bin/env python3
"""The node table of scripts/gpu-check.sh's node stage (issue 51): ranks sharing the GPU as a node's ranks
would, bound by mpirun or not, on the JPEG folder with the whole recipe, beside one rank.

  gpu_node_summary.py NODE_DIR      reads NODE_DIR/runs.tsv, writes NODE_DIR/node.json and NODE_DIR/node.md and
                                    prints the Markdown table
  gpu_node_summary.py --self-test   the figures and the table from a made-up header, log and trace

runs.tsv, one run a line, tab-separated: name, ranks, the run's output (stdout and stderr: the header names
every local rank's mask and share), its --log, its --trace, what happened ("ok", or why not).
Per rank of a run:
  mask, share     from the header's "CPUs of the ranks on this host" line (Note [A rank's CPUs on a node])
  loader threads  the share's CPUs less the launching thread's (Note [CPU threads on a CUDA rank]); rank 0's
                  from its "CPU threads per rank" line
  data wait       the rank's "data" spans over its step spans in the trace (its traced steps)
  img/s           the run's images over the seconds of its steps after the first `warm` (min(5, a quarter)),
                  over the ranks (data parallel: every rank makes the same number)
"""
import json
import os
import re
import statistics
import sys
import tempfile

GOAL_WAIT = 0.02


def fail(msg):
    sys.exit(f"gpu_node_summary.py: {msg}")


def shares_from_header(text):
    """[(local rank, mask, share, cpus)] from the header line; [] when the run printed none."""
    line = next((l for l in text.splitlines() if "CPUs of the ranks on this host" in l), "")
    out = []
    for m in re.finditer(r"local rank (\d+): mask (\S+) -> (\S+) \((\d+) CPUs?", line):
        out.append((int(m.group(1)), m.group(2), m.group(3), int(m.group(4))))
    return out


def loader_threads_of_rank0(text):
    m = re.search(r"CPU threads per rank .*?: (\d+) loader threads?", text)
    return int(m.group(1)) if m else None


def data_wait_per_rank(trace_path):
    """{rank: data wait over step time} over the traced steps (pid is the rank)."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    steps, waits = {}, {}
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "step":
            steps.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "data":
            for t0, t1 in steps.get(e["pid"], []):
                a, b = max(t0, e["ts"]), min(t1, e["ts"] + e["dur"])
                if b > a:
                    waits[e["pid"]] = waits.get(e["pid"], 0.0) + (b - a)
    return {pid: waits.get(pid, 0.0) / sum(b - a for a, b in spans)
            for pid, spans in steps.items() if sum(b - a for a, b in spans) > 0}


def img_per_s(log_path):
    steps = []
    with open(log_path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                if r.get("split") == "train" and "step_time_s" in r:
                    steps.append(r)
    if len(steps) < 2:
        fail(f"{log_path}: {len(steps)} train steps")
    warm = min(5, len(steps) // 4)
    rest = steps[warm:]
    images = sum(r["img_per_s"] * r["step_time_s"] for r in rest)
    seconds = sum(r["step_time_s"] for r in rest)
    return images / seconds if seconds > 0 and images > 0 else None, statistics.median(
        r["step_time_s"] for r in rest)


def run_rows(name, ranks, out_path, log, trace, state):
    rows = []
    if state != "ok":
        return [{"run": name, "ranks": ranks, "state": state}]
    text = open(out_path, errors="replace").read()
    shares = {r: (mask, share, cpus) for r, mask, share, cpus in shares_from_header(text)}
    waits = data_wait_per_rank(trace) if trace != "-" and os.path.exists(trace) else {}
    total, median_step = img_per_s(log)
    lt0 = loader_threads_of_rank0(text)
    for r in range(ranks):
        mask, share, cpus = shares.get(r, ("?", "?", 0))
        loaders = lt0 if r == 0 and lt0 is not None else max(1, cpus - 1) if cpus else None
        rows.append({"run": name, "ranks": ranks, "rank": r, "mask": mask, "share": share, "cpus": cpus,
                     "loader_threads": loaders, "data_wait": waits.get(r),
                     "img_per_s": total / ranks if total else None, "median_step_s": median_step,
                     "state": "ok"})
    return rows


def markdown(rows):
    out = ["| run | rank | mask | share (CPUs) | loader threads | data wait | img/s | median step | goal |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["state"] != "ok":
            out.append(f"| {r['run']} | - | - | - | - | - | - | - | {r['state']} |")
            continue
        w = r["data_wait"]
        goal = "n/a" if w is None else ("ok" if w <= GOAL_WAIT else f"over {100 * GOAL_WAIT:.0f}%")
        out.append(f"| {r['run']} | {r['rank']} | {r['mask']} | {r['share']} ({r['cpus']}) | "
                   f"{r['loader_threads'] if r['loader_threads'] is not None else '?'} | "
                   f"{'?' if w is None else f'{100 * w:.1f}%'} | "
                   f"{r['img_per_s']:.0f} | {1e3 * r['median_step_s']:.0f} ms | {goal} |")
    return "\n".join(out) + "\n"


def summarise(node_dir):
    rows = []
    with open(os.path.join(node_dir, "runs.tsv")) as f:
        for line in f:
            if line.strip():
                name, ranks, out, log, trace, state = line.rstrip("\n").split("\t")
                rows += run_rows(name, int(ranks), out, log, trace, state)
    with open(os.path.join(node_dir, "node.json"), "w") as f:
        json.dump(rows, f, indent=1)
    md = markdown(rows)
    with open(os.path.join(node_dir, "node.md"), "w") as f:
        f.write(md)
    print(md, end="")


def self_test():
    d = tempfile.mkdtemp()
    header = ("convnext_zero: CPU threads per rank (a CUDA rank, 2 CPUs, 2 cores: its own; 2 in the mask, 2 ranks "
              "on this host): 1 loader thread on CPU 1, CPU 0 left to the thread that launches kernels\n"
              "convnext_zero: CPUs of the ranks on this host (the launcher's masks, gathered): local rank 0: "
              "mask 0-1 -> 0-1 (2 CPUs, 2 cores; its mask is its own); local rank 1: mask 2-3 -> 2-3 (2 CPUs, "
              "2 cores; its mask is its own)\n")
    open(os.path.join(d, "two.txt"), "w").write(header)
    with open(os.path.join(d, "two.jsonl"), "w") as f:
        for s in range(1, 9):
            t = 0.5 if s == 1 else 0.1
            f.write(json.dumps({"split": "train", "step": s, "step_time_s": t, "img_per_s": 64 / t}) + "\n")
    events = []
    for pid, wait in ((0, 1000), (1, 10000)):
        for k in range(2):
            events.append({"ph": "X", "cat": "step", "pid": pid, "tid": 0, "ts": k * 100000, "dur": 100000,
                           "name": "step"})
            events.append({"ph": "X", "cat": "data", "pid": pid, "tid": 0, "ts": k * 100000, "dur": wait,
                           "name": "data wait"})
    json.dump({"traceEvents": events}, open(os.path.join(d, "two.trace.json"), "w"))
    with open(os.path.join(d, "runs.tsv"), "w") as f:
        f.write(f"two\t2\t{d}/two.txt\t{d}/two.jsonl\t{d}/two.trace.json\tok\n")
        f.write(f"gone\t8\t-\t-\t-\tnot run: out of time\n")
    summarise(d)
    rows = json.load(open(os.path.join(d, "node.json")))
    checks = [
        (len(rows) == 3, f"{len(rows)} rows"),
        (rows[0]["share"] == "0-1" and rows[1]["mask"] == "2-3", "masks and shares from the header"),
        (rows[0]["loader_threads"] == 1 and rows[1]["loader_threads"] == 1, "loader threads"),
        (abs(rows[0]["data_wait"] - 0.01) < 1e-9 and abs(rows[1]["data_wait"] - 0.1) < 1e-9, "data waits"),
        (abs(rows[0]["img_per_s"] - 320) < 1e-6, f"img/s per rank {rows[0]['img_per_s']}"),
        (rows[2]["state"].startswith("not run"), "a run that did not happen"),
    ]
    md = open(os.path.join(d, "node.md")).read()
    checks.append(("| two | 1 | 2-3 | 2-3 (2) | 1 | 10.0% | 320 | 100 ms | over 2% |" in md, md))
    bad = [why for ok, why in checks if not ok]
    if bad:
        fail("self-test: " + "; ".join(bad))
    print("gpu_node_summary.py self-test: OK")


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        self_test()
    elif len(sys.argv) == 2:
        summarise(sys.argv[1])
    else:
        fail(__doc__)


if __name__ == "__main__":
    main()
