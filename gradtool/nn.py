"""Building blocks of models, recorded from the op table's ops.

Each function records its computation on the tape of its first argument as
ordinary nodes (no node type of its own), so everything a tape does -- save,
load, backward, fd-check, device replay -- works on them unchanged, and the
exact sequence of roundings is the sequence of recorded ops spelled out
below.  Arguments are :class:`~gradtool.tape.GVar` handles; weights are
params or consts the caller records (``tp.param(...)``), numbers are Python
floats.  ``tests/test_nn.py`` compares every function with PyTorch float64.

    import gradtool as gt
    from gradtool import nn
    tp = gt.Tape()
    x = tp.const(batch, name="x")                     # [N, 16]
    ids = tp.const(labels[:, None], name="y", dtype="i64")   # [N, 1]
    h = nn.gelu(nn.linear(x, tp.param(w1), tp.param(b1)))
    loss = nn.softmax_cross_entropy(nn.linear(h, tp.param(w2)), ids)
"""

from __future__ import annotations

import math

import numpy as np

from .errors import TapeError
from .tape import GVar

__all__ = ["linear", "rms_norm", "layer_norm", "native_layer_norm", "silu", "gelu",
           "softmax_cross_entropy", "mse", "conv2d", "conv1d", "max_pool2d", "avg_pool2d",
           "global_avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d",
           "upsample_bilinear2d", "conv_transpose2d", "conv_transpose1d", "conv3d",
           "conv_transpose3d", "grid_sample", "feature_dropout", "alpha_dropout", "bernoulli",
           "normal", "rand", "randint", "randperm", "multinomial",
           "max_pool3d", "avg_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool3d",
           "group_norm", "batch_norm2d", "batch_norm2d_train", "rng_slot", "dropout"]

GELU_C = math.sqrt(2.0 / math.pi)     # the tanh form's constant, rounded once
GELU_K = 0.044715
SQRT1_2 = float.fromhex("0x1.6a09e667f3bcdp-1")   # 1/sqrt(2) rounded once (M_SQRT1_2)


def _tape(x, what: str):
    if not isinstance(x, GVar):
        raise TapeError(f"nn.{what}: expected a GVar, got {type(x).__name__}")
    return x.tape


def linear(x: GVar, w: GVar, b: GVar = None) -> GVar:
    """``x @ w + b``: x [N, in] or [B, T, in], w [in, out], b [out] (optional).

    A 3-dim x multiplies every batch by the same w, recorded as a broadcast
    ``bmm`` with w reshaped to [1, in, out], whose gradient sums the batches
    serially.  b broadcasts over the rows (numpy rules).
    """
    tp = _tape(x, "linear")
    y = tp.bmm(x, tp.reshape(w, [1, *w.shape])) if len(x.shape) == 3 else tp.matmul(x, w)
    return y if b is None else tp.add(y, b)


def rms_norm(x: GVar, gain: GVar = None, eps: float = 1e-6) -> GVar:
    """RMSNorm over the last axis: ``x / sqrt(mean(x * x) + eps) * gain``.

    The mean is the axis mean (serial sum / n), then one ``adds``, one
    ``sqrt``, one broadcast ``div``, and the gain (optional, [dim]) multiplies
    last.  (PyTorch's ``x * rsqrt(...)`` rounds differently: within 1e-15.)
    """
    tp = _tape(x, "rms_norm")
    ms = tp.mean(tp.mul(x, x), axis=-1, keepdims=True)
    y = tp.div(x, tp.sqrt(tp.adds(ms, eps)))
    return y if gain is None else tp.mul(y, gain)


def layer_norm(x: GVar, gain: GVar = None, bias: GVar = None, eps: float = 1e-5) -> GVar:
    """LayerNorm over the last axis: ``(x - mu) / sqrt(var + eps) * gain + bias``.

    mu = mean(x), var = mean((x - mu)^2) (the biased variance, as PyTorch's
    layer_norm), both axis means; gain and bias ([dim]) are optional.
    """
    tp = _tape(x, "layer_norm")
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
    tp = _tape(x, "native_layer_norm")
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


def silu(x: GVar) -> GVar:
    """SiLU (swish): ``x * sigmoid(x)``."""
    tp = _tape(x, "silu")
    return tp.mul(x, tp.sigmoid(x))


def gelu(x: GVar, approximate: str = "none") -> GVar:
    """GELU, PyTorch's ``F.gelu`` (same default, same two forms).

    ``approximate="none"`` (exact): ``x * 0.5 * (1 + erf(x * M_SQRT1_2))``, recorded in
    PyTorch's CPU order as ``(x * 0.5) * (erf(x * SQRT1_2) + 1.0)`` with SQRT1_2 =
    1/sqrt(2) rounded once; erf is the libm-free fdlibm port (within 1 ulp).

    ``approximate="tanh"``: ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``,
    recorded as ``((x * (tanh((x + (x*x*x) * 0.044715) * c) + 1.0)) * 0.5)`` with
    c = sqrt(2/pi) rounded once.
    """
    tp = _tape(x, "gelu")
    if approximate == "none":
        return tp.mul(tp.muls(x, 0.5), tp.adds(tp.erf(tp.muls(x, SQRT1_2)), 1.0))
    if approximate != "tanh":
        raise TapeError(f"nn.gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    cube = tp.mul(tp.mul(x, x), x)
    inner = tp.add(x, tp.muls(cube, GELU_K))
    return tp.muls(tp.mul(x, tp.adds(tp.tanh(tp.muls(inner, GELU_C)), 1.0)), 0.5)


def rng_slot(tp) -> GVar:
    """The tape's one rng slot (``Tape.rng()``): the [3] const ``gradtool.rng`` holding
    (step, shard, train flag), recorded as [0, 0, 1] on first use."""
    return tp.rng()


def _salt(tp, salt, what: str) -> int:
    """``salt`` (an int in [0, 2^63)) checked, or by default :func:`_next_salt`."""
    if salt is None:
        return _next_salt(tp)
    if isinstance(salt, bool) or not isinstance(salt, (int, np.integer)) or \
            not 0 <= int(salt) < 2 ** 63:
        raise TapeError(f"nn.{what}: salt must be an integer in [0, 2^63), got {salt!r}"[:200])
    return int(salt)


def _next_salt(tp) -> int:
    """One more than the largest salt of the tape's uniform nodes (0 for the first): each
    dropout of a tape draws its own numbers, on a loaded tape too."""
    salts = [n.aux["salt"] for n in tp.nodes if n.op == "uniform"]
    return max(salts) + 1 if salts else 0


def dropout(x: GVar, p: float, salt: int = None) -> GVar:
    """Train-mode dropout that gives the same bits on every backend and any number of ranks.

    Recorded from the table's ops, reading the tape's rng slot r = (step, shard, flag)
    (:func:`rng_slot`)::

        u    = uniform(r, shape=x.shape, salt)     # counter-based, in [0, 1)
        keep = ge(u, p)                            # 1.0 with probability 1 - p
        on   = where(keep, x * (1/(1-p)), 0.0)     # 1/(1-p) rounded once; dropped: +0.0
        y    = where(r[2:3], on, x)                # the flag: 1 trains, 0 gives x

    With the flag 0 (``gradtool train``'s validation, ``torch``'s eval()) y is x bit for
    bit (``where`` copies exactly).  ``p == 0`` returns x itself (nothing recorded);
    ``p == 1`` records ``where(flag, 0.0, x)``: zeros, never a NaN.  The gradient is
    ``g * (1/(1-p))`` where kept and +0.0 where dropped when the flag is on, ``g`` when
    it is off; none reaches the rng slot.  ``salt`` (an int >= 0) picks the stream; by
    default one more than the tape's largest so far, so every dropout of a tape draws
    its own numbers.  Which elements a step drops depends only on (salt, step, shard,
    element index): ``numerics``, "The counter-based generator"; docs/training.md says
    what ``gradtool train`` puts in the slot.
    """
    return _dropout(x, p, salt, "dropout")


def feature_dropout(x: GVar, p: float, salt: int = None) -> GVar:
    """Train-mode channel dropout (torch's ``dropout1d``/``2d``/``3d``, ``feature_dropout``):
    as :func:`dropout`, but one draw per (sample, channel) -- ``uniform`` of shape [N, C,
    1, ...] broadcast over the rest of x [N, C, ...] -- so a channel is kept or dropped
    whole.  The flag 0 gives x bit for bit."""
    return _dropout(x, p, salt, "feature_dropout", channels=True)


ALPHA_SELU = 1.7580993408473766      # torch's alpha_dropout constant (SELU's -scale*alpha)


def bernoulli(p, shape=None, salt: int = None, tape=None) -> GVar:
    """Bernoulli draws over the tape's rng slot (torch's ``bernoulli``): 1.0 where
    ``uniform < p``, else 0.0, with probability ``p`` (a number in [0, 1], with ``shape``
    and ``tape``; or a GVar of probabilities, its shape the draws'), no gradient (as
    torch's).  With the slot's train flag 0 (validation) each draw is its mean ``p`` (held
    constant: ``detach``), so the inverted-dropout pattern ``x * mask / p`` (stochastic
    depth, DropPath) gives x there, as torch's eval() skips the draw."""
    if isinstance(p, GVar):
        tp = _tape(p, "bernoulli")
    else:
        tp = tape
        if tp is None or shape is None:
            raise TapeError("nn.bernoulli: a number p needs shape= and tape=")
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) \
                or not 0.0 <= float(p) <= 1.0:
            raise TapeError(f"nn.bernoulli: p must be a number in [0, 1] or a GVar, got "
                            f"{p!r}"[:200])
    salt = _salt(tp, salt, "bernoulli")               # checked before anything is recorded
    if isinstance(p, GVar):
        shape, probs = list(p.shape), tp.detach(p)
    else:
        shape, probs = [int(d) for d in shape], tp.const(np.array([float(p)]))
    rng = tp.rng()
    u = tp.uniform(rng, shape=shape, salt=salt)
    draws = tp.lt(u, probs)
    return tp.where(tp.slice(rng, [2], [3]), draws, tp.expand(probs, shape))


TWO_PI = 2.0 * math.pi                # rounded once


def normal(shape, tape, salt: int = None) -> GVar:
    """Standard normal draws over the tape's rng slot (torch's ``randn``): Box-Muller on
    one ``uniform`` of shape [2, *shape], ``z = sqrt(-2 * log(1 - u1)) * cos(2pi * u2)``
    (``1 - u1`` is exact and in (0, 1], so no draw is infinite; log, sqrt and cos are
    the table's libm-free ones, so every backend gives the same bits); no gradient.  With
    the slot's train flag 0 (validation) each draw is its mean, +0.0: a VAE's sample is
    its mean there."""
    tp, shape = _draw_args(tape, shape, "normal")
    salt = _salt(tp, salt, "normal")
    rng = tp.rng()
    u = tp.uniform(rng, shape=[2] + shape, salt=salt)
    lo, hi = [0] * (len(shape) + 1), [1] + shape
    u1 = tp.reshape(tp.slice(u, lo, hi), shape)
    u2 = tp.reshape(tp.slice(u, [1] + lo[1:], [2] + shape), shape)
    radius = tp.sqrt(tp.muls(tp.log(tp.sub(tp.const(np.ones(1)), u1)), -2.0))
    z = tp.mul(radius, tp.cos(tp.muls(u2, TWO_PI)))
    return tp.where(tp.slice(rng, [2], [3]), z, 0.0)


def _draw_args(tape, shape, what: str):
    """(tape, shape as a list of ints >= 1) of a draw, checked before anything is recorded."""
    if tape is None or not hasattr(tape, "rng"):
        raise TapeError(f"nn.{what}: tape= must be a gradtool Tape")
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1
            for d in shape):
        raise TapeError(f"nn.{what}: shape must be a list of ints >= 1, got {shape!r}"[:200])
    return tape, [int(d) for d in shape]


def _number(v, what: str, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or \
            not math.isfinite(float(v)):
        raise TapeError(f"nn.{what}: {name} must be a finite number, got {v!r}"[:200])
    return float(v)


def rand(shape, tape, low: float = 0.0, high: float = 1.0, salt: int = None) -> GVar:
    """Uniform draws in [low, high) over the tape's rng slot (torch's ``rand``,
    ``rand_like`` and ``uniform_``): the ``uniform`` op itself for [0, 1), else
    ``u * (high - low) + low`` (torch's order: the width rounded once, then a product and
    a sum, each rounded); no gradient.  With the slot's train flag 0 (validation) each draw
    is its mean, ``low/2 + high/2`` (0.5 for rand), as :func:`normal`'s is."""
    tp, shape = _draw_args(tape, shape, "rand")
    low, high = _number(low, "rand", "low"), _number(high, "rand", "high")
    if not low <= high or not math.isfinite(high - low):
        raise TapeError(f"nn.rand: expected low <= high with a finite width, got [{low!r}, "
                        f"{high!r})")
    salt = _salt(tp, salt, "rand")
    rng = tp.rng()
    u = tp.uniform(rng, shape=shape, salt=salt)
    if (low, high) != (0.0, 1.0):
        u = tp.adds(tp.muls(u, high - low), low)
    return tp.where(tp.slice(rng, [2], [3]), u, low * 0.5 + high * 0.5)


def randint(low: int, high: int, shape, tape, salt: int = None) -> GVar:
    """Integer draws in [low, high), each with probability 1/(high - low), over the tape's
    rng slot (torch's ``randint``): ``floor(u * n) + low`` with n = high - low, integer-
    valued, so they may serve as ids (a diffusion model's timesteps: ``take`` of a noise
    schedule).  ``u * n`` is below n for every u < 1 (u is a multiple of 2^-53, so the
    product falls more than half an ulp short of n), so each of the n values is drawn by
    floor(2^53 / n) or one more of the 2^53 possible u.  With the slot's train flag 0
    (validation) each draw is the middle value ``low + (n - 1) // 2`` (the lower one of
    two): the mean where it is a whole number."""
    tp, shape = _draw_args(tape, shape, "randint")
    for name, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or \
                not -2 ** 53 <= int(v) <= 2 ** 53:
            raise TapeError(f"nn.randint: {name} must be an integer in [-2^53, 2^53], got "
                            f"{v!r}"[:200])
    low, high = int(low), int(high)
    if not 0 < high - low <= 2 ** 53:
        raise TapeError(f"nn.randint: expected low < high <= low + 2^53, got [{low}, {high})")
    salt = _salt(tp, salt, "randint")
    rng = tp.rng()
    ids = tp.floor(tp.muls(tp.uniform(rng, shape=shape, salt=salt), float(high - low)))
    if low:
        ids = tp.adds(ids, float(low))                  # exact: |ids| <= 2^53
    return tp.where(tp.slice(rng, [2], [3]), ids, low + (high - low - 1) // 2)


def randperm(n: int, tape, salt: int = None) -> GVar:
    """A random permutation of 0 .. n-1 over the tape's rng slot (torch's ``randperm``):
    the ids that sort one ``uniform`` draw of shape [n] (``Tape.sort``, stable: equal
    draws, about n^2 / 2^54 likely, keep their order), integer-valued; the cost is n x n
    comparisons (the sort's limit applies).  With the slot's train flag 0 (validation) it
    is the identity 0 .. n-1: a batch mixed with itself (mixup) is the batch."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise TapeError(f"nn.randperm: n must be an integer >= 1, got {n!r}"[:200])
    tp, _ = _draw_args(tape, [int(n)], "randperm")
    salt = _salt(tp, salt, "randperm")
    rng = tp.rng()
    _, ids = tp.sort(tp.uniform(rng, shape=[int(n)], salt=salt))
    return tp.where(tp.slice(rng, [2], [3]), ids,
                    tp.const(np.arange(int(n), dtype=np.int64), dtype="i64"))


def multinomial(weights: GVar, num_samples: int = 1, replacement: bool = False,
                salt: int = None) -> GVar:
    """Category draws over the tape's rng slot (torch's ``multinomial``, and
    ``Categorical.sample``): ids [..., num_samples] into the last axis of ``weights``
    (non-negative, each row's sum positive: probabilities or not), integer-valued; no
    gradient.  By the inverse CDF: ``c = cumsum(w)`` along the categories, ``t = u *
    c[last]`` with one ``uniform`` per draw, and the id is how many entries of c are <= t,
    so category j is drawn for t in [c[j-1], c[j]): with probability w[j] / sum(w), never
    where w[j] is 0 (t < c[last] for every u < 1).  Without replacement only one sample
    per row (more is refused).  A row with a negative, NaN or infinite weight, or a sum of
    0, gives NaN ids, which any gather refuses as torch refuses the row.  With the slot's
    train flag 0 (validation) every draw is the row's most likely category (the first of
    equal ones): a policy acts greedily there."""
    tp = _tape(weights, "multinomial")
    shape = list(weights.shape)
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) \
            or num_samples < 1:
        raise TapeError(f"nn.multinomial: num_samples must be an integer >= 1, got "
                        f"{num_samples!r}"[:200])
    if not isinstance(replacement, (bool, np.bool_)):
        raise TapeError(f"nn.multinomial: replacement must be True or False, got "
                        f"{replacement!r}"[:200])
    if not replacement and num_samples > 1:
        raise TapeError("nn.multinomial: more than one sample per row needs replacement=True "
                        "(without replacement gradtool draws one)")
    if not shape:
        raise TapeError("nn.multinomial: weights must have at least one axis (categories)")
    salt = _salt(tp, salt, "multinomial")
    k, last = int(num_samples), len(shape) - 1
    w = tp.detach(weights)
    c = tp.cumsum(w, axis=last)                                    # [..., C]
    total = tp.slice(c, [0] * last + [shape[last] - 1], shape)      # [..., 1]
    rng = tp.rng()
    t = tp.mul(tp.uniform(rng, shape=shape[:last] + [k], salt=salt), total)   # [..., k]
    below = tp.le(tp.unsqueeze(c, last), tp.unsqueeze(t, last + 1))  # [..., k, C]
    ids = tp.sum(below, axis=last + 1)                             # [..., k]
    lowest = tp.neg(tp.max(tp.neg(w), axis=last, keepdims=True))  # a NaN wins max: bad
    fine = tp.logical_and(tp.ge(lowest, 0.0), tp.logical_and(
        tp.gt(total, 0.0), tp.lt(total, float("inf"))))           # [..., 1]
    ids = tp.floor(tp.where(fine, ids, float("nan")))             # still integer-valued
    _, mode = tp.topk(w, 1, axis=last)                              # [..., 1]
    return tp.where(tp.slice(rng, [2], [3]), ids, tp.expand(mode, shape[:last] + [k]))


def alpha_dropout(x: GVar, p: float, salt: int = None, channels: bool = False) -> GVar:
    """Train-mode alpha dropout (torch's ``alpha_dropout``, SELU networks' dropout; with
    ``channels`` its ``feature_alpha_dropout``): where kept ``x * a + a*alpha*p``, where
    dropped ``-a*alpha + a*alpha*p``, with ``a = 1 / sqrt((alpha^2 * p + 1) * (1 - p))``
    and torch's alpha, the constants in torch's order, rounded once each; the flag 0
    gives x bit for bit, and the gradient is ``g * a`` where kept, +0.0 where dropped."""
    return _dropout(x, p, salt, "feature_alpha_dropout" if channels else "alpha_dropout",
                    channels=channels, alpha=True)


def _dropout(x, p, salt, what, channels=False, alpha=False):
    tp = _tape(x, what)
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TapeError(f"nn.{what}: p must be a number in [0, 1], got {type(p).__name__}")
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise TapeError(f"nn.{what}: p must lie in [0, 1], got {p!r}")
    i = tp.node_id(x, f"nn.{what} input")
    if tp.holds_ids(i):
        raise TapeError(f"nn.{what}: node {i} holds integer data; dropout needs float "
                        f"values (tp.to_f64 converts)")
    if channels and len(x.shape) < 2:
        raise TapeError(f"nn.{what}: expected x [N, C, ...], got {list(x.shape)}")
    salt = _salt(tp, salt, what)
    if p == 0.0:
        return x
    rng = tp.rng()
    flag = tp.slice(rng, [2], [3])
    if p == 1.0:                      # torch: x * 0 (alpha dropout too)
        return tp.where(flag, 0.0, x)
    shape = list(x.shape[:2]) + [1] * (len(x.shape) - 2) if channels else list(x.shape)
    u = tp.uniform(rng, shape=shape, salt=salt)
    keep = tp.ge(u, p)
    if shape != list(x.shape):
        keep = tp.expand(keep, list(x.shape))
    if alpha:
        a = 1.0 / math.sqrt((ALPHA_SELU * ALPHA_SELU * p + 1.0) * (1.0 - p))
        kept_b = (a * ALPHA_SELU) * p
        dropped = -(a * ALPHA_SELU) + kept_b
        on = tp.where(keep, tp.adds(tp.muls(x, a), kept_b), dropped)
    else:
        on = tp.where(keep, tp.muls(x, 1.0 / (1.0 - p)), 0.0)
    return tp.where(flag, on, x)


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
    tp = _tape(logits, "softmax_cross_entropy")
    picked = tp.take_along(tp.log_softmax(logits, axis=axis), ids, axis=axis)
    return tp.neg(tp.mean(picked))


def mse(y: GVar, t: GVar) -> GVar:
    """Mean squared error ``mean((y - t) * (y - t))``, shape [1] (the Tape's ``mse``)."""
    return _tape(y, "mse").mse(y, t)


# ── convolutional layers (NCHW; torch.nn.functional's arguments) ───────────

def _ints(v, count: int, what: str) -> list:
    """An int (repeated) or ``count`` ints: [height, width], or [depth, height, width]."""
    words = {2: "two", 3: "three"}[count]
    if isinstance(v, int) and not isinstance(v, bool):
        return [v] * count
    try:
        out = [int(x) for x in v]
    except (TypeError, ValueError):
        out = None
    if out is None or len(out) != count:
        raise TapeError(f"nn.{what}: expected an int or {words} ints, got {v!r}"[:200])
    return out


def _pair(v, what: str) -> list:
    return _ints(v, 2, what)


def conv2d(x: GVar, w: GVar, b: GVar = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> GVar:
    """torch's ``conv2d``: x [N, C, H, W], w [OC, C/groups, KH, KW], b [OC] (optional).

    One ``conv2d`` node (the matmul's products, numerics.conv2d), then b
    reshaped to [OC, 1, 1] and added with broadcasting (its gradient the
    serial sum over (n, oh, ow)).
    """
    tp = _tape(x, "conv2d")
    y = tp.conv2d(x, w, stride=_pair(stride, "conv2d stride"),
                  padding=_pair(padding, "conv2d padding"),
                  dilation=_pair(dilation, "conv2d dilation"), groups=groups)
    return y if b is None else tp.add(y, tp.reshape(b, [b.shape[0], 1, 1]))


def conv1d(x: GVar, w: GVar, b: GVar = None, stride: int = 1, padding: int = 0,
           dilation: int = 1, groups: int = 1) -> GVar:
    """torch's ``conv1d`` (x [N, C, L], w [OC, C/groups, K]) as a conv2d of height 1:
    reshapes around one ``conv2d`` node, the same products."""
    tp = _tape(x, "conv1d")
    n, c, length = x.shape
    oc, cg, k = w.shape
    y = conv2d(tp.reshape(x, [n, c, 1, length]), tp.reshape(w, [oc, cg, 1, k]), None,
               stride=[1, stride], padding=[0, padding], dilation=[1, dilation], groups=groups)
    y = tp.reshape(y, [n, oc, y.shape[3]])
    return y if b is None else tp.add(y, tp.reshape(b, [oc, 1]))


def _spread(tp, x, axis: int, stride: int) -> GVar:
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


def conv_transpose2d(x: GVar, w: GVar, b: GVar = None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1) -> GVar:
    """torch's ``conv_transpose2d``: x [N, C, H, W], w [C, OC/groups, KH, KW] (the
    layout of ``nn.ConvTranspose2d.weight``), b [OC] (optional); output size
    ``(H - 1) * stride - 2 * padding + dilation * (KH - 1) + output_padding + 1``.

    Recorded as the convolution it is the gradient of: x spread by the stride (zeros
    between its entries), padded by ``dilation * (K - 1) - padding`` on each side (and
    ``output_padding`` more after; cropped where that is negative), then one ``conv2d``
    of stride 1 by w with its spatial axes reversed and its channel axes exchanged per
    group.  Its products are therefore the matmul's own, as conv2d's; the spread input's
    zeros are multiplied too (stride**2 the work of a direct transposed convolution).
    """
    tp = _tape(x, "conv_transpose2d")
    s = _pair(stride, "conv_transpose2d stride")
    p = _pair(padding, "conv_transpose2d padding")
    op = _pair(output_padding, "conv_transpose2d output_padding")
    d = _pair(dilation, "conv_transpose2d dilation")
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise TapeError(f"nn.conv_transpose2d: expected x [N,C,H,W] and w [C,OC/groups,KH,KW], "
                        f"got {list(x.shape)} and {list(w.shape)}")
    return _transposed(tp, "conv_transpose2d", x, w, b, s, p, op, d, groups,
                       lambda y, wt, pads, g: tp.conv2d(y, wt, stride=[1, 1], padding=pads,
                                                        dilation=d, groups=g))


def _transposed(tp, what, x, w, b, s, p, op, d, groups, conv):
    """The transposed convolution of x [N, C, *spatial] by w [C, OC/groups, *kernel] as the
    stride-1 convolution ``conv(y, wt, pads, groups)`` it is the gradient of (see
    :func:`conv_transpose2d`), for 2 or 3 spatial dims."""
    c, cg, *k = w.shape
    nd = len(k)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or \
            c % groups or x.shape[1] != c:
        raise TapeError(f"nn.{what}: x's {x.shape[1]} channels must be w's dim 0 "
                        f"({c}), divisible by groups={groups!r}")
    if min(s + d) < 1 or min(p) < 0 or min(op) < 0 or any(
            o >= max(si, di) for o, si, di in zip(op, s, d)):
        raise TapeError(f"nn.{what}: stride {s} and dilation {d} must be >= 1, "
                        f"padding {p} >= 0, output_padding {op} >= 0 and smaller than the "
                        f"stride or the dilation")
    y = x
    pads = []
    for i in range(nd):
        axis, ki, si, pi, oi, di = 2 + i, k[i], s[i], p[i], op[i], d[i]
        y = _spread(tp, y, axis, si)
        lo = di * (ki - 1) - pi
        hi = lo + oi
        size = y.shape[axis]
        if size + lo + hi - di * (ki - 1) < 1:
            raise TapeError(f"nn.{what}: the output of {list(x.shape)} by a "
                            f"{'x'.join(map(str, k))} kernel (stride {s}, padding {p}) would "
                            f"be empty")
        if min(lo, hi) < 0:                             # crop where padding exceeds the kernel
            y = tp.narrow(y, axis, max(0, -lo), size - max(0, -hi))
            lo, hi = max(0, lo), max(0, hi)
        if hi > lo:                                     # output_padding: zeros after
            widths = [(0, 0)] * (2 + nd)
            widths[axis] = (0, hi - lo)
            y = tp.pad(y, widths)
        pads.append(lo)
    g = groups
    wt = tp.reshape(w, [g, c // g, cg, *k])
    wt = tp.reshape(tp.permute(wt, [0, 2, 1] + list(range(3, 3 + nd))), [g * cg, c // g, *k])
    y = conv(y, tp.flip(wt, tuple(range(2, 2 + nd))), pads, g)
    return y if b is None else tp.add(y, tp.reshape(b, [b.shape[0]] + [1] * nd))


def conv_transpose3d(x: GVar, w: GVar, b: GVar = None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1) -> GVar:
    """torch's ``conv_transpose3d``: x [N, C, D, H, W], w [C, OC/groups, KD, KH, KW] (the
    layout of ``nn.ConvTranspose3d.weight``), b [OC] (optional): as
    :func:`conv_transpose2d`, the stride-1 :func:`conv3d` it is the gradient of (the
    input spread by the stride along each spatial axis, padded or cropped, the kernel
    reversed and its channel axes exchanged per group)."""
    tp = _tape(x, "conv_transpose3d")
    _rank5(x, "conv_transpose3d")
    _rank5(w, "conv_transpose3d", "w", "[C, OC/groups, KD, KH, KW]")
    s, p, op, d = (_triple(v, f"conv_transpose3d {n}") for v, n in (
        (stride, "stride"), (padding, "padding"), (output_padding, "output_padding"),
        (dilation, "dilation")))
    return _transposed(tp, "conv_transpose3d", x, w, b, s, p, op, d, groups,
                       lambda y, wt, pads, g: conv3d(y, wt, stride=1, padding=pads,
                                                     dilation=d, groups=g))


def conv_transpose1d(x: GVar, w: GVar, b: GVar = None, stride: int = 1, padding: int = 0,
                     output_padding: int = 0, groups: int = 1, dilation: int = 1) -> GVar:
    """torch's ``conv_transpose1d`` (x [N, C, L], w [C, OC/groups, K]) as a
    :func:`conv_transpose2d` of height 1."""
    tp = _tape(x, "conv_transpose1d")
    if len(x.shape) != 3 or len(w.shape) != 3:
        raise TapeError(f"nn.conv_transpose1d: expected x [N,C,L] and w [C,OC/groups,K], got "
                        f"{list(x.shape)} and {list(w.shape)}")
    n, c, length = x.shape
    y = conv_transpose2d(tp.reshape(x, [n, c, 1, length]), tp.reshape(w, [*w.shape[:2], 1,
                                                                           w.shape[2]]),
                         None, stride=[1, stride], padding=[0, padding],
                         output_padding=[0, output_padding], groups=groups,
                         dilation=[1, dilation])
    y = tp.reshape(y, [n, y.shape[1], y.shape[3]])
    return y if b is None else tp.add(y, tp.reshape(b, [b.shape[0], 1]))


def max_pool2d(x: GVar, kernel, stride=None, padding=0, dilation=1,
               ceil_mode: bool = False) -> GVar:
    """torch's ``max_pool2d`` (stride defaults to the kernel): the first maximum of each
    window gets the gradient, a NaN wins (numerics.max_pool2d)."""
    tp = _tape(x, "max_pool2d")
    k = _pair(kernel, "max_pool2d kernel")
    return tp.max_pool2d(x, kernel=k, stride=k if stride is None else _pair(stride, "stride"),
                         padding=_pair(padding, "max_pool2d padding"),
                         dilation=_pair(dilation, "max_pool2d dilation"), ceil_mode=ceil_mode)


def avg_pool2d(x: GVar, kernel, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> GVar:
    """torch's ``avg_pool2d`` (stride defaults to the kernel; numerics.avg_pool2d)."""
    tp = _tape(x, "avg_pool2d")
    k = _pair(kernel, "avg_pool2d kernel")
    return tp.avg_pool2d(x, kernel=k, stride=k if stride is None else _pair(stride, "stride"),
                         padding=_pair(padding, "avg_pool2d padding"), ceil_mode=ceil_mode,
                         count_include_pad=count_include_pad)


# ── 3-d layers: per output depth, the 2-d op of a depth slab ───────────────

def _triple(v, what: str) -> list:
    return _ints(v, 3, what)


def _depth_out(tp, what, d, k, stride, pad, dil, ceil_mode=False) -> int:
    if k < 1 or stride < 1 or dil < 1 or pad < 0:
        raise TapeError(f"nn.{what}: the depth's kernel, stride and dilation must be >= 1 "
                        f"and its padding >= 0, got {k}, {stride}, {dil}, {pad}")
    span = d + 2 * pad - dil * (k - 1) - 1
    if span < 0:
        raise TapeError(f"nn.{what}: the depth window ({k} taps, dilation {dil}) is larger "
                        f"than the padded depth {d + 2 * pad}")
    out = -(-span // stride) + 1 if ceil_mode else span // stride + 1
    if ceil_mode and (out - 1) * stride >= d + pad:     # torch: no window starts in the pad
        out -= 1
    return out


def _rank5(x, what, name="x", dims="[N, C, D, H, W]"):
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) != 5:
        raise TapeError(f"nn.{what}: expected {name} {dims}, got "
                        f"{list(shape) if shape is not None else type(x).__name__}")


def conv3d(x: GVar, w: GVar, b: GVar = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> GVar:
    """torch's ``conv3d``: x [N, C, D, H, W], w [OC, C/groups, KD, KH, KW], b [OC].

    Per output depth one ``conv2d`` node of the input's depth slab merged into the
    channels ([N, C*KD, H, W], channel-major) by w reshaped to [OC, C/groups*KD, KH, KW]:
    each output's products are one FMA chain over (channel, depth tap, row, column),
    the matmul's inner products as every convolution's, and groups stay contiguous
    blocks of the merged channels.  The depths are joined by ``stack``; zero depth
    padding is a const block (``pad``)."""
    tp = _tape(x, "conv3d")
    _rank5(x, "conv3d")
    _rank5(w, "conv3d", "w", "[OC, C/groups, KD, KH, KW]")
    (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = (_triple(v, f"conv3d {n}") for v, n in (
        (stride, "stride"), (padding, "padding"), (dilation, "dilation")))
    n, c, d, h, wd = x.shape
    oc, cg, kd, kh, kw = w.shape
    out_d = _depth_out(tp, "conv3d", d, kd, sd, pd, dd)
    if pd:
        x = tp.pad(x, [(0, 0), (0, 0), (pd, pd), (0, 0), (0, 0)])
    w2 = tp.reshape(w, [oc, cg * kd, kh, kw])
    outs = []
    for o in range(out_d):
        slab = tp.narrow(x, 2, o * sd, o * sd + dd * (kd - 1) + 1, dd)      # [N, C, KD, H, W]
        outs.append(tp.conv2d(tp.reshape(slab, [n, c * kd, h, wd]), w2, stride=[sh, sw],
                              padding=[ph, pw], dilation=[dh, dw], groups=groups))
    y = tp.stack(outs, 2)
    return y if b is None else tp.add(y, tp.reshape(b, [oc, 1, 1, 1]))


def _depth_taps(d, k, stride, pad, dil, out_d):
    """The input depths each output depth's window reads (padding taps left out)."""
    return [[t for t in (o * stride - pad + j * dil for j in range(k)) if 0 <= t < d]
            for o in range(out_d)]


def max_pool3d(x: GVar, kernel, stride=None, padding=0, dilation=1,
               ceil_mode: bool = False) -> GVar:
    """torch's ``max_pool3d``: per output depth the ``maximum`` of the ``max_pool2d`` of
    each depth its window reads, in ascending depth (a tie keeps the earlier depth: the
    first maximum in (depth, row, column) order gets the gradient, as torch's scan)."""
    tp = _tape(x, "max_pool3d")
    _rank5(x, "max_pool3d")
    k = _triple(kernel, "max_pool3d kernel")
    s = k if stride is None else _triple(stride, "stride")
    p, dl = _triple(padding, "max_pool3d padding"), _triple(dilation, "max_pool3d dilation")
    n, c, d, h, wd = x.shape
    out_d = _depth_out(tp, "max_pool3d", d, k[0], s[0], p[0], dl[0], ceil_mode)
    outs = []
    for taps in _depth_taps(d, k[0], s[0], p[0], dl[0], out_d):
        pooled = [max_pool2d(tp.reshape(tp.narrow(x, 2, t, t + 1), [n, c, h, wd]), k[1:],
                             s[1:], p[1:], dl[1:], ceil_mode) for t in taps]
        m = pooled[0]
        for q in pooled[1:]:
            m = tp.maximum(m, q)
        outs.append(m)
    return tp.stack(outs, 2)


def avg_pool3d(x: GVar, kernel, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> GVar:
    """torch's ``avg_pool3d``: per output depth the ``avg_pool2d`` of each depth its window
    reads (``ceil_mode`` and ``count_include_pad`` passed on), summed in ascending depth
    and divided by the depth taps counted: with count_include_pad those of the window
    inside the padded depth (torch's ``min(start + k, D + pad) - start``), else those
    inside the input.  The product of the two divisors is torch's; the average over the
    window's elements, rounded differently from torch's one sum."""
    tp = _tape(x, "avg_pool3d")
    _rank5(x, "avg_pool3d")
    k = _triple(kernel, "avg_pool3d kernel")
    s = k if stride is None else _triple(stride, "stride")
    p = _triple(padding, "avg_pool3d padding")
    n, c, d, h, wd = x.shape
    out_d = _depth_out(tp, "avg_pool3d", d, k[0], s[0], p[0], 1, bool(ceil_mode))
    outs = []
    for o, taps in enumerate(_depth_taps(d, k[0], s[0], p[0], 1, out_d)):
        pooled = [avg_pool2d(tp.reshape(tp.narrow(x, 2, t, t + 1), [n, c, h, wd]), k[1:],
                             s[1:], p[1:], bool(ceil_mode), count_include_pad) for t in taps]
        total = pooled[0]
        for q in pooled[1:]:
            total = tp.add(total, q)
        start = o * s[0] - p[0]
        count = min(start + k[0], d + p[0]) - start if count_include_pad else len(taps)
        outs.append(tp.div(total, tp.const_like(total, np.array([float(count)])))
                    if count > 1 else total)
    return tp.stack(outs, 2)


def global_avg_pool2d(x: GVar) -> GVar:
    """torch's ``adaptive_avg_pool2d(x, 1)``: the mean over H and W, [N, C, 1, 1].

    x reshaped to [N, C, H*W], one axis ``mean`` (serial sum over (h, w)
    row-major / (H*W)), reshaped back."""
    tp = _tape(x, "global_avg_pool2d")
    n, c, h, w = x.shape
    m = tp.mean(tp.reshape(x, [n, c, h * w]), axis=2, keepdims=True)
    return tp.reshape(m, [n, c, 1, 1])


def _windows(size: int, out: int) -> list:
    """Adaptive pooling's windows along one axis (torch's): [floor(i * size / out),
    ceil((i + 1) * size / out)) for each output index i."""
    return [((i * size) // out, -(-((i + 1) * size) // out)) for i in range(out)]


def _adaptive_size(x, output_size, what, dims=2):
    if len(x.shape) != 2 + dims:
        want = "[N,C,H,W]" if dims == 2 else "[N,C,D,H,W]"
        raise TapeError(f"nn.{what}: expected x {want}, got {list(x.shape)}")
    size = list(output_size) if isinstance(output_size, (list, tuple)) else \
        [output_size] * dims
    if len(size) != dims:
        count = ("two", "three")[dims - 2]
        raise TapeError(f"nn.{what}: output_size must be an int or {count}, got "
                        f"{output_size!r}"[:200])
    size = [x.shape[2 + k] if v is None else v for k, v in enumerate(size)]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in size):
        raise TapeError(f"nn.{what}: output_size must be ints >= 1, got "
                        f"{output_size!r}"[:200])
    return size


def _separable_windows(tp, x, size, out, reduce):
    """torch's adaptive windows reduced one spatial axis at a time, the last first."""
    y = x
    for k in reversed(range(len(size))):
        axis, n, o = 2 + k, size[k], out[k]
        if n != o:
            y = tp.cat([reduce(tp.narrow(y, axis, lo, hi), axis=axis, keepdims=True)
                        for lo, hi in _windows(n, o)], axis)
    return y


def adaptive_avg_pool2d(x: GVar, output_size) -> GVar:
    """torch's ``adaptive_avg_pool2d``: x [N, C, H, W] to [N, C, OH, OW] (``output_size``
    an int or two; None keeps that dim).

    Where OH divides H and OW divides W, one ``avg_pool2d`` (kernel = stride = H/OH x
    W/OW: the sum of each window / its count, as torch).  Else the windows overlap or
    differ in size: along W, each window's axis ``mean`` (a slice), joined; then the same
    along H -- a mean of the window's row means, equal to torch's mean in value (the
    windows are rectangles), not in its last bits.
    """
    tp = _tape(x, "adaptive_avg_pool2d")
    (h, w), (oh, ow) = x.shape[2:], _adaptive_size(x, output_size, "adaptive_avg_pool2d")
    if h % oh == 0 and w % ow == 0:
        if (oh, ow) == (h, w):
            return x
        return tp.avg_pool2d(x, kernel=[h // oh, w // ow], stride=[h // oh, w // ow],
                             padding=[0, 0], ceil_mode=False, count_include_pad=True)
    return _separable_windows(tp, x, (h, w), (oh, ow), tp.mean)


def adaptive_max_pool2d(x: GVar, output_size) -> GVar:
    """torch's ``adaptive_max_pool2d`` (the values): one ``max_pool2d`` where the output
    size divides the input's, else each window's axis ``max`` along W, joined, then
    along H.  Either way the first maximum of a window in row-major order gets the
    gradient (along W first, then H, picks the first row holding the maximum and
    the first column in it), as max_pool2d; a NaN wins."""
    tp = _tape(x, "adaptive_max_pool2d")
    (h, w), (oh, ow) = x.shape[2:], _adaptive_size(x, output_size, "adaptive_max_pool2d")
    if h % oh == 0 and w % ow == 0:
        if (oh, ow) == (h, w):
            return x
        k = [h // oh, w // ow]
        return tp.max_pool2d(x, kernel=k, stride=k, padding=[0, 0], dilation=[1, 1],
                             ceil_mode=False)
    return _separable_windows(tp, x, (h, w), (oh, ow), tp.max)


def adaptive_avg_pool3d(x: GVar, output_size) -> GVar:
    """torch's ``adaptive_avg_pool3d``: x [N, C, D, H, W] to [N, C, OD, OH, OW]
    (``output_size`` an int or three; None keeps that dim): each window's axis ``mean``
    along W, joined, then along H, then along D -- the mean of the window's means, torch's
    mean in value (the windows are boxes), not in its last bits."""
    tp = _tape(x, "adaptive_avg_pool3d")
    size, out = list(x.shape[2:]), _adaptive_size(x, output_size, "adaptive_avg_pool3d", 3)
    return _separable_windows(tp, x, size, out, tp.mean)


def adaptive_max_pool3d(x: GVar, output_size) -> GVar:
    """torch's ``adaptive_max_pool3d`` (the values): each window's axis ``max`` along W,
    joined, then along H, then D; the first maximum of a window in (depth, row, column)
    order gets the gradient, torch's scan order; a NaN wins."""
    tp = _tape(x, "adaptive_max_pool3d")
    size, out = list(x.shape[2:]), _adaptive_size(x, output_size, "adaptive_max_pool3d", 3)
    return _separable_windows(tp, x, size, out, tp.max)


def _linear_taps(size: int, out: int, align_corners: bool, scale) -> tuple:
    """Linear interpolation's two source indices and weights per output index along one
    axis, torch's rule (area_pixel_compute_source_index, in float64): the source
    coordinate ``scale * dst`` (align_corners) or ``max(scale * (dst + 0.5) - 0.5, 0)``,
    i0 its floor, i1 = i0 + 1 short of the edge, weights ``1 - l`` and ``l``, ``l`` the
    fraction."""
    if align_corners:
        ratio = (size - 1) / (out - 1) if out > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale is not None and scale > 0 else size / out
    i0, i1, w0, w1 = [], [], [], []
    for dst in range(out):
        src = ratio * dst if align_corners else max(ratio * (dst + 0.5) - 0.5, 0.0)
        lo = min(int(src), size - 1)
        frac = min(src - lo, 1.0)
        i0.append(lo)
        i1.append(lo + (1 if lo < size - 1 else 0))
        w0.append(1.0 - frac)
        w1.append(frac)
    return i0, i1, np.array(w0), np.array(w1)


def grid_sample(x: GVar, grid: GVar, align_corners: bool = False) -> GVar:
    """torch's ``grid_sample(x, grid, mode="bilinear", padding_mode="zeros")``: x [N, C, H,
    W] sampled at grid [N, OH, OW, 2] ((x, y) in [-1, 1]) to [N, C, OH, OW].

    Each grid point's source coordinate is torch's unnormalisation, ``((g + 1) * W - 1) /
    2`` (``(g + 1) / 2 * (W - 1)`` with align_corners); ``x0 = floor(ix)`` (no gradient)
    and ``f = ix - x0``; the weight of column j is ``1 - f`` where ``j == x0``, ``f`` where
    ``j == x0 + 1``, 0 elsewhere (a column outside the input is no column: zero padding).
    So the gradient with respect to the grid is torch's floor rule (``v[x0 + 1] - v[x0]``
    times the other axis' weights), also at whole-number coordinates, where an identity
    grid lies.  The sample is ``sum_i wy[i] * sum_j wx[j] * x[i, j]``: the sum over j one
    batched product by the column weights (FMA chains, as every product), then over i a
    serial sum: torch's value within rounding.  Dense in the input's rows and columns:
    [N, C*H, W] @ [N, W, OH*OW] -- meant for the small images spatial transformers warp.
    """
    tp = _tape(x, "grid_sample")
    if len(x.shape) != 4 or len(grid.shape) != 4 or grid.shape[3] != 2 or \
            grid.shape[0] != x.shape[0]:
        raise TapeError(f"nn.grid_sample: expected x [N,C,H,W] and grid [N,OH,OW,2], got "
                        f"{list(x.shape)} and {list(grid.shape)}")
    n, c, h, w = x.shape
    _, oh, ow, _ = grid.shape
    pts = oh * ow

    def weights(axis, size):
        g = tp.reshape(tp.slice(grid, [0, 0, 0, axis], [n, oh, ow, axis + 1]), [n, pts, 1])
        if align_corners:
            at = tp.muls(tp.muls(tp.adds(g, 1.0), 0.5), float(size - 1))
        else:
            at = tp.muls(tp.adds(tp.muls(tp.adds(g, 1.0), float(size)), -1.0), 0.5)
        x0 = tp.floor(at)
        f = tp.sub(at, x0)
        cols = tp.const(np.arange(size, dtype=np.float64).reshape(1, 1, size))
        lo = tp.mul(tp.eq(cols, x0), tp.sub(tp.const(np.ones(1)), f))
        return tp.add(lo, tp.mul(tp.eq(cols, tp.adds(x0, 1.0)), f))        # [N, P, size]

    wx, wy = weights(0, w), weights(1, h)
    rows = tp.bmm(tp.reshape(x, [n, c * h, w]), tp.permute(wx, [0, 2, 1]))  # [N, C*H, P]
    rows = tp.permute(tp.reshape(rows, [n, c, h, pts]), [0, 1, 3, 2])      # [N, C, P, H]
    out = tp.sum(tp.mul(rows, tp.reshape(wy, [n, 1, pts, h])), axis=3)     # [N, C, P]
    return tp.reshape(out, [n, c, oh, ow])


def upsample_bilinear2d(x: GVar, size, align_corners: bool = False, scale_factor=None) -> GVar:
    """torch's ``interpolate(x, size, mode="bilinear", align_corners=...)``: x [N, C, H, W]
    to [N, C, OH, OW] (``scale_factor``, one or two, only sets where the taps fall, as
    torch's ``recompute_scale_factor=None``; ``size`` is the output size either way).

    Separable: along W, ``x[..., i0] * w0 + x[..., i1] * w1`` (two index_selects, two
    muls by const weights, an add), then the same along H; the weights are torch's,
    the roundings of a different grouping than torch's kernel (within 1e-15)."""
    tp = _tape(x, "upsample_bilinear2d")
    if len(x.shape) != 4:
        raise TapeError(f"nn.upsample_bilinear2d: expected x [N,C,H,W], got {list(x.shape)}")
    out = _pair(size, "upsample_bilinear2d size")
    scales = (list(scale_factor) if isinstance(scale_factor, (list, tuple))
              else [scale_factor] * 2)
    if min(out) < 1 or len(scales) != 2:
        raise TapeError(f"nn.upsample_bilinear2d: size must be ints >= 1 and scale_factor "
                        f"one or two numbers, got {size!r}, {scale_factor!r}"[:200])
    y = x
    for axis, n, o, sc in ((3, x.shape[3], out[1], scales[1]), (2, x.shape[2], out[0], scales[0])):
        if n == o and (align_corners or sc in (None, 1.0)):          # the identity
            continue
        i0, i1, w0, w1 = _linear_taps(n, o, bool(align_corners), sc)
        shape = [1] * 4
        shape[axis] = o
        y = tp.add(tp.mul(tp.index_select(y, axis, i0), tp.const(w0.reshape(shape))),
                   tp.mul(tp.index_select(y, axis, i1), tp.const(w1.reshape(shape))))
    return y


def group_norm(x: GVar, num_groups: int, weight: GVar = None, bias: GVar = None,
               eps: float = 1e-5) -> GVar:
    """torch's ``group_norm``: x [N, C, *] normalised over each group of C / num_groups
    channels and every spatial position (the biased variance), then the per-channel
    weight and bias ([C], optional).

    x reshaped to [N, G, C/G * rest] and :func:`native_layer_norm` over the last axis
    (no gain), reshaped back, times weight and plus bias reshaped to [C, 1, ...].
    """
    tp = _tape(x, "group_norm")
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
    tp = _tape(x, "batch_norm2d")
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
    tp = _tape(x, "batch_norm2d_train")
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
