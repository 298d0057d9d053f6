"""The host backend: kernels.cu compiled by the system C compiler, run through ctypes.

``gradtool/csrc/kernels.cu`` is compiled as C (``cc -x c``) with
``host_prelude.h`` mapping the CUDA built-ins: a launch runs the kernel body
for every thread index in order.  Flags: ``-O3 -ffp-contract=off
-fno-math-errno`` (no FMA contraction, no fast-math: every + - * / sqrt is
one IEEE rounding, exactly as under nvcc's ``__d*_rn``; the inner products'
fused multiply-adds are written out, ``GT_FMA`` = ``fma()`` as nvcc's
``__fma_rn``), plus ``-march=native`` for wider vectors and the CPU's FMA
instructions, which change no result (SIMD lanes round like scalars, an FMA
instruction like ``fma()``; contraction stays off); the machine is part of the
cache key.  ``GRADTOOL_HOST_NATIVE=0`` leaves ``-march=native`` out.

Building and caching (by a hash of the five source files, the flags, the
compiler's version and the machine) is :mod:`gradtool.native`'s job; so is
building a fused program's generated source (:func:`host_library`, the source
from :mod:`gradtool.device.fusion`) into a second library.

A whole episode (forward, backward, optimizer) is ONE ctypes call into the
interpreter at the end of kernels.cu, which walks the launch table.  The
arena is a numpy array, so inputs, the loss and values are plain array reads
and writes.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import time
from pathlib import Path

import numpy as np

from .. import native
from ..errors import GradtoolError
from ..ops import pack
from .backends import Options
from .fusion import HEADERS as FUSED_HEADERS
from .program import DTYPES, PHASES, Program
from .staging import Staging

CSRC = native.CSRC
SOURCES = ("kernels.cu", "host_prelude.h", "gt_real.h", "gt_real32.h", "gt_bodies.h", "gt_math.h",
           "gt_ops.h", "gt_matmul.h", "gt_conv.h", "gt_optim.h", "gt_optim_table.h")
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
    for run in (lib.gt_run, lib.gt_run_fns):
        run.restype = None
        run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                        ctypes.c_longlong, ctypes.c_longlong]
    lib.gt_kernel_at.restype = ctypes.c_void_p
    lib.gt_kernel_at.argtypes = [ctypes.c_longlong]
    if lib.gt_real_bytes() != np.dtype(DTYPES[dtype]).itemsize:
        raise HostBuildError(f"{path} was built for another element type")
    native.register_threaded(lib)
    _LIBS[dtype, variant] = lib
    return lib


def kernel_names(dtype: str = "f64") -> list:
    return load_library(dtype).gt_kernel_names().decode().split()


# ── a fused program's library ─────────────────────────────────────────────

_HOST_LIBS: dict = {}


def host_flags(dtype: str) -> list:
    """The C compiler flags of a fused program's library (the kernel library's, as C)."""
    return ["-x", "c", *native.SAFE_FLAGS] + (["-DGT_REAL_F32"] if dtype == "f32" else [])


def host_library(source: str, dtype: str):
    """The fused source compiled by the system C compiler, cached by a hash of the source,
    the headers, the flags, the compiler and the machine (:mod:`gradtool.native`), and
    loaded once per process.  -> (ctypes library, {"seconds": build or load time,
    "cached": found already built})."""
    digest = hashlib.sha256(source.encode()).hexdigest()
    key = (digest, dtype)
    if key in _HOST_LIBS:
        return _HOST_LIBS[key], {"seconds": 0.0, "cached": True}
    t0 = time.perf_counter()
    folder = native.cache_dir() / "fused"
    folder.mkdir(parents=True, exist_ok=True)
    native.sweep_temporaries(folder, ".tmp")         # those of killed builds
    path = folder / f"gtf_{digest[:24]}.c"
    if not path.exists() or path.read_text() != source:
        fd, tmp = native.cache_temporary(folder, path.stem, ".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(source)
        os.replace(tmp, path)
    stem, flags = f"gt_fused_{dtype}", host_flags(dtype)
    headers = [CSRC / h for h in FUSED_HEADERS]
    wanted = flags + ([native.NATIVE_ARCH] if native.native_arch_wanted() else [])
    cached = native.library_path(stem, path, wanted, headers).exists()
    try:
        lib_path = native.build_best(stem, path, flags, headers)
    except native.NativeUnavailable as exc:
        raise GradtoolError(f"the fused kernels could not be built: {exc}") from None
    lib = ctypes.CDLL(str(lib_path))
    lib.gtf_kernel_at.restype = ctypes.c_void_p
    lib.gtf_kernel_at.argtypes = [ctypes.c_longlong]
    lib.gtf_real_bytes.restype = ctypes.c_int
    _HOST_LIBS[key] = lib
    return lib, {"seconds": time.perf_counter() - t0, "cached": cached}


class HostBackend:
    """A :class:`Program` instantiated on the host: the arena is a numpy array
    (a :class:`gradtool.device.backends.Backend`)."""

    name = "host"
    graph = None                          # an episode is one call: no graph to choose

    @classmethod
    def create(cls, program: Program, options: Options) -> "HostBackend":
        """The registry's factory (:mod:`gradtool.device.backends`)."""
        return cls(program, variant=options.host_kernels)

    def __init__(self, program: Program, variant: str = "tiled"):
        self.program = program
        self.variant = variant
        lib = load_library(program.dtype, variant)
        names = lib.gt_kernel_names().decode().split()
        index = {name: i for i, name in enumerate(names)}
        self._run = lib.gt_run
        self.fusion_build = None
        plan = program.fusion
        if plan is not None and plan.kernels:
            # fused kernels live in their own library: the launch table then holds
            # function pointers of both, run by gt_run_fns (gradtool/device/fusion.py)
            flib, self.fusion_build = host_library(plan.source, program.dtype)
            index = {name: lib.gt_kernel_at(i) for i, name in enumerate(names)}
            index.update({k.name: flib.gtf_kernel_at(j) for j, k in enumerate(plan.kernels)})
            self._run = lib.gt_run_fns
        self.meta, self.table, self.ranges = program.flatten(index)
        if self.fusion_build is not None and variant == "per-thread-reversed":
            fused = {k.name for k in plan.kernels}
            flat = [la for ph in PHASES for la in program.launches[ph]]
            for q, la in enumerate(flat):           # fused kernels walk last to first (M[1])
                if la.kernel in fused:
                    self.meta[self.table[2 * q + 1] + 1] = 1
        self.staging = Staging(program)
        # 8-byte aligned in every dtype: the float32 build's float64 staging area lives in it
        words = (self.staging.end * np.dtype(DTYPES[program.dtype]).itemsize + 7) // 8
        self.arena = np.zeros(max(words, 1), np.float64).view(DTYPES[program.dtype])
        self._ptrs = (self.arena.ctypes.data, self.meta.ctypes.data, self.table.ctypes.data)
        if self.staging.chunk:
            self._convert = (lib.gt_run, int(names.index("k_from_f64")),
                             self.arena[self.staging.off:].view(np.float64)[:self.staging.chunk])
        for off, data in program.init:
            self.write(off, np.asarray(data, dtype=np.float64))

    def run(self, first: str, last: str) -> None:
        """Run the phases from ``first`` to ``last`` (in PHASES order) as one call."""
        start = self.ranges[first][0]
        end = self.ranges[last][1]
        if end > start:
            self._run(*self._ptrs, start, end)

    def write(self, off: int, data: np.ndarray) -> None:
        """float64 ``data`` into the arena at ``off``: a copy in the float64 build; in the
        float32 build copied into the staging area and converted by k_from_f64 (float32
        ``data`` there: a plain copy, exact)."""
        if data.dtype == self.arena.dtype:
            self.arena[off:off + data.size] = data.reshape(-1)
            return
        flat = np.ascontiguousarray(data, dtype=np.float64).reshape(-1)
        if not self.staging.chunk:
            self.arena[off:off + flat.size] = flat
            return
        run, kernel, area = self._convert
        table = np.array([kernel, 0], dtype=np.int64)
        for start, n in self.staging.pieces(flat.size):
            area[:n] = flat[start:start + n]
            meta = np.array(pack("k_from_f64", n, dst=off + start, src=self.staging.off),
                            dtype=np.int64)
            run(self._ptrs[0], meta.ctypes.data, table.ctypes.data, 0, 1)

    def read(self, off: int, n: int) -> np.ndarray:
        return self.arena[off:off + n].astype(np.float64)

    def scalar(self, off: int) -> float:
        return float(self.arena[off])

    def set_scalar(self, off: int, value: float) -> None:
        self.arena[off] = value

    def set_scalars(self, off: int, values) -> None:
        self.arena[off:off + len(values)] = values

    def synchronize(self) -> None:
        pass

    @property
    def nbytes(self) -> int:
        return self.arena.nbytes + self.meta.nbytes + self.table.nbytes

    def describe(self) -> str:
        extra = "" if self.variant == "tiled" else f", {self.variant} kernels"
        return f"host ({platform.machine()}, {self.program.dtype}{extra})"


__all__ = ["HostBackend", "HostBuildError", "Staging", "load_library", "kernel_names",
           "library_path", "host_library", "host_flags", "PHASES"]
