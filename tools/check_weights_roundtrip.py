#!/usr/bin/env python3
"""Round trip of timm weights through convnext_zero: timm model -> HDF5 (convert_weights.py to-h5) -> our import
and export (the cz_weights app) -> PyTorch (to-torch --timm-model, a strict load) -> equal to the original, value
for value. Also with the keys renamed to the original facebookresearch/ConvNeXt names, and with --reset-head.

    python3 tools/check_weights_roundtrip.py build/apps/cz_weights [convnext_atto convnext_tiny ...]

Needs torch, timm and h5py; not part of ctest.
"""
import os
import subprocess
import sys
import tempfile

import h5py
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert_weights as cw  # noqa: E402

NUM_CLASSES = 10


def facebook_key(k):
    """The original ConvNeXt repository's name for a timm key."""
    p = k.split(".")
    if p[0] == "stem":
        return "downsample_layers.0." + ".".join(p[1:])
    if p[0] == "head":
        return ("norm." if p[1] == "norm" else "head.") + ".".join(p[2:])
    if p[2] == "downsample":
        return f"downsample_layers.{p[1]}." + ".".join(p[3:])
    rest = ".".join(p[5:])
    name = {"conv_dw": "dwconv", "norm": "norm", "gamma": "gamma", "mlp": {"fc1": "pwconv1", "fc2": "pwconv2"}}[p[4]]
    if p[4] == "mlp":
        name, rest = name[p[5]], ".".join(p[6:])
    return f"stages.{p[1]}.{p[3]}.{name}" + (f".{rest}" if rest else "")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    return r.stdout.strip()


def check(cz_weights, model_name, tmp):
    ref = cw.create_timm_model(model_name, NUM_CLASSES, seed=1).state_dict()
    timm_h5, fb_h5 = os.path.join(tmp, "timm.h5"), os.path.join(tmp, "fb.h5")
    cw.write_h5(ref, timm_h5)
    cw.write_h5({facebook_key(k): v for k, v in ref.items()}, fb_h5)
    results = []
    for label, src, extra in [("timm keys", timm_h5, []), ("facebook keys", fb_h5, []),
                              ("reset head", timm_h5, ["--reset-head"])]:
        out_h5, out_pth = os.path.join(tmp, "ours.h5"), os.path.join(tmp, "ours.pth")
        report = "; ".join(run([cz_weights, src, out_h5, "--model", model_name, "--num-classes", str(NUM_CLASSES)] + extra).splitlines())
        with h5py.File(out_h5) as f:
            assert f.attrs["format"] == cw.FORMAT, dict(f.attrs)
        model = cw.create_timm_model(model_name, NUM_CLASSES, seed=2)
        model.load_state_dict(cw.fit_to_model(cw.read_h5(out_h5), model), strict=True)
        got = model.state_dict()
        skipped = {"head.fc.weight", "head.fc.bias"} if extra else set()
        bad = [k for k in ref if k not in skipped and not torch.equal(got[k], ref[k])]
        # With --reset-head the classifier is our fresh initialisation (biases are zero on both sides).
        head_new = not skipped or not torch.equal(got["head.fc.weight"], ref["head.fc.weight"])
        ok = not bad and head_new and set(got) == set(ref)
        results.append(ok)
        print(f"{model_name:16s} {label:14s} {'OK' if ok else 'MISMATCH ' + ', '.join(bad[:5])}  [{report}]")
    return all(results)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    models = sys.argv[2:] or ["convnext_atto", "convnext_tiny"]
    with tempfile.TemporaryDirectory() as tmp:
        ok = all([check(sys.argv[1], m, tmp) for m in models])
    print("round trip:", "all equal" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
