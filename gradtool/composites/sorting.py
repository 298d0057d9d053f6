"""Sorting, Tape methods: ``sort`` and ``topk`` by pairwise comparisons (stable, NaN
largest), exact copies of the entries by the ids they find."""

from __future__ import annotations

import math

import numpy as np

from ._axes import checked_axis, fail, is_int, shape_of
from .layout import swapaxes, unsqueeze

__all__ = ["topk", "sort"]


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
    shape = shape_of(tp, a, what)
    ax = checked_axis(axis, len(shape), what)
    n = shape[ax]
    if not is_int(k) or not 1 <= k <= n:
        return fail(tp, f"{what}: k must be an int in [1, {n}], got {k!r}"[:200])
    if not isinstance(largest, (bool, np.bool_)):
        flag = "largest" if what == "topk" else "descending"
        return fail(tp, f"{what}: {flag} must be True or False, got {largest!r}"[:200])
    rows = math.prod(shape) // n
    if rows * n * n > PAIRWISE_LIMIT:
        return fail(tp, f"{what}: rows of {n} entries compared pairwise: {rows} x {n} x "
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
    shape = shape_of(tp, a, "sort")
    n = shape[checked_axis(axis, len(shape), "sort")]
    return _order(tp, a, axis, n, descending, "sort")


# name -> function(tp, ...): each becomes a Tape method of that name (tape.py)
METHODS = {"topk": topk, "sort": sort}
