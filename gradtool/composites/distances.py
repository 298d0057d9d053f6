"""Pairwise distances (torch's cdist and pdist), recorded from the op table's ops.

GVar-first functions (the nodes go on the operand's tape), usable from ``gt.Tape``
without torch; the importer's ATen entries (``aten._cdist_forward``,
``aten._pdist_forward``: :mod:`gradtool.interop.aten.nn`) call them.  Compared with torch
float64 in ``tests/test_composites_distances.py``.

p = 2 is the direct form (torch's CPU kernel may use a matrix-product form for large
inputs, which rounds differently): the differences, their squares, a serial sum along the
last axis, a sqrt; p = 1 the serial sum of |differences|.  A zero distance has the
gradient 0 there (torch's cdist and pdist's convention), not sqrt's inf * 0.
"""

from __future__ import annotations

import numpy as np

from ..errors import TapeError
from ..tape import GVar

__all__ = ["norms", "cdist", "pdist"]


def _checked(x, p, what: str):
    if not isinstance(x, GVar):
        raise TapeError(f"composites.distances.{what}: expected a GVar, got "
                        f"{type(x).__name__}")
    p = float(p)
    if p not in (1.0, 2.0):
        raise TapeError(f"composites.distances.{what}: p = {p!r} (p = 1 and 2 only)")
    return x.tape, p


def norms(d: GVar, p: float) -> GVar:
    """The p-norms of the differences ``d`` along the last axis (p = 1: the sum of |d|;
    p = 2: sqrt of the sum of d * d, 0 with a zero gradient where that sum is 0)."""
    tp, p = _checked(d, p, "norms")
    if p == 1.0:
        return tp.sum(tp.abs(d), axis=-1)
    s = tp.sum(tp.mul(d, d), axis=-1)
    zero = tp.eq(s, tp.const_like(s, np.array([0.0])))
    return tp.where(zero, tp.const_like(s, np.array([0.0])),
                    tp.sqrt(tp.where(zero, tp.const_like(s, np.array([1.0])), s)))


def cdist(x1: GVar, x2: GVar, p: float = 2.0) -> GVar:
    """torch.cdist: x1 [..., P, M], x2 [..., R, M] -> [..., P, R], the p-norm (1 or 2) of
    x1[..., i, None, :] - x2[..., None, j, :] along M (batch dims as the operands give
    them, broadcasting)."""
    tp, p = _checked(x1, p, "cdist")
    _checked(x2, p, "cdist")
    pa, pb = list(x1.shape), list(x2.shape)
    d = tp.sub(tp.reshape(x1, pa[:-1] + [1, pa[-1]]), tp.reshape(x2, pb[:-2] + [1] + pb[-2:]))
    return norms(d, p)


def pdist(x: GVar, p: float = 2.0) -> GVar:
    """torch.pdist: x [N, M] -> [N * (N - 1) / 2], the distances of the rows i < j in
    torch's order (row-major over the upper triangle): cdist of x with itself, picked by
    take."""
    tp, p = _checked(x, p, "pdist")
    if len(x.shape) != 2:
        raise TapeError(f"composites.distances.pdist: x of shape {list(x.shape)} "
                        f"(a matrix [N, M] only)")
    n, m = x.shape
    d = tp.sub(tp.reshape(x, [n, 1, m]), tp.reshape(x, [1, n, m]))
    full = tp.reshape(norms(d, p), [n * n])
    rows, cols = np.triu_indices(n, 1)
    return tp.take(full, tp.const((rows * n + cols).astype(np.int64), dtype="i64"))
