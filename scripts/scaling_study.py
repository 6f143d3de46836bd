#!/usr/bin/env python3
"""Scaling study: convnext_zero over a grid of ranks x ZeRO stage x bucket size x micro-batch, a few steps
each under mpirun, collected from the runs' JSON-lines logs into results.csv, PNG plots and summary.md.

    python3 scripts/scaling_study.py                      # the default grid (minutes on a 2-core machine)
    python3 scripts/scaling_study.py --quick --out /tmp/s # the smallest grid (seconds; what CI runs)
    python3 scripts/scaling_study.py --ranks 1,2,4,8 --stages 0,2,3 --bucket-mb 5,25 --micro-batch 16,32 \\
        --model tiny --image-size 224 -- --device cuda --precision bf16

Across hosts: --hosts 1,2 --link-rate none,1gbit,200mbit adds hosts x link rate to the grid. Ranks are then
spread evenly over the hosts of the test bed (scripts/hosts.sh: network namespaces on this machine, each
host's link shaped with tc; needs root); rank counts that do not divide evenly over a host count are left out
for it. A bed is made per configuration and always removed afterwards.

    sudo python3 scripts/scaling_study.py --hosts 1,2 --ranks 2,4 --link-rate none,1gbit --stages 0,3

Each configuration's figures are medians over the steps after --warmup. Scaling efficiency is img/s divided
by (ranks x img/s of 1 rank with the same stage, bucket size and micro-batch). Hidden communication is
1 - sum(comm_exposed_s) / sum(comm_s) over those steps, where comm_exposed_s is the part of the collectives'
run time during which the host waited for them (Note [Exposed communication] in src/dist/zero/engine.cpp),
so it lies in [0, 100]%; the host's other waiting (hand-off to the communication thread, wake-ups) is not in
it. The plots need matplotlib (Debian's python3-matplotlib); an interpreter without it (a pyenv or venv
python3) re-runs the script under /usr/bin/python3 when that one has it, and otherwise the CSV and the
summary are still written and the message names the interpreter that lacked it.
"""
import argparse
import csv
import itertools
import json
import os
import statistics
import subprocess
import sys

FIELDS = ["hosts", "link_rate", "ranks", "stage", "bucket_mb", "micro_batch", "img_per_s", "scaling_efficiency", "step_time_s",
          "peak_mem_bytes", "model_state_bytes", "comm_buffer_bytes", "comm_bytes", "comm_s", "comm_exposed_s",
          "hidden_fraction"]


def ints(s):
    return [int(x) for x in s.split(",") if x]


def floats(s):
    return [float(x) for x in s.split(",") if x]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build", help="build folder whose apps/convnext_zero runs (default build/)")
    p.add_argument("--out", default="runs/scaling", help="where results.csv, the PNGs and summary.md go")
    p.add_argument("--quick", action="store_true", help="the smallest grid: a tiny model, 1-2 ranks, stages 0 and 3")
    p.add_argument("--ranks", type=ints, default=None)
    p.add_argument("--stages", type=ints, default=None)
    p.add_argument("--bucket-mb", type=floats, default=None)
    p.add_argument("--micro-batch", type=ints, default=None)
    p.add_argument("--model", default=None, help="convnext_zero --model (default atto; --quick: a 4-block custom)")
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--hosts", type=ints, default=[1], help="hosts of the test bed the ranks spread over (default 1)")
    p.add_argument("--link-rate", default="none",
                   help="comma-separated tc rates of each host's link with --hosts > 1 (none: unshaped)")
    p.add_argument("extra", nargs="*", help="more convnext_zero flags, after --")
    a = p.parse_args()
    q = a.quick
    a.ranks = a.ranks or ([1, 2] if q else [1, 2, 4])
    a.stages = a.stages or ([0, 3] if q else [0, 1, 2, 3])
    a.bucket_mb = a.bucket_mb or [25.0]
    a.micro_batch = a.micro_batch or ([8] if q else [16])
    a.image_size = a.image_size or (32 if q else 64)
    a.steps = a.steps or (4 if q else 8)
    a.warmup = a.warmup if a.warmup is not None else (1 if q else 3)
    if a.steps <= a.warmup:
        p.error(f"--steps ({a.steps}) must exceed --warmup ({a.warmup})")
    if min(a.ranks) < 1 or min(a.micro_batch) < 1 or min(a.bucket_mb) <= 0:
        p.error("ranks, micro-batches and bucket sizes must be positive")
    if any(s not in (0, 1, 2, 3) for s in a.stages):
        p.error("stages are 0, 1, 2 or 3")
    a.link_rate = [r for r in a.link_rate.split(",") if r]
    if min(a.hosts) < 1:
        p.error("--hosts must be positive")
    return a


def model_flags(a):
    if a.model:
        return ["--model", a.model]
    if a.quick:
        return ["--depths", "1,1,1,1", "--dims", "8,16,24,32"]
    return ["--model", "atto"]


HOSTS_SH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hosts.sh")


def run_one(a, app, ranks, stage, bucket, micro, log, hosts=1):
    cmd = [app] + model_flags(a) + [
        "--image-size", str(a.image_size), "--micro-batch", str(micro), "--steps", str(a.steps),
        "--stage", str(stage), "--bucket-mb", str(bucket), "--num-classes", "10",
        "--data", f"synthetic:n={max(256, 4 * ranks * micro * a.steps)},eval_n=16", "--loader-threads", "1",
        "--no-progress", "--log", log] + a.extra
    if hosts > 1:
        cmd = [HOSTS_SH, "run"] + cmd  # every slot of the bed: hosts x ranks/hosts
    elif ranks > 1:
        cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)] + cmd
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"scaling_study: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}")
    steps = [json.loads(l) for l in open(log) if '"split":"train"' in l]
    if len(steps) != a.steps:
        sys.exit(f"scaling_study: {log} has {len(steps)} step records, expected {a.steps}")
    s = steps[a.warmup:]
    med = lambda k: statistics.median(x.get(k, 0) for x in s)
    row = {"hosts": hosts, "link_rate": "", "ranks": ranks, "stage": stage, "bucket_mb": bucket, "micro_batch": micro}
    for k in ["img_per_s", "step_time_s", "peak_mem_bytes", "model_state_bytes", "comm_buffer_bytes",
              "comm_bytes", "comm_s", "comm_exposed_s"]:
        row[k] = med(k)
    row["hidden_fraction"] = hidden_fraction(s)
    return row


def hidden_fraction(steps):
    """1 - exposed/comm over the steps together (a ratio of sums, not of medians taken from different steps)."""
    comm = sum(x.get("comm_s", 0) for x in steps)
    exposed = sum(x.get("comm_exposed_s", 0) for x in steps)
    if comm <= 0:
        return ""
    h = 1 - exposed / comm
    if not -1e-9 <= h <= 1:
        sys.exit(f"scaling_study: comm_exposed_s ({exposed:.6f} s) exceeds comm_s ({comm:.6f} s): a convnext_zero "
                 "older than Note [Exposed communication]? rebuild it")
    return max(0.0, h)


def plot(rows, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"scaling_study: {sys.executable} has no matplotlib: no plots (apt-get install python3-matplotlib "
              "and run the script with /usr/bin/python3, or pip install matplotlib for this interpreter)")
        return []
    written = []
    groups = sorted({(r["bucket_mb"], r["micro_batch"]) for r in rows})
    panels = [("img_per_s", "img/s", "throughput"), ("scaling_efficiency", "scaling efficiency", "efficiency"),
              ("peak_mem_bytes", "peak MiB per rank", "peak_memory"),
              ("model_state_bytes", "model-state MiB per rank", "model_states"),
              ("comm_bytes", "MiB sent per step per rank", "comm_bytes"),
              ("comm_exposed_s", "exposed communication s per step", "comm_exposed")]
    for key, label, name in panels:
        fig, ax = plt.subplots(figsize=(6, 4))
        for bucket, micro in groups:
            for stage in sorted({r["stage"] for r in rows}):
                pts = sorted((r["ranks"], r[key]) for r in rows
                             if r["stage"] == stage and r["bucket_mb"] == bucket and r["micro_batch"] == micro
                             and r[key] != "")
                if not pts:
                    continue
                ys = [y / 2**20 if "bytes" in key else y for _, y in pts]
                tag = f"stage {stage}" + (f", {bucket:g} MiB, mb {micro}" if len(groups) > 1 else "")
                ax.plot([x for x, _ in pts], ys, marker="o", label=tag)
        ax.set_xlabel("ranks")
        ax.set_ylabel(label)
        ax.set_xticks(sorted({r["ranks"] for r in rows}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out, f"{name}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def use_an_interpreter_with_matplotlib():
    """Re-runs the script under Debian's python3 when this interpreter (a pyenv or venv one) lacks matplotlib
    and /usr/bin/python3 has it (python3-matplotlib)."""
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    system = "/usr/bin/python3"
    if os.environ.get("CZ_STUDY_REEXEC") or not os.access(system, os.X_OK):
        return
    if subprocess.run([system, "-c", "import matplotlib"], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode != 0:
        return
    me = sys.executable + (" -S" if sys.flags.no_site else "")
    print(f"scaling_study: {me} has no matplotlib; running under {system}, which has", flush=True)
    os.environ["CZ_STUDY_REEXEC"] = "1"
    os.execv(system, [system, os.path.abspath(__file__)] + sys.argv[1:])


def main():
    a = parse_args()
    use_an_interpreter_with_matplotlib()
    app = os.path.join(a.build, "apps", "convnext_zero")
    if not os.access(app, os.X_OK):
        sys.exit(f"scaling_study: {app} not found: build first or pass --build")
    os.makedirs(a.out, exist_ok=True)
    rows = []
    grid = list(itertools.product(a.ranks, a.stages, a.bucket_mb, a.micro_batch))
    # Hosts > 1: one test bed per (hosts, ranks per host), re-shaped per link rate (none on one host).
    beds = [(1, None)] if 1 in a.hosts else []
    beds += [(h, rate) for h in a.hosts if h > 1 for rate in a.link_rate]
    if max(a.hosts) > 1:
        os.environ.setdefault("CZ_HOSTS_BED", "study")
    total = sum(1 for h, _ in beds for r, *_ in grid if h == 1 or r % h == 0)
    for hosts, rate in beds:
        for ranks, stage, bucket, micro in grid:
            if hosts > 1 and ranks % hosts != 0:
                continue
            tag = f"h{hosts}_{rate}_" if hosts > 1 else ""
            log = os.path.join(a.out, f"run_{tag}r{ranks}_s{stage}_b{bucket:g}_m{micro}.jsonl")
            if hosts > 1:
                subprocess.run([HOSTS_SH, "up", str(hosts), str(ranks // hosts)] +
                               ([] if rate == "none" else ["--rate", rate]), check=True)
                try:
                    row = run_one(a, app, ranks, stage, bucket, micro, log, hosts)
                finally:
                    subprocess.run([HOSTS_SH, "down"], check=False)
                row["link_rate"] = rate
            else:
                row = run_one(a, app, ranks, stage, bucket, micro, log)
            rows.append(row)
            where = f"{hosts} hosts at {rate}, " if hosts > 1 else ""
            print(f"[{len(rows)}/{total}] {where}ranks {ranks} stage {stage} bucket {bucket:g} MiB micro-batch "
                  f"{micro}: {row['img_per_s']:.1f} img/s, model states {row['model_state_bytes'] / 2**20:.2f} MiB/rank",
                  flush=True)
    for r in rows:
        base = [b for b in rows if b["ranks"] == 1 and b["stage"] == r["stage"] and b["bucket_mb"] == r["bucket_mb"]
                and b["micro_batch"] == r["micro_batch"] and b["hosts"] == 1]
        r["scaling_efficiency"] = r["img_per_s"] / (r["ranks"] * base[0]["img_per_s"]) if base else ""
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    pngs = plot(rows, a.out)
    best = max(rows, key=lambda r: (r["img_per_s"], -r["peak_mem_bytes"]))
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write("# Scaling study\n\n")
        f.write(f"`{' '.join(sys.argv)}`: medians of steps {a.warmup + 1}-{a.steps}.\n\n")
        f.write("| hosts | link | ranks | stage | bucket MiB | micro-batch | img/s | efficiency | peak MiB | "
                "model states MiB | MiB sent/step | exposed comm s | hidden |\n|" + " --- |" * 13 + "\n")
        for r in rows:
            eff = f"{r['scaling_efficiency']:.2f}" if r["scaling_efficiency"] != "" else "-"
            hid = f"{100 * r['hidden_fraction']:.0f}%" if r["hidden_fraction"] != "" else "-"
            f.write(f"| {r['hosts']} | {r['link_rate'] or '-'} | {r['ranks']} | {r['stage']} | {r['bucket_mb']:g} | {r['micro_batch']} | {r['img_per_s']:.1f} | "
                    f"{eff} | {r['peak_mem_bytes'] / 2**20:.1f} | {r['model_state_bytes'] / 2**20:.2f} | "
                    f"{r['comm_bytes'] / 2**20:.2f} | {r['comm_exposed_s']:.4f} | {hid} |\n")
        f.write(f"\nBest setting: {best['ranks']} ranks, stage {best['stage']}, bucket {best['bucket_mb']:g} MiB, "
                f"micro-batch {best['micro_batch']}: {best['img_per_s']:.1f} img/s at "
                f"{best['peak_mem_bytes'] / 2**20:.1f} MiB peak per rank.\n")
        for p in pngs:
            f.write(f"\n![{os.path.basename(p)}]({os.path.basename(p)})\n")
    print(f"scaling_study: {len(rows)} configurations -> {a.out}/results.csv, summary.md, {len(pngs)} plots")


if __name__ == "__main__":
    main()
