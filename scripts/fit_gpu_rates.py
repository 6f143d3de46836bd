#!/usr/bin/env python3
"""The fit behind the what-if model's built-in RTX 4090 rates (Note [RTX 4090 rates], docs/planning.md).

timm posts ConvNeXt training throughput on an RTX 3090 (results/benchmark-train-amp-nhwc-pt112-cu113-
rtx3090.csv: AMP, channels-last, PyTorch 1.12). This script times the same models and batches with the
what-if model (convnext_zero --plan --what-if, one GPU, stage 0) from the 3090's spec sheet (71 dense fp16/bf16
tensor TFLOP/s with fp32 accumulation, 936 GB/s) times a grid of efficiencies, keeps the efficiencies with the
least squared log error, and prints each model's residual and the RTX 4090 figure the same efficiencies give
from its own spec sheet (165.2 TFLOP/s, 1008 GB/s).

    scripts/fit_gpu_rates.py --app build/apps/convnext_zero
"""
import argparse
import itertools
import json
import math
import os
import subprocess
import tempfile

# model: (img/s, batch) from timm's table.
TIMM_3090 = {"tiny": (819.24, 256), "small": (487.15, 192), "base": (338.68, 128), "large": (187.93, 96),
             "xlarge": (116.37, 64)}
ONE_GPU = {"nodes": [{"id": "host0", "type": "host", "up_gbps": 12.5},
                     {"id": "cpu0", "type": "cpu", "parent": "host0", "up_gbps": 20},
                     {"id": "gpu0", "type": "gpu", "parent": "cpu0", "up_gbps": 24, "rank": 0}]}


def predict(app, work, model, batch, eff, overhead_us, tflops, gbps):
    table = {"device": "fit", "matmul_tflops": tflops, "memory_gbps": gbps, "op_overhead_us": overhead_us,
             "efficiency": {"matmul": eff[0], "memory": eff[1], "depthwise": eff[2]}}
    with open(os.path.join(work, "rates.json"), "w") as f:
        json.dump(table, f)
    out = subprocess.run([app, "--plan", "--what-if", os.path.join(work, "topo.json"), "--compute-table",
                          os.path.join(work, "rates.json"), "--model", model, "--image-size", "224",
                          "--micro-batch", str(batch), "--device", "cuda", "--precision", "bf16",
                          "--num-classes", "1000", "--json"], capture_output=True, text=True, check=True).stdout
    return next(r for r in json.loads(out)["rows"] if r["stage"] == 0)["img_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--app", default="build/apps/convnext_zero")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "topo.json"), "w") as f:
            json.dump(ONE_GPU, f)
        best = None
        for mm, mem, dw, ovh in itertools.product([0.6, 0.7, 0.8, 0.9], [0.3, 0.4, 0.5, 0.6],
                                                  [0.06, 0.1, 0.15, 0.2], [5]):
            err = sum(math.log(predict(a.app, work, m, b, (mm, mem, dw), ovh, 71, 936) / v) ** 2
                      for m, (v, b) in TIMM_3090.items())
            if best is None or err < best[0]:
                best = (err, (mm, mem, dw), ovh)
        err, eff, ovh = best
        print("efficiency matmul %.2f memory %.2f depthwise %.2f, op overhead %g us, rms log error %.1f%%" %
              (*eff, ovh, 100 * math.sqrt(err / len(TIMM_3090))))
        print("| model | batch | timm RTX 3090 img/s | model RTX 3090 | residual | model RTX 4090 |")
        print("| --- | --- | --- | --- | --- | --- |")
        for m, (v, b) in TIMM_3090.items():
            p = predict(a.app, work, m, b, eff, ovh, 71, 936)
            q = predict(a.app, work, m, b, eff, ovh, 165.2, 1008)
            print("| %s | %d | %.0f | %.0f | %+.1f%% | %.0f |" % (m, b, v, p, 100 * (p / v - 1), q))


if __name__ == "__main__":
    main()
