#!/usr/bin/env python3
"""Writes the fixtures that tests/io/test_randaugment.cpp and test_random_erasing.cpp compare against: timm's
own RandAugment ops, PIL's crop-and-resize as timm's RandomResizedCropAndInterpolation calls it, and the
statistics of timm's RandomErasing (all from PyPI timm and Pillow; the versions are recorded in the files).

tests/data/randaugment_fixture.h5
  images (K, H, W, 3) u8          the inputs: smooth colour fields with edges, a low-contrast one, noise
  op (C) i64                      index into the root attribute `ops` (comma-separated timm op names)
  image (C) i64                   which input
  magnitude (C) f64               the level given to timm's AugmentOp (prob 1, no magnitude noise)
  negate (C) i64                  1 where timm's _randomly_negate was made to negate (the script picks)
  arg (C) f64                     the argument timm's level function gave the op (NaN: the op takes none)
  resample (C) i64                PIL's filter for geometric ops (2 bilinear, 3 bicubic; 0 otherwise)
  out (C, H, W, 3) u8             timm's output
  resize_src (Hs, Ws, 3) u8, resize_box (R, 4) i64 [top, left, h, w], resize_size (R) i64,
  resize_resample (R) i64, resize_out_<r> (S, S, 3) u8: torchvision's F.resized_crop (PIL crop + resize)
  Root attributes: ops, fill (the geometric ops' fill colour timm's transform factory chose), versions,
  and `pipeline`: the class names of timm's training transform in order, which the C++ loader follows.

tests/data/random_erasing_timm.json
  For each configuration (probability, mode, count, image size), statistics of timm's RandomErasing over
  many draws: fraction of images erased, the distribution of boxes per image, the boxes' area fraction,
  log aspect ratio (h / w) and centre, and the mean and standard deviation of the values written. Box sizes
  and values are recorded by wrapping timm.data.random_erasing._get_pixels (called once per box, which it
  returns unchanged); centres come from erasing a constant image. The draws are timm's own (Python's random).

Usage: python3 tools/make_randaugment_fixtures.py [out_dir]   (needs timm, torch, torchvision, Pillow, h5py;
seeded, so it rewrites the same files on the same versions)
"""
import json
import math
import os
import random
import sys

import h5py
import numpy as np
import PIL
import timm
import torch
import torchvision
import torchvision.transforms.functional as TF
from PIL import Image

import timm.data.auto_augment as aa
import timm.data.random_erasing as re_mod

H, W = 16, 24
MAGNITUDES = [0.0, 2.0, 4.6, 7.0, 9.0, 10.0]
NO_LEVEL = ["AutoContrast", "Equalize", "Invert"]
COLOUR = ["Posterize", "PosterizeIncreasing", "Solarize", "SolarizeIncreasing", "SolarizeAdd", "Color",
          "ColorIncreasing", "Contrast", "ContrastIncreasing", "Brightness", "BrightnessIncreasing",
          "Sharpness", "SharpnessIncreasing"]
GEOMETRIC = ["Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"]
OPS = NO_LEVEL + COLOUR + GEOMETRIC


def make_images(rng):
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float64)
    imgs = []
    # Colour ramps, a bright rectangle and a dark disc, light noise: every op has edges and gradients to act on.
    a = np.stack([40 + 180 * xx / (W - 1), 30 + 200 * yy / (H - 1), 200 - 150 * (xx + yy) / (W + H - 2)], -1)
    a[3:9, 4:11] = [250, 240, 20]
    a[((yy - 10) ** 2 + (xx - 17) ** 2) < 16] = [10, 20, 90]
    a += rng.uniform(-4, 4, a.shape)
    imgs.append(a)
    # Low contrast (values in about 70..160): AutoContrast and Equalize have work to do; Contrast's mean grey.
    b = 115 + 35 * np.sin(xx / 3.0)[..., None] * np.cos(yy[..., None] / 4.0 + np.arange(3))
    b += rng.uniform(-10, 10, b.shape)
    imgs.append(b)
    # Saturated noise with a hard diagonal: clipping in Sharpness, Brightness and bicubic overshoot.
    c = rng.uniform(0, 255, (H, W, 3))
    c[xx > yy * 1.5] = [255, 0, 128]
    imgs.append(c)
    return np.stack([np.clip(np.rint(i), 0, 255).astype(np.uint8) for i in imgs])


def timm_train_transform():
    # The transform timm's factory builds for the ConvNeXt recipe; its RandAugment hparams are what the ops
    # below use, so the fill colour and the interpolation are the factory's, not this script's.
    return timm.data.create_transform(input_size=224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1",
                                      interpolation="bicubic", re_prob=0.25, re_mode="pixel", re_count=1)


def ra_cases(images, hparams, skipped):
    cases = []
    for name in OPS:
        mags = [0.0] if name in NO_LEVEL else MAGNITUDES
        resamples = [Image.BILINEAR, Image.BICUBIC] if name in GEOMETRIC else [0]
        for mi, m in enumerate(mags):
            # Each magnitude on one of the images, with either sign: over the six magnitudes every (image,
            # sign) pair comes up once, at a sixth of the file's size of all of them.
            for ii in range(len(images)) if name in NO_LEVEL else [mi % len(images)]:
                for rs in resamples:
                    neg = mi % 2 == 1
                    aa._randomly_negate = (lambda v: -v) if neg else (lambda v: v)
                    hp = dict(hparams)
                    if rs:
                        hp["interpolation"] = rs
                    op = aa.AugmentOp(name, prob=1.0, magnitude=m, hparams=hp)
                    assert op.magnitude_std == 0
                    level = aa.LEVEL_TO_ARG[name]
                    arg = level(m, hp)[0] if level else float("nan")
                    try:
                        out = np.asarray(op(Image.fromarray(images[ii])))
                    except ValueError as e:
                        # Pillow 13 refuses ImageOps.posterize(img, 0), which timm asks for at Posterize's low
                        # and PosterizeIncreasing's high magnitudes (docs/data.md, Note [Posterize to 0 bits]).
                        assert name.startswith("Posterize") and arg == 0, (name, m, e)
                        skipped.append(f"{name} m={m}: {e}")
                        continue
                    cases.append((OPS.index(name), ii, m, int(neg), float(arg), int(rs), out))
    return cases


def resize_cases(rng):
    src = np.clip(rng.normal(128, 60, (37, 53, 3)), 0, 255).astype(np.uint8)
    src[10:20, 5:30] = [255, 255, 255]  # a hard block: bicubic's overshoot is clipped
    # (top, left, h, w, size): shrinking, enlarging, mixed, unchanged; and the crops for which Pillow 13 resizes
    # vertically first (the height shrinks by more than twice what the width does), enlarging the width
    # (2, 40, 20, 8), (1, 2, 35, 17) or shrinking it less (0, 30, 37, 20).
    boxes = [(0, 0, 37, 53, 16), (3, 7, 30, 41, 16), (5, 9, 9, 12, 16), (2, 40, 20, 8, 16), (11, 20, 16, 16, 16),
             (0, 0, 37, 53, 40), (1, 2, 35, 17, 24), (0, 30, 37, 20, 16)]
    out = []
    for (top, left, h, w, s) in boxes:
        for rs, mode in ((Image.BILINEAR, TF.InterpolationMode.BILINEAR),
                         (Image.BICUBIC, TF.InterpolationMode.BICUBIC)):
            r = np.asarray(TF.resized_crop(Image.fromarray(src), top, left, h, w, [s, s], mode))
            out.append(((top, left, h, w), s, int(rs), r))
    return src, out


def write_h5(path, images, cases, src, resized, fill, pipeline):
    with h5py.File(path, "w") as f:
        f.attrs["ops"] = ",".join(OPS)
        f.attrs["fill"] = np.array(fill, dtype=np.int64)
        f.attrs["pipeline"] = ",".join(pipeline)
        f.attrs["versions"] = f"timm {timm.__version__}, Pillow {PIL.__version__}, torchvision {torchvision.__version__}"
        z = dict(compression="gzip", compression_opts=9)
        f.create_dataset("images", data=images, **z)
        for k, col, dt in (("op", 0, np.int64), ("image", 1, np.int64), ("magnitude", 2, np.float64),
                           ("negate", 3, np.int64), ("arg", 4, np.float64), ("resample", 5, np.int64)):
            f.create_dataset(k, data=np.array([c[col] for c in cases], dtype=dt))
        f.create_dataset("out", data=np.stack([c[6] for c in cases]), **z)
        f.create_dataset("resize_src", data=src, **z)
        f.create_dataset("resize_box", data=np.array([r[0] for r in resized], dtype=np.int64))
        f.create_dataset("resize_size", data=np.array([r[1] for r in resized], dtype=np.int64))
        f.create_dataset("resize_resample", data=np.array([r[2] for r in resized], dtype=np.int64))
        for i, r in enumerate(resized):
            f.create_dataset(f"resize_out_{i}", data=r[3], **z)


ERASE_CONFIGS = [  # (probability, mode, count, height, width, draws)
    (0.25, "pixel", 1, 64, 64, 20000),
    (1.0, "const", 1, 48, 80, 20000),
    (1.0, "rand", 3, 64, 64, 20000),
    (0.5, "pixel", 2, 32, 32, 20000),
]


def erase_stats(p, mode, count, h, w, draws):
    # timm writes each box with what _get_pixels returns for it: a wrapper records the box's size and values.
    real = re_mod._get_pixels
    boxes, fills = [], []

    def spy(per_pixel, rand_color, patch_size, dtype=torch.float32, device="cuda"):
        v = real(per_pixel, rand_color, patch_size, dtype=dtype, device="cpu")
        boxes.append(patch_size)
        fills.append(v.expand(patch_size).reshape(patch_size[0], -1))
        return v

    re_mod._get_pixels = spy
    try:
        er = re_mod.RandomErasing(probability=p, mode=mode, max_count=count, device="cpu")
        random.seed(1234)
        torch.manual_seed(1234)
        erased, per_image, area, log_aspect, top, left = 0, [0] * (count + 1), [], [], [], []
        img = torch.zeros(3, h, w)
        for _ in range(draws):
            n0 = len(boxes)
            er._erase(img, 3, h, w, img.dtype)
            k = len(boxes) - n0
            per_image[k] += 1
            erased += k > 0
            for (_, bh, bw) in boxes[n0:]:
                area.append(bh * bw / (h * w))
                log_aspect.append(math.log(bh / bw) if bh and bw else float("nan"))
        vals = torch.cat(fills, 1) if fills else torch.zeros(3, 0)
    finally:
        re_mod._get_pixels = real
    # Box positions: the image is filled with its pixel index; after one erase of a const box (zeros), the
    # zeroed rectangle's corner is the box's. Done with count 1 and probability 1 so each draw is one box.
    pos = re_mod.RandomErasing(probability=1.0, mode="const", max_count=1, device="cpu")
    random.seed(99)
    for _ in range(4000):
        img = torch.ones(3, h, w)
        pos._erase(img, 3, h, w, img.dtype)
        z = (img[0] == 0).nonzero()
        if len(z):
            top.append((z[:, 0].min().item() + z[:, 0].max().item() + 1) / 2 / h)
            left.append((z[:, 1].min().item() + z[:, 1].max().item() + 1) / 2 / w)
    area, la = np.array(area), np.array([x for x in log_aspect if x == x])
    return {
        "probability": p, "mode": mode, "count": count, "height": h, "width": w, "draws": draws,
        "erased_fraction": erased / draws,
        "boxes_per_image": [c / draws for c in per_image],
        "area_mean": float(area.mean()), "area_std": float(area.std()),
        "area_quantiles": [float(q) for q in np.quantile(area, [0.1, 0.5, 0.9])],
        "log_aspect_mean": float(la.mean()), "log_aspect_std": float(la.std()),
        "centre_y_mean": float(np.mean(top)), "centre_x_mean": float(np.mean(left)),
        "centre_y_std": float(np.std(top)), "centre_x_std": float(np.std(left)),
        "fill_mean": [float(v) for v in vals.mean(1)], "fill_std": [float(v) for v in vals.std(1)]
        if vals.shape[1] > 1 else [0.0, 0.0, 0.0],
        "boxes": len(area),
    }


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data")
    rng = np.random.default_rng(31)
    images = make_images(rng)
    tf = timm_train_transform()
    pipeline = [type(t).__name__ for t in tf.transforms]
    ra = next(t for t in tf.transforms if type(t).__name__ == "RandAugment")
    hparams = dict(ra.ops[0].hparams)
    fill = ra.ops[0].kwargs["fillcolor"]
    assert ra.ops[0].kwargs["resample"] == Image.BICUBIC, "timm's factory gives the ops the crop's interpolation"
    hparams.pop("magnitude_std", None)  # the fixture's ops run without magnitude noise
    skipped = []
    cases = ra_cases(images, hparams, skipped)
    src, resized = resize_cases(rng)
    write_h5(os.path.join(out_dir, "randaugment_fixture.h5"), images, cases, src, resized, fill, pipeline)
    print(f"not in the fixture ({len(skipped)}): {sorted(set(skipped))}")
    stats = {"versions": f"timm {timm.__version__}, torch {torch.__version__}",
             "configs": [erase_stats(*c) for c in ERASE_CONFIGS]}
    with open(os.path.join(out_dir, "random_erasing_timm.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(f"{len(cases)} op cases, {len(resized)} resize cases; pipeline {pipeline}; fill {fill}")


if __name__ == "__main__":
    main()
