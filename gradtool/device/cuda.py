"""The CUDA backend: kernels.cu compiled by PyCUDA, run per launch or as a CUDA graph.

``pip install gradtool[gpu]`` brings PyCUDA.  The kernel file is compiled
once per process and dtype (``SourceModule``, cached by a hash of the source
with gt_math.h inlined, so a header change cannot hit a stale cubin), with
``--fmad=false`` on top of the explicit ``__d*_rn`` intrinsics.  Every
kernel takes two pointers (the arena and its metadata block) prepared as
``"PP"``.

Per-node launches (``graph=False``) call ``prepared_async_call`` on one
stream for every launch of the program.  With ``graph=True`` (the default)
the launches of a phase range -- e.g. a whole training episode: forward,
backward and optimizer -- are recorded once into a CUDA graph by stream
capture, instantiated, and replayed per step.  The recorded kernels,
arguments and order are the per-node path's, so both give identical bits;
per step the host only uploads the inputs and the optimizer's control
scalar (async copies on the same stream) and reads back the loss.

Stream capture goes through PyCUDA's ``Stream.begin_capture`` /
``end_capture`` / ``Graph.instantiate`` / ``GraphExec.launch`` where the
installed PyCUDA has them (its git main does; the 2026.1 release on PyPI
does not), and otherwise through the same four CUDA driver calls
(``cuStreamBeginCapture_v2``, ``cuStreamEndCapture``,
``cuGraphInstantiateWithFlags``, ``cuGraphLaunch``) made with ctypes on
PyCUDA's own stream handle, in PyCUDA's context.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import hashlib
import weakref

import numpy as np

from ..errors import GradtoolError
from .host import CSRC
from .program import DTYPES, PHASES, Program

BLOCK = 256
MAX_GRID = 1 << 16


def cuda_status() -> tuple:
    """(usable, description): PyCUDA importable and at least one CUDA device."""
    try:
        import pycuda.driver as drv
    except ImportError:
        return False, "PyCUDA is not installed (pip install 'gradtool[gpu]')"
    except Exception as exc:  # noqa: BLE001 - a broken install must not crash `auto`
        return False, f"PyCUDA failed to import: {type(exc).__name__}: {exc}"
    try:
        drv.init()
        count = drv.Device.count()
    except Exception as exc:  # noqa: BLE001 - no driver, no device, ...
        return False, f"no usable CUDA driver ({' '.join(str(exc).split())})"
    if count < 1:
        return False, "no CUDA device"
    return True, f"cuda device 0: {drv.Device(0).name()}"


def kernel_source() -> str:
    """kernels.cu with gt_math.h inlined (host_prelude.h is host-only)."""
    src = (CSRC / "kernels.cu").read_text()
    header = (CSRC / "gt_math.h").read_text()
    return src.replace('#include "gt_math.h"', header, 1)


_MODULES: dict = {}
_LIVE = weakref.WeakSet()           # backends whose device memory must go before the context
_CLEANUP_REGISTERED = []


def _release_all() -> None:
    for backend in list(_LIVE):
        backend.close()
    _MODULES.clear()


def _module(dtype: str):
    import pycuda.autoinit  # noqa: F401 - creates the context on device 0, pops it at exit
    from pycuda.compiler import SourceModule

    if not _CLEANUP_REGISTERED:
        # atexit runs last-registered first: this frees our buffers, graphs and modules
        # while pycuda.autoinit's context still exists
        atexit.register(_release_all)
        _CLEANUP_REGISTERED.append(True)

    src = kernel_source()
    key = (hashlib.sha256(src.encode()).hexdigest(), dtype)
    if key not in _MODULES:
        options = ["--fmad=false"] + (["-DGT_REAL_F32"] if dtype == "f32" else [])
        try:
            _MODULES[key] = SourceModule(src, options=options, no_extern_c=True)
        except Exception as exc:  # noqa: BLE001 - CompileError carries nvcc's output
            raise GradtoolError(f"nvcc could not compile {CSRC / 'kernels.cu'}: "
                                f"{' '.join(str(exc).split())[:400]}") from None
    return _MODULES[key]


CAPTURE_MODE_RELAXED = 2          # CUstreamCaptureMode: our thread makes no unsafe calls anyway


class DriverGraphs:
    """Stream capture through the CUDA driver API, for a PyCUDA without graph support."""

    def __init__(self):
        name = ctypes.util.find_library("cuda") or "libcuda.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            raise GradtoolError(f"CUDA graphs need the driver library ({exc}); use --no-graph")
        vp, pvp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        sigs = {"cuStreamBeginCapture_v2": (vp, ctypes.c_int),
                "cuStreamEndCapture": (vp, pvp),
                "cuGraphInstantiateWithFlags": (pvp, vp, ctypes.c_ulonglong),
                "cuGraphLaunch": (vp, vp),
                "cuGraphExecDestroy": (vp,),
                "cuGraphDestroy": (vp,)}
        for fname, args in sigs.items():
            fn = getattr(lib, fname)
            fn.argtypes, fn.restype = list(args), ctypes.c_int
        self.lib = lib

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise GradtoolError(f"{what} failed (CUresult {rc}); rerun with --no-graph")

    def capture(self, stream, record) -> tuple:
        """Record everything ``record()`` enqueues on ``stream``; (graph, executable)."""
        handle = ctypes.c_void_p(stream.handle)
        self._check(self.lib.cuStreamBeginCapture_v2(handle, CAPTURE_MODE_RELAXED),
                    "cuStreamBeginCapture")
        graph = ctypes.c_void_p()
        try:
            record()
        finally:
            rc = self.lib.cuStreamEndCapture(handle, ctypes.byref(graph))
        self._check(rc, "cuStreamEndCapture")
        exe = ctypes.c_void_p()
        rc = self.lib.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0)
        if rc != 0:
            self.lib.cuGraphDestroy(graph)
        self._check(rc, "cuGraphInstantiateWithFlags")
        return graph, exe

    def launch(self, pair, stream) -> None:
        self._check(self.lib.cuGraphLaunch(pair[1], ctypes.c_void_p(stream.handle)),
                    "cuGraphLaunch")

    def destroy(self, pair) -> None:
        self.lib.cuGraphExecDestroy(pair[1])
        self.lib.cuGraphDestroy(pair[0])


class PycudaGraphs:
    """Stream capture through PyCUDA's own API (Stream.begin_capture and friends)."""

    def __init__(self, drv):
        self.drv = drv

    def capture(self, stream, record) -> tuple:
        mode = getattr(getattr(self.drv, "capture_mode", None), "RELAXED", None)
        if mode is None:
            stream.begin_capture()
        else:
            stream.begin_capture(mode)
        try:
            record()
        finally:
            graph = stream.end_capture()
        return graph, graph.instantiate()

    def launch(self, pair, stream) -> None:
        pair[1].launch(stream)

    def destroy(self, pair) -> None:
        pass                            # PyCUDA frees its Graph/GraphExec objects itself


def graph_api(drv):
    """PyCUDA's graph API where it exists, else the driver's through ctypes."""
    if hasattr(drv.Stream, "begin_capture") and hasattr(drv, "Graph"):
        return PycudaGraphs(drv)
    return DriverGraphs()


def _geometry(work: int) -> tuple:
    if work <= 1:
        return (1, 1), (32, 1, 1)
    blocks = min((work + BLOCK - 1) // BLOCK, MAX_GRID)
    return (blocks, 1), (BLOCK, 1, 1)


class CudaBackend:
    """A :class:`Program` instantiated on the GPU: one arena, one metadata array."""

    name = "cuda"

    def __init__(self, program: Program, graph: bool = True):
        import pycuda.driver as drv

        self.drv = drv
        self.program = program
        self.graph = graph
        module = _module(program.dtype)
        self.dtype = np.dtype(DTYPES[program.dtype])
        names = sorted({launch.kernel for ph in PHASES for launch in program.launches[ph]})
        funcs = {}
        for name in names:
            funcs[name] = module.get_function(name)
            funcs[name].prepare("PP")
        index = {name: i for i, name in enumerate(names)}
        meta, table, self.ranges = program.flatten(index)

        self.arena_bytes = max(program.size, 1) * self.dtype.itemsize
        self.arena = drv.mem_alloc(self.arena_bytes)
        drv.memset_d8(self.arena, 0, self.arena_bytes)
        self.meta = drv.to_device(meta)
        self.meta_bytes = meta.nbytes
        self.stream = drv.Stream()
        self._held = []                # host buffers of async copies still in flight
        for off, data in program.init:
            self.write(off, np.asarray(data, dtype=np.float64).astype(self.dtype))

        base_w, base_m = int(self.arena), int(self.meta)
        self.launches = []
        flat = [launch for ph in PHASES for launch in program.launches[ph]]
        for q, launch in enumerate(flat):
            grid, block = _geometry(launch.work)
            meta_ptr = base_m + 8 * int(table[2 * q + 1])
            self.launches.append((funcs[launch.kernel], grid, block, (base_w, meta_ptr)))
        self._graphs = {}
        self._graph_api = graph_api(drv) if graph else None
        self.synchronize()
        _LIVE.add(self)

    def close(self) -> None:
        """Free the device memory and graphs now (also done at interpreter exit)."""
        if self.arena is None:
            return
        self.stream.synchronize()
        for pair in self._graphs.values():
            self._graph_api.destroy(pair)
        self._graphs.clear()
        self.launches = []
        self.arena.free()
        self.meta.free()
        self.arena = self.meta = None

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
                self.stream, lambda: self._launch_range(start, end))
        self._graph_api.launch(self._graphs[key], self.stream)

    def _launch_range(self, start: int, end: int) -> None:
        stream = self.stream
        for func, grid, block, args in self.launches[start:end]:
            func.prepared_async_call(grid, block, stream, *args)

    # ── memory ─────────────────────────────────────────────────────────────
    def _ptr(self, off: int) -> int:
        return int(self.arena) + off * self.dtype.itemsize

    def write(self, off: int, data: np.ndarray) -> None:
        buf = np.ascontiguousarray(data, dtype=self.dtype).reshape(-1)
        self.drv.memcpy_htod_async(self._ptr(off), buf, self.stream)
        self._held.append(buf)

    def read(self, off: int, n: int) -> np.ndarray:
        self.synchronize()
        out = np.empty(n, dtype=self.dtype)
        self.drv.memcpy_dtoh(out, self._ptr(off))
        return out.astype(np.float64)

    def scalar(self, off: int) -> float:
        return float(self.read(off, 1)[0])

    def set_scalar(self, off: int, value: float) -> None:
        self.write(off, np.array([value], dtype=self.dtype))

    def synchronize(self) -> None:
        self.stream.synchronize()
        self._held.clear()

    @property
    def nbytes(self) -> int:
        return self.arena_bytes + self.meta_bytes

    def describe(self) -> str:
        how = {None: "", "PycudaGraphs": ", graphs via PyCUDA",
               "DriverGraphs": ", graphs via the driver API"}[
            type(self._graph_api).__name__ if self._graph_api else None]
        return f"cuda ({self.drv.Context.get_device().name()}, {self.program.dtype}{how})"


__all__ = ["CudaBackend", "cuda_status", "kernel_source"]
