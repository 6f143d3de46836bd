#!/usr/bin/env python3
"""Two weight files (--export-weights, HDF5 with timm's keys) tensor by tensor: prints the largest
max|a - b| / max|b| over the tensors and the tensors that reach it, and exits 1 where it exceeds BOUND (0: the
files must be equal to the bit) or where the files hold different tensors.

    compare_weights.py A.h5 B.h5 BOUND [LABEL]
"""
import sys

import h5py
import numpy as np


def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, np.asarray(obj)) if isinstance(obj, h5py.Dataset)
                     else None)
    return out


def main():
    a_path, b_path, bound = sys.argv[1], sys.argv[2], float(sys.argv[3])
    label = sys.argv[4] if len(sys.argv) > 4 else f"{a_path} vs {b_path}"
    a, b = tensors(a_path), tensors(b_path)
    if a.keys() != b.keys():
        print(f"{label}: the files hold different tensors: {sorted(a.keys() ^ b.keys())}")
        return 1
    rows, differing = [], 0
    for name in sorted(a):
        x, y = a[name], b[name]
        if x.shape != y.shape:
            print(f"{label}: {name} has shape {x.shape} against {y.shape}")
            return 1
        if x.tobytes() != y.tobytes():
            differing += 1
        x, y = x.astype(np.float64), y.astype(np.float64)
        scale = np.abs(y).max() if y.size else 0.0
        rows.append((np.abs(x - y).max() / scale if scale > 0 else np.abs(x - y).max(), name))
    rows.sort(reverse=True)
    worst = rows[0][0] if rows else 0.0
    print(f"{label}: largest max|a-b|/max|b| {worst:.2e} ({rows[0][1]}); {differing} of {len(rows)} tensors "
          f"differ in any bit; bound {'equal to the bit' if bound == 0 else f'{bound:.0e}'}")
    if bound == 0:
        return 1 if differing else 0
    for r, name in rows[:3]:
        print(f"  {r:.2e} {name}")
    return 1 if worst > bound else 0


if __name__ == "__main__":
    sys.exit(main())
