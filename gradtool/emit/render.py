"""Scalar C renderings of the op table: one small function per op.

Each op's forward rule renders the C expression for its value ``tN`` and,
right under it, its backward rule renders the C expression of each input's
gradient contribution.  They mirror :mod:`gradtool.ops` (and through it
:mod:`gradtool.numerics`) EXPRESSION BY EXPRESSION, restricted to
one-element tensors: the same separately rounded binary64 operations in
the same order, every ``+ - * /`` and sqrt spelled as a ``GT_*`` macro from
``gradtool/csrc/gt_math.h`` (plain operators on the host, ``__d*_rn``
intrinsics under nvcc, so no compiler can fuse a multiply-add), and the
transcendental functions as gt_math.h's ``gt_exp``/``gt_log``/``gt_tanh``,
the C twins of :mod:`gradtool.fdlibm`.  Unary minus, comparisons and the
ternary select are exact and stay plain C.

Arguments are C expressions (operands are node variables such as ``t7``,
``g7`` or literals) and are always parenthesised by the caller's rules
here, so a rendering can be pasted anywhere.  A contribution of ``None``
means the op gives that input nothing (it has no such input).

Only ops that act on one element at a time have a scalar rendering: every
``elementwise`` op of the table, the broadcasting binaries (whose broadcast
is the identity on one-element operands) and ``sum``/``mean`` (which pass a
one-element tensor through as ``0.0 + x`` and ``(0.0 + x) / 1.0``).  Every
other op is rejected by :func:`rule`.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import GradtoolError


class EmitError(GradtoolError):
    """A tape, binding or name the CUDA-C emitter cannot turn into code."""


class EmitScopeError(EmitError):
    """A node outside the emitter's scope: not one element, or an op without a scalar form."""


def c_double(x: float) -> str:
    """``x`` as a C expression denoting exactly that double, valid in C99 and CUDA.

    Finite values are hexadecimal floating literals (``0x1.8p+1``), which
    every compiler converts exactly.  Infinities and NaNs (which have no
    literal) are rebuilt from their bit pattern by gt_math.h's
    ``gtm_from_bits``, payload and sign included.
    """
    x = float(x)
    if math.isfinite(x):
        text = x.hex()
        return f"({text})" if text.startswith("-") else text
    bits = struct.unpack("<Q", struct.pack("<d", x))[0]
    return f"gtm_from_bits(0x{bits:016x}ULL)"


def _neg(e: str) -> str:
    return f"(-{e})"


@dataclass(frozen=True)
class ScalarRule:
    """How one op reads in scalar C.

    forward(a, b, s) -> expr               a/b: input C expressions, s: the node's
                                           scalar operand as a C literal.
    backward(g, a, b, t, s) -> (ca, cb)    g: the node's gradient, t: its value.
    """

    forward: Callable[[str, Optional[str], str], str]
    backward: Callable[[str, str, Optional[str], str, str], tuple]


RULES: dict[str, ScalarRule] = {}


def _rule(name: str, forward, backward) -> None:
    RULES[name] = ScalarRule(forward, backward)


# ── binaries: a one-element broadcast is the identity, so reduce_to_shape
#    returns the contribution itself ─────────────────────────────────────────

def _add_f(a, b, s): return f"GT_ADD({a}, {b})"
def _add_b(g, a, b, t, s): return (g, g)


def _sub_f(a, b, s): return f"GT_SUB({a}, {b})"
def _sub_b(g, a, b, t, s): return (g, _neg(g))


def _mul_f(a, b, s): return f"GT_MUL({a}, {b})"
def _mul_b(g, a, b, t, s): return (f"GT_MUL({g}, {b})", f"GT_MUL({g}, {a})")


def _div_f(a, b, s): return f"GT_DIV({a}, {b})"
def _div_b(g, a, b, t, s):
    # dL/db = -((g * t) / b): the negation is exact, the rest rounds twice
    return (f"GT_DIV({g}, {b})", _neg(f"GT_DIV(GT_MUL({g}, {t}), {b})"))


# ── unaries ──────────────────────────────────────────────────────────────────

def _neg_f(a, b, s): return _neg(a)
def _neg_b(g, a, b, t, s): return (_neg(g), None)


def _adds_f(a, b, s): return f"GT_ADD({a}, {s})"
def _adds_b(g, a, b, t, s): return (g, None)


def _muls_f(a, b, s): return f"GT_MUL({a}, {s})"
def _muls_b(g, a, b, t, s): return (f"GT_MUL({g}, {s})", None)


def _relu_f(a, b, s):
    # numerics.relu: x if not (x <= 0) else +0.0 -- NaN passes, -0.0 becomes +0.0
    return f"(({a} <= 0.0) ? 0.0 : {a})"
def _relu_b(g, a, b, t, s):
    # ops._relu_b: g where x > 0, else 0 (also at 0 and at NaN)
    return (f"(({a} > 0.0) ? {g} : 0.0)", None)


def _sigmoid_f(a, b, s):
    # numerics.sigmoid: 1.0 / (1.0 + exp(-x))
    return f"GT_DIV(1.0, GT_ADD(1.0, gt_exp({_neg(a)})))"
def _sigmoid_b(g, a, b, t, s): return (f"GT_MUL(GT_MUL({g}, {t}), GT_SUB(1.0, {t}))", None)


def _tanh_f(a, b, s): return f"gt_tanh({a})"
def _tanh_b(g, a, b, t, s): return (f"GT_MUL({g}, GT_SUB(1.0, GT_MUL({t}, {t})))", None)


def _exp_f(a, b, s): return f"gt_exp({a})"
def _exp_b(g, a, b, t, s): return (f"GT_MUL({g}, {t})", None)


def _log_f(a, b, s): return f"gt_log({a})"
def _log_b(g, a, b, t, s): return (f"GT_DIV({g}, {a})", None)


def _sqrt_f(a, b, s): return f"GT_SQRT({a})"
def _sqrt_b(g, a, b, t, s): return (f"GT_DIV({g}, GT_MUL(2.0, {t}))", None)


# ── reductions of a one-element tensor ───────────────────────────────────────

def _sum_f(a, b, s):
    # numerics.serial_sum: acc = 0.0; acc = acc + x
    return f"GT_ADD(0.0, {a})"
def _sum_b(g, a, b, t, s): return (g, None)


def _mean_f(a, b, s):
    # numerics.serial_mean: serial_sum(x) / n with n = 1 (a division, not a copy)
    return f"GT_DIV(GT_ADD(0.0, {a}), 1.0)"
def _mean_b(g, a, b, t, s): return (f"GT_DIV({g}, 1.0)", None)


_rule("add", _add_f, _add_b)
_rule("sub", _sub_f, _sub_b)
_rule("mul", _mul_f, _mul_b)
_rule("div", _div_f, _div_b)
_rule("neg", _neg_f, _neg_b)
_rule("adds", _adds_f, _adds_b)
_rule("muls", _muls_f, _muls_b)
_rule("relu", _relu_f, _relu_b)
_rule("sigmoid", _sigmoid_f, _sigmoid_b)
_rule("tanh", _tanh_f, _tanh_b)
_rule("exp", _exp_f, _exp_b)
_rule("log", _log_f, _log_b)
_rule("sqrt", _sqrt_f, _sqrt_b)
_rule("sum", _sum_f, _sum_b)
_rule("mean", _mean_f, _mean_b)

SCALAR_OPS = tuple(RULES)


def rule(op: str) -> ScalarRule:
    """The scalar rendering of ``op``, or EmitScopeError naming the op and the scope."""
    try:
        return RULES[op]
    except KeyError:
        raise EmitScopeError(f"op {op!r} has no scalar C form; emit-cuda handles "
                             f"{', '.join(SCALAR_OPS)}") from None
