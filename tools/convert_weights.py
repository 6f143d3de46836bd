#!/usr/bin/env python3
"""Converts ConvNeXt weights between PyTorch/timm checkpoints and convnext_zero's HDF5 weight files (docs/weights.md).

    # a state dict, or a timm / facebookresearch checkpoint holding one (.pth/.pt/.bin, or .safetensors) -> HDF5
    python3 tools/convert_weights.py to-h5 convnext_tiny_1k_224.pth convnext_tiny.h5
    # a freshly created timm model (seeded; --pretrained downloads its weights instead) -> HDF5
    python3 tools/convert_weights.py to-h5 --timm-model convnext_atto --num-classes 10 --seed 1 atto.h5
    # HDF5 (e.g. from convnext_zero --export-weights) -> PyTorch state dict; with --timm-model the tensors are
    # shaped for that model (timm's 1x1-conv MLP of atto..nano) and load_state_dict(strict=True) is checked
    python3 tools/convert_weights.py to-torch trained.h5 trained.pth --timm-model convnext_atto --num-classes 10
    # what a weight file holds: its attributes, and each tensor's name, shape and dtype (needs h5py only)
    python3 tools/convert_weights.py show trained.h5

to-h5 writes one float32 dataset per floating-point tensor, named by its state-dict key (timm or original
facebookresearch keys, kept as found: convnext_zero maps either), in PyTorch's shape. Both directions write to a
temporary file and rename it, so an interrupted run never leaves a half-written file under the output name.
Needs h5py and numpy, and torch for to-h5 and to-torch (timm for --timm-model, safetensors for a .safetensors
file). When this interpreter lacks one of them and /usr/bin/python3 has them all (e.g. a pyenv or venv python3
beside Debian's python3-h5py), the script re-runs itself there; otherwise it prints one line naming what to
install and exits 1. --help needs none of them. Not part of the C++ build (ctest runs it without the packages:
convert_weights_without_packages).
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

# Note [Imports on demand]: h5py, numpy and torch are imported by the functions that use them, after the
# command line is parsed, so that --help and a missing package never end in a traceback (issue 30): main() checks
# what the command needs (needed_modules) and either re-runs under an interpreter that has it or names it.

FORMAT, VERSION = "convnext_zero.weights", 1


def fail(msg):
    sys.exit(f"convert_weights: {msg}")


# The import name of each package the commands use, and what to install for it.
PIP_NAMES = {"h5py": "h5py", "numpy": "numpy", "torch": "torch", "timm": "timm", "safetensors": "safetensors"}
SYSTEM_PYTHON = "/usr/bin/python3"
REEXEC_MARK = "CZ_CONVERT_WEIGHTS_REEXEC"  # set on the re-run, so that it never loops


def needed_modules(args):
    """The packages the parsed command imports, in the order a user would install them."""
    need = ["numpy", "h5py"]
    if args.cmd != "show":
        need.append("torch")
    if getattr(args, "timm_model", None):
        need.append("timm")
    if args.cmd == "to-h5" and not args.timm_model and args.paths[0].endswith(".safetensors"):
        need.append("safetensors")
    return need


def missing_here(modules):
    return [m for m in modules if importlib.util.find_spec(m) is None]


def missing_in(python, modules):
    """The modules `python` cannot find (all of them when it cannot run)."""
    probe = "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    try:
        r = subprocess.run([python, "-c", probe] + modules, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return list(modules)
    return r.stdout.split() if r.returncode == 0 else list(modules)


def same_interpreter(python):
    try:
        return os.path.samefile(python, sys.executable)
    except OSError:
        return False


def ensure_modules(args):
    """Returns when this interpreter has what the command needs; else re-runs the script under /usr/bin/python3
    when that one has it all, or exits 1 with one line naming what to install."""
    need = needed_modules(args)
    missing = missing_here(need)
    if not missing:
        return
    me = sys.executable + (" -S" if sys.flags.no_site else "")
    system_missing = None
    if not os.environ.get(REEXEC_MARK) and os.access(SYSTEM_PYTHON, os.X_OK) and not (
            same_interpreter(SYSTEM_PYTHON) and not sys.flags.no_site):
        system_missing = missing_in(SYSTEM_PYTHON, need)
        if not system_missing:
            print(f"convert_weights: {me} has no {', '.join(missing)}; running under {SYSTEM_PYTHON}, which has",
                  file=sys.stderr, flush=True)
            os.environ[REEXEC_MARK] = "1"
            os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])
    also = ""
    if system_missing:
        also = f" (nor has {SYSTEM_PYTHON}: no {', '.join(system_missing)})"
    what = args.cmd + (" --timm-model" if getattr(args, "timm_model", None) else "")
    fail(f"{what} needs {', '.join(need)}, and {me} has no {', '.join(missing)}{also}: "
         f"pip install {' '.join(PIP_NAMES[m] for m in missing)}")


def create_timm_model(name, num_classes, pretrained=False, seed=0):
    import timm
    import torch
    torch.manual_seed(seed)
    kw = {} if num_classes is None else {"num_classes": num_classes}
    try:
        return timm.create_model(name, pretrained=pretrained, **kw)
    except RuntimeError as e:  # an unknown name, or --pretrained without the weights at hand
        fail(f"--timm-model {name}: {e}")


def load_checkpoint(path):
    """The state dict in a checkpoint file, unwrapped from {"model"|"state_dict"|...: sd} and DDP's "module."."""
    import torch
    if not os.path.isfile(path):
        fail(f"{path}: no such file")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        obj = load_file(path)
    else:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("model", "state_dict", "model_ema", "state_dict_ema"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not any(torch.is_tensor(v) for v in obj.values()):
        fail(f"{path}: no state dict found (top level is {type(obj).__name__})")
    return {k[len("module."):] if k.startswith("module.") else k: v for k, v in obj.items() if torch.is_tensor(v)}


def atomic_write(dst, write):
    """Calls write(tmp_path) for a temporary file beside dst, then renames it to dst."""
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(dst) + ".tmp.", dir=os.path.dirname(os.path.abspath(dst)))
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
    except BaseException:
        os.unlink(tmp)
        raise


def write_h5(sd, dst):
    import h5py
    skipped = [k for k, v in sd.items() if not v.is_floating_point()]
    def write(tmp):
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["version"] = VERSION
            for k, v in sd.items():
                if v.is_floating_point():
                    f[k] = v.detach().cpu().float().numpy()
    atomic_write(dst, write)
    for k in skipped:
        print(f"skipped non-float tensor {k} ({sd[k].dtype})", file=sys.stderr)
    return len(sd) - len(skipped)


def read_h5(src, group=""):
    import h5py
    import numpy as np
    import torch
    sd = {}
    with h5py.File(src, "r") as f:
        root = f[group] if group else f
        root.visititems(lambda name, obj: sd.__setitem__(name, torch.from_numpy(np.array(obj)))
                        if isinstance(obj, h5py.Dataset) else None)
    return sd


def fit_to_model(sd, model):
    """sd reshaped where timm stores a tensor in another shape of the same size (1x1-conv MLP), then checked with
    load_state_dict(strict=True)."""
    ref = model.state_dict()
    fitted = {}
    for k, v in sd.items():
        if k in ref and ref[k].shape != v.shape and ref[k].numel() == v.numel():
            v = v.reshape(ref[k].shape)
        fitted[k] = v.to(ref[k].dtype) if k in ref else v
    model.load_state_dict(fitted, strict=True)
    return fitted


def to_h5(args):
    if args.timm_model:
        if len(args.paths) != 1:
            fail("to-h5 --timm-model NAME takes only the output file")
        model = create_timm_model(args.timm_model, args.num_classes, args.pretrained, args.seed)
        sd, what = model.state_dict(), f"timm {args.timm_model}"
    else:
        if len(args.paths) != 2:
            fail("to-h5 takes CHECKPOINT OUT.h5 (or OUT.h5 with --timm-model)")
        sd, what = load_checkpoint(args.paths[0]), args.paths[0]
    n = write_h5(sd, args.paths[-1])
    print(f"wrote {args.paths[-1]}: {n} tensors from {what}")


def to_torch(args):
    if not os.path.isfile(args.src):
        fail(f"{args.src}: no such file")
    sd = read_h5(args.src, args.group)
    if not sd:
        fail(f"{args.src}: no datasets{' under ' + args.group if args.group else ''}")
    if args.timm_model:
        try:
            sd = fit_to_model(sd, create_timm_model(args.timm_model, args.num_classes))
        except RuntimeError as e:
            fail(f"{args.src}: does not load into timm {args.timm_model}: {e}")
        print(f"checked: loads into timm {args.timm_model} with strict=True")
    import torch
    atomic_write(args.dst, lambda tmp: torch.save(sd, tmp))
    print(f"wrote {args.dst}: {len(sd)} tensors")


def show(args):
    import h5py
    if not os.path.isfile(args.src):
        fail(f"{args.src}: no such file")
    try:
        f = h5py.File(args.src, "r")
    except OSError as e:
        fail(f"{args.src}: not an HDF5 file ({e})")
    with f:
        for k in sorted(f.attrs):
            v = f.attrs[k]
            v = v.decode() if isinstance(v, bytes) else v.tolist() if hasattr(v, "tolist") else v
            print(f"{k} = {v}")
        rows = []
        f.visititems(lambda name, obj: rows.append((name, obj.shape, obj.dtype))
                     if isinstance(obj, h5py.Dataset) else None)
        for name, shape, dtype in rows:
            print(f"{name} {tuple(shape)} {dtype}")
        print(f"{len(rows)} tensors")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("to-h5", help="PyTorch checkpoint or timm model -> HDF5")
    a.add_argument("paths", nargs="+", metavar="CHECKPOINT OUT.h5")
    a.add_argument("--timm-model", help="convert a newly created timm model of this name instead of a file")
    a.add_argument("--num-classes", type=int, help="with --timm-model: classifier outputs")
    a.add_argument("--pretrained", action="store_true", help="with --timm-model: download timm's weights")
    a.add_argument("--seed", type=int, default=0, help="with --timm-model: torch seed for the initialisation")
    a.set_defaults(fn=to_h5)
    b = sub.add_parser("to-torch", help="HDF5 -> PyTorch state dict")
    b.add_argument("src", metavar="IN.h5")
    b.add_argument("dst", metavar="OUT.pth")
    b.add_argument("--group", default="", help="read the datasets under this group (e.g. weights in the fixtures)")
    b.add_argument("--timm-model", help="shape the tensors for this timm model and check a strict load")
    b.add_argument("--num-classes", type=int, help="with --timm-model: classifier outputs")
    b.set_defaults(fn=to_torch)
    c = sub.add_parser("show", help="a weight file's attributes and tensors (name, shape, dtype)")
    c.add_argument("src", metavar="IN.h5")
    c.set_defaults(fn=show)
    args = ap.parse_args()
    ensure_modules(args)
    args.fn(args)


if __name__ == "__main__":
    main()
