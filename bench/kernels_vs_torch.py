#!/usr/bin/env python3
"""Side-by-side: convnext_zero's CPU kernels (bench_kernels) against PyTorch's CPU ops at the same shapes.

Runs `bench_kernels --benchmark_format=json` (or reads a JSON file it wrote), times the PyTorch equivalent
of every benchmark with the same thread count (channels_last convolutions, aten backward ops called
directly, as autograd would call them), and prints a table of times, rates and speedups (torch time / our
time: above 1 means convnext_zero is faster). Medians over repetitions; on a shared machine both sides see
the same noise, so compare ratios from the same run.

  python3 bench/kernels_vs_torch.py                       # build/bench/bench_kernels, all benchmarks
  python3 bench/kernels_vs_torch.py --filter dwconv7 --repetitions 5
  python3 bench/kernels_vs_torch.py --json ours.json      # reuse a saved bench_kernels JSON

When every kernel of a ConvNeXt-atto training step (batch 32, 64 px) was timed, the summary adds up one
step's worth of them on each side (the GEMMs, depthwise convs, LayerNorms, GELUs and patchify convs; not the
elementwise ops, pooling, head, loss or optimizer).
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine_info  # noqa: E402

# Both sides wait passively at OpenMP barriers (Note [Passive OpenMP waits] in bench_kernels.cpp); the OpenMP
# runtime reads this when it loads, so it is set before torch is imported and passed on to bench_kernels.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def run_ours(args):
    if args.json:
        with open(args.json) as f:
            return json.load(f)
    cmd = [args.bench, "--benchmark_format=json", f"--benchmark_min_time={args.min_time}",
           f"--benchmark_repetitions={args.repetitions}", "--benchmark_report_aggregates_only=true"]
    if args.filter:
        cmd.append(f"--benchmark_filter={args.filter}")
    print("running:", " ".join(cmd), file=sys.stderr)
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def median_results(data, clock):
    """name -> (seconds per iteration, counter name, counter value) from the medians (or single runs)."""
    out = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        name = b.get("run_name", b["name"]).removesuffix("/real_time")
        unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b.get("time_unit", "ns")]
        counter = next((k for k in ("FLOP/s", "B/s") if k in b), None)
        value = b.get(counter) if counter else None
        if clock == "cpu" and value:  # bench_kernels computes rates from real time
            value *= b["real_time"] / b["cpu_time"]
        out[name] = (b[f"{clock}_time"] * unit, counter, value)
    return out


def rnd(*shape):
    return torch.rand(*shape) * 2 - 1


def cl(x):
    return x.contiguous(memory_format=torch.channels_last)


def torch_case(name):
    """A no-argument callable running PyTorch's version of benchmark `name`."""
    kind, shape = name.split("/", 1)
    if kind in ("linear_fwd", "linear_bwd"):
        m, k, n = map(int, shape.split("x"))
        x, w, b, gy = rnd(m, k), rnd(n, k), rnd(n), rnd(m, n)
        if kind == "linear_fwd":
            return lambda: F.linear(x, w, b)
        return lambda: (torch.mm(gy, w), torch.mm(gy.t(), x), gy.sum(0))
    if kind.startswith("patchify"):
        mt = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+)_k(\d+)_(\d+)", shape)
        n, h, w_, cin, k, cout = map(int, mt.groups())
        x, w, b = cl(rnd(n, cin, h, w_)), rnd(cout, cin, k, k), rnd(cout)
        if kind == "patchify_fwd":
            return lambda: F.conv2d(x, w, b, stride=k)
        gy = cl(F.conv2d(x, w, b, stride=k).uniform_(-1, 1))
        return lambda: torch.ops.aten.convolution_backward(gy, x, w, [cout], [k, k], [0, 0], [1, 1], False,
                                                           [0, 0], 1, [True, True, True])
    if kind.startswith("block_mlp"):  # "block_mlp[_fwd]/{unfused,fused,fused_tileN}/NxHxWxC": PyTorch's one way
        n, h, w_, c = map(int, shape.split("/")[-1].split("x"))
        m = n * h * w_
        x, w1, b1, w2, b2, gamma = rnd(m, c), rnd(4 * c, c), rnd(4 * c), rnd(c, 4 * c), rnd(c), rnd(c)
        r, g = rnd(m, c), rnd(m, c)
        params = [x, w1, b1, w2, b2, gamma]

        def mlp():
            return r + gamma * F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)

        if kind == "block_mlp_fwd":
            return mlp
        for p in params:
            p.requires_grad_(True)

        def forward_backward():
            with torch.enable_grad():
                torch.autograd.grad(mlp(), params, g)

        return forward_backward
    n, h, w_, c = map(int, shape.split("x"))
    if kind.startswith("dwconv7"):
        x, w, b, gy = cl(rnd(n, c, h, w_)), rnd(c, 1, 7, 7), rnd(c), cl(rnd(n, c, h, w_))
        if kind == "dwconv7_fwd":
            return lambda: F.conv2d(x, w, b, padding=3, groups=c)
        return lambda: torch.ops.aten.convolution_backward(gy, x, w, [c], [1, 1], [3, 3], [1, 1], False, [0, 0], c,
                                                           [True, True, True])
    if kind.startswith("layer_norm"):
        x, w, b, gy = rnd(n * h * w_, c), rnd(c), rnd(c), rnd(n * h * w_, c)
        if kind == "layer_norm_fwd":
            return lambda: torch.ops.aten.native_layer_norm(x, [c], w, b, 1e-6)
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, [c], w, b, 1e-6)
        return lambda: torch.ops.aten.native_layer_norm_backward(gy, x, [c], mean, rstd, w, b, [True, True, True])
    if kind.startswith("gelu"):
        x, gy = rnd(n, h, w_, c), rnd(n, h, w_, c)
        if kind == "gelu_fwd":
            return lambda: F.gelu(x)
        return lambda: torch.ops.aten.gelu_backward(gy, x)
    raise ValueError(f"no PyTorch equivalent for {name}")


def time_torch(fn, min_time, repetitions, clock):
    """Median over repetitions of the mean time per call, each repetition running for at least min_time."""
    now = time.perf_counter if clock == "real" else time.thread_time
    with torch.no_grad():
        fn()
        t0, calls = now(), 0
        while now() - t0 < min(0.05, min_time):
            fn()
            calls += 1
        per_rep = max(1, int(calls * min_time / max(now() - t0, 1e-9)))
        samples = []
        for _ in range(repetitions):
            t0 = now()
            for _ in range(per_rep):
                fn()
            samples.append((now() - t0) / per_rep)
    return statistics.median(samples)


def fmt_rate(counter, value):
    if value is None:
        return "-"
    return f"{value / 1e9:.1f} G{counter}"


def atto_step_counts():
    """How often one ConvNeXt-atto training step (batch 32, 64 px, depths 2-2-6-2, widths 40-80-160-320) runs
    each benchmarked kernel: every forward kernel once per use, every backward kernel likewise."""
    counts = {}
    stages = [(16, 40, 2), (8, 80, 2), (4, 160, 6), (2, 320, 2)]
    for s, (hw, c, depth) in enumerate(stages):
        shape, m = f"32x{hw}x{hw}x{c}", 32 * hw * hw
        # LayerNorms: one per block, plus the stem's (stage 0) and the one before each downsampling conv.
        norms = depth + (s == 0) + (s < 3)
        for d in ("fwd", "bwd"):
            counts[f"dwconv7_{d}/{shape}"] = depth
            counts[f"layer_norm_{d}/{shape}"] = norms
            counts[f"gelu_{d}/32x{hw}x{hw}x{4 * c}"] = depth
            counts[f"linear_{d}/{m}x{c}x{4 * c}"] = depth
            counts[f"linear_{d}/{m}x{4 * c}x{c}"] = depth
            if s < 3:
                counts[f"patchify_{d}/{shape}_k2_{2 * c}"] = 1
    for d in ("fwd", "bwd"):
        counts[f"patchify_{d}/32x64x64x3_k4_40"] = 1
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="build/bench/bench_kernels")
    ap.add_argument("--json", help="read bench_kernels JSON from this file instead of running it")
    ap.add_argument("--filter", default="", help="benchmark name regex, passed to bench_kernels")
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--threads", type=int, help="torch threads (default: bench_kernels' cpu_threads)")
    ap.add_argument("--clock", choices=("real", "cpu"), default="real",
                    help="cpu: compare CPU time of the calling thread, which a loaded machine disturbs less; "
                         "meaningful only with one thread (OMP_NUM_THREADS=1)")
    args = ap.parse_args()

    data = run_ours(args)
    threads = args.threads or int(data.get("context", {}).get("cpu_threads", torch.get_num_threads()))
    torch.set_num_threads(threads)
    if args.clock == "cpu" and threads != 1:
        sys.exit("--clock cpu needs one thread: run with OMP_NUM_THREADS=1")
    ours = median_results(data, args.clock)
    filt = re.compile(args.filter) if args.filter else None

    print(machine_info.describe(with_torch=True))
    print(f"torch {torch.__version__}, {threads} threads, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, "
          f"{args.clock} time; medians of {args.repetitions} repetitions; "
          f"speedup = torch time / convnext_zero time")
    header = f"{'benchmark':44} {'ours ms':>9} {'torch ms':>9} {'ours rate':>14} {'torch rate':>14} {'speedup':>8}"
    print(header)
    print("-" * len(header))
    by_kind, times = {}, {}
    for name, (t_ours, counter, value) in ours.items():
        if filt and not filt.search(name):
            continue
        t_torch = time_torch(torch_case(name), args.min_time, args.repetitions, args.clock)
        torch_value = value * t_ours / t_torch if value else None
        speedup = t_torch / t_ours
        times[name] = (t_ours, t_torch)
        kind = name.rsplit("/", 1)[0] if name.startswith("block_mlp") else name.split("/")[0]
        by_kind.setdefault(kind, []).append(speedup)
        print(f"{name:44} {t_ours * 1e3:9.3f} {t_torch * 1e3:9.3f} {fmt_rate(counter, value):>14} "
              f"{fmt_rate(counter, torch_value):>14} {speedup:7.2f}x", flush=True)
    print()
    print("geometric-mean speedup per kernel:")
    for kind, s in by_kind.items():
        print(f"  {kind:16} {math.exp(sum(map(math.log, s)) / len(s)):5.2f}x over {len(s)} shapes")
    counts = atto_step_counts()
    if all(name in times for name in counts):
        ours_ms = sum(n * times[name][0] for name, n in counts.items()) * 1e3
        torch_ms = sum(n * times[name][1] for name, n in counts.items()) * 1e3
        print(f"\nConvNeXt-atto training step (batch 32, 64 px), these kernels only: convnext_zero {ours_ms:.1f} ms, "
              f"torch {torch_ms:.1f} ms, speedup {torch_ms / ours_ms:.2f}x")
        for kind in sorted({name.split("/")[0] for name in counts}):
            o = sum(n * times[k][0] for k, n in counts.items() if k.startswith(kind + "/")) * 1e3
            t = sum(n * times[k][1] for k, n in counts.items() if k.startswith(kind + "/")) * 1e3
            print(f"  {kind:16} {o:8.2f} ms {t:8.2f} ms {t / o:6.2f}x")


if __name__ == "__main__":
    main()
