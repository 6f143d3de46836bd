#!/usr/bin/env python3
"""Writes tests/data/mixup_fixture.h5: small batches mixed by timm's own Mixup (timm.data.mixup.Mixup, from
PyPI), with the parameters timm drew recorded beside them (each image's lam as timm used it for the target,
whether CutMix pasted a box, and the box), so that tests/io/test_mixup.cpp applies the same lam, boxes and
pairing (timm's flip: image i with image n-1-i) with our apply_mix/mix_targets and compares bit for bit.

One HDF5 group per case, the batch mode, pair and elem modes with Mixup, CutMix, both (switching), CutMix's
min-max boxes, and prob < 1:
  images (n, H, W, 3) f32    the input, ImageNet-normalised from random 8-bit pixels, NHWC as our loader's
  mixed (n, H, W, 3) f32     timm's output, NHWC
  labels (n) i64, targets (n, K) f32   timm's mixup_target
  lams (n) f64, cutmix (n) u8, boxes (n, 4) i64 ([y0, y1, x0, x1], zeros without a box)
  mode (scalar i64: 0 batch, 1 pair, 2 elem), num_classes (i64), smoothing (f64)

Usage: python3 tools/make_mixup_fixture.py [out.h5]   (needs torch, timm and h5py; seeded, so it rewrites
the same file)
"""
import sys

import h5py
import numpy as np
import torch
import timm
import timm.data.mixup as tm

N, H, W, K, SMOOTHING = 8, 10, 12, 7, 0.1
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
MODES = {"batch": 0, "pair": 1, "elem": 2}

CASES = [  # (name, numpy seed, Mixup arguments)
    ("batch_mixup", 16, dict(mixup_alpha=0.8, cutmix_alpha=0.0, mode="batch")),
    ("batch_cutmix", 2, dict(mixup_alpha=0.0, cutmix_alpha=1.0, mode="batch")),
    ("batch_minmax", 3, dict(mixup_alpha=0.0, cutmix_minmax=(0.2, 0.8), mode="batch")),
    ("batch_switch", 4, dict(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, mode="batch")),
    ("batch_off", 5, dict(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.0, mode="batch")),
    ("pair", 6, dict(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, mode="pair")),
    ("elem", 7, dict(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, prob=0.7, mode="elem")),
    ("elem_minmax", 8, dict(mixup_alpha=0.0, cutmix_minmax=(0.3, 0.7), mode="elem")),
]


def run_case(seed, args):
    """timm's Mixup on a fresh batch, returning its inputs, outputs and the parameters it drew."""
    rng = np.random.default_rng(100 + seed)
    pixels = torch.from_numpy(rng.integers(0, 256, size=(N, 3, H, W), dtype=np.uint8))
    x = ((pixels.float() / 255.0) - MEAN) / STD
    labels = torch.from_numpy(rng.integers(0, K, size=N)).long()
    images = x.permute(0, 2, 3, 1).contiguous().numpy().copy()

    boxes, lam_arg, cut_draws, raw_lams = [], [], [], []
    real_box = tm.cutmix_bbox_and_lam
    real_target = tm.mixup_target

    def box_spy(*a, **kw):
        (yl, yh, xl, xh), lam = real_box(*a, **kw)
        boxes.append((int(yl), int(yh), int(xl), int(xh)))
        return (yl, yh, xl, xh), lam

    def target_spy(target, num_classes, lam=1.0, smoothing=0.0, multi_label=False):
        lam_arg.append(lam)
        return real_target(target, num_classes, lam, smoothing, multi_label)

    mixer = tm.Mixup(label_smoothing=SMOOTHING, num_classes=K, **args)
    per_batch, per_elem = mixer._params_per_batch, mixer._params_per_elem

    def batch_spy():
        lam, cut = per_batch()
        cut_draws.append(np.array([cut]))
        return lam, cut

    def elem_spy(n):
        lam, cut = per_elem(n)
        cut_draws.append(np.asarray(cut).copy())
        raw_lams.append(np.asarray(lam).copy())
        return lam, cut

    mixer._params_per_batch, mixer._params_per_elem = batch_spy, elem_spy
    tm.cutmix_bbox_and_lam, tm.mixup_target = box_spy, target_spy
    np.random.seed(seed)
    try:
        mixed, targets = mixer(x.clone(), labels)
    finally:
        tm.cutmix_bbox_and_lam, tm.mixup_target = real_box, real_target

    lam = lam_arg[0]
    lams = np.full(N, float(lam)) if isinstance(lam, float) else lam.view(-1).double().numpy()
    cut, box = np.zeros(N, np.uint8), np.zeros((N, 4), np.int64)
    mode = args["mode"]
    if mode == "batch":
        if cut_draws[0][0] and boxes:  # lam == 1 returns before any box is drawn
            cut[:] = 1
            box[:] = boxes[0]
    else:
        # timm's loop draws a box for image (pair) i where CutMix was chosen and its raw lam is not 1, in
        # order of i; the lam it then uses is the corrected one, which the target spy saw.
        pasted = iter(boxes)
        for i, (use, raw) in enumerate(zip(cut_draws[0], raw_lams[0])):
            if use and raw != 1.0:
                b = next(pasted)
                for k in ([i, N - 1 - i] if mode == "pair" else [i]):
                    cut[k] = 1
                    box[k] = b
    return dict(images=images, mixed=mixed.permute(0, 2, 3, 1).contiguous().numpy(), labels=labels.numpy(),
                targets=targets.numpy(), lams=lams, cutmix=cut, boxes=box, mode=MODES[mode])


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/mixup_fixture.h5"
    with h5py.File(out, "w") as f:
        f.attrs["timm"] = str(timm.__version__)
        f.attrs["torch"] = str(torch.__version__)
        for name, seed, args in CASES:
            r = run_case(seed, args)
            g = f.create_group(name)
            for key in ("images", "mixed", "targets"):
                g[key] = r[key].astype(np.float32)
            g["labels"] = r["labels"].astype(np.int64)
            g["lams"] = r["lams"].astype(np.float64)
            g["cutmix"] = r["cutmix"].astype(np.uint8)
            g["boxes"] = r["boxes"].astype(np.int64)
            g["mode"] = np.int64(r["mode"])
            g["num_classes"] = np.int64(K)
            g["smoothing"] = np.float64(SMOOTHING)
            print(f"{name}: lams {np.round(r['lams'], 4).tolist()} cutmix {r['cutmix'].tolist()}")
    print(f"wrote {out} (timm {timm.__version__}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
