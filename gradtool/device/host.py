"""The host backend: kernels.cu compiled by the system C compiler, run through ctypes.

``gradtool/csrc/kernels.cu`` is compiled as C (``cc -x c``) with
``host_prelude.h`` mapping the CUDA built-ins: a launch runs the kernel body
for every thread index in order.  Flags: ``-O3 -ffp-contract=off
-fno-math-errno`` (no FMA contraction, no fast-math: every + - * / sqrt is
one IEEE rounding, exactly as under nvcc's ``__d*_rn``), plus
``-march=native`` for wider vectors, which changes no result (SIMD lanes
round like scalars; contraction stays off); the machine is part of the
cache key.  ``GRADTOOL_HOST_NATIVE=0`` leaves ``-march=native`` out.

Building and caching (by a hash of the five source files, the flags, the
compiler's version and the machine) is :mod:`gradtool.native`'s job.

A whole episode (forward, backward, optimizer) is ONE ctypes call into the
interpreter at the end of kernels.cu, which walks the launch table.  The
arena is a numpy array, so inputs, the loss and values are plain array reads
and writes.
"""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

import numpy as np

from .. import native
from ..errors import GradtoolError
from .program import DTYPES, PHASES, Program

CSRC = native.CSRC
SOURCES = ("kernels.cu", "host_prelude.h", "gt_math.h", "gt_matmul.h", "gt_optim.h")
BASE_FLAGS = ("-x", "c", *native.SAFE_FLAGS)
VARIANTS = ("tiled", "per-thread", "per-thread-reversed")


class HostBuildError(GradtoolError):
    """The host kernel library could not be built or loaded."""


def _flags(dtype: str, variant: str = "tiled") -> list:
    flags = list(BASE_FLAGS)
    if dtype == "f32":
        flags.append("-DGT_REAL_F32")
    if variant != "tiled":
        flags.append("-DGT_PER_THREAD")       # the GPU's one-thread-per-output loop bodies
    if variant == "per-thread-reversed":
        flags.append("-DGT_REVERSE_THREADS")  # ... walked last index first (race detector)
    return flags


def _stem(dtype: str, variant: str) -> str:
    return f"gt_kernels_{dtype}" + {"tiled": "", "per-thread": "_pt",
                                    "per-thread-reversed": "_ptr"}[variant]


def library_path(dtype: str, native_arch: bool = True, variant: str = "tiled") -> Path:
    """Where the cached library for this source, dtype, compiler and machine lives."""
    flags = _flags(dtype, variant) + ([native.NATIVE_ARCH] if native_arch else [])
    return native.library_path(_stem(dtype, variant), CSRC / "kernels.cu", flags,
                               [CSRC / name for name in SOURCES[1:]])


_LIBS: dict = {}


def load_library(dtype: str, variant: str = "tiled"):
    """The compiled kernel library for ``dtype`` (built and cached on first use).

    ``variant="per-thread"`` builds the GPU's one-thread-per-output loop bodies
    instead of the host's tiled ones (for tests: the same bits, slower);
    ``"per-thread-reversed"`` runs those bodies with the thread indices in
    reverse order, which changes the bits of any kernel whose threads depend
    on each other (what would race on a GPU).
    """
    if variant not in VARIANTS:
        raise HostBuildError(f"unknown host kernel variant {variant!r}")
    if (dtype, variant) in _LIBS:
        return _LIBS[dtype, variant]
    try:
        path = native.build_best(_stem(dtype, variant), CSRC / "kernels.cu",
                                 _flags(dtype, variant), [CSRC / name for name in SOURCES[1:]])
    except native.NativeUnavailable as exc:
        raise HostBuildError(f"the host backend needs a working C compiler: {exc}") from None
    lib = ctypes.CDLL(str(path))
    lib.gt_kernel_names.restype = ctypes.c_char_p
    lib.gt_kernel_names.argtypes = []
    lib.gt_real_bytes.restype = ctypes.c_int
    lib.gt_run.restype = None
    lib.gt_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_longlong, ctypes.c_longlong]
    if lib.gt_real_bytes() != np.dtype(DTYPES[dtype]).itemsize:
        raise HostBuildError(f"{path} was built for another element type")
    native.register_threaded(lib)
    _LIBS[dtype, variant] = lib
    return lib


def kernel_names(dtype: str = "f64") -> list:
    return load_library(dtype).gt_kernel_names().decode().split()


class HostBackend:
    """A :class:`Program` instantiated on the host: the arena is a numpy array."""

    name = "host"

    def __init__(self, program: Program, variant: str = "tiled"):
        self.program = program
        self.variant = variant
        lib = load_library(program.dtype, variant)
        index = {name: i for i, name in enumerate(lib.gt_kernel_names().decode().split())}
        self.meta, self.table, self.ranges = program.flatten(index)
        self.arena = np.zeros(max(program.size, 1), dtype=DTYPES[program.dtype])
        for off, data in program.init:
            flat = np.asarray(data, dtype=np.float64).reshape(-1)
            self.arena[off:off + flat.size] = flat
        self._run = lib.gt_run
        self._ptrs = (self.arena.ctypes.data, self.meta.ctypes.data, self.table.ctypes.data)

    def run(self, first: str, last: str) -> None:
        """Run the phases from ``first`` to ``last`` (in PHASES order) as one call."""
        start = self.ranges[first][0]
        end = self.ranges[last][1]
        if end > start:
            self._run(*self._ptrs, start, end)

    def write(self, off: int, data: np.ndarray) -> None:
        flat = data.reshape(-1)
        self.arena[off:off + flat.size] = flat

    def read(self, off: int, n: int) -> np.ndarray:
        return self.arena[off:off + n].astype(np.float64)

    def scalar(self, off: int) -> float:
        return float(self.arena[off])

    def set_scalar(self, off: int, value: float) -> None:
        self.arena[off] = value

    def synchronize(self) -> None:
        pass

    @property
    def nbytes(self) -> int:
        return self.arena.nbytes + self.meta.nbytes + self.table.nbytes

    def describe(self) -> str:
        extra = "" if self.variant == "tiled" else f", {self.variant} kernels"
        return f"host ({platform.machine()}, {self.program.dtype}{extra})"


__all__ = ["HostBackend", "HostBuildError", "load_library", "kernel_names", "library_path",
           "PHASES"]
