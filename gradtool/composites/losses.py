"""Losses: ``softmax_cross_entropy`` against integer targets, ``mse``."""

from __future__ import annotations

from ..tape import GVar
from ._args import tape_of

__all__ = ["softmax_cross_entropy", "mse"]


def softmax_cross_entropy(logits: GVar, ids: GVar, axis: int = -1) -> GVar:
    """Mean cross-entropy of class logits against integer targets: ``-mean(log_softmax
    (logits)[target])``, shape [1].

    ``ids`` is an i64 const (``tp.const(labels, dtype="i64")``), or integer-valued ids
    computed from one on the tape (docs/ops.md; every row counts: for an ignore_index,
    mask the rows as docs/ops.md's cross-entropy example does), shaped like
    logits with the class axis of size 1 (logits [N, C] -> ids [N, 1]), each
    id a class in [0, C).  Recorded as ``log_softmax`` along the class axis,
    ``take_along`` of each row's target entry, ``mean`` and ``neg``: no
    division of probabilities, so a confident wrong prediction costs a large
    finite loss instead of log(0).
    """
    tp = tape_of(logits, "softmax_cross_entropy")
    picked = tp.take_along(tp.log_softmax(logits, axis=axis), ids, axis=axis)
    return tp.neg(tp.mean(picked))


def mse(y: GVar, t: GVar) -> GVar:
    """Mean squared error ``mean((y - t) * (y - t))``, shape [1] (the Tape's ``mse``)."""
    return tape_of(y, "mse").mse(y, t)
