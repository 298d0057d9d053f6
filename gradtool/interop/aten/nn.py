"""Softmax, layer norm, matrix products, the bilinear form, distances and losses whose
torch decomposition is not the op."""

from __future__ import annotations

import numpy as np

from ... import nn
from ...composites import distances
from .registry import Unsupported, aten


@aten("aten._softmax.default", doc="softmax")
def _softmax(r, node, a, dim, half_to_float=False):
    return r.tp.softmax(r.f(a), axis=dim)


@aten("aten._log_softmax.default", doc="log_softmax")
def _log_softmax(r, node, a, dim, half_to_float=False):
    return r.tp.log_softmax(r.f(a), axis=dim)


@aten("aten.native_layer_norm.default", needs=("nn.native_layer_norm",),
      doc="gradtool.nn.native_layer_norm: (y, mean, rstd) over the normalized axes")
def _native_layer_norm(r, node, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    w = None if weight is None else r.f(weight)
    b = None if bias is None else r.f(bias)
    return tuple(nn.native_layer_norm(r.f(x), len(normalized_shape), w, b, eps=float(eps)))


# ── matrix products ────────────────────────────────────────────────────────

@aten("aten.mm.default", doc="matmul")
def _mm(r, node, a, b):
    return r.tp.matmul(r.f(a), r.f(b))


@aten("aten.bmm.default", doc="bmm")
def _bmm(r, node, a, b):
    return r.tp.bmm(r.f(a), r.f(b))


def _scaled_sum(r, product, bias, beta, alpha):
    """alpha * product + beta * bias as torch's addmm/baddbmm: a factor of 1 is no node,
    beta 0 ignores bias (a NaN in it too, as BLAS does)."""
    tp = r.tp
    out = product if alpha == 1 else tp.muls(product, float(alpha))
    if beta == 0:
        return out
    return tp.add(out, r.f(bias) if beta == 1 else tp.muls(r.f(bias), float(beta)))


@aten("aten.addmm.default", doc="add(matmul(a, b), bias); alpha and beta as muls")
def _addmm(r, node, bias, a, b, beta=1, alpha=1):
    return _scaled_sum(r, r.tp.matmul(r.f(a), r.f(b)), bias, beta, alpha)


@aten("aten.baddbmm.default", doc="add(bmm(a, b), input); alpha and beta as muls")
def _baddbmm(r, node, bias, a, b, beta=1, alpha=1):
    return _scaled_sum(r, r.tp.bmm(r.f(a), r.f(b)), bias, beta, alpha)


@aten("aten._trilinear.default", needs=("matmul",),
      doc="nn.Bilinear's pattern (x1 [N, I], w [O, I, J], x2 [N, J]): x1 @ w as [I, O*J] "
          "(the matmul's FMA chains over I), times x2 broadcast, summed over J; any other "
          "pattern refused")
def _trilinear(r, node, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    tp = r.tp
    if (list(expand1), list(expand2), list(expand3), list(sumdim)) != \
            ([1, 3], [0], [1, 2], [2, 3]):
        raise Unsupported("a _trilinear other than nn.Bilinear's")
    x1, w, x2 = r.f(i1), r.f(i2), r.f(i3)
    n, (o, i, j) = x1.shape[0], w.shape
    wt = r.reshape(r.permute(w, [1, 0, 2]), [i, o * j])                    # [I, O*J]
    t = r.reshape(tp.matmul(x1, wt), [n, o, j])
    return tp.sum(tp.mul(t, r.reshape(x2, [n, 1, j])), axis=2)


@aten("aten._cdist_forward.default", needs=("abs", "sqrt", "where"),
      doc="p = 2: sqrt of the serial sum of squared differences x1[.., i, None, :] - x2[.., "
          "None, j, :] (the direct form, also where torch uses its matrix-product form); "
          "p = 1: the sum of |differences|; other p refused (composites.distances.cdist)")
def _cdist(r, node, x1, x2, p, compute_mode=None):
    if float(p) not in (1.0, 2.0):
        raise Unsupported(f"cdist with p = {float(p)!r} (p = 1 and 2 only)")
    return distances.cdist(r.f(x1), r.f(x2), float(p))


@aten("aten._pdist_forward.default", needs=("abs", "sqrt", "where", "take"),
      doc="the rows i < j of the row distances (cdist of x with itself, p = 1 or 2), "
          "picked in torch's order by take (composites.distances.pdist)")
def _pdist(r, node, x, p=2.0):
    if float(p) not in (1.0, 2.0):
        raise Unsupported(f"pdist with p = {float(p)!r} (p = 1 and 2 only)")
    return distances.pdist(r.f(x), float(p))


# ── losses whose torch decomposition is not the op ────────────────────────

@aten("aten.multilabel_margin_loss.default",
      needs=("cummax", "take_along", "where", "logical_and", "logical_not", "relu"),
      doc="kept out of run_decompositions (torch 2.13's decomposition counts the entries "
          "after the -1 end marker as targets: another loss). Per sample: valid = the "
          "targets before the first -1 (1 - cummax(t < 0)); z[j, i] = (1 - x[t_j]) + x[i], "
          "relu(z) summed over (j, i) row-major where j is valid and i not a target, / C; "
          "then the reduction")
def _multilabel_margin(r, node, x, target, reduction=1):
    tp = r.tp
    x = r.f(x)
    if len(x.shape) not in (1, 2):
        raise Unsupported(f"an input of rank {len(x.shape)} (torch takes [C] or [N, C])")
    n, c = (1, x.shape[0]) if len(x.shape) == 1 else tuple(x.shape)
    x = r.reshape(x, [n, c])
    t = r.reshape(r.value(r.ids(target)), [n, c])                           # exact integers
    valid = tp.logical_not(tp.cummax(tp.lt(t, r.f(0.0)), axis=1))          # [n, c(j)]
    xt = tp.take_along(x, tp.where(valid, t, r.ids(0)), axis=1)              # x[t_j]
    cols = tp.const(np.arange(c, dtype=np.float64).reshape(1, 1, c))
    valid3 = r.reshape(valid, [n, c, 1])
    hits = tp.logical_and(tp.eq(r.reshape(t, [n, c, 1]), cols), valid3)     # [n, j, i]
    is_target = r.reshape(tp.max(hits, axis=1), [n, 1, c])
    z = tp.add(tp.adds(tp.neg(r.reshape(xt, [n, c, 1])), 1.0), r.reshape(x, [n, 1, c]))
    keep = tp.logical_and(valid3, tp.logical_not(is_target))
    terms = tp.where(keep, tp.relu(z), r.f(0.0))
    per = tp.div(tp.sum(terms, axis=(1, 2)), r.f(float(c)))                # [n]
    if reduction == 1:
        return tp.mean(per)
    if reduction == 2:
        return tp.sum(per)
    return r.reshape(per, r.shape(node))
