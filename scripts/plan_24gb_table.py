#!/usr/bin/env python3
"""The seeds' question as tables (docs/planning.md): ConvNeXt-T/S/B/L/XL at 224 px, bf16, on 24 GB GPUs.

For each model: the largest micro-batch per GPU that fits (convnext_zero --plan --gpu-mem) on 1 and on 8 ranks
at ZeRO stages 0-3, without and with CPU offload and activation checkpointing; and the img/s the what-if model
predicts (convnext_zero --plan --what-if TOPOLOGY) on 1 and on 8 GPUs at each stage, at the largest micro-batch
that fits without checkpointing or offload (capped at --cap). Every figure is planned, none measured.

    scripts/plan_24gb_table.py --app build/apps/convnext_zero --topo tests/dist/data/dual_socket_8gpu.json
"""
import argparse
import json
import shlex
import subprocess

MODELS = ["tiny", "small", "base", "large", "xlarge"]


def run(app, *args):
    out = subprocess.run([app, "--plan", "--json", "--image-size", "224", "--device", "cuda", "--precision", "bf16",
                          "--num-classes", "1000", *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def largest(app, model, ranks, mem):
    j = run(app, "--model", model, "--ranks", str(ranks), "--gpu-mem", mem, "--micro-batch", "1")
    return {(m["stage"], m["offload"], m["activation_checkpointing"]): m["micro_batch"] for m in j["max_micro_batch"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--app", default="build/apps/convnext_zero")
    ap.add_argument("--topo", default="tests/dist/data/dual_socket_8gpu.json")
    ap.add_argument("--gpu-mem", default="24564MiB", help="an RTX 4090's memory")
    ap.add_argument("--cap", type=int, default=128, help="largest micro-batch timed")
    ap.add_argument("--extra", default="", help="more flags for the what-if, e.g. --extra='--reduce-dtype bf16'")
    a = ap.parse_args()

    print("Largest micro-batch per GPU (plain / checkpointing / offload / offload + checkpointing):\n")
    print("| model | ranks | stage 0 | stage 1 | stage 2 | stage 3 |")
    print("| --- | --- | --- | --- | --- | --- |")
    fits = {}
    for model in MODELS:
        for ranks in (1, 8):
            mb = largest(a.app, model, ranks, a.gpu_mem)
            fits[model, ranks] = mb
            cells = [" / ".join(str(mb[s, off, ck]) for off, ck in ((False, False), (False, True), (True, False),
                                                                       (True, True))) for s in range(4)]
            print("| %s | %d | %s |" % (model, ranks, " | ".join(cells)))

    print("\nPredicted img/s (micro-batch per GPU in brackets), 1 GPU and 8 GPUs over PCIe (%s):\n" % a.topo)
    print("| model | 1 GPU | 8 GPUs stage 0 | stage 1 | stage 2 | stage 3 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for model in MODELS:
        cells = []
        for ranks, stages in ((1, [0]), (8, [0, 1, 2, 3])):
            for s in stages:
                b = min(fits[model, ranks][s, False, False], a.cap)
                if b == 0:
                    cells.append("does not fit")
                    continue
                j = run(a.app, "--model", model, "--micro-batch", str(b), "--what-if", a.topo, "--stage", str(s),
                        *shlex.split(a.extra))
                row = next(r for r in j["rows"] if r["stage"] == s and r["ranks"] == ranks)
                cells.append("%.0f (%d)" % (row["img_per_s"], b))
                compute = j["compute"]["provenance"]
        print("| %s | %s |" % (model, " | ".join(cells)))
    print("\nCompute: " + compute)


if __name__ == "__main__":
    main()
