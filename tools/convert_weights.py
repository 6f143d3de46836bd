#!/usr/bin/env python3
"""Converts ConvNeXt weights between PyTorch checkpoints and convnext_zero's HDF5 format.

    # PyTorch/timm checkpoint (state dict, or a dict holding one under "model"/"state_dict") -> HDF5
    python3 tools/convert_weights.py to-h5 convnext_tiny.pth convnext_tiny.h5
    # a timm model's own (pretrained or freshly initialised) weights -> HDF5
    python3 tools/convert_weights.py to-h5 timm:convnext_tiny convnext_tiny.h5 [--pretrained]
    # HDF5 (e.g. from convnext_zero --export-weights) -> PyTorch state dict, checked against a timm model
    python3 tools/convert_weights.py from-h5 trained.h5 trained.pth --check-model convnext_atto --num-classes 10

The HDF5 file holds one float32 dataset per tensor, named by its state-dict key in PyTorch's shape. Keys are
written as found (timm or original facebookresearch names); convnext_zero maps either on import. Needs torch and
h5py (and timm for timm: sources and --check-model); not part of the core build.
"""
import argparse
import sys

import h5py
import numpy as np
import torch


def load_state_dict(src, pretrained, num_classes):
    if src.startswith("timm:"):
        import timm
        kw = {} if num_classes is None else {"num_classes": num_classes}
        return timm.create_model(src[5:], pretrained=pretrained, **kw).state_dict()
    obj = torch.load(src, map_location="cpu", weights_only=True)
    for key in ("model", "state_dict", "model_ema"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict):
        sys.exit(f"{src}: not a state dict (found {type(obj).__name__})")
    return {k[7:] if k.startswith("module.") else k: v for k, v in obj.items() if torch.is_tensor(v)}


def to_h5(args):
    sd = load_state_dict(args.src, args.pretrained, args.num_classes)
    with h5py.File(args.dst, "w") as f:
        f.attrs["format"] = "convnext_zero.weights"
        f.attrs["version"] = 1
        for k, v in sd.items():
            if v.is_floating_point():
                f[k] = v.detach().float().cpu().numpy()
    print(f"wrote {args.dst}: {len(sd)} tensors")


def from_h5(args):
    sd = {}
    with h5py.File(args.src, "r") as f:
        f.visititems(lambda name, obj: sd.__setitem__(name, torch.from_numpy(np.asarray(obj)))
                     if isinstance(obj, h5py.Dataset) else None)
    if args.check_model:
        import timm
        kw = {} if args.num_classes is None else {"num_classes": args.num_classes}
        model = timm.create_model(args.check_model, pretrained=False, **kw)
        ref = model.state_dict()
        fixed = {}
        for k, v in sd.items():
            if k in ref and ref[k].shape != v.shape and ref[k].numel() == v.numel():
                v = v.reshape(ref[k].shape)  # e.g. timm's 1x1-conv MLP form
            fixed[k] = v
        model.load_state_dict(fixed, strict=True)
        sd = fixed
        print(f"checked: loads into timm {args.check_model} with strict=True")
    torch.save(sd, args.dst)
    print(f"wrote {args.dst}: {len(sd)} tensors")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("to-h5")
    a.add_argument("src", help="checkpoint file, or timm:MODEL_NAME")
    a.add_argument("dst")
    a.add_argument("--pretrained", action="store_true", help="timm: download pretrained weights")
    a.add_argument("--num-classes", type=int)
    a.set_defaults(fn=to_h5)
    b = sub.add_parser("from-h5")
    b.add_argument("src")
    b.add_argument("dst")
    b.add_argument("--check-model", help="timm model name to load the weights into (strict)")
    b.add_argument("--num-classes", type=int)
    b.set_defaults(fn=from_h5)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
