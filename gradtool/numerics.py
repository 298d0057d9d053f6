"""Every floating-point order gradtool uses, in one place.

gradtool's promise is that a gradient is identical to the bit wherever it is
computed: this numpy reference, the emitted C/CUDA (`gradtool.emit`) and the
device kernels (`gradtool.device`).  That only holds if every result is
produced by the same sequence of separately rounded IEEE-754 binary64
operations everywhere.  This module is that sequence, written down once.

Rules that hold for every function here
---------------------------------------
* Each + - * / sqrt is one correctly rounded binary64 operation (round to
  nearest, ties to even).  Nothing is fused (no FMA): the C mirrors compile
  with ``-ffp-contract=off`` and the CUDA mirrors spell ``__dadd_rn`` etc.
* Nothing depends on the BLAS, the SIMD width or the platform libm: no ``@``,
  no ``np.dot``/``einsum``, no ``np.sum`` (numpy's sum is pairwise), no
  ``np.exp``/``np.log`` (their last bit differs between libraries).
  Transcendentals come from :mod:`gradtool.fdlibm`, whose C twin is
  ``gradtool/csrc/gt_math.h``.
* numpy's elementwise ufuncs are exact per element (one rounding each), and
  ``np.add.accumulate`` is sequential by definition (output i is output i-1
  plus input i), so both are safe building blocks.

The orders
----------
serial sum        ``acc = 0.0; for i ascending (row-major): acc = acc + x[i]``
mean              ``serial_sum(x) / n`` (one division, not a multiply by 1/n)
matmul C = A @ B  ``c[i,j] = 0.0; for k = 0..K-1: c[i,j] = c[i,j] + a[i,k]*b[k,j]``
                  (the product rounded, then the sum rounded)
bmm               the matmul order in every batch slice
bmm, broadcast    a batch of 1 on one side is read for every batch; that side's
                  gradient is the per-batch products' axis sum over the batch
                  (``0.0 + P[0] + P[1] + ...``, batch ascending)
axis sum          the serial sum along one axis, other indices fixed (from 0.0,
                  ascending); axis mean = axis sum / length (one division)
first max         see :func:`first_max`: the first NaN, else the first largest element
                  (ties, +0.0 against -0.0 included, go to the earliest); exact
multi-axis        sum/mean/max over several axes at once (``axis=(0, 2)``): per kept
reduction         index, the one-axis rule over the reduced coordinates in row-major
                  order (the reduced axes in ascending axis order, whatever order they
                  were named in, the last varying fastest): ``acc = 0.0; for each
                  reduced coordinate: acc = acc + x``; the mean is ``acc / count``
                  (one division by the product of the reduced dims); the max is the
                  first maximal element in that order, and only it gets the gradient
                  (torch's ``amax`` gives the same value but splits a tie's gradient
                  evenly).  Every axis at once is the whole reduction.  Recorded by
                  ``gradtool.layout.reduce_axes`` as permute/reshape and the one-axis op
softmax           along an axis: ``e = exp(x - max); y = e / axis_sum(e)``; backward
                  ``t * (g - axis_sum(g * t))`` (the elementwise parts are expressions
                  in the op table, :mod:`gradtool.ops`)
log_softmax       along an axis: ``m = first_max``, ``d = x - m``,
                  ``y = d - log(axis_sum(exp(d)))``; backward
                  ``g - exp(t) * axis_sum(g)`` (expressions in the op table)
gather backward   see :func:`take_index`: each table row's gradient is
                  ``0.0 + g[p0] + g[p1] + ...`` over the positions reading it, ascending
elementwise ops   one expression per rule in the op table, each node one rounding
shard mean        ``acc = x[0]; for k = 1..S-1: acc = acc + x[k]; result = acc / S``
                  per element, over the S shards of a minibatch in shard order
                  (see :func:`shard_mean`)
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from . import fdlibm, native

__all__ = [
    "serial_sum", "serial_mean", "serial_sum_axis", "first_max", "take_index", "reduce_to_shape",
    "matmul", "bmm", "matmul_numpy", "bmm_numpy", "cpu_kernels", "cpu_library", "matmul_config",
    "exp", "log", "tanh", "expm1", "shard_mean", "shard_accumulate", "shard_divide",
]

exp = fdlibm.exp
log = fdlibm.log
tanh = fdlibm.tanh
expm1 = fdlibm.expm1


def serial_sum(x: np.ndarray) -> np.ndarray:
    """Sum of every element, row-major ascending, starting from 0.0; shape [1].

    ``acc = 0.0; for v in x.flat: acc = acc + v``.  Implemented as the last
    prefix sum of ``np.add.accumulate`` (which starts from x[0] instead of
    0.0) plus 0.0: the two sequences can only differ by the sign of a zero
    (0.0 + -0.0 is +0.0), and the final ``+ 0.0`` restores exactly the
    0.0-started result.
    """
    flat = np.ravel(x)
    return np.add(np.add.accumulate(flat)[-1:], 0.0)


def serial_mean(x: np.ndarray) -> np.ndarray:
    """``serial_sum(x) / n``: one rounded division, shape [1]."""
    return serial_sum(x) / float(np.size(x))


def serial_sum_axis(x: np.ndarray, axis: int) -> np.ndarray:
    """Serial 0.0-started sum along ``axis`` (ascending), keepdims=True."""
    last = np.take(np.add.accumulate(x, axis=axis), [-1], axis=axis)
    return np.add(last, 0.0, out=last)


def first_max(x: np.ndarray, axis: int) -> tuple:
    """The first maximal element along ``axis``: (values, indices), both keepdims.

    Per line ``m = x[0]; i = 0; for l = 1..L-1: if m == m and (x[l] > m or
    x[l] != x[l]): m = x[l]; i = l``.  So a line holding a NaN gives its FIRST
    NaN; otherwise the first of the largest values wins every tie (+0.0 and
    -0.0 compare equal: the earlier one is the max, sign and all).  The value
    is that element itself, an exact copy.  ``np.argmax`` computes exactly this
    index (tests/test_numerics.py checks it against the loop); the kernels
    (``gt_first_max`` in kernels.cu) run the loop.
    """
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    return np.take_along_axis(x, idx, axis=axis), idx


def take_index(ids: np.ndarray, rows: int) -> tuple:
    """The gather's backward order: which positions read each table row, ascending.

    ``ids`` (any shape, ints in [0, rows)) is read flat, row-major: position p
    reads row ``ids.flat[p]``.  Returns ``(order, start)``: ``order`` lists the
    positions sorted by the row they read, ascending within a row (a stable
    sort), and the positions reading row v are ``order[start[v]:start[v+1]]``.
    A row's gradient is then the serial sum ``0.0 + g[p0] + g[p1] + ...`` over
    those positions in that order (+0.0 for a row nobody reads).  The device
    replay uploads this index with the ids and its kernel walks it, one thread
    per table element: deterministic, no atomics.
    """
    flat = np.ravel(ids)
    order = np.argsort(flat, kind="stable")
    start = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(flat, minlength=rows), out=start[1:])
    return order, start


def reduce_to_shape(c: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum an out-shaped gradient contribution down to a broadcast input's shape.

    The input's shape is aligned to the trailing dims of ``c`` (numpy rules);
    an axis is *broadcast* when the input has size 1 (or no dim) there and
    ``c`` has size > 1.  Each input element receives the sum of the
    contributions at every out index that maps onto it, taken in row-major
    order of the out tensor, i.e. lexicographic order of the broadcast
    coordinates.  The sum starts from the FIRST contribution (no 0.0 seed):
    ``r = c0; r = r + c1; ...``.  The caller then adds ``r`` into the
    gradient slot once (``grad = grad + r``).  When nothing is broadcast,
    ``r`` is ``c`` itself.
    """
    shape = tuple(shape)
    if c.shape == shape:
        return c
    nd = c.ndim
    padded = (1,) * (nd - len(shape)) + shape
    bcast = [ax for ax in range(nd) if padded[ax] == 1 and c.shape[ax] != 1]
    kept = [ax for ax in range(nd) if ax not in bcast]
    moved = np.transpose(c, bcast + kept)
    count = math.prod(c.shape[ax] for ax in bcast)
    flat = moved.reshape((count, -1))         # rows: the broadcast coordinates, in order
    lib = _DEFAULT[0] if _DEFAULT else cpu_kernels()
    if lib is not None and count > 1:         # the same sums, row after row, compiled
        flat = np.ascontiguousarray(flat, dtype=np.float64)
        total = np.empty(flat.shape[1])
        lib.gt_sum_rows(count, flat.shape[1], flat.ctypes.data, total.ctypes.data)
        return total.reshape(shape)
    total = np.add.accumulate(flat, axis=0)[-1]
    return np.ascontiguousarray(total).reshape(shape)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[M,K] @ [K,N] with every c[i,j] a serial k-ascending sum from 0.0.

    Runs the compiled kernel ``csrc/gt_matmul.h`` (through ``csrc/gt_cpu.c``)
    when a C compiler is available, else :func:`matmul_numpy`; the two give
    identical bits (the test suite checks it against both the numpy loop and
    plain Python loops), only the speed differs.  Operands may be any
    float64 views, e.g. ``b.T`` in the backward rules: their strides go to
    the kernel, which never makes a transposed copy.

    The kernel (the same code runs the host backend's matmul launches)
    -------------------------------------------------------------------
    ``docs/cpu-kernels.md`` has the details.

    * Register tile: 4 rows x 32 columns of C in 16 AVX-512 vector
      accumulators (4 x 12 in 12 AVX2 ones, 4 x 6 with 16-byte vectors, a
      4 x 4 scalar tile with ``-DGT_MM_PORTABLE`` or without GCC/Clang
      vector extensions).  A SIMD lane is one output element, and each gets
      ``acc = acc + b*a`` per k as one multiply and one add instruction
      (``-ffp-contract=off``; a test disassembles the library and fails on
      any FMA).
    * Packing: B is copied panel by panel (K x 32, zero-padded) into a
      per-thread buffer, from either layout; A is read in place, or packed
      into K x 4 tiles when its k stride is not 1 (``A^T``).
    * Threads: products of at least 2^20 multiply-adds are cut into
      chunks (batch items, column panels or row groups) that
      ``GRADTOOL_NUM_THREADS`` threads claim (default: the usable cores;
      :func:`gradtool.native.num_threads`); after a worker was late (a busy
      machine) the next products run serially for a while.  Each output
      element is still one serial k loop in one thread, so every thread
      count gives the same bits.
    * Floating-point mode: the kernel runs under round-to-nearest with
      flush-to-zero and denormals-are-zero off (x86 MXCSR), in the caller
      and in every worker, and restores the caller's mode after: a caller's
      FTZ/DAZ cannot change a product.
    """
    lib = _DEFAULT[0] if _DEFAULT else cpu_kernels()
    if lib is None:
        return matmul_numpy(a, b)
    out = np.empty((a.shape[0], b.shape[1]))
    _native_product(lib, out, a[np.newaxis], b[np.newaxis], 1)
    return out


def bmm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[B,M,K] @ [B,K,N], the matmul order in every batch slice."""
    lib = _DEFAULT[0] if _DEFAULT else cpu_kernels()
    if lib is None:
        return bmm_numpy(a, b)
    out = np.empty((a.shape[0], a.shape[1], b.shape[2]))
    _native_product(lib, out, a, b, a.shape[0])
    return out


_F64 = np.dtype(np.float64)


def _element_strides(x: np.ndarray):
    """``x`` as the kernel reads it (float64, aligned, strides in whole elements: a copy if
    need be) and its three strides in bytes."""
    s = x.strides
    if x.dtype != _F64 or not x.flags.aligned or (s[0] | s[1] | s[2]) & 7:
        x = np.ascontiguousarray(x, dtype=np.float64)
        s = x.strides
    return x, s


def _native_product(lib, out, a, b, batch, accumulate=False) -> None:
    """out[bt] (= or, accumulating, +=) a[bt] @ b[bt] by the compiled kernel; a, b 3-d
    views of any strides, out C-contiguous float64."""
    a, sa = _element_strides(a)
    b, sb = _element_strides(b)
    lib.gt_mm(out.ctypes.data, a.ctypes.data, sa[0] >> 3, sa[1] >> 3, sa[2] >> 3,
              b.ctypes.data, sb[0] >> 3, sb[1] >> 3, sb[2] >> 3, batch, a.shape[1],
              a.shape[2], b.shape[2], accumulate)


def matmul_numpy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`matmul` in numpy: vectorized over the outputs, looping over k."""
    m, kdim = a.shape
    n = b.shape[1]
    acc = np.zeros((m, n))
    prod = np.empty((m, n))
    for k in range(kdim):
        np.multiply(a[:, k:k + 1], b[k], out=prod)
        np.add(acc, prod, out=acc)
    return acc


def bmm_numpy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`bmm` in numpy."""
    batch, m, kdim = a.shape
    n = b.shape[2]
    acc = np.zeros((batch, m, n))
    prod = np.empty((batch, m, n))
    for k in range(kdim):
        np.multiply(a[:, :, k:k + 1], b[:, k:k + 1, :], out=prod)
        np.add(acc, prod, out=acc)
    return acc


CPU_SOURCES = ("gt_cpu.c", "gt_matmul.h", "gt_optim.h")
_LIBRARIES: dict = {}         # (extra flags, native arch) -> loaded library or None
_DEFAULT: list = []           # [library or None] once the default one was asked for


def cpu_library(extra_flags=(), native_arch=None):
    """The CPU reference's compiled kernels, ``csrc/gt_cpu.c`` (built and cached on first
    use), or None: the matmul (``gt_mm``), the broadcast reduction's row sums
    (``gt_sum_rows``) and the optimizer step (``gt_opt_step``).

    The default (no arguments) is the one :func:`matmul`, :func:`bmm` and
    :mod:`gradtool.optim` use.  ``extra_flags=("-DGT_MM_PORTABLE",)`` builds
    the plain-C scalar matmul tile, and ``native_arch=False`` leaves
    ``-march=native`` out: the tests run every such variant against the
    naive order.  None when no C compiler works or ``GRADTOOL_NATIVE=0``.
    """
    if native_arch is None:
        native_arch = native.native_arch_wanted()
    key = (tuple(extra_flags), bool(native_arch))
    if key not in _LIBRARIES:
        lib = None
        if native.enabled():
            try:
                lib = native.load("gt_cpu", native.CSRC / CPU_SOURCES[0],
                                  [*native.SAFE_FLAGS, *extra_flags],
                                  [native.CSRC / name for name in CPU_SOURCES[1:]],
                                  native_arch=native_arch)
                _declare(lib)
                native.register_threaded(lib)
            except (native.NativeUnavailable, OSError):
                lib = None
        _LIBRARIES[key] = lib
    return _LIBRARIES[key]


def _declare(lib) -> None:
    i64, ptr, f64 = ctypes.c_longlong, ctypes.c_void_p, ctypes.c_double
    lib.gt_mm.restype = None
    lib.gt_mm.argtypes = [ptr, ptr, i64, i64, i64, ptr, i64, i64, i64, i64, i64, i64, i64,
                          ctypes.c_int]
    lib.gt_mm_config.restype = None
    lib.gt_mm_config.argtypes = [ctypes.POINTER(i64)]
    lib.gt_sum_rows.restype = None
    lib.gt_sum_rows.argtypes = [i64, i64, ptr, ptr]
    lib.gt_opt_step.restype = None
    lib.gt_opt_step.argtypes = [ctypes.c_int, i64, ptr, ptr, ptr, ptr, ctypes.c_int,
                                f64, f64, f64, f64, f64, f64, f64, f64]


def matmul_config(lib=None) -> dict:
    """The compiled kernel's tile (rows, cols, lanes per vector), its thread count, the
    product size below which it stays serial, and how many runs used worker threads.

    ``lib``: a library that includes csrc/gt_matmul.h (default: :func:`cpu_kernels`;
    the host backend's kernel library exports the same function)."""
    lib = lib or _native_kernels()
    out = (ctypes.c_longlong * 6)()
    lib.gt_mm_config.restype = None
    lib.gt_mm_config.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
    lib.gt_mm_config(out)
    return dict(zip(("rows", "cols", "lanes", "threads", "serial_below", "threaded_runs"),
                    list(out)))


def cpu_kernels():
    """The compiled library this process uses (:func:`cpu_library` with no arguments),
    or None (no compiler, or ``GRADTOOL_NATIVE=0``)."""
    if not _DEFAULT:
        _DEFAULT.append(cpu_library())
    return _DEFAULT[0]


_native_kernels = cpu_kernels


def shard_mean(parts) -> np.ndarray:
    """The mean of S equally shaped shard results (gradients, losses), in shard order.

    Per element: ``acc = x[0]; acc = acc + x[1]; ...; acc = acc + x[S-1]``, then
    ``acc / S`` (one rounded division).  The sum starts from the FIRST shard (no 0.0
    seed), so with S = 1 the result is ``x[0] / 1``, which is ``x[0]`` bit for bit
    (signed zeros and infinities included): one shard is plain training.

    The order depends only on S, never on who computes which shard: data-parallel
    training (:mod:`gradtool.train.distributed`) splits this same left fold across
    ranks with :func:`shard_accumulate` (a rank continues the fold it receives) and
    :func:`shard_divide`.
    """
    parts = list(parts)
    acc = np.array(parts[0], dtype=np.float64, copy=True)
    for x in parts[1:]:
        shard_accumulate(acc, x)
    return shard_divide(acc, len(parts))


def shard_accumulate(acc: np.ndarray, x: np.ndarray) -> None:
    """One step of :func:`shard_mean`'s fold, in place: ``acc = acc + x`` per element."""
    np.add(acc, x, out=acc)


def shard_divide(acc: np.ndarray, shards: int) -> np.ndarray:
    """The last step of :func:`shard_mean`, in place: ``acc = acc / S``; returns acc."""
    np.divide(acc, float(shards), out=acc)
    return acc
