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

import numpy as np

from . import fdlibm, native

__all__ = [
    "serial_sum", "serial_mean", "serial_sum_axis", "first_max", "take_index", "reduce_to_shape",
    "matmul", "bmm", "matmul_numpy", "bmm_numpy", "exp", "log", "tanh", "expm1",
    "shard_mean", "shard_accumulate", "shard_divide",
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
    count = int(np.prod([c.shape[ax] for ax in bcast]))
    flat = moved.reshape((count,) + tuple(c.shape[ax] for ax in kept))
    total = np.add.accumulate(flat, axis=0)[-1]
    return np.ascontiguousarray(total).reshape(shape)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[M,K] @ [K,N] with every c[i,j] a serial k-ascending sum from 0.0.

    Runs the compiled kernel ``csrc/serial_matmul.c`` when a C compiler is
    available, else :func:`matmul_numpy`; the two give identical bits (the
    test suite checks it), only the speed differs.
    """
    kernel = _native_kernels()
    if kernel is None:
        return matmul_numpy(a, b)
    m, kdim = a.shape
    n = b.shape[1]
    a = np.ascontiguousarray(a, dtype=np.float64)
    b = np.ascontiguousarray(b, dtype=np.float64)
    out = np.empty((m, n))
    kernel.gt_matmul_serial(m, kdim, n, a.ctypes.data, b.ctypes.data, out.ctypes.data)
    return out


def bmm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[B,M,K] @ [B,K,N], the matmul order in every batch slice."""
    kernel = _native_kernels()
    if kernel is None:
        return bmm_numpy(a, b)
    batch, m, kdim = a.shape
    n = b.shape[2]
    a = np.ascontiguousarray(a, dtype=np.float64)
    b = np.ascontiguousarray(b, dtype=np.float64)
    out = np.empty((batch, m, n))
    kernel.gt_bmm_serial(batch, m, kdim, n, a.ctypes.data, b.ctypes.data, out.ctypes.data)
    return out


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


_NATIVE_STATE: list = []      # [] = not tried yet; [None] = unavailable; [lib] = loaded


def _native_kernels():
    """The compiled serial-matmul library, or None (no compiler / GRADTOOL_NATIVE=0)."""
    if not _NATIVE_STATE:
        lib = None
        if native.enabled():
            try:
                lib = native.load("serial_matmul", native.CSRC / "serial_matmul.c",
                                  ("-std=c99", *native.SAFE_FLAGS))
                for fn in (lib.gt_matmul_serial, lib.gt_bmm_serial):
                    fn.restype = None
                lib.gt_matmul_serial.argtypes = [ctypes.c_long] * 3 + [ctypes.c_void_p] * 3
                lib.gt_bmm_serial.argtypes = [ctypes.c_long] * 4 + [ctypes.c_void_p] * 3
            except (native.NativeUnavailable, OSError):
                lib = None
        _NATIVE_STATE.append(lib)
    return _NATIVE_STATE[0]


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
