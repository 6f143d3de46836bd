#!/usr/bin/env python3
"""ZeRO stages side by side: img/s, peak and model-state bytes per rank, bytes sent per step and the hidden
fraction of communication, for each stage and rank count (CPU ranks under mpirun by default).

    python3 bench/zero_stages.py --build build --ranks 1,2,4 --steps 12
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(args, ranks, stage, log):
    app = os.path.join(args.build, "apps", "convnext_zero")
    cmd = [app, "--model", args.model, "--image-size", str(args.image_size), "--micro-batch", str(args.micro_batch),
           "--steps", str(args.steps), "--stage", str(stage), "--data", "synthetic:n=4096,eval_n=16",
           "--num-classes", "10", "--no-progress", "--loader-threads", "1", "--log", log,
           "--device", args.device] + args.extra
    if ranks > 1:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)] + cmd
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    steps = [json.loads(l) for l in open(log) if '"split":"train"' in l]
    return steps[args.warmup:]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--stages", default="0,1,2,3")
    p.add_argument("--model", default="atto")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("extra", nargs="*", help="more convnext_zero flags (after --)")
    args = p.parse_args()
    print("| ranks | stage | img/s | peak MiB/rank | model states MiB/rank | comm MiB/step | comm s | exposed s | hidden |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as d:
        for n in map(int, args.ranks.split(",")):
            for stage in map(int, args.stages.split(",")):
                s = run(args, n, stage, os.path.join(d, f"{n}_{stage}.jsonl"))
                med = lambda k: statistics.median(x[k] for x in s)
                comm, exposed = med("comm_s"), med("comm_exposed_s")
                hidden = f"{100 * (1 - exposed / comm):.0f}%" if n > 1 and comm > 0 else "-"
                print(f"| {n} | {stage} | {med('img_per_s'):.1f} | {med('peak_mem_bytes') / 2**20:.1f} | "
                      f"{med('model_state_bytes') / 2**20:.2f} | {med('comm_bytes') / 2**20:.2f} | {comm:.4f} | "
                      f"{exposed:.4f} | {hidden} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
