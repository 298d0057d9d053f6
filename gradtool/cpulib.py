"""The ctypes loader of the CPU reference's compiled kernels (``csrc/gt_cpu.c``).

:mod:`gradtool.numerics` defines the floating-point orders; this module builds, loads and
declares the C library that runs them compiled (the matmul tiles, the row sums, the
convolution and pooling kernels, the select, the optimizer step), for float64 and, as
``gt_cpu_f32``, for float32.  Everything it exports is re-exported by
:mod:`gradtool.numerics` (``numerics.cpu_kernels()`` etc.), the names callers use.

The default library is the one value ``_DEFAULT`` holds (``[library or None]`` once asked
for); :mod:`gradtool.numerics` reads it here, at call time, so a test that sets
``cpulib._DEFAULT = [None]`` runs every caller as without a C compiler.
"""

from __future__ import annotations

import ctypes

from . import native

__all__ = ["CPU_SOURCES", "cpu_library", "cpu_kernels", "cpu_kernels32", "matmul_config"]


CPU_SOURCES = ("gt_cpu.c", "gt_matmul.h", "gt_conv.h", "gt_optim.h", "gt_optim_table.h")
_LIBRARIES: dict = {}         # (extra flags, native arch) -> loaded library or None
_DEFAULT: list = []           # [library or None] once the default one was asked for


def cpu_library(extra_flags=(), native_arch=None, python=True, dtype="f64"):
    """The CPU reference's compiled kernels, ``csrc/gt_cpu.c`` (built and cached on first
    use), or None: the matmul (``gt_mm``), the broadcast reduction's row sums
    (``gt_sum_rows``, ``gt_sum_outer_inner``), conv2d's products and max pooling
    (``gt_conv2d*``, ``gt_max_pool2d*``: ``csrc/gt_conv.h``) and the optimizer step
    (``gt_opt_step``).

    The default (no arguments) is the one :func:`matmul`, :func:`bmm` and
    :mod:`gradtool.optim` use.  ``extra_flags=("-DGT_MM_PORTABLE",)`` builds
    the plain-C scalar matmul tile, and ``native_arch=False`` leaves
    ``-march=native`` out: the tests run every such variant against the
    naive order.  None when no C compiler works or ``GRADTOOL_NATIVE=0``.

    With ``python`` (and the interpreter's ``Python.h``: :func:`native.python_flags`)
    the library also has ``gt_mm_py``, which :func:`matmul` and :func:`bmm` call with
    the arrays themselves (``lib.py_mm``, else None), and the same for the optimizer
    step, the select and the row sums (``lib.py_opt_step``, ``py_select_zero``,
    ``py_sum``); ``python=False`` builds the plain ctypes entries only, which the
    tests compare with them bit for bit.

    ``dtype="f32"``: the same source built for float32 (``-DGT_CPU_F32``, library
    ``gt_cpu_f32``): the same entries on float32 arrays (the matmul tiles of
    ``gt_matmul.h`` and ``gt_conv.h`` instantiated for float: one ``fmaf`` chain per
    output, :mod:`gradtool.numerics32`'s products; the select; the optimizer step, its
    scalars rounded to float32 once), for :mod:`gradtool.numerics32`.  It has no row
    sums (``gt_sum_rows`` is the float64 serial order; numerics32 sums in numpy).
    """
    if dtype not in ("f64", "f32"):
        raise ValueError(f"cpu_library: dtype must be 'f64' or 'f32', not {dtype!r}")
    if native_arch is None:
        native_arch = native.native_arch_wanted()
    key = (tuple(extra_flags), bool(native_arch), bool(python), dtype)
    if key not in _LIBRARIES:
        lib = None
        if native.enabled():
            sources = (native.CSRC / CPU_SOURCES[0],
                       [native.CSRC / name for name in CPU_SOURCES[1:]])
            with_python = native.python_flags() if python else ()
            # with the Python entry first; a compiler that refuses it (a Python.h it
            # cannot use) still builds the ctypes entries
            stem, typed = ("gt_cpu", ()) if dtype == "f64" else ("gt_cpu_f32", ("-DGT_CPU_F32",))
            for flags in ([with_python, ()] if with_python else [()]):
                try:
                    lib = native.load(stem, sources[0],
                                      [*native.SAFE_FLAGS, *typed, *extra_flags, *flags],
                                      sources[1], native_arch=native_arch)
                    _declare(lib, bool(flags), dtype)
                    native.register_threaded(lib)
                    break
                except (native.NativeUnavailable, OSError, AttributeError):
                    lib = None
        _LIBRARIES[key] = lib
    return _LIBRARIES[key]


def _declare(lib, python=False, dtype="f64") -> None:
    i64, ptr, f64 = ctypes.c_longlong, ctypes.c_void_p, ctypes.c_double
    # the Python entries (lib.py_*, None without them): the same library again (dlopen
    # returns the loaded one: one thread pool), its functions called with the GIL held,
    # as their buffer calls need (they release it for the work)
    obj, cint = ctypes.py_object, ctypes.c_int
    entries = {"py_mm": ("gt_mm_py", [obj, obj, obj, cint]),
               "py_opt_step": ("gt_opt_step_py", [cint, obj, obj, obj, obj, cint,
                                                  *[f64] * 8]),
               "py_opt_table_step": ("gt_opt_table_step_py", [cint, obj, obj, obj, obj, obj,
                                                              cint, f64, f64, obj]),
               "py_opt_table_steps": ("gt_opt_table_steps_py", [cint, obj, obj, obj, obj, obj,
                                                                obj]),
               "py_select_zero": ("gt_select_zero_py", [obj, obj, obj, cint]),
               "py_sum": ("gt_sum_py", [i64, i64, i64, obj, obj, cint])}
    if dtype == "f32":            # the serial row sums are float64's order: not built
        del entries["py_sum"]
        lib.py_sum = None
        lib.gt_lane_tree_cols.restype = ctypes.c_int      # numerics32's sum down columns
        lib.gt_lane_tree_cols.argtypes = [i64, i64, ptr, ptr]
    pydll = ctypes.PyDLL(lib._name) if python else None
    for attr, (name, argtypes) in entries.items():
        fn = None
        if pydll is not None:
            fn = getattr(pydll, name)
            fn.restype = cint
            fn.argtypes = argtypes
        setattr(lib, attr, fn)
    lib.gt_mm.restype = None
    lib.gt_mm.argtypes = [ptr, ptr, i64, i64, i64, ptr, i64, i64, i64, i64, i64, i64, i64,
                          ctypes.c_int]
    lib.gt_mm_config.restype = None
    lib.gt_mm_config.argtypes = [ctypes.POINTER(i64)]
    lib.gt_select_zero.restype = None
    lib.gt_select_zero.argtypes = [i64, ptr, ptr, ptr, ctypes.c_int]
    if dtype == "f64":
        lib.gt_sum_rows.restype = None
        lib.gt_sum_rows.argtypes = [i64, i64, ptr, ptr]
        lib.gt_sum_outer_inner.restype = None
        lib.gt_sum_outer_inner.argtypes = [i64, i64, i64, ptr, ptr]
    for name in ("gt_conv2d", "gt_conv2d_dx", "gt_conv2d_dw", "gt_max_pool2d_dx"):
        getattr(lib, name).restype = ctypes.c_int
        getattr(lib, name).argtypes = [ptr, ptr, ptr, ptr, ctypes.c_int, ptr, i64]
    lib.gt_max_pool2d.restype = ctypes.c_int
    lib.gt_max_pool2d.argtypes = [ptr, ptr, ptr, ptr, i64]
    lib.gt_conv_ws_bytes.restype = i64
    lib.gt_conv_ws_bytes.argtypes = [ptr, ctypes.c_int, ctypes.c_int]
    lib.gt_opt_table_step.restype = None
    lib.gt_opt_table_step.argtypes = [ctypes.c_int, i64, ptr, ptr, ptr, ptr, ptr, ctypes.c_int,
                                      f64, f64, ptr]
    lib.gt_opt_step.restype = None
    lib.gt_opt_step.argtypes = [ctypes.c_int, i64, ptr, ptr, ptr, ptr, ctypes.c_int,
                                f64, f64, f64, f64, f64, f64, f64, f64]


def matmul_config(lib=None) -> dict:
    """The compiled kernel's tile (rows, cols, lanes per vector), its thread count, the
    product size below which it stays serial, and how many runs used worker threads.

    ``lib``: a library that includes csrc/gt_matmul.h (default: :func:`cpu_kernels`;
    the host backend's kernel library exports the same function)."""
    lib = lib or _native_kernels()
    out = (ctypes.c_longlong * 7)()
    lib.gt_mm_config.restype = None
    lib.gt_mm_config.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
    lib.gt_mm_config(out)
    return dict(zip(("rows", "cols", "lanes", "threads", "serial_below", "threaded_runs",
                     "vector_fma"), list(out)))


def cpu_kernels():
    """The compiled library this process uses (:func:`cpu_library` with no arguments),
    or None (no compiler, or ``GRADTOOL_NATIVE=0``)."""
    if not _DEFAULT:
        _DEFAULT.append(cpu_library())
    return _DEFAULT[0]


_DEFAULT32: list = []


def cpu_kernels32():
    """The float32 twin of :func:`cpu_kernels` (``cpu_library(dtype="f32")``), or None."""
    if not _DEFAULT32:
        _DEFAULT32.append(cpu_library(dtype="f32"))
    return _DEFAULT32[0]


_native_kernels = cpu_kernels
