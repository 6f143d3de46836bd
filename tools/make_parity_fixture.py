#!/usr/bin/env python3
"""Builds the PyTorch parity fixtures for tests/parity/test_parity.cpp.

A small timm ConvNeXt (or ConvNeXt V2 with --grn) with randomised parameters (so layer scale, GRN, LayerNorm
affine and biases all matter) is run
on a fixed batch: the fixture holds its weights (timm state-dict keys, PyTorch shapes), the input (NHWC), labels,
logits, loss, every parameter gradient, and the weights and losses after three AdamW steps with timm's
weight-decay rule. Needs torch, timm and h5py (not part of the core build).

    python3 tools/make_parity_fixture.py tests/data/parity_convnext.h5 [--conv-mlp]
    python3 tools/make_parity_fixture.py tests/data/parity_convnextv2.h5 --conv-mlp --grn
"""
import argparse

import h5py
import numpy as np
import timm
import torch
import torch.nn.functional as F

DEPTHS = (1, 1, 2, 1)
DIMS = (8, 16, 24, 32)
NUM_CLASSES = 10
BATCH, SIZE = 4, 32
LABEL_SMOOTHING = 0.1
LR, WD, STEPS = 2e-3, 0.05, 3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--conv-mlp", action="store_true", help="timm's 1x1-conv MLP form (atto..nano)")
    ap.add_argument("--grn", action="store_true", help="ConvNeXt V2 blocks: GRN in the MLP, no layer scale")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    v2 = dict(use_grn=True, ls_init_value=None) if args.grn else {}
    model = timm.models.convnext.ConvNeXt(depths=DEPTHS, dims=DIMS, num_classes=NUM_CLASSES,
                                          conv_mlp=args.conv_mlp, drop_path_rate=0.0, **v2).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".grn." in name:  # timm starts GRN at zero (the identity)
                p.uniform_(-0.5, 0.5)
            elif name.endswith("gamma"):
                p.uniform_(0.5, 1.5)
            elif "norm" in name or name.startswith("stem.1") or ".downsample.0" in name:
                p.uniform_(0.5, 1.5) if name.endswith("weight") else p.uniform_(-0.2, 0.2)
            elif name.endswith("bias"):
                p.uniform_(-0.2, 0.2)
    model.train()

    x = torch.randn(BATCH, 3, SIZE, SIZE, dtype=torch.float64)
    labels = torch.randint(0, NUM_CLASSES, (BATCH,))

    def loss_fn():
        logits = model(x)
        return logits, F.cross_entropy(logits, labels, label_smoothing=LABEL_SMOOTHING)

    with h5py.File(args.out, "w") as f:
        f.attrs["depths"] = DEPTHS
        f.attrs["dims"] = DIMS
        f.attrs["num_classes"] = NUM_CLASSES
        f.attrs["label_smoothing"] = LABEL_SMOOTHING
        f.attrs["lr"] = LR
        f.attrs["weight_decay"] = WD
        f.attrs["steps"] = STEPS
        f.attrs["conv_mlp"] = int(args.conv_mlp)
        f.attrs["grn"] = int(args.grn)
        for k, v in model.state_dict().items():
            f[f"weights/{k}"] = v.float().numpy()
        f["input"] = x.permute(0, 2, 3, 1).float().numpy()  # NHWC
        f["labels"] = labels.numpy().astype(np.int64)

        # The reference runs in float64 from the float32-rounded weights and input, so it is exact to the
        # precision our f32 implementation is compared at.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.float().double())
            x.copy_(x.float().double())
        logits, loss = loss_fn()
        loss.backward()
        f["logits"] = logits.detach().float().numpy()
        f["loss"] = np.float32(loss.item())
        for k, p in model.named_parameters():
            f[f"grads/{k}"] = p.grad.float().numpy()

        decay = [p for n, p in model.named_parameters() if p.ndim > 1 and not n.endswith(".bias")]
        no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1 or n.endswith(".bias")]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=LR, betas=(0.9, 0.999), eps=1e-8)
        losses = []
        model.zero_grad()
        for _ in range(STEPS):
            opt.zero_grad()
            _, loss = loss_fn()
            losses.append(loss.item())
            loss.backward()
            opt.step()
        f["losses"] = np.array(losses, dtype=np.float32)
        for k, p in model.named_parameters():
            f[f"weights_after/{k}"] = p.detach().float().numpy()
    print(f"wrote {args.out}: {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main()
