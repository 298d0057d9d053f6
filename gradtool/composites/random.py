"""Draws over the tape's rng slot (``Tape.rng()``): dropout in its forms and torch's
random functions, every one the counter-based ``uniform`` op and table ops after it, so
every backend and any number of ranks give the same bits (``numerics``, "The
counter-based generator"); with the slot's train flag 0 (validation) each gives its
documented eval value."""

from __future__ import annotations

import math

import numpy as np

from ..errors import TapeError
from ..tape import GVar
from ._args import tape_of

__all__ = ["rng_slot", "dropout", "feature_dropout", "alpha_dropout", "bernoulli", "normal",
           "rand", "randint", "randperm", "multinomial"]


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
        tp = tape_of(p, "bernoulli")
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
    tp = tape_of(weights, "multinomial")
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
    tp = tape_of(x, what)
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
