"""The CPU library's builds and products (test_matmul.py, test_device_f32.py): every
kernel build this machine can run (:func:`builds`), the library of each in float64 or
float32 (:func:`cpu_libraries`), the four transposition layouts of an operand pair
(:func:`layouts`), one product by one library (:func:`product`), and the functions of a
library's disassembly that hold fused multiply-adds
(:func:`functions_with_fused_multiply_adds`).  Tests import these through
tests/support.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from conftest import require_c_compiler
from gradtool import native
from gradtool import numerics as nx


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next((line for line in fh if line.startswith("flags")), "")
    except OSError:
        return ""


def builds():
    """(name, extra flags, native arch) of every kernel build this machine can run."""
    out = [("native", (), None), ("generic", (), False),
           ("portable", ("-DGT_MM_PORTABLE",), False),
           ("no-fma", native.NO_FMA_FLAGS, None)]
    if " avx2 " in cpu_flags() + " " and " fma " in cpu_flags():
        out.append(("avx2", ("-march=x86-64-v3",), False))
    return out


def cpu_libraries(dtype="f64"):
    """{build name: its library} for every build of :func:`builds` in ``dtype``, and the
    native build loaded without its Python entry ("native, ctypes entry")."""
    require_c_compiler()
    what = "" if dtype == "f64" else " float32"
    libs = {}
    for name, flags, arch in builds():
        lib = nx.cpu_library(flags, arch, dtype=dtype)
        assert lib is not None, f"the {name}{what} build of csrc/gt_cpu.c failed"
        libs[name] = lib
    # the products of every build above go through gt_mm_py, the arrays themselves
    # (when this interpreter has Python.h); this one through the ctypes entry, gt_mm
    libs["native, ctypes entry"] = nx.cpu_library(python=False, dtype=dtype)
    assert libs["native, ctypes entry"].py_mm is None
    return libs


def layouts(a, b):
    """The four transposition cases as strided views: A or A^T stored, B or B^T stored."""
    at = np.ascontiguousarray(np.swapaxes(a, -1, -2))
    bt = np.ascontiguousarray(np.swapaxes(b, -1, -2))
    return {"A@B": (a, b), "A^T@B": (np.swapaxes(at, -1, -2), b),
            "A@B^T": (a, np.swapaxes(bt, -1, -2)),
            "A^T@B^T": (np.swapaxes(at, -1, -2), np.swapaxes(bt, -1, -2))}


def product(lib, a, b, c0=None):
    """a @ b (or c0 + a @ b, accumulated in place as the host backend's gradients are)
    by one library, in a's dtype; a, b are 2-d or 3-d views."""
    a3, b3 = (a, b) if a.ndim == 3 else (a[np.newaxis], b[np.newaxis])
    out = np.empty((a3.shape[0], a3.shape[1], b3.shape[2]), a.dtype)
    if c0 is not None:
        out[...] = c0.reshape(out.shape)
    nx._native_product(lib, out, a3, b3, a3.shape[0], accumulate=c0 is not None)
    return out.reshape(out.shape[1:]) if a.ndim == 2 else out


FUSED = ("vfmadd", "vfmsub", "vfnmadd", "vfnmsub", "fmadd", "fmla", "fmsub", "fnmadd")


def functions_with_fused_multiply_adds(objdump: str, path: Path) -> dict:
    """{function: its FMA instructions and calls to fma()} in a library's disassembly."""
    text = subprocess.run([objdump, "-d", str(path)], capture_output=True, text=True,
                          check=True).stdout
    assert "mulpd" in text or "mulsd" in text or "fmul" in text, f"{path}: no multiply?"
    found, name = {}, None
    for line in text.splitlines():
        if line.endswith(">:"):
            name = line.split("<", 1)[1][:-2]
        elif any(f in line for f in FUSED) or "<fma@plt>" in line or "<fmaf@plt>" in line:
            found.setdefault(name, []).append(line.strip())
    return found
