"""The table's matrix products: matmul and bmm, the FMA chain of numerics.matmul."""

from __future__ import annotations

import numpy as np

from .. import numerics as nx
from .spec import OpSpec, _register, kernel
from .shapes import _bmm_shape, _matmul_shape


# ── the table: matrix products ─────────────────────────────────────────────

kernel("k_matmul", "c:w a:r b:r batch:i m:i k:i n:i sab:i sai:i sak:i sbb:i sbk:i sbj:i "
       "acc:i",
       "C[bt] (=|+=) A[bt] @ B[bt] with arbitrary strides, every element the FMA chain "
       "over k ascending from +0.0 (numerics.matmul)")


def _matmul_f(a, b, s, at):
    return nx.matmul(a, b)


def _matmul_b(g, a, b, t, s, at, na, nb):
    # dA = G @ B^T (serial over N), dB = A^T @ G (serial over M)
    return (nx.matmul(g, b.T) if na else None, nx.matmul(a.T, g) if nb else None)


def _batched(a, b):
    """a and b with a batch of 1 stretched to the other's batch (read-only views)."""
    bt = max(a.shape[0], b.shape[0])
    return np.broadcast_to(a, (bt,) + a.shape[1:]), np.broadcast_to(b, (bt,) + b.shape[1:])


def _bmm_f(a, b, s, at):
    return nx.bmm(*_batched(a, b))


def _batch_sum(p, shape):
    """A stretched side's gradient: the per-batch products summed over the batch
    (serial, from 0.0, batch ascending); a side that was not stretched keeps its own."""
    return nx.serial_sum_axis(p, 0) if p.shape[0] != shape[0] else p


def _bmm_b(g, a, b, t, s, at, na, nb):
    # dA[bt] = G[bt] @ B[bt]^T (serial over N), dB[bt] = A[bt]^T @ G[bt] (serial over M)
    wa, wb = _batched(a, b)
    return (_batch_sum(nx.bmm(g, np.swapaxes(wb, 1, 2)), a.shape) if na else None,
            _batch_sum(nx.bmm(np.swapaxes(wa, 1, 2), g), b.shape) if nb else None)


# fresh_grads: each contribution is a new array from an FMA chain started at +0.0
# (or a serial sum from 0.0 of such arrays), which never holds -0.0, so the backward
# walk keeps a first contribution as it is: 0.0 + c, its usual copy, would be c bit
# for bit (tape.Tape._accumulate).
_register(OpSpec("matmul", "matmul", 2, "[M,K] @ [K,N], serial over K", _matmul_shape,
                 _matmul_f, _matmul_b, kernels=("k_matmul",), fresh_grads=True))
_register(OpSpec("bmm", "bmm", 2, "[B,M,K] @ [B,K,N], the matmul order per batch; a batch of "
                 "1 on either side stretches, and its gradient is the batch's serial sum",
                 _bmm_shape, _bmm_f, _bmm_b, kernels=("k_matmul", "k_sum"), fresh_grads=True))
