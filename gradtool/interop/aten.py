"""The one mapping table from ATen ops to gradtool recordings.

Each entry maps one ATen OpOverload, by its name (``aten.addmm.default``), to a
small function that records it through the :class:`~gradtool.tape.Tape` (the
importer's recorder :class:`~gradtool.interop.torch.Recorder` is only the
environment: argument lifting and shapes; it records nothing itself).  The
importer looks every graph node up here once, in its unsupported-op pass, and
again when recording; ``docs/torch.md``'s supported-op table is generated from
this table (``python -m gradtool.codegen``).

An entry's function is called as ``fn(r, node, *args, **kwargs)`` with the
node's arguments where every graph value is replaced by what it became: a
:class:`~gradtool.tape.GVar` (on the tape), a ``torch.Tensor`` (a folded
constant, float64/int64/bool) or a Python value.  It returns a GVar (or a
tuple of them for multi-output ops).  ``needs`` names the Tape methods the
entry requires: an op whose needs this build lacks is reported as unsupported
(by name, with the missing method), never approximated.

No torch import at module level: the table is plain data (and codegen reads it
on machines without torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import GradtoolError


class Unsupported(GradtoolError):
    """An entry cannot record this particular call (an argument it does not handle)."""


@dataclass(frozen=True)
class Entry:
    name: str                 # aten.add.Tensor
    fn: Callable
    needs: tuple              # Tape methods (or "nn.<fn>") the entry requires
    doc: str                  # how it is recorded (docs/torch.md)


ATEN: dict[str, Entry] = {}


def aten(*names, needs=(), doc=""):
    def register(fn):
        for name in names:
            if name in ATEN:
                raise ValueError(f"{name} is mapped twice")
            ATEN[name] = Entry(name, fn, tuple(needs), doc)
        return fn
    return register


def missing_needs(entry: Entry) -> list:
    """The Tape methods (or nn functions) this build lacks for ``entry``."""
    from .. import nn
    from ..tape import Tape
    out = []
    for need in entry.needs:
        if need.startswith("nn."):
            if not hasattr(nn, need[3:]):
                out.append(f"gradtool.{need}")
        elif not hasattr(Tape, need):
            out.append(f"Tape.{need}")
    return out


def has(method: str) -> bool:
    from ..tape import Tape
    return hasattr(Tape, method)


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# ── elementwise arithmetic ─────────────────────────────────────────────────

@aten("aten.add.Tensor", "aten.add.Scalar", doc="add; a number operand: adds")
def _add(r, node, a, b, alpha=1):
    if alpha != 1:
        b = r.scale(b, alpha)
    if _num(b):
        return r.tp.adds(r.f(a), float(b))
    if _num(a):
        return r.tp.adds(r.f(b), float(a))
    return r.tp.add(r.f(a), r.f(b))


@aten("aten.sub.Tensor", "aten.sub.Scalar", doc="sub; a number operand: adds (of -b, exact)")
def _sub(r, node, a, b, alpha=1):
    if alpha != 1:
        b = r.scale(b, alpha)
    if _num(b):
        return r.tp.adds(r.f(a), -float(b))
    if _num(a):
        return r.tp.adds(r.tp.neg(r.f(b)), float(a))
    return r.tp.sub(r.f(a), r.f(b))


@aten("aten.rsub.Scalar", "aten.rsub.Tensor", doc="b - a, as sub")
def _rsub(r, node, a, b, alpha=1):
    return _sub(r, node, b, a, alpha)


@aten("aten.mul.Tensor", "aten.mul.Scalar", doc="mul; a number operand: muls")
def _mul(r, node, a, b):
    if _num(b):
        return r.tp.muls(r.f(a), float(b))
    if _num(a):
        return r.tp.muls(r.f(b), float(a))
    return r.tp.mul(r.f(a), r.f(b))


@aten("aten.div.Tensor", "aten.div.Scalar",
      doc="div; a number operand becomes a one-element const (x / c, never x * (1/c))")
def _div(r, node, a, b):
    return r.tp.div(r.f(a), r.f(b))


@aten("aten.neg.default", doc="neg")
def _neg(r, node, a):
    return r.tp.neg(r.f(a))


@aten("aten.reciprocal.default", doc="div(1, a)")
def _reciprocal(r, node, a):
    return r.tp.div(r.f(1.0), r.f(a))


def _unary(aten_name, method, note=None):
    @aten(aten_name, needs=(method,), doc=note or method)
    def fn(r, node, a):
        return getattr(r.tp, method)(r.f(a))
    return fn


for _name, _method in [("relu", "relu"), ("sigmoid", "sigmoid"), ("tanh", "tanh"),
                       ("exp", "exp"), ("log", "log"), ("sqrt", "sqrt"), ("abs", "abs"),
                       ("erf", "erf"), ("sin", "sin"), ("cos", "cos"), ("expm1", "expm1"),
                       ("log1p", "log1p"), ("floor", "floor"), ("ceil", "ceil"),
                       ("trunc", "trunc"), ("round", "round"), ("erfc", "erfc"),
                       ("atan", "atan")]:
    _unary(f"aten.{_name}.default", _method)


# ── elementwise math torch has and the table lacks, from the table's own functions ──
#
# Each within a few ulps of the correctly rounded value (torch's float64 within 1e-12
# relative, the tests), with fdlibm's argument ranges so that nothing overflows or loses
# accuracy before the result does; the gradients by differentiating the recording.
# Piecewise rules evaluate every piece on an input clamped into that piece's range (a
# `where` of the input first), so a piece that is not taken is finite and passes a zero
# gradient, never 0 * inf.

LN2, LN10 = math.log(2.0), math.log(10.0)
_BIG = 2.0 ** 28                     # fdlibm's asinh/acosh: beyond it, log(x) + ln 2


def _pieces(r, mask, a, inside, outside):
    """``a`` where ``mask``, else ``inside`` (a number in the piece's range), and the
    other piece's input likewise: (a_in, a_out)."""
    tp = r.tp
    return tp.where(mask, a, r.f(inside)), tp.where(mask, r.f(outside), a)


def _odd(r, a, f):
    """An odd function from its rule ``f`` on x >= 0: f(a) where a >= 0 (-0.0 included,
    whose sign f keeps), else -f(-a); NaN goes to the negative side and stays NaN."""
    tp = r.tp
    pos = tp.ge(a, r.f(0.0))
    a_pos, a_neg = _pieces(r, pos, a, 0.0, 0.0)
    return tp.where(pos, f(a_pos), tp.neg(f(tp.neg(a_neg))))


@aten("aten.log2.default", "aten.log10.default", needs=("log",),
      doc="log(a) / ln 2 (log10: / ln 10), the constant rounded once")
def _log_base(r, node, a):
    base = LN2 if str(node.target).startswith("aten.log2") else LN10
    return r.tp.div(r.tp.log(r.f(a)), r.f(base))


@aten("aten.exp2.default", needs=("exp",),
      doc="exp(a * ln 2): within about (|a| + 2) ulps")
def _exp2(r, node, a):
    return r.tp.exp(r.tp.muls(r.f(a), LN2))


@aten("aten.tan.default", needs=("sin", "cos"), doc="sin(a) / cos(a)")
def _tan(r, node, a):
    a = r.f(a)
    return r.tp.div(r.tp.sin(a), r.tp.cos(a))


@aten("aten.sinh.default", needs=("expm1", "exp", "where"),
      doc="odd; for 0 <= x < 22, e = expm1(x), (e + e / (e + 1)) * 0.5 (fdlibm's s_sinh.c); "
          "beyond, exp(x - ln 2): finite up to 710.47 as sinh is, and so is its gradient")
def _sinh(r, node, a):
    tp = r.tp
    return _odd(r, r.f(a), lambda x: _hyperbolic(
        r, x, lambda e: tp.muls(tp.add(e, tp.div(e, tp.adds(e, 1.0))), 0.5)))


def _hyperbolic(r, x, near):
    """sinh's or cosh's rule for x >= 0: ``near(expm1(x))`` below 22, ``exp(x - ln 2)``
    from there (finite up to 710.47, as the functions and their gradients are)."""
    tp = r.tp
    small = tp.lt(x, r.f(22.0))
    x_s, x_b = _pieces(r, small, x, 0.0, 22.0)
    return tp.where(small, near(tp.expm1(x_s)), tp.exp(tp.adds(x_b, -LN2)))


@aten("aten.cosh.default", needs=("expm1", "exp", "abs", "where"),
      doc="x = |a|; below 22, 1 + e*e / (2 * (1 + e)) with e = expm1(x) (no cancellation, "
          "in the value or its gradient near 0); beyond, exp(x - ln 2)")
def _cosh(r, node, a):
    tp = r.tp
    x = tp.abs(r.f(a))                       # even: |a|'s zero gradient at 0 is cosh's
    return _hyperbolic(r, x, lambda e: tp.adds(
        tp.div(tp.mul(e, e), tp.muls(tp.adds(e, 1.0), 2.0)), 1.0))


@aten("aten.asinh.default", needs=("log1p", "log", "sqrt", "where"),
      doc="odd; x below 2^-28; below 2^28, log1p(x + x*x / (1 + sqrt(1 + x*x))); beyond, "
          "log(x) + ln 2 (fdlibm's s_asinh.c)")
def _asinh(r, node, a):
    tp = r.tp

    def f(x):
        small = tp.lt(x, r.f(_BIG))
        x_s, x_b = _pieces(r, small, x, 0.0, _BIG)
        xx = tp.mul(x_s, x_s)
        near = tp.log1p(tp.add(x_s, tp.div(xx, tp.adds(tp.sqrt(tp.adds(xx, 1.0)), 1.0))))
        near = tp.where(tp.lt(x, r.f(2.0 ** -28)), x, near)     # x itself (and -0.0's sign)
        return tp.where(small, near, tp.adds(tp.log(x_b), LN2))
    return _odd(r, r.f(a), f)


@aten("aten.acosh.default", needs=("log1p", "log", "sqrt", "where"),
      doc="for x < 2^28, t = x - 1, log1p(t + sqrt(t) * sqrt(t + 2)) (NaN below 1; the "
          "gradient inf at 1, as torch's); beyond, log(x) + ln 2 (fdlibm's e_acosh.c)")
def _acosh(r, node, a):
    tp = r.tp
    x = r.f(a)
    small = tp.logical_not(tp.ge(x, r.f(_BIG)))          # NaN on the near side
    x_s, x_b = _pieces(r, small, x, 1.0, _BIG)
    t = tp.adds(x_s, -1.0)
    near = tp.log1p(tp.add(t, tp.mul(tp.sqrt(t), tp.sqrt(tp.adds(t, 2.0)))))
    return tp.where(small, near, tp.adds(tp.log(x_b), LN2))


@aten("aten.atanh.default", needs=("log1p", "where"),
      doc="odd; for 0 <= x, 0.5 * log1p(2x / (1 - x)) (1 - x exact near 1; fdlibm's "
          "e_atanh.c form)")
def _atanh(r, node, a):
    tp = r.tp

    def f(x):
        return tp.muls(tp.log1p(tp.div(tp.muls(x, 2.0), tp.sub(r.f(1.0), x))), 0.5)
    return _odd(r, r.f(a), f)


@aten("aten.hypot.default", needs=("maximum", "abs", "detach", "sqrt", "where"),
      doc="s * sqrt((a/s)^2 + (b/s)^2) with s = max(|a|, |b|) held as a constant "
          "(detach: the gradient is a/h, b/h), 1 where both are 0; inf where either is inf")
def _hypot(r, node, a, b):
    tp = r.tp
    a, b = r.f(a), r.f(b)
    m = tp.maximum(tp.abs(a), tp.abs(b))
    s = tp.detach(tp.where(tp.eq(m, r.f(0.0)), r.f(1.0), m))
    inf = tp.logical_or(tp.eq(tp.abs(a), r.f(math.inf)), tp.eq(tp.abs(b), r.f(math.inf)))
    s = tp.where(inf, r.f(1.0), s)
    qa, qb = tp.div(a, s), tp.div(b, s)
    h = tp.mul(s, tp.sqrt(tp.add(tp.mul(qa, qa), tp.mul(qb, qb))))
    return tp.where(inf, r.f(math.inf), h)


@aten("aten.asin.default", "aten.acos.default", needs=("atan2", "sqrt"),
      doc="asin(a) = atan2(a, c), acos(a) = atan2(c, a) with c = sqrt(1 - a) * sqrt(1 + a) "
          "(NaN outside [-1, 1]; 1 - a exact near 1; the gradient inf at +-1, as torch's)")
def _asin_acos(r, node, a):
    tp = r.tp
    a = r.f(a)
    c = tp.mul(tp.sqrt(tp.sub(r.f(1.0), a)), tp.sqrt(tp.adds(a, 1.0)))
    return tp.atan2(a, c) if str(node.target).startswith("aten.asin") else tp.atan2(c, a)


@aten("aten.atan2.default", needs=("atan2",),
      doc="atan2 (fdlibm's; numpy broadcasting; torch.arctan2 exports as this)")
def _atan2(r, node, a, b):
    return r.tp.atan2(r.f(a), r.f(b))


@aten("aten.fmod.Scalar", "aten.fmod.Tensor", "aten.remainder.Scalar",
      "aten.remainder.Tensor", needs=("fmods", "mods"),
      doc="by a number (or a one-element constant): fmods, or mods (torch.remainder's "
          "rule); by a tensor refused")
def _fmod(r, node, a, b):
    b = r.scalar_const(b)
    if not _num(b):
        raise Unsupported("fmod or remainder by a tensor (only by a number)")
    op = r.tp.fmods if str(node.target).startswith("aten.fmod") else r.tp.mods
    return op(r.f(a), float(b))


@aten("aten.rsqrt.default", doc="rsqrt (the op where present, else div(1, sqrt(a)): the "
                                "same two roundings)")
def _rsqrt(r, node, a):
    if has("rsqrt"):
        return r.tp.rsqrt(r.f(a))
    return r.tp.div(r.f(1.0), r.tp.sqrt(r.f(a)))


@aten("aten.pow.Tensor_Scalar",
      doc="exponent 1: a; 2: a*a; 0.5: sqrt; -0.5: rsqrt; -1: 1/a; 3: a*a*a (torch's CPU "
          "special cases); any other: pows")
def _pow(r, node, a, e):
    if not _num(e):
        raise Unsupported("pow with a tensor exponent")
    a, e = r.f(a), float(e)
    tp = r.tp
    if e == 1.0:
        return a
    if e == 2.0:
        return tp.mul(a, a)
    if e == 3.0:
        return tp.mul(tp.mul(a, a), a)
    if e == 0.5:
        return tp.sqrt(a)
    if e == -0.5:
        return _rsqrt(r, node, a)
    if e == -1.0:
        return tp.div(r.f(1.0), a)
    if not has("pows"):
        raise Unsupported(f"pow by {e!r} needs Tape.pows")
    return tp.pows(a, e)


@aten("aten.pow.Tensor_Tensor", "aten.pow.Scalar", needs=("pow",),
      doc="pow (a ** b elementwise, broadcasting: pows' rule with the exponent an input; "
          "a number base for pow.Scalar)")
def _pow_tensor(r, node, a, b):
    if _num(b) and str(node.target) == "aten.pow.Tensor_Tensor":
        return _pow(r, node, a, b)
    return r.tp.pow(r.f(a), r.f(b))


@aten("aten.silu.default", doc="gradtool.nn.silu: a * sigmoid(a)")
def _silu(r, node, a):
    from .. import nn
    return nn.silu(r.f(a))


@aten("aten.gelu.default", doc="gradtool.nn.gelu (approximate='tanh'; 'none' needs erf)")
def _gelu(r, node, a, approximate="none"):
    import inspect
    from .. import nn
    takes = "approximate" in inspect.signature(nn.gelu).parameters
    if approximate == "tanh":
        return nn.gelu(r.f(a), approximate="tanh") if takes else nn.gelu(r.f(a))
    if not takes:
        raise Unsupported("exact gelu (approximate='none') needs gradtool.nn.gelu(x, "
                          "approximate='none')")
    return nn.gelu(r.f(a), approximate=approximate)


@aten("aten.maximum.default", needs=("maximum",), doc="maximum")
def _maximum(r, node, a, b):
    return r.tp.maximum(r.f(a), r.f(b))


@aten("aten.minimum.default", needs=("minimum",), doc="minimum")
def _minimum(r, node, a, b):
    return r.tp.minimum(r.f(a), r.f(b))


@aten("aten.fmax.default", "aten.fmin.default", needs=("maximum", "minimum", "ne", "where"),
      doc="maximum (minimum) where neither is NaN; the other operand where one is (NaN "
          "only where both are), as C's fmax: where(b != b, a, where(a != a, b, maximum(a, "
          "b))); the gradient torch's (to a where a wins or b is NaN)")
def _fmax(r, node, a, b):
    tp = r.tp
    a, b = r.f(a), r.f(b)
    pick = tp.maximum if str(node.target).startswith("aten.fmax") else tp.minimum
    return tp.where(tp.ne(b, b), a, tp.where(tp.ne(a, a), b, pick(a, b)))


@aten("aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default",
      "aten.clamp.Tensor", "aten.clamp_min.Tensor", "aten.clamp_max.Tensor", needs=("clamp",),
      doc="clamp by numbers (or one-element constants); by tensors minimum(maximum(a, lo), "
          "hi), broadcasting: the gradient to a where lo <= a <= hi, to lo where a < lo, to "
          "hi where the result is hi, as torch's (but for lo == hi > a, where torch gives "
          "it to neither, and at a NaN)")
def _clamp(r, node, a, lo=None, hi=None):
    if str(node.target).startswith("aten.clamp_max"):
        lo, hi = None, lo
    lo, hi = (r.scalar_const(b) for b in (lo, hi))
    if all(bound is None or _num(bound) for bound in (lo, hi)):
        return r.tp.clamp(r.f(a), lo=None if lo is None else float(lo),
                          hi=None if hi is None else float(hi))
    v = r.f(a)
    if lo is not None:
        v = r.tp.maximum(v, r.f(lo))
    if hi is not None:
        v = r.tp.minimum(v, r.f(hi))
    return r.expand(v, r.shape(node))


# ── comparisons, masks, where ──────────────────────────────────────────────

def _compare(aten_names, method):
    @aten(*aten_names, needs=(method,), doc=f"{method} (a mask of 0.0/1.0)")
    def fn(r, node, a, b):
        a, b = r.operands(a, b)
        return getattr(r.tp, method)(a, b)
    return fn


for _m in ("eq", "ne", "lt", "le", "gt", "ge"):
    _compare((f"aten.{_m}.Tensor", f"aten.{_m}.Scalar"), _m)


@aten("aten.logical_and.default", needs=("logical_and",), doc="logical_and")
def _land(r, node, a, b):
    return r.tp.logical_and(r.mask(a), r.mask(b))


@aten("aten.logical_or.default", needs=("logical_or",), doc="logical_or")
def _lor(r, node, a, b):
    return r.tp.logical_or(r.mask(a), r.mask(b))


@aten("aten.logical_not.default", needs=("logical_not",), doc="logical_not")
def _lnot(r, node, a):
    return r.tp.logical_not(r.mask(a))


@aten("aten.bitwise_not.default", needs=("logical_not",), doc="logical_not (bool only)")
def _bnot(r, node, a):
    if r.torch_dtype(node) != "bool":
        raise Unsupported("bitwise_not of integers")
    return r.tp.logical_not(r.mask(a))


def _bitwise(names, method, how):
    @aten(*names, needs=(method,), doc=f"{how} (bool masks only)")
    def fn(r, node, a, b):
        if r.torch_dtype(node) != "bool":
            raise Unsupported(f"{str(node.target).split('.')[1]} of integers")
        return getattr(r.tp, method)(r.mask(a), r.mask(b))
    return fn


# transformers' mask builders combine their boolean masks with & and |
_bitwise(("aten.bitwise_and.Tensor", "aten.bitwise_and.Scalar"), "logical_and", "logical_and")
_bitwise(("aten.bitwise_or.Tensor", "aten.bitwise_or.Scalar"), "logical_or", "logical_or")
_bitwise(("aten.bitwise_xor.Tensor", "aten.bitwise_xor.Scalar"), "ne",
         "ne of the 0.0/1.0 masks (xor)")


@aten("aten.logical_xor.default", needs=("ne",), doc="ne of the two operands' truth")
def _lxor(r, node, a, b):
    tp = r.tp
    zero = r.f(0.0)
    return tp.ne(tp.ne(r.mask(a), zero), tp.ne(r.mask(b), zero))


@aten("aten.where.self", needs=("where",),
      doc="where (the gradient to a where the mask holds, to b elsewhere)")
def _where(r, node, m, a, b):
    a, b = r.operands(a, b)
    return r.tp.where(r.mask(m), a, b)


@aten("aten.any.dim", "aten.any.dims", "aten.any.default",
      doc="max of the 0.0/1.0 mask over the axes (exact)")
def _any(r, node, a, dim=None, keepdim=False):
    return r.reduce("max", r.mask(a), dim, keepdim)


# ── reductions and normalisations ──────────────────────────────────────────

@aten("aten.sum.dim_IntList", "aten.sum.default",
      doc="sum (over one, several or all axes)")
def _sum(r, node, a, dim=None, keepdim=False, dtype=None):
    return r.reduce("sum", r.f(a), dim, keepdim)


@aten("aten.mean.dim", "aten.mean.default", doc="mean (over one, several or all axes)")
def _mean(r, node, a, dim=None, keepdim=False, dtype=None):
    return r.reduce("mean", r.f(a), dim, keepdim)


@aten("aten.amax.default", "aten.max.default", doc="max (the first maximal element)")
def _amax(r, node, a, dim=None, keepdim=False):
    return r.reduce("max", r.f(a), dim, keepdim)


@aten("aten.var.correction", "aten.var.dim", needs=("variance",),
      doc="variance (torch's formula, one or several axes)")
def _var(r, node, a, dim=None, *args, correction=None, keepdim=False, unbiased=None):
    if args:                       # var.dim(self, dim, unbiased, keepdim)
        unbiased = args[0]
        keepdim = args[1] if len(args) > 1 else keepdim
    if correction is None:
        correction = 1 if unbiased in (None, True) else 0
    a = r.f(a)
    axes = r.axes(a, dim)
    axis = axes[0] if len(axes) == 1 else tuple(axes)
    return r.tp.variance(a, axis, correction=correction, keepdims=bool(keepdim))


@aten("aten.var_mean.correction", needs=("variance",),
      doc="(variance, mean): as aten.var.correction and aten.mean.dim")
def _var_mean(r, node, a, dim=None, *, correction=None, keepdim=False):
    return (_var(r, node, a, dim, correction=correction, keepdim=keepdim),
            _mean(r, node, a, dim, keepdim))


@aten("aten.cumsum.default", needs=("cumsum",),
      doc="cumsum (the serial running sum from +0.0, as torch's CPU loop)")
def _cumsum(r, node, a, dim, dtype=None):
    return r.tp.cumsum(r.f(a), dim)


@aten("aten.logcumsumexp.default", needs=("logcumsumexp",),
      doc="Tape.logcumsumexp: a chain of logaddexp (the running maximum held constant, so "
          "the gradient is the exact softmax weights; -inf entries stay -inf)")
def _logcumsumexp(r, node, a, dim):
    v = r.f(a)
    return r.tp.logcumsumexp(v, dim % len(v.shape))


@aten("aten.cummax.default", "aten.cummin.default", needs=("cummax", "cummin"),
      doc="(Tape.cummax or cummin, -): the running extrema, a tie to the later entry as "
          "torch's; the indices are not recorded")
def _cummax(r, node, a, dim):
    v = r.f(a)
    fn = r.tp.cummax if str(node.target).startswith("aten.cummax") else r.tp.cummin
    return (fn(v, dim % len(v.shape)), None)


@aten("aten.cumprod.default", needs=("cumprod",),
      doc="cumprod (the running product, one mul a step in ascending order)")
def _cumprod(r, node, a, dim, dtype=None):
    return r.tp.cumprod(r.f(a), dim)


@aten("aten.prod.dim_int", "aten.prod.default", needs=("prod",),
      doc="prod (a mul chain in ascending order along the axis; no axis: of every "
          "element)")
def _prod(r, node, a, dim=None, keepdim=False, dtype=None):
    if not isinstance(dim, int) or isinstance(dim, bool):     # aten.prod.default(a, dtype)
        return r.reshape(r.tp.prod(r.f(a)), r.tshape(node))
    return r.tp.prod(r.f(a), dim, keepdims=bool(keepdim))


@aten("aten.sign.default", needs=("gt", "lt"),
      doc="gt(a, 0) - lt(a, 0) (+0.0 for +-0 and NaN, as torch's CPU sign)")
def _sign(r, node, a):
    a = r.f(a)
    return r.tp.sub(r.tp.gt(a, 0.0), r.tp.lt(a, 0.0))


@aten("aten.flip.default", needs=("flip",),
      doc="flip (index_select by descending ids: copies)")
def _flip(r, node, a, dims):
    return r.tp.flip(r.value(a), dims)


@aten("aten.isnan.default", needs=("ne",), doc="ne(a, a) (a mask of 0.0/1.0)")
def _isnan(r, node, a):
    a = r.f(a)
    return r.tp.ne(a, a)


@aten("aten._softmax.default", doc="softmax")
def _softmax(r, node, a, dim, half_to_float=False):
    return r.tp.softmax(r.f(a), axis=dim)


@aten("aten._log_softmax.default", doc="log_softmax")
def _log_softmax(r, node, a, dim, half_to_float=False):
    return r.tp.log_softmax(r.f(a), axis=dim)


@aten("aten.native_layer_norm.default", needs=("nn.native_layer_norm",),
      doc="gradtool.nn.native_layer_norm: (y, mean, rstd) over the normalized axes")
def _native_layer_norm(r, node, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    from .. import nn
    w = None if weight is None else r.f(weight)
    b = None if bias is None else r.f(bias)
    return tuple(nn.native_layer_norm(r.f(x), len(normalized_shape), w, b, eps=float(eps)))


# ── matrix products ────────────────────────────────────────────────────────

@aten("aten.mm.default", doc="matmul")
def _mm(r, node, a, b):
    return r.tp.matmul(r.f(a), r.f(b))


@aten("aten.bmm.default", doc="bmm")
def _bmm(r, node, a, b):
    return r.tp.bmm(r.f(a), r.f(b))


def _scaled_sum(r, product, bias, beta, alpha):
    """alpha * product + beta * bias as torch's addmm/baddbmm: a factor of 1 is no node,
    beta 0 ignores bias (a NaN in it too, as BLAS does)."""
    tp = r.tp
    out = product if alpha == 1 else tp.muls(product, float(alpha))
    if beta == 0:
        return out
    return tp.add(out, r.f(bias) if beta == 1 else tp.muls(r.f(bias), float(beta)))


@aten("aten.addmm.default", doc="add(matmul(a, b), bias); alpha and beta as muls")
def _addmm(r, node, bias, a, b, beta=1, alpha=1):
    return _scaled_sum(r, r.tp.matmul(r.f(a), r.f(b)), bias, beta, alpha)


@aten("aten.baddbmm.default", doc="add(bmm(a, b), input); alpha and beta as muls")
def _baddbmm(r, node, bias, a, b, beta=1, alpha=1):
    return _scaled_sum(r, r.tp.bmm(r.f(a), r.f(b)), bias, beta, alpha)


# ── layout ─────────────────────────────────────────────────────────────────

@aten("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
      "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
      "aten.squeeze.default", "aten.view_copy.default", "aten.flatten.using_ints",
      "aten.unflatten.int",
      doc="reshape to the exported shape (a no-op where the shape does not change)")
def _view(r, node, a, *args):
    return r.reshape(r.value(a), r.shape(node))


@aten("aten.clone.default", "aten.contiguous.default",
      "aten.lift_fresh_copy.default",
      doc="the same value (no node)")
def _identity(r, node, a, *args, **kwargs):
    return r.value(a)


def _dropout_of(r, x, p, train, record=None):
    """``record(x, p)`` (default gradtool.nn.dropout) in train mode (the tape's rng slot
    decides per step), x itself in eval mode."""
    from .. import nn
    v = r.value(x)
    if train is None or not train:
        return v
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
        raise Unsupported(f"dropout probability {p!r} (a number in [0, 1] only)")
    return (record or nn.dropout)(r.f(x), float(p))


@aten("aten.native_dropout.default", needs=("nn.dropout",),
      doc="gradtool.nn.dropout in train mode (counter-based masks: the rng slot; the mask "
          "output is not recorded), the same value in eval mode")
def _native_dropout(r, node, x, p, train):
    return (_dropout_of(r, x, p, train), None)


@aten("aten.dropout.default", needs=("nn.dropout",),
      doc="gradtool.nn.dropout in train mode, the same value (no node) in eval mode")
def _dropout(r, node, x, p, train):
    return _dropout_of(r, x, p, train)


@aten("gradtool.feature_dropout.default", "gradtool.alpha_dropout.default",
      needs=("nn.feature_dropout", "nn.alpha_dropout"),
      doc="torch's feature_dropout, alpha_dropout and feature_alpha_dropout, which the "
          "importer turns into these custom ops before run_decompositions (which would make "
          "them bernoulli): gradtool.nn.feature_dropout (Dropout1d/2d/3d: one draw per "
          "sample and channel) or nn.alpha_dropout (AlphaDropout, FeatureAlphaDropout) in "
          "train mode, the same value in eval mode")
def _feature_dropout(r, node, x, p, train, channels=False):
    from .. import nn
    if str(node.target) == "gradtool.feature_dropout.default":
        return _dropout_of(r, x, p, train, nn.feature_dropout)
    return _dropout_of(r, x, p, train,
                       lambda v, q: nn.alpha_dropout(v, q, channels=bool(channels)))


@aten("aten.bernoulli.p", "aten.bernoulli.default", needs=("nn.bernoulli",),
      doc="gradtool.nn.bernoulli: lt(uniform, p) over the rng slot (counter-based draws, no "
          "gradient); with the train flag 0 (validation) the mean p, so x * mask / p is x "
          "(stochastic depth, DropPath); bernoulli.default (probabilities a tensor) kept "
          "out of run_decompositions, which would draw it with rand")
def _bernoulli(r, node, x, p=None, generator=None):
    from .. import nn
    if p is None:                                   # bernoulli(probs)
        return nn.bernoulli(r.f(x))
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
        raise Unsupported(f"bernoulli with p {p!r} (a number in [0, 1] only)")
    return nn.bernoulli(float(p), shape=r.shape(node), tape=r.tp)


@aten("aten.randn.default", "aten.randn_like.default", "aten.normal.float_float",
      "aten.normal.Tensor_float", "aten.normal.float_Tensor", "aten.normal.Tensor_Tensor",
      "aten.normal_functional.default", needs=("nn.normal",),
      doc="gradtool.nn.normal (Box-Muller on uniform over the rng slot: counter-based, the "
          "same bits on every backend; no gradient), times std plus mean for normal; with "
          "the train flag 0 (validation) each draw is its mean (+0.0: randn, mean: normal)")
def _randn(r, node, *args, **kwargs):
    from .. import nn
    name = str(node.target)
    shape = r.shape(node)
    z = nn.normal(shape, tape=r.tp)
    if not name.startswith("aten.normal"):
        return z
    if name == "aten.normal_functional.default":        # x.normal_(mean, std)
        args = args[1:]
    mean, std = (list(args) + [kwargs.get("mean", 0.0), kwargs.get("std", 1.0)])[:2]
    tp = r.tp
    scaled = tp.muls(z, float(std)) if _num(std) else tp.mul(z, r.f(std))
    return tp.adds(scaled, float(mean)) if _num(mean) else tp.add(scaled, r.f(mean))


@aten("aten.rand.default", "aten.rand_like.default", "aten.uniform.default",
      needs=("nn.rand",),
      doc="gradtool.nn.rand (the uniform op over the rng slot: counter-based, the same bits "
          "on every backend; no gradient), scaled to [from, to) for uniform_; with the train "
          "flag 0 (validation) each draw is its mean (0.5: rand)")
def _rand(r, node, *args, **kwargs):
    from .. import nn
    low, high = 0.0, 1.0
    if str(node.target) == "aten.uniform.default":
        low, high = (list(args[1:]) + [kwargs.get("from", 0.0), kwargs.get("to", 1.0)])[:2]
    return nn.rand(r.shape(node), tape=r.tp, low=low, high=high)


@aten("aten.randint.default", "aten.randint.low", "aten.randint_like.default",
      "aten.randint_like.low_dtype", "aten.random.to", needs=("nn.randint",),
      doc="gradtool.nn.randint: floor(uniform * (high - low)) + low over the rng slot, "
          "integer-valued (ids: a diffusion model's timesteps); with the train flag 0 "
          "(validation) each draw is the middle value low + (high - low - 1) // 2")
def _randint(r, node, *args, **kwargs):
    from .. import nn
    name = str(node.target)
    taken = args[1:] if "like" in name or "random" in name else args   # x.random_(to)
    numbers = [a for a in taken if not isinstance(a, (list, tuple))]   # size: a list
    low, high = kwargs.get("low", 0), kwargs.get("high", kwargs.get("to"))
    if len(numbers) == 2:
        low, high = numbers
    elif numbers:
        high = numbers[0]
    if any(isinstance(v, bool) or not isinstance(v, int) or abs(v) > 2 ** 53
           for v in (low, high)) or not 0 < high - low <= 2 ** 53:
        raise Unsupported(f"randint over [{low!r}, {high!r}) (gradtool draws integers in "
                          f"[low, high) with low < high <= low + 2^53, both within +-2^53)")
    return nn.randint(low, high, r.shape(node), tape=r.tp)


@aten("aten.multinomial.default", needs=("nn.multinomial",),
      doc="gradtool.nn.multinomial: the inverse CDF of the weights over the rng slot "
          "(cumsum, one uniform per draw, a count of comparisons), integer-valued ids; "
          "without replacement one sample per row; an invalid row gives NaN ids; with the "
          "train flag 0 (validation) every draw is the row's most likely category")
def _multinomial(r, node, w, num_samples, replacement=False, generator=None):
    from .. import nn
    if not replacement and num_samples > 1:
        raise Unsupported(f"multinomial of {num_samples} samples without replacement "
                          f"(gradtool draws one per row, or any number with replacement)")
    return nn.multinomial(r.f(w), int(num_samples), bool(replacement))


@aten("aten.randperm.default", needs=("nn.randperm", "sort"),
      doc="gradtool.nn.randperm: the ids that sort a uniform draw over the rng slot "
          "(Tape.sort, n x n comparisons), integer-valued; with the train flag 0 "
          "(validation) the identity 0 .. n-1")
def _randperm(r, node, n, *args, **kwargs):
    from .. import nn
    return nn.randperm(int(n), tape=r.tp)


@aten("aten.detach.default", needs=("detach",),
      doc="detach (a stop-gradient) of a value a param reaches, else the same value (the "
          "importer keeps detach out of run_decompositions, which would make it an alias)")
def _detach(r, node, a):
    v = r.value(a)
    return r.tp.detach(v) if r.requires_grad(v) else v


@aten("aten.alias.default",
      doc="the same value (a view of the whole tensor: a no-op slice; the gradient passes, "
          "as torch's alias; detach, which the decomposition would make an alias, is kept "
          "as detach)")
def _alias(r, node, a):
    return r.value(a)


@aten("aten._to_copy.default", "aten.to.dtype", needs=("trunc",),
      doc="a float-to-float copy is the same value (every float is f64); i64 data to float: "
          "to_f64; integer-valued data (ids, masks) to an integer dtype: the same value; "
          "other floats to an integer dtype: trunc (torch's conversion rounds toward zero: "
          "(torch.rand(n) * T).long() gives ids), to bool: ne(a, 0)")
def _to_copy(r, node, a, *args, dtype=None, **kwargs):
    dst = r.torch_dtype(node)
    if r.is_ids(a):
        return a if dst == "int" else r.tp.to_f64(a)
    v = r.f(a)
    if dst == "float" or dst == r.torch_dtype(node.args[0]):
        return v
    if dst == "bool":
        return v if r.torch_dtype(node.args[0]) == "bool" else r.tp.ne(v, 0.0)
    return v if r.is_integral(v) else r.tp.trunc(v)


@aten("aten.permute.default", needs=("permute",),
      doc="permute (a swap of the last two axes: transpose; the identity: no node)")
def _permute(r, node, a, dims):
    return r.permute(r.value(a), list(dims))


def _strided_sources(node):
    """For ``as_strided(x, size, stride, offset)``: the flat (row-major) index into ``x``
    of each output element, in row-major order, from the memory layout torch gives ``x``
    (its strides and storage offset), or a reason it is not a read of ``x``'s elements."""
    val = node.args[0].meta["val"]
    shape, strides = [int(d) for d in val.shape], [int(d) for d in val.stride()]
    base = int(val.storage_offset())
    size, stride = [int(d) for d in node.args[1]], [int(d) for d in node.args[2]]
    offset = base if len(node.args) < 4 or node.args[3] is None else int(node.args[3])
    def positions(start, dims, steps):     # storage position of each element, row-major
        pos = np.full(dims, start, dtype=np.int64)
        for axis, (d, st) in enumerate(zip(dims, steps)):
            pos = pos + (np.arange(d, dtype=np.int64) * st).reshape(
                [d if k == axis else 1 for k in range(len(dims))])
        return pos.reshape(-1)

    held = positions(base, shape, strides)          # x's elements, by flat index
    if len(np.unique(held)) != len(held):
        return None, "its input is itself an overlapping (expanded) view"
    order = np.argsort(held, kind="stable")
    read = positions(offset, size, stride)
    at = np.searchsorted(held[order], read)
    found = at < len(held)
    found[found] = held[order][at[found]] == read[found]
    if not found.all():
        return None, "it reads memory outside its input"
    return order[at].astype(np.int64), ""


def _as_box(sources, shape):
    """``(starts, stops, steps)`` where ``sources`` (flat indices into ``shape``) are a
    slice of each axis enumerated in row-major order, else None."""
    if not len(sources):
        return None
    coords = np.unravel_index(sources, shape)
    box = []
    for c in coords:
        values = np.unique(c)
        step = int(values[1] - values[0]) if len(values) > 1 else 1
        if step < 1 or not np.array_equal(values, np.arange(values[0], values[-1] + 1, step)):
            return None
        box.append((int(values[0]), int(values[-1]) + 1, step, len(values)))
    grid = np.ix_(*[np.arange(a, b, st) for a, b, st, _ in box])
    want = np.ravel_multi_index(grid, shape).reshape(-1)
    return box if np.array_equal(want, sources) else None


@aten("aten.as_strided.default",
      doc="where its strides are a reshape, a permute or a slice of its input's layout "
          "(torch's adaptive_avg_pool2d on a channels-last tensor): that op; any other "
          "as_strided (overlapping windows, memory outside the input) is refused")
def _as_strided(r, node, a, size, stride, storage_offset=None):
    import itertools
    shape = list(r.tshape(node.args[0]))
    out_shape = r.shape(node)
    sources, why = _strided_sources(node)
    if sources is None:
        raise Unsupported(f"as_strided: {why}")
    v = r.value(a)
    n = math.prod(shape)
    if len(sources) == n and np.array_equal(sources, np.arange(n)):
        return r.reshape(v, out_shape)                                  # a reshape
    if len(sources) == n and len(shape) <= 6:
        grid = np.arange(n).reshape(shape)
        for perm in itertools.permutations(range(len(shape))):
            if np.array_equal(grid.transpose(perm).reshape(-1), sources):
                return r.reshape(r.permute(v, list(perm)), out_shape)   # a permute
    box = _as_box(sources, shape)
    if box is not None:                                                 # a slice
        for axis, (start, stop, step, _) in enumerate(box):
            v = r.slice_axis(v, axis, start, stop, step)
        return r.reshape(v, out_shape)
    raise Unsupported("as_strided whose strides are not a reshape, permute or slice of "
                      "its input (overlapping windows: use unfold)")


@aten("aten.t.default", doc="transpose (of a 2-dim tensor)")
def _t(r, node, a):
    v = r.value(a)
    return v if len(v.shape) < 2 else r.tp.transpose(v)


@aten("aten.transpose.int", needs=("permute",), doc="as permute")
def _transpose(r, node, a, d0, d1):
    v = r.value(a)
    n = len(r.tshape(node))
    perm = list(range(n))
    d0, d1 = d0 % n, d1 % n
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return r.permute(v, perm)


@aten("aten.expand.default", needs=("expand",),
      doc="expand (the gradient summed back in reduce_to_shape's order)")
def _expand(r, node, a, size, implicit=False):
    return r.expand(r.f(a), r.shape(node))


@aten("aten.slice.Tensor", doc="slice (with steps where the step is > 1)")
def _slice(r, node, a, dim=0, start=None, end=None, step=1):
    v = r.value(a)
    shape = list(r.tshape(node.args[0]))
    if not shape:
        raise Unsupported("slice of a 0-dim tensor")
    dim %= len(shape)
    start, end, _ = slice(start, end, step).indices(shape[dim])
    return r.slice_axis(v, dim, start, end, step)


@aten("aten.select.int", doc="slice + reshape")
def _select(r, node, a, dim, index):
    v = r.value(a)
    shape = list(r.tshape(node.args[0]))
    dim %= len(shape)
    index %= shape[dim]
    return r.reshape(r.slice_axis(v, dim, index, index + 1, 1), r.shape(node))


@aten("aten.copy.default", needs=("expand",),
      doc="src broadcast to dst's shape (the functional form of dst.copy_(src), which "
          "in-place slice assignment decomposes to); no gradient to dst, whose values it "
          "replaces")
def _copy(r, node, dst, src, non_blocking=False):
    want, have = r.torch_dtype(node.args[0]), r.torch_dtype(node.args[1])
    if want != have and not (want == "float" and have in ("int", "bool")):
        raise Unsupported(f"a copy of {have} data into a {want} tensor")
    return r.expand(r.f(src), r.shape(node))


@aten("aten.slice_scatter.default", needs=("cat", "where"),
      doc="base with src in base[start:end:step] along dim (in-place slice assignment): "
          "step 1, cat of base's head, src and base's tail; a step, where(grid, src spread "
          "by the step, base) in between; exact copies, each gradient torch's")
def _slice_scatter(r, node, base, src, dim=0, start=None, end=None, step=1):
    shape = list(r.tshape(node))
    dim %= len(shape)
    return _scatter_into(r, r.f(base), r.f(src), shape, dim,
                         *slice(start, end, step).indices(shape[dim]))


@aten("aten.select_scatter.default", needs=("cat", "where"),
      doc="slice_scatter of src (an axis of one inserted) at index")
def _select_scatter(r, node, base, src, dim, index):
    shape = list(r.tshape(node))
    dim %= len(shape)
    index %= shape[dim]
    v = r.reshape(r.f(src), shape[:dim] + [1] + shape[dim + 1:])
    return _scatter_into(r, r.f(base), v, shape, dim, index, index + 1, 1)


def _scatter_into(r, b, v, shape, dim, start, end, step):
    """b (of ``shape``) with v in b[start:end:step] along ``dim``."""
    from ..nn import _spread
    m = len(range(start, end, step))
    if m == 0:
        return b
    last = start + (m - 1) * step + 1         # one past the last position v fills
    if step > 1:                              # v's rows at the grid, b's in between
        grid = np.zeros([last - start] + [1] * (len(shape) - 1 - dim))
        grid[::step] = 1.0
        v = r.tp.where(r.tp.const(grid), _spread(r.tp, v, dim, step),
                       r.slice_axis(b, dim, start, last, 1))
    parts = [r.slice_axis(b, dim, 0, start, 1)] if start > 0 else []
    parts.append(v)
    if last < shape[dim]:
        parts.append(r.slice_axis(b, dim, last, shape[dim], 1))
    return parts[0] if len(parts) == 1 else r.tp.cat(parts, dim)


@aten("aten.diagonal.default", needs=("permute",),
      doc="permute of dim1, dim2 to the end, reshape, a slice with step (columns + 1) "
          "from the offset: exact copies")
def _diagonal(r, node, a, offset=0, dim1=0, dim2=1):
    v = r.f(a)
    shape = list(r.tshape(node.args[0]))
    n = len(shape)
    d1, d2 = dim1 % n, dim2 % n
    rest = [d for d in range(n) if d not in (d1, d2)]
    rows, cols = shape[d1], shape[d2]
    count = min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols)
    if count <= 0:
        raise Unsupported("an empty diagonal (gradtool values have at least one element)")
    flat = r.reshape(r.permute(v, rest + [d1, d2]), [shape[d] for d in rest] + [rows * cols])
    start = offset if offset >= 0 else -offset * cols
    out = r.slice_axis(flat, len(rest), start, start + (count - 1) * (cols + 1) + 1, cols + 1)
    return r.reshape(out, r.shape(node))


@aten("aten.split_with_sizes.default", "aten.split.Tensor", doc="slices")
def _split(r, node, a, sizes, dim=0):
    v = r.value(a)
    shape = list(r.tshape(node.args[0]))
    dim %= len(shape)
    if isinstance(sizes, int):
        sizes = [min(sizes, shape[dim] - s) for s in range(0, shape[dim], sizes)]
    out, start = [], 0
    for n in sizes:
        out.append(r.slice_axis(v, dim, start, start + n, 1))
        start += n
    return tuple(out)


@aten("aten.unbind.int", doc="select of each index")
def _unbind(r, node, a, dim=0):
    v = r.value(a)
    shape = list(r.tshape(node.args[0]))
    dim %= len(shape)
    keep = shape[:dim] + shape[dim + 1:]
    return tuple(r.reshape(r.slice_axis(v, dim, i, i + 1, 1), keep or [1])
                 for i in range(shape[dim]))


@aten("aten.cat.default", needs=("cat",), doc="cat (N inputs; empty ones dropped)")
def _cat(r, node, tensors, dim=0):
    # an empty input (a KV cache's first cat starts from torch.tensor([])) is dropped
    # before anything is lifted: a [0] const is not a tape value
    vals = [r.value(t) for t, s in zip(tensors, [r.tshape(t) for t in node.args[0]])
            if 0 not in s]
    if not vals:
        raise Unsupported("cat of empty tensors only (a zero-size result)")
    ndim = len(r.tshape(node))
    dim %= ndim
    return vals[0] if len(vals) == 1 else r.tp.cat(vals, dim)


@aten("aten.stack.default", needs=("cat",), doc="unsqueeze (reshape) of each input, then cat")
def _stack(r, node, tensors, dim=0):
    shape = list(r.tshape(node.args[0][0]))
    dim %= len(shape) + 1
    parts = [r.reshape(r.f(t), shape[:dim] + [1] + shape[dim:]) for t in tensors]
    return parts[0] if len(parts) == 1 else r.tp.cat(parts, dim)


# ── gathers ────────────────────────────────────────────────────────────────

@aten("aten.embedding.default",
      doc="take (rows of the weight by i64 ids); with padding_idx p, where(ids == p, "
          "detach(rows), rows): the same values, and row p gets no gradient, as in torch")
def _embedding(r, node, weight, ids, padding_idx=-1, scale_grad=False, sparse=False):
    if scale_grad:
        raise Unsupported("embedding with scale_grad_by_freq")
    pos = r.ids(ids)
    rows = r.tp.take(r.f(weight), pos)
    if padding_idx is None or padding_idx < 0 or not r.requires_grad(rows):
        return rows
    pad = r.reshape(r.tp.eq(pos, float(padding_idx)), list(pos.shape) + [1])
    return r.tp.where(pad, r.tp.detach(rows), rows)


@aten("aten._embedding_bag.default", needs=("cat",),
      doc="nn.EmbeddingBag (sum, mean, max) with bag boundaries fixed at export (a folded "
          "offsets tensor, as a 2-d input gives): take, then per bag the sum, mean or max "
          "over its rows (one reduction over a [bags, length, dim] reshape when the bags "
          "are equally long); per-sample weights and padding_idx are refused")
def _embedding_bag(r, node, weight, ids, offsets, scale_grad=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    torch = r.torch
    if scale_grad:
        raise Unsupported("embedding_bag with scale_grad_by_freq")
    if per_sample_weights is not None:
        raise Unsupported("embedding_bag with per_sample_weights")
    if padding_idx is not None and padding_idx >= 0:
        raise Unsupported("embedding_bag with padding_idx")
    if not isinstance(offsets, torch.Tensor):
        raise Unsupported("embedding_bag whose offsets are an input or computed (gradtool "
                          "fixes the bag boundaries at export)")
    n = r.tshape(node.args[1])[0]
    bounds = [int(o) for o in offsets.tolist()] + ([] if include_last_offset else [n])
    if any(b < 0 or b > n for b in bounds) or bounds != sorted(bounds) or len(bounds) < 2:
        raise Unsupported(f"embedding_bag offsets {bounds[:8]} are not ascending in [0, {n}]")
    tp = r.tp
    rows = tp.take(r.f(weight), r.ids(ids))                               # [n, D]
    d = rows.shape[1]
    reduce = {0: tp.sum, 1: tp.mean, 2: tp.max}[int(mode)]
    sizes = [e - s for s, e in zip(bounds, bounds[1:])]
    if min(sizes) > 0 and len(set(sizes)) == 1 and bounds[0] == 0 and bounds[-1] == n:
        out = reduce(r.reshape(rows, [len(sizes), sizes[0], d]), axis=1)
    else:
        bags = [reduce(r.slice_axis(rows, 0, s, e, 1), axis=0, keepdims=True) if e > s
                else tp.const(np.zeros((1, d))) for s, e in zip(bounds, bounds[1:])]
        out = bags[0] if len(bags) == 1 else tp.cat(bags, 0)
    return (out, None, None, None)


@aten("aten.index_select.default", needs=("index_select",), doc="index_select")
def _index_select(r, node, a, dim, ids):
    v = r.f(a)
    return r.tp.index_select(v, dim % len(v.shape), r.ids(ids))


@aten("aten.gather.default", doc="take_along")
def _gather(r, node, a, dim, ids, sparse_grad=False):
    v = r.f(a)
    return r.tp.take_along(v, r.ids(ids), axis=dim % len(v.shape))


# ── activations and norms that decompose no further ───────────────────────

@aten("aten.leaky_relu.default", needs=("gt", "where"),
      doc="where(a > 0, a, a * slope)")
def _leaky_relu(r, node, a, slope=0.01):
    a = r.f(a)
    return r.tp.where(r.tp.gt(a, r.f(0.0)), a, r.tp.muls(a, float(slope)))


@aten("aten.hardtanh.default", needs=("le", "ge", "where"),
      doc="where(a <= lo, lo, where(a >= hi, hi, a)): the gradient passes where lo < a < hi, "
          "as torch's")
def _hardtanh(r, node, a, lo=-1.0, hi=1.0):
    a = r.f(a)
    tp = r.tp
    lo_c, hi_c = r.f(float(lo)), r.f(float(hi))
    return tp.where(tp.le(a, lo_c), lo_c, tp.where(tp.ge(a, hi_c), hi_c, a))


@aten("aten.elu.default", needs=("gt", "where", "expm1"),
      doc="where(a > 0, a * scale, expm1(a * input_scale) * alpha * scale) (also selu)")
def _elu(r, node, a, alpha=1.0, scale=1.0, input_scale=1.0):
    a = r.f(a)
    tp = r.tp
    pos = a if scale == 1 else tp.muls(a, float(scale))
    inner = a if input_scale == 1 else tp.muls(a, float(input_scale))
    neg = tp.muls(tp.expm1(inner), float(alpha) * float(scale)) if scale != 1 else \
        tp.muls(tp.expm1(inner), float(alpha))
    return tp.where(tp.gt(a, r.f(0.0)), pos, neg)


@aten("aten.max.dim", doc="(max along the axis, -): the values only (the first maximal "
                          "element); reading the indices is refused")
def _max_dim(r, node, a, dim, keepdim=False):
    a = r.f(a)
    return (r.tp.max(a, axis=dim % len(a.shape), keepdims=bool(keepdim)), None)


@aten("aten._trilinear.default", needs=("matmul",),
      doc="nn.Bilinear's pattern (x1 [N, I], w [O, I, J], x2 [N, J]): x1 @ w as [I, O*J] "
          "(the matmul's FMA chains over I), times x2 broadcast, summed over J; any other "
          "pattern refused")
def _trilinear(r, node, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    tp = r.tp
    if (list(expand1), list(expand2), list(expand3), list(sumdim)) != \
            ([1, 3], [0], [1, 2], [2, 3]):
        raise Unsupported("a _trilinear other than nn.Bilinear's")
    x1, w, x2 = r.f(i1), r.f(i2), r.f(i3)
    n, (o, i, j) = x1.shape[0], w.shape
    wt = r.reshape(r.permute(w, [1, 0, 2]), [i, o * j])                    # [I, O*J]
    t = r.reshape(tp.matmul(x1, wt), [n, o, j])
    return tp.sum(tp.mul(t, r.reshape(x2, [n, 1, j])), axis=2)


def _distances(r, d, p):
    """The p-norms of the differences ``d`` along the last axis (p = 1 or 2); a zero
    distance has the gradient 0 there, as torch's cdist and pdist."""
    tp = r.tp
    if p == 1.0:
        return tp.sum(tp.abs(d), axis=-1)
    s = tp.sum(tp.mul(d, d), axis=-1)
    zero = tp.eq(s, r.f(0.0))
    return tp.where(zero, r.f(0.0), tp.sqrt(tp.where(zero, r.f(1.0), s)))


@aten("aten._cdist_forward.default", needs=("abs", "sqrt", "where"),
      doc="p = 2: sqrt of the serial sum of squared differences x1[.., i, None, :] - x2[.., "
          "None, j, :] (the direct form, also where torch uses its matrix-product form); "
          "p = 1: the sum of |differences|; other p refused")
def _cdist(r, node, x1, x2, p, compute_mode=None):
    p = float(p)
    if p not in (1.0, 2.0):
        raise Unsupported(f"cdist with p = {p!r} (p = 1 and 2 only)")
    a, b = r.f(x1), r.f(x2)
    pa, pb = list(a.shape), list(b.shape)
    d = r.tp.sub(r.reshape(a, pa[:-1] + [1, pa[-1]]), r.reshape(b, pb[:-2] + [1] + pb[-2:]))
    return _distances(r, d, p)


@aten("aten._pdist_forward.default", needs=("abs", "sqrt", "where", "take"),
      doc="the rows i < j of the row distances (cdist of x with itself, p = 1 or 2), "
          "picked in torch's order by take")
def _pdist(r, node, x, p=2.0):
    p = float(p)
    if p not in (1.0, 2.0):
        raise Unsupported(f"pdist with p = {p!r} (p = 1 and 2 only)")
    a = r.f(x)
    n, m = a.shape
    d = r.tp.sub(r.reshape(a, [n, 1, m]), r.reshape(a, [1, n, m]))
    full = r.reshape(_distances(r, d, p), [n * n])
    rows, cols = np.triu_indices(n, 1)
    return r.tp.take(full, r.ids(r.torch.tensor(rows * n + cols)))


@aten("aten.argmax.default", "aten.argmin.default", needs=("topk",),
      doc="the ids of Tape.topk(k=1) (largest, or smallest for argmin): the first extreme "
          "entry, a NaN the largest, as torch's; dim=None: of the flattened input")
def _argmax(r, node, a, dim=None, keepdim=False):
    v = r.f(a)
    if dim is None:
        v = r.reshape(v, [int(np.prod(v.shape))])
        dim = 0
    axis = dim % len(v.shape)
    largest = str(node.target).startswith("aten.argmax")
    _, ids = r.tp.topk(v, 1, axis=axis, largest=largest)
    return r.reshape(ids, r.shape(node))


@aten("aten.topk.default", needs=("topk",),
      doc="(values, indices) from pairwise comparisons (Tape.topk: ties in index order, "
          "a NaN the largest; sorted=False gives them sorted too); values take_along")
def _topk(r, node, a, k, dim=-1, largest=True, sorted=True):
    v = r.f(a)
    return r.tp.topk(v, int(k), axis=dim % len(v.shape), largest=bool(largest))


@aten("aten.sort.default", "aten.sort.stable", needs=("sort",),
      doc="(values, indices) of a stable sort from pairwise comparisons (Tape.sort); a NaN "
          "the largest, as torch's")
def _sort(r, node, a, dim=-1, descending=False, *, stable=None):
    v = r.f(a)
    return r.tp.sort(v, axis=dim % len(v.shape), descending=bool(descending))


@aten("aten.median.dim", "aten.median.default", needs=("sort",),
      doc="the lower median (entry (n - 1) // 2 of the ascending sort; of every element "
          "without a dim) and, by dim, its index")
def _median(r, node, a, dim=None, keepdim=False):
    v = r.f(a)
    if dim is None:
        v, dim = r.reshape(v, [math.prod(v.shape)]), 0
    dim %= len(v.shape)
    n = v.shape[dim]
    values, ids = r.tp.sort(v, axis=dim)
    picked = [r.slice_axis(t, dim, (n - 1) // 2, (n - 1) // 2 + 1, 1) for t in (values, ids)]
    if str(node.target) == "aten.median.default":
        return r.reshape(picked[0], r.shape(node))
    out = [t if keepdim else r.reshape(t, [d for i, d in enumerate(t.shape) if i != dim] or [1])
           for t in picked]
    return tuple(out)


@aten("aten.min.dim", doc="(-max(-a) along the axis, -): the values only")
def _min_dim(r, node, a, dim, keepdim=False):
    a = r.f(a)
    tp = r.tp
    return (tp.neg(tp.max(tp.neg(a), axis=dim % len(a.shape), keepdims=bool(keepdim))), None)


@aten("aten.amin.default", doc="-max(-a) (negation is exact)")
def _amin(r, node, a, dim=None, keepdim=False):
    tp = r.tp
    return tp.neg(r.reduce("max", tp.neg(r.f(a)), dim, keepdim))


@aten("aten.linalg_vector_norm.default", needs=("abs",),
      doc="ord 2: sqrt(sum(a * a)); 1: sum(abs(a)); inf: max(abs(a)); -inf: -max(-abs(a)); "
          "any other p > 0: sum(abs(a) ** p) ** (1 / p) (pows), over the axes; ord <= 0 refused")
def _vector_norm(r, node, a, ord=2, dim=None, keepdim=False, dtype=None):
    a, tp = r.f(a), r.tp
    if ord == 2:
        return tp.sqrt(r.reduce("sum", tp.mul(a, a), dim, keepdim))
    if not _num(ord) or (ord <= 0 and ord != -math.inf):
        raise Unsupported(f"vector norm of order {ord!r} (orders > 0 and -inf only)")
    m = tp.abs(a)
    if ord == math.inf:
        return r.reduce("max", m, dim, keepdim)
    if ord == -math.inf:
        return tp.neg(r.reduce("max", tp.neg(m), dim, keepdim))
    if ord == 1:
        return r.reduce("sum", m, dim, keepdim)
    return tp.pows(r.reduce("sum", tp.pows(m, float(ord)), dim, keepdim), 1.0 / float(ord))


@aten("aten.repeat.default", needs=("expand",),
      doc="reshape with a size-1 axis before each, expand, reshape (exact copies)")
def _repeat(r, node, a, repeats):
    v = r.value(a)
    shape = r.tshape(node.args[0])
    shape = [1] * (len(repeats) - len(shape)) + shape
    inter = [d for s in shape for d in (1, s)]
    target = [d for rep, s in zip(repeats, shape) for d in (rep, s)]
    v = r.expand(r.reshape(v, inter), target)
    return r.reshape(v, r.shape(node))


@aten("aten.constant_pad_nd.default", needs=("pad",),
      doc="pad (cat with const blocks of the pad value); negative widths crop (slices)")
def _pad(r, node, a, pad, value=0.0):
    v = r.f(a)
    n = len(v.shape)
    widths = [(0, 0)] * n
    for i in range(len(pad) // 2):
        widths[n - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    for axis, (lo, hi) in enumerate(widths):
        if min(lo, hi) < 0:
            start, stop = max(0, -lo), v.shape[axis] - max(0, -hi)
            if stop <= start:
                raise Unsupported("padding that crops a whole axis away")
            v = r.tp.narrow(v, axis, start, stop)
            widths[axis] = (max(0, lo), max(0, hi))
    if any(lo or hi for lo, hi in widths):
        v = r.tp.pad(v, widths, float(value))
    return v


@aten("aten.index.Tensor", needs=("permute",),
      doc="one index tensor: take along its axis (ids of any shape); several (x[rows, "
          "labels], broadcasting): take by the first, then take_along by each next, the "
          "result's dims placed as torch places them")
def _index(r, node, a, indices):
    given = [(i, t) for i, t in enumerate(indices) if t is not None]
    if any(r.torch_dtype(node.args[1][i]) == "bool" for i, _ in given):
        raise Unsupported("boolean-mask indexing (a data-dependent shape)")
    if len(given) > 1:
        return _index_several(r, node, r.f(a), given)
    axis, ids = given[0]
    v = r.f(a)
    n = len(v.shape)
    if axis == 0:
        return r.tp.take(v, r.ids(ids))
    perm = [axis] + [i for i in range(n) if i != axis]
    out = r.tp.take(r.permute(v, perm), r.ids(ids))
    k = len(out.shape) - (n - 1)           # the ids' dims, now in front
    rest = list(range(k, len(out.shape)))
    back = rest[:axis] + list(range(k)) + rest[axis:]
    return r.permute(out, back)


def _index_several(r, node, v, given):
    """x[i1, ..., im] with index tensors on dims P (broadcast together to bshape): the
    indexed dims permuted to the front, ``take`` by i1 (each expanded to bshape), then
    per next index ``take_along`` of the dim after bshape; torch's result has bshape
    where the first indexed dim was when P are adjacent, in front otherwise."""
    tp, torch = r.tp, r.torch
    n = len(v.shape)
    dims = [i for i, _ in given]
    others = [d for d in range(n) if d not in dims]
    shapes = [tuple(r.tshape(node.args[1][i])) for i in dims]
    bshape = list(np.broadcast_shapes(*shapes)) or [1]

    def ids(i, t):
        if isinstance(t, torch.Tensor):             # a folded index: negatives counted back
            t = torch.remainder(t, v.shape[i])
        g = r.ids(t)
        g = tp.to_f64(g) if tp.holds_ids(g.id) else g
        g = r.reshape(g, [1] * (len(bshape) - len(g.shape)) + list(g.shape))
        return r.expand(g, bshape)

    t = tp.take(r.permute(v, dims + others), ids(*given[0]))    # bshape + dims[1:] + others
    lead = len(bshape)
    for i, g in given[1:]:
        tail = list(t.shape[lead + 1:])
        pick = r.expand(r.reshape(ids(i, g), bshape + [1] * (1 + len(tail))),
                        bshape + [1] + tail)
        t = r.reshape(tp.take_along(t, pick, axis=lead), bshape + tail)
    if dims == list(range(dims[0], dims[0] + len(dims))) and dims[0] > 0:
        before = list(range(lead, lead + dims[0]))               # the others before P
        rest = [d for d in range(len(t.shape)) if d not in before]
        t = r.permute(t, before + rest)
    return r.reshape(t, r.shape(node))


# ── losses whose torch decomposition is not the op ────────────────────────

@aten("aten.multilabel_margin_loss.default",
      needs=("cummax", "take_along", "where", "logical_and", "logical_not", "relu"),
      doc="kept out of run_decompositions (torch 2.13's decomposition counts the entries "
          "after the -1 end marker as targets: another loss). Per sample: valid = the "
          "targets before the first -1 (1 - cummax(t < 0)); z[j, i] = (1 - x[t_j]) + x[i], "
          "relu(z) summed over (j, i) row-major where j is valid and i not a target, / C; "
          "then the reduction")
def _multilabel_margin(r, node, x, target, reduction=1):
    tp = r.tp
    x = r.f(x)
    if len(x.shape) not in (1, 2):
        raise Unsupported(f"an input of rank {len(x.shape)} (torch takes [C] or [N, C])")
    n, c = (1, x.shape[0]) if len(x.shape) == 1 else tuple(x.shape)
    x = r.reshape(x, [n, c])
    t = r.reshape(r.value(r.ids(target)), [n, c])                           # exact integers
    valid = tp.logical_not(tp.cummax(tp.lt(t, r.f(0.0)), axis=1))          # [n, c(j)]
    xt = tp.take_along(x, tp.where(valid, t, r.ids(0)), axis=1)              # x[t_j]
    cols = tp.const(np.arange(c, dtype=np.float64).reshape(1, 1, c))
    valid3 = r.reshape(valid, [n, c, 1])
    hits = tp.logical_and(tp.eq(r.reshape(t, [n, c, 1]), cols), valid3)     # [n, j, i]
    is_target = r.reshape(tp.max(hits, axis=1), [n, 1, c])
    z = tp.add(tp.adds(tp.neg(r.reshape(xt, [n, c, 1])), 1.0), r.reshape(x, [n, 1, c]))
    keep = tp.logical_and(valid3, tp.logical_not(is_target))
    terms = tp.where(keep, tp.relu(z), r.f(0.0))
    per = tp.div(tp.sum(terms, axis=(1, 2)), r.f(float(c)))                # [n]
    if reduction == 1:
        return tp.mean(per)
    if reduction == 2:
        return tp.sum(per)
    return r.reshape(per, r.shape(node))


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
        w = _dropout_of(r, w, dropout_p, True)
    out = tp.bmm(w, r.reshape(vv, [nb, n_s, ev]))
    return r.reshape(out, batch + [n_l, ev])


# ops kept out of run_decompositions only when torch's own decomposition of the program
# fails (GPT-2's SDPA in eval mode: "Cannot view a tensor with shape ..."), each recorded
# by its own entry in this table
RETRY_UNDECOMPOSED = {"aten.scaled_dot_product_attention.default"}


# ops kept out of run_decompositions, each recorded by its own entry in this table
PRESERVE = {"aten.detach.default", "aten.multilabel_margin_loss.default",
            "aten.index_add.default", "aten.bernoulli.default"}


# ── scatter-adds (GNN message passing: index_add, scatter_add, index_put(accumulate)) ──
#
# Each records Tape.index_add (base + scatter of src's entries by the ids, gradtool's
# order: base + (0.0 + src[p0] + src[p1] + ...), within rounding of torch's sequential
# base[v] += src[p]); into a folded base of +0.0 (torch.zeros(...).index_add(...)) just
# the scatter, which is torch's sum to the bit.

def _zero_base(r, base) -> bool:
    """A folded tensor of +0.0 only: adding it changes no bit of a scatter's sum."""
    torch = r.torch
    return (isinstance(base, torch.Tensor) and bool((base == 0).all())
            and not bool(torch.signbit(base).any()))


def _scatter_dims(r, v, d, ids, rows):
    """v (pre + ids.shape + post, the ids' dims from d) scattered by ids into ``rows``
    entries at dim d: pre + [rows] + post."""
    n, k = len(v.shape), len(ids.shape)
    front = list(range(d, d + k)) + list(range(d)) + list(range(d + k, n))
    summed = r.tp.scatter(r.permute(v, front), ids, rows=rows)
    return r.permute(summed, list(range(1, d + 1)) + [0] + list(range(d + 1, n - k + 1)))


def _add_rows(r, node, base, dim, ids, src, alpha=1):
    """base + src's entries of ``dim`` summed by 1-d ``ids`` (torch.index_add)."""
    shape = r.shape(node)
    dim %= len(shape)
    ids = r.ids(ids)
    if _zero_base(r, base):
        v = r.f(src) if alpha == 1 else r.scale(src, alpha)
        return _scatter_dims(r, v, dim, ids, shape[dim])
    return r.tp.index_add(r.f(base), dim, ids, r.f(src), alpha=float(alpha))


@aten("aten.index_add.default", needs=("index_add", "scatter"),
      doc="Tape.index_add: base + scatter of src's entries along dim by the ids (alpha: "
          "muls first); into a folded base of zeros the scatter alone (torch's sum to the "
          "bit). The importer keeps index_add out of run_decompositions (which makes it "
          "index_put)")
def _index_add(r, node, base, dim, ids, src, alpha=1):
    return _add_rows(r, node, base, dim, ids, src, alpha)


def _one_index(r, node, index, dim):
    """The 1-d ids of a scatter_add index that only varies along ``dim`` (PyG's and
    torch_scatter's ``idx.view(-1, 1).expand_as(src)``), else None."""
    torch = r.torch
    shape = r.tshape(node.args[2])
    if isinstance(index, torch.Tensor):             # folded: compare with its first line
        lines = index.movedim(dim, 0).reshape(shape[dim], -1)
        if not bool((lines == lines[:, :1]).all()):
            return None
        return lines[:, 0].contiguous()
    source = node.args[2]
    if any(n != 1 for k, n in enumerate(shape) if k != dim):   # is it an expand of a line?
        if str(source.target) != "aten.expand.default":
            return None
        source = source.args[0]
        inner = r.tshape(source)
        if len(inner) != len(shape) or any(n != 1 for k, n in enumerate(inner) if k != dim):
            return None
        index = r.imp.env[source]
    line = source                       # back through views to the ids leaf, if any: its
    while True:                         # uploaded index beats scanning computed ids
        value = r.imp.env.get(line)
        if r.is_ids(value) and list(value.shape) == [shape[dim]]:
            return value
        if str(getattr(line, "target", "")) not in _VIEWS or math.prod(
                r.tshape(line.args[0])) != shape[dim]:
            return r.reshape(r.value(r.ids(index)), [shape[dim]])    # i64: to_f64 first
        line = line.args[0]


_VIEWS = {"aten.view.default", "aten.reshape.default", "aten._unsafe_view.default",
          "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
          "aten.squeeze.default", "aten.flatten.using_ints"}


# Any other index (one varying along other dims than dim, or covering part of the output;
# index_put's several index tensors) names the output's entries one by one: each position's
# linear id into the output laid out with the indexed dims first, one scatter by those ids
# into [size], reshaped and permuted back.  A folded index's ids are computed at import by
# torch itself (gather / index of a table of the ids: torch's range checks, negatives and
# broadcasting); a computed index's are integer-valued ops of it, index * stride added to
# a folded table of the rest.  Laid out so, a leading-dim id out of range makes an id out
# of [0, size), which the scatter refuses at replay as torch raises; index_put's other
# computed index tensors are checked by masks (a bad one turns its ids to -1).

def _positions(r, shape, lead):
    """A folded tensor of ``shape``: each entry's linear id in the layout with the dims
    ``lead`` first (the others after them, in order); and that layout (a permutation)."""
    perm = list(lead) + [k for k in range(len(shape)) if k not in lead]
    laid = r.torch.arange(math.prod(shape)).reshape([shape[k] for k in perm])
    return laid.permute([perm.index(k) for k in range(len(shape))]), perm


def _folded_ids(r, op, fn):
    """fn() (torch picking the linear ids of a folded index), refused where torch
    refuses that index."""
    try:
        return fn()
    except (RuntimeError, IndexError) as exc:
        raise Unsupported(f"{op} by a folded index torch refuses "
                          f"({str(exc).strip().splitlines()[0]})") from None


def _plus_index(r, lin, i, stride):
    """lin + i * stride: i an integer-valued GVar, lin one or a folded integer tensor;
    integer-valued."""
    if stride != 1:
        i = r.tp.mul(i, r.value(r.torch.tensor([stride])))
    return r.tp.add(r.value(lin), i)


def _scatter_ids(r, node, dim, index):
    """A scatter_add index's linear ids (shaped like it) into the output laid out with
    ``dim`` first, and that layout."""
    torch = r.torch
    shape, ishape = r.shape(node), r.shape(node.args[2])
    pos, perm = _positions(r, shape, [dim])
    if isinstance(index, torch.Tensor):
        lin = _folded_ids(r, "scatter_add",
                          lambda: pos.gather(dim, index.long().reshape(ishape)))
        return r.ids(lin), perm
    offsets = pos.gather(dim, torch.zeros(ishape, dtype=torch.int64))
    return _plus_index(r, offsets, r.value(r.ids(index)), math.prod(shape) // shape[dim]), perm


def _index_put_ids(r, node, indices):
    """index_put's linear ids of several index tensors (None: a full slice) into base laid
    out with the indexed dims first, shaped like the indexed part (torch's advanced
    indexing: the index tensors broadcast, in their place where adjacent, else first); and
    that layout.  Folded index tensors count negatives back; computed ones must lie in
    [0, n), as index_put's one-index path reads them."""
    torch, tp = r.torch, r.tp
    shape = r.shape(node)
    given = [k for k, t in enumerate(indices) if t is not None]
    pos, perm = _positions(r, shape, given)
    ishapes = {k: r.tshape(node.args[1][k]) for k in given}
    computed = [k for k in given if not isinstance(indices[k], torch.Tensor)]
    table = [None if t is None else t.long() if k not in computed       # computed: at 0
             else torch.zeros(ishapes[k], dtype=torch.int64) for k, t in enumerate(indices)]
    lin = _folded_ids(r, "index_put", lambda: torch.ops.aten.index(pos, table))
    if not computed:
        return r.ids(lin), perm
    bshape = list(torch.broadcast_shapes(*[torch.Size(s) for s in ishapes.values()]))
    at = given[0] if given == list(range(given[0], given[-1] + 1)) else 0
    after = lin.dim() - at - len(bshape)            # the sliced dims after the broadcast
    bad = None
    for k in computed:
        lead = [1] * (at + len(bshape) - len(ishapes[k]))
        i = r.reshape(r.value(r.ids(indices[k])), lead + ishapes[k] + [1] * after)
        if k != perm[0]:                            # the scatter checks the leading one
            out = tp.logical_or(tp.lt(i, r.f(0.0)), tp.ge(i, r.f(float(shape[k]))))
            bad = out if bad is None else tp.logical_or(bad, out)
        lin = _plus_index(r, lin, i, math.prod(shape[j] for j in perm[perm.index(k) + 1:]))
    return (lin if bad is None else tp.where(bad, -1, lin)), perm


def _scatter_flat(r, shape, perm, v, lin):
    """v (shaped like the linear ids ``lin`` of the layout ``perm``) summed by them into
    a tensor of ``shape``."""
    flat = r.tp.scatter(v, lin, rows=math.prod(shape))
    laid = r.reshape(flat, [shape[k] for k in perm])
    return r.permute(laid, [perm.index(k) for k in range(len(shape))])


def _broadcast(r, v, target):
    """v broadcast to ``target`` (torch's rules: leading dims added)."""
    v = r.f(v)
    return r.expand(r.reshape(v, [1] * (len(target) - len(v.shape)) + list(v.shape)), target)


def _scatter_add_rows(r, node, base, dim, index, src, reduce="sum", include_self=True):
    """torch.scatter_add, and scatter_reduce's 'sum' and 'mean': base's entries with src's
    summed into them by the index (mean: divided by their counts, base's included where
    include_self; without it, the entries the index names are src's alone)."""
    torch, tp = r.torch, r.tp
    shape, src_shape = r.shape(node), r.shape(node.args[3])
    ishape = r.shape(node.args[2])
    dim %= len(shape)
    v = r.f(src)
    for k, n in enumerate(ishape):                 # torch reads src where index reaches
        if src_shape[k] != n:
            v = r.slice_axis(v, k, 0, n, 1)
    covers = bool(r.tshape(node.args[2])) and all(
        ishape[k] == shape[k] for k in range(len(shape)) if k != dim)
    ids = _one_index(r, node, index, dim) if covers else None
    if ids is not None:
        ids = r.ids(ids)
        if reduce == "sum" and include_self:
            return _add_rows(r, node, base, dim, ids, v)
        place = lambda t: _scatter_dims(r, t, dim, ids, shape[dim])   # noqa: E731
    else:
        lin, perm = _scatter_ids(r, node, dim, index)
        place = lambda t: _scatter_flat(r, shape, perm, t, lin)       # noqa: E731
    summed, zero = place(v), _zero_base(r, base)
    if reduce == "sum" and (include_self or zero):
        return summed if zero else tp.add(r.f(base), summed)
    folded = isinstance(index, torch.Tensor)
    if folded:                                      # the counts: folded, or scattered ones
        count = torch.zeros(shape, dtype=torch.float64).scatter_add(
            dim, index.long().reshape(ishape), torch.ones(ishape, dtype=torch.float64))
    else:
        count = place(r.f(torch.ones(ishape, dtype=torch.float64)))
    if reduce == "mean":
        if include_self:
            return tp.div(summed if zero else tp.add(r.f(base), summed),
                          r.f(count + 1) if folded else tp.adds(count, 1.0))
        summed = tp.div(summed, r.f(count.clamp(min=1)) if folded
                        else tp.maximum(count, r.f(1.0)))
        if zero:
            return summed
    hit = r.f((count > 0).double()) if folded else tp.gt(count, r.f(0.0))
    return tp.where(hit, summed, r.f(base))      # the entries the index names: src's alone


@aten("aten.scatter_add.default", needs=("index_add", "scatter"),
      doc="index_add where the index only varies along dim (a 1-d index expanded along "
          "the others, PyG's and torch_scatter's pattern, or a folded index constant "
          "along them); any other index: one scatter by linear ids into the output laid "
          "out with dim first (a folded index's computed by torch at import; a computed "
          "one's index * stride + a folded table of the other dims' offsets), reshaped, "
          "permuted back and added to base")
def _scatter_add(r, node, base, dim, index, src):
    return _scatter_add_rows(r, node, base, dim, index, src)


@aten("aten.scatter_reduce.two", needs=("index_add", "scatter", "where"),
      doc="reduce='sum' with include_self=True: as scatter_add; include_self=False: where "
          "the index names an entry (count > 0, the counts a scatter of ones, folded for a "
          "folded index) the sum, else base. reduce='mean': the sum (base's included "
          "where include_self) / (count + 1) with include_self, else / max(count, 1) "
          "where count > 0 and base elsewhere (torch's definition); amax, amin and prod "
          "are refused")
def _scatter_reduce(r, node, base, dim, index, src, reduce, include_self=True):
    if reduce not in ("sum", "mean"):
        raise Unsupported(f"scatter_reduce with reduce={reduce!r} (only 'sum' and 'mean' "
                          "import)")
    if reduce == "mean" and r.torch_dtype(node) != "float":
        raise Unsupported("scatter_reduce with reduce='mean' of integer data (torch floors "
                          "the quotient)")
    return _scatter_add_rows(r, node, base, dim, index, src, reduce, include_self)


@aten("aten.index_put.default", needs=("index_add", "scatter", "where"),
      doc="accumulate=True (x.index_put_(indices, v, accumulate=True); not x[ids] += v, "
          "which exports as an assignment): values broadcast to the indexed shape; one "
          "index tensor: scatter of them by the ids (folded ids: negatives counted back) "
          "added to base; several (None: full slices): one scatter by linear ids into base "
          "laid out with the indexed dims first (folded ones computed by torch at import; "
          "computed ones index * stride added up, each not leading checked by masks) "
          "added to base; an assignment (accumulate=False) or a boolean mask is refused")
def _index_put(r, node, base, indices, values, accumulate=False):
    given = [(k, t) for k, t in enumerate(indices) if t is not None]
    if not accumulate:
        raise Unsupported("index_put without accumulate (an assignment by index, x[ids] = v: "
                          "the last of repeated ids wins)")
    if any(r.torch_dtype(node.args[1][k]) == "bool" for k, _ in given):
        raise Unsupported("index_put by a boolean mask (a data-dependent shape)")
    shape = r.shape(node)
    if len(given) == 1:
        d, ids = given[0]
        if isinstance(ids, r.torch.Tensor):
            ids = r.torch.remainder(ids, shape[d])
        ids = r.ids(ids)
        v = _broadcast(r, values, shape[:d] + list(ids.shape) + shape[d + 1:])
        summed = _scatter_dims(r, v, d, ids, shape[d])
    else:
        lin, perm = _index_put_ids(r, node, indices)
        summed = _scatter_flat(r, shape, perm, _broadcast(r, values, list(lin.shape)), lin)
    return summed if _zero_base(r, base) else r.tp.add(r.f(base), summed)


# ── complex values (rotary embeddings as LLaMA's reference code writes them) ──────
#
# The tape holds float64 values only, so a complex tensor is a pair of them, its real
# and its imaginary part, each of the complex tensor's shape (a folded complex tensor,
# a complex buffer: two consts, lifted once; complex64 values are exact in float64).
# The importer sends every node that reads or makes a complex tensor (by the exported
# dtypes) to COMPLEX instead of ATEN; an op COMPLEX lacks is refused in one line.

@dataclass(frozen=True)
class Complex:
    """A complex value on the tape: its real and imaginary parts, two f64 GVars of the
    complex tensor's shape."""
    re: object
    im: object

    @property
    def parts(self) -> tuple:
        return (self.re, self.im)


COMPLEX: dict[str, Entry] = {}

COMPLEX_ONLY = ("complex tensors: gradtool imports view_as_complex, view_as_real, polar, "
                "mul, add, sub, neg, conj and layout ops (views, slices, permutes, expand, "
                "cat, stack, split) of complex values only, each a pair of float64 parts")


def complex_op(*names, needs=(), doc=""):
    """Register the complex form of ATen ops: ``fn(r, node, *args, **kwargs)`` gets the
    node's arguments as an ATEN entry does, complex ones as :class:`Complex`, a folded
    complex tensor or a Python complex number as they are (``r.complex`` lifts them)."""
    def register(fn):
        for name in names:
            if name in COMPLEX:
                raise ValueError(f"{name} is mapped twice")
            COMPLEX[name] = Entry(name, fn, tuple(needs), doc)
        return fn
    return register


def _part(r, obj, i):
    """``obj`` (arguments, nested lists and tuples) with each complex value replaced by
    its real (i = 0) or imaginary (i = 1) part; a real tensor among them is refused."""
    if r.is_complex(obj):
        return r.complex(obj).parts[i]
    if isinstance(obj, (list, tuple)):
        return type(obj)(_part(r, x, i) for x in obj)
    if isinstance(obj, dict):
        return {k: _part(r, v, i) for k, v in obj.items()}
    if r.is_gvar(obj) or isinstance(obj, r.torch.Tensor):
        raise Unsupported(f"a real tensor among complex ones; {COMPLEX_ONLY}")
    return obj


def _on_parts(fn):
    """The complex form of the ATEN entry ``fn`` (a layout op, neg): ``fn`` once on the
    real parts and once on the imaginary parts."""
    def on_parts(r, node, *args, **kwargs):
        re, im = (fn(r, node, *_part(r, args, i), **_part(r, kwargs, i)) for i in (0, 1))
        if isinstance(re, tuple):                       # split, unbind
            return tuple(Complex(a, b) for a, b in zip(re, im))
        return Complex(re, im)
    return on_parts


for _name in ["aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
              "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
              "aten.squeeze.default", "aten.view_copy.default", "aten.flatten.using_ints",
              "aten.unflatten.int", "aten.clone.default", "aten.contiguous.default",
              "aten.lift_fresh_copy.default", "aten.alias.default", "aten.detach.default",
              "aten.permute.default", "aten.t.default", "aten.transpose.int",
              "aten.expand.default", "aten.slice.Tensor", "aten.select.int",
              "aten.split_with_sizes.default", "aten.split.Tensor", "aten.unbind.int",
              "aten.cat.default", "aten.stack.default", "aten.neg.default"]:
    complex_op(_name, needs=ATEN[_name].needs,
               doc="the real op on the real parts and on the imaginary parts")(
        _on_parts(ATEN[_name].fn))


@complex_op("aten.view_as_complex.default",
            doc="(x[..., 0], x[..., 1]): two slices of the last axis, reshaped (exact copies)")
def _view_as_complex(r, node, x):
    v = r.value(x)
    last = len(r.tshape(node.args[0])) - 1
    return Complex(*(r.reshape(r.slice_axis(v, last, i, i + 1, 1), r.shape(node))
                     for i in (0, 1)))


@complex_op("aten.view_as_real.default", needs=("cat",),
            doc="the real and the imaginary part stacked on a new last axis: cat (exact)")
def _view_as_real(r, node, c):
    shape = r.tshape(node)
    return r.tp.cat([r.reshape(p, shape[:-1] + [1]) for p in r.complex(c).parts],
                    len(shape) - 1)


@complex_op("aten.polar.default", needs=("sin", "cos"),
            doc="(abs * cos(angle), abs * sin(angle)), as torch's kernel computes it")
def _polar(r, node, magnitude, angle):
    m, t = r.f(magnitude), r.f(angle)
    return Complex(r.tp.mul(m, r.tp.cos(t)), r.tp.mul(m, r.tp.sin(t)))


@complex_op("aten._conj.default", "aten.conj_physical.default",
            doc="(re, neg(im)): exact (torch's conjugate view is resolved at once)")
def _conj(r, node, c):
    c = r.complex(c)
    return Complex(c.re, r.tp.neg(c.im))


@complex_op("aten.mul.Tensor", "aten.mul.Scalar",
            doc="complex * complex: (ar * br - ai * bi, ar * bi + ai * br), each product "
                "rounded, then the sum or difference (torch's order; a fused kernel may "
                "differ by an ulp); by a real tensor or number: each part times it "
                "(torch's ar * b - ai * 0 is ar * b)")
def _complex_mul(r, node, a, b):
    if not (r.is_complex(a) and r.is_complex(b)):
        c, x = (a, b) if r.is_complex(a) else (b, a)
        return Complex(*(_mul(r, node, p, x) for p in r.complex(c).parts))
    a, b, tp = r.complex(a), r.complex(b), r.tp
    return Complex(tp.sub(tp.mul(a.re, b.re), tp.mul(a.im, b.im)),
                   tp.add(tp.mul(a.re, b.im), tp.mul(a.im, b.re)))


@complex_op("aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar",
            doc="the real op on the real parts and on the imaginary parts (alpha as the "
                "real op's); with a real operand, the other's imaginary part as it is "
                "(sub: negated), broadcast to the result's shape")
def _complex_add(r, node, a, b, alpha=1):
    if isinstance(alpha, complex):
        raise Unsupported(f"a complex alpha; {COMPLEX_ONLY}")
    op = _sub if str(node.target).startswith("aten.sub") else _add
    ca, cb = (r.complex(v) if r.is_complex(v) else None for v in (a, b))
    re = op(r, node, ca.re if ca else a, cb.re if cb else b, alpha)
    if ca and cb:
        im = op(r, node, ca.im, cb.im, alpha)
    elif ca:
        im = ca.im
    else:
        im = cb.im if alpha == 1 else r.scale(cb.im, alpha)
        im = r.tp.neg(im) if op is _sub else im
    return Complex(re, r.expand(im, r.shape(node)))


@complex_op("aten._to_copy.default", "aten.to.dtype",
            doc="between complex dtypes: the same pair (every complex value is complex128); "
                "to or from a real dtype refused")
def _complex_to_copy(r, node, a, *args, **kwargs):
    if not (r.is_complex(a) and r.torch_dtype(node) == "complex"):
        raise Unsupported(f"a conversion between complex and real dtypes; {COMPLEX_ONLY}")
    return r.complex(a)


# ── constants that only depend on shapes (folded at import; listed here for the report)

SHAPE_ONLY = {
    "aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default",
    "aten.empty_like.default", "aten.new_zeros.default", "aten.new_ones.default",
    "aten.new_full.default", "aten.new_empty.default", "aten.scalar_tensor.default",
    "aten.full.default", "aten.zeros.default", "aten.ones.default", "aten.empty.memory_format",
    "aten.arange.start_step", "aten.arange.default", "aten.arange.start",
}

# ops that draw random numbers: never folded (a draw frozen at import would be another
# program); those ATEN maps import as gradtool's counter-based draws (gradtool.nn.rand,
# randint, randperm; dropout, bernoulli and normal besides), any other is refused
RANDOM = {
    "aten.rand.default", "aten.rand_like.default", "aten.randint.default",
    "aten.randint_like.default", "aten.randperm.default", "aten.uniform.default",
}

# no-op bookkeeping nodes torch.export leaves in graphs
SKIP = {"aten._assert_scalar.default", "aten._assert_tensor_metadata.default",
        "aten.sym_constrain_range_for_size.default", "aten.sym_constrain_range.default",
        "aten._assert_async.msg", "aten._assert_async.default"}


def docs_table() -> str:
    """The supported-op table of docs/torch.md (generated by ``python -m gradtool.codegen``)."""
    rows = ["| ATen op | recorded as | needs |", "|---|---|---|"]
    for name in sorted(ATEN):
        e = ATEN[name]
        needs = ", ".join(f"`{n}`" for n in e.needs) or "-"
        rows.append(f"| `{name}` | {e.doc.replace('|', chr(92) + '|')} | {needs} |")
    rows.append("")
    rows.append("Folded at import when they depend only on shapes and constants (evaluated "
                "once by torch in float64, recorded as consts): any op; always folded: "
                + ", ".join(f"`{n}`" for n in sorted(SHAPE_ONLY)) + ".")
    rows += ["", "Complex values (Meta's LLaMA rotary embeddings: `view_as_complex`, a "
             "product by the complex table, `view_as_real`) are pairs of float64 values, "
             "the real and the imaginary part; a node that reads or makes a complex tensor "
             "is recorded by this table instead, and any op it lacks is refused "
             f"(\"{COMPLEX_ONLY}\"):", "",
             "| ATen op on complex values | recorded as | needs |", "|---|---|---|"]
    for name in sorted(COMPLEX):
        e = COMPLEX[name]
        needs = ", ".join(f"`{n}`" for n in e.needs) or "-"
        rows.append(f"| `{name}` | {e.doc.replace('|', chr(92) + '|')} | {needs} |")
    return "\n".join(rows) + "\n"


# ── convolutional layers (issue 21) ────────────────────────────────────────
#
# ATen mappings of the convolutional ops (issue 21): convolution, batch norm, pooling.
#
# Each entry records through ``gradtool.nn``:
#
# * ``aten.convolution.default``: ``nn.conv2d`` (NCHW) or ``nn.conv1d`` (NCL), bias
#   added by broadcasting; transposed: ``nn.conv_transpose2d`` or ``nn.conv_transpose1d``.
# * ``aten.max_pool2d_with_indices.default``: ``nn.max_pool2d`` (the values; a graph
#   that reads the indices is refused by the importer's getitem check).
# * ``aten.avg_pool2d.default``: ``nn.avg_pool2d`` (``divisor_override`` refused).
# * ``aten._native_batch_norm_legit_no_training.default``: ``nn.batch_norm2d`` with the
#   running statistics as consts (eval mode).
# * ``aten._native_batch_norm_legit_functional.default``: ``nn.batch_norm2d_train``
#   (train mode): the new running statistics are its outputs 3 and 4, which the
#   importer turns into named outputs under the buffers' names (its BUFFER_MUTATION
#   rule), the buffers themselves being state slots of those names (named consts the
#   outputs replace after every training step); eval mode through this overload
#   records ``nn.batch_norm2d``.
# * ``aten.mean.dim`` (adaptive average pooling to 1x1) is the table's own mean entry.




def _pair(v, what):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if len(v) == 1:
        v = v * 2
    if len(v) != 2 or not all(isinstance(x, int) for x in v):
        raise Unsupported(f"{what} {v} is not one or two ints")
    return v


@aten("aten.convolution.default", needs=("conv2d", "nn.conv2d", "nn.conv1d",
                                         "nn.conv_transpose2d", "nn.conv_transpose1d"),
      doc="gradtool.nn.conv2d (NCHW), nn.conv1d (NCL) or nn.conv3d (NCDHW: a conv2d per "
          "output depth of the depth slab merged into the channels); transposed: "
          "nn.conv_transpose2d or nn.conv_transpose1d (a conv2d of the stride-spread "
          "input); the bias a broadcast add")
def _convolution(r, node, x, w, bias, stride, padding, dilation, transposed,
                 output_padding, groups):
    from .. import nn
    x, w = r.f(x), r.f(w)
    b = None if bias is None else r.f(bias)
    if transposed:
        return _conv_transpose(x, w, b, stride, padding, dilation, output_padding, groups)
    if len(x.shape) == 4:
        return nn.conv2d(x, w, b, stride=_pair(stride, "stride"),
                         padding=_pair(padding, "padding"),
                         dilation=_pair(dilation, "dilation"), groups=int(groups))
    if len(x.shape) == 3:
        one = lambda v: (list(v) if isinstance(v, (list, tuple)) else [v])[0]   # noqa: E731
        return nn.conv1d(x, w, b, stride=one(stride), padding=one(padding),
                         dilation=one(dilation), groups=int(groups))
    if len(x.shape) == 5:
        return nn.conv3d(x, w, b, stride=stride, padding=padding, dilation=dilation,
                         groups=int(groups))
    raise Unsupported(f"a convolution of a rank-{len(x.shape)} input (1-d, 2-d and 3-d only)")


def _conv_transpose(x, w, b, stride, padding, dilation, output_padding, groups):
    from .. import nn
    if len(x.shape) == 4:
        return nn.conv_transpose2d(x, w, b, stride=_pair(stride, "stride"),
                                   padding=_pair(padding, "padding"),
                                   output_padding=_pair(output_padding, "output_padding"),
                                   groups=int(groups), dilation=_pair(dilation, "dilation"))
    if len(x.shape) == 3:
        one = lambda v: (list(v) if isinstance(v, (list, tuple)) else [v])[0]   # noqa: E731
        return nn.conv_transpose1d(x, w, b, stride=one(stride), padding=one(padding),
                                   output_padding=one(output_padding), groups=int(groups),
                                   dilation=one(dilation))
    if len(x.shape) == 5:
        return nn.conv_transpose3d(x, w, b, stride=stride, padding=padding,
                                   output_padding=output_padding, groups=int(groups),
                                   dilation=dilation)
    raise Unsupported(f"a transposed convolution of a rank-{len(x.shape)} input (1-d, 2-d "
                      f"and 3-d only)")


@aten("aten.max_pool2d_with_indices.default", needs=("max_pool2d",),
      doc="gradtool.nn.max_pool2d (the values; the indices are not recorded)")
def _max_pool2d(r, node, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    from .. import nn
    k = _pair(kernel_size, "kernel_size")
    y = nn.max_pool2d(r.f(x), k, _pair(stride, "stride") if stride else k,
                      _pair(padding, "padding"), _pair(dilation, "dilation"),
                      ceil_mode=bool(ceil_mode))
    return (y, None)


@aten("aten.avg_pool2d.default", needs=("avg_pool2d",),
      doc="gradtool.nn.avg_pool2d (ceil_mode, count_include_pad; no divisor_override)")
def _avg_pool2d(r, node, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    from .. import nn
    if divisor_override is not None:
        raise Unsupported("avg_pool2d's divisor_override")
    k = _pair(kernel_size, "kernel_size")
    return nn.avg_pool2d(r.f(x), k, _pair(stride, "stride") if stride else k,
                         _pair(padding, "padding"), ceil_mode=bool(ceil_mode),
                         count_include_pad=bool(count_include_pad))


def _batched(r, x, fn, rank, what):
    """fn of x of ``rank`` dims ([N, C, ...]), or of an unbatched x (one dim fewer) as a
    batch of one; any other rank is refused."""
    if len(x.shape) not in (rank - 1, rank):
        raise Unsupported(f"{what} of a rank-{len(x.shape)} input")
    if len(x.shape) == rank - 1:
        y = fn(r.reshape(x, [1] + list(x.shape)))
        return r.reshape(y, list(y.shape[1:]))
    return fn(x)


@aten("aten.max_pool3d_with_indices.default", needs=("nn.max_pool3d",),
      doc="gradtool.nn.max_pool3d (per output depth the maximum of the max_pool2d of each "
          "depth in its window; the values, the indices are not recorded)")
def _max_pool3d(r, node, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    from .. import nn
    return (_batched(r, r.f(x), lambda v: nn.max_pool3d(
        v, kernel_size, stride or None, padding, dilation, bool(ceil_mode)), 5,
        "max_pool3d"), None)


@aten("aten.avg_pool3d.default", needs=("nn.avg_pool3d",),
      doc="gradtool.nn.avg_pool3d (the avg_pool2d of each depth in the window summed and "
          "divided by the depth count; ceil_mode, count_include_pad; no divisor_override)")
def _avg_pool3d(r, node, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    from .. import nn
    if divisor_override is not None:
        raise Unsupported("avg_pool3d's divisor_override")
    return _batched(r, r.f(x), lambda v: nn.avg_pool3d(
        v, kernel_size, stride or None, padding, bool(ceil_mode), bool(count_include_pad)), 5,
        "avg_pool3d")


def _optional(r, v):
    return None if v is None else r.f(v)


def _as_nchw(r, x):
    """Batch norm's input as [N, C, H, W]: [N, C] and [N, C, L] (BatchNorm1d) and [N, C,
    D, H, W] (BatchNorm3d) reshaped to [N, C, rest, 1], the same values per channel."""
    if len(x.shape) < 2:
        raise Unsupported(f"batch norm of a rank-{len(x.shape)} input")
    n, c = x.shape[:2]
    rest = math.prod(x.shape[2:])
    return x if len(x.shape) == 4 else r.reshape(x, [n, c, rest, 1])


@aten("aten._native_batch_norm_legit_no_training.default", needs=("nn.batch_norm2d",),
      doc="gradtool.nn.batch_norm2d (eval mode: the running statistics as consts)")
def _batch_norm_eval(r, node, x, weight, bias, running_mean, running_var, momentum, eps):
    from .. import nn
    x = r.f(x)
    y = nn.batch_norm2d(_as_nchw(r, x), _optional(r, weight), _optional(r, bias),
                        r.f(running_mean), r.f(running_var), eps=float(eps))
    return (r.reshape(y, x.shape), None, None)


@aten("aten._native_batch_norm_legit_functional.default",
      needs=("nn.batch_norm2d_train",),
      doc="gradtool.nn.batch_norm2d_train (batch statistics; the running statistics' "
          "update as the buffers' named outputs)")
def _batch_norm_train(r, node, x, weight, bias, running_mean, running_var, training,
                      momentum, eps):
    from .. import nn
    x = r.f(x)
    x4 = _as_nchw(r, x)
    w, b = _optional(r, weight), _optional(r, bias)
    if not training:
        y = nn.batch_norm2d(x4, w, b, r.f(running_mean), r.f(running_var), eps=float(eps))
        return (r.reshape(y, x.shape), None, None, r.f(running_mean), r.f(running_var))
    y, new_mean, new_var = nn.batch_norm2d_train(x4, w, b, r.f(running_mean),
                                                 r.f(running_var), momentum=float(momentum),
                                                 eps=float(eps))
    return (r.reshape(y, x.shape), None, None, new_mean, new_var)


@aten("aten._native_batch_norm_legit.no_stats", needs=("nn.batch_norm2d_train",),
      doc="gradtool.nn.batch_norm2d_train without running statistics (instance norm: "
          "torch's [1, N*C, ...] view, the batch statistics per channel)")
def _batch_norm_no_stats(r, node, x, weight, bias, training, momentum, eps):
    from .. import nn
    if not training:
        raise Unsupported("batch norm in eval mode without running statistics")
    x = r.f(x)
    y, _, _ = nn.batch_norm2d_train(_as_nchw(r, x), _optional(r, weight), _optional(r, bias),
                                    eps=float(eps))
    return (r.reshape(y, x.shape), None, None)


@aten("aten.native_group_norm.default", needs=("nn.group_norm",),
      doc="gradtool.nn.group_norm (native_layer_norm of each group, then weight and bias)")
def _group_norm(r, node, x, weight, bias, n, c, hxw, group, eps):
    from .. import nn
    y = nn.group_norm(r.f(x), int(group), _optional(r, weight), _optional(r, bias),
                      eps=float(eps))
    return (y, None, None)


@aten("aten._adaptive_avg_pool2d.default", needs=("nn.adaptive_avg_pool2d",),
      doc="gradtool.nn.adaptive_avg_pool2d (avg_pool2d where the sizes divide, else the "
          "mean of each window's row means)")
def _adaptive_avg_pool2d(r, node, x, output_size):
    from .. import nn
    return _adaptive_pool(r, nn.adaptive_avg_pool2d, "average", x, output_size)


def _adaptive_pool(r, pool, what, x, output_size):
    """One of nn's adaptive poolings of an [N, C, H, W] input, or of an unbatched [C, H, W]
    one as a batch of one."""
    size = [int(v) for v in output_size]
    return _batched(r, r.f(x), lambda v: pool(v, size), 4, f"adaptive {what} pooling")


@aten("aten.adaptive_max_pool2d.default", needs=("nn.adaptive_max_pool2d",),
      doc="gradtool.nn.adaptive_max_pool2d (max_pool2d where the sizes divide, else the "
          "max of each window's row maxima; the values, the indices not recorded)")
def _adaptive_max_pool2d(r, node, x, output_size):
    from .. import nn
    return (_adaptive_pool(r, nn.adaptive_max_pool2d, "max", x, output_size), None)


@aten("aten._adaptive_avg_pool3d.default", needs=("nn.adaptive_avg_pool3d",),
      doc="gradtool.nn.adaptive_avg_pool3d (the mean of each window's means, along W, H, D)")
def _adaptive_avg_pool3d(r, node, x, output_size):
    from .. import nn
    size = [int(v) for v in output_size]
    return _batched(r, r.f(x), lambda v: nn.adaptive_avg_pool3d(v, size), 5,
                    "adaptive average pooling")


@aten("aten.adaptive_max_pool3d.default", needs=("nn.adaptive_max_pool3d",),
      doc="gradtool.nn.adaptive_max_pool3d (the max of each window's maxima along W, H, D; "
          "the values, the indices not recorded)")
def _adaptive_max_pool3d(r, node, x, output_size):
    from .. import nn
    size = [int(v) for v in output_size]
    return (_batched(r, r.f(x), lambda v: nn.adaptive_max_pool3d(v, size), 5,
                     "adaptive max pooling"), None)


@aten("aten.grid_sampler_2d.default", needs=("nn.grid_sample",),
      doc="gradtool.nn.grid_sample: bilinear, zero padding (torch's floor rule for the "
          "grid's gradient); nearest and bicubic modes, border and reflection padding "
          "refused")
def _grid_sampler_2d(r, node, x, grid, interpolation_mode, padding_mode, align_corners):
    from .. import nn
    if interpolation_mode != 0 or padding_mode != 0:
        modes = ("bilinear", "nearest", "bicubic")
        pads = ("zeros", "border", "reflection")
        raise Unsupported(f"grid_sample with mode {modes[interpolation_mode]!r} and "
                          f"padding_mode {pads[padding_mode]!r} (bilinear, zeros only)")
    return nn.grid_sample(r.f(x), r.f(grid), align_corners=bool(align_corners))


@aten("aten.upsample_bilinear2d.vec", "aten.upsample_bilinear2d.default",
      needs=("nn.upsample_bilinear2d",),
      doc="gradtool.nn.upsample_bilinear2d (torch's taps and weights; along W, then H)")
def _upsample_bilinear2d(r, node, x, output_size, align_corners, *scales):
    from .. import nn
    x = r.f(x)
    if len(scales) == 1:                       # .vec: scale_factors (or None)
        scales = scales[0] if scales[0] is not None else (None, None)
    return nn.upsample_bilinear2d(x, r.tshape(node)[2:], bool(align_corners),
                                  [None if v is None else float(v) for v in scales])


@aten("aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default",
      "aten._upsample_nearest_exact2d.vec", "aten._upsample_nearest_exact2d.default",
      needs=("index_select",),
      doc="index_select of rows, then of columns, by the source indices torch's own kernel "
          "picks (it is run once on a map of indices at import): copies")
def _upsample_nearest2d(r, node, x, *args, **kwargs):
    import numpy as np
    import torch
    x = r.f(x)
    n, c, h, w = x.shape
    oh, ow = r.tshape(node)[2:]
    where = torch.arange(h * w, dtype=torch.float64).reshape(1, 1, h, w)
    src = node.target(where, *args, **kwargs)[0, 0].numpy().astype(np.int64)
    rows, cols = src[:, 0] // w, src[0, :] % w
    if src.shape != (oh, ow) or not np.array_equal(src, rows[:, None] * w + cols[None, :]):
        raise Unsupported("a nearest upsampling that is not one source row and column per "
                          "output row and column (an importer bug)")
    if not np.array_equal(rows, np.arange(h)):
        x = r.tp.index_select(x, 2, rows)
    if not np.array_equal(cols, np.arange(w)):
        x = r.tp.index_select(x, 3, cols)
    return x
