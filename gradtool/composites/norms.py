"""Normalisation: ``rms_norm``, ``layer_norm``, ``native_layer_norm`` (with torch's
statistics), ``group_norm`` and batch norm (``batch_norm2d`` eval mode, ``batch_norm2d_train``
with the running statistics' update)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import TapeError
from ..tape import GVar
from ._args import tape_of

__all__ = ["rms_norm", "layer_norm", "native_layer_norm", "group_norm", "batch_norm2d",
           "batch_norm2d_train"]


def rms_norm(x: GVar, gain: GVar = None, eps: float = 1e-6) -> GVar:
    """RMSNorm over the last axis: ``x / sqrt(mean(x * x) + eps) * gain``.

    The mean is the axis mean (serial sum / n), then one ``adds``, one
    ``sqrt``, one broadcast ``div``, and the gain (optional, [dim]) multiplies
    last.  (PyTorch's ``x * rsqrt(...)`` rounds differently: within 1e-15.)
    """
    tp = tape_of(x, "rms_norm")
    ms = tp.mean(tp.mul(x, x), axis=-1, keepdims=True)
    y = tp.div(x, tp.sqrt(tp.adds(ms, eps)))
    return y if gain is None else tp.mul(y, gain)


def layer_norm(x: GVar, gain: GVar = None, bias: GVar = None, eps: float = 1e-5) -> GVar:
    """LayerNorm over the last axis: ``(x - mu) / sqrt(var + eps) * gain + bias``.

    mu = mean(x), var = mean((x - mu)^2) (the biased variance, as PyTorch's
    layer_norm), both axis means; gain and bias ([dim]) are optional.
    """
    tp = tape_of(x, "layer_norm")
    d = tp.sub(x, tp.mean(x, axis=-1, keepdims=True))
    var = tp.mean(tp.mul(d, d), axis=-1, keepdims=True)
    y = tp.div(d, tp.sqrt(tp.adds(var, eps)))
    if gain is not None:
        y = tp.mul(y, gain)
    return y if bias is None else tp.add(y, bias)


def native_layer_norm(x: GVar, normalized_ndim: int = 1, gain: GVar = None, bias: GVar = None,
                      eps: float = 1e-5) -> tuple:
    """LayerNorm over the last ``normalized_ndim`` axes, with the statistics that
    ``torch.native_layer_norm`` returns: ``(y, mean, rstd)``, mean and rstd shaped like
    x with those axes kept as size 1.

    mean is the (multi-axis) mean, var the mean of ``(x - mean)^2``, ``y = (x - mean) /
    sqrt(var + eps)`` then the gain and bias: over one axis these are exactly the nodes
    of :func:`layer_norm`, so y has its bits.  rstd is ``1.0 / sqrt(var + eps)``,
    recorded only for a caller that reads it (torch's y multiplies by rstd instead of
    dividing: within 1e-15).
    """
    tp = tape_of(x, "native_layer_norm")
    rank = len(x.shape)
    if isinstance(normalized_ndim, bool) or not isinstance(normalized_ndim, int) or \
            not 1 <= normalized_ndim <= rank:
        raise TapeError(f"nn.native_layer_norm: normalized_ndim must be an int in [1, {rank}], "
                        f"got {normalized_ndim!r}"[:200])
    axes = -1 if normalized_ndim == 1 else tuple(range(rank - normalized_ndim, rank))
    mean = tp.mean(x, axis=axes, keepdims=True)
    d = tp.sub(x, mean)
    den = tp.sqrt(tp.adds(tp.mean(tp.mul(d, d), axis=axes, keepdims=True), eps))
    y = tp.div(d, den)
    if gain is not None:
        y = tp.mul(y, gain)
    if bias is not None:
        y = tp.add(y, bias)
    return y, mean, tp.div(tp.const_like(den, np.ones((1,))), den)


def group_norm(x: GVar, num_groups: int, weight: GVar = None, bias: GVar = None,
               eps: float = 1e-5) -> GVar:
    """torch's ``group_norm``: x [N, C, *] normalised over each group of C / num_groups
    channels and every spatial position (the biased variance), then the per-channel
    weight and bias ([C], optional).

    x reshaped to [N, G, C/G * rest] and :func:`native_layer_norm` over the last axis
    (no gain), reshaped back, times weight and plus bias reshaped to [C, 1, ...].
    """
    tp = tape_of(x, "group_norm")
    if len(x.shape) < 2:
        raise TapeError(f"nn.group_norm: expected x [N, C, ...], got {list(x.shape)}")
    n, c = x.shape[:2]
    g = num_groups
    if isinstance(g, bool) or not isinstance(g, int) or g < 1 or c % g:
        raise TapeError(f"nn.group_norm: num_groups={g!r} must divide the {c} channels")
    for v in (weight, bias):
        if v is not None and list(v.shape) != [c]:
            raise TapeError(f"nn.group_norm: weight and bias must be [{c}], got "
                            f"{list(v.shape)}")
    y, _, _ = native_layer_norm(tp.reshape(x, [n, g, math.prod(x.shape) // (n * g)]), 1,
                                eps=eps)
    y = tp.reshape(y, list(x.shape))
    per_channel = [c] + [1] * (len(x.shape) - 2)
    if weight is not None:
        y = tp.mul(y, tp.reshape(weight, per_channel))
    return y if bias is None else tp.add(y, tp.reshape(bias, per_channel))


# ── batch norm (NCHW, per channel) ──────────────────────────────────────────
#
# Both modes are torch's CPU formula, as recorded elementwise ops:
#     invstd = 1 / sqrt(var + eps);  alpha = invstd * weight;  beta = bias - mean * alpha
#     y = x * alpha + beta            (alpha, beta [C] reshaped to [C, 1, 1])
# Eval mode reads mean and var from the running statistics (consts); train mode
# computes them over (n, h, w): x as [N*H*W, C] (reshape, transpose, reshape), mean =
# the serial axis sum / count, var = the same of (x - mean)^2 (biased), and the
# gradient flows through both, as torch's.  The running statistics' update (torch's
# momentum rule, the unbiased variance) is returned as two nodes; name them as outputs
# and the running consts as state (``save(..., state={"bn.running_mean": "bn.mean"})``)
# and ``gradtool train`` replaces the consts by them after every step (docs/training.md,
# "Training state").


def _channel_vector(tp, v, what):
    if v is not None and (len(v.shape) != 1):
        raise TapeError(f"nn.{what}: expected a [C] vector, got shape {list(v.shape)}")
    return v


def _normalize(tp, x, mean, var, weight, bias, eps):
    c = x.shape[1]
    invstd = tp.div(tp.const_like(var, np.ones(1)), tp.sqrt(tp.adds(var, eps)))
    alpha = invstd if weight is None else tp.mul(invstd, weight)
    shift = tp.mul(mean, alpha)
    beta = tp.neg(shift) if bias is None else tp.sub(bias, shift)
    return tp.add(tp.mul(x, tp.reshape(alpha, [c, 1, 1])), tp.reshape(beta, [c, 1, 1]))


def batch_norm2d(x: GVar, weight: GVar = None, bias: GVar = None, running_mean: GVar = None,
                 running_var: GVar = None, eps: float = 1e-5) -> GVar:
    """torch's ``batch_norm`` in eval mode: x [N, C, H, W] normalised by the running
    statistics (consts [C]); weight and bias ([C]) optional."""
    tp = tape_of(x, "batch_norm2d")
    if running_mean is None or running_var is None:
        raise TapeError("nn.batch_norm2d: eval mode needs running_mean and running_var")
    for v in (weight, bias, running_mean, running_var):
        _channel_vector(tp, v, "batch_norm2d")
    return _normalize(tp, x, running_mean, running_var, weight, bias, eps)


def batch_norm2d_train(x: GVar, weight: GVar = None, bias: GVar = None,
                       running_mean: GVar = None, running_var: GVar = None,
                       momentum: float = 0.1, eps: float = 1e-5) -> tuple:
    """torch's ``batch_norm`` in train mode: (y, new running mean, new running var).

    The batch statistics over (n, h, w) normalise x (differentiable); with running
    statistics given, the two further nodes are torch's update
    ``momentum * batch_mean + (1 - momentum) * running_mean`` and the same with the
    unbiased batch variance (sum of squares / (count - 1)); else they are None.
    """
    tp = tape_of(x, "batch_norm2d_train")
    for v in (weight, bias, running_mean, running_var):
        _channel_vector(tp, v, "batch_norm2d_train")
    n, c, h, w = x.shape
    count = n * h * w
    rows = tp.reshape(tp.transpose(tp.reshape(x, [n, c, h * w])), [count, c])
    mean = tp.mean(rows, axis=0)                                   # [C]
    d = tp.sub(rows, mean)
    sq = tp.sum(tp.mul(d, d), axis=0)                              # [C]
    var = tp.div(sq, tp.const_like(sq, np.full(1, float(count))))  # the biased variance
    y = _normalize(tp, x, mean, var, weight, bias, eps)
    if running_mean is None or running_var is None:
        return y, None, None
    if count < 2:
        raise TapeError("nn.batch_norm2d_train: the unbiased variance needs more than one "
                        "value per channel")
    unbiased = tp.div(sq, tp.const_like(sq, np.full(1, float(count - 1))))
    keep = 1.0 - momentum
    new_mean = tp.add(tp.muls(mean, momentum), tp.muls(running_mean, keep))
    new_var = tp.add(tp.muls(unbiased, momentum), tp.muls(running_var, keep))
    return y, new_mean, new_var
