"""scaled_dot_product_attention, where torch's own decomposition fails and the op is kept."""

from __future__ import annotations

import math

import numpy as np

from .random import dropout_of
from .registry import Unsupported, aten


@aten("aten.scaled_dot_product_attention.default",
      needs=("bmm", "softmax", "where", "logical_not", "nn.dropout"),
      doc="(only where torch's own decomposition of the program fails and the op is kept, "
          "RETRY_UNDECOMPOSED) as torch's math kernel: q and k each times sqrt(scale), bmm, "
          "the mask added (a bool mask or is_causal as 0/-inf), softmax, rows masked "
          "whole give 0, nn.dropout of the weights (dropout_p > 0), bmm with v")
def _sdpa(r, node, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    tp = r.tp
    qs, ks, vs = (list(r.tshape(a)) for a in node.args[:3])
    if min(len(qs), len(ks), len(vs)) < 2:
        raise Unsupported("attention of 1-dim tensors")
    qv, kv, vv = r.f(q), r.f(k), r.f(v)
    if len(qs) >= 3 and ks[-3] != qs[-3] and ks[-3] and qs[-3] % ks[-3] == 0:
        rep = qs[-3] // ks[-3]       # grouped-query attention: each k/v head rep times
        kv = tp.repeat_interleave(kv, rep, len(ks) - 3)
        vv = tp.repeat_interleave(vv, rep, len(vs) - 3)
        ks[-3], vs[-3] = qs[-3], qs[-3]
    batch, (n_l, e), n_s, ev = qs[:-2], qs[-2:], ks[-2], vs[-1]
    if ks[:-2] != batch or vs[:-2] != batch or ks[-1] != e:
        raise Unsupported("attention whose q, k, v batch dims differ (broadcast)")
    nb = math.prod(batch)
    factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(e))
    q3 = r.reshape(tp.muls(qv, factor), [nb, n_l, e])
    k3 = r.permute(r.reshape(tp.muls(kv, factor), [nb, n_s, e]), [0, 2, 1])
    att = tp.bmm(q3, k3)                                           # [nb, L, S]
    masked = is_causal or attn_mask is not None
    if is_causal:
        bias = np.where(np.tril(np.ones((n_l, n_s), dtype=bool)), 0.0, -math.inf)
        att = tp.add(att, r.expand(tp.const(bias.reshape(1, n_l, n_s)), [nb, n_l, n_s]))
    if attn_mask is not None:
        mshape = list(r.tshape(node.args[3]))
        full = batch + [n_l, n_s]
        if r.torch_dtype(node.args[3]) == "bool":
            bias = tp.where(r.mask(attn_mask), r.f(0.0), r.f(-math.inf))
        else:
            bias = r.f(attn_mask)
        bias = r.reshape(bias, [1] * (len(full) - len(mshape)) + mshape)
        att = tp.add(att, r.reshape(r.expand(bias, full), [nb, n_l, n_s]))
    if masked:                       # torch's _safe_softmax: a row masked whole gives 0
        live = r.expand(r.reduce("max", tp.logical_not(tp.eq(att, r.f(-math.inf))), [2],
                                 True), [nb, n_l, n_s])
        # (its softmax taken of zeros, not of -infs: no NaN, in the value or the gradient)
        w = tp.where(live, tp.softmax(tp.where(live, att, r.f(0.0)), axis=2), r.f(0.0))
    else:
        w = tp.softmax(att, axis=2)
    if dropout_p:
        w = dropout_of(r, w, dropout_p, True)
    out = tp.bmm(w, r.reshape(vv, [nb, n_s, ev]))
    return r.reshape(out, batch + [n_l, ev])
