"""The CUDA backend: kernels.cu compiled by PyCUDA, run per launch or as a CUDA graph.

``pip install gradtool[gpu]`` brings PyCUDA.  Everything runs in the
device's PRIMARY context (``pycuda.autoprimaryctx``), the one the CUDA
runtime -- PyTorch, CuPy -- uses too: with a context of PyCUDA's own
(``pycuda.autoinit``), the first runtime call of another library in the
same process (``cudaSetDevice``) makes the primary context current, and
every later PyCUDA call then runs against the wrong context.

The kernel file is compiled once per process and dtype (PyCUDA's nvcc call,
the cubin cached by gradtool under a hash of the source with gt_math.h
inlined, so a header change cannot hit a stale cubin: :func:`_cubin`) with :func:`nvcc_options`: ``--fmad=false`` on
top of the explicit ``__d*_rn`` intrinsics (the inner products' one fused
operation is the explicit ``__fma_rn``, which ``--fmad=false`` leaves alone).  The kernels are declared
``extern "C"`` in the file itself (hence ``no_extern_c=True``), so their
names are not mangled.  Every kernel takes two pointers (the arena and its
metadata block); each launch's 16-byte argument buffer is packed once, here,
and handed to PyCUDA's ``cuLaunchKernel`` wrapper (``Function._launch_kernel``,
what ``prepared_async_call`` ends in, minus its per-call argument packing and
its deprecated ``cuFuncSetBlockShape``).

Per-node launches (``graph=False``) enqueue every launch of a phase range on
one stream.  With ``graph=True`` (the default) the same launches -- e.g. a
whole training episode: forward, backward and optimizer -- are recorded once
into a CUDA graph by stream capture, instantiated, and replayed per step, so
both give identical bits.  The captured kernels read everything that changes
between steps from device memory (input slots and the optimizer's control
buffer, written by async copies on the same stream before the launch), and
nothing inside the capture allocates or synchronizes: the recorded callable
makes no CUDA call but ``cuLaunchKernel``, and the capture is checked to
hold exactly one node per launch.

PyCUDA's 2026.1 release has no graph API, so the capture is four CUDA
driver calls made with ctypes on PyCUDA's own stream handle, in the same
(current) context: ``cuStreamBeginCapture_v2``, ``cuStreamEndCapture``,
``cuGraphInstantiateWithFlags`` and ``cuGraphLaunch``.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import functools
import hashlib
import os
import re
import struct
import time
import weakref

import numpy as np

from .. import native
from ..errors import GradtoolError
from ..native import CSRC
from ..ops import pack
from .backends import Options
from .program import DTYPES, PHASES, Program
from .staging import Staging

BLOCK = 256
MAX_GRID = 1 << 16


def cuda_status() -> tuple:
    """(usable, description): PyCUDA importable and at least one CUDA device."""
    try:
        import pycuda.driver as drv
    except ModuleNotFoundError as exc:
        if exc.name in ("pycuda", "pycuda.driver"):
            return False, "PyCUDA is not installed (pip install 'gradtool[gpu]')"
        return False, f"PyCUDA failed to import: {exc}"
    except Exception as exc:  # noqa: BLE001 - no libcuda, a broken install: `auto` goes on
        return False, f"PyCUDA failed to import: {type(exc).__name__}: {exc}"
    try:
        drv.init()
        count = drv.Device.count()
    except Exception as exc:  # noqa: BLE001 - no driver, no device, ...
        return False, f"no usable CUDA driver ({' '.join(str(exc).split())})"
    if count < 1:
        return False, "no CUDA device"
    return True, f"cuda device 0: {drv.Device(0).name()}"


def select_device(local_rank: int) -> None:
    """Several MPI ranks on one machine: rank ``local_rank`` takes GPU local rank mod
    count (through ``CUDA_DEVICE``, which PyCUDA's context reads), unless the user chose
    (``CUDA_DEVICE`` or ``CUDA_VISIBLE_DEVICES`` set).  Before any context exists."""
    if "CUDA_DEVICE" in os.environ or "CUDA_VISIBLE_DEVICES" in os.environ:
        return
    try:
        import pycuda.driver as drv
        drv.init()
        count = drv.Device.count()
    except Exception:  # noqa: BLE001 - no PyCUDA or no GPU: the backend says so itself
        return
    if count > 0:
        os.environ["CUDA_DEVICE"] = str(local_rank % count)


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[^\n]*$', re.M)


def inline_headers(src: str) -> str:
    """``src`` with every ``#include "header"`` of gradtool/csrc inlined, recursively and
    once each (host_prelude.h, host-only, stays a line nvcc never reaches): what nvcc
    compiles, and what a module cache is keyed by."""
    seen = set()

    def expand(text: str) -> str:
        def one(match):
            name = match.group(1)
            if name == "host_prelude.h" or not (CSRC / name).is_file():
                return match.group(0)
            if name in seen:
                return ""
            seen.add(name)
            return expand((CSRC / name).read_text())
        return _INCLUDE.sub(one, text)

    return expand(src)


def kernel_source() -> str:
    """kernels.cu with its headers inlined: what nvcc compiles."""
    return inline_headers((CSRC / "kernels.cu").read_text())


def nvcc_options(dtype: str) -> list:
    """The options :func:`_cubin` hands nvcc (PyCUDA's compile adds --cubin, -arch sm_XY
    and -I)."""
    return ["--fmad=false"] + (["-DGT_REAL_F32", "-ftz=false"] if dtype == "f32" else [])


# ── context and modules ───────────────────────────────────────────────────

_MODULES: dict = {}
_LIVE = weakref.WeakSet()           # backends whose device memory must go before the context
_STATE = {"registered": False, "context_alive": False}


def _release_all() -> None:
    """atexit: free every backend's memory, graphs and the modules while the context lives."""
    for backend in list(_LIVE):
        try:
            backend.close()
        except Exception:  # noqa: BLE001 - a device in an error state must not spoil the exit
            pass
    _MODULES.clear()
    _STATE["context_alive"] = False


def _ensure_context() -> None:
    # the primary context, pushed on this thread; pycuda.autoprimaryctx pops it at exit
    import pycuda.autoprimaryctx  # noqa: F401

    if not _STATE["registered"]:
        # atexit runs last-registered first: this runs before autoprimaryctx's pop
        atexit.register(_release_all)
        _STATE["registered"] = True
    _STATE["context_alive"] = True


def _one_line(exc: BaseException, limit: int = 400) -> str:
    return " ".join(str(exc).split())[:limit]


def _cubin(src: str, dtype: str) -> bytes:
    """nvcc's cubin of ``src`` for the current device, from gradtool's cache
    (``$GRADTOOL_CACHE/cuda``, :func:`gradtool.native.cached_bytes`: written by an atomic
    rename, its temporaries of killed builds swept), keyed by the source, the options,
    the device's architecture and nvcc's version.  Not PyCUDA's own cubin cache, which
    writes its file in place: a build killed mid-write left a truncated cubin that every
    later run failed to load."""
    import pycuda.driver as drv
    from pycuda.compiler import compile as nvcc_compile
    from pycuda.compiler import get_nvcc_version

    options = nvcc_options(dtype)
    arch = "sm_%d%d" % drv.Context.get_device().compute_capability()
    key = hashlib.sha256("\0".join([src, *options, arch, get_nvcc_version("nvcc")])
                         .encode()).hexdigest()[:32]
    cubin, _ = native.cached_bytes(
        native.cache_dir() / "cuda", f"gt_{dtype}_{key}.cubin",
        lambda: nvcc_compile(src, options=options, no_extern_c=True, arch=arch,
                             cache_dir=False))
    return cubin


def _module(dtype: str, src: str = None, label: str = None):
    """The compiled module of ``src`` (default: kernels.cu with its headers), per process
    and dtype, keyed by a hash of the source."""
    _ensure_context()
    import pycuda.driver as drv

    src = kernel_source() if src is None else src
    label = label or str(CSRC / "kernels.cu")
    key = (hashlib.sha256(src.encode()).hexdigest(), dtype)
    if key in _MODULES:
        return _MODULES[key]
    try:
        module = drv.module_from_buffer(_cubin(src, dtype))
    except drv.CompileError as exc:       # nvcc ran and failed: its message names the line
        raise GradtoolError(f"nvcc could not compile {label}: {_one_line(exc)}") from None
    except OSError as exc:                # nvcc missing or not runnable
        raise GradtoolError(f"the cuda backend could not run nvcc for {label} "
                            f"(is the CUDA toolkit's bin on PATH?): {_one_line(exc)}") from None
    except drv.Error as exc:              # the driver refused the compiled module
        raise GradtoolError(f"the CUDA driver could not load the kernels compiled from "
                            f"{label}: {_one_line(exc)}") from None
    _MODULES[key] = module
    return module


def fused_source(plan) -> str:
    """A fusion plan's generated source with its headers inlined: what nvcc compiles."""
    return inline_headers(plan.source)


# ── CUDA graphs through the driver API ────────────────────────────────────

CU_STREAM_CAPTURE_MODE_RELAXED = 2   # CUstreamCaptureMode: GLOBAL 0, THREAD_LOCAL 1, RELAXED 2


def _load_libcuda():
    # libcuda.so.1 first: PyCUDA's extension already loaded it, so this is the same library
    # (a bare find_library("cuda") can name the toolkit's link-time stub instead)
    names = ["libcuda.so.1", ctypes.util.find_library("cuda")]
    if os.name == "nt":
        names.append("nvcuda.dll")
    errors = []
    for name in names:
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise GradtoolError(f"CUDA graphs need the driver library libcuda ({'; '.join(errors)}); "
                        f"use --no-graph")


class DriverGraphs:
    """Stream capture, instantiation and launch through the CUDA driver API (ctypes)."""

    def __init__(self):
        lib = _load_libcuda()
        vp, pvp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        sigs = {   # CUresult f(...), from cuda.h
            "cuStreamBeginCapture_v2": (vp, ctypes.c_int),            # (CUstream, mode)
            "cuStreamEndCapture": (vp, pvp),                          # (CUstream, CUgraph *)
            "cuGraphGetNodes": (vp, pvp, ctypes.POINTER(ctypes.c_size_t)),
            "cuGraphInstantiateWithFlags": (pvp, vp, ctypes.c_ulonglong),
            "cuGraphLaunch": (vp, vp),                                # (CUgraphExec, CUstream)
            "cuGraphExecDestroy": (vp,),
            "cuGraphDestroy": (vp,),
            "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
        }
        for fname, args in sigs.items():
            try:
                fn = getattr(lib, fname)
            except AttributeError:
                raise GradtoolError(f"the CUDA driver has no {fname} (too old for CUDA graphs); "
                                    f"use --no-graph") from None
            fn.argtypes, fn.restype = list(args), ctypes.c_int
        self.lib = lib

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            known = self.lib.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value
            label = name.value.decode() if known else "unknown"
            raise GradtoolError(f"{what} failed (CUresult {rc}, {label}); rerun with --no-graph")

    def capture(self, stream, record, expected_nodes: int) -> "DriverGraph":
        """Record what ``record()`` enqueues on ``stream`` (PyCUDA Stream) and instantiate it.

        ``record`` must enqueue exactly ``expected_nodes`` kernel launches and
        nothing else; anything else (a copy, a launch on another stream) fails.
        """
        handle = ctypes.c_void_p(stream.handle)
        self._check(self.lib.cuStreamBeginCapture_v2(handle, CU_STREAM_CAPTURE_MODE_RELAXED),
                    "cuStreamBeginCapture")
        graph = ctypes.c_void_p()
        try:
            record()
        except BaseException:
            if self.lib.cuStreamEndCapture(handle, ctypes.byref(graph)) == 0 and graph.value:
                self.lib.cuGraphDestroy(graph)
            raise
        self._check(self.lib.cuStreamEndCapture(handle, ctypes.byref(graph)),
                    "cuStreamEndCapture")
        result = DriverGraph(self.lib, graph)
        count = ctypes.c_size_t(0)
        self._check(self.lib.cuGraphGetNodes(graph, None, ctypes.byref(count)), "cuGraphGetNodes")
        if count.value != expected_nodes:
            result.close()
            raise GradtoolError(f"the captured CUDA graph has {count.value} nodes, expected one "
                                f"per launch ({expected_nodes}); rerun with --no-graph")
        exe = ctypes.c_void_p()
        rc = self.lib.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0)
        if rc != 0:
            result.close()
        self._check(rc, "cuGraphInstantiateWithFlags")
        result.exe = exe
        return result


class DriverGraph:
    """One captured graph and its executable; freed by :meth:`close` (or when collected)."""

    def __init__(self, lib, graph):
        self.lib, self.graph, self.exe = lib, graph, None

    def launch(self, stream) -> None:
        rc = self.lib.cuGraphLaunch(self.exe, ctypes.c_void_p(stream.handle))
        if rc != 0:
            raise GradtoolError(f"cuGraphLaunch failed (CUresult {rc}); rerun with --no-graph")

    def close(self) -> None:
        if self.exe is not None:
            self.lib.cuGraphExecDestroy(self.exe)
            self.exe = None
        if self.graph is not None:
            self.lib.cuGraphDestroy(self.graph)
            self.graph = None

    def __del__(self):
        try:
            if _STATE["context_alive"]:  # after _release_all the context may be gone
                self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# ── the backend ───────────────────────────────────────────────────────────

def geometry(work: int, rows_block: int = 0) -> tuple:
    """(grid, block) for a grid-stride loop over ``work`` thread indices.

    A serial kernel (sum, clip norm, guard) has work 1: its GT_LOOP runs the
    body for global thread index 0 only, whatever the block size.  A fused
    block kernel (``rows_block`` > 0 threads per block) gets one block per row
    of its ``work`` rows, up to the grid limit (it strides over the rest).
    """
    if rows_block:
        return (min(work, MAX_GRID), 1), (rows_block, 1, 1)
    if work <= 1:
        return (1, 1), (32, 1, 1)
    blocks = min((work + BLOCK - 1) // BLOCK, MAX_GRID)
    return (blocks, 1), (BLOCK, 1, 1)


class CudaBackend:
    """A :class:`Program` instantiated on the GPU: one arena, one metadata array
    (a :class:`gradtool.device.backends.Backend`)."""

    name = "cuda"

    @classmethod
    def create(cls, program: Program, options: Options) -> "CudaBackend":
        """The registry's factory (:mod:`gradtool.device.backends`)."""
        return cls(program, graph=options.graph)

    def __init__(self, program: Program, graph: bool = True):
        import pycuda.driver as drv

        self.drv = drv
        self.program = program
        self.graph = graph
        self.arena = None
        module = _module(program.dtype)          # also makes the context current
        self.dtype = np.dtype(DTYPES[program.dtype])
        names = sorted({launch.kernel for ph in PHASES for launch in program.launches[ph]})
        self.fusion_build = None
        fused, fused_module = set(), module
        plan = program.fusion
        if plan is not None and plan.kernels:
            t0 = time.perf_counter()
            fused_module = _module(program.dtype, fused_source(plan),
                                   f"the fused kernels of this tape ({plan.digest[:12]})")
            # PyCUDA's cubin cache may have answered: the time says which
            self.fusion_build = {"seconds": time.perf_counter() - t0, "cached": None}
            fused = {k.name for k in plan.kernels}
        funcs = {name: (fused_module if name in fused else module).get_function(name)
                 for name in names}
        index = {name: i for i, name in enumerate(names)}
        meta, table, self.ranges = program.flatten(index)
        self._graphs = {}
        self._graph_api = DriverGraphs() if graph else None

        self.stream = drv.Stream()
        self.staging = Staging(program)           # float32: where float64 uploads land
        self.arena_bytes = self.staging.end * self.dtype.itemsize
        self.arena = drv.mem_alloc(self.arena_bytes)
        drv.memset_d8_async(self.arena, 0, self.arena_bytes, self.stream)
        self.meta = drv.to_device(meta)
        self.meta_bytes = meta.nbytes
        self._pinned = drv.pagelocked_empty(1, self.dtype)    # the loss comes back through it
        self._held = []                # host buffers of async copies still in flight
        if self.staging.chunk:
            # k_from_f64's metadata block, rewritten (stream-ordered) before each conversion
            self._convert_meta = drv.mem_alloc(8 * 3)
            self._convert = module.get_function("k_from_f64")
        for off, data in program.init:
            self.write(off, np.asarray(data, dtype=np.float64))

        base_m = int(self.meta)
        self.launches = []             # one bound call per launch, in table order
        flat = [launch for ph in PHASES for launch in program.launches[ph]]
        for q, launch in enumerate(flat):
            grid, block = geometry(launch.work, getattr(launch, "block", 0))
            self.launches.append(self._bind(funcs[launch.kernel], grid, block,
                                            base_m + 8 * int(table[2 * q + 1])))
        self.synchronize()
        _LIVE.add(self)

    def _bind(self, func, grid, block, meta_ptr: int):
        """A call that enqueues ``func(arena, meta_ptr)`` on the stream."""
        if hasattr(func, "_launch_kernel"):
            args = struct.pack("@PP", int(self.arena), meta_ptr)  # (gt_real *W, const long long *M)
            return functools.partial(func._launch_kernel, grid, block, args, 0, self.stream)
        func.prepare("PP")                                        # a PyCUDA without it: same launch
        return functools.partial(func.prepared_async_call, grid, block, self.stream,
                                 int(self.arena), meta_ptr)

    def close(self) -> None:
        """Free the device memory and graphs now (also done at interpreter exit)."""
        if self.arena is None:
            return
        self.stream.synchronize()
        for g in self._graphs.values():
            g.close()
        self._graphs.clear()
        self.launches = []
        self._held.clear()
        self.arena.free()
        self.meta.free()
        if self.staging.chunk:
            self._convert_meta.free()
        # the rest goes now too, while the context still exists (not at some later collection)
        self.arena = self.meta = self._pinned = self.stream = None

    # ── running ────────────────────────────────────────────────────────────
    def run(self, first: str, last: str) -> None:
        start, end = self.ranges[first][0], self.ranges[last][1]
        if end <= start:
            return
        if not self.graph:
            self._launch_range(start, end)
            return
        key = (start, end)
        if key not in self._graphs:
            self._graphs[key] = self._graph_api.capture(
                self.stream, lambda: self._launch_range(start, end), end - start)
        self._graphs[key].launch(self.stream)

    def _launch_range(self, start: int, end: int) -> None:
        for call in self.launches[start:end]:
            call()

    # ── memory ─────────────────────────────────────────────────────────────
    def _ptr(self, off: int) -> int:
        return int(self.arena) + off * self.dtype.itemsize

    def write(self, off: int, data: np.ndarray) -> None:
        """float64 ``data`` into the arena at ``off``: a plain copy in the float64 build; in
        the float32 build copied as float64 into the staging area and converted there by
        k_from_f64 (no host pass over the data)."""
        flat = np.ascontiguousarray(data, dtype=np.float64).reshape(-1)
        if not self.staging.chunk:
            self.drv.memcpy_htod_async(self._ptr(off), flat, self.stream)
            self._held.append(flat)
            return
        for start, n in self.staging.pieces(flat.size):
            piece = flat[start:start + n]
            meta = np.array(pack("k_from_f64", n, dst=off + start, src=self.staging.off),
                            dtype=np.int64)
            self.drv.memcpy_htod_async(self._ptr(self.staging.off), piece, self.stream)
            self.drv.memcpy_htod_async(self._convert_meta, meta, self.stream)
            grid, block = geometry(n)
            self._bind(self._convert, grid, block, int(self._convert_meta))()
            self._held += [piece, meta]

    def read(self, off: int, n: int) -> np.ndarray:
        self.synchronize()
        out = np.empty(n, dtype=self.dtype)
        if n:
            self.drv.memcpy_dtoh(out, self._ptr(off))
        return out.astype(np.float64)

    def scalar(self, off: int) -> float:
        # one async copy into page-locked memory and one stream sync: the per-episode loss
        self.drv.memcpy_dtoh_async(self._pinned, self._ptr(off), self.stream)
        self.synchronize()
        return float(self._pinned[0])

    def set_scalar(self, off: int, value: float) -> None:
        # one value (the step's lr_t): rounded here, no conversion launch per step
        buf = np.array([value], dtype=self.dtype)
        self.drv.memcpy_htod_async(self._ptr(off), buf, self.stream)
        self._held.append(buf)

    def set_scalars(self, off: int, values) -> None:
        # the optimizer's per-step scalars: one copy, rounded here
        buf = np.array(values, dtype=self.dtype)
        self.drv.memcpy_htod_async(self._ptr(off), buf, self.stream)
        self._held.append(buf)

    def synchronize(self) -> None:
        self.stream.synchronize()
        self._held.clear()

    @property
    def nbytes(self) -> int:
        return self.arena_bytes + self.meta_bytes

    def describe(self) -> str:
        how = ", graphs via the driver API" if self._graph_api else ""
        return f"cuda ({self.drv.Context.get_device().name()}, {self.program.dtype}{how})"


__all__ = ["CudaBackend", "cuda_status", "select_device", "kernel_source", "fused_source", "inline_headers",
           "nvcc_options", "geometry"]
