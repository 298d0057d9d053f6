"""Layout composites: Tape methods that record copies.

Each function ``fn(tp, ...)`` here (but :func:`spread` and :func:`reshape_to`) is also a
:class:`~gradtool.tape.Tape` method of its name (``tp.expand``, ``tp.select``, ...; see
``METHODS``) and records ordinary op-table nodes, no node type of its own.  Every one is
exact by construction: they record only copies (``reshape``, ``permute``, ``slice``,
``concat``, ``take``, ``scatter`` of distinct rows' sums for ``index_add``) and ``x +
(-0.0)`` (``expand``), which is ``x`` bit for bit (signed zeros and NaN included).  The
bits are therefore those of the ops they record, on every backend.

Shapes follow PyTorch where it differs from numpy only in spelling (``dim`` is ``axis``;
negative axes count from the end).  A result with no dims left is ``[1]``, as everywhere
in gradtool.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

import numpy as np

from ..errors import TapeError
from ..ops import format_shape
from ._axes import checked_axes, checked_axis, checked_dims, fail, is_int, shape_of

if TYPE_CHECKING:
    from ..tape import GVar

__all__ = ["spread", "expand", "reshape_to", "unsqueeze", "squeeze", "flatten", "select",
           "narrow", "split", "cat", "stack", "swapaxes", "pad", "index_select", "index_add",
           "flip", "repeat_interleave"]


def spread(tp, x, axis: int, stride: int) -> GVar:
    """x with ``stride - 1`` zeros between neighbouring entries of ``axis`` (size (n-1) *
    stride + 1): a zero block joined behind each entry (a new axis), merged, the last
    zeros cut off.  Copies and zeros: exact."""
    if stride == 1 or x.shape[axis] == 1:
        return x
    shape = list(x.shape)
    n = shape[axis]
    col = tp.unsqueeze(x, axis + 1)
    zeros = tp.const(np.zeros(shape[:axis + 1] + [stride - 1] + shape[axis + 1:]))
    merged = shape[:axis] + [n * stride] + shape[axis + 1:]
    return tp.narrow(tp.reshape(tp.cat([col, zeros], axis + 1), merged), axis, 0,
                     (n - 1) * stride + 1)


def expand(tp, a, shape):
    """numpy's ``broadcast_to`` (torch's ``expand``, where -1 keeps a dim): new leading dims
    and size-1 dims stretch.  Recorded as ``add(a, c)`` with c a const of -0.0 shaped 1
    except on the stretched dims (``x + -0.0`` is x exactly), so the gradient is summed
    back in ``numerics.reduce_to_shape``'s order.  Integer-valued ``a`` (ids) is recorded
    as ``keep(a, m)`` with m a const of ones so shaped, the same copy and gradient, still
    integer-valued.  The same shape returns ``a``."""
    have = shape_of(tp, a, "expand")
    want = checked_dims(shape, "expand shape")
    if len(want) < len(have):
        return fail(tp, f"expand: cannot expand {format_shape(have)} to fewer dims "
                         f"{format_shape(want)}")
    pad = (1,) * (len(want) - len(have)) + have
    target = []
    for k, (h, w) in enumerate(zip(pad, want)):
        if w == -1 and k >= len(want) - len(have):
            w = h
        if w < 1 or (h != 1 and h != w):
            return fail(tp, f"expand: cannot expand {format_shape(have)} to "
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
    return a if tuple(shape) == shape_of(tp, a, what) else tp.reshape(a, shape)


def unsqueeze(tp, a, axis):
    """A new size-1 axis at ``axis`` (in [-rank-1, rank]), as torch.unsqueeze."""
    shape = shape_of(tp, a, "unsqueeze")
    ax = checked_axis(axis, len(shape), "unsqueeze", extra=1)
    return tp.reshape(a, list(shape[:ax]) + [1] + list(shape[ax:]))


def squeeze(tp, a, axes=None):
    """Drop size-1 axes: every one (None), or those of ``axes`` (an int or a sequence)
    that have size 1 (torch.squeeze leaves the others).  No dims left: [1]."""
    shape = shape_of(tp, a, "squeeze")
    drop = checked_axes(axes, len(shape), "squeeze")
    return reshape_to(tp, a, [n for d, n in enumerate(shape) if not (d in drop and n == 1)],
                      "squeeze")


def flatten(tp, a, start=0, end=-1):
    """Merge axes start..end (inclusive) into one, as torch.flatten."""
    shape = shape_of(tp, a, "flatten")
    lo, hi = checked_axis(start, len(shape), "flatten"), checked_axis(end, len(shape), "flatten")
    if lo > hi:
        raise TapeError(f"flatten: start axis {lo} comes after end axis {hi}")
    return reshape_to(tp, a, list(shape[:lo]) + [math.prod(shape[lo:hi + 1])]
                      + list(shape[hi + 1:]), "flatten")


def select(tp, a, axis, index):
    """``a`` at ``index`` of ``axis``, the axis dropped (torch.select; negative index counts
    from the end): a slice, then a reshape."""
    shape = shape_of(tp, a, "select")
    ax = checked_axis(axis, len(shape), "select")
    if not is_int(index) or not -shape[ax] <= int(index) < shape[ax]:
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
    shape = shape_of(tp, a, "narrow")
    ax = checked_axis(axis, len(shape), "narrow")
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
    shape = shape_of(tp, a, "split")
    ax = checked_axis(axis, len(shape), "split")
    n = shape[ax]
    if is_int(sizes):
        if sizes < 1:
            raise TapeError(f"split: a piece size must be >= 1, got {sizes}")
        sizes = [min(int(sizes), n - lo) for lo in range(0, n, int(sizes))]
    sizes = checked_dims(sizes, "split sizes")
    if any(s < 1 for s in sizes) or sum(sizes) != n:
        raise TapeError(f"split: sizes {sizes} must be >= 1 and add up to {n}, the size of "
                        f"axis {ax} of {format_shape(shape)}")
    out, lo = [], 0
    for s in sizes:
        out.append(narrow(tp, a, ax, lo, lo + s))
        lo += s
    return out


def _inputs(xs, what: str) -> list:
    """``xs`` (cat's and stack's inputs) as a non-empty list; TapeError otherwise."""
    try:
        xs = list(xs)
    except TypeError:
        raise TapeError(f"{what}: expected a sequence of GVars, got {xs!r}"[:200]) from None
    if not xs:
        raise TapeError(f"{what}: needs at least one input")
    return xs


def cat(tp, xs, axis=0):
    """``xs`` (one or more GVars) joined along ``axis`` (torch.cat): binary concats in a
    balanced tree (every value and gradient a copy, so any grouping gives the same
    bits; the tree copies each element log2(N) times, a chain N times)."""
    xs = _inputs(xs, "cat")
    ax = checked_axis(axis, len(shape_of(tp, xs[0], "cat")), "cat")
    while len(xs) > 1:
        pairs = [tp.concat(xs[k], xs[k + 1], ax) for k in range(0, len(xs) - 1, 2)]
        xs = pairs + xs[len(xs) - len(xs) % 2:]
    return xs[0]


def index_select(tp, a, axis, ids):
    """Entries of ``axis`` picked by 1-d integer ids (torch.index_select): ``ids`` an i64
    const (or int data, recorded as one), ``take`` on axis 0, with permutes moving the
    axis to the front and back.  Backward: ``take``'s (each entry's gradient summed over
    the positions that picked it, ascending)."""
    shape = shape_of(tp, a, "index_select")
    ax = checked_axis(axis, len(shape), "index_select")
    if not hasattr(ids, "tape"):
        ids = tp.const(np.asarray(ids), dtype="i64")
    ids_shape = shape_of(tp, ids, "index_select ids")
    if len(ids_shape) != 1:
        return fail(tp, f"index_select: ids must be 1-d, got {format_shape(ids_shape)}")
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
    shape = shape_of(tp, base, "index_add base")
    ax = checked_axis(axis, len(shape), "index_add")
    if not hasattr(ids, "tape"):
        arr = np.asarray(ids)
        if arr.dtype.kind not in "iu":
            raise TapeError(f"index_add: ids must be integer data, got dtype {arr.dtype}")
        ids = tp.const(arr.astype(np.int64), dtype="i64")
    ids_shape = shape_of(tp, ids, "index_add ids")
    src_shape = shape_of(tp, src, "index_add src")
    if not isinstance(alpha, numbers.Real) or isinstance(alpha, (bool, np.bool_)):
        raise TapeError(f"index_add: alpha must be a number, got {alpha!r}"[:200])
    if len(ids_shape) != 1:
        return fail(tp, f"index_add: ids must be 1-d, got {format_shape(ids_shape)}")
    want = shape[:ax] + ids_shape + shape[ax + 1:]
    if src_shape != want:
        return fail(tp, f"index_add along axis {ax} of {format_shape(shape)} by "
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
    shape = shape_of(tp, a, "flip")
    for ax in checked_axes(axes, len(shape), "flip"):
        if shape[ax] > 1:
            a = index_select(tp, a, ax, np.arange(shape[ax] - 1, -1, -1, dtype=np.int64))
    return a


def repeat_interleave(tp, a, repeats, axis):
    """Each entry of ``axis`` repeated ``repeats`` times in place (torch.repeat_interleave
    with an int): unsqueeze behind the axis, expand, reshape.  The gradient of each
    entry sums its copies' in order (``numerics.reduce_to_shape``)."""
    shape = shape_of(tp, a, "repeat_interleave")
    ax = checked_axis(axis, len(shape), "repeat_interleave")
    if not is_int(repeats) or repeats < 1:
        raise TapeError(f"repeat_interleave: repeats must be an int >= 1, got {repeats!r}"
                        [:200])
    if repeats == 1:
        return a
    wide = list(shape[:ax + 1]) + [int(repeats)] + list(shape[ax + 1:])
    merged = list(shape[:ax]) + [shape[ax] * int(repeats)] + list(shape[ax + 1:])
    return tp.reshape(expand(tp, unsqueeze(tp, a, ax + 1), wide), merged)


def swapaxes(tp, a, axis1, axis2):
    """Two axes exchanged (torch.transpose(a, d0, d1), numpy.swapaxes): a ``permute``
    (``a`` itself when they are the same axis)."""
    shape = shape_of(tp, a, "swapaxes")
    i, j = checked_axis(axis1, len(shape), "swapaxes"), checked_axis(axis2, len(shape), "swapaxes")
    if i == j:
        return a
    dims = list(range(len(shape)))
    dims[i], dims[j] = j, i
    return tp.permute(a, dims)


def stack(tp, xs, axis=0):
    """``xs`` (equally shaped GVars) joined along a new axis (torch.stack): each gets the
    axis by ``unsqueeze``, then :func:`cat`."""
    xs = _inputs(xs, "stack")
    ax = checked_axis(axis, len(shape_of(tp, xs[0], "stack")), "stack", extra=1)
    return cat(tp, [unsqueeze(tp, x, ax) for x in xs], ax)


def pad(tp, a, widths, value=0.0):
    """``a`` with ``widths[k] = (before, after)`` elements of ``value`` added on each side
    of axis k (numpy.pad's constant mode; one pair per axis, each >= 0): concats with
    const blocks, axis by axis (the values and the gradient are copies)."""
    shape = shape_of(tp, a, "pad")
    try:
        pairs = [checked_dims(w, "pad widths") for w in widths]
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
           "swapaxes": swapaxes, "pad": pad, "index_select": index_select,
           "index_add": index_add, "repeat_interleave": repeat_interleave, "flip": flip}
