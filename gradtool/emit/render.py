"""Scalar C renderings of the op table's rules, for the emitter.

An op's scalar rule renders the C expression for its value ``tN`` and each
input's gradient contribution.  They are the op table's own expressions
(:mod:`gradtool.ops`, :mod:`gradtool.expr`) rendered in the scalar dialect:
every ``+ - * /`` and sqrt a ``GT_*`` macro from ``gradtool/csrc/gt_math.h``
(plain operators on the host, ``__d*_rn`` intrinsics under nvcc, so no
compiler can fuse a multiply-add), the transcendental functions
gt_math.h's ``gt_exp``/``gt_log``/``gt_tanh``/``gt_expm1``/``gt_log1p``/``gt_erf``/
``gt_sin``/``gt_cos``, the C twins of
:mod:`gradtool.fdlibm`.  Unary minus, comparisons and the ternary select are
exact and stay plain C.  Nothing here restates an op's arithmetic.

An f32 tape's nodes render the same rules in float code (``RULES32``: ``GT_FADD`` ...,
the binary32 operations, and ``gt_expf`` ... of ``gradtool/csrc/gt_real32.h``, the
float64 port on the widened input rounded once; every constant rounded to float32
once), numerics32's contract for one element.

Arguments are C expressions (node variables such as ``t7``, ``g7`` or
literals); every rendering parenthesises what it builds, so it can be pasted
anywhere.  A contribution of ``None`` means the op has no such input.

Only ops that act on one element at a time have a scalar rendering: every
elementwise op of the table (a broadcast is the identity on one-element
operands) and the ops whose entry gives a one-element form (``sum`` and
``mean``: ``0.0 + x`` and ``(0.0 + x) / 1.0``; ``max``: ``x``; ``log_softmax``:
its parts on a line of one).  Every other op is rejected by :func:`rule`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import GradtoolError
from ..expr import SCALAR, SCALAR32, c_double, render
from ..ops import OPS


class EmitError(GradtoolError):
    """A tape, binding or name the CUDA-C emitter cannot turn into code."""


class EmitScopeError(EmitError):
    """A node outside the emitter's scope: not one element, or an op without a scalar form."""


@dataclass(frozen=True)
class ScalarRule:
    """How one op reads in scalar C.

    forward(a, b, s) -> expr               a/b: input C expressions, s: the node's
                                           scalar operand as a C literal.
    backward(g, a, b, t, s) -> (ca, cb)    g: the node's gradient, t: its value.
    """

    forward: Callable[[str, Optional[str], str], str]
    backward: Callable[[str, str, Optional[str], str, str], tuple]


def _scalar_rule(spec, dialect=SCALAR) -> ScalarRule:
    fwd, contributions = spec.rules

    def forward(a, b, s):
        return render(fwd, dialect, {"x": a, "y": b or "0", "s": s})

    def backward(g, a, b, t, s):
        env = {"g": g, "x": a, "y": b or "0", "t": t, "s": s}
        out = [render(c, dialect, env) for c in contributions]
        return tuple(out + [None] * (2 - len(out)))

    return ScalarRule(forward, backward)


RULES: dict[str, ScalarRule] = {name: _scalar_rule(spec) for name, spec in OPS.items()
                                if spec.rules is not None}
# the same rules in float code, for the nodes of an f32 tape (SCALAR32: binary32
# operations, gt_real32.h's functions, constants rounded to float32 once)
RULES32: dict[str, ScalarRule] = {name: _scalar_rule(spec, SCALAR32)
                                  for name, spec in OPS.items() if spec.rules is not None}
SCALAR_OPS = tuple(RULES)


def rule(op: str, dtype: str = "f64") -> ScalarRule:
    """The scalar rendering of ``op`` (``dtype`` "f32": in float code), or EmitScopeError
    naming the op and the scope."""
    try:
        return (RULES32 if dtype == "f32" else RULES)[op]
    except KeyError:
        raise EmitScopeError(f"op {op!r} has no scalar C form; emit-cuda handles "
                             f"{', '.join(SCALAR_OPS)}") from None


__all__ = ["EmitError", "EmitScopeError", "ScalarRule", "RULES", "SCALAR_OPS", "rule",
           "c_double"]
