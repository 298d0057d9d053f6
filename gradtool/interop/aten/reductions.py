"""Reductions, running (cumulative) ops, sorts and norms over axes."""

from __future__ import annotations

import math

import numpy as np

from .registry import Unsupported, aten, is_num


# ── reductions and normalisations ──────────────────────────────────────────

@aten("aten.sum.dim_IntList", "aten.sum.default",
      doc="sum (over one, several or all axes)")
def _sum(r, node, a, dim=None, keepdim=False, dtype=None):
    return r.reduce("sum", r.f(a), dim, keepdim)


@aten("aten.mean.dim", "aten.mean.default", doc="mean (over one, several or all axes)")
def _mean(r, node, a, dim=None, keepdim=False, dtype=None):
    return r.reduce("mean", r.f(a), dim, keepdim)


@aten("aten.amax.default", "aten.max.default", doc="max (the first maximal element)")
def _amax(r, node, a, dim=None, keepdim=False):
    return r.reduce("max", r.f(a), dim, keepdim)


@aten("aten.var.correction", "aten.var.dim", needs=("variance",),
      doc="variance (torch's formula, one or several axes)")
def _var(r, node, a, dim=None, *args, correction=None, keepdim=False, unbiased=None):
    if args:                       # var.dim(self, dim, unbiased, keepdim)
        unbiased = args[0]
        keepdim = args[1] if len(args) > 1 else keepdim
    if correction is None:
        correction = 1 if unbiased in (None, True) else 0
    a = r.f(a)
    axes = r.axes(a, dim)
    axis = axes[0] if len(axes) == 1 else tuple(axes)
    return r.tp.variance(a, axis, correction=correction, keepdims=bool(keepdim))


@aten("aten.var_mean.correction", needs=("variance",),
      doc="(variance, mean): as aten.var.correction and aten.mean.dim")
def _var_mean(r, node, a, dim=None, *, correction=None, keepdim=False):
    return (_var(r, node, a, dim, correction=correction, keepdim=keepdim),
            _mean(r, node, a, dim, keepdim))


@aten("aten.cumsum.default", needs=("cumsum",),
      doc="cumsum (the serial running sum from +0.0, as torch's CPU loop)")
def _cumsum(r, node, a, dim, dtype=None):
    return r.tp.cumsum(r.f(a), dim)


@aten("aten.logcumsumexp.default", needs=("logcumsumexp",),
      doc="Tape.logcumsumexp: a chain of logaddexp (the running maximum held constant, so "
          "the gradient is the exact softmax weights; -inf entries stay -inf)")
def _logcumsumexp(r, node, a, dim):
    v = r.f(a)
    return r.tp.logcumsumexp(v, dim % len(v.shape))


@aten("aten.cummax.default", needs=("cummax",),
      doc="(Tape.cummax, -): the running maximum, a tie to the later entry as torch's; the "
          "indices are not recorded")
def _cummax(r, node, a, dim):
    v = r.f(a)
    return (r.tp.cummax(v, dim % len(v.shape)), None)


@aten("aten.cummin.default", needs=("cummin",),
      doc="(Tape.cummin, -): the running minimum, as cummax")
def _cummin(r, node, a, dim):
    v = r.f(a)
    return (r.tp.cummin(v, dim % len(v.shape)), None)


@aten("aten.cumprod.default", needs=("cumprod",),
      doc="cumprod (the running product, one mul a step in ascending order)")
def _cumprod(r, node, a, dim, dtype=None):
    return r.tp.cumprod(r.f(a), dim)


@aten("aten.prod.dim_int", "aten.prod.default", needs=("prod",),
      doc="prod (a mul chain in ascending order along the axis; no axis: of every "
          "element)")
def _prod(r, node, a, dim=None, keepdim=False, dtype=None):
    if not isinstance(dim, int) or isinstance(dim, bool):     # aten.prod.default(a, dtype)
        return r.reshape(r.tp.prod(r.f(a)), r.tshape(node))
    return r.tp.prod(r.f(a), dim, keepdims=bool(keepdim))


@aten("aten.max.dim", doc="(max along the axis, -): the values only (the first maximal "
                          "element); reading the indices is refused")
def _max_dim(r, node, a, dim, keepdim=False):
    a = r.f(a)
    return (r.tp.max(a, axis=dim % len(a.shape), keepdims=bool(keepdim)), None)


@aten("aten.argmax.default", needs=("topk",),
      doc="the ids of Tape.topk(k=1, largest): the first largest entry, a NaN the largest, "
          "as torch's; dim=None: of the flattened input")
def _argmax(r, node, a, dim=None, keepdim=False):
    return _arg_extreme(r, node, a, dim, True)


@aten("aten.argmin.default", needs=("topk",),
      doc="the ids of Tape.topk(k=1, smallest), as argmax")
def _argmin(r, node, a, dim=None, keepdim=False):
    return _arg_extreme(r, node, a, dim, False)


def _arg_extreme(r, node, a, dim, largest):
    v = r.f(a)
    if dim is None:
        v = r.reshape(v, [int(np.prod(v.shape))])
        dim = 0
    axis = dim % len(v.shape)
    _, ids = r.tp.topk(v, 1, axis=axis, largest=largest)
    return r.reshape(ids, r.shape(node))


@aten("aten.topk.default", needs=("topk",),
      doc="(values, indices) from pairwise comparisons (Tape.topk: ties in index order, "
          "a NaN the largest; sorted=False gives them sorted too); values take_along")
def _topk(r, node, a, k, dim=-1, largest=True, sorted=True):
    v = r.f(a)
    return r.tp.topk(v, int(k), axis=dim % len(v.shape), largest=bool(largest))


@aten("aten.sort.default", "aten.sort.stable", needs=("sort",),
      doc="(values, indices) of a stable sort from pairwise comparisons (Tape.sort); a NaN "
          "the largest, as torch's")
def _sort(r, node, a, dim=-1, descending=False, *, stable=None):
    v = r.f(a)
    return r.tp.sort(v, axis=dim % len(v.shape), descending=bool(descending))


def _lower_median(r, v, dim):
    """(value, index) of entry (n - 1) // 2 of the ascending sort along ``dim``, the axis
    kept."""
    dim %= len(v.shape)
    n = v.shape[dim]
    values, ids = r.tp.sort(v, axis=dim)
    return [r.slice_axis(t, dim, (n - 1) // 2, (n - 1) // 2 + 1, 1) for t in (values, ids)]


@aten("aten.median.default", needs=("sort",),
      doc="the lower median of every element (entry (n - 1) // 2 of the ascending sort)")
def _median_all(r, node, a):
    v = r.f(a)
    picked = _lower_median(r, r.reshape(v, [math.prod(v.shape)]), 0)
    return r.reshape(picked[0], r.shape(node))


@aten("aten.median.dim", needs=("sort",),
      doc="(the lower median along dim, its index): entry (n - 1) // 2 of the ascending "
          "sort")
def _median(r, node, a, dim, keepdim=False):
    v = r.f(a)
    dim %= len(v.shape)
    picked = _lower_median(r, v, dim)
    out = [t if keepdim else r.reshape(t, [d for i, d in enumerate(t.shape) if i != dim] or [1])
           for t in picked]
    return tuple(out)


@aten("aten.min.dim", doc="(-max(-a) along the axis, -): the values only")
def _min_dim(r, node, a, dim, keepdim=False):
    a = r.f(a)
    tp = r.tp
    return (tp.neg(tp.max(tp.neg(a), axis=dim % len(a.shape), keepdims=bool(keepdim))), None)


@aten("aten.amin.default", doc="-max(-a) (negation is exact)")
def _amin(r, node, a, dim=None, keepdim=False):
    tp = r.tp
    return tp.neg(r.reduce("max", tp.neg(r.f(a)), dim, keepdim))


@aten("aten.linalg_vector_norm.default", needs=("abs",),
      doc="ord 2: sqrt(sum(a * a)); 1: sum(abs(a)); inf: max(abs(a)); -inf: -max(-abs(a)); "
          "any other p > 0: sum(abs(a) ** p) ** (1 / p) (pows), over the axes; ord <= 0 refused")
def _vector_norm(r, node, a, ord=2, dim=None, keepdim=False, dtype=None):
    a, tp = r.f(a), r.tp
    if ord == 2:
        return tp.sqrt(r.reduce("sum", tp.mul(a, a), dim, keepdim))
    if not is_num(ord) or (ord <= 0 and ord != -math.inf):
        raise Unsupported(f"vector norm of order {ord!r} (orders > 0 and -inf only)")
    m = tp.abs(a)
    if ord == math.inf:
        return r.reduce("max", m, dim, keepdim)
    if ord == -math.inf:
        return tp.neg(r.reduce("max", tp.neg(m), dim, keepdim))
    if ord == 1:
        return r.reduce("sum", m, dim, keepdim)
    return tp.pows(r.reduce("sum", tp.pows(m, float(ord)), dim, keepdim), 1.0 / float(ord))
