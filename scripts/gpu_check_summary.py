#!/usr/bin/env python3
"""The tables of a scripts/gpu-check.sh run, from the JSON results its bench stage writes: bench_train_step
--json (ours, default and each switch), bench/train_step_torch.py --json (PyTorch eager and torch.compile),
bench_gemm_cuda --json and bench_depthwise_cuda --json. Files are told apart by their contents ("impl", "variant"), not their names, so the
results of several calls (each call's gpu-check-logs.tar.gz unpacked into its own folder) can be given
together: a later file replaces an earlier one with the same implementation, variant and batch.

  scripts/gpu_check_summary.py LOGS_DIR [LOGS_DIR ...]   print the tables
  scripts/gpu_check_summary.py --strict DIR             also fail on a JSON file that cannot be read
  scripts/gpu_check_summary.py --self-test              check the tables against made-up results

Tables: (1) img/s of ours, PyTorch eager and torch.compile per batch with the ratios, MFU and peak memory (the
side-by-side table of issue 13); (2) each of our switches against our default at the same batch, with a
verdict, which decides the defaults; (3) where our step goes, op by op, and the depthwise convolution's share
against its goal; (4) PyTorch's top operators; (5) the pointwise GEMMs with and without cuBLASLt epilogues;
(6) the depthwise kernels per ConvNeXt-T stage, ours (tiled) and cuDNN's, against their FMA and memory bounds.
"""
import argparse
import glob
import json
import os
import sys
import tempfile

NOISE = 0.03  # relative differences below this are called a tie
DEPTHWISE_GOAL_MS = 3.0  # issue 13: depthwise forward + backward under 3 ms per step at batch 64
IMPL_NAMES = {"convnext_zero": "convnext_zero", "pytorch_eager": "PyTorch eager", "pytorch_compile": "torch.compile"}


def load(dirs, strict):
    """Every result in `dirs`, keyed by (impl, variant, batch); bench_gemm_cuda's under ("gemm", "", 0),
    bench_depthwise_cuda's under ("depthwise", "", 0)."""
    results, errors = {}, []
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "**", "*.json"), recursive=True)):
            try:
                with open(path) as f:
                    r = json.load(f)
                if r.get("impl") in ("gemm", "depthwise"):
                    key = (r["impl"], "", 0)
                else:
                    key = (r["impl"], r.get("variant", ""), int(r["batch"]))
                    float(r["img_per_s"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                errors.append(f"{path}: {type(e).__name__}: {e}")
                continue
            r["_path"] = path
            results[key] = r
    if errors:
        for e in errors:
            print(f"gpu_check_summary: unreadable result {e}", file=sys.stderr)
        if strict:
            sys.exit(1)
    return results


def fmt(v, spec, empty="-"):
    return empty if v is None else format(v, spec)


def ratio(a, b):
    return a / b if a and b else None


def mfu(r, peak):
    if not r or not peak or not r.get("train_flop_per_img"):
        return None
    return r["img_per_s"] * r["train_flop_per_img"] / 1e12 / peak


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def summarize(results, peak):
    lines = []
    ours_default = {b: r for (impl, var, b), r in results.items() if impl == "convnext_zero" and var == ""}
    batches = sorted({b for (impl, _, b) in results if impl not in ("gemm", "depthwise")})
    if not batches:
        return "\n".join(["no training-step results (no bench_train_step / train_step_torch.py JSON found)"] +
                         depthwise_table(results.get(("depthwise", "", 0))))
    any_r = next(r for (impl, _, _), r in results.items() if impl not in ("gemm", "depthwise"))
    compile_modes = sorted({r.get("compile_mode") or "default" for (impl, _, _), r in results.items()
                            if impl == "pytorch_compile"})
    lines.append(f"## Training step: {any_r.get('model', '?')} {any_r.get('dtype', '?')}, "
                 f"{any_r.get('image', '?')} px, img/s (torch.compile mode: {', '.join(compile_modes) or '-'}; "
                 f"MFU against {peak or '?'} TFLOP/s)")
    rows = []
    for b in batches:
        ours = ours_default.get(b)
        eager = results.get(("pytorch_eager", "", b))
        comp = results.get(("pytorch_compile", "", b))
        rows.append([b, fmt(ours and ours["img_per_s"], ".0f"), fmt(eager and eager["img_per_s"], ".0f"),
                     fmt(comp and comp["img_per_s"], ".0f"),
                     fmt(ratio(ours and ours["img_per_s"], eager and eager["img_per_s"]), ".2f"),
                     fmt(ratio(ours and ours["img_per_s"], comp and comp["img_per_s"]), ".2f"),
                     fmt(mfu(ours, peak), ".1%"),
                     " / ".join(fmt(r and r.get("peak_gib"), ".2f") for r in (ours, eager, comp))])
        for (impl, var, bb), r in sorted(results.items()):
            if impl == "convnext_zero" and var and bb == b:
                rows.append([f"{b}, --{var}", fmt(r["img_per_s"], ".0f"), "", "",
                             fmt(ratio(r["img_per_s"], eager and eager["img_per_s"]), ".2f"),
                             fmt(ratio(r["img_per_s"], comp and comp["img_per_s"]), ".2f"), fmt(mfu(r, peak), ".1%"),
                             fmt(r.get("peak_gib"), ".2f")])
    lines.append(table(["batch", "convnext_zero", "PyTorch eager", "torch.compile", "ours / eager",
                        "ours / compiled", "ours MFU", "peak GiB (ours / eager / compiled)"], rows))
    lines.append("Goal (issue 13): ours / eager >= 1.3 and ours / compiled >= 1.0 at every batch, peak memory at "
                 "most PyTorch's.")

    switch_rows = []
    for (impl, var, b), r in sorted(results.items()):
        if impl != "convnext_zero" or not var:
            continue
        base = ours_default.get(b)
        change = ratio(r["img_per_s"], base and base["img_per_s"])
        if change is None:
            verdict = "no default run at this batch to compare with"
        elif change > 1 + NOISE:
            verdict = "faster: make it the default"
        elif change < 1 - NOISE:
            verdict = "slower: keep the default"
        else:
            verdict = f"within {NOISE:.0%}: no reason to change"
        switch_rows.append([f"--{var}", b, fmt(r["img_per_s"], ".0f"), fmt(base and base["img_per_s"], ".0f"),
                            fmt(change and change - 1, "+.1%"), verdict])
    if switch_rows:
        lines += ["", "## Our switches against our default (same batch, same call)",
                  table(["switch", "batch", "img/s", "default img/s", "change", "verdict"], switch_rows)]

    for b in batches:
        for label, r in [("ours", ours_default.get(b))] + [
                (f"ours --{var}", rr) for (impl, var, bb), rr in sorted(results.items())
                if impl == "convnext_zero" and var and bb == b]:
            ops = (r or {}).get("ops") or []
            if not ops:
                continue
            total = r.get("profiled_ms_per_step") or sum(o["ms_per_step"] for o in ops)
            dw = sum(o["ms_per_step"] for o in ops if "depthwise" in o["name"].lower())
            lines += ["", f"## Where our step goes: {label}, batch {b} ({total:.2f} ms/step profiled, "
                          f"{r['ms_per_step']:.2f} ms/step timed)",
                      table(["op", "calls/step", "ms/step", "share"],
                            [[o["name"], f"{o['calls_per_step']:.1f}", f"{o['ms_per_step']:.3f}",
                              f"{o['ms_per_step'] / total:.1%}" if total else "-"] for o in ops[:15]])]
            goal = f" (goal: under {DEPTHWISE_GOAL_MS:g} ms at batch 64)" if b == 64 else ""
            lines.append(f"depthwise convolution, forward + backward: {dw:.2f} ms/step, {dw / total:.1%} of the "
                         f"step{goal}" if total else "")
    for b in batches:
        for impl in ("pytorch_eager", "pytorch_compile"):
            r = results.get((impl, "", b))
            ops = (r or {}).get("ops") or []
            if ops:
                lines += ["", f"## PyTorch's step: {IMPL_NAMES[impl]}, batch {b} (self time per step, from torch.profiler)",
                          table(["operator", "calls/step", "ms/step"],
                                [[o["name"][:60], f"{o['calls_per_step']:.1f}", f"{o['ms_per_step']:.3f}"]
                                 for o in ops[:12]])]

    gemm = results.get(("gemm", "", 0))
    if gemm:
        rows = []
        for g in gemm.get("layers", []):
            f, u = g.get("fused", {}), g.get("unfused", {})
            rows.append([g["name"], f"{g['rows']} x {g['in']} -> {g['out']}",
                         fmt(f.get("fwd_ms"), ".3f"), fmt(u.get("fwd_ms"), ".3f"),
                         fmt(f.get("dw_db_ms"), ".3f"), fmt(u.get("dw_db_ms"), ".3f"),
                         fmt(ratio(u.get("dw_db_ms"), f.get("dw_db_ms")), ".2f")])
        paths = ", ".join(f"{p['dtype']} {p['epilogue']}: {'fused' if p['fused'] else 'UNFUSED'}"
                          for p in gemm.get("paths", []))
        lines += ["", f"## Pointwise GEMMs ({gemm.get('dtype', '?')}, ms), cuBLASLt epilogues fused vs our kernels",
                  f"epilogue paths: {paths or '-'}",
                  table(["layer", "shape", "fwd fused", "fwd unfused", "dw+db fused", "dw+db unfused",
                         "unfused / fused (dw+db)"], rows),
                  "An unfused / fused ratio below 1 for dw+db means BGRADB costs the tall weight-gradient GEMM more "
                  "than a separate column sum: linear_backward should not ask for it on such shapes."]
    lines += depthwise_table(results.get(("depthwise", "", 0)))
    return "\n".join(lines)


def depthwise_table(dw):
    """bench_depthwise_cuda: each stage's forward and backward, tiled and cuDNN, against the larger of the FMA
    and memory bounds (a bound of 0 where the peaks were unknown)."""
    if not dw:
        return []
    rows = []
    for r in dw.get("rows", []):
        fb = max(r["fwd_fma_ms"], r["fwd_mem_ms"])
        bb = max(r["bwd_fma_ms"], r["bwd_mem_ms"])
        rows.append([f"{r['stage']} (C={r['c']}, {r['side']}x{r['side']}, x{r['layers']})", r["path"],
                     f"{r['fwd_ms']:.3f}", f"{fb:.3f}", fmt(ratio(fb, r["fwd_ms"]), ".0%"),
                     f"{r['bwd_ms']:.3f}", f"{bb:.3f}", fmt(ratio(bb, r["bwd_ms"]), ".0%")])
    step = dw.get("step_ms", {})
    return ["", f"## Depthwise 7x7 per ConvNeXt-T stage ({dw.get('dtype', '?')}, batch {dw.get('batch', '?')}; "
                f"bounds from {dw.get('peak_fp32_tflops', 0)} f32 TFLOP/s and {dw.get('peak_gbps', 0)} GB/s)",
            table(["stage", "path", "fwd ms", "fwd bound", "of bound", "bwd ms", "bwd bound", "of bound"], rows),
            f"per step (forward + backward, every layer): tiled {fmt(step.get('tiled'), '.2f')} ms, cuDNN "
            f"{fmt(step.get('cudnn'), '.2f')} ms, bound {fmt(dw.get('step_bound_ms'), '.2f')} ms "
            f"(goal: under {DEPTHWISE_GOAL_MS:g} ms at batch 64)"]


def self_test():
    """Made-up results (the figures of issue 13's first run), through the same code as real ones."""
    def ours(batch, img_s, variant="", ops=None):
        flags = {"depthwise": "cudnn" if variant == "depthwise-cudnn" else "tiled",
                 "gemm_epilogues": variant != "no-gemm-epilogues",
                 "patchify_gemm": variant == "patchify-gemm"}
        return {"impl": "convnext_zero", "variant": variant, "model": "convnext_tiny", "device": "cuda",
                "dtype": "bf16", "batch": batch, "image": 224, "steps": 20, "ms_per_step": 1e3 * batch / img_s,
                "img_per_s": img_s, "train_flop_per_img": 26.76e9, "tflops": 0, "mfu": None, "peak_gib": 9.5,
                "loss": 6.9, "profiled_ms_per_step": 96.0 if ops else 0, "ops": ops or [], **flags}

    def torch(impl, batch, img_s):
        return {"impl": impl, "compile_mode": "default" if impl == "pytorch_compile" else None,
                "model": "convnext_tiny", "dtype": "bf16", "batch": batch, "image": 224, "img_per_s": img_s,
                "ms_per_step": 1e3 * batch / img_s, "peak_gib": 11.0,
                "ops": [{"name": "aten::convolution_backward", "calls_per_step": 18, "ms_per_step": 9.0}]}

    ops = [{"name": "DepthwiseConv2dBackward", "calls_per_step": 18, "ms_per_step": 59.8},
           {"name": "depthwise_conv2d", "calls_per_step": 18, "ms_per_step": 21.8},
           {"name": "LinearBackward", "calls_per_step": 37, "ms_per_step": 3.7}]
    results = [ours(64, 681, ops=ops), ours(128, 543), ours(64, 1469, "depthwise-cudnn"),
               ours(64, 663, "no-gemm-epilogues"), ours(64, 676, "patchify-gemm"),
               torch("pytorch_eager", 64, 2190), torch("pytorch_compile", 64, 3038), torch("pytorch_eager", 128, 2547),
               {"impl": "gemm", "dtype": "bf16", "paths": [{"dtype": "bf16", "epilogue": "BGRADB", "fused": True}],
                "layers": [{"name": "stage1 fc1", "rows": 200704, "in": 96, "out": 384,
                            "fused": {"fwd_ms": 0.1, "dw_db_ms": 0.4}, "unfused": {"fwd_ms": 0.11, "dw_db_ms": 0.2}}]},
               {"impl": "depthwise", "dtype": "bf16", "batch": 64, "image": 224, "peak_fp32_tflops": 67,
                "peak_gbps": 3350, "step_ms": {"tiled": 1.5, "cudnn": 81.6}, "step_bound_ms": 0.65,
                "rows": [{"stage": 1, "c": 96, "side": 56, "layers": 3, "path": "tiled", "fwd_ms": 0.05,
                          "bwd_ms": 0.1, "fwd_fma_ms": 0.028, "fwd_mem_ms": 0.023, "bwd_fma_ms": 0.056,
                          "bwd_mem_ms": 0.035}]}]
    with tempfile.TemporaryDirectory() as d:
        for i, r in enumerate(results):
            with open(os.path.join(d, f"r{i}.json"), "w") as f:
                json.dump(r, f)
        with open(os.path.join(d, "broken.json"), "w") as f:
            f.write("{not json")
        text = summarize(load([d], strict=False), 989.0)
    print(text)
    expect = [
        "| 64 | 681 | 2190 | 3038 | 0.31 | 0.22 | 1.8% | 9.50 / 11.00 / 11.00 |",
        "| 128 | 543 | 2547 | - | 0.21 | - |",  # no torch.compile figure at 128: shown as missing
        "| 64, --depthwise-cudnn | 1469 |  |  | 0.67 | 0.48 |",
        "| --depthwise-cudnn | 64 | 1469 | 681 | +115.7% | faster: make it the default |",
        "| --no-gemm-epilogues | 64 | 663 | 681 | -2.6% | within 3%: no reason to change |",
        "depthwise convolution, forward + backward: 81.60 ms/step, 85.0% of the step (goal: under 3 ms at batch 64)",
        "| aten::convolution_backward | 18.0 | 9.000 |",
        "| stage1 fc1 | 200704 x 96 -> 384 | 0.100 | 0.110 | 0.400 | 0.200 | 0.50 |",
        "| 1 (C=96, 56x56, x3) | tiled | 0.050 | 0.028 | 56% | 0.100 | 0.056 | 56% |",
        "per step (forward + backward, every layer): tiled 1.50 ms, cuDNN 81.60 ms, bound 0.65 ms (goal: under 3 ms at batch 64)",
    ]
    missing = [e for e in expect if e not in text]
    for e in missing:
        print(f"gpu_check_summary: self-test: expected line not found: {e}", file=sys.stderr)
    return 1 if missing else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="*", help="folders holding the JSON results (searched recursively)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="the GPU's dense peak, for the MFU column")
    ap.add_argument("--strict", action="store_true", help="fail on a JSON file that cannot be read")
    ap.add_argument("--self-test", action="store_true", help="check the tables against made-up results")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if not args.dirs:
        ap.error("give at least one folder, or --self-test")
    print(summarize(load(args.dirs, args.strict), args.peak_tflops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
