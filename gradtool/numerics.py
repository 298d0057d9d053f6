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
axis sum          the serial sum along one axis, other indices fixed
broadcast reduce  see :func:`reduce_to_shape`
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import fdlibm, native

__all__ = [
    "serial_sum", "serial_mean", "serial_sum_axis", "reduce_to_shape",
    "matmul", "bmm", "matmul_numpy", "bmm_numpy", "exp", "log", "tanh", "expm1", "sigmoid", "relu",
    "softmax", "softmax_backward",
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
    count = int(np.prod([c.shape[ax] for ax in bcast]))
    flat = moved.reshape((count,) + tuple(c.shape[ax] for ax in kept))
    total = np.add.accumulate(flat, axis=0)[-1]
    return np.ascontiguousarray(total).reshape(shape)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[M,K] @ [K,N] with every c[i,j] a serial k-ascending sum from 0.0.

    Runs the compiled kernel ``csrc/gt_matmul.h`` (through ``csrc/gt_matmul.c``)
    when a C compiler is available, else :func:`matmul_numpy`; the two give
    identical bits (the test suite checks it against both the numpy loop and
    plain Python loops), only the speed differs.  Operands may be any
    float64 views, e.g. ``b.T`` in the backward rules: their strides go to
    the kernel, which never makes a transposed copy.

    The kernel (the same code runs the host backend's matmul launches)
    -------------------------------------------------------------------
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
    * Threads: products of at least 65,536 multiply-adds are split over
      ``GRADTOOL_NUM_THREADS`` threads (default: the usable cores; see
      :func:`gradtool.native.num_threads`): batch items, column panels or
      row tiles.  Each output element is still one serial k loop in one
      thread, so every thread count gives the same bits.
    * Floating-point mode: the kernel runs under round-to-nearest with
      flush-to-zero and denormals-are-zero off (x86 MXCSR), in the caller
      and in every worker, and restores the caller's mode after: a caller's
      FTZ/DAZ cannot change a product.
    """
    lib = _native_kernels()
    if lib is None:
        return matmul_numpy(a, b)
    m, kdim = a.shape
    out = np.empty((m, b.shape[1]))
    _native_product(lib, out, a[np.newaxis], b[np.newaxis], 1)
    return out


def bmm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[B,M,K] @ [B,K,N], the matmul order in every batch slice."""
    lib = _native_kernels()
    if lib is None:
        return bmm_numpy(a, b)
    out = np.empty((a.shape[0], a.shape[1], b.shape[2]))
    _native_product(lib, out, a, b, a.shape[0])
    return out


def _element_strides(x: np.ndarray):
    """``x`` (float64, aligned, strides in whole elements: a copy if need be) and its strides."""
    if x.dtype != np.float64 or not x.flags.aligned or any(s % 8 for s in x.strides):
        x = np.ascontiguousarray(x, dtype=np.float64)
    return x, [s // 8 for s in x.strides]


def _native_product(lib, out, a, b, batch, accumulate=False) -> None:
    """out[bt] (= or, accumulating, +=) a[bt] @ b[bt] by the compiled kernel; a, b 3-d
    views of any strides, out C-contiguous float64."""
    a, (sab, sai, sak) = _element_strides(a)
    b, (sbb, sbk, sbj) = _element_strides(b)
    _, m, kdim = a.shape
    lib.gt_mm(out.ctypes.data, a.ctypes.data, sab, sai, sak, b.ctypes.data, sbb, sbk, sbj,
              batch, m, kdim, b.shape[2], int(accumulate))


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


MATMUL_SOURCES = ("gt_matmul.c", "gt_matmul.h")
_LIBRARIES: dict = {}         # (extra flags, native arch) -> loaded library or None
_DEFAULT: list = []           # [library or None] once the default one was asked for


def matmul_library(extra_flags=(), native_arch=None):
    """A compiled matmul library (built and cached on first use), or None.

    The default (no arguments) is the one :func:`matmul` and :func:`bmm` use.
    ``extra_flags=("-DGT_MM_PORTABLE",)`` builds the plain-C scalar tile, and
    ``native_arch=False`` leaves ``-march=native`` out: the tests run every
    such variant against the naive order.  None when no C compiler works or
    ``GRADTOOL_NATIVE=0``.
    """
    if native_arch is None:
        native_arch = native.native_arch_wanted()
    key = (tuple(extra_flags), bool(native_arch))
    if key not in _LIBRARIES:
        lib = None
        if native.enabled():
            try:
                lib = native.load("gt_matmul", native.CSRC / MATMUL_SOURCES[0],
                                  [*native.SAFE_FLAGS, *extra_flags],
                                  [native.CSRC / MATMUL_SOURCES[1]], native_arch=native_arch)
                lib.gt_mm.restype = None
                lib.gt_mm.argtypes = ([ctypes.c_void_p] * 2 + [ctypes.c_longlong] * 3 +
                                      [ctypes.c_void_p] + [ctypes.c_longlong] * 7 +
                                      [ctypes.c_int])
                lib.gt_mm_config.restype = None
                lib.gt_mm_config.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
                native.register_threaded(lib)
            except (native.NativeUnavailable, OSError):
                lib = None
        _LIBRARIES[key] = lib
    return _LIBRARIES[key]


def matmul_config(lib=None) -> dict:
    """The compiled kernel's tile (rows, cols, lanes per vector), its thread count, the
    product size below which it stays serial, and how many runs used worker threads."""
    lib = lib or _native_kernels()
    out = (ctypes.c_longlong * 6)()
    lib.gt_mm_config(out)
    return dict(zip(("rows", "cols", "lanes", "threads", "serial_below", "threaded_runs"),
                    list(out)))


def _native_kernels():
    """The matmul library this process uses, or None (no compiler / GRADTOOL_NATIVE=0)."""
    if not _DEFAULT:
        _DEFAULT.append(matmul_library())
    return _DEFAULT[0]


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``1.0 / (1.0 + exp(0.0 - x))``: three roundings plus exp's.

    ``0.0 - x`` and ``-x`` agree except at x = +0.0 (exp of either zero is
    1.0), so the negation is written as numpy's exact ``-x``.
    """
    return 1.0 / (1.0 + exp(-x))


def relu(x: np.ndarray) -> np.ndarray:
    """``x if not (x <= 0) else +0.0``: NaN passes through, -0.0 becomes +0.0."""
    return np.where(x <= 0.0, 0.0, x)


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """Softmax along ``axis``: ``e = exp(x - max); y = e / serial_sum_axis(e)``.

    The max is exact whatever the order (a NaN anywhere on the axis makes
    that row NaN).  The sum is the serial 0.0-started sum along the axis.
    """
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = exp(shifted)
    return e / serial_sum_axis(e, axis)


def softmax_backward(g: np.ndarray, t: np.ndarray, axis: int) -> np.ndarray:
    """``t * (g - serial_sum_axis(g * t))`` with t the softmax output."""
    return t * (g - serial_sum_axis(g * t, axis))
