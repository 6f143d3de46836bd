#!/usr/bin/env python3
"""Writes an ImageNet-like `folder:` data set for measuring the loader (`convnext_zero --loader-only`, issue 32):
real photographs cut, scaled and re-encoded into JPEGs with ImageNet's spread of sizes and qualities.

The photographs are the ones Debian's Python packages ship: matplotlib's sample Grace Hopper portrait
(python3-matplotlib), SciPy's raccoon face and grey "ascent" (python3-scipy, scipy.misc), and scikit-image's
sample photographs (astronaut, chelsea, coffee, rocket, ...) when python3-skimage is installed. Nothing is
downloaded.

Sizes follow the ImageNet-1k training set's shape: most of its files are Flickr images scaled to 500 px on the
long side, mostly 4:3 landscape (500x375 is both the mode and the median), some portrait, a tail of smaller
and larger ones up to a few thousand pixels. Here: the long side is 500 for 60% of the files and otherwise
log-normal around 500 (sigma 0.45) clipped to [64, --max-side]; the aspect is 4:3 landscape for 55%, 3:4
portrait for 20%, otherwise uniform in [0.5, 2]. JPEG quality is uniform in [75, 95], 4:2:0 subsampling as
most cameras and Flickr write; 2% of the files are greyscale JPEGs, as about that share of ImageNet's are.

A class is one region of one photograph (its centre and scale drawn per class); each image of the class is a
random cut around that region (jittered centre, scale, aspect), flipped half the time, with a mild brightness
and colour change, resampled to its drawn size (Lanczos). Everything is drawn from --seed: the same seed and
the same package versions give the same files.

Usage: python3 tools/make_imagenet_like.py OUT_DIR [--classes 10] [--per-class 300] [--seed 0]
       [--max-side 2000] [--photos DIR]
       python3 tools/make_imagenet_like.py --save-photos DIR
--photos DIR takes the photographs from DIR's *.jpg and *.png files (sorted by name) instead of the packages:
a machine without those packages (the GPU machine of scripts/gpu-check.sh) gets them from one that has them,
where --save-photos DIR writes them (JPEG, quality 95).
Writes OUT_DIR/c000/img_00000.JPEG ... and prints the count, the median and largest sizes, the quality range
and the bytes written. Needs NumPy and Pillow (python3-numpy, python3-pil); with a Python that lacks them
(pyenv, a venv), or without any of the packages that ship the photographs, it re-runs itself under
/usr/bin/python3.
"""
import argparse
import bz2
import os
import pickle
import sys


def reexec_under_system_python(missing):
    system = "/usr/bin/python3"
    if os.path.realpath(sys.executable) != os.path.realpath(system) and os.path.exists(system):
        os.execv(system, [system] + sys.argv)
    sys.exit(f"make_imagenet_like.py: needs {missing}; none found under {sys.executable} or {system} "
             "(Debian: apt-get install python3-numpy python3-pil python3-matplotlib python3-scipy)")


try:
    import numpy as np
    from PIL import Image
except ImportError as e:
    reexec_under_system_python(e.name)


def photographs_in(folder):
    """(name, HxWx3 uint8 array) of each *.jpg / *.png file of `folder`, by name; at least one or an error."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.lower().endswith((".jpg", ".jpeg", ".png")))
    except OSError as e:
        sys.exit(f"make_imagenet_like.py: --photos {folder}: {e.strerror}")
    if not names:
        sys.exit(f"make_imagenet_like.py: --photos {folder}: no .jpg or .png files")
    return [(os.path.splitext(n)[0], np.asarray(Image.open(os.path.join(folder, n)).convert("RGB")))
            for n in names]


def photographs():
    """(name, HxWx3 uint8 array) of every sample photograph found; at least one or an error."""
    found = []
    try:
        import matplotlib
        path = os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")
        found.append(("grace_hopper", np.asarray(Image.open(path).convert("RGB"))))
    except (ImportError, OSError):
        pass
    try:  # scipy.misc's files are read directly: its functions are deprecated and gone from newer SciPy
        import scipy.misc
        folder = os.path.dirname(scipy.misc.__file__)
        with open(os.path.join(folder, "face.dat"), "rb") as f:
            face = np.frombuffer(bz2.decompress(f.read()), dtype=np.uint8)  # raw 768 x 1024 x 3
            found.append(("face", face.reshape(768, 1024, 3)))
        with open(os.path.join(folder, "ascent.dat"), "rb") as f:
            grey = np.asarray(pickle.load(f)).clip(0, 255).astype(np.uint8)
            found.append(("ascent", np.stack([grey] * 3, axis=-1)))
    except (ImportError, OSError):
        pass
    try:
        import skimage.data
        for name in ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "hubble_deep_field"):
            try:
                img = np.asarray(getattr(skimage.data, name)())
                if img.ndim == 3 and img.shape[2] >= 3:
                    found.append((name, img[:, :, :3].astype(np.uint8)))
            except Exception:  # an image this skimage version lacks or cannot read without a download
                pass
    except ImportError:
        pass
    if not found:  # a pyenv or venv Python with NumPy and Pillow but not the packages that ship photographs
        reexec_under_system_python("sample photographs (python3-matplotlib, python3-scipy or python3-skimage)")
    return found


def draw_size(rng, max_side):
    """(width, height) with ImageNet's spread (module docstring)."""
    long_side = 500 if rng.random() < 0.6 else int(np.clip(rng.lognormal(np.log(500), 0.45), 64, max_side))
    u = rng.random()
    aspect = 4 / 3 if u < 0.55 else 3 / 4 if u < 0.75 else float(np.exp(rng.uniform(np.log(0.5), np.log(2))))
    if aspect >= 1:
        return long_side, max(16, round(long_side / aspect))
    return max(16, round(long_side * aspect)), long_side


def cut(rng, photo, centre, scale, width, height):
    """A random cut of `photo` around the class's region, with the aspect of width x height."""
    h, w = photo.shape[:2]
    side = scale * min(h, w) * float(np.exp(rng.uniform(np.log(0.7), np.log(1.3))))
    aspect = width / height
    cw, ch = min(w, side * np.sqrt(aspect)), min(h, side / np.sqrt(aspect))
    cx = np.clip(centre[0] * w + rng.normal(0, 0.08) * w, cw / 2, w - cw / 2)
    cy = np.clip(centre[1] * h + rng.normal(0, 0.08) * h, ch / 2, h - ch / 2)
    box = (int(cx - cw / 2), int(cy - ch / 2), int(cx + cw / 2), int(cy + ch / 2))
    return Image.fromarray(photo).crop(box)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    if len(sys.argv) == 3 and sys.argv[1] == "--save-photos":
        os.makedirs(sys.argv[2], exist_ok=True)
        for name, photo in photographs():
            Image.fromarray(photo).save(os.path.join(sys.argv[2], f"{name}.jpg"), "JPEG", quality=95)
        print(f"photographs saved in {sys.argv[2]}: {', '.join(sorted(os.listdir(sys.argv[2])))}")
        return
    p.add_argument("out_dir")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--per-class", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-side", type=int, default=2000)
    p.add_argument("--photos", help="take the photographs from this folder's .jpg/.png files")
    a = p.parse_args()
    if a.classes < 1 or a.per_class < 1:
        sys.exit(f"make_imagenet_like.py: --classes and --per-class must be >= 1, got {a.classes} and "
                 f"{a.per_class}")
    if a.max_side < 64:
        sys.exit(f"make_imagenet_like.py: --max-side must be >= 64, got {a.max_side}")
    photos = photographs_in(a.photos) if a.photos else photographs()
    rng = np.random.default_rng(a.seed)
    sizes, qualities, total = [], [], 0
    for k in range(a.classes):
        name, photo = photos[k % len(photos)]
        centre = (rng.uniform(0.3, 0.7), rng.uniform(0.3, 0.7))
        scale = rng.uniform(0.35, 0.9)
        folder = os.path.join(a.out_dir, f"c{k:03d}")
        os.makedirs(folder, exist_ok=True)
        for i in range(a.per_class):
            width, height = draw_size(rng, a.max_side)
            img = cut(rng, photo, centre, scale, width, height).resize((width, height), Image.LANCZOS)
            if rng.random() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
            gain = rng.uniform(0.8, 1.2) * rng.uniform(0.92, 1.08, size=3)
            img = Image.fromarray((np.asarray(img, dtype=np.float32) * gain).clip(0, 255).astype(np.uint8))
            if rng.random() < 0.02:
                img = img.convert("L")
            quality = int(rng.integers(75, 96))
            path = os.path.join(folder, f"img_{i:05d}.JPEG")
            img.save(path, "JPEG", quality=quality, subsampling=2)
            sizes.append((width, height))
            qualities.append(quality)
            total += os.path.getsize(path)
    w = np.array([s[0] for s in sizes])
    h = np.array([s[1] for s in sizes])
    print(f"{len(sizes)} JPEGs in {a.classes} classes under {a.out_dir} from {len(photos)} photographs "
          f"({', '.join(n for n, _ in photos)}): median {int(np.median(w))}x{int(np.median(h))}, largest side "
          f"{int(max(w.max(), h.max()))}, quality {min(qualities)}-{max(qualities)}, "
          f"{total / 2**20:.1f} MiB ({total / len(sizes) / 1024:.0f} KiB each)")


if __name__ == "__main__":
    main()
