"""The table's reductions: sum, mean and max over one axis or every element."""

from __future__ import annotations

import numpy as np

from .. import numerics as nx
from ..expr import G, X
from .spec import Attr, OpSpec, _register, attr, kernel
from .shapes import _axis_check


# ── the table: reductions ──────────────────────────────────────────────────
#
# sum, mean and max reduce one axis (``axis``) or, without one, every element.
# ``keepdims`` keeps the reduced axis (every axis, for a whole reduction) as
# size 1; without it the axis is dropped, and a result with no dims left is
# [1] (where numpy would give a 0-d array).  Every line of the reduced axis
# is a row of ``len`` elements at stride ``inner`` (a whole reduction: one row
# of every element); the kernels run one thread per row.

kernel("k_sum", "out:w a:r len:i inner:i is_mean:i acc:i",
       "per row: v = (0.0 + a0 + a1 + ...) [/ len], serial; out (=|+=) v "
       "(numerics.serial_sum_axis)")
kernel("k_sum_bwd", "ga:w g:r len:i inner:i is_mean:i",
       "ga[i] = ga[i] + v, v = g[row of i] (sum) or g[row of i] / len (mean)")
kernel("k_max", "out:w a:r len:i inner:i", "per row: out = the first maximal element "
       "(numerics.first_max)")
kernel("k_max_bwd", "ga:w g:r a:r len:i inner:i",
       "per row: ga = ga + (g at the first maximal element, +0.0 elsewhere)")

REDUCE_ATTRS = (
    Attr("axis", "axis", "the axis to reduce; negative counts from the end; None (absent "
         "from a file): every element", default=None, optional=True),
    Attr("keepdims", "flag", "keep the reduced axis as size 1, as numpy does", default=False,
         optional=True),
)


def _reduce_shape(sa, _sb, attrs):
    axis, keep = attr(attrs, "axis"), attr(attrs, "keepdims", False)
    if axis is None:
        return (1,) * len(sa) if keep else (1,)
    _axis_check(sa, axis, "reduction")
    if keep:
        return tuple(sa[:axis]) + (1,) + tuple(sa[axis + 1:])
    return tuple(sa[:axis]) + tuple(sa[axis + 1:]) or (1,)


def _rows(a, at):
    """(a as [..., len, ...] with the reduced axis, that axis): a whole reduction is one
    row of every element."""
    axis = attr(at, "axis")
    return (a.reshape(-1), 0) if axis is None else (a, axis)


def _sum_f(a, b, s, at):
    if attr(at, "axis") is None:
        return nx.serial_sum(a).reshape(_reduce_shape(a.shape, None, at))   # same order
    rows, axis = _rows(a, at)
    return nx.serial_sum_axis(rows, axis).reshape(_reduce_shape(a.shape, None, at))


def _mean_f(a, b, s, at):
    if attr(at, "axis") is None:
        return nx.serial_mean(a).reshape(_reduce_shape(a.shape, None, at))
    rows, axis = _rows(a, at)
    return (nx.serial_sum_axis(rows, axis) / float(rows.shape[axis])).reshape(
        _reduce_shape(a.shape, None, at))


def _spread(g, a, at):
    """g (one value per row) in a's keepdims layout, ready to broadcast over a."""
    axis = attr(at, "axis")
    kept = (1,) * a.ndim if axis is None else a.shape[:axis] + (1,) + a.shape[axis + 1:]
    return g.reshape(kept)


def _sum_b(g, a, b, t, s, at, na, nb):
    if attr(at, "axis") is None:
        return (np.full(a.shape, g.reshape(-1)[0]), None)   # one value: np.full is cheaper
    return (np.broadcast_to(_spread(g, a, at), a.shape).copy(), None)


def _mean_b(g, a, b, t, s, at, na, nb):
    if attr(at, "axis") is None:
        return (np.full(a.shape, g.reshape(-1)[0] / float(a.size)), None)
    rows, axis = _rows(a, at)
    return (np.broadcast_to(_spread(g, a, at) / float(rows.shape[axis]), a.shape).copy(),
            None)


def _max_f(a, b, s, at):
    rows, axis = _rows(a, at)
    return nx.first_max(rows, axis)[0].reshape(_reduce_shape(a.shape, None, at))


def _max_b(g, a, b, t, s, at, na, nb):
    rows, axis = _rows(a, at)
    idx = nx.first_max(rows, axis)[1]
    c = np.zeros(rows.shape, dtype=g.dtype)         # g at each row's max, +0.0 elsewhere
    np.put_along_axis(c, idx, g.reshape(idx.shape), axis)
    return (c.reshape(a.shape), None)


# one-element forms (the emitter): the serial sum of one element is 0.0 + x; the mean
# divides that by n = 1 (a division, not a copy), and its gradient is g / 1.0; the max of
# one element is that element, and its gradient all of g
_register(OpSpec("sum", "reduce", 1, "serial sum along an axis, or of every element",
                 _reduce_shape, _sum_f, _sum_b, scalar=(0.0 + X, (G,)),
                 kernels=("k_sum", "k_sum_bwd"), attrs=REDUCE_ATTRS, integral="inputs"))
_register(OpSpec("mean", "reduce", 1, "serial sum / count, along an axis or of every element",
                 _reduce_shape, _mean_f, _mean_b, scalar=((0.0 + X) / 1.0, (G / 1.0,)),
                 kernels=("k_sum", "k_sum_bwd"), attrs=REDUCE_ATTRS))
_register(OpSpec("max", "max", 1, "the first maximal element along an axis, or of every "
                 "element; a NaN wins; the gradient goes to that one element",
                 _reduce_shape, _max_f, _max_b, scalar=(X, (G,)),
                 kernels=("k_max", "k_max_bwd"), attrs=REDUCE_ATTRS, integral="inputs"))
