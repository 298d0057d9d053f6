"""Elementwise ATen ops: arithmetic, the table's unary ops, the math the table lacks
(:mod:`gradtool.composites.math`), activations, clamps, comparisons, masks and where."""

from __future__ import annotations

import inspect
from ... import nn
from ...composites import math as cmath
from .registry import Unsupported, aten, has, is_num


# ── elementwise arithmetic ─────────────────────────────────────────────────

@aten("aten.add.Tensor", "aten.add.Scalar", doc="add; a number operand: adds")
def record_add(r, node, a, b, alpha=1):
    if alpha != 1:
        b = r.scale(b, alpha)
    if is_num(b):
        return r.tp.adds(r.f(a), float(b))
    if is_num(a):
        return r.tp.adds(r.f(b), float(a))
    return r.tp.add(r.f(a), r.f(b))


@aten("aten.sub.Tensor", "aten.sub.Scalar", doc="sub; a number operand: adds (of -b, exact)")
def record_sub(r, node, a, b, alpha=1):
    if alpha != 1:
        b = r.scale(b, alpha)
    if is_num(b):
        return r.tp.adds(r.f(a), -float(b))
    if is_num(a):
        return r.tp.adds(r.tp.neg(r.f(b)), float(a))
    return r.tp.sub(r.f(a), r.f(b))


@aten("aten.rsub.Scalar", "aten.rsub.Tensor", doc="b - a, as sub")
def _rsub(r, node, a, b, alpha=1):
    return record_sub(r, node, b, a, alpha)


@aten("aten.mul.Tensor", "aten.mul.Scalar", doc="mul; a number operand: muls")
def record_mul(r, node, a, b):
    if is_num(b):
        return r.tp.muls(r.f(a), float(b))
    if is_num(a):
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


# ── elementwise math torch has and the table lacks: gradtool.composites.math ────────
#
# Each entry is the composite (its docstring gives the formula and the order of the
# roundings); the doc strings here are docs/torch.md's table.

def _composite(aten_name, fn, needs, doc):
    @aten(aten_name, needs=needs, doc=f"{doc} (composites.math.{fn.__name__})")
    def entry(r, node, a):
        return fn(r.f(a))
    return entry


for _name, _needs, _doc in [
        ("log2", ("log",), "log(a) / ln 2, the constant rounded once"),
        ("log10", ("log",), "log(a) / ln 10, the constant rounded once"),
        ("exp2", ("exp",), "exp(a * ln 2): within about (|a| + 2) ulps"),
        ("tan", ("sin", "cos"), "sin(a) / cos(a)"),
        ("sinh", ("expm1", "exp", "where"),
         "odd; for 0 <= x < 22, e = expm1(x), (e + e / (e + 1)) * 0.5 (fdlibm's s_sinh.c); "
         "beyond, exp(x - ln 2): finite up to 710.47 as sinh is, and so is its gradient"),
        ("cosh", ("expm1", "exp", "abs", "where"),
         "x = |a|; below 22, 1 + e*e / (2 * (1 + e)) with e = expm1(x) (no cancellation, in "
         "the value or its gradient near 0); beyond, exp(x - ln 2)"),
        ("asinh", ("log1p", "log", "sqrt", "where"),
         "odd; x below 2^-28; below 2^28, log1p(x + x*x / (1 + sqrt(1 + x*x))); beyond, "
         "log(x) + ln 2 (fdlibm's s_asinh.c)"),
        ("acosh", ("log1p", "log", "sqrt", "where"),
         "for x < 2^28, t = x - 1, log1p(t + sqrt(t) * sqrt(t + 2)) (NaN below 1; the "
         "gradient inf at 1, as torch's); beyond, log(x) + ln 2 (fdlibm's e_acosh.c)"),
        ("atanh", ("log1p", "where"),
         "odd; for 0 <= x, 0.5 * log1p(2x / (1 - x)) (1 - x exact near 1; fdlibm's e_atanh.c "
         "form)")]:
    _composite(f"aten.{_name}.default", getattr(cmath, _name), _needs, _doc)


@aten("aten.hypot.default", needs=("maximum", "abs", "detach", "sqrt", "where"),
      doc="s * sqrt((a/s)^2 + (b/s)^2) with s = max(|a|, |b|) held as a constant "
          "(detach: the gradient is a/h, b/h), 1 where both are 0; inf where either is inf "
          "(composites.math.hypot)")
def _hypot(r, node, a, b):
    return cmath.hypot(r.f(a), r.f(b))


def _cos_of_asin(r, a):
    """c = sqrt(1 - a) * sqrt(1 + a) (NaN outside [-1, 1]; 1 - a exact near 1)."""
    tp = r.tp
    return tp.mul(tp.sqrt(tp.sub(r.f(1.0), a)), tp.sqrt(tp.adds(a, 1.0)))


@aten("aten.asin.default", needs=("atan2", "sqrt"),
      doc="atan2(a, c) with c = sqrt(1 - a) * sqrt(1 + a) (NaN outside [-1, 1]; 1 - a exact "
          "near 1; the gradient inf at +-1, as torch's)")
def _asin(r, node, a):
    a = r.f(a)
    return r.tp.atan2(a, _cos_of_asin(r, a))


@aten("aten.acos.default", needs=("atan2", "sqrt"),
      doc="atan2(c, a) with c = sqrt(1 - a) * sqrt(1 + a) (NaN outside [-1, 1]; 1 - a exact "
          "near 1; the gradient inf at +-1, as torch's)")
def _acos(r, node, a):
    a = r.f(a)
    return r.tp.atan2(_cos_of_asin(r, a), a)


@aten("aten.atan2.default", needs=("atan2",),
      doc="atan2 (fdlibm's; numpy broadcasting; torch.arctan2 exports as this)")
def _atan2(r, node, a, b):
    return r.tp.atan2(r.f(a), r.f(b))


def _by_number(r, op, a, b):
    """``op(a, b)`` (fmods or mods) by a number or a one-element constant ``b``."""
    b = r.scalar_const(b)
    if not is_num(b):
        raise Unsupported("fmod or remainder by a tensor (only by a number)")
    return op(r.f(a), float(b))


@aten("aten.fmod.Scalar", "aten.fmod.Tensor", needs=("fmods",),
      doc="by a number (or a one-element constant): fmods; by a tensor refused")
def _fmod(r, node, a, b):
    return _by_number(r, r.tp.fmods, a, b)


@aten("aten.remainder.Scalar", "aten.remainder.Tensor", needs=("mods",),
      doc="by a number (or a one-element constant): mods (torch.remainder's rule); by a "
          "tensor refused")
def _remainder(r, node, a, b):
    return _by_number(r, r.tp.mods, a, b)


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
    if not is_num(e):
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


@aten("aten.pow.Tensor_Tensor", needs=("pow",),
      doc="pow (a ** b elementwise, broadcasting: pows' rule with the exponent an input); "
          "a number exponent as pow.Tensor_Scalar")
def _pow_tensor(r, node, a, b):
    if is_num(b):
        return _pow(r, node, a, b)
    return r.tp.pow(r.f(a), r.f(b))


@aten("aten.pow.Scalar", needs=("pow",),
      doc="pow (a number base a ** b elementwise: pows' rule with the exponent an input)")
def _pow_scalar(r, node, a, b):
    return r.tp.pow(r.f(a), r.f(b))


@aten("aten.silu.default", doc="gradtool.nn.silu: a * sigmoid(a)")
def _silu(r, node, a):
    return nn.silu(r.f(a))


@aten("aten.gelu.default", doc="gradtool.nn.gelu (approximate='tanh'; 'none' needs erf)")
def _gelu(r, node, a, approximate="none"):
    takes = "approximate" in inspect.signature(nn.gelu).parameters
    if approximate == "tanh":
        return nn.gelu(r.f(a), approximate="tanh") if takes else nn.gelu(r.f(a))
    if not takes:
        raise Unsupported("exact gelu (approximate='none') needs gradtool.nn.gelu(x, "
                          "approximate='none')")
    return nn.gelu(r.f(a), approximate=approximate)


def _binary(aten_name, method):
    @aten(aten_name, needs=(method,), doc=method)
    def fn(r, node, a, b):
        return getattr(r.tp, method)(r.f(a), r.f(b))
    return fn


_binary("aten.maximum.default", "maximum")
_binary("aten.minimum.default", "minimum")


def _nan_ignoring(r, pick, a, b):
    """C's fmax/fmin from ``pick`` (maximum or minimum): where(b != b, a, where(a != a, b,
    pick(a, b)))."""
    tp = r.tp
    a, b = r.f(a), r.f(b)
    return tp.where(tp.ne(b, b), a, tp.where(tp.ne(a, a), b, pick(a, b)))


@aten("aten.fmax.default", needs=("maximum", "ne", "where"),
      doc="maximum where neither is NaN; the other operand where one is (NaN only where "
          "both are), as C's fmax: where(b != b, a, where(a != a, b, maximum(a, b))); the "
          "gradient torch's (to a where a wins or b is NaN)")
def _fmax(r, node, a, b):
    return _nan_ignoring(r, r.tp.maximum, a, b)


@aten("aten.fmin.default", needs=("minimum", "ne", "where"),
      doc="minimum where neither is NaN; the other operand where one is, as C's fmin: "
          "where(b != b, a, where(a != a, b, minimum(a, b)))")
def _fmin(r, node, a, b):
    return _nan_ignoring(r, r.tp.minimum, a, b)


_CLAMP_DOC = ("clamp by numbers (or one-element constants); by tensors minimum(maximum(a, "
              "lo), hi), broadcasting: the gradient to a where lo <= a <= hi, to lo where a "
              "< lo, to hi where the result is hi, as torch's (but for lo == hi > a, where "
              "torch gives it to neither, and at a NaN)")


@aten("aten.clamp.default", "aten.clamp.Tensor", needs=("clamp",), doc=_CLAMP_DOC)
def _clamp(r, node, a, lo=None, hi=None):
    return _clamp_between(r, node, a, lo, hi)


@aten("aten.clamp_min.default", "aten.clamp_min.Tensor", needs=("clamp",),
      doc="as clamp with no upper bound")
def _clamp_min(r, node, a, lo):
    return _clamp_between(r, node, a, lo, None)


@aten("aten.clamp_max.default", "aten.clamp_max.Tensor", needs=("clamp",),
      doc="as clamp with no lower bound")
def _clamp_max(r, node, a, hi):
    return _clamp_between(r, node, a, None, hi)


def _clamp_between(r, node, a, lo, hi):
    lo, hi = (r.scalar_const(b) for b in (lo, hi))
    if all(bound is None or is_num(bound) for bound in (lo, hi)):
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
    op = names[0].split(".")[1]             # bitwise_and, ... (the same for each overload)

    @aten(*names, needs=(method,), doc=f"{how} (bool masks only)")
    def fn(r, node, a, b):
        if r.torch_dtype(node) != "bool":
            raise Unsupported(f"{op} of integers")
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


@aten("aten.sign.default", needs=("gt", "lt"),
      doc="gt(a, 0) - lt(a, 0) (+0.0 for +-0 and NaN, as torch's CPU sign)")
def _sign(r, node, a):
    a = r.f(a)
    return r.tp.sub(r.tp.gt(a, 0.0), r.tp.lt(a, 0.0))


@aten("aten.isnan.default", needs=("ne",), doc="ne(a, a) (a mask of 0.0/1.0)")
def _isnan(r, node, a):
    a = r.f(a)
    return r.tp.ne(a, a)


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
