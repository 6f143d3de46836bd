#!/usr/bin/env python3
"""Issue 21's figures on the test bed of hosts: 2 hosts x 2 ranks of convnext_zero at several link rates, for
flat ZeRO stages 0-3, the node-aware (two-level) collectives, HSDP (--shard-group host) and hpZ (--hpz):
img/s, step time, comm_s / comm_exposed_s, the bytes each host really sent per step (veth counters) next to
the engine's own count, and the what-if model's predicted step time for the same run. Writes a CSV and a plot.

Issue 22's rows: q8g_s3 (stage 3, --gather-dtype int8) and q8_s3 (and --reduce-dtype int8), e.g.
  CZ_HOSTS_BED=qt python3 bench/hosts_mesh.py --models atto --rates 1gbit,200mbit \
      --settings flat_s3,q8g_s3,q8_s3 --out bench/results/hosts-quant-$(date +%F)/hosts_quant

Run as root from the repository:  python3 bench/hosts_mesh.py [--build build] [--models atto,femto]
    [--rates 10gbit,1gbit,200mbit] [--settings ...] [--out bench/results/hosts-mesh-<date>/hosts_mesh]

Bytes per step: two runs of A and B steps, (host 1's veth tx after the B run - after the A run) / (B - A), so
start-up (wire-up, the initial broadcast) and the final evaluation cancel. img/s and times: the mean over the
B run's steps after the first two, and
the step on the clock, (wall time of the B run - that of the A run) / (B - A), from which img/s is taken.
Each rank gets OMP_NUM_THREADS = max(1, cores / ranks) (hosts.sh run); the 4 ranks share this machine's cores, so compute is that of a quarter of the machine per rank: the what-if model
is given a compute profile per model measured on one thread alone and scaled to a rank's share of the cores,
together with what a rank's cores spend on messages
(comm_cpu, measured with commbench: Note [CPU ranks pay for their messages]). Each row records the load average
beside it: run on a quiet machine. Where the kernel groups processes by session (sched_autogroup_enabled=1),
`nice` shields nothing from another session's compiler; the figures in bench/results/hosts-*-2026-11-25 were taken with autogroup
off and the bed at nice -10.
"""
import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from runs import dated_results, log_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS = os.path.join(ROOT, "scripts", "hosts.sh")

# name -> flags beyond the common ones
SETTINGS = {
    "flat_s0": ["--stage", "0", "--comm-impl", "flat"],
    "flat_s1": ["--stage", "1", "--comm-impl", "flat"],
    "flat_s2": ["--stage", "2", "--comm-impl", "flat"],
    "flat_s3": ["--stage", "3", "--comm-impl", "flat"],
    "hier_s0": ["--stage", "0", "--comm-impl", "hier"],
    "hier_s2": ["--stage", "2", "--comm-impl", "hier"],
    "hier_s3": ["--stage", "3", "--comm-impl", "hier"],
    "hsdp_s2": ["--stage", "2", "--shard-group", "host", "--comm-impl", "flat"],
    "hsdp_s3": ["--stage", "3", "--shard-group", "host", "--comm-impl", "flat"],
    "hpz_s3": ["--stage", "3", "--hpz", "--comm-impl", "flat"],
    "auto_s3": ["--stage", "3"],  # the default: --comm-impl auto
    # Issue 22: quantized communication on the flat ring (docs/zero.md, "Quantized blocks").
    "q8g_s3": ["--stage", "3", "--gather-dtype", "int8", "--comm-impl", "flat"],
    "q8_s3": ["--stage", "3", "--gather-dtype", "int8", "--reduce-dtype", "int8", "--comm-impl", "flat"],
    # Issue 34: the same with the two-hop quantized reduction (and two-level gathers of the records).
    "q8h_s3": ["--stage", "3", "--gather-dtype", "int8", "--reduce-dtype", "int8", "--comm-impl", "hier"],
    # ... with auto (the default): the two hops for the reductions, the cost model's choice for the gathers.
    "q8a_s3": ["--stage", "3", "--gather-dtype", "int8", "--reduce-dtype", "int8"],
    # Stage 0's quantized all-reduce, flat and in two hops (Note [Two-hop quantized all-reduce]).
    "q8_s0": ["--stage", "0", "--reduce-dtype", "int8", "--comm-impl", "flat"],
    "q8h_s0": ["--stage", "0", "--reduce-dtype", "int8", "--comm-impl", "hier"],
}
RATE_GBPS = {"10gbit": 10.0, "1gbit": 1.0, "200mbit": 0.2}


def sh(args, **kw):
    return subprocess.run(args, check=True, text=True, capture_output=True, **kw).stdout


def host_tx(host):
    # "h1 tx_bytes T rx_bytes R"
    return int(sh([HOSTS, "bytes", str(host)]).split()[2])


def common_flags(model, micro_batch):
    return ["--model", model, "--image-size", "64", "--micro-batch", str(micro_batch), "--data",
            "synthetic:n=4096,eval_n=64", "--no-progress", "--loader-threads", "1", "--eval-every", "0"]


def train_run(build, flags, steps, log):
    """Runs convnext_zero across the bed; returns its wall-clock seconds."""
    cmd = [HOSTS, "run", os.path.join(build, "apps", "convnext_zero")] + flags + ["--steps", str(steps), "--log", log]
    t0 = time.monotonic()
    r = subprocess.run(cmd, text=True, capture_output=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return wall


def measure(build, model, micro_batch, setting, a, b, work):
    flags = common_flags(model, micro_batch) + SETTINGS[setting]
    tx, wall = {}, {}
    for steps in (a, b):
        before = [host_tx(1), host_tx(2)]
        wall[steps] = train_run(build, flags, steps, os.path.join(work, f"{model}_{setting}_{steps}.jsonl"))
        after = [host_tx(1), host_tx(2)]
        tx[steps] = [x - y for x, y in zip(after, before)]
    recs = log_records(os.path.join(work, f"{model}_{setting}_{b}.jsonl"))[2:]
    mean = lambda k: sum(float(r.get(k, 0)) for r in recs) / len(recs)
    per_step = [(tx[b][h] - tx[a][h]) / (b - a) for h in range(2)]
    last = recs[-1]
    # A step on the clock: the B run's wall time less the A run's, per step (start-up and the final evaluation
    # cancel); the logged step_time_s beside it.
    step_s = (wall[b] - wall[a]) / (b - a)
    return {
        "img_per_s": micro_batch * 4 / step_s,
        "step_s": step_s,
        "logged_step_s": mean("step_time_s"),
        "comm_s": mean("comm_s"),
        "comm_exposed_s": mean("comm_exposed_s"),
        "engine_bytes_rank0": float(last.get("comm_bytes", 0)),
        # comm_cross_bytes: rank 0's share of what its host sends to other hosts; the hosts' ranks are alike
        "engine_cross_bytes_host": 2 * float(last.get("comm_cross_bytes", 0)),
        "veth_tx_host1": per_step[0],
        "veth_tx_host2": per_step[1],
    }


def commbench_row(build, cmd, op, size, env):
    """commbench's result for one size of a ring collective, out-of-place and in-place averaged:
    (time_us, busbw GB/s). Bus bandwidth is the bytes a rank sends (and receives) per second."""
    out = subprocess.run(cmd + [os.path.join(build, "apps", "commbench"), "-o", op, "-b", size, "-e", size,
                                "--impl", "ring", "-n", "20", "-w", "3", "--json"],
                         env=env, check=True, text=True, capture_output=True).stdout
    r = json.loads(out[out.index("{"):])["results"][0]
    mean = lambda k: (r["out_of_place"][k] + r["in_place"][k]) / 2
    return mean("time_us"), mean("busbw_GBps")


def measure_comm_cpu(build, ranks=4):
    """What a rank's share of the cores spends on messages (Note [CPU ranks pay for their messages] in
    src/dist/plan/what_if.cpp), measured like the bed runs: `ranks` ranks with one thread each on this machine,
    8 MiB ring collectives, the median of 3 runs. Shared memory: the ranks on one host. Network: each rank a
    host of its own on an unshaped bed, so every ring hop is TCP over a veth and the cores, not the link, set
    the rate. Reduction: the reduce-scatter's extra time over the all-gather's, per byte. A ring step's fixed
    time: a 4 KiB all-gather on the bed of 2 hosts x 2 ranks (this script's), over its ranks - 1 steps."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    local = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), "-x", "OMP_NUM_THREADS"]
    median = lambda f: sorted(f() for _ in range(3))[1]
    busbw = lambda cmd, op, e: median(lambda: commbench_row(build, cmd, op, "8M", e)[1])
    shm_ag = busbw(local, "all_gather", env)
    shm_rs = busbw(local, "reduce_scatter", env)
    bed = dict(env, CZ_HOSTS_BED="meshcal")
    net_ag = busbw([HOSTS, "with", str(ranks), "1", "--", HOSTS, "run"], "all_gather", bed)
    step_us = median(lambda: commbench_row(build, [HOSTS, "run"], "all_gather", "4K", env)[0]) / (ranks - 1)
    c = {"network_gbps": net_ag, "shared_memory_gbps": shm_ag,
         "reduce_gbps": 1 / max(1 / shm_rs - 1 / shm_ag, 1e-6), "step_us": step_us,
         "source": f"commbench ring collectives, {ranks} ranks x 1 thread on {os.cpu_count()} cores, median of 3 "
                   "(bench/hosts_mesh.py)"}
    print(f"# messages on the cores: network {c['network_gbps']:.2f} GB/s, shared memory {c['shared_memory_gbps']:.2f} "
          f"GB/s, reductions {c['reduce_gbps']:.2f} GB/s per rank, {step_us:.0f} us a ring step", file=sys.stderr,
          flush=True)
    return c


def measure_profile(build, model, micro_batch, work):
    """bench_train_step --profile of one process with one thread, alone on the machine. (Four profiles taken
    at once instead gave 73-116 ms a step for the same atto configuration, as the processes finished at
    different times.)"""
    f = os.path.join(work, f"profile_{model}.json")
    subprocess.run([os.path.join(build, "bench", "bench_train_step"), "--model", model, "--batch", str(micro_batch),
                    "--image", "64", "--warmup", "3", "--steps", "8", "--profile", "6", "--json", f],
                   env=dict(os.environ, OMP_NUM_THREADS="1"), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    prof = json.load(open(f))
    print(f"# profile {model}: {prof['ms_per_step']:.1f} ms a step alone on one thread", file=sys.stderr, flush=True)
    return prof


def compute_table(calibration, model, work, ranks=4):
    """The what-if's compute table for a bed rank: the model's profile scaled to a rank's share of the cores
    (cores / ranks: the bed's ranks all share this machine's cores) with scale_from / scale_to, and the
    messages' cost on those cores."""
    share = min(1.0, calibration["cores"] / ranks)
    table = {"profile": calibration["profiles"][model], "scale_from": {"matmul_tflops": 1.0, "memory_gbps": 1.0},
             "scale_to": {"device": f"cpu, {share:g} core per rank", "matmul_tflops": share, "memory_gbps": share},
             "comm_cpu": calibration["comm_cpu"]}
    out = os.path.join(work, f"table_{model}.json")
    with open(out, "w") as g:
        json.dump(table, g)
    return out


def predict(build, model, micro_batch, setting, topo, profile):
    flags = common_flags(model, micro_batch) + SETTINGS[setting]
    stage = flags[flags.index("--stage") + 1]
    cmd = [os.path.join(build, "apps", "convnext_zero"), "--plan", "--what-if", topo, "--json"] + flags
    if profile:
        cmd += ["--compute-table", profile]
    r = subprocess.run(cmd, text=True, capture_output=True)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
    w = json.loads(r.stdout)
    for row in w["rows"]:
        if str(row["stage"]) == stage and row["ranks"] == 4:
            return row["step_s"], ""
    return None, "no row for 4 ranks"


def topology_file(rate, work):
    """The test bed as a topology (src/dist/comm/topology.h): 2 hosts, each a cpu with 2 CPU ranks; a host's
    network link is the tc rate."""
    nodes = []
    for h in range(2):
        nodes.append({"id": f"host{h}", "type": "host", "up_gbps": RATE_GBPS[rate] / 8})
        nodes.append({"id": f"cpu{h}", "type": "cpu", "parent": f"host{h}", "up_gbps": 20})
        nodes.append({"id": f"proc{h}", "type": "proc", "parent": f"cpu{h}", "up_gbps": 20, "ranks": [2 * h, 2 * h + 1]})
    path = os.path.join(work, f"bed_{rate}.json")
    with open(path, "w") as f:
        json.dump({"nodes": nodes}, f)
    return path


def calibrate(args, work):
    """Everything the what-if needs about this machine, measured once and kept beside the CSV
    (OUT_calibration.json), so that --predict-only can redo the predictions of a measured CSV."""
    c = {"cores": os.cpu_count(), "comm_cpu": measure_comm_cpu(args.build), "profiles": {}}
    for model in args.models.split(","):
        c["profiles"][model] = measure_profile(args.build, model, args.micro_batch, work)
    with open(args.out + "_calibration.json", "w") as f:
        json.dump(c, f, indent=1)
    return c


def predict_rows(args, rows, calibration, work):
    """Fills in each row's predicted step time (and its ratio to the measured one)."""
    for row in rows:
        topo = topology_file(row["rate"], work)
        table = compute_table(calibration, row["model"], work)
        pred, why = predict(args.build, row["model"], args.micro_batch, row["setting"], topo, table)
        row["predicted_step_s"] = pred if pred is not None else ""
        row["predicted_note"] = why
        row["predicted_over_measured"] = pred / float(row["step_s"]) if pred and row.get("step_s") else ""


def write_csv(rows, out):
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def inner(args):
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    work = tempfile.mkdtemp(prefix="hosts_mesh_")
    calibration = calibrate(args, work)
    rows = []
    for rate in args.rates.split(","):
        sh([HOSTS, "shape", rate])
        for model in args.models.split(","):
            for setting in args.settings.split(","):
                print(f"# {rate} {model} {setting}", file=sys.stderr, flush=True)
                try:
                    m = measure(args.build, model, args.micro_batch, setting, args.a, args.b, work)
                except RuntimeError as e:
                    print(str(e), file=sys.stderr)
                    m = None
                row = {"rate": rate, "model": model, "setting": setting, "load_1m": os.getloadavg()[0]}
                if m:
                    row.update(m)
                    row["engine_vs_veth"] = (m["engine_cross_bytes_host"] / m["veth_tx_host1"]
                                             if m["engine_cross_bytes_host"] and m["veth_tx_host1"] else "")
                predict_rows(args, [row], calibration, work)
                rows.append(row)
                print(json.dumps(row), flush=True)
    write_csv(rows, args.out)
    plot(rows, args.out + ".png")
    print(f"wrote {args.out}.csv and {args.out}.png", file=sys.stderr)


LABELS = {"flat_s0": "flat s0", "flat_s1": "flat s1", "flat_s2": "flat s2", "flat_s3": "flat s3",
          "hier_s0": "hier s0", "hier_s2": "hier s2", "hier_s3": "hier s3", "hsdp_s2": "HSDP s2",
          "hsdp_s3": "HSDP s3", "hpz_s3": "hpZ s3", "auto_s3": "auto s3", "q8g_s3": "int8 gathers s3",
          "q8_s3": "int8 both s3", "q8h_s3": "int8 both s3, two hops",
          "q8a_s3": "int8 both s3, auto", "q8_s0": "int8 s0", "q8h_s0": "int8 s0, two hops"}
RATE_LABELS = {"10gbit": "10 Gbit/s", "1gbit": "1 Gbit/s", "200mbit": "200 Mbit/s"}


def markdown(rows):
    """The docs' tables from a CSV: img/s per setting with the best over flat stage 3, then predicted /
    measured step time."""
    settings = [s for s in SETTINGS if any(r["setting"] == s for r in rows)]
    keys = []
    for r in rows:
        if (r["rate"], r["model"]) not in keys:
            keys.append((r["rate"], r["model"]))
    at = {(r["rate"], r["model"], r["setting"]): r for r in rows}
    head = "| link | model | " + " | ".join(LABELS[s] for s in settings)
    sep = "| --- | --- | " + " | ".join("---" for _ in settings)
    out = ["img/s (4 ranks):", "", head + " | best unquantized / flat s3 |", sep + " | --- |"]
    for rate, model in keys:
        ips = {s: float(at[rate, model, s]["img_per_s"]) for s in settings if at.get((rate, model, s), {}).get("img_per_s")}
        # issue 21's goal: the best unquantized setting (the int8 columns are issue 22's)
        best = max((s for s in ips if s != "flat_s3" and not s.startswith("q8")), key=ips.get)
        cells = " | ".join(f"{ips[s]:.1f}" if s in ips else "-" for s in settings)
        out.append(f"| {RATE_LABELS.get(rate, rate)} | {model} | {cells} | {ips[best] / ips['flat_s3']:.2f} ({LABELS[best]}) |")
    out += ["", "Predicted / measured step time:", "", head + " |", sep + " |"]
    for rate, model in keys:
        cells = []
        for s in settings:
            v = at.get((rate, model, s), {}).get("predicted_over_measured")
            cells.append(f"{float(v):.2f}" if v else "-")
        out.append(f"| {RATE_LABELS.get(rate, rate)} | {model} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def predict_only(args):
    """Redoes the predictions of a measured CSV with its saved calibration (after a change to the model)."""
    base = os.path.splitext(args.predict_only)[0]
    with open(args.predict_only) as f:
        rows = list(csv.DictReader(f))
    with open(base + "_calibration.json") as f:
        calibration = json.load(f)
    predict_rows(args, rows, calibration, tempfile.mkdtemp(prefix="hosts_mesh_"))
    write_csv(rows, base)
    plot(rows, base + ".png")
    ratios = [float(r["predicted_over_measured"]) for r in rows if r.get("predicted_over_measured")]
    within = sum(abs(x - 1) <= 0.2 for x in ratios)
    print(f"predicted / measured: {min(ratios):.2f}-{max(ratios):.2f}, {within} of {len(ratios)} rows within 20%; "
          f"wrote {base}.csv and {base}.png", file=sys.stderr)
    return 0


def plot(rows, path):
    try:
        import matplotlib
    except ImportError:  # a pyenv or venv python3: Debian's has python3-matplotlib
        csv_path = os.path.splitext(path)[0] + ".csv"
        if subprocess.call(["/usr/bin/python3", os.path.abspath(__file__), "--plot-only", csv_path]) != 0:
            print(f"hosts_mesh: no plot ({sys.executable} and /usr/bin/python3 lack matplotlib)", file=sys.stderr)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = sorted({r["model"] for r in rows})
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        width = 0.8 / len(settings)
        for i, s in enumerate(settings):
            ys = []
            for rate in rates:
                v = [r.get("img_per_s", 0) for r in rows if r["model"] == model and r["rate"] == rate and r["setting"] == s]
                ys.append(float(v[0]) if v and v[0] != "" else 0)
            ax.bar([x + i * width for x in range(len(rates))], ys, width, label=s)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rates))])
        ax.set_xticklabels(rates)
        ax.set_ylabel("img/s (4 ranks)")
        ax.set_title(f"ConvNeXt-{model}, 64 px, 2 hosts x 2 ranks")
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--models", default="atto,femto")
    p.add_argument("--rates", default="10gbit,1gbit,200mbit")
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--a", type=int, default=4, help="steps of the short run")
    p.add_argument("--b", type=int, default=20, help="steps of the long run")
    p.add_argument("--out", default=os.path.join(dated_results("hosts-mesh"), "hosts_mesh"))
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--plot-only", metavar="CSV", help="only draw the plot of an earlier run's CSV (next to it)")
    p.add_argument("--markdown", metavar="CSV", help="print the docs' tables of an earlier run's CSV")
    p.add_argument("--predict-only", metavar="CSV",
                   help="redo the what-if predictions of an earlier run's CSV with its CSV_calibration.json, in place")
    args = p.parse_args()
    args.build = os.path.abspath(args.build)
    if args.plot_only:
        with open(args.plot_only) as f:
            plot(list(csv.DictReader(f)), os.path.splitext(args.plot_only)[0] + ".png")
        return 0
    if args.predict_only:
        return predict_only(args)
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown(list(csv.DictReader(f))))
        return 0
    for s in args.settings.split(","):
        if s not in SETTINGS:
            p.error(f"--settings: unknown setting '{s}' (known: {', '.join(SETTINGS)})")
    if args.inner:
        return inner(args)
    os.environ.setdefault("CZ_HOSTS_BED", "mesh")
    cmd = [HOSTS, "with", "2", "2", "--", sys.executable, os.path.abspath(__file__), "--inner"] + sys.argv[1:]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
