"""Every floating-point order gradtool uses, in one place.

gradtool's promise is that a gradient is identical to the bit wherever it is
computed: this numpy reference, the emitted C/CUDA (`gradtool.emit`) and the
device kernels (`gradtool.device`).  That only holds if every result is
produced by the same sequence of separately rounded IEEE-754 binary64
operations everywhere (plus, in inner products only, the fused multiply-add, also
correctly rounded).  This module is that sequence, written down once.  The float32 contract (binary32
fmaf chains, a lane-tree sum of O(log n) error, fdlibm rounded once) is its twin,
:mod:`gradtool.numerics32` (C: ``csrc/gt_real32.h``; docs/numerics-f32.md).

Rules that hold for every function here
---------------------------------------
* Each + - * / sqrt is one correctly rounded binary64 operation (round to
  nearest, ties to even).  Outside the inner products nothing is fused: the C
  mirrors compile with ``-ffp-contract=off`` and the CUDA mirrors spell
  ``__dadd_rn`` etc.
* Every inner product (matmul, bmm, both backward products of each, and the
  products of any op built on them, e.g. a convolution) is a chain of IEEE 754
  fusedMultiplyAdd operations, :func:`fma` (``a*b + c`` rounded once), k
  ascending from +0.0.  The fma is correctly rounded, so the chain has the same
  bits wherever it runs: x86 FMA3/AVX-512, AArch64, CUDA's ``__fma_rn``, libm's
  ``fma()`` on a CPU without FMA, and :func:`fma`'s exact numpy emulation
  (:mod:`gradtool.fma_exact`).
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
matmul C = A @ B  ``c[i,j] = +0.0; for k = 0..K-1: c[i,j] = fma(a[i,k], b[k,j], c[i,j])``
                  (each step one rounding; :func:`matmul` says why +0.0 starts it);
                  a gradient contribution is then added whole: ``grad = grad + c``
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
scatter           the same sum as a forward rule (:func:`scatter_rows`): out row v of
                  ``scatter(src, ids, rows)`` is ``0.0 + src[p0] + src[p1] + ...`` over
                  the positions p with ``ids[p] == v``, ascending (row-major over ids);
                  a row nobody writes is +0.0.  Its gradient is an exact gather
elementwise ops   one expression per rule in the op table, each node one rounding
shard mean        ``acc = x[0]; for k = 1..S-1: acc = acc + x[k]; result = acc / S``
                  per element, over the S shards of a minibatch in shard order
                  (see :func:`shard_mean`)
conv2d            see :func:`conv2d`: im2col, then the matmul order (the matmul
                  kernel itself) per group: each output the inner product over
                  (c, kh, kw) ascending; the weight gradient the inner product
                  over (n, oh, ow) ascending; the input gradient ``0.0 + term +
                  ...`` over (kh, kw) ascending, each term an inner product over
                  the group's output channels ascending
max_pool2d        per window the first maximum in (kh, kw) row-major order over
                  the positions inside the input (:func:`first_max`'s rule); its
                  gradient per input element ``0.0 + g + ...`` over the windows
                  whose maximum it is, (kh, kw) ascending (:func:`max_pool2d`)
avg_pool2d        ``(0.0 + x + ...) / divisor`` over the window's positions inside
                  the input, (kh, kw) ascending, torch's divisor; the gradient per
                  input element ``0.0 + g/divisor + ...``, (kh, kw) ascending
uniform           the counter-based generator, integer arithmetic only (no rounding
                  at all): see below and :func:`uniform`

The counter-based generator (the ``uniform`` op, ``gradtool.nn.dropout``)
------------------------------------------------------------------------
Method.  Every operation is on unsigned 64-bit integers, modulo 2^64 (numpy
``uint64`` with wrapping multiplies, C ``uint64_t``, CUDA ``unsigned long
long``): there is nothing to round, so every backend gives the same bits by
construction.  ``mix`` is the splitmix64 finalizer (Steele, Lea and Flood,
"Fast splittable pseudorandom number generators", 2014; Vigna's splitmix64.c)::

    mix(z):  z = z + 0x9E3779B97F4A7C15          (the golden-ratio increment)
             z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
             z = (z ^ (z >> 27)) * 0x94D049BB133111EB
             return z ^ (z >> 31)

Element i (row-major, 0-based) of a ``uniform`` output with the integer
attribute ``salt`` (0 <= salt < 2^63) and the counters ``step`` and ``shard``
(whole numbers in [0, 2^53), read as float64 from the rng slot and converted
exactly) is::

    h = mix(mix(mix(mix(salt) ^ step) ^ shard) ^ i)
    u = (h >> 11) * 2^-53

``h >> 11`` has 53 bits, so it converts to float64 exactly, and the multiply
by 2^-53 is exact (a power of two): u is a multiple of 2^-53 in [0, 1),
``1 - 2^-53`` at most; each of the 2^53 values has probability 2^-53 when
``h`` is uniform.  A chained mix (rather than one mix of a sum) keeps the
four counters from trading off against each other: (salt, step, shard, i)
and (salt, step + 1, shard, i - 1) are unrelated streams.  A counter that is
not a whole number in [0, 2^53) (a fraction, a negative, an infinity, a NaN)
gives NaN for every element: the op's callers refuse such values before they
are set (``docs/ops.md``), and every backend computes the same NaN anyway.
The float32 device build rounds u to float (not bit-equal, like everything
else there) and reads counters exactly only below 2^24.
"""

from __future__ import annotations

import math

import numpy as np

from . import cpulib as _cpu, fdlibm
from .fma_exact import fma  # noqa: F401  (the exact fma, the inner products' spec)
# the ctypes loader of the compiled kernels lives in gradtool.cpulib; its names stay here
from .cpulib import (CPU_SOURCES, _native_kernels, cpu_kernels, cpu_kernels32,  # noqa: F401
                     cpu_library, matmul_config)

NUMERICS_VERSION = 2
"""Which contract this module defines, as tape files record it beside stored values
(``save(..., values=True)`` writes ``"numerics": 2``): 1 (files without the field), every
inner product a separately rounded multiply then add; 2, the k-ascending FMA chain.
Everything else is the same in both."""
NUMERICS_CONTRACTS = {1: "inner products as a separately rounded multiply and add",
                      2: "inner products as one k-ascending FMA chain"}

__all__ = [
    "NUMERICS_VERSION", "NUMERICS_CONTRACTS",
    "serial_sum", "serial_mean", "serial_sum_axis", "first_max", "take_index", "scatter_rows",
    "reduce_to_shape",
    "matmul", "bmm", "matmul_numpy", "bmm_numpy", "cpu_kernels", "cpu_library", "matmul_config",
    "fma", "exp", "log", "tanh", "expm1", "shard_mean", "shard_accumulate", "shard_divide",
    "conv_out_size", "pool_out_size", "im2col", "col2im", "conv2d", "conv2d_backward",
    "conv2d_numpy", "conv2d_backward_numpy",
    "max_pool2d", "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward",
    "mix64", "uniform", "uniform_counters_ok",
]

exp = fdlibm.exp
log = fdlibm.log
tanh = fdlibm.tanh
expm1 = fdlibm.expm1


# a float64 array is told by its dtype's identity first (numpy's one native float64
# dtype: ``is`` costs half a comparison), then any other compared with float32
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_F32_ORDERS: list = []


def use_f32_orders(module) -> None:
    """Install :mod:`gradtool.numerics32` (the float32 contract's orders) as the twin this
    module routes float32 arrays to.  ``gradtool.ops`` installs it on import (numerics32
    reads this module, so this module cannot import it: no import cycle)."""
    _F32_ORDERS[:] = [module]


def _n32():
    """The float32 orders (:func:`use_f32_orders`).  Every function here that takes float
    arrays routes a float32 one there, in this one place per rule, so the op table's
    rules read the same for both dtypes."""
    if not _F32_ORDERS:
        raise RuntimeError("gradtool.numerics: float32 arrays need gradtool.numerics32 "
                           "(import gradtool.ops, which installs it)")
    return _F32_ORDERS[0]


def serial_sum(x: np.ndarray) -> np.ndarray:
    """Sum of every element, row-major ascending, starting from 0.0; shape [1].
    (float32: numerics32.sum's order over every element.)

    ``acc = 0.0; for v in x.flat: acc = acc + v``.  Implemented as the last
    prefix sum of ``np.add.accumulate`` (which starts from x[0] instead of
    0.0) plus 0.0: the two sequences can only differ by the sign of a zero
    (0.0 + -0.0 is +0.0), and the final ``+ 0.0`` restores exactly the
    0.0-started result.
    """
    if x.dtype is not _F64 and x.dtype == _F32:
        return _n32().sum_all(x)
    flat = np.ravel(x)
    return np.add(np.add.accumulate(flat)[-1:], 0.0)


def serial_mean(x: np.ndarray) -> np.ndarray:
    """``serial_sum(x) / n``: one rounded division, shape [1] (float32: numerics32's
    mean_all)."""
    if x.dtype is not _F64 and x.dtype == _F32:
        return _n32().mean_all(x)
    return serial_sum(x) / float(np.size(x))


def serial_sum_axis(x: np.ndarray, axis: int) -> np.ndarray:
    """Serial 0.0-started sum along ``axis`` (ascending), keepdims=True.  (float32:
    numerics32.sum's order along the axis.)"""
    if x.dtype is not _F64 and x.dtype == _F32:
        return _n32().sum_axis(x, axis)
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


def scatter_rows(x: np.ndarray, ids: np.ndarray, rows: int, dtype=None) -> np.ndarray:
    """The scatter-add of rows in :func:`take_index`'s order: take's backward and the
    ``scatter`` op's forward, one implementation.

    ``x`` is [N, width] with N = ids.size (position p's row is ``x[p]``); ``ids`` (any
    shape, ints in [0, rows)) is read flat.  Returns [rows, width]: row v is
    ``0.0 + x[p0] + x[p1] + ...`` over the positions reading v in ascending order (+0.0
    for a row nobody reads; each + one rounding).  The k-th additions of every row
    run as one numpy add (rows are independent; within a row the order is fixed), the
    rows with the most positions first, so the work is O(N * width + rows) however the
    ids repeat.  The kernels ``k_take_bwd`` (walking the uploaded index) and
    ``k_take_bwd_scan`` (scanning ids computed on the device) sum in the same order.
    """
    if dtype is None:                 # x's own float type: float32 sums in binary32
        dtype = np.float32 if x.dtype == np.float32 else np.float64
    order, start = take_index(ids, rows)
    counts = np.diff(start)
    busiest = np.argsort(-counts, kind="stable")          # rows, most positions first
    minus_counts = -counts[busiest]                       # ascending
    out = np.zeros((rows, x.shape[1]), dtype=dtype)     # float32: numerics32's twin
    for k in range(int(-minus_counts[0]) if rows else 0):
        hit = busiest[:int(np.searchsorted(minus_counts, -k, side="left"))]   # count > k
        out[hit] = out[hit] + x[order[start[hit] + k]]
    return out


_REDUCE_PLANS: dict = {}       # (c's shape, shape) -> _reduce_plan's answer
_REDUCE_PLANS_MAX = 4096


def _reduce_plan(cshape: tuple, shape: tuple):
    """How :func:`reduce_to_shape` sums a ``cshape`` contribution to ``shape``, worked out
    once per pair of shapes: (the broadcast axes then the kept ones, the number of
    broadcast coordinates, and (outer, kept size, inner) when the broadcast axes lead
    and trail the kept ones, size-1 axes aside, and there is more than one, else None)."""
    nd = len(cshape)
    padded = (1,) * (nd - len(shape)) + shape
    bcast = [ax for ax in range(nd) if padded[ax] == 1 and cshape[ax] != 1]
    kept = [ax for ax in range(nd) if ax not in bcast]
    count = math.prod(cshape[ax] for ax in bcast)
    outer_inner = None
    if count > 1:
        pattern = "".join("b" if ax in bcast else "k" for ax in range(nd) if cshape[ax] != 1)
        inner = pattern.lstrip("b")
        lead, core = len(pattern) - len(inner), inner.rstrip("b")
        if "b" not in core:
            dims = [d for d in cshape if d != 1]
            outer_inner = (math.prod(dims[:lead]), math.prod(dims[lead:lead + len(core)]),
                           math.prod(dims[lead + len(core):]))
    return tuple(bcast + kept), count, outer_inner


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
    if c.dtype is not _F64 and c.dtype == _F32:
        return _n32().reduce_to_shape(c, shape)   # float32: numerics32's order, same terms
    plan = _REDUCE_PLANS.get((c.shape, shape))
    if plan is None:
        if len(_REDUCE_PLANS) >= _REDUCE_PLANS_MAX:
            _REDUCE_PLANS.clear()
        plan = _REDUCE_PLANS[(c.shape, shape)] = _reduce_plan(c.shape, shape)
    axes, count, outer_inner = plan
    lib = _cpu._DEFAULT[0] if _cpu._DEFAULT else _cpu.cpu_kernels()
    if lib is not None and outer_inner is not None:
        # broadcast axes before and after the kept ones (size-1 axes aside): the same
        # sums straight from c, compiled, without moving the kept axes last
        outer, size, inner = outer_inner
        src = np.ascontiguousarray(c, dtype=np.float64)
        total = np.empty(size)
        if lib.py_sum is None or lib.py_sum(outer, size, inner, src, total, 0):
            lib.gt_sum_outer_inner(outer, size, inner, src.ctypes.data, total.ctypes.data)
        return total.reshape(shape)
    moved = np.transpose(c, axes)
    flat = moved.reshape((count, -1))         # rows: the broadcast coordinates, in order
    if lib is not None and count > 1:         # the same sums, row after row, compiled
        flat = np.ascontiguousarray(flat, dtype=np.float64)
        total = np.empty(flat.shape[1])
        if lib.py_sum is None or lib.py_sum(count, flat.shape[1], 1, flat, total, 1):
            lib.gt_sum_rows(count, flat.shape[1], flat.ctypes.data, total.ctypes.data)
        return total.reshape(shape)
    total = np.add.accumulate(flat, axis=0)[-1]
    return np.ascontiguousarray(total).reshape(shape)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[M,K] @ [K,N], every c[i,j] the FMA chain ``acc = +0.0; for k ascending:
    acc = fma(a[i,k], b[k,j], acc)``.

    This and :func:`bmm` are the one inner-product helper: the forward products,
    both backward products of matmul and bmm (``G @ B^T``, ``A^T @ G``, passed as
    views), and any later op's products (a convolution's im2col product) call
    :func:`matmul`/:func:`bmm` -- compiled, :func:`_native_product` -- so each keeps
    this order with no code of its own.

    Why the chain starts from +0.0 (rather than from the first product rounded):
    ``fma(a, b, +0.0)`` is ``a*b`` rounded once, which is what the first product
    rounded would be, for every nonzero, infinite or NaN product, an underflow to
    -0.0 included.  The two starts differ only on an exact zero product of negative
    sign (``-1 * 0.0``): -0.0 + +0.0 is +0.0.  Starting from +0.0 therefore keeps
    the old contract's signed zeros (an all-zero row gives +0.0, K = 0 gives +0.0,
    as ``0.0 + p`` did), is exact, and costs nothing: the kernels zero their
    accumulators (one xor) and run one uniform loop, with no peeled first step.

    Runs the compiled kernel ``csrc/gt_matmul.h`` (through ``csrc/gt_cpu.c``)
    when a C compiler is available, else :func:`matmul_numpy`; the two give
    identical bits (the test suite checks it against both the numpy loop and
    plain Python loops), only the speed differs.  Operands may be any
    float64 views, e.g. ``b.T`` in the backward rules: their strides go to
    the kernel, which never makes a transposed copy.

    The kernel (the same code runs the host backend's matmul launches)
    -------------------------------------------------------------------
    ``docs/cpu-kernels.md`` has the details.

    * Register tile: 8 rows x 24 columns of C in 24 AVX-512 vector
      accumulators (4 x 12 in 12 AVX2 ones, 4 x 6 with 16-byte vectors, a
      4 x 4 scalar tile with ``-DGT_MM_PORTABLE`` or without GCC/Clang
      vector extensions).  A SIMD lane is one output element, and each gets
      ``acc = fma(b, a, acc)`` per k as one FMA instruction (AVX-512F, FMA3
      or AArch64 intrinsics; ``-ffp-contract=off`` keeps the compiler from
      fusing anything else, and a test disassembles the library and finds
      FMAs in the micro-kernels only).  Without an FMA instruction (or under
      ``GRADTOOL_NO_FMA=1``) each lane calls libm's ``fma()``: same bits.
    * Packing: B is copied panel by panel (K x 24, zero-padded) into a
      per-thread buffer, from either layout; A is read in place (also
      ``A^T`` with contiguous rows), or packed into K x (tile rows) tiles
      when neither of its strides is 1.
    * Threads: products of at least 2^20 multiply-adds are cut into
      chunks (batch items, column panels or row groups) that
      ``GRADTOOL_NUM_THREADS`` threads claim (default: the usable cores;
      :func:`gradtool.native.num_threads`); after a worker was late (a busy
      machine) the next products run serially for a while.  Each output
      element is still one serial k loop in one thread, so every thread
      count gives the same bits.
    * The call: the arrays themselves go to ``gt_mm_py`` (the buffer protocol, the
      GIL released for the product; about 1.4 us a call, ctypes' entry about 7.5),
      anything it does not take as it is through ctypes after a conversion.
    * Floating-point mode: the kernel runs under round-to-nearest with
      flush-to-zero and denormals-are-zero off (x86 MXCSR), in the caller
      and in every worker, and restores the caller's mode after: a caller's
      FTZ/DAZ cannot change a product.
    """
    if a.dtype is not _F64 and a.dtype == _F32 and b.dtype == _F32:
        # float32: the fmaf chain, k ascending from +0.0 (a mix is widened exactly: the
        # f64 chain)
        return _n32().matmul(a, b)
    lib = _cpu._DEFAULT[0] if _cpu._DEFAULT else _cpu.cpu_kernels()
    if lib is None:
        return matmul_numpy(a, b)
    out = np.empty((a.shape[0], b.shape[1]))
    _native_product(lib, out, a[np.newaxis], b[np.newaxis], 1)
    return out


def bmm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[B,M,K] @ [B,K,N], the matmul FMA chain in every batch slice (with
    :func:`matmul`, the one inner-product helper)."""
    if a.dtype is not _F64 and a.dtype == _F32 and b.dtype == _F32:
        return _n32().bmm(a, b)
    lib = _cpu._DEFAULT[0] if _cpu._DEFAULT else _cpu.cpu_kernels()
    if lib is None:
        return bmm_numpy(a, b)
    out = np.empty((a.shape[0], a.shape[1], b.shape[2]))
    _native_product(lib, out, a, b, a.shape[0])
    return out


def _element_strides(x: np.ndarray, dtype=_F64):
    """``x`` as the kernel reads it (``dtype``, aligned, strides in whole elements: a copy
    if need be) and its three strides in elements."""
    size = dtype.itemsize
    s = x.strides
    if x.dtype != dtype or not x.flags.aligned or (s[0] | s[1] | s[2]) % size:
        x = np.ascontiguousarray(x, dtype=dtype)
        s = x.strides
    return x, [v // size for v in s]


def _native_product(lib, out, a, b, batch, accumulate=False) -> None:
    """out[bt] (= or, accumulating, +=) a[bt] @ b[bt] by the compiled kernel; a, b 3-d
    views of any strides, out C-contiguous of the library's element type (float64, or
    float32 for ``cpu_library(dtype="f32")``).  The compiled inner-product helper
    (:func:`matmul`, :func:`bmm`, numerics32's products and ops built on them call it;
    signature stable)."""
    py_mm = lib.py_mm
    if py_mm is not None and py_mm(out, a, b, accumulate) == 0:
        return                               # native views of the element type: no copy
    a, sa = _element_strides(a, out.dtype)
    b, sb = _element_strides(b, out.dtype)
    lib.gt_mm(out.ctypes.data, a.ctypes.data, sa[0], sa[1], sa[2],
              b.ctypes.data, sb[0], sb[1], sb[2], batch, a.shape[1],
              a.shape[2], b.shape[2], accumulate)


def matmul_numpy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`matmul` in numpy: vectorized over the outputs, looping over k, each step one
    :func:`fma` (``acc = fma(a[:, k], b[k, :], acc)``, acc from +0.0)."""
    m, kdim = a.shape
    n = b.shape[1]
    acc = np.zeros((m, n))
    for k in range(kdim):
        acc = fma(a[:, k:k + 1], b[k], acc)
    return acc


def bmm_numpy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`bmm` in numpy: the :func:`matmul_numpy` chain in every batch slice."""
    batch, m, kdim = a.shape
    n = b.shape[2]
    acc = np.zeros((batch, m, n))
    for k in range(kdim):
        acc = fma(a[:, :, k:k + 1], b[:, k:k + 1, :], acc)
    return acc


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


# ── convolution and pooling (NCHW) ─────────────────────────────────────────
#
# One geometry per node: kernel (kh, kw), stride (sh, sw), padding (ph, pw),
# dilation (dh, dw).  Window (oh, ow) reads input position (oh*sh - ph + i*dh,
# ow*sw - pw + j*dw) for kernel offset (i, j); a position outside the input is
# padding.  The device kernels (kernels.cu: k_matmul_conv2d, k_matmul_conv2d_dw,
# k_matmul_conv2d_dx, k_max_pool, k_max_pool_bwd, k_avg_pool, k_avg_pool_bwd)
# compute exactly these orders, one thread per output element; the compiled CPU
# paths (csrc/gt_conv.h: conv2d's products and max pooling, for this module and the
# host backend's tiled build) too, sample by sample.


def conv_out_size(size: int, k: int, stride: int, pad: int, dil: int) -> int:
    """Output length along one axis: ``(size + 2*pad - dil*(k-1) - 1) // stride + 1``."""
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def pool_out_size(size: int, k: int, stride: int, pad: int, dil: int, ceil_mode: bool) -> int:
    """torch's pooling output length: floor (or, ceil_mode, ceiling) of the window count,
    where with ceil_mode a last window must start inside the input or its left padding."""
    span = size + 2 * pad - dil * (k - 1) - 1
    if not ceil_mode:
        return span // stride + 1
    out = -(-span // stride) + 1
    if (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _padded(x: np.ndarray, ph: int, pw: int, hp: int, wp: int, fill: float) -> np.ndarray:
    """x inside a [N, C, hp, wp] buffer of ``fill``, offset (ph, pw)."""
    n, c, h, w = x.shape
    if (ph, pw, hp, wp) == (0, 0, h, w):
        return x                                   # no padding: x itself (read only)
    xp = np.full((n, c, hp, wp), fill, dtype=x.dtype)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    return xp


def _window_view(xp, i, j, oh, ow, stride, dilation):
    """Kernel offset (i, j) of every window: a [N, C, OH, OW] strided view of xp."""
    (sh, sw), (dh, dw) = stride, dilation
    return xp[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]


def im2col(x, kernel, stride, padding, dilation, groups) -> np.ndarray:
    """The convolution's columns, [G, Cg*KH*KW, N*OH*OW]:
    ``cols[g, (c, i, j), (n, oh, ow)] = x[n, g*Cg + c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]``,
    +0.0 at padding (exact copies; row (c, i, j) and column (n, oh, ow) row-major)."""
    n, c, h, w = x.shape
    (kh, kw), (ph, pw) = kernel, padding
    oh = conv_out_size(h, kh, stride[0], ph, dilation[0])
    ow = conv_out_size(w, kw, stride[1], pw, dilation[1])
    xp = _padded(x, ph, pw, h + 2 * ph, w + 2 * pw, 0.0)
    cols = np.empty((c, kh, kw, n, oh, ow), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, i, j] = _window_view(xp, i, j, oh, ow, stride, dilation).transpose(1, 0, 2, 3)
    return cols.reshape(groups, c // groups * kh * kw, n * oh * ow)


def col2im(dcols, x_shape, kernel, stride, padding, dilation) -> np.ndarray:
    """im2col's adjoint: per input element ``0.0 + dcols[(c, i, j), (n, oh, ow)] + ...``
    over every (i, j) ascending (row-major) whose window (oh, ow) reads it."""
    n, c, h, w = x_shape
    (kh, kw), (ph, pw) = kernel, padding
    oh = conv_out_size(h, kh, stride[0], ph, dilation[0])
    ow = conv_out_size(w, kw, stride[1], pw, dilation[1])
    parts = dcols.reshape(c, kh, kw, n, oh, ow)
    dxp = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=dcols.dtype)
    for i in range(kh):
        for j in range(kw):
            view = _window_view(dxp, i, j, oh, ow, stride, dilation)
            np.add(view, parts[:, i, j].transpose(1, 0, 2, 3), out=view)
    return np.ascontiguousarray(dxp[:, :, ph:ph + h, pw:pw + w])


def conv2d(x, w, stride, padding, dilation, groups) -> np.ndarray:
    """NCHW convolution (cross-correlation, as torch): x [N, C, H, W], w [OC, C/G, KH, KW].

    ``out[n, oc, oh, ow] = 0.0 + w[oc, c, i, j] * x[...] + ...`` over (c, i, j)
    ascending, the group's input channels only: per group the product
    ``w_g [OCg, Kg] @ cols_g [Kg, N*OH*OW]`` (:func:`im2col`) in the matmul
    order, computed by :func:`bmm` (the compiled matmul kernel, or its numpy
    twin): whatever inner-product contract matmul has, conv2d has.  Padding
    contributes ``w * 0.0`` products (so an infinite or NaN weight gives a NaN
    there, as in torch's im2col).

    Compiled (``csrc/gt_conv.h``), the same products run sample by sample: each
    sample's columns, then the matmul kernel on them, straight into NCHW -- the
    same chains, so the same bits as :func:`conv2d_numpy` (the tests compare them).
    """
    lib, dt = _conv_library(x)                 # float32: gt_conv.h on float (numerics32)
    if lib is not None:
        x, w = np.ascontiguousarray(x, dt), np.ascontiguousarray(w, dt)
        out = np.empty((x.shape[0], w.shape[0], *_out_hw(x, w, stride, padding, dilation)), dt)
        geo = _conv_geo(x.shape, w.shape, out.shape, stride, padding, dilation, groups)
        ws, nbytes = _workspace(lib, geo, _CONV_FWD)
        if lib.gt_conv2d(geo.ctypes.data, out.ctypes.data, x.ctypes.data, w.ctypes.data, 0,
                         ws.ctypes.data, nbytes):
            return out
    return conv2d_numpy(x, w, stride, padding, dilation, groups)


def conv2d_numpy(x, w, stride, padding, dilation, groups) -> np.ndarray:
    """:func:`conv2d` as :func:`im2col` of the whole batch, then :func:`bmm`."""
    oc, cg, kh, kw = w.shape
    n = x.shape[0]
    cols = im2col(x, (kh, kw), stride, padding, dilation, groups)
    out = bmm(np.ascontiguousarray(w).reshape(groups, oc // groups, cg * kh * kw), cols)
    return np.ascontiguousarray(
        out.reshape(oc, n, -1).transpose(1, 0, 2)).reshape(n, oc, *_out_hw(x, w, stride,
                                                                              padding, dilation))


def _f64(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64)


def _conv_library(x):
    """(compiled library, element type) for a convolution or pooling of ``x``: gt_cpu for
    float64, gt_cpu_f32 (the same gt_conv.h on float) for float32; (None, _) without one."""
    if x.dtype is not _F64 and x.dtype == _F32:
        return _cpu.cpu_kernels32(), np.float32
    return (_cpu._DEFAULT[0] if _cpu._DEFAULT else _cpu.cpu_kernels()), np.float64


_CONV_FWD, _CONV_DX, _CONV_DW, _POOL_FWD, _POOL_DX = range(5)


def _workspace(lib, geo: np.ndarray, which: int) -> tuple:
    """(pointer, bytes) of a numpy workspace for one csrc/gt_conv.h call: a buffer per
    thread, allocated here so that it is numpy memory like every other temporary (the
    memory budget, gradtool.budget, counts it)."""
    nbytes = int(lib.gt_conv_ws_bytes(geo.ctypes.data, which, 0))
    ws = np.empty(nbytes // 8 + 1)
    return ws, ws.nbytes


def _conv_geo(x_shape, w_shape, out_shape, stride, padding, dilation, groups) -> np.ndarray:
    """The geometry csrc/gt_conv.h reads (gt_conv_geo): nb ch ih iw kh kw oh ow sh sw ph pw
    dh dw oc groups."""
    return np.array([*x_shape, *w_shape[2:], *out_shape[2:], *stride, *padding, *dilation,
                     w_shape[0], groups], dtype=np.int64)


def _out_hw(x, w, stride, padding, dilation):
    return (conv_out_size(x.shape[2], w.shape[2], stride[0], padding[0], dilation[0]),
            conv_out_size(x.shape[3], w.shape[3], stride[1], padding[1], dilation[1]))


def conv2d_backward(g, x, w, stride, padding, dilation, groups, need_x, need_w) -> tuple:
    """(dx, dw) of :func:`conv2d` (None where not needed).

    With ``gt = g`` as [G, OCg, N*OH*OW] (an exact copy):
    ``dw_g = gt_g @ cols_g^T``, each element the inner product over (n, oh, ow)
    ascending; ``dcols_g = w_g^T @ gt_g``, each the inner product over the
    group's output channels ascending, then dx = :func:`col2im` (dcols): the
    terms summed from 0.0 over (i, j) ascending.  Both products in the matmul
    order by :func:`bmm`.

    Compiled (``csrc/gt_conv.h``), sample by sample: dx per sample (its dcols, then
    its col2im); dw as one FMA chain per element carried from sample to sample in
    (n, oh, ow) order, so the same bits as :func:`conv2d_backward_numpy`.
    """
    lib, dt = _conv_library(x)
    if lib is not None:
        g, x, w = (np.ascontiguousarray(a, dt) for a in (g, x, w))
        geo = _conv_geo(x.shape, w.shape, g.shape, stride, padding, dilation, groups)
        dx = np.empty(x.shape, dt) if need_x else None
        dw = np.empty(w.shape, dt) if need_w else None
        if need_x:
            ws, nbytes = _workspace(lib, geo, _CONV_DX)
            lib.gt_conv2d_dx(geo.ctypes.data, dx.ctypes.data, g.ctypes.data, w.ctypes.data, 0,
                             ws.ctypes.data, nbytes)
        if need_w:
            ws, nbytes = _workspace(lib, geo, _CONV_DW)
            lib.gt_conv2d_dw(geo.ctypes.data, dw.ctypes.data, g.ctypes.data, x.ctypes.data, 0,
                             ws.ctypes.data, nbytes)
        return dx, dw
    return conv2d_backward_numpy(g, x, w, stride, padding, dilation, groups, need_x, need_w)


def conv2d_backward_numpy(g, x, w, stride, padding, dilation, groups, need_x, need_w):
    """:func:`conv2d_backward` through the whole batch's columns and :func:`bmm`."""
    oc, cg, kh, kw = w.shape
    n = x.shape[0]
    gt = np.ascontiguousarray(g.reshape(n, oc, -1).transpose(1, 0, 2)).reshape(groups, oc // groups, -1)
    dx = dw = None
    if need_w:
        cols = im2col(x, (kh, kw), stride, padding, dilation, groups)
        dw = bmm(gt, cols.transpose(0, 2, 1)).reshape(w.shape)
    if need_x:
        wg = np.ascontiguousarray(w).reshape(groups, oc // groups, cg * kh * kw)
        dcols = bmm(wg.transpose(0, 2, 1), gt)
        dx = col2im(dcols, x.shape, (kh, kw), stride, padding, dilation)
    return dx, dw


def _pool_geometry(x, kernel, stride, padding, dilation, ceil_mode):
    n, c, h, w = x.shape
    oh = pool_out_size(h, kernel[0], stride[0], padding[0], dilation[0], ceil_mode)
    ow = pool_out_size(w, kernel[1], stride[1], padding[1], dilation[1], ceil_mode)
    # big enough for every window (ceil_mode's last one may reach past the padding)
    hp = max(h + 2 * padding[0], (oh - 1) * stride[0] + (kernel[0] - 1) * dilation[0] + 1)
    wp = max(w + 2 * padding[1], (ow - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1)
    return oh, ow, hp, wp


def _max_pool_index(x, kernel, stride, padding, dilation, ceil_mode):
    """(values, window offsets l = i*KW + j of each window's maximum; -1: no position of
    the window lies inside the input, the value is then -inf)."""
    oh, ow, hp, wp = _pool_geometry(x, kernel, stride, padding, dilation, ceil_mode)
    xp = _padded(x, padding[0], padding[1], hp, wp, -np.inf)
    if xp is x:             # every window inside the input: its first position starts it
        m = _window_view(x, 0, 0, oh, ow, stride, dilation).copy()
        idx = np.zeros(m.shape, dtype=np.int64)
        for l in range(1, kernel[0] * kernel[1]):
            v = _window_view(x, l // kernel[1], l % kernel[1], oh, ow, stride, dilation)
            take = (m == m) & ((v > m) | (v != v))
            np.copyto(m, v, where=take)
            idx[take] = l
        return m, idx
    inside = _padded(np.ones(x.shape, dtype=bool), padding[0], padding[1], hp, wp, False)
    m = np.full(x.shape[:2] + (oh, ow), -np.inf, dtype=x.dtype)
    idx = np.full(m.shape, -1, dtype=np.int64)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            v = _window_view(xp, i, j, oh, ow, stride, dilation)
            ok = _window_view(inside, i, j, oh, ow, stride, dilation)
            take = ok & ((idx < 0) | ((m == m) & ((v > m) | (v != v))))
            np.copyto(m, v, where=take)
            idx[take] = i * kernel[1] + j
    return m, idx


def max_pool2d(x, kernel, stride, padding, dilation, ceil_mode) -> np.ndarray:
    """Per window the first maximum over its positions inside the input, in (i, j)
    row-major order: ``m = first; for each later l: if m == m and (v > m or v != v): m = v``
    (:func:`first_max`: a NaN wins, the first of equal values wins).  Exact copies.
    Compiled (``csrc/gt_conv.h``) when available: the same rule, the same bits."""
    lib, dt = _conv_library(x)
    if lib is not None:
        x = np.ascontiguousarray(x, dt)
        out = np.empty(x.shape[:2] + _pool_geometry(x, kernel, stride, padding, dilation,
                                                    ceil_mode)[:2], dt)
        geo = _pool_geo(x.shape, out.shape, kernel, stride, padding, dilation)
        ws, nbytes = _workspace(lib, geo, _POOL_FWD)
        if lib.gt_max_pool2d(geo.ctypes.data, out.ctypes.data, x.ctypes.data, ws.ctypes.data,
                             nbytes):
            return out
    return _max_pool_index(x, kernel, stride, padding, dilation, ceil_mode)[0]


def _pool_geo(x_shape, out_shape, kernel, stride, padding, dilation) -> np.ndarray:
    return np.array([*x_shape, *kernel, *out_shape[2:], *stride, *padding, *dilation, 0, 1],
                    dtype=np.int64)


def max_pool2d_backward(g, x, kernel, stride, padding, dilation, ceil_mode) -> np.ndarray:
    """Per input element ``0.0 + g[window] + ...`` over the windows whose maximum it is,
    (i, j) ascending; +0.0 where it is none's.  Compiled (``csrc/gt_conv.h``) when
    available: the same sums in the same order."""
    lib, dt = _conv_library(x)
    if lib is not None:
        g, x = np.ascontiguousarray(g, dt), np.ascontiguousarray(x, dt)
        dx = np.empty(x.shape, dt)
        geo = _pool_geo(x.shape, g.shape, kernel, stride, padding, dilation)
        ws, nbytes = _workspace(lib, geo, _POOL_DX)
        if lib.gt_max_pool2d_dx(geo.ctypes.data, dx.ctypes.data, g.ctypes.data, x.ctypes.data,
                                0, ws.ctypes.data, nbytes):
            return dx
    oh, ow, hp, wp = _pool_geometry(x, kernel, stride, padding, dilation, ceil_mode)
    idx = _max_pool_index(x, kernel, stride, padding, dilation, ceil_mode)[1]
    dxp = np.zeros(x.shape[:2] + (hp, wp), dtype=g.dtype)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            view = _window_view(dxp, i, j, oh, ow, stride, dilation)
            np.add(view, np.where(idx == i * kernel[1] + j, g, 0.0), out=view)   # + 0.0: exact
    h, w = x.shape[2:]
    return np.ascontiguousarray(dxp[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w])


def avg_pool_divisor(x_hw, out_hw, kernel, stride, padding, count_include_pad) -> np.ndarray:
    """torch's divisor per window, [OH, OW]: the window clipped to the padded input
    (count_include_pad) or to the input itself."""
    out = []
    for size, o, k, s, p in zip(x_hw, out_hw, kernel, stride, padding):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, size + p)
        if count_include_pad:
            out.append(end - start)
        else:
            out.append(np.minimum(end, size) - np.maximum(start, 0))
    return (out[0][:, None] * out[1][None, :]).astype(np.float64)


def avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad) -> np.ndarray:
    """``(0.0 + x + ...) / divisor`` per window, over its positions inside the input in
    (i, j) ascending order (padding adds +0.0, which changes nothing), one division."""
    one = (1, 1)
    oh, ow, hp, wp = _pool_geometry(x, kernel, stride, padding, one, ceil_mode)
    xp = _padded(x, padding[0], padding[1], hp, wp, 0.0)
    acc = np.zeros(x.shape[:2] + (oh, ow), dtype=x.dtype)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            np.add(acc, _window_view(xp, i, j, oh, ow, stride, one), out=acc)
    return acc / avg_pool_divisor(x.shape[2:], (oh, ow), kernel, stride, padding,
                                  count_include_pad).astype(x.dtype)      # exact counts


def avg_pool2d_backward(g, x, kernel, stride, padding, ceil_mode, count_include_pad):
    """Per input element ``0.0 + g[window] / divisor + ...`` over the windows reading it,
    (i, j) ascending (each quotient one rounded division)."""
    one = (1, 1)
    oh, ow, hp, wp = _pool_geometry(x, kernel, stride, padding, one, ceil_mode)
    q = g / avg_pool_divisor(x.shape[2:], (oh, ow), kernel, stride, padding,
                             count_include_pad).astype(g.dtype)
    dxp = np.zeros(x.shape[:2] + (hp, wp), dtype=g.dtype)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            view = _window_view(dxp, i, j, oh, ow, stride, one)
            np.add(view, q, out=view)
    h, w = x.shape[2:]
    return np.ascontiguousarray(dxp[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w])


# ── the counter-based generator (the module docstring: "The counter-based generator") ──

MIX_INCREMENT = 0x9E3779B97F4A7C15
MIX_MUL1 = 0xBF58476D1CE4E5B9
MIX_MUL2 = 0x94D049BB133111EB
COUNTER_LIMIT = 2 ** 53          # step and shard are whole numbers in [0, 2^53)


def mix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on uint64 values, every operation modulo 2^64 (numpy's
    uint64 add and multiply wrap)."""
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):      # numpy warns about a wrapping scalar multiply
        z = z + np.uint64(MIX_INCREMENT)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX_MUL1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX_MUL2)
        return z ^ (z >> np.uint64(31))


def uniform_counters_ok(step: float, shard: float) -> bool:
    """Whether both counters are whole numbers in [0, 2^53) (``uniform`` reads them)."""
    return all(math.isfinite(c) and 0 <= c < COUNTER_LIMIT and c == math.floor(c)
               for c in (float(step), float(shard)))


def uniform(shape, salt: int, step: float, shard: float) -> np.ndarray:
    """The ``uniform`` op's values: u[i] = (mix(mix(mix(mix(salt) ^ step) ^ shard) ^ i)
    >> 11) * 2^-53 for element i (row-major) of ``shape``; NaN everywhere when a counter
    is not a whole number in [0, 2^53)."""
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if not uniform_counters_ok(step, shard):
        return np.full(tuple(shape), np.nan)
    base = mix64(mix64(mix64(np.uint64(salt)) ^ np.uint64(int(step))) ^ np.uint64(int(shard)))
    h = mix64(base ^ np.arange(n, dtype=np.uint64))
    return ((h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53).reshape(tuple(shape))
