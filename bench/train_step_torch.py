#!/usr/bin/env python3
"""The PyTorch peer of bench_train_step: one timm ConvNeXt training step (forward, label-smoothed
cross-entropy, backward, AdamW) in eager mode or with the model under torch.compile, channels_last, with
autocast bf16/f16 compute on fp32 parameters (or plain f32), on synthetic data of the same shapes. Prints
img/s and writes a JSON line like bench_train_step's (with --profile, the top operators by device time too),
so scripts/gpu-check.sh can put them side by side.

  python3 bench/train_step_torch.py --model tiny --device cuda --dtype bf16 --batch 64 --json torch.json
  python3 bench/train_step_torch.py --compile default --batch 64 --json compiled.json
"""
import argparse
import json
import sys
import time

import torch
import timm


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="timm ConvNeXt variant, with or without 'convnext_'")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["f32", "bf16", "f16"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--threads", type=int, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 in f32 matmuls/convolutions")
    ap.add_argument("--json", help="also write the result to this file")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after timing, N more steps under torch.profiler: the top operators by device time")
    ap.add_argument("--compile", metavar="MODE", choices=["default", "reduce-overhead", "max-autotune",
                                                          "max-autotune-no-cudagraphs"],
                    help="run the model under torch.compile in this mode (the optimizer step stays eager); "
                         "compilation happens in the warm-up steps, which are timed apart (warmup_s)")
    args = ap.parse_args()
    if args.compile and args.warmup < 3:
        ap.error("--compile needs --warmup 3 or more (compilation, then CUDA graph recording, happen there)")

    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.model if args.model.startswith("convnext_") else "convnext_" + args.model
    dev = torch.device(args.device)
    # Same numerics switches as ours: no TF32 unless asked; cuDNN picks algorithms by timing, as with
    # bench_train_step's default --conv-benchmark.
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cudnn.benchmark = True

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=args.classes).to(dev)
    model = model.to(memory_format=torch.channels_last).train()
    # The parameters stay the eager module's, so the optimizer and its weight-decay groups are unchanged.
    run_model = torch.compile(model, mode=args.compile) if args.compile else model
    # timm's weight-decay rule: no decay on 1-d parameters and biases (as optim/param_groups.h).
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and not n.endswith(".bias")]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim > 1 and not n.endswith(".bias"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, foreach=True)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)

    images = torch.randn(args.batch, 3, args.image, args.image, device=dev).to(memory_format=torch.channels_last)
    labels = torch.randint(0, args.classes, (args.batch,), device=dev)
    amp_dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(args.dtype)
    scaler = torch.amp.GradScaler(enabled=args.dtype == "f16")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            loss = loss_fn(run_model(images).float(), labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    t_warm = time.perf_counter()
    for _ in range(args.warmup):
        step()
    sync()
    warmup_s = time.perf_counter() - t_warm
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync()
    seconds = time.perf_counter() - t0
    img_s = args.batch * args.steps / seconds
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else 0.0
    impl = "pytorch_compile" if args.compile else "pytorch_eager"
    result = {"impl": impl, "compile_mode": args.compile, "model": name, "device": args.device,
              "dtype": args.dtype, "batch": args.batch, "image": args.image, "steps": args.steps,
              "ms_per_step": 1e3 * seconds / args.steps, "img_per_s": img_s, "peak_gib": peak,
              "warmup_s": warmup_s, "loss": float(loss.detach()), "torch": torch.__version__,
              "timm": timm.__version__, "ops": []}
    mode = f" (torch.compile, mode {args.compile})" if args.compile else " (eager)"
    print(f"train_step_torch: {name}{mode} {args.device} {args.dtype} batch {args.batch} image {args.image}: "
          f"{result['ms_per_step']:.2f} ms/step, {img_s:.1f} img/s, peak {peak:.2f} GiB, "
          f"loss {float(loss.detach()):.4f}; warm-up {warmup_s:.1f} s")
    write_json(args.json, result)  # again below with the operators, should profiling fail
    if args.profile > 0:
        # The peer of bench_train_step --profile: where PyTorch's step goes, aten operator by operator.
        acts = [torch.profiler.ProfilerActivity.CPU]
        if dev.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(args.profile):
                step()
            sync()
        keys = ["self_device_time_total", "self_cuda_time_total"] if dev.type == "cuda" else ["self_cpu_time_total"]
        for key in keys:  # the device key's name changed across PyTorch versions
            try:
                table = prof.key_averages().table(sort_by=key, row_limit=20)
            except (AttributeError, KeyError, ValueError):
                continue
            print(f"train_step_torch: top operators over {args.profile} profiled steps, by {key}")
            print(table)
            result["ops"] = top_ops(prof.key_averages(), key, args.profile)
            break
        write_json(args.json, result)
    return 0


def write_json(path, result):
    if path:
        with open(path, "w") as f:
            f.write(json.dumps(result) + "\n")


def top_ops(averages, key, steps, limit=20):
    """The operators with the most self time under `key` (microseconds, summed over the profiled steps), per
    step, in the shape of bench_train_step's "ops" list."""
    rows = sorted(averages, key=lambda e: getattr(e, key, 0), reverse=True)[:limit]
    return [{"name": e.key, "calls_per_step": e.count / steps, "ms_per_step": getattr(e, key, 0) / 1e3 / steps}
            for e in rows if getattr(e, key, 0) > 0]


if __name__ == "__main__":
    sys.exit(main())
