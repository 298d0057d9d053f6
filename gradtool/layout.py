"""Layout composites and multi-axis reductions: Tape methods that record existing ops.

Each function here becomes a :class:`~gradtool.tape.Tape` method (``tp.expand``,
``tp.select``, ...; ``tp.sum/mean/max`` with a tuple of axes) and records
ordinary op-table nodes, no node type of its own, like :mod:`gradtool.nn`.
Every one is exact by construction: the layout ones record only copies
(``reshape``, ``permute``, ``slice``, ``concat``, ``take``) and ``x + (-0.0)``
(``expand``), which is ``x`` bit for bit (signed zeros and NaN included);
the reductions record the single-axis reduction of the documented order
(``numerics``: "multi-axis reduction").  The bits are therefore those of
the ops they record, on every backend.

Shapes follow PyTorch where it differs from numpy only in spelling
(``dim`` is ``axis``; negative axes count from the end).  A result with no
dims left is ``[1]``, as everywhere in gradtool.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers

import numpy as np

from .errors import ShapeError, TapeError
from .ops import format_shape

__all__ = ["METHODS", "reduction_method"]


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _shape(tp, a, what: str) -> tuple:
    return tuple(tp.values[tp.node_id(a, what)].shape)


def _fail(tp, message: str):
    """A shape problem: poison the tape (ShapeError with raise_on_error), as ops do."""
    return tp._poison(message, ShapeError)


def _axis(x, rank: int, what: str, *, extra: int = 0) -> int:
    """One axis in [-rank-extra, rank+extra), normalised to >= 0; TapeError otherwise."""
    if not _is_int(x):
        raise TapeError(f"{what}: an axis must be an int, got {x!r}"[:200])
    n = rank + extra
    if not -n <= int(x) < n:
        raise TapeError(f"{what}: axis {int(x)} is out of range for rank {rank}")
    return int(x) + n if x < 0 else int(x)


def _axes(axis, rank: int, what: str) -> list:
    """None -> every axis; an int or a sequence of ints -> sorted distinct axes >= 0."""
    if axis is None:
        return list(range(rank))
    items = [axis] if _is_int(axis) else None
    if items is None:
        try:
            items = list(axis)
        except TypeError:
            raise TapeError(f"{what}: axis must be None, an int or a sequence of ints, "
                            f"got {axis!r}"[:200]) from None
    out = [_axis(x, rank, what) for x in items]
    for x in out:
        if out.count(x) > 1:
            raise TapeError(f"{what}: axis {x} appears more than once in {list(items)}")
    return sorted(out)


def _dims(shape, what: str) -> list:
    try:
        dims = list(shape)
    except TypeError:
        raise TapeError(f"{what}: expected a sequence of ints, got {shape!r}"[:200]) from None
    if not all(_is_int(d) for d in dims):
        raise TapeError(f"{what}: expected ints, got {dims!r}"[:200])
    return [int(d) for d in dims]


# ── multi-axis reductions ──────────────────────────────────────────────────

def reduce_axes(tp, op: str, a, axis, keepdims: bool = False):
    """``sum``/``mean``/``max`` over several axes at once (numerics: "multi-axis
    reduction"): the reduced axes are moved behind the kept ones in their order
    (a ``permute``, left out when they are already adjacent), merged into one
    (a ``reshape``), and reduced as one axis: so every kept index's result is the
    single-axis rule over the reduced coordinates in row-major order (the
    serial sum from 0.0; the mean divides it once by their count; the max is
    the first maximal element, whose one element gets the gradient).  Every
    axis at once is the whole reduction itself (``axis=None``).
    """
    method = getattr(tp, f"_{op}_one")
    shape = _shape(tp, a, op)
    axes = _axes(axis, len(shape), op)
    if not axes:
        raise TapeError(f"{op}: axis=() names no axis (numpy would reduce none, torch "
                        f"every one); pass None for every axis")
    if len(axes) == 1:
        return method(a, axes[0], keepdims)
    if len(axes) == len(shape):
        return method(a, None, keepdims)
    kept = [d for d in range(len(shape)) if d not in axes]
    count = math.prod(shape[d] for d in axes)
    if axes == list(range(axes[0], axes[-1] + 1)):          # adjacent: merge in place
        merged = list(shape[:axes[0]]) + [count] + list(shape[axes[-1] + 1:])
        r = method(tp.reshape(a, merged), axes[0], False)
    else:
        moved = tp.permute(a, kept + axes)
        r = method(tp.reshape(moved, [shape[d] for d in kept] + [count]), len(kept), False)
    if keepdims:
        r = tp.reshape(r, [1 if d in axes else shape[d] for d in range(len(shape))])
    return r


def reduction_method(one):
    """The Tape's ``sum``/``mean``/``max``: the table's op method ``one`` for None or one
    axis (the file node it always was), :func:`reduce_axes` for a tuple of axes."""
    op = one.__name__

    @functools.wraps(one)
    def method(self, a, axis=None, keepdims=False):
        if axis is None or _is_int(axis):
            return one(self, a, axis, keepdims)
        return reduce_axes(self, op, a, axis, keepdims)

    method.__signature__ = inspect.signature(one)
    method.__doc__ = (one.__doc__ or "") + (
        "\n\nA tuple of axes reduces them all at once: row-major over the reduced "
        "coordinates (numerics: multi-axis reduction), recorded as permute/reshape and "
        "the one-axis op.")
    return method


def variance(tp, a, axis=None, correction=1, keepdims=False):
    """torch.var (named ``variance``: ``Tape.var`` already looks up a node's handle):
    ``m = mean(a, axis, keepdims=True)``, ``d = a - m``, then ``sum(d * d, axis) /
    max(0, N - correction)`` (one division by a const; N the number of reduced
    elements).  torch's CPU kernel accumulates differently (Welford),
    so torch's float64 bits differ from these in the last places."""
    shape = _shape(tp, a, "variance")
    axes = _axes(axis, len(shape), "variance")
    if not axes:
        raise TapeError("variance: axis=() names no axis; pass None for every axis")
    if not isinstance(correction, numbers.Real) or isinstance(correction, (bool, np.bool_)):
        raise TapeError(f"variance: correction must be a number, got {correction!r}"[:200])
    d = tp.sub(a, tp.mean(a, axes, keepdims=True))
    ss = tp.sum(tp.mul(d, d), axes, keepdims)
    n = math.prod(shape[x] for x in axes)
    return tp.div(ss, tp.const_like(ss, np.array([max(0.0, n - float(correction))])))


def std(tp, a, axis=None, correction=1, keepdims=False):
    """torch.std: ``sqrt(variance(a, axis, correction, keepdims))``."""
    return tp.sqrt(variance(tp, a, axis, correction, keepdims))


def amin(tp, a, axis=None, keepdims=False):
    """The first minimal element (torch.amin's value; one axis, several, or every one):
    ``-max(-a)``, exact (negation is), so ties and NaN go as in :meth:`Tape.max`: the
    first NaN, else the first smallest element, which alone gets the gradient."""
    return tp.neg(tp.max(tp.neg(a), axis, keepdims))


# ── views, as copies ───────────────────────────────────────────────────────

def expand(tp, a, shape):
    """numpy's ``broadcast_to`` (torch's ``expand``, where -1 keeps a dim): new leading dims
    and size-1 dims stretch.  Recorded as ``add(a, c)`` with c a const of -0.0 shaped 1
    except on the stretched dims (``x + -0.0`` is x exactly), so the gradient is summed
    back in ``numerics.reduce_to_shape``'s order.  Integer-valued ``a`` (ids) is recorded
    as ``keep(a, m)`` with m a const of ones so shaped, the same copy and gradient, still
    integer-valued.  The same shape returns ``a``."""
    have = _shape(tp, a, "expand")
    want = _dims(shape, "expand shape")
    if len(want) < len(have):
        return _fail(tp, f"expand: cannot expand {format_shape(have)} to fewer dims "
                         f"{format_shape(want)}")
    pad = (1,) * (len(want) - len(have)) + have
    target = []
    for k, (h, w) in enumerate(zip(pad, want)):
        if w == -1 and k >= len(want) - len(have):
            w = h
        if w < 1 or (h != 1 and h != w):
            return _fail(tp, f"expand: cannot expand {format_shape(have)} to "
                             f"{format_shape(want)} (dim {k})")
        target.append(w)
    if tuple(target) == have:
        return a
    stretch = [w if h == 1 and w != 1 else 1 for h, w in zip(pad, target)]
    if tp.integral[a.id]:            # ids stay ids: keep(a, ones) is a exactly, integral
        return tp.keep(a, tp.const(np.ones(stretch)))
    return tp.add(a, tp.const_like(a, np.full(stretch, -0.0)))


def reshape_to(tp, a, shape, what):
    """A reshape, left out when the shape does not change."""
    shape = [int(d) for d in shape] or [1]
    return a if tuple(shape) == _shape(tp, a, what) else tp.reshape(a, shape)


def unsqueeze(tp, a, axis):
    """A new size-1 axis at ``axis`` (in [-rank-1, rank]), as torch.unsqueeze."""
    shape = _shape(tp, a, "unsqueeze")
    ax = _axis(axis, len(shape), "unsqueeze", extra=1)
    return tp.reshape(a, list(shape[:ax]) + [1] + list(shape[ax:]))


def squeeze(tp, a, axes=None):
    """Drop size-1 axes: every one (None), or those of ``axes`` (an int or a sequence)
    that have size 1 (torch.squeeze leaves the others).  No dims left: [1]."""
    shape = _shape(tp, a, "squeeze")
    drop = _axes(axes, len(shape), "squeeze")
    return reshape_to(tp, a, [n for d, n in enumerate(shape) if not (d in drop and n == 1)],
                      "squeeze")


def flatten(tp, a, start=0, end=-1):
    """Merge axes start..end (inclusive) into one, as torch.flatten."""
    shape = _shape(tp, a, "flatten")
    lo, hi = _axis(start, len(shape), "flatten"), _axis(end, len(shape), "flatten")
    if lo > hi:
        raise TapeError(f"flatten: start axis {lo} comes after end axis {hi}")
    return reshape_to(tp, a, list(shape[:lo]) + [math.prod(shape[lo:hi + 1])]
                      + list(shape[hi + 1:]), "flatten")


def select(tp, a, axis, index):
    """``a`` at ``index`` of ``axis``, the axis dropped (torch.select; negative index counts
    from the end): a slice, then a reshape."""
    shape = _shape(tp, a, "select")
    ax = _axis(axis, len(shape), "select")
    if not _is_int(index) or not -shape[ax] <= int(index) < shape[ax]:
        raise TapeError(f"select: index {index!r} is out of range for axis {ax} of "
                        f"{format_shape(shape)}"[:200])
    i = int(index) % shape[ax]
    starts = [0] * len(shape)
    stops = list(shape)
    starts[ax], stops[ax] = i, i + 1
    return tp.reshape(tp.slice(a, starts, stops),
                      [n for d, n in enumerate(shape) if d != ax] or [1])


def narrow(tp, a, axis, start, stop, step=1):
    """``a[start:stop:step]`` on one axis (a slice node; the whole axis returns ``a``)."""
    shape = _shape(tp, a, "narrow")
    ax = _axis(axis, len(shape), "narrow")
    if (start, stop, step) == (0, shape[ax], 1):
        return a
    starts, stops = [0] * len(shape), list(shape)
    starts[ax], stops[ax] = start, stop
    steps = None
    if step != 1:
        steps = [1] * len(shape)
        steps[ax] = step
    return tp.slice(a, starts, stops, steps)


def split(tp, a, sizes, axis=0):
    """Pieces along ``axis`` (torch.split): ``sizes`` an int (pieces of that size, the last
    one shorter) or a list of sizes adding up to the axis.  -> a list of GVars (slices;
    one piece covering the axis is ``a`` itself)."""
    shape = _shape(tp, a, "split")
    ax = _axis(axis, len(shape), "split")
    n = shape[ax]
    if _is_int(sizes):
        if sizes < 1:
            raise TapeError(f"split: a piece size must be >= 1, got {sizes}")
        sizes = [min(int(sizes), n - lo) for lo in range(0, n, int(sizes))]
    sizes = _dims(sizes, "split sizes")
    if any(s < 1 for s in sizes) or sum(sizes) != n:
        raise TapeError(f"split: sizes {sizes} must be >= 1 and add up to {n}, the size of "
                        f"axis {ax} of {format_shape(shape)}")
    out, lo = [], 0
    for s in sizes:
        out.append(narrow(tp, a, ax, lo, lo + s))
        lo += s
    return out


def cat(tp, xs, axis=0):
    """``xs`` (one or more GVars) joined along ``axis`` (torch.cat): binary concats in a
    balanced tree (every value and gradient a copy, so any grouping gives the same
    bits; the tree copies each element log2(N) times, a chain N times)."""
    try:
        xs = list(xs)
    except TypeError:
        raise TapeError(f"cat: expected a sequence of GVars, got {xs!r}"[:200]) from None
    if not xs:
        raise TapeError("cat: needs at least one input")
    ax = _axis(axis, len(_shape(tp, xs[0], "cat")), "cat")
    while len(xs) > 1:
        pairs = [tp.concat(xs[k], xs[k + 1], ax) for k in range(0, len(xs) - 1, 2)]
        xs = pairs + xs[len(xs) - len(xs) % 2:]
    return xs[0]


def index_select(tp, a, axis, ids):
    """Entries of ``axis`` picked by 1-d integer ids (torch.index_select): ``ids`` an i64
    const (or int data, recorded as one), ``take`` on axis 0, with permutes moving the
    axis to the front and back.  Backward: ``take``'s (each entry's gradient summed over
    the positions that picked it, ascending)."""
    shape = _shape(tp, a, "index_select")
    ax = _axis(axis, len(shape), "index_select")
    if not hasattr(ids, "tape"):
        ids = tp.const(np.asarray(ids), dtype="i64")
    ids_shape = _shape(tp, ids, "index_select ids")
    if len(ids_shape) != 1:
        return _fail(tp, f"index_select: ids must be 1-d, got {format_shape(ids_shape)}")
    if ax == 0:
        return tp.take(a, ids)
    perm = [ax] + [d for d in range(len(shape)) if d != ax]
    return tp.permute(tp.take(tp.permute(a, perm), ids), list(np.argsort(perm)))


def index_add(tp, base, axis, ids, src, alpha=1.0):
    """``base`` plus ``src``'s entries of ``axis`` summed into the entries ``ids`` names
    (torch.index_add: ``ids`` 1-d integer ids, an i64 const or integer-valued node, or int
    data, recorded as one; ``src`` shaped like ``base`` except along ``axis``, where it
    has ``len(ids)`` entries).  Recorded as ``add(base, scatter(src, ids, rows))``, with
    permutes moving ``axis`` to the front and back, and ``muls(src, alpha)`` first where
    ``alpha != 1``.  Entry v is therefore ``base[v] + (0.0 + src[p0] + src[p1] + ...)``
    over the positions reading v, ascending: gradtool's order, within rounding of
    torch's sequential ``base[v] += src[p]`` (the same bits where base is +0.0 and alpha
    1).  Backward: ``base`` gets ``g``, ``src`` the exact gather ``take(g, ids)``."""
    shape = _shape(tp, base, "index_add base")
    ax = _axis(axis, len(shape), "index_add")
    if not hasattr(ids, "tape"):
        arr = np.asarray(ids)
        if arr.dtype.kind not in "iu":
            raise TapeError(f"index_add: ids must be integer data, got dtype {arr.dtype}")
        ids = tp.const(arr.astype(np.int64), dtype="i64")
    ids_shape = _shape(tp, ids, "index_add ids")
    src_shape = _shape(tp, src, "index_add src")
    if not isinstance(alpha, numbers.Real) or isinstance(alpha, (bool, np.bool_)):
        raise TapeError(f"index_add: alpha must be a number, got {alpha!r}"[:200])
    if len(ids_shape) != 1:
        return _fail(tp, f"index_add: ids must be 1-d, got {format_shape(ids_shape)}")
    want = shape[:ax] + ids_shape + shape[ax + 1:]
    if src_shape != want:
        return _fail(tp, f"index_add along axis {ax} of {format_shape(shape)} by "
                         f"{ids_shape[0]} ids needs src {format_shape(want)}, got "
                         f"{format_shape(src_shape)}")
    if alpha != 1:
        src = tp.muls(src, float(alpha))
    perm = [ax] + [d for d in range(len(shape)) if d != ax]
    if ax == 0:
        return tp.add(base, tp.scatter(src, ids, rows=shape[0]))
    summed = tp.scatter(tp.permute(src, perm), ids, rows=shape[ax])
    return tp.add(base, tp.permute(summed, [int(d) for d in np.argsort(perm)]))


def flip(tp, a, axes):
    """``a`` with the order of the entries of ``axes`` (an int or a sequence) reversed
    (torch.flip): one :func:`index_select` with descending ids per axis longer than 1,
    copies, so the values and the gradient are exact."""
    shape = _shape(tp, a, "flip")
    for ax in _axes(axes, len(shape), "flip"):
        if shape[ax] > 1:
            a = index_select(tp, a, ax, np.arange(shape[ax] - 1, -1, -1, dtype=np.int64))
    return a


def _chain(tp, a, axis, what, step, first=lambda x: x):
    """([y0, y1, ...], axis): the serial chain along ``axis`` of the one-entry slices x_i,
    ``y0 = first(x0)``, ``y_i = step(y_(i-1), x_i)`` in ascending order (the running
    sums, products and maxima)."""
    shape = _shape(tp, a, what)
    ax = _axis(axis, len(shape), what)
    run = first(narrow(tp, a, ax, 0, 1))
    out = [run]
    for i in range(1, shape[ax]):
        run = step(run, narrow(tp, a, ax, i, i + 1))
        out.append(run)
    return out, ax


def cumsum(tp, a, axis):
    """Running sums along ``axis`` (torch.cumsum): ``y[0] = 0.0 + a[0]``, ``y[i] = y[i-1]
    + a[i]``, each sum one rounding in ascending order, as torch's CPU loop (which starts
    from +0.0, so a -0.0 first entry gives +0.0).  Recorded as one-entry slices, a chain
    of ``add`` nodes and a :func:`cat`: about three nodes per entry of the axis, and the
    gradient of each entry is the serial sum of the later gradients through the chain."""
    return cat(tp, *_chain(tp, a, axis, "cumsum", tp.add, lambda first: tp.adds(first, 0.0)))


def cumprod(tp, a, axis):
    """Running products along ``axis`` (torch.cumprod): ``y[0] = a[0]``, ``y[i] = y[i-1] *
    a[i]``, each product one rounding in ascending order; one-entry slices, a chain of
    ``mul`` nodes and a :func:`cat`.  The gradient is the chain rule through the chain
    (exact in value where an entry is zero, as torch's special case for zeros)."""
    return cat(tp, *_chain(tp, a, axis, "cumprod", tp.mul))


def cummax(tp, a, axis):
    """Running maxima along ``axis`` (torch.cummax's values): ``y[0] = a[0]``, ``y[i] =
    maximum(a[i], y[i-1])``, exact copies; a tie gives the later entry (and its
    gradient), as torch's index, and a NaN stays (its gradient then follows the
    chain back, where torch's goes to the NaN's own entry)."""
    return cat(tp, *_chain(tp, a, axis, "cummax", lambda run, x: tp.maximum(x, run)))


def cummin(tp, a, axis):
    """Running minima (torch.cummin's values): ``-cummax(-a)``, exact; ties to the later."""
    return tp.neg(cummax(tp, tp.neg(a), axis))


def logcumsumexp(tp, a, axis):
    """Running log-sum-exps along ``axis`` (torch.logcumsumexp): ``y[0] = a[0]``, ``y[i] =
    logaddexp(y[i-1], a[i])`` with ``logaddexp(u, v) = m + log(exp(u - m) + exp(v - m))``,
    ``m = max(u, v)`` held as a constant (``detach``: the gradient is the exact softmax
    weights, also on a tie) and taken as 0 where it is -inf (so two -inf give -inf, as
    torch's).  Each step stays in range however far apart the entries are (the running
    maximum, not the line's); about ten nodes per entry of the axis and a :func:`cat`."""
    def step(u, v):
        m = tp.detach(tp.maximum(u, v))
        m = tp.where(tp.eq(m, -math.inf), 0.0, m)
        return tp.add(m, tp.log(tp.add(tp.exp(tp.sub(u, m)), tp.exp(tp.sub(v, m)))))
    return cat(tp, *_chain(tp, a, axis, "logcumsumexp", step))


def prod(tp, a, axis=None, keepdims=False):
    """The product along ``axis`` (torch.prod; None: of every element, as [1]): the last
    entry of :func:`cumprod`'s chain, without the cat."""
    shape = _shape(tp, a, "prod")
    if axis is None:                             # of every element: shaped [1]
        steps, _ = _chain(tp, tp.reshape(a, [math.prod(shape)]), 0, "prod", tp.mul)
        return steps[-1]
    steps, ax = _chain(tp, a, axis, "prod", tp.mul)
    run = steps[-1]
    if keepdims:
        return run
    return reshape_to(tp, run, [n for d, n in enumerate(shape) if d != ax], "prod")


def repeat_interleave(tp, a, repeats, axis):
    """Each entry of ``axis`` repeated ``repeats`` times in place (torch.repeat_interleave
    with an int): unsqueeze behind the axis, expand, reshape.  The gradient of each
    entry sums its copies' in order (``numerics.reduce_to_shape``)."""
    shape = _shape(tp, a, "repeat_interleave")
    ax = _axis(axis, len(shape), "repeat_interleave")
    if not _is_int(repeats) or repeats < 1:
        raise TapeError(f"repeat_interleave: repeats must be an int >= 1, got {repeats!r}"
                        [:200])
    if repeats == 1:
        return a
    wide = list(shape[:ax + 1]) + [int(repeats)] + list(shape[ax + 1:])
    merged = list(shape[:ax]) + [shape[ax] * int(repeats)] + list(shape[ax + 1:])
    return tp.reshape(expand(tp, unsqueeze(tp, a, ax + 1), wide), merged)


# the pairwise comparisons of sort/topk: at most this many elements per [..., n, n] node
PAIRWISE_LIMIT = 1 << 22


def _order(tp, a, axis, k, largest, what):
    """(values, ids) of the first ``k`` entries of ``a`` along ``axis`` in sorted order,
    largest or smallest first.  Every entry's place is its rank: the number of entries
    that come before it, counted from the pairwise comparisons of the row ([..., n, n]
    masks: ``gt``/``lt``, and ``ne(x, x)`` so that a NaN comes before every number when
    largest, after every number when smallest, as torch's sort), plus the equal entries
    of lower index (ties keep their order: a stable sort; -0.0 equals +0.0).  The id of
    place p is the sum over the row of ``keep(index, rank == p)``, exact integers; the
    values are ``take_along`` by those ids, so each gets its entry's gradient exactly
    and the ranks none.  Cost: about a dozen nodes of rows x n x n elements."""
    shape = _shape(tp, a, what)
    ax = _axis(axis, len(shape), what)
    n = shape[ax]
    if not _is_int(k) or not 1 <= k <= n:
        return _fail(tp, f"{what}: k must be an int in [1, {n}], got {k!r}"[:200])
    if not isinstance(largest, (bool, np.bool_)):
        flag = "largest" if what == "topk" else "descending"
        return _fail(tp, f"{what}: {flag} must be True or False, got {largest!r}"[:200])
    rows = math.prod(shape) // n
    if rows * n * n > PAIRWISE_LIMIT:
        return _fail(tp, f"{what}: rows of {n} entries compared pairwise: {rows} x {n} x "
                         f"{n} elements exceed the limit of {PAIRWISE_LIMIT}")
    last = len(shape) - 1
    x = swapaxes(tp, a, ax, last)
    xi, xj = unsqueeze(tp, x, last + 1), unsqueeze(tp, x, last)   # [.., n, 1], [.., 1, n]
    nan_i, nan_j = tp.ne(xi, xi), tp.ne(xj, xj)
    if largest:
        before = tp.add(tp.gt(xj, xi), tp.mul(nan_j, tp.eq(xi, xi)))
    else:
        before = tp.add(tp.lt(xj, xi), tp.mul(tp.eq(xj, xj), nan_i))
    tie = tp.add(tp.eq(xj, xi), tp.mul(nan_j, nan_i))
    lower = tp.const(np.tri(n, n, -1))                   # [i, j]: 1 where j < i
    rank = tp.sum(tp.add(before, tp.mul(tie, lower)), axis=last + 1)        # [.., n]
    places = tp.const(np.arange(k, dtype=np.int64).reshape(k, 1), dtype="i64")
    hit = tp.eq(unsqueeze(tp, rank, last), places)                          # [.., k, n]
    index = tp.const(np.arange(n, dtype=np.int64), dtype="i64")
    ids = tp.sum(tp.keep(index, hit), axis=last + 1)                        # [.., k]
    values = tp.take_along(x, ids, axis=last)
    return swapaxes(tp, values, ax, last), swapaxes(tp, ids, ax, last)


def topk(tp, a, k, axis=-1, largest=True):
    """The ``k`` largest (or smallest) entries along ``axis`` and their ids, in order
    (torch.topk with sorted=True): see :func:`sort` for the order, ties and NaNs."""
    return _order(tp, a, axis, k, largest, "topk")


def sort(tp, a, axis=-1, descending=False):
    """``a`` sorted along ``axis`` and the ids of the entries (torch.sort(stable=True)):
    ascending, or descending; a NaN counts as the largest value, equal entries keep their
    order.  Exact copies (``take_along``) by ids from pairwise comparisons, so each value
    gets its own entry's gradient; the cost is rows x n x n elements (n the axis length),
    refused above :data:`PAIRWISE_LIMIT`."""
    shape = _shape(tp, a, "sort")
    n = shape[_axis(axis, len(shape), "sort")]
    return _order(tp, a, axis, n, descending, "sort")


def swapaxes(tp, a, axis1, axis2):
    """Two axes exchanged (torch.transpose(a, d0, d1), numpy.swapaxes): a ``permute``
    (``a`` itself when they are the same axis)."""
    shape = _shape(tp, a, "swapaxes")
    i, j = _axis(axis1, len(shape), "swapaxes"), _axis(axis2, len(shape), "swapaxes")
    if i == j:
        return a
    dims = list(range(len(shape)))
    dims[i], dims[j] = j, i
    return tp.permute(a, dims)


def stack(tp, xs, axis=0):
    """``xs`` (equally shaped GVars) joined along a new axis (torch.stack): each gets the
    axis by ``unsqueeze``, then :func:`cat`."""
    try:
        xs = list(xs)
    except TypeError:
        raise TapeError(f"stack: expected a sequence of GVars, got {xs!r}"[:200]) from None
    if not xs:
        raise TapeError("stack: needs at least one input")
    ax = _axis(axis, len(_shape(tp, xs[0], "stack")), "stack", extra=1)
    return cat(tp, [unsqueeze(tp, x, ax) for x in xs], ax)


def pad(tp, a, widths, value=0.0):
    """``a`` with ``widths[k] = (before, after)`` elements of ``value`` added on each side
    of axis k (numpy.pad's constant mode; one pair per axis, each >= 0): concats with
    const blocks, axis by axis (the values and the gradient are copies)."""
    shape = _shape(tp, a, "pad")
    try:
        pairs = [_dims(w, "pad widths") for w in widths]
    except TypeError:
        raise TapeError(f"pad: widths must be one (before, after) pair per axis, got "
                        f"{widths!r}"[:200]) from None
    if len(pairs) != len(shape) or any(len(p) != 2 or min(p) < 0 for p in pairs):
        raise TapeError(f"pad: widths must be one (before, after) pair of ints >= 0 per axis "
                        f"of {format_shape(shape)}, got {widths!r}"[:200])
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise TapeError(f"pad: value must be a number, got {value!r}"[:200])
    # ids padded with a whole number (labels with -100) stay ids: the blocks are i64
    # consts read through to_f64 (exact), so the result is integer-valued like its input
    whole = (tp.integral[a.id] and math.isfinite(value) and value == math.floor(value)
             and abs(value) <= 2 ** 53)
    out, cur = a, list(shape)
    for ax, (before, after) in enumerate(pairs):
        parts = []
        for width in (before, after):
            block = list(cur)
            block[ax] = width
            if not width:
                parts.append(None)
            elif whole:
                parts.append(tp.to_f64(tp.const(np.full(block, int(value), dtype=np.int64),
                                                dtype="i64")))
            else:
                parts.append(tp.const(np.full(block, float(value))))
        out = cat(tp, [x for x in (parts[0], out, parts[1]) if x is not None], ax)
        cur[ax] += before + after
    return out


# name -> function(tp, ...): each becomes a Tape method of that name (tape.py)
METHODS = {"expand": expand, "unsqueeze": unsqueeze, "squeeze": squeeze, "flatten": flatten,
           "select": select, "narrow": narrow, "split": split, "cat": cat, "stack": stack,
           "swapaxes": swapaxes, "pad": pad,
           "index_select": index_select, "index_add": index_add,
           "repeat_interleave": repeat_interleave,
           "flip": flip, "cumsum": cumsum, "cumprod": cumprod, "cummax": cummax,
           "cummin": cummin, "logcumsumexp": logcumsumexp, "prod": prod,
           "topk": topk, "sort": sort,
           "variance": variance, "std": std, "amin": amin}
