#!/usr/bin/env python3
"""The job table of scripts/gpu-check.sh's job stage (issue 40): the app, not the benchmark, beside
bench_train_step's img/s at the same batch in the same call.

  gpu_job_summary.py JOB_DIR        reads JOB_DIR/runs.tsv, writes JOB_DIR/job.json and JOB_DIR/job.md and
                                    prints the Markdown table
  gpu_job_summary.py --self-test    the figures and the table from a made-up log, trace and step result

runs.tsv, one app run a line, tab-separated: name, micro-batch, bench_train_step's --json at that batch, the
app's --log, its --trace ("-": none), what happened ("ok", or why the run did not happen or failed).
Per run:
  app img/s       images / seconds over the steps after the first `warm` ones (the job's rate: data waits and
                  an epoch's end included); `warm` = min(10, a quarter of the steps)
  / step          that over bench_train_step's img/s (goals: >= 0.95 on synthetic data, >= 0.90 on JPEGs)
  median step     the median step time after the warm steps, against the benchmark's ms per step
  GPU busy        over the traced steps: the union of the op spans on the device lanes ("... (cuda:N)", Note
                  [Trace device times]) inside each step's span, over the steps' spans (goal >= 90%)
  data wait       the steps' data_wait_s over their step_time_s, after the warm steps
  epoch-end wait  the longest data_wait_s of an epoch's first step (the log's "epoch" changes there; not the
                  run's first epoch), in ms and in median steps (goal: at most one step)
"""
import json
import os
import statistics
import sys
import tempfile

GOAL_RATIO = {"synthetic": 0.95, "folder": 0.90}
GOAL_BUSY = 0.90


def fail(msg):
    sys.exit(f"gpu_job_summary.py: {msg}")


def read_log(path):
    """The training steps of a --log file (JSON lines), in order."""
    steps = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                fail(f"{path}:{n}: not JSON")
            if r.get("split") == "train" and "step_time_s" in r:
                steps.append(r)
    return steps


def union_length(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def gpu_busy(trace_path):
    """(busy fraction, traced steps): device-lane op time inside the step spans over the step spans."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    device = {k for k, name in lanes.items() if "(cuda" in name}
    step_spans = [(e["pid"], e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("ph") == "X" and e.get("cat") == "step"]
    if not step_spans:
        return None, 0
    if not device:
        return 0.0, len(step_spans)
    ops = [(e["pid"], e["ts"], e["ts"] + e["dur"]) for e in events
           if e.get("ph") == "X" and e.get("cat") == "op" and (e["pid"], e["tid"]) in device]
    busy = span = 0.0
    for pid, t0, t1 in step_spans:
        span += t1 - t0
        busy += union_length([(max(a, t0), min(b, t1)) for p, a, b in ops if p == pid and b > t0 and a < t1])
    return (busy / span if span > 0 else None), len(step_spans)


def row_figures(name, batch, step_json, log, trace, state):
    row = {"run": name, "micro_batch": batch, "state": state}
    if state != "ok":
        return row
    data = "folder" if "folder" in name else "synthetic"
    row["data"] = data
    try:
        with open(step_json) as f:
            bench = json.load(f)
        row["step_img_s"] = bench["img_per_s"]
        row["step_ms"] = bench["ms_per_step"]
    except (OSError, KeyError, json.JSONDecodeError) as e:
        row["step_img_s"] = None
        row["note"] = f"no bench_train_step result ({step_json}: {e})"
    steps = read_log(log)
    if len(steps) < 4:
        row["state"] = f"only {len(steps)} steps in {log}"
        return row
    warm = min(10, len(steps) // 4)
    steady = steps[warm:]
    seconds = sum(s["step_time_s"] for s in steady)
    images = sum(s["img_per_s"] * s["step_time_s"] for s in steady)
    row["steps"] = len(steps)
    row["app_img_s"] = images / seconds
    row["median_step_ms"] = 1e3 * statistics.median(s["step_time_s"] for s in steady)
    row["data_wait"] = sum(s["data_wait_s"] for s in steady) / seconds
    ends = [s for prev, s in zip(steps, steps[1:]) if s.get("epoch") != prev.get("epoch")]
    row["epoch_ends"] = len(ends)
    if ends:
        worst = max(ends, key=lambda s: s["data_wait_s"])
        row["epoch_end_wait_ms"] = 1e3 * worst["data_wait_s"]
        row["epoch_end_wait_steps"] = row["epoch_end_wait_ms"] / row["median_step_ms"]
        row["epoch_end_step"] = worst["step"]
    row["longest_wait_ms"] = 1e3 * max(s["data_wait_s"] for s in steady)
    if row.get("step_img_s"):
        row["ratio"] = row["app_img_s"] / row["step_img_s"]
        row["ratio_goal"] = GOAL_RATIO[data]
    if trace and trace != "-" and os.path.exists(trace):
        row["gpu_busy"], row["traced_steps"] = gpu_busy(trace)
    return row


def read_runs(job_dir):
    path = os.path.join(job_dir, "runs.tsv")
    try:
        lines = [l.rstrip("\n") for l in open(path) if l.strip()]
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    rows = []
    for n, line in enumerate(lines, 1):
        f = line.split("\t")
        if len(f) != 6:
            fail(f"{path}:{n}: {len(f)} fields, expected 6 (name, batch, step json, log, trace, state)")
        rows.append(row_figures(f[0], int(f[1]), f[2], f[3], f[4], f[5]))
    return rows


def pct(v):
    return "-" if v is None else f"{100 * v:.1f}%"


def num(v, fmt):
    return "-" if v is None else format(v, fmt)


def markdown(rows):
    out = ["| run | batch | app img/s | step img/s | app / step | median step ms (bench) | GPU busy | data wait "
           "| epoch-end wait | goals |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["state"] != "ok":
            out.append(f"| {r['run']} | {r['micro_batch']} | {r['state']} | | | | | | | |")
            continue
        goals = []
        if "ratio" in r:
            goals.append(("met" if r["ratio"] >= r["ratio_goal"] else "NOT met") + f" >= {r['ratio_goal']}x")
        if r.get("gpu_busy") is not None:
            goals.append(("met" if r["gpu_busy"] >= GOAL_BUSY else "NOT met") + " busy >= 90%")
        if "epoch_end_wait_steps" in r:
            goals.append(("met" if r["epoch_end_wait_steps"] <= 1 else "NOT met") + " epoch end <= 1 step")
        end = (f"{r['epoch_end_wait_ms']:.1f} ms ({r['epoch_end_wait_steps']:.2f} steps)"
               if "epoch_end_wait_ms" in r else "no epoch end")
        out.append(f"| {r['run']} | {r['micro_batch']} | {r['app_img_s']:.0f} | {num(r.get('step_img_s'), '.0f')} | "
                   f"{num(r.get('ratio'), '.2f')}x | {r['median_step_ms']:.2f} ({num(r.get('step_ms'), '.2f')}) | "
                   f"{pct(r.get('gpu_busy'))} | {pct(r['data_wait'])} | {end} | {'; '.join(goals)} |")
    return "\n".join(out) + "\n"


def summarise(job_dir):
    rows = read_runs(job_dir)
    with open(os.path.join(job_dir, "job.json"), "w") as f:
        json.dump(rows, f, indent=1)
    table = markdown(rows)
    with open(os.path.join(job_dir, "job.md"), "w") as f:
        f.write("# The job against its step (gpu-check.sh, job stage)\n\n" + table)
    return rows, table


def self_test():
    """A made-up run: 24 steps of 20 ms at 64 images (3200 img/s), the first two slow, 8 steps an epoch whose
    third epoch starts with a 30 ms wait; a benchmark at 4000 img/s; a trace of two steps of 20 ms whose
    device lane holds 5 + 6 ms of ops inside them (overlaps counted once, what lies outside cut off)."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "bench.json"), "w") as f:
            json.dump({"img_per_s": 4000.0, "ms_per_step": 16.0}, f)
        with open(os.path.join(d, "app.jsonl"), "w") as f:
            f.write(json.dumps({"event": "start"}) + "\n")
            for step in range(1, 25):
                t = 0.2 if step <= 2 else 0.02
                wait = 0.03 if step == 17 else 0.001
                if step == 17:
                    t = 0.05
                f.write(json.dumps({"split": "train", "step": step, "epoch": (step - 1) // 8, "step_time_s": t,
                                    "data_wait_s": wait, "img_per_s": 64 / t}) + "\n")
            f.write(json.dumps({"split": "eval", "step": 24, "loss": 1.0}) + "\n")
        meta = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "step"}},
                {"ph": "M", "name": "thread_name", "pid": 0, "tid": 2, "args": {"name": "compute"}},
                {"ph": "M", "name": "thread_name", "pid": 0, "tid": 3, "args": {"name": "compute (cuda:0)"}}]
        spans = [{"ph": "X", "cat": "step", "name": "step 5", "pid": 0, "tid": 1, "ts": 0, "dur": 20000},
                 {"ph": "X", "cat": "step", "name": "step 6", "pid": 0, "tid": 1, "ts": 20000, "dur": 20000},
                 # host ops: not device time
                 {"ph": "X", "cat": "op", "name": "linear", "pid": 0, "tid": 2, "ts": 0, "dur": 19000},
                 # step 5: 3 + 4 ms overlapping by 2 -> 5 ms
                 {"ph": "X", "cat": "op", "name": "linear", "pid": 0, "tid": 3, "ts": 1000, "dur": 3000},
                 {"ph": "X", "cat": "op", "name": "gelu", "pid": 0, "tid": 3, "ts": 2000, "dur": 4000},
                 {"ph": "X", "cat": "block", "name": "stages.0", "pid": 0, "tid": 3, "ts": 0, "dur": 20000},
                 # step 6: 4 + 3 ms, of which 1 ms falls after its end -> 6 ms
                 {"ph": "X", "cat": "op", "name": "conv", "pid": 0, "tid": 3, "ts": 25000, "dur": 4000},
                 {"ph": "X", "cat": "op", "name": "conv", "pid": 0, "tid": 3, "ts": 38000, "dur": 3000},
                 # outside both steps
                 {"ph": "X", "cat": "op", "name": "late", "pid": 0, "tid": 3, "ts": 50000, "dur": 9000}]
        with open(os.path.join(d, "app.trace.json"), "w") as f:
            json.dump({"traceEvents": meta + spans}, f)
        with open(os.path.join(d, "runs.tsv"), "w") as f:
            f.write("\t".join(["synthetic_b64", "64", f"{d}/bench.json", f"{d}/app.jsonl", f"{d}/app.trace.json",
                               "ok"]) + "\n")
            f.write("\t".join(["folder_b128", "128", f"{d}/none.json", f"{d}/none.jsonl", "-",
                               "skipped: tools/make_imagenet_like.py failed"]) + "\n")
        rows, table = summarise(d)
        r = rows[0]
        # Steady steps 3..24 (warm = min(10, 24 // 4) = 6: steps 7..24): 17 of 20 ms and one of 50 ms.
        steady = [0.05 if s == 17 else 0.02 for s in range(7, 25)]
        want_img_s = 64 * len(steady) / sum(steady)
        checks = [
            (abs(r["app_img_s"] - want_img_s) < 1e-6, f"app img/s {r['app_img_s']} != {want_img_s}"),
            (abs(r["ratio"] - want_img_s / 4000) < 1e-9, f"ratio {r['ratio']}"),
            (abs(r["median_step_ms"] - 20) < 1e-9, f"median step {r['median_step_ms']}"),
            (r["epoch_ends"] == 2 and abs(r["epoch_end_wait_ms"] - 30) < 1e-9 and r["epoch_end_step"] == 17,
             f"epoch ends {r.get('epoch_ends')}, worst {r.get('epoch_end_wait_ms')} at {r.get('epoch_end_step')}"),
            (abs(r["epoch_end_wait_steps"] - 1.5) < 1e-9, f"epoch-end wait in steps {r['epoch_end_wait_steps']}"),
            (abs(r["data_wait"] - (0.03 + 0.001 * 17) / sum(steady)) < 1e-9, f"data wait {r['data_wait']}"),
            (abs(r["gpu_busy"] - (5 + 6) / 40) < 1e-9 and r["traced_steps"] == 2, f"busy {r['gpu_busy']}"),
            (rows[1]["state"].startswith("skipped"), f"second row {rows[1]}"),
            ("NOT met >= 0.95x" in table and "NOT met busy >= 90%" in table and "NOT met epoch end" in table,
             "the goals' verdicts missing:\n" + table),
            ("| folder_b128 | 128 | skipped: tools/make_imagenet_like.py failed |" in table, table),
            (os.path.exists(os.path.join(d, "job.json")) and os.path.exists(os.path.join(d, "job.md")),
             "job.json / job.md not written"),
        ]
        bad = [msg for ok, msg in checks if not ok]
        if bad:
            fail("self-test failed:\n  " + "\n  ".join(bad))
        print(table, end="")
        print(f"gpu_job_summary.py: self-test passed ({len(checks)} checks)")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
    elif len(sys.argv) == 2 and not sys.argv[1].startswith("-"):
        _, table = summarise(sys.argv[1])
        print(table, end="")
    else:
        fail("usage: gpu_job_summary.py JOB_DIR | --self-test")


if __name__ == "__main__":
    main()
