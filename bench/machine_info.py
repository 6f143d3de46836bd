#!/usr/bin/env python3
"""What every CPU side-by-side table names: the CPU (lscpu's model name), the OpenBLAS kernels it runs
(openblas_get_corename of the OpenMP build convnext_zero links), the cores, and PyTorch's BLAS and ISA when
torch is importable. Imported by the bench scripts; run alone it prints the line.

  python3 bench/machine_info.py
"""
import ctypes
import os
import subprocess

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0"


def heap_env_like_ours(env):
    """env with the glibc heap settings our CPU backend makes for itself (Note [Freed heap memory stays mapped],
    src/tensor/allocator.h) spelled as glibc's environment: for timing PyTorch under them too."""
    return dict(env, MALLOC_MMAP_THRESHOLD_=str(32 << 20), MALLOC_TRIM_THRESHOLD_=str(64 << 30))


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU (lscpu failed)"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    name = fields.get("Model name", "unknown CPU (no model name in lscpu)").strip()
    # A virtual machine's name is often generic ("Intel(R) Xeon(R) Processor"): family/model and the vector
    # extensions that decide the kernels say more.
    flags = set(fields.get("Flags", "").split())
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{name} (family {fields.get('CPU family', '?').strip()} model {fields.get('Model', '?').strip()}; " \
           f"{' '.join(isa) or 'no AVX2'})"


def openblas_core():
    try:
        lib = ctypes.CDLL(OPENBLAS)
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return "unknown (no " + OPENBLAS + ")"


def torch_info():
    try:
        import torch
    except ImportError:
        return None
    blas = "MKL" if torch.backends.mkl.is_available() else "no MKL"
    return f"PyTorch {torch.__version__} ({blas}, oneDNN {'on' if torch.backends.mkldnn.is_available() else 'off'}, " \
           f"{torch.backends.cpu.get_cpu_capability()})"


def describe(with_torch=False):
    parts = [f"CPU: {cpu_model()}", f"{os.cpu_count()} logical CPUs", f"OpenBLAS core: {openblas_core()}"]
    if with_torch:
        t = torch_info()
        if t:
            parts.append(t)
    return "; ".join(parts)


if __name__ == "__main__":
    print(describe(with_torch=True))
