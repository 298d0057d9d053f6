"""The host backend: kernels.cu compiled by the system C compiler, run through ctypes.

``gradtool/csrc/kernels.cu`` is compiled as C (``cc -x c``) with
``host_prelude.h`` mapping the CUDA built-ins: a launch runs the kernel body
for every thread index in order.  Flags: ``-O3 -ffp-contract=off
-fno-math-errno`` (no FMA contraction, no fast-math: every + - * / sqrt is
one IEEE rounding, exactly as under nvcc's ``__d*_rn``), plus
``-march=native`` for wider vectors, which changes no result (SIMD lanes
round like scalars; contraction stays off); the machine is part of the
cache key.  ``GRADTOOL_HOST_NATIVE=0`` leaves ``-march=native`` out.

The shared library is cached on disk under ``$GRADTOOL_CACHE`` (default
``~/.cache/gradtool``), named by a hash of the three source files, the flags,
the compiler's version and the machine, and written atomically.

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
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ..errors import GradtoolError
from .program import DTYPES, PHASES, Program

CSRC = Path(__file__).resolve().parent.parent / "csrc"
SOURCES = ("kernels.cu", "host_prelude.h", "gt_math.h")
BASE_FLAGS = ("-x", "c", "-O3", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC")
FORBIDDEN_FLAGS = ("-ffast-math", "-Ofast", "-ffp-contract=fast", "-funsafe-math-optimizations")


class HostBuildError(GradtoolError):
    """The host kernel library could not be built or loaded."""


def cache_dir() -> Path:
    """``$GRADTOOL_CACHE``, else ``~/.cache/gradtool``, else (not writable) a temp folder."""
    root = os.environ.get("GRADTOOL_CACHE")
    if root:
        return Path(root)
    home = Path.home() / ".cache" / "gradtool"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK):
            return home
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"gradtool-cache-{os.getuid()}"


def _compiler() -> str:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise HostBuildError(f"the host backend needs a C compiler, and {cc!r} is not on PATH "
                             f"(set CC or install gcc/clang)")
    return cc


def _machine_tag() -> str:
    """What -march=native depends on: the architecture and the CPU's feature flags."""
    tag = platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features", "model name")):
                    tag += "|" + line.strip()
    except OSError:
        tag += "|" + platform.processor()
    return tag


VARIANTS = ("tiled", "per-thread")


def _flags(dtype: str, native: bool, variant: str = "tiled") -> list:
    flags = list(BASE_FLAGS) + (["-march=native"] if native else [])
    if dtype == "f32":
        flags.append("-DGT_REAL_F32")
    if variant == "per-thread":
        flags.append("-DGT_PER_THREAD")       # the GPU's one-thread-per-output loop bodies
    assert not any(f in FORBIDDEN_FLAGS for f in flags)
    return flags


def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _source_text() -> bytes:
    return b"".join((CSRC / name).read_bytes() for name in SOURCES)


def library_path(dtype: str, native: bool = True, variant: str = "tiled") -> Path:
    """Where the cached library for this source, dtype, compiler and machine lives."""
    cc = _compiler()
    key = hashlib.sha256()
    key.update(_source_text())
    key.update(" ".join(_flags(dtype, native, variant)).encode())
    key.update(_compiler_version(cc).encode())
    if native:
        key.update(_machine_tag().encode())
    tag = "" if variant == "tiled" else "_pt"
    return cache_dir() / f"gt_kernels_{dtype}{tag}_{key.hexdigest()[:20]}.so"


def _build(dtype: str, native: bool, variant: str) -> Path:
    path = library_path(dtype, native, variant)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp.so", dir=path.parent)
    os.close(fd)
    cmd = [_compiler(), *_flags(dtype, native, variant), f"-I{CSRC}", str(CSRC / "kernels.cu"),
           "-o", tmp, "-lm"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            detail = " ".join((proc.stderr or proc.stdout).split())[:400]
            raise HostBuildError(f"compiling {CSRC / 'kernels.cu'} failed: {detail}")
        os.replace(tmp, path)                   # atomic: readers see all of it or nothing
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


_LIBS: dict = {}


def load_library(dtype: str, variant: str = "tiled"):
    """The compiled kernel library for ``dtype`` (built and cached on first use).

    ``variant="per-thread"`` builds the GPU's one-thread-per-output loop bodies
    instead of the host's tiled ones (for tests: the same bits, slower).
    """
    if variant not in VARIANTS:
        raise HostBuildError(f"unknown host kernel variant {variant!r}")
    if (dtype, variant) in _LIBS:
        return _LIBS[dtype, variant]
    native = os.environ.get("GRADTOOL_HOST_NATIVE", "1") != "0"
    try:
        path = _build(dtype, native, variant)
    except HostBuildError:
        if not native:
            raise
        path = _build(dtype, False, variant)   # a compiler that rejects -march=native
    lib = ctypes.CDLL(str(path))
    lib.gt_kernel_names.restype = ctypes.c_char_p
    lib.gt_kernel_names.argtypes = []
    lib.gt_real_bytes.restype = ctypes.c_int
    lib.gt_run.restype = None
    lib.gt_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_longlong, ctypes.c_longlong]
    if lib.gt_real_bytes() != np.dtype(DTYPES[dtype]).itemsize:
        raise HostBuildError(f"{path} was built for another element type")
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
           "cache_dir", "PHASES"]
