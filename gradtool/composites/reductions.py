"""Reductions and scans, Tape methods that record the table's ops: ``sum``/``mean``/``max``
over several axes (:func:`reduce_axes`, the multi-axis rule of ``numerics``), ``variance``,
``std``, ``amin``, ``prod``, and the running ``cumsum``/``cumprod``/``cummax``/``cummin``/
``logcumsumexp`` (serial chains in ascending order)."""

from __future__ import annotations

import functools
import inspect
import math
import numbers

import numpy as np

from ..errors import TapeError
from ._axes import checked_axes, checked_axis, is_int, shape_of
from .layout import cat, narrow, reshape_to

__all__ = ["reduce_axes", "variance", "std", "amin", "prod", "cumsum", "cumprod", "cummax",
           "cummin", "logcumsumexp"]


def reduce_axes(tp, op: str, a, axis, keepdims: bool = False):
    """``sum``/``mean``/``max`` over several axes at once (numerics: "multi-axis
    reduction"): the reduced axes are moved behind the kept ones in their order
    (a ``permute``, left out when they are already adjacent), merged into one
    (a ``reshape``), and reduced as one axis: so every kept index's result is the
    single-axis rule over the reduced coordinates in row-major order (the
    serial sum from 0.0; the mean divides it once by their count; the max is
    the first maximal element, whose one element gets the gradient).  Every
    axis at once is the whole reduction itself (``axis=None``).
    """
    method = getattr(tp, f"_{op}_one")
    shape = shape_of(tp, a, op)
    axes = checked_axes(axis, len(shape), op)
    if not axes:
        raise TapeError(f"{op}: axis=() names no axis (numpy would reduce none, torch "
                        f"every one); pass None for every axis")
    if len(axes) == 1:
        return method(a, axes[0], keepdims)
    if len(axes) == len(shape):
        return method(a, None, keepdims)
    kept = [d for d in range(len(shape)) if d not in axes]
    count = math.prod(shape[d] for d in axes)
    if axes == list(range(axes[0], axes[-1] + 1)):          # adjacent: merge in place
        merged = list(shape[:axes[0]]) + [count] + list(shape[axes[-1] + 1:])
        r = method(tp.reshape(a, merged), axes[0], False)
    else:
        moved = tp.permute(a, kept + axes)
        r = method(tp.reshape(moved, [shape[d] for d in kept] + [count]), len(kept), False)
    if keepdims:
        r = tp.reshape(r, [1 if d in axes else shape[d] for d in range(len(shape))])
    return r


def reduction_method(one):
    """The Tape's ``sum``/``mean``/``max``: the table's op method ``one`` for None or one
    axis (the file node it always was), :func:`reduce_axes` for a tuple of axes."""
    op = one.__name__

    @functools.wraps(one)
    def method(self, a, axis=None, keepdims=False):
        if axis is None or is_int(axis):
            return one(self, a, axis, keepdims)
        return reduce_axes(self, op, a, axis, keepdims)

    method.__signature__ = inspect.signature(one)
    method.__doc__ = (one.__doc__ or "") + (
        "\n\nA tuple of axes reduces them all at once: row-major over the reduced "
        "coordinates (numerics: multi-axis reduction), recorded as permute/reshape and "
        "the one-axis op.")
    return method


def variance(tp, a, axis=None, correction=1, keepdims=False):
    """torch.var (named ``variance``: ``Tape.var`` already looks up a node's handle):
    ``m = mean(a, axis, keepdims=True)``, ``d = a - m``, then ``sum(d * d, axis) /
    max(0, N - correction)`` (one division by a const; N the number of reduced
    elements).  torch's CPU kernel accumulates differently (Welford),
    so torch's float64 bits differ from these in the last places."""
    shape = shape_of(tp, a, "variance")
    axes = checked_axes(axis, len(shape), "variance")
    if not axes:
        raise TapeError("variance: axis=() names no axis; pass None for every axis")
    if not isinstance(correction, numbers.Real) or isinstance(correction, (bool, np.bool_)):
        raise TapeError(f"variance: correction must be a number, got {correction!r}"[:200])
    d = tp.sub(a, tp.mean(a, axes, keepdims=True))
    ss = tp.sum(tp.mul(d, d), axes, keepdims)
    n = math.prod(shape[x] for x in axes)
    return tp.div(ss, tp.const_like(ss, np.array([max(0.0, n - float(correction))])))


def std(tp, a, axis=None, correction=1, keepdims=False):
    """torch.std: ``sqrt(variance(a, axis, correction, keepdims))``."""
    return tp.sqrt(variance(tp, a, axis, correction, keepdims))


def amin(tp, a, axis=None, keepdims=False):
    """The first minimal element (torch.amin's value; one axis, several, or every one):
    ``-max(-a)``, exact (negation is), so ties and NaN go as in :meth:`Tape.max`: the
    first NaN, else the first smallest element, which alone gets the gradient."""
    return tp.neg(tp.max(tp.neg(a), axis, keepdims))


def _chain(tp, a, axis, what, step, first=lambda x: x):
    """([y0, y1, ...], axis): the serial chain along ``axis`` of the one-entry slices x_i,
    ``y0 = first(x0)``, ``y_i = step(y_(i-1), x_i)`` in ascending order (the running
    sums, products and maxima)."""
    shape = shape_of(tp, a, what)
    ax = checked_axis(axis, len(shape), what)
    run = first(narrow(tp, a, ax, 0, 1))
    out = [run]
    for i in range(1, shape[ax]):
        run = step(run, narrow(tp, a, ax, i, i + 1))
        out.append(run)
    return out, ax


def cumsum(tp, a, axis):
    """Running sums along ``axis`` (torch.cumsum): ``y[0] = 0.0 + a[0]``, ``y[i] = y[i-1]
    + a[i]``, each sum one rounding in ascending order, as torch's CPU loop (which starts
    from +0.0, so a -0.0 first entry gives +0.0).  Recorded as one-entry slices, a chain
    of ``add`` nodes and a :func:`cat`: about three nodes per entry of the axis, and the
    gradient of each entry is the serial sum of the later gradients through the chain."""
    return cat(tp, *_chain(tp, a, axis, "cumsum", tp.add, lambda first: tp.adds(first, 0.0)))


def cumprod(tp, a, axis):
    """Running products along ``axis`` (torch.cumprod): ``y[0] = a[0]``, ``y[i] = y[i-1] *
    a[i]``, each product one rounding in ascending order; one-entry slices, a chain of
    ``mul`` nodes and a :func:`cat`.  The gradient is the chain rule through the chain
    (exact in value where an entry is zero, as torch's special case for zeros)."""
    return cat(tp, *_chain(tp, a, axis, "cumprod", tp.mul))


def cummax(tp, a, axis):
    """Running maxima along ``axis`` (torch.cummax's values): ``y[0] = a[0]``, ``y[i] =
    maximum(a[i], y[i-1])``, exact copies; a tie gives the later entry (and its
    gradient), as torch's index, and a NaN stays (its gradient then follows the
    chain back, where torch's goes to the NaN's own entry)."""
    return cat(tp, *_chain(tp, a, axis, "cummax", lambda run, x: tp.maximum(x, run)))


def cummin(tp, a, axis):
    """Running minima (torch.cummin's values): ``-cummax(-a)``, exact; ties to the later."""
    return tp.neg(cummax(tp, tp.neg(a), axis))


def logcumsumexp(tp, a, axis):
    """Running log-sum-exps along ``axis`` (torch.logcumsumexp): ``y[0] = a[0]``, ``y[i] =
    logaddexp(y[i-1], a[i])`` with ``logaddexp(u, v) = m + log(exp(u - m) + exp(v - m))``,
    ``m = max(u, v)`` held as a constant (``detach``: the gradient is the exact softmax
    weights, also on a tie) and taken as 0 where it is -inf (so two -inf give -inf, as
    torch's).  Each step stays in range however far apart the entries are (the running
    maximum, not the line's); about ten nodes per entry of the axis and a :func:`cat`."""
    def step(u, v):
        m = tp.detach(tp.maximum(u, v))
        m = tp.where(tp.eq(m, -math.inf), 0.0, m)
        return tp.add(m, tp.log(tp.add(tp.exp(tp.sub(u, m)), tp.exp(tp.sub(v, m)))))
    return cat(tp, *_chain(tp, a, axis, "logcumsumexp", step))


def prod(tp, a, axis=None, keepdims=False):
    """The product along ``axis`` (torch.prod; None: of every element, as [1]): the last
    entry of :func:`cumprod`'s chain, without the cat."""
    shape = shape_of(tp, a, "prod")
    if axis is None:                             # of every element: shaped [1]
        steps, _ = _chain(tp, tp.reshape(a, [math.prod(shape)]), 0, "prod", tp.mul)
        return steps[-1]
    steps, ax = _chain(tp, a, axis, "prod", tp.mul)
    run = steps[-1]
    if keepdims:
        return run
    return reshape_to(tp, run, [n for d, n in enumerate(shape) if d != ax], "prod")


# name -> function(tp, ...): each becomes a Tape method of that name (tape.py)
METHODS = {"cumsum": cumsum, "cumprod": cumprod, "cummax": cummax, "cummin": cummin,
           "logcumsumexp": logcumsumexp, "prod": prod, "variance": variance, "std": std,
           "amin": amin}
