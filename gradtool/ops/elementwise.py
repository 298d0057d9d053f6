"""The table's elementwise ops: one expression for the forward rule and one per input's
gradient."""

from __future__ import annotations

import math

from .. import numerics as nx
from ..expr import (G, S, T, X, Y, Const, Expr, abs_, atan, atan2, ceil, compile_numpy, cos, eq,
                    erf, erfc, exp, expm1, floor, fmod, log, log1p, rint, select, sin, sqrt, tanh,
                    trunc)
from .spec import OpSpec, _register
from .shapes import _same_shape, broadcast_shape


# ── numpy rules from expressions (elementwise ops) ─────────────────────────

def _unary_rules(fwd: Expr, bwd: Expr):
    f = compile_numpy(fwd, ("x", "s"))
    c = compile_numpy(bwd, ("g", "x", "t", "s"))

    def forward(a, b, s, at):
        return f(a, s)

    def backward(g, a, b, t, s, at, na, nb):
        return (c(g, a, t, s), None)

    return forward, backward


def _binary_rules(fwd: Expr, bwd_a: Expr, bwd_b: Expr):
    f = compile_numpy(fwd, ("x", "y"))
    ca = compile_numpy(bwd_a, ("g", "x", "y", "t"))
    cb = compile_numpy(bwd_b, ("g", "x", "y", "t"))
    red = nx.reduce_to_shape

    def forward(a, b, s, at):
        return f(a, b)

    def backward(g, a, b, t, s, at, na, nb):
        # each contribution is out-shaped, then summed down to its input's shape
        return (red(ca(g, a, b, t), a.shape) if na else None,
                red(cb(g, a, b, t), b.shape) if nb else None)

    return forward, backward


def unary(name: str, doc: str, fwd: Expr, bwd: Expr, **extra) -> None:
    """An elementwise one-input op (same shape): ``out = fwd``, ``ga += bwd``."""
    forward, backward = _unary_rules(fwd, bwd)
    _register(OpSpec(name, "unary", 1, doc, _same_shape, forward, backward, fwd=fwd,
                     bwd=(bwd,), **extra))


def binary(name: str, doc: str, fwd: Expr, bwd_a: Expr, bwd_b: Expr, **extra) -> None:
    """An elementwise two-input op with numpy broadcasting; each contribution is summed
    down to its input's shape in :func:`numerics.reduce_to_shape`'s order."""
    forward, backward = _binary_rules(fwd, bwd_a, bwd_b)
    _register(OpSpec(name, "binary", 2, doc, broadcast_shape, forward, backward, fwd=fwd,
                     bwd=(bwd_a, bwd_b), **extra))


# ── the table: elementwise ops ─────────────────────────────────────────────

_register(OpSpec("param", "leaf", 0, "a trained leaf (requires grad)"))
_register(OpSpec("const", "leaf", 0, "a constant leaf; a named const is an input slot"))

binary("add", "a + b", X + Y, G, G, integral="inputs")
binary("sub", "a - b", X - Y, G, -G, integral="inputs")
binary("mul", "a * b", X * Y, G * Y, G * X, integral="inputs")
# dL/db = -g * t / b, rounded as -((g * t) / b)
binary("div", "a / b", X / Y, G / Y, -((G * T) / Y))

unary("neg", "-a", -X, -G, integral="inputs")
unary("adds", "a + s (a Python number)", X + S, G, scalar_operand=True, integral="a_whole_s")
unary("muls", "a * s (a Python number)", X * S, G * S, scalar_operand=True,
      integral="a_whole_s")
# x if not (x <= 0) else +0.0: NaN passes through, -0.0 becomes +0.0; the gradient is
# g where x > 0, else 0 (also at 0 and at NaN)
unary("relu", "max(a, 0)", select(X <= 0.0, 0.0, X), select(X > 0.0, G, 0.0))
# 1/(1+exp(-x)): -x and 0-x agree except at +0.0, where exp gives 1.0 either way
unary("sigmoid", "1 / (1 + exp(-a))", 1.0 / (1.0 + exp(-X)), (G * T) * (1.0 - T))
unary("tanh", "tanh(a)", tanh(X), G * (1.0 - T * T))
unary("exp", "exp(a)", exp(X), G * T)
unary("log", "natural log", log(X), G / X, domain="positive")
unary("sqrt", "square root (correctly rounded)", sqrt(X), G / (2.0 * T), domain="positive")
# |x| (exact; abs(-0.0) = +0.0); the gradient is g * sign(x): g where x > 0, -g where
# x < 0, +0.0 elsewhere (at +-0.0, and at a NaN, as relu and PyTorch do)
unary("abs", "|a|", abs_(X), select(X > 0.0, G, select(X < 0.0, -G, 0.0)))
# a where a >= b, b where a < b, and NaN when either is NaN (neither comparison holds;
# x + y is then a NaN); ties (+0.0 against -0.0 too) give a.  The gradient goes to a
# where a >= b, else to b: on a tie all of it to a; when either is NaN all of it to b
binary("maximum", "elementwise max, numpy broadcasting; NaN wins",
       select(X >= Y, X, select(X < Y, Y, X + Y)), select(X >= Y, G, 0.0),
       select(X >= Y, 0.0, G), integral="inputs")
# erf: fdlibm's s_erf.c (gradtool/fdlibm/_erf.py, C twin gt_erf), within 1 ulp.  Its
# gradient is PyTorch's 2/sqrt(pi) * exp(-(x*x)) * g, rounded in that order, with
# TWO_OVER_SQRT_PI = 2.0 / sqrt(pi) rounded once (0x1.20dd750429b6dp+0, M_2_SQRTPI)
TWO_OVER_SQRT_PI = float.fromhex("0x1.20dd750429b6dp+0")
unary("erf", "the error function (fdlibm s_erf.c, within 1 ulp)", erf(X),
      (TWO_OVER_SQRT_PI * exp(-(X * X))) * G)
# erfc: fdlibm's own erfc from s_erf.c (gradtool/fdlibm/_erfc.py, C twin gt_erfc), not
# 1 - erf: it keeps its relative accuracy for large x (fdlibm's, up to ~3 ulp).  Its
# gradient is PyTorch's -2/sqrt(pi) * exp(-(x*x)) * g, rounded as erf's
unary("erfc", "the complementary error function 1 - erf(a) (fdlibm s_erf.c)", erfc(X),
      (-TWO_OVER_SQRT_PI * exp(-(X * X))) * G)
# atan: fdlibm's s_atan.c (_atan.py, gt_atan), within 1 ulp; the gradient PyTorch's
# g / (x*x + 1)
unary("atan", "arctangent (fdlibm s_atan.c, within 1 ulp)", atan(X), G / (X * X + 1.0))
# atan2(a, b): the angle of the point (b, a), fdlibm's e_atan2.c (_atan2.py, gt_atan2) with
# its signed zeros and infinities; numpy broadcasting.  The gradients are PyTorch's:
# r = 1 / (a*a + b*b), except r = 0 where a*a + b*b == 0 (a = b = 0, or both so small
# that the squares underflow): a gets (g * b) * r, b gets (g * -a) * r, so both are zero
# (their signs PyTorch's) at the origin, where atan2 has no derivative
_R = select(eq(X * X + Y * Y, 0.0), 0.0, 1.0 / (X * X + Y * Y))
binary("atan2", "the angle of the point (b, a) in [-pi, pi], numpy broadcasting "
       "(fdlibm e_atan2.c)", atan2(X, Y), (G * Y) * _R, (G * (-X)) * _R)
del _R
# sin, cos: fdlibm's s_sin.c/s_cos.c with its k_sin/k_cos kernels and its exact pi/2
# reduction (e_rem_pio2.c, k_rem_pio2.c) for every finite x; inf and NaN give NaN.
# Gradients as PyTorch's: g * cos(x) and g * -sin(x)
unary("sin", "sine (fdlibm s_sin.c, within 1 ulp)", sin(X), G * cos(X))
unary("cos", "cosine (fdlibm s_cos.c, within 1 ulp)", cos(X), G * (-sin(X)))
# expm1 (fdlibm s_expm1.c) and log1p (fdlibm s_log1p.c); gradients g * (t + 1) and
# g / (x + 1), as PyTorch's
unary("expm1", "exp(a) - 1 (fdlibm s_expm1.c)", expm1(X), G * (T + 1.0))
unary("log1p", "log(1 + a) (fdlibm s_log1p.c)", log1p(X), G / (X + 1.0), domain="positive")
# rsqrt: 1.0 / sqrt(x), two roundings, as PyTorch's CPU float64; the gradient is PyTorch's
# -0.5 * g * t^3, rounded as (-0.5 * g) * ((t * t) * t)
unary("rsqrt", "1 / sqrt(a) (two roundings)", 1.0 / sqrt(X), (-0.5 * G) * ((T * T) * T),
      domain="positive")
# floor, ceil, trunc and round (half to even, torch.round's): exact, -0.0 kept (floor(-0.0),
# round(-0.4) give -0.0, as torch), a NaN or an infinity passes through.  Their derivative
# is zero wherever it exists, and torch's gradient is zeros: like a comparison the node
# carries none (the backward walk stops there), which gives every param the same gradient
# as torch's.  Their values are whole numbers whatever the input (or an infinity or a NaN,
# which no ids input accepts: every computed id is checked where it is used), so they are
# integer-valued always and may feed ids: bucketing, ``(torch.rand(n) * T).long()``
for _name, _rule, _doc in (("floor", floor(X), "the largest integer <= a (exact)"),
                           ("ceil", ceil(X), "the smallest integer >= a (exact)"),
                           ("trunc", trunc(X), "a rounded toward zero (exact)"),
                           ("round", rint(X), "a rounded to the nearest integer, ties to even "
                                              "(exact)")):
    unary(_name, _doc + "; no gradient", _rule, Const(0.0), grad_inputs=(), integral="always")
del _name, _rule, _doc
# fmod and remainder by a number s (torch.fmod, and torch.remainder's CPU rule: fmod, then
# + s where the result is nonzero and its sign differs from s's): exact but for that one
# add; the gradient is g (the derivative in a, 1 between the jumps)
_F = fmod(X, S)
unary("fmods", "fmod(a, s): a - trunc(a / s) * s, exactly (C's fmod)", _F, G,
      scalar_operand=True)
unary("mods", "a mod s with the sign of s (torch.remainder: fmod, + s where the signs "
      "differ)", select(eq(_F, 0.0), _F, select(S < 0.0, select(_F < 0.0, _F, _F + S),
                                                 select(_F < 0.0, _F + S, _F))), G,
      scalar_operand=True)
del _F


def _pow_rule(x: Expr, e: Expr) -> Expr:
    """x ** e for a scalar e (the scalar operand s, or s - 1 in the gradient), as ONE
    expression: exact special cases where PyTorch's CPU pow has them, else
    exp(e * log(|x|)) with the sign of an odd integer power of a negative x.

    e == 0: 1.0 (also for a NaN x);  e == 1: x;  e == 2: x*x;  e == 3: (x*x)*x;
    e == 4: (x*x)*(x*x);  e == -1: 1/x;  e == -2: 1/(x*x);  e == 0.5: sqrt(x);
    e == -0.5: 1/sqrt(x);  otherwise p = exp(e * log(|x|)), and for a negative x (-0.0
    included: 1/x < 0): -p when e is an odd integer, else p, except NaN for a finite x < 0
    and an e that is not an integer (C's pow).  e is an integer when floor(|e|) == |e|
    (an infinity too); odd when moreover h = |e| * 0.5 (exact) is not an integer, which
    holds for no |e| >= 2^53 (2^24 in float32), all of them even.  floor is exact in
    every dtype, so the one rule serves float64 and float32."""
    ae = abs_(e)
    is_int = select(eq(floor(ae), ae), 1.0, 0.0)
    h = ae * 0.5
    is_odd = select(eq(is_int, 0.0), 0.0, select(eq(floor(h), h), 0.0, 1.0))
    p = exp(e * log(abs_(x)))
    odd_sign = select(eq(is_odd, 0.0), p, -p)
    finite_neg = select(eq(is_int, 0.0), math.nan, odd_sign)
    general = select(x < 0.0, select(x > -math.inf, finite_neg, odd_sign),
                     select(1.0 / x < 0.0, odd_sign, p))
    xx = x * x
    cases = ((0.0, 1.0), (1.0, x), (2.0, xx), (3.0, xx * x), (4.0, xx * xx), (-1.0, 1.0 / x),
             (-2.0, 1.0 / xx), (0.5, sqrt(x)), (-0.5, 1.0 / sqrt(x)))
    out = general
    for value, rule in reversed(cases):
        out = select(eq(e, value), rule, out)
    return out


# pows: a ** s for a Python float s.  Error: exact cases as listed in _pow_rule (sqrt
# correctly rounded, the products and quotients within 2 roundings); the general case
# within about (|s * log|x|| + 2) ulps (log and exp within 1 ulp each, the rounding of
# s * log|x| scaled by the exponent).  The gradient is PyTorch's s * x**(s - 1) * g,
# rounded as g * (s * x**(s - 1)), and +0.0 when s == 0; at x = 0 it follows x**(s - 1)
# (inf for s < 1, 0 for s > 1, 1 for s == 1), as PyTorch's does
unary("pows", "a ** s (a Python number): exact for s in {0, 1, 2, 3, 4, -1, -2, 0.5, -0.5}, "
      "else exp(s * log|a|) with the sign of an odd integer power", _pow_rule(X, S),
      select(eq(S, 0.0), 0.0, G * (S * _pow_rule(X, S - 1.0))), scalar_operand=True,
      domain="positive")
# pow: a ** b elementwise (torch.pow of two tensors), numpy broadcasting: pows' rule with
# the exponent an input, the same special cases and error.  The gradients are PyTorch's:
# to a, g * (b * a**(b - 1)) and +0.0 where b == 0; to b, g * (t * log(a)), where log is
# fdlibm's (NaN for a < 0, as torch's), and g * 0.0 where a == 0 and b >= 0
binary("pow", "a ** b (numpy broadcasting): pows' rule with the exponent an input",
       _pow_rule(X, Y), select(eq(Y, 0.0), 0.0, G * (Y * _pow_rule(X, Y - 1.0))),
       G * select(eq(X, 0.0), select(Y >= 0.0, 0.0, T * log(X)), T * log(X)),
       domain="positive")
# minimum mirrors maximum: a where a <= b, b where a > b, NaN when either is NaN; ties
# (+0.0 against -0.0 too) give a.  The gradient goes to a where a <= b, else to b: on a tie
# all of it to a; when either is NaN all of it to b
binary("minimum", "elementwise min, numpy broadcasting; NaN wins",
       select(X <= Y, X, select(X > Y, Y, X + Y)), select(X <= Y, G, 0.0),
       select(X <= Y, 0.0, G), integral="inputs")
# clamp_min / clamp_max: torch.clamp's halves (Tape.clamp records them): s where x < s
# (resp. x > s), else x (so a NaN x stays NaN, and a tie keeps x); the gradient passes
# where lo <= x (resp. x <= hi), inclusive like PyTorch's, +0.0 elsewhere and at a NaN
unary("clamp_min", "max(a, s) for a Python number s, NaN kept (torch.clamp's min)",
      select(X < S, S, X), select(X >= S, G, 0.0), scalar_operand=True, integral="a_whole_s")
unary("clamp_max", "min(a, s) for a Python number s, NaN kept (torch.clamp's max)",
      select(X > S, S, X), select(X <= S, G, 0.0), scalar_operand=True, integral="a_whole_s")
