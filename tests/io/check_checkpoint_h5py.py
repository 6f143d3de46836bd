#!/usr/bin/env python3
"""Reads a checkpoint of checkpoint_driver's small model with h5py, as a user would: the index file's virtual
datasets are full tensors under their timm names in PyTorch shape, holding the values the driver wrote
(checkpoint_testing.cpp: value_at), and the scalars are attributes. Exit 77 (ctest: skipped) without h5py.

    check_checkpoint_h5py.py CHECKPOINT_DIR STEP
"""
import os
import sys

try:
    import h5py
    import numpy as np
except ImportError:
    print("h5py (or numpy) is not installed: skipped")
    sys.exit(77)

# checkpoint_testing.cpp: small_model(), in order (the tensor's index enters its values).
TENSORS = [("stem.0.weight", (8, 3, 4, 4)), ("stem.0.bias", (8,)), ("stages.0.blocks.0.conv_dw.weight", (8, 1, 7, 7)),
           ("stages.0.blocks.0.gamma", (8,)), ("stages.0.blocks.0.mlp.fc1.weight", (32, 8)),
           ("stages.0.blocks.0.mlp.fc2.weight", (8, 32)), ("stages.1.downsample.1.weight", (16, 8, 2, 2)),
           ("head.norm.weight", (16,)), ("head.fc.weight", (10, 16)), ("head.fc.bias", (10,)), ("head.fc.scale", (1,))]
GROUPS = ["params", "exp_avg", "exp_avg_sq", "ema"]


def value_at(step, group, t, i):
    v = (step * 7919 + group * 104729 + t * 1299709 + i * 31) % 4000000
    return v.astype(np.float32) * np.float32(-0.25 if group % 2 else 0.5)


def main():
    folder, step = sys.argv[1], int(sys.argv[2])
    latest = open(os.path.join(folder, "latest")).read().strip()
    path = os.path.join(folder, latest, "checkpoint.h5")
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "convnext_zero.checkpoint", f.attrs["format"]
        assert f.attrs["version"] == 1 and f.attrs["step"] == step, dict(f.attrs)
        assert f.attrs["epoch"] == step // 3 and f.attrs["loss_scale"] == 65536.0, dict(f.attrs)
        assert "convnext_atto" in f.attrs["config"], f.attrs["config"]
        assert list(f["state/shuffle_rng"][()]) == [1, 2, 3, 255, 0, step]
        for g, group in enumerate(GROUPS):
            names = sorted(f[group].keys())
            assert names == sorted(n for n, _ in TENSORS), (group, names)
            for t, (name, shape) in enumerate(TENSORS):
                d = f[group][name]
                assert d.is_virtual and d.shape == shape and d.dtype == np.float32, (group, name, d.shape, d.dtype)
                want = value_at(step, g, t, np.arange(int(np.prod(shape)), dtype=np.int64)).reshape(shape)
                got = d[()]
                assert np.array_equal(got, want), (group, name, np.argwhere(got != want)[:5])
    print(f"{path}: {len(GROUPS)} groups x {len(TENSORS)} tensors read by h5py {h5py.__version__} "
          f"(HDF5 {h5py.version.hdf5_version}): names, shapes and values as written")


if __name__ == "__main__":
    main()
