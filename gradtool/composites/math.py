"""Elementwise math torch has and the op table lacks, recorded from the table's own ops.

sinh, cosh, asinh, acosh, atanh, hypot, tan, exp2, log2 and log10, each a function of
:class:`~gradtool.tape.GVar` handles (GVar-first, as :mod:`gradtool.nn`: the nodes go on
the operand's tape), usable from ``gt.Tape`` without torch; the importer's ATen entries
(:mod:`gradtool.interop.aten.elementwise`) call them.

Each is within a few ulps of the correctly rounded value (torch's float64 within 1e-12
relative: ``tests/test_composites_math.py``), with fdlibm's argument ranges so that
nothing overflows or loses accuracy before the result does; the gradients come from
differentiating the recording.  Piecewise rules evaluate every piece on an input clamped
into that piece's range (a ``where`` of the input first), so a piece that is not taken is
finite and passes a zero gradient, never 0 * inf.  Numbers in the formulas are one-element
consts in the operand's dtype (:meth:`~gradtool.tape.Tape.const_like`), or the ``adds`` /
``muls`` operand; the order of the roundings is the order of the ops written below.

    import gradtool as gt
    from gradtool.composites import math as gm
    tp = gt.Tape()
    x = tp.param(np.array([0.5, -3.0]))
    y = gm.sinh(x)
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import TapeError
from ..tape import GVar

__all__ = ["exp2", "log2", "log10", "tan", "sinh", "cosh", "asinh", "acosh", "atanh",
           "hypot"]

LN2, LN10 = math.log(2.0), math.log(10.0)    # each rounded once
BIG = 2.0 ** 28                              # fdlibm's asinh/acosh: beyond it, log(x) + ln 2


def _tape(x, what: str):
    if not isinstance(x, GVar):
        raise TapeError(f"composites.math.{what}: expected a GVar, got {type(x).__name__}")
    return x.tape


def _c(x: GVar, v: float) -> GVar:
    """The number ``v`` as a one-element const beside ``x`` (its float dtype)."""
    return x.tape.const_like(x, np.array([v]))


def _pieces(x: GVar, mask: GVar, inside: float, outside: float) -> tuple:
    """``x`` where ``mask``, else ``inside`` (a number in the piece's range), and the
    other piece's input likewise: (x_in, x_out)."""
    tp = x.tape
    return tp.where(mask, x, _c(x, inside)), tp.where(mask, _c(x, outside), x)


def _odd(x: GVar, f) -> GVar:
    """An odd function from its rule ``f`` on x >= 0: f(x) where x >= 0 (-0.0 included,
    whose sign f keeps), else -f(-x); NaN goes to the negative side and stays NaN."""
    tp = x.tape
    pos = tp.ge(x, _c(x, 0.0))
    x_pos, x_neg = _pieces(x, pos, 0.0, 0.0)
    return tp.where(pos, f(x_pos), tp.neg(f(tp.neg(x_neg))))


def _hyperbolic(x: GVar, near) -> GVar:
    """sinh's or cosh's rule for x >= 0: ``near(expm1(x))`` below 22, ``exp(x - ln 2)``
    from there (finite up to 710.47, as the functions and their gradients are)."""
    tp = x.tape
    small = tp.lt(x, _c(x, 22.0))
    x_s, x_b = _pieces(x, small, 0.0, 22.0)
    return tp.where(small, near(tp.expm1(x_s)), tp.exp(tp.adds(x_b, -LN2)))


def exp2(x: GVar) -> GVar:
    """2^x as exp(x * ln 2): within about (|x| + 2) ulps (the product's rounding, scaled
    by |x|, plus exp's)."""
    tp = _tape(x, "exp2")
    return tp.exp(tp.muls(x, LN2))


def log2(x: GVar) -> GVar:
    """log(x) / ln 2, the constant rounded once: two roundings after log's."""
    tp = _tape(x, "log2")
    return tp.div(tp.log(x), _c(x, LN2))


def log10(x: GVar) -> GVar:
    """log(x) / ln 10, the constant rounded once."""
    tp = _tape(x, "log10")
    return tp.div(tp.log(x), _c(x, LN10))


def tan(x: GVar) -> GVar:
    """sin(x) / cos(x): three roundings (fdlibm's sin and cos, then the division)."""
    tp = _tape(x, "tan")
    return tp.div(tp.sin(x), tp.cos(x))


def sinh(x: GVar) -> GVar:
    """Odd; for 0 <= x < 22, e = expm1(x), (e + e / (e + 1)) * 0.5 (fdlibm's s_sinh.c);
    beyond, exp(x - ln 2): finite up to 710.47 as sinh is, and so is its gradient."""
    tp = _tape(x, "sinh")
    return _odd(x, lambda v: _hyperbolic(
        v, lambda e: tp.muls(tp.add(e, tp.div(e, tp.adds(e, 1.0))), 0.5)))


def cosh(x: GVar) -> GVar:
    """v = |x|; below 22, 1 + e*e / (2 * (1 + e)) with e = expm1(v) (no cancellation, in
    the value or its gradient near 0); beyond, exp(v - ln 2).  |x|'s zero gradient at 0
    is cosh's."""
    tp = _tape(x, "cosh")
    return _hyperbolic(tp.abs(x), lambda e: tp.adds(
        tp.div(tp.mul(e, e), tp.muls(tp.adds(e, 1.0), 2.0)), 1.0))


def asinh(x: GVar) -> GVar:
    """Odd; x itself below 2^-28 (and -0.0's sign); below 2^28,
    log1p(x + x*x / (1 + sqrt(1 + x*x))); beyond, log(x) + ln 2 (fdlibm's s_asinh.c)."""
    tp = _tape(x, "asinh")

    def f(v):
        small = tp.lt(v, _c(v, BIG))
        v_s, v_b = _pieces(v, small, 0.0, BIG)
        vv = tp.mul(v_s, v_s)
        near = tp.log1p(tp.add(v_s, tp.div(vv, tp.adds(tp.sqrt(tp.adds(vv, 1.0)), 1.0))))
        near = tp.where(tp.lt(v, _c(v, 2.0 ** -28)), v, near)
        return tp.where(small, near, tp.adds(tp.log(v_b), LN2))
    return _odd(x, f)


def acosh(x: GVar) -> GVar:
    """For x < 2^28, t = x - 1, log1p(t + sqrt(t) * sqrt(t + 2)) (NaN below 1; the
    gradient inf at 1, as torch's); beyond, log(x) + ln 2 (fdlibm's e_acosh.c)."""
    tp = _tape(x, "acosh")
    small = tp.logical_not(tp.ge(x, _c(x, BIG)))          # NaN on the near side
    x_s, x_b = _pieces(x, small, 1.0, BIG)
    t = tp.adds(x_s, -1.0)
    near = tp.log1p(tp.add(t, tp.mul(tp.sqrt(t), tp.sqrt(tp.adds(t, 2.0)))))
    return tp.where(small, near, tp.adds(tp.log(x_b), LN2))


def atanh(x: GVar) -> GVar:
    """Odd; for 0 <= x, 0.5 * log1p(2x / (1 - x)) (1 - x exact near 1; fdlibm's
    e_atanh.c form)."""
    tp = _tape(x, "atanh")

    def f(v):
        return tp.muls(tp.log1p(tp.div(tp.muls(v, 2.0), tp.sub(_c(v, 1.0), v))), 0.5)
    return _odd(x, f)


def hypot(a: GVar, b: GVar) -> GVar:
    """s * sqrt((a/s)^2 + (b/s)^2) with s = max(|a|, |b|) held as a constant (detach: the
    gradient is a/h, b/h), s = 1 where both are 0; inf where either is inf.  a and b
    broadcast (numpy rules)."""
    tp = _tape(a, "hypot")
    _tape(b, "hypot")
    m = tp.maximum(tp.abs(a), tp.abs(b))
    s = tp.detach(tp.where(tp.eq(m, _c(a, 0.0)), _c(a, 1.0), m))
    inf = tp.logical_or(tp.eq(tp.abs(a), _c(a, math.inf)), tp.eq(tp.abs(b), _c(a, math.inf)))
    s = tp.where(inf, _c(a, 1.0), s)
    qa, qb = tp.div(a, s), tp.div(b, s)
    h = tp.mul(s, tp.sqrt(tp.add(tp.mul(qa, qa), tp.mul(qb, qb))))
    return tp.where(inf, _c(a, math.inf), h)
