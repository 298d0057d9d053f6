"""The float32 contract: every floating-point order of an f32 value, in one place.

:mod:`gradtool.numerics` is the float64 contract; this module is its float32 twin.
An f32 result is identical to the bit on every backend (this numpy reference, the
compiled CPU kernels, the host backend, CUDA, the emitted C) because each one runs
the sequence of correctly rounded IEEE 754 binary32 operations written down here.
The C rendering is ``gradtool/csrc/gt_real32.h``; tests/test_numerics32.py compares
its bits with this module's.

Rules that hold for every function here
---------------------------------------
* ``+ - * /`` and ``sqrt`` are IEEE binary32, round to nearest even, subnormals kept
  (no FTZ/DAZ anywhere; nvcc ``-ftz=false``).  numpy's float32 ufuncs are exactly
  that, one rounding per element.  Nothing is fused outside the inner products.
* Inner products (matmul, bmm, the convolution products and their gradients) are a
  chain of binary32 fusedMultiplyAdds, :func:`fmaf`, k ascending from +0.0: the f64
  contract's order with ``fmaf`` for ``fma``.
* Sums and reductions (sum, mean, axis sums, multi-axis sums, the broadcast
  reductions of backward, softmax's and log_softmax's sums, the clipping norm) use
  the *lane-tree order* below, not the serial order of the f64 contract (which stays
  serial): a serial binary32 sum of 10^6 elements can be off by (n-1)u ~ 6%.
* The transcendental functions (:func:`unary`, :func:`atan2`) are the float64 fdlibm
  ports of :mod:`gradtool.fdlibm` applied to the input widened exactly to float64,
  then ONE rounding to float32.

The orders
----------
fmaf              ``a*b + c`` rounded once to binary32 (:func:`fmaf`: exact emulation)
matmul C = A @ B  ``c[i,j] = +0.0f; for k = 0..K-1: c[i,j] = fmaf(a[i,k], b[k,j], c[i,j])``
bmm               the matmul order in every batch slice; a batch of 1 on one side is
                  read for every batch (its gradient: the lane-tree sum over the batch)
sum of n values   the lane-tree order (below); the result depends only on n and the
                  values, never on the machine, SIMD width or thread count
axis sum          the lane-tree sum along one axis, other indices fixed
multi-axis sum    per kept index, the lane-tree sum of the reduced coordinates taken in
                  row-major order (reduced axes ascending, the last fastest), as the f64
                  contract orders them
mean              ``sum / float32(n)``: one binary32 division (n rounded to float32
                  once, exact for n <= 2^24)
broadcast         :func:`reduce_to_shape`: per input element, the lane-tree sum of its
reduction         contributions in row-major order of the broadcast coordinates
shard mean        per element ``acc = x[0]; acc = acc + x[1]; ...; acc / float32(S)``
                  (the f64 fold, in binary32; S is small)
gather backward   :func:`scatter_rows`: the f64 serial order ``0.0 + g[p0] + ...`` in
                  binary32 (a table row is read a few times, not 10^6)
unary functions   ``float32(fdlibm_f64(float64(x)))``
first max, take   exact, dtype-independent: :func:`gradtool.numerics.first_max` as is

The lane-tree order (sum of x[0..n-1])
--------------------------------------
Constants: ``LANES = 32``, ``CHUNK = 8``, ``BLOCK = LANES * CHUNK = 256``.

Method.  Pad x with +0.0 to ``nb = max(1, ceil(n / BLOCK))`` whole blocks.  Element
``i = b*BLOCK + c*LANES + l`` belongs to block b, chunk c, lane l.

1. Lane sums, per block and lane (serial over the block's 8 chunks, from +0.0)::

       p[b][l] = +0.0;  for c = 0..CHUNK-1:  p[b][l] = p[b][l] + x[b*BLOCK + c*LANES + l]

2. Block tree, per lane: the perfect binary tree over the blocks padded with +0.0
   partials to the next power of two, adjacent pairs first::

       while nb > 1:  p[j] = p[2j] + p[2j+1]  for every j  (p[nb] = +0.0 when nb odd);
                      nb = ceil(nb / 2)

   The same tree, streamed (a GPU thread or CPU loop that sees blocks in order):
   keep a stack; after block b is pushed, pop-and-add once per trailing one bit of b
   (``left + right``); at the end add the stack from the top down.  Equivalently:
   S(blocks [lo, lo+m)) = S(the first 2^k) + S(the rest), 2^k the largest power of
   two below m.

3. Lane fold: ``for h = 16, 8, 4, 2, 1: v[l] = v[l] + v[l+h] for l < h``; the sum is
   ``v[0]``.  (Upper half onto lower half: a SIMD register's halves, or one warp's
   ``__shfl_down_sync(., v, h)`` steps.)

Why padding with +0.0 changes nothing.  Every partial starts at +0.0 and a sum
rounded to zero under round-to-nearest is +0.0, so no partial is ever -0.0, and
``v + (+0.0)`` is ``v`` bit for bit for every other v (NaN and infinities included).
So an implementation may skip the padded elements, partials and lanes entirely; the
sum of zero elements, and of any number of -0.0, is +0.0.

Bound.  Every element reaches the result through at most
``D(n) = (min(CHUNK, ceil(n/LANES)) - 1) + ceil(log2(nb)) + ceil(log2(min(n, LANES)))``
inexact additions (:func:`sum_depth`: a lane's first addition, to +0.0, is exact, and
so is every addition of a padded +0.0; D = CHUNK - 1 + ceil(log2 nb) + 5 from
n = 256 on), so (Higham, Accuracy and Stability of Numerical
Algorithms, 2nd ed., section 4.2) ``|sum - exact| <= gamma_D * sum(|x|)``,
``gamma_D = D u / (1 - D u)``, ``u = 2^-24``; without overflow.  D(10^6) = 24:
``<= 1.4e-6 * sum|x|``, where the serial binary32 sum's bound is ``(n - 1) u =
6.0e-2``.  ``docs/numerics-f32.md`` has the measured errors.

Why this order.  CPU: a block's 32 lanes are 2 AVX-512, 4 AVX2 or 8 SSE registers of
independent accumulators (the compiler vectorises the lane loop without reassociating
anything), the block tree is one vector add per block, and the fold is the usual
halving of a register.  GPU: one warp per row, thread l owns lane l: each step reads
32 consecutive floats (one 128-byte line), each thread streams its own stack of block
partials (at most ceil(log2 nb) + 1 deep, indexed by level, in registers), and the
fold is five shuffles; a thread owning a whole row visits the lanes in bit-reversed
order, where the fold is a tree of adjacent pairs (``gt_real32.h``).  The chunk of 8
keeps the block-tree additions to one per 8 loads per lane.
"""

from __future__ import annotations

import math

import numpy as np

from . import fdlibm
from . import numerics as _nx

__all__ = [
    "LANES", "CHUNK", "BLOCK", "sum_depth", "sum_bound",
    "fmaf", "matmul", "bmm", "matmul_numpy", "bmm_numpy", "cpu_library",
    "sum", "sum_all", "mean", "mean_all", "sum_axis", "sum_axes", "reduce_to_shape",
    "shard_mean", "shard_accumulate", "shard_divide", "scatter_rows",
    "UNARY", "unary", "atan2",
]

LANES = 32
CHUNK = 8
BLOCK = LANES * CHUNK
U32 = 2.0 ** -24              # the unit roundoff of binary32

_F32 = np.dtype(np.float32)


# ── the fused multiply-add in binary32, exactly, in numpy ──────────────────

def fmaf(a, b, c) -> np.ndarray:
    """IEEE 754 binary32 fusedMultiplyAdd: ``a*b + c`` rounded once to float32 (to
    nearest, ties to even), elementwise with numpy broadcasting; float32 out.

    Operands are converted to float32 first (exact for float32 input).

    Method (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved
    algorithms using rounding to odd", IEEE Trans. Computers 57(4), 2008):

    * ``p = float64(a) * float64(b)`` is exact: two 24-bit significands make at most
      48 bits (<= 53), and the exponents (-298 .. 256) are inside float64's normal
      range, so even subnormal float32 operands multiply exactly.
    * ``s = p + c`` (float64, round to nearest) and its error ``e`` by Knuth's TwoSum,
      exact (|s| < 2^258: no overflow).
    * round to odd: when ``e != 0``, replace s by the neighbour of the exact sum whose
      last significand bit is odd: truncate toward zero (one step down in magnitude
      when s was rounded away, i.e. e has the other sign) then set the last bit.  The
      result is the exact sum rounded to odd at 53 bits.
    * one rounding to float32 (round to nearest even).  Rounding to odd at 53 >= 24 + 2
      bits, then to nearest at 24, is the exact sum rounded to nearest (their theorem);
      a float32 subnormal result has fewer bits still, and any nonzero s is a multiple
      of 2^-298, a float64 normal, so it holds there too; overflow to +-inf happens
      exactly when the correctly rounded result overflows.

    Special cases.  When ``s`` is not finite (an infinite or NaN operand, inf - inf,
    0 * inf) the result is ``float32(p + c)``, which is the fmaf's (any NaN for a NaN:
    payloads are not promised).  Signed zeros come out as IEEE says: ``-0 + -0`` is
    -0.0, an exact zero sum of nonzero terms +0.0, and a nonzero exact result that
    rounds to zero keeps its sign (the float32 conversion of a tiny s).

    Tests (tests/test_numerics32.py) compare it with the machine's ``fmaf`` (an FMA
    instruction, or libm's correctly rounded ``fmaf``) on 10^7 random and adversarial
    triples, bit for bit.
    """
    a, b, c = np.broadcast_arrays(*(np.asarray(x, dtype=np.float32) for x in (a, b, c)))
    with np.errstate(all="ignore"):
        p = a.astype(np.float64) * b.astype(np.float64)
        c64 = c.astype(np.float64)
        s = p + c64
        bb = s - p
        e = (p - (s - bb)) + (c64 - bb)
        inexact = (e != 0) & np.isfinite(s)
        away = inexact & ((e < 0) != (s < 0))
        bits = np.asarray(s).view(np.int64)
        odd = ((bits - away) | inexact).view(np.float64)
        return odd.astype(np.float32)


# ── inner products ─────────────────────────────────────────────────────────

def _f32(x) -> np.ndarray:
    x = np.asarray(x)
    return x if x.dtype == _F32 else x.astype(np.float32)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[M,K] @ [K,N] in float32: every c[i,j] the chain ``acc = +0.0f; for k
    ascending: acc = fmaf(a[i,k], b[k,j], acc)`` (:func:`gradtool.numerics.matmul`'s
    order, with :func:`fmaf`; +0.0 starts it for the same reasons).

    Runs the compiled kernel (:func:`cpu_library`: ``csrc/gt_matmul.h``'s tiles
    instantiated for float through ``csrc/gt_cpu.c -DGT_CPU_F32``, the same tile
    generator as float64's; one ``fmaf`` per step, an FMA instruction or libm's
    ``fmaf``) when a C compiler is available, else :func:`matmul_numpy`; the two give
    identical bits (tests/test_device_f32.py: every build and thread count;
    tests/test_numerics32.py), only the speed differs.  Operands may be any float32
    views (``b.T`` in the backward rules)."""
    lib = cpu_library()
    if lib is None:
        return matmul_numpy(a, b)
    out = np.empty((a.shape[0], b.shape[1]), dtype=np.float32)
    _nx._native_product(lib, out, _f32(a)[np.newaxis], _f32(b)[np.newaxis], 1)
    return out


def bmm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[B,M,K] @ [B,K,N] in float32: the :func:`matmul` chain in every batch slice.  A
    batch of 1 on either side is read for every batch of the other (as the f64 op
    stretches it); the stretched side's gradient is the caller's :func:`sum_axis`
    over axis 0.  Compiled as :func:`matmul` (the stretched side a stride-0 batch),
    else :func:`bmm_numpy`."""
    lib = cpu_library()
    if lib is None:
        return bmm_numpy(a, b)
    a, b = _f32(a), _f32(b)
    batch = max(a.shape[0], b.shape[0])
    a = np.broadcast_to(a, (batch,) + a.shape[1:])
    b = np.broadcast_to(b, (batch,) + b.shape[1:])
    out = np.empty((batch, a.shape[1], b.shape[2]), dtype=np.float32)
    _nx._native_product(lib, out, a, b, batch)
    return out


def matmul_numpy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`matmul` in numpy: vectorised over the outputs, one :func:`fmaf` per k."""
    a, b = _f32(a), _f32(b)
    m, kdim = a.shape
    acc = np.zeros((m, b.shape[1]), dtype=np.float32)
    for k in range(kdim):
        acc = fmaf(a[:, k:k + 1], b[k], acc)
    return acc


def bmm_numpy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`bmm` in numpy: the :func:`matmul_numpy` chain in every batch slice."""
    a, b = _f32(a), _f32(b)
    batch = max(a.shape[0], b.shape[0])
    acc = np.zeros((batch, a.shape[1], b.shape[2]), dtype=np.float32)
    for k in range(a.shape[2]):
        acc = fmaf(a[:, :, k:k + 1], b[:, k:k + 1, :], acc)
    return acc


def cpu_library():
    """The compiled float32 kernels (:func:`gradtool.numerics.cpu_kernels32`: the float
    build of ``csrc/gt_cpu.c``), or None (no C compiler, or ``GRADTOOL_NATIVE=0``)."""
    return _nx.cpu_kernels32()


# ── the lane-tree sum ──────────────────────────────────────────────────────

def sum_depth(n: int) -> int:
    """D(n): the most rounded additions between any element and the sum of n values
    in the lane-tree order (the module docstring's bound is gamma_D * sum|x|)."""
    n = int(n)
    nb = max(1, -(-n // BLOCK))
    per_lane = min(CHUNK, -(-n // LANES))          # elements of one lane in one block
    lanes = min(max(n, 1), LANES)                  # lanes holding any element
    return max(per_lane - 1, 0) + (nb - 1).bit_length() + (lanes - 1).bit_length()


def sum_bound(n: int) -> float:
    """gamma_D(n) = D u / (1 - D u): ``|sum - exact| <= sum_bound(n) * sum(|x|)``."""
    d = sum_depth(n) * U32
    return d / (1.0 - d)


def _lane_tree(x: np.ndarray) -> np.ndarray:
    """:func:`_lane_tree_body`, compiled for float32 (gt_cpu.c's gt_lane_tree_cols: the
    same additions, 64 columns at a time) where the CPU kernels are built."""
    if x.dtype == _F32 and x.ndim and x.size:
        lib = cpu_library()
        if lib is not None:
            src = np.ascontiguousarray(x).reshape(x.shape[0], -1)
            out = np.empty(src.shape[1], _F32)
            if lib.gt_lane_tree_cols(src.shape[0], src.shape[1], src.ctypes.data,
                                     out.ctypes.data):
                return out.reshape(x.shape[1:])
    with np.errstate(over="ignore", invalid="ignore"):     # inf and NaN are sums too
        return _lane_tree_body(x)


def _lane_tree_body(x: np.ndarray) -> np.ndarray:
    """The lane-tree sum of ``x`` [n, S] along axis 0 -> [S], in x's dtype (float32; float64
    only for scripts/accuracy_f32.py's timing: the f64 contract's sums stay serial)."""
    n = x.shape[0]
    rest = x.shape[1:]
    nfull = n // BLOCK
    tail = n - nfull * BLOCK
    parts = []
    if nfull:
        blocks = x[:nfull * BLOCK].reshape((nfull, CHUNK, LANES) + rest)
        p = blocks[:, 0] + np.float32(0.0)
        for c in range(1, CHUNK):
            p += blocks[:, c]
        parts.append(p)
    width = LANES
    if tail or not nfull:
        t = x[nfull * BLOCK:]
        width = min(tail, LANES)
        q = t[:width] + np.float32(0.0)
        for start in range(LANES, tail, LANES):
            seg = t[start:start + LANES]
            q[:seg.shape[0]] += seg
        if nfull:                            # the tail block joins the tree: 32 lanes
            full = np.zeros((LANES,) + rest, dtype=x.dtype)
            full[:width] = q
            parts.append(full[np.newaxis])
            width = LANES
        else:
            parts.append(q[np.newaxis])
    p = parts[0] if len(parts) == 1 else np.concatenate(parts)
    while p.shape[0] > 1:                    # step 2: adjacent pairs, an odd one carried
        m = p.shape[0]
        pairs = p[0:m - 1:2] + p[1:m:2]
        p = np.concatenate([pairs, p[m - 1:]]) if m & 1 else pairs
    v = p[0]
    for h in (16, 8, 4, 2, 1):               # step 3, skipping the +0.0 lanes
        if width > h:
            low = v[:h].copy()
            low[:width - h] += v[h:width]
            v, width = low, h
    if width == 0:                           # n == 0
        return np.zeros(rest, dtype=x.dtype)
    return v[0]


def _rows_last(x: np.ndarray, axes: tuple):
    """(x arranged as [count, kept...] with the reduced coordinates row-major along axis
    0, the kept shape): the layout :func:`_lane_tree` sums."""
    kept = [ax for ax in range(x.ndim) if ax not in axes]
    moved = np.transpose(x, tuple(sorted(axes)) + tuple(kept))
    kshape = tuple(x.shape[ax] for ax in kept)
    return moved.reshape((-1,) + kshape), kshape


def _axes(x: np.ndarray, axis) -> tuple:
    if axis is None:
        return tuple(range(x.ndim))
    if isinstance(axis, (int, np.integer)):
        axis = (int(axis),)
    out = []
    for ax in axis:
        ax = int(ax)
        if not -x.ndim <= ax < max(x.ndim, 1):
            raise ValueError(f"axis {ax} out of range for {x.ndim} dims")
        out.append(ax % max(x.ndim, 1))
    if len(set(out)) != len(out):
        raise ValueError(f"repeated axis in {axis}")
    return tuple(sorted(out))


def sum(x, axis=None, keepdims=False) -> np.ndarray:   # noqa: A001 (mirrors np.sum)
    """The lane-tree sum of float32 ``x`` over ``axis`` (None: every element; an int;
    a tuple: the reduced coordinates in row-major order), float32."""
    x = _f32(x)
    axes = _axes(x, axis)
    rows, kshape = _rows_last(x, axes)
    out = _lane_tree(rows).astype(np.float32, copy=False).reshape(kshape)
    if keepdims:
        out = out.reshape(tuple(1 if ax in axes else d for ax, d in enumerate(x.shape)))
    return out


def mean(x, axis=None, keepdims=False) -> np.ndarray:
    """:func:`sum` / float32(count): one binary32 division."""
    x = _f32(x)
    count = math.prod(x.shape[ax] for ax in _axes(x, axis))
    return np.divide(sum(x, axis, keepdims), np.float32(count), dtype=np.float32)


def sum_all(x) -> np.ndarray:
    """Twin of :func:`gradtool.numerics.serial_sum`: every element, shape [1]."""
    return sum(x).reshape(1)


def mean_all(x) -> np.ndarray:
    """Twin of :func:`gradtool.numerics.serial_mean`: ``sum_all(x) / float32(n)``, [1]."""
    x = _f32(x)
    return np.divide(sum_all(x), np.float32(x.size), dtype=np.float32)


def sum_axis(x, axis: int) -> np.ndarray:
    """Twin of :func:`gradtool.numerics.serial_sum_axis`: the lane-tree sum along one
    axis, keepdims=True."""
    return sum(x, int(axis), keepdims=True)


def sum_axes(x, axes) -> np.ndarray:
    """The multi-axis reduction's sum (keepdims=True): per kept index the lane-tree sum
    over the reduced coordinates in row-major order, whatever order they are named in."""
    return sum(x, tuple(axes), keepdims=True)


def reduce_to_shape(c: np.ndarray, shape: tuple) -> np.ndarray:
    """Twin of :func:`gradtool.numerics.reduce_to_shape`: an out-shaped float32
    contribution summed down to a broadcast input's shape.  Each input element gets the
    lane-tree sum of the contributions mapping onto it, in row-major order of the
    broadcast coordinates (so +0.0, never -0.0, for all-zero contributions); when
    nothing is broadcast, ``c`` itself."""
    c = _f32(c)
    shape = tuple(shape)
    if c.shape == shape:
        return c
    nd = c.ndim
    padded = (1,) * (nd - len(shape)) + shape
    bcast = tuple(ax for ax in range(nd) if padded[ax] == 1 and c.shape[ax] != 1)
    if not bcast:
        return c.reshape(shape)
    rows, _ = _rows_last(c, bcast)
    return _lane_tree(rows).astype(np.float32, copy=False).reshape(shape)


# ── the other f64 folds, in binary32 ───────────────────────────────────────

def shard_mean(parts) -> np.ndarray:
    """:func:`gradtool.numerics.shard_mean` in binary32: ``acc = x[0]; acc = acc +
    x[1]; ...``, then ``acc / float32(S)``."""
    parts = list(parts)
    acc = np.array(parts[0], dtype=np.float32, copy=True)
    for x in parts[1:]:
        shard_accumulate(acc, x)
    return shard_divide(acc, len(parts))


def shard_accumulate(acc: np.ndarray, x: np.ndarray) -> None:
    """One step of :func:`shard_mean`'s fold, in place, binary32."""
    np.add(acc, _f32(x), out=acc)


def shard_divide(acc: np.ndarray, shards: int) -> np.ndarray:
    """``acc = acc / float32(S)`` in place; returns acc."""
    np.divide(acc, np.float32(shards), out=acc)
    return acc


def scatter_rows(x: np.ndarray, ids: np.ndarray, rows: int) -> np.ndarray:
    """:func:`gradtool.numerics.scatter_rows` in binary32 (same serial order)."""
    return _nx.scatter_rows(_f32(x), ids, rows, dtype=np.float32)


# ── transcendental functions ───────────────────────────────────────────────

UNARY = {"exp": fdlibm.exp, "expm1": fdlibm.expm1, "log": fdlibm.log,
         "log1p": fdlibm.log1p, "tanh": fdlibm.tanh, "erf": fdlibm.erf,
         "erfc": fdlibm.erfc, "sin": fdlibm.sin, "cos": fdlibm.cos, "atan": fdlibm.atan}
"""The float32 transcendentals: name -> the float64 fdlibm port it rounds."""


def unary(name: str, x) -> np.ndarray:
    """``float32(fdlibm_<name>(float64(x)))``: the float64 function on the input
    widened exactly, then one rounding to float32 (round to nearest even).

    Bound: the f64 ports are within 1 ulp of binary64 (``gradtool.fdlibm``), so the
    float32 result is within 0.5 + 2^-28 ulp of float32 -- one float32 away from the
    correctly rounded value at most, and only when the exact value is within 2^-28
    float32 ulps of a float32 midpoint (the float64 result's error, 1 ulp of binary64,
    is 2^-29 ulps of binary32).  The measured largest errors over all 2^32 inputs
    are in ``docs/numerics-f32.md``.  The C twin is ``(float)gt_exp((double)x)``
    (``gt_real32.h``'s ``gt_expf`` ...), the same bits wherever the f64 port's are."""
    try:
        fn = UNARY[name]
    except KeyError:
        raise ValueError(f"no float32 function {name!r}; known: {sorted(UNARY)}") from None
    with np.errstate(over="ignore", invalid="ignore"):    # inf and NaN are results here
        return np.asarray(fn(_f32(x).astype(np.float64))).astype(np.float32)


def atan2(y, x) -> np.ndarray:
    """``float32(fdlibm.atan2(float64(y), float64(x)))``, broadcasting."""
    y, x = _f32(y).astype(np.float64), _f32(x).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(fdlibm.atan2(y, x)).astype(np.float32)
