#!/usr/bin/env python3
"""The PyTorch peer of a multi-rank CPU step: timm's ConvNeXt under DistributedDataParallel (the peer of ZeRO
stages 0-2) or FSDP2's fully_shard per block (the peer of stage 3), gloo on the CPU, channels_last, AdamW with
timm's weight-decay rule, the same synthetic shapes as bench/train_step_torch.py. Started by torchrun (one
process per rank); rank 0 writes the mean step time over the timed steps (the slowest rank's, as a step ends
when every rank's does).

  python3 -m torch.distributed.run --nproc-per-node 2 bench/train_step_dist_torch.py --mode ddp --json t.json
"""
import argparse
import json
import time

import timm
import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["ddp", "fsdp2"], required=True)
    ap.add_argument("--model", default="atto")
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    name = args.model if args.model.startswith("convnext_") else "convnext_" + args.model
    model = timm.create_model(name, pretrained=False, num_classes=args.classes)
    if args.mode == "ddp":
        model = model.to(memory_format=torch.channels_last)
    # FSDP2 shards only contiguous parameters, so its model keeps contiguous weights; its convolutions still
    # run channels_last, as the input is.
    model.train()
    if args.mode == "ddp":
        run_model = torch.nn.parallel.DistributedDataParallel(model)
        params = model.named_parameters()
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for stage in model.stages:
            for block in stage.blocks:
                fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        run_model = model
        params = model.named_parameters()
    params = list(params)
    decay = [p for n, p in params if p.ndim > 1 and not n.endswith(".bias")]
    no_decay = [p for n, p in params if not (p.ndim > 1 and not n.endswith(".bias"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, foreach=True)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    gen = torch.Generator().manual_seed(1 + rank)
    images = torch.randn(args.batch, 3, args.image, args.image, generator=gen).to(memory_format=torch.channels_last)
    labels = torch.randint(0, args.classes, (args.batch,), generator=gen)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(run_model(images), labels)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    dist.barrier()
    seconds = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    if rank == 0:
        result = {"impl": f"pytorch_{args.mode}", "model": name, "ranks": world, "batch_per_rank": args.batch,
                  "image": args.image, "threads_per_rank": args.threads, "steps": args.steps,
                  "ms_per_step": 1e3 * float(seconds) / args.steps,
                  "img_per_s": world * args.batch * args.steps / float(seconds), "loss": float(loss.detach()),
                  "torch": torch.__version__}
        print(f"train_step_dist_torch: {name} {args.mode} {world} ranks x batch {args.batch}: "
              f"{result['ms_per_step']:.1f} ms/step, {result['img_per_s']:.1f} img/s")
        if args.json:
            with open(args.json, "w") as f:
                f.write(json.dumps(result) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
