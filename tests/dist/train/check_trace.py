#!/usr/bin/env python3
"""Checks a --trace file against the Trace Event format and the run's JSON log.

Usage: check_trace.py TRACE LOG FIRST LAST RANKS [--overlap]
  - the file is {"traceEvents": [...]}, each event has name/ph/pid/tid/ts (and dur for X), ts and dur in
    microseconds; process_name and thread_name metadata name every pid and tid used;
  - on each (pid, tid), X spans nest (no partial overlap) and B/E pairs match;
  - exactly the steps FIRST..LAST are there, on every rank, and each step's span equals the log's
    step_time_s within 2%;
  - --overlap: some reduce-scatter on a communication lane overlaps a backward span of the same rank;
  - every rank's compute lane has block spans (Note [Trace blocks]) holding ops, one per model unit and
    direction at least, and backward's nodes among its ops; counter samples ("C") of memory with a numeric "allocated";
  - each engine collective's span says what it was for ("bucket N", "unit N" or "partition N"), its bytes and
    group; --stage 3: the blocks are numbered units and the all-gathers are for units.
"""
import json
import sys
from collections import defaultdict


def fail(msg):
    print(f"check_trace: {msg}")
    sys.exit(1)


def main():
    path, log, first, last, ranks = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    overlap = "--overlap" in sys.argv[6:]
    stage3 = "--stage3" in sys.argv[6:]
    with open(path) as f:
        doc = json.load(f)
    events = doc.get("traceEvents")
    if not isinstance(events, list) or not events:
        fail("no traceEvents list")
    procs, threads = {}, {}
    lanes = defaultdict(list)
    for e in events:
        for k in ("name", "ph", "pid", "tid"):
            if k not in e:
                fail(f"event without {k}: {e}")
        if e["ph"] == "M":
            if e["name"] == "process_name":
                procs[e["pid"]] = e["args"]["name"]
            elif e["name"] == "thread_name":
                threads[(e["pid"], e["tid"])] = e["args"]["name"]
            continue
        if e["ph"] not in "XBEiC":
            fail(f"unexpected ph {e['ph']!r}")
        if not isinstance(e.get("ts"), (int, float)):
            fail(f"event without a numeric ts: {e}")
        if e["ph"] == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            fail(f"X event without a duration >= 0: {e}")
        lanes[(e["pid"], e["tid"])].append(e)
    if sorted(procs) != list(range(ranks)):
        fail(f"processes {sorted(procs)}, expected one per rank 0..{ranks - 1}")
    for key in lanes:
        if key not in threads:
            fail(f"lane {key} has no thread_name")
    # Nesting per lane: sorted by start (longer first on ties), each span lies inside the enclosing one or
    # after it. 1 us of slack for the rounding of the recorded times.
    for key, evs in lanes.items():
        stack = []
        for e in sorted((e for e in evs if e["ph"] == "X"), key=lambda e: (e["ts"], -e["dur"])):
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - 1:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + 1:
                fail(f"{threads[key]} of rank {key[0]}: {e['name']} overlaps {stack[-1]['name']} partly")
            stack.append(e)
        depth = 0
        for e in evs:
            depth += {"B": 1, "E": -1}.get(e["ph"], 0)
            if depth < 0:
                fail(f"{threads[key]}: E without B")
        if depth != 0:
            fail(f"{threads[key]}: unmatched B")
    steps = defaultdict(dict)  # step -> rank -> dur (s)
    for e in events:
        if e.get("cat") == "step" and e["ph"] == "X":
            steps[int(e["name"].split()[1])][e["pid"]] = e["dur"] / 1e6
    if sorted(steps) != list(range(first, last + 1)):
        fail(f"traced steps {sorted(steps)}, expected {first}..{last}")
    logged = {}
    with open(log) as f:
        for line in f:
            r = json.loads(line)
            if r.get("split") == "train":
                logged[r["step"]] = r["step_time_s"]
    for step, by_rank in steps.items():
        if sorted(by_rank) != list(range(ranks)):
            fail(f"step {step} traced on ranks {sorted(by_rank)}")
        # The log holds rank 0's step_time_s.
        if abs(by_rank[0] - logged[step]) > 0.02 * logged[step]:
            fail(f"step {step}: traced {by_rank[0]:.6f} s, logged {logged[step]:.6f} s")
    kinds = defaultdict(int)
    for e in events:
        if e.get("cat") == "comm":
            kinds[e["name"].split()[0]] += 1
    for rank in range(ranks):
        mine = [e for e in events if e["pid"] == rank]
        blocks = [e for e in mine if e.get("cat") == "block"]
        names = {e["name"] for e in blocks}
        if not any(n.endswith("(forward)") for n in names) or not any(n.endswith("(backward)") for n in names):
            fail(f"rank {rank}: no forward and backward block spans ({sorted(names)[:5]})")
        if stage3 and not all(n.startswith("unit ") for n in names):
            fail(f"rank {rank}: stage 3 blocks not named by unit: {sorted(names)[:5]}")
        ops = [e for e in mine if e.get("cat") == "op"]
        inside = sum(any(b["tid"] == o["tid"] and b["ts"] - 1 <= o["ts"] and o["ts"] + o["dur"] <= b["ts"] + b["dur"] + 1
                         for b in blocks) for o in ops)
        if inside < len(ops) // 2:
            fail(f"rank {rank}: only {inside} of {len(ops)} ops inside a block span")
        # Backward's nodes are ops of the compute lane too (the GPU-busy fraction sums that lane on CUDA).
        if not any(o["name"].endswith("Backward") for o in ops):
            fail(f"rank {rank}: no backward node among the ops ({sorted({o['name'] for o in ops})[:8]})")
        counters = [e for e in mine if e["ph"] == "C"]
        if not counters or not all(isinstance(e.get("args", {}).get("allocated"), (int, float)) for e in counters):
            fail(f"rank {rank}: no memory counter samples with a numeric 'allocated'")
        engine = [e for e in mine if e.get("cat") == "comm" and "for" in e.get("args", {})]
        if not engine:
            fail(f"rank {rank}: no collective says what it was for")
        for e in engine:
            a = e["args"]
            if not (a["for"].split()[0] in ("bucket", "unit", "partition") and isinstance(a.get("bytes"), int)
                    and "group" in a):
                fail(f"rank {rank}: collective {e['name']} without for/bytes/group: {a}")
        if stage3 and not any(e["name"].startswith("all_gather unit ") for e in engine):
            fail(f"rank {rank}: no all-gather for a unit")
    if overlap:
        found = 0
        for rank in range(ranks):
            back = [e for e in events if e["pid"] == rank and e.get("cat") == "phase" and e["name"] == "backward"]
            rs = [e for e in events if e["pid"] == rank and e.get("cat") == "comm"
                  and e["name"].startswith("reduce_scatter")]
            for r in rs:
                if any(r["ts"] < b["ts"] + b["dur"] and b["ts"] < r["ts"] + r["dur"] for b in back):
                    found += 1
        if not found:
            fail(f"no reduce-scatter overlaps backward (collectives: {dict(kinds)})")
        print(f"check_trace: {found} reduce-scatters overlap backward")
    print(f"check_trace: {len(events)} events, {len(lanes)} lanes, steps {sorted(steps)}, collectives {dict(kinds)}")


if __name__ == "__main__":
    main()
