"""Elementwise rules as expressions: written once, evaluated by numpy, rendered as C.

An op's elementwise rule (a forward value, a backward contribution, a part of
softmax) is a small expression tree over

* symbols: the per-element operands a rule reads (``x`` and ``y`` the inputs,
  ``s`` the scalar operand, ``t`` the output, ``g`` the output's gradient,
  and whatever names a hand-written kernel binds, such as softmax's row max);
* float64 constants;
* the separately rounded operations ``+ - * /`` and ``sqrt`` (each ONE
  correctly rounded binary64 operation), the libm-free ``exp``, ``expm1``,
  ``log``, ``log1p``, ``tanh``, ``erf``, ``erfc``, ``sin``, ``cos``, ``atan`` and
  ``atan2`` of :mod:`gradtool.fdlibm` (C twin ``gt_math.h``);
* the exact operations: negation, ``abs`` (clears the sign bit: ``abs(-0.0)``
  is +0.0), the comparisons ``< <= > >= == !=`` and ``select(cond, a, b)``.

The same tree is

* evaluated with numpy (:func:`evaluate`) for the CPU reference: every node is
  one numpy ufunc call, exact per element, so the result is the sequence of
  roundings the tree spells.  Arrays of float32 (an f32 node's values) are
  evaluated in float32: every constant and the scalar operand ``s`` rounded to
  float32 once, + - * / sqrt as binary32 operations, every transcendental by
  :func:`gradtool.numerics32.unary` (the float64 fdlibm port, then one rounding);
* rendered as C (:func:`render`) in a :class:`Dialect`: the device kernels'
  (``R_ADD``..., which are ``GT_*`` for float64 and the float32 operations
  for the f32 build), or the emitter's (``GT_ADD``..., ``gt_exp``...).
  Every arithmetic node becomes one macro call, so no compiler can fuse or
  reorder it; every operand is parenthesised;
* printed as text (:func:`text`) for the docs.

Write ``1.0 / (1.0 + exp(-x))`` with the operators below; the tree keeps the
order exactly as written (no folding, no rewriting).
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from . import fdlibm, numerics, numerics32

ARITH = ("add", "sub", "mul", "div")
FUNCS = ("sqrt", "exp", "expm1", "log", "log1p", "tanh", "erf", "erfc", "sin", "cos", "atan",
         "abs", "floor", "ceil", "trunc", "rint")
FUNCS2 = ("fmod", "atan2")           # two-argument functions
COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


class Expr:
    """A node of an elementwise rule.  Build with the operators and the functions below."""

    __slots__ = ()

    def __add__(self, o): return Op("add", (self, lift(o)))
    def __radd__(self, o): return Op("add", (lift(o), self))
    def __sub__(self, o): return Op("sub", (self, lift(o)))
    def __rsub__(self, o): return Op("sub", (lift(o), self))
    def __mul__(self, o): return Op("mul", (self, lift(o)))
    def __rmul__(self, o): return Op("mul", (lift(o), self))
    def __truediv__(self, o): return Op("div", (self, lift(o)))
    def __rtruediv__(self, o): return Op("div", (lift(o), self))
    def __neg__(self): return Op("neg", (self,))
    def __lt__(self, o): return Op("lt", (self, lift(o)))
    def __le__(self, o): return Op("le", (self, lift(o)))
    def __gt__(self, o): return Op("gt", (self, lift(o)))
    def __ge__(self, o): return Op("ge", (self, lift(o)))
    # == and != stay Python's identity comparisons (Expr objects are hashable): use eq()/ne()


@dataclass(frozen=True, eq=False)
class Sym(Expr):
    name: str


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: float


@dataclass(frozen=True, eq=False)
class Op(Expr):
    op: str
    args: tuple


def lift(x) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return Const(float(x))
    raise TypeError(f"not an expression: {x!r}")


def sqrt(a) -> Expr: return Op("sqrt", (lift(a),))
def exp(a) -> Expr: return Op("exp", (lift(a),))
def expm1(a) -> Expr: return Op("expm1", (lift(a),))
def log(a) -> Expr: return Op("log", (lift(a),))
def tanh(a) -> Expr: return Op("tanh", (lift(a),))
def erf(a) -> Expr: return Op("erf", (lift(a),))
def erfc(a) -> Expr: return Op("erfc", (lift(a),))
def atan(a) -> Expr: return Op("atan", (lift(a),))
def log1p(a) -> Expr: return Op("log1p", (lift(a),))
def sin(a) -> Expr: return Op("sin", (lift(a),))
def cos(a) -> Expr: return Op("cos", (lift(a),))
def abs_(a) -> Expr: return Op("abs", (lift(a),))
# IEEE 754's roundToIntegral operations: exact (every result is representable), the same
# in every libm, numpy and CUDA; rint rounds half to even (the default rounding mode)
def floor(a) -> Expr: return Op("floor", (lift(a),))
def ceil(a) -> Expr: return Op("ceil", (lift(a),))
def trunc(a) -> Expr: return Op("trunc", (lift(a),))
def rint(a) -> Expr: return Op("rint", (lift(a),))
# C's fmod: a - trunc(a / b) * b computed exactly (every result is representable): numpy's
# np.fmod, and gt_math.h's gt_fmod in integer arithmetic for the kernels and emitted code
def fmod(a, b) -> Expr: return Op("fmod", (lift(a), lift(b)))
# fdlibm's atan2(a, b): the angle of the point (b, a), in [-pi, pi] (C's argument order)
def atan2(a, b) -> Expr: return Op("atan2", (lift(a), lift(b)))
def eq(a, b) -> Expr: return Op("eq", (lift(a), lift(b)))
def ne(a, b) -> Expr: return Op("ne", (lift(a), lift(b)))


def select(cond, a, b) -> Expr:
    """``a`` where ``cond`` holds, else ``b`` (exact: no rounding)."""
    return Op("select", (lift(cond), lift(a), lift(b)))


def substitute(expr: Expr, mapping: Mapping[str, Expr]) -> Expr:
    """``expr`` with each symbol named in ``mapping`` replaced by that expression (the
    tree otherwise unchanged: the same operations in the same order)."""
    if isinstance(expr, Sym):
        return mapping.get(expr.name, expr)
    if isinstance(expr, Op):
        return Op(expr.op, tuple(substitute(a, mapping) for a in expr.args))
    return expr


def symbols(expr: Expr) -> list:
    """The symbol names an expression reads, in order of first appearance."""
    if isinstance(expr, Sym):
        return [expr.name]
    out = []
    if isinstance(expr, Op):
        for arg in expr.args:
            out += [n for n in symbols(arg) if n not in out]
    return out


# rough cost of one element, in copies (a copy = 1): what the host backend uses to decide
# when a launch is worth splitting over threads (it never changes a result)
_COST = {"exp": 11, "expm1": 11, "log": 11, "tanh": 23, "erf": 25, "erfc": 25, "log1p": 12,
         "sin": 14, "cos": 14, "atan": 9, "atan2": 12, "sqrt": 3, "div": 1, "fmod": 6}


def cost(expr: Expr) -> int:
    """1 + the weight of every operation node (transcendentals dominate)."""
    def walk(e) -> int:
        if isinstance(e, Op):
            return _COST.get(e.op, 0) + sum(walk(a) for a in e.args)
        return 0
    return 1 + walk(expr)


def operations(expr: Expr) -> set:
    """The operation names an expression uses."""
    if isinstance(expr, Op):
        out = {expr.op}
        for arg in expr.args:
            out |= operations(arg)
        return out
    return set()


# ── numpy ──────────────────────────────────────────────────────────────────

_NUMPY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "neg": np.negative, "sqrt": np.sqrt, "exp": fdlibm.exp, "expm1": fdlibm.expm1,
    "log": fdlibm.log, "tanh": fdlibm.tanh, "erf": fdlibm.erf, "log1p": fdlibm.log1p,
    "sin": fdlibm.sin, "cos": fdlibm.cos, "erfc": fdlibm.erfc, "atan": fdlibm.atan,
    "atan2": fdlibm.atan2, "abs": np.abs, "floor": np.floor, "ceil": np.ceil,
    "trunc": np.trunc, "rint": np.rint, "fmod": np.fmod,
    "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "eq": np.equal, "ne": np.not_equal,
}


def select_numpy(cond, a, b):
    """``np.where(cond, a, b)``, exactly, faster where one side is the constant +0.0 and
    the other a float64 array of the condition's shape (relu and its gradient): the
    condition as an all-ones or all-zeros int64 mask ANDed with the array's bit pattern
    gives the array's element or +0.0's all-zero pattern, bit for bit what np.where
    gives (several times faster); with the CPU kernels compiled, the same bit operation
    in one pass (``gt_select_zero``, csrc/gt_cpu.c)."""
    if type(b) in _ZEROS:
        keep, zero, invert = a, b, False
    elif type(a) in _ZEROS:
        keep, zero, invert = b, a, True
    else:
        return np.where(cond, a, b)
    if (zero != 0.0 or math.copysign(1.0, zero) < 0 or type(keep) is not np.ndarray
            or keep.dtype not in _SELECT_BITS or type(cond) is not np.ndarray
            or keep.shape != cond.shape):
        return np.where(cond, a, b)
    # (float32 too: np.where of a float32 array and the Python +0.0 is float32, and its
    # +0.0 is the all-zero pattern as well)
    dtype = keep.dtype
    keep = np.ascontiguousarray(keep)
    if cond.flags.c_contiguous and cond.dtype == np.bool_:
        lib = (numerics.cpu_kernels() if dtype is _F64 or dtype == _F64
               else numerics.cpu_kernels32())
        if lib is not None:                          # the same bits in one compiled pass
            out = np.empty(keep.shape, dtype)
            if lib.py_select_zero is None or lib.py_select_zero(cond, keep, out, invert):
                lib.gt_select_zero(keep.size, cond.ctypes.data, keep.ctypes.data,
                                   out.ctypes.data, invert)
            return out
    bits = _SELECT_BITS[dtype]
    mask = cond.view(np.int8).astype(bits)          # 1 where cond holds, else 0
    if invert:
        np.subtract(mask, 1, out=mask)               # 0 where cond holds, else all ones
    else:
        np.negative(mask, out=mask)                  # all ones where cond holds, else 0
    np.bitwise_and(mask, keep.view(bits), out=mask)
    return mask.view(dtype)


# the float dtypes select_numpy masks, and the integer of their width; the types of the
# constant it may be selecting against (the f32 rule bodies' constants are np.float32)
_SELECT_BITS = {np.dtype(np.float64): np.int64, np.dtype(np.float32): np.int32}
_ZEROS = (float, np.float32)


def evaluate(expr: Expr, env: Mapping[str, object]):
    """The expression over numpy arrays (broadcasting like numpy): one ufunc per node.

    Runs :func:`compile_numpy`'s function for these symbol names (compiled on first
    use and kept), so there is one numpy rendering of a rule, not two."""
    return _compiled(expr, tuple(env))(**env)


@functools.lru_cache(maxsize=None)
def _compiled(expr: Expr, names: tuple):
    return compile_numpy(expr, names)


def _f32_unary(name: str):
    def fn(x):
        return numerics32.unary(name, x)
    fn.__name__ = f"{name}_f32"
    return fn


# the float32 evaluation: binary32 ufuncs (numpy keeps float32 when every operand is a
# float32 array or scalar), the transcendentals from numerics32, np.where for select
_NUMPY32 = dict(_NUMPY, **{op: _f32_unary(op) for op in
                           ("exp", "expm1", "log", "tanh", "erf", "log1p", "sin", "cos",
                            "erfc", "atan")}, atan2=numerics32.atan2)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def compile_numpy(expr: Expr, names, one_body: bool = True) -> "callable":
    """The expression as a Python function of the symbols ``names`` (in that order),
    one ufunc call per node, without walking the tree per call
    (the CPU reference records and replays one node at a time).  Expressions come from
    the op table, never from input, so generating the function's source is safe.

    The function evaluates in float32 when its first argument is a float32 array (an
    f32 node: the forward rule's x, a contribution's g; a caller passing Python numbers
    too puts an array first): the constants are float32
    (each rounded once, here), ``s`` is rounded to float32 once per call (torch's rule
    for a Python number with a float32 tensor), and the operations are :data:`_NUMPY32`'s.
    One generated function holds both bodies (an f64 call pays one dtype comparison),
    or the one body where the two are the same: no constant, no ``s``, and each
    operation the same function in both (``x + y``, ``g * y``, a select without constants:
    the ufuncs keep their operands' dtype), so the dtype cannot change what it does
    (``one_body=False`` writes the two bodies even then: the tests compare the two forms).
    """
    names = tuple(names)
    missing = set(symbols(expr)) - set(names)
    if missing:
        raise ValueError(f"compile_numpy: symbols {sorted(missing)} are not arguments")
    namespace: dict = {"_F32": _F32, "_F64": _F64, "_float32": np.float32}

    used = set()            # the function names the float64 body calls ("_add", "_where")
    count = [0]             # the constants each body holds

    def body(f32: bool) -> str:
        tag = "32" if f32 else ""
        count[0] = 0

        def py(e) -> str:
            if isinstance(e, Sym):
                return e.name
            if isinstance(e, Const):
                key = f"_c{tag}_{count[0]}"
                count[0] += 1
                namespace[key] = np.float32(e.value) if f32 else e.value
                return key
            args = ", ".join(py(a) for a in e.args)
            fn = "_where" if e.op == "select" else f"_{e.op}"
            used.add(fn)
            return f"{fn}{tag}({args})"

        return py(expr)

    for op, fn in _NUMPY.items():
        namespace[f"_{op}"] = fn
    for op, fn in _NUMPY32.items():
        namespace[f"_{op}32"] = fn
    namespace["_where"], namespace["_where32"] = select_numpy, select_numpy
    args = ", ".join(names)
    body64 = body(False)
    one_body = (one_body and count[0] == 0 and "s" not in symbols(expr)
                and all(namespace[f"{fn}32"] is namespace[fn] for fn in used))
    if names and not one_body:
        s32 = "        s = _float32(s)\n" if "s" in names else ""
        # (a float64 array, the common case, is told by identity: the dtype objects of
        # native float64 arrays are numpy's one float64 dtype; anything else compares)
        source = (f"def rule({args}):\n"
                  f"    _dtype_ = getattr({names[0]}, 'dtype', None)\n"
                  f"    if _dtype_ is not _F64 and _dtype_ == _F32:\n{s32}"
                  f"        return {body(True)}\n"
                  f"    return {body64}\n")
    else:
        source = f"def rule({args}):\n    return {body64}\n"
    exec(compile(source, "<gradtool.expr>", "exec"), namespace)   # noqa: S102 - table data
    rule = namespace["rule"]
    rule.__doc__ = text(expr)
    return rule


# ── C ──────────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Dialect:
    """How a C rendering spells each operation and constant."""

    arith: Mapping[str, str]          # add/sub/mul/div/sqrt/exp/.../cos/abs -> callee
    const: object                     # float -> C expression

    def call(self, op: str, args: list) -> str:
        return f"{self.arith[op]}({', '.join(args)})"


def c_double(x: float) -> str:
    """``x`` as a C expression denoting exactly that double, valid in C99 and CUDA.

    Finite values are hexadecimal floating literals (``0x1.8p+1``), which
    every compiler converts exactly.  Infinities and NaNs (which have no
    literal) are rebuilt from their bit pattern by gt_math.h's
    ``gtm_from_bits``, payload and sign included.
    """
    x = float(x)
    if math.isfinite(x):
        mant, _, power = x.hex().partition("p")
        mant = mant.rstrip("0").rstrip(".") if "." in mant else mant
        text = f"{mant}p{power}"
        return f"({text})" if text.startswith("-") else text
    bits = struct.unpack("<Q", struct.pack("<d", x))[0]
    return f"gtm_from_bits(0x{bits:016x}ULL)"


# the device kernels' element type gt_real: R_* are gt_math.h's GT_* for float64 and the
# float32 operations for the f32 build (kernels.cu)
KERNEL = Dialect(
    arith={"add": "R_ADD", "sub": "R_SUB", "mul": "R_MUL", "div": "R_DIV", "sqrt": "R_SQRT",
           "exp": "R_EXP", "expm1": "R_EXPM1", "log": "R_LOG", "tanh": "R_TANH",
           "erf": "R_ERF", "log1p": "R_LOG1P", "sin": "R_SIN", "cos": "R_COS",
           "erfc": "R_ERFC", "atan": "R_ATAN", "atan2": "R_ATAN2", "abs": "R_ABS", "floor": "R_FLOOR", "ceil": "R_CEIL", "trunc": "R_TRUNC",
           "rint": "R_RINT", "fmod": "R_FMOD"},
    const=lambda v: f"((gt_real){c_double(v)})")

# scalar double code (the emitter): gt_math.h's macros and functions directly
SCALAR = Dialect(
    arith={"add": "GT_ADD", "sub": "GT_SUB", "mul": "GT_MUL", "div": "GT_DIV", "sqrt": "GT_SQRT",
           "exp": "gt_exp", "expm1": "gt_expm1", "log": "gt_log", "tanh": "gt_tanh",
           "erf": "gt_erf", "log1p": "gt_log1p", "sin": "gt_sin", "cos": "gt_cos",
           "erfc": "gt_erfc", "atan": "gt_atan", "atan2": "gt_atan2", "abs": "fabs", "floor": "floor", "ceil": "ceil", "trunc": "trunc", "rint": "rint",
           "fmod": "gt_fmod"},
    const=c_double)


# scalar float code (the emitter's f32 tapes): binary32 operations that cannot be
# contracted (GT_FADD ... : __fadd_rn ... under nvcc, plain operators on the host with
# -ffp-contract=off; the emitted prelude defines them) and gt_real32.h's transcendentals
# (the float64 fdlibm port on the widened input, rounded once); constants rounded to
# float32 once
SCALAR32 = Dialect(
    arith={"add": "GT_FADD", "sub": "GT_FSUB", "mul": "GT_FMUL", "div": "GT_FDIV",
           "sqrt": "GT_FSQRT", "exp": "gt_expf", "expm1": "gt_expm1f", "log": "gt_logf",
           "tanh": "gt_tanhf", "erf": "gt_erff", "log1p": "gt_log1pf", "sin": "gt_sinf",
           "cos": "gt_cosf", "erfc": "gt_erfcf", "atan": "gt_atanf", "atan2": "gt_atan2f",
           "abs": "fabsf", "floor": "floorf", "ceil": "ceilf", "trunc": "truncf",
           "rint": "rintf", "fmod": "GT_FMODF"},
    const=lambda v: f"((float){c_double(v)})")


def render(expr: Expr, dialect: Dialect, env: Mapping[str, str]) -> str:
    """The expression as one C expression; ``env`` maps each symbol to C text."""
    if isinstance(expr, Sym):
        return _atom(env[expr.name])
    if isinstance(expr, Const):
        return dialect.const(expr.value)
    args = [render(a, dialect, env) for a in expr.args]
    if expr.op == "neg":
        return f"(-{args[0]})"
    if expr.op in COMPARE:
        return f"({args[0]} {COMPARE[expr.op]} {args[1]})"
    if expr.op == "select":
        return f"({args[0]} ? {args[1]} : {args[2]})"
    return dialect.call(expr.op, args)


def _atom(code: str) -> str:
    """C text safe as an operand: an identifier, or anything else in parentheses."""
    if code.isidentifier() or (code.startswith("(") and code.endswith(")")
                               and _balanced(code[1:-1])):
        return code
    return f"({code})"


def _balanced(code: str) -> bool:
    depth = 0
    for ch in code:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


# ── text ───────────────────────────────────────────────────────────────────

_PREC = {"select": 0, "lt": 1, "le": 1, "gt": 1, "ge": 1, "eq": 1, "ne": 1,
         "add": 2, "sub": 2, "mul": 3, "div": 3, "neg": 4}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", **COMPARE}


def text(expr: Expr, parent: int = 0) -> str:
    """Python-like text of the expression, parenthesised wherever evaluation order needs it
    (``a - (b - c)``, ``(a * b) * c`` is written ``a * b * c``)."""
    if isinstance(expr, Sym):
        return expr.name
    if isinstance(expr, Const):
        v = expr.value
        return repr(v) if not math.isfinite(v) or v != int(v) or abs(v) >= 1e16 else f"{v:.1f}"
    op, args = expr.op, expr.args
    if op in FUNCS:
        return f"{op}({text(args[0])})"
    if op in FUNCS2:
        return f"{op}({text(args[0])}, {text(args[1])})"
    if op == "select":
        out = f"{text(args[1], 1)} if {text(args[0], 1)} else {text(args[2], 1)}"
        return f"({out})" if parent > 0 else out
    prec = _PREC[op]
    if op == "neg":
        out = f"-{text(args[0], prec + 1)}"
    else:
        # left-associative: the right operand of an equal-precedence op needs parentheses
        out = f"{text(args[0], prec)} {_INFIX[op]} {text(args[1], prec + 1)}"
    return f"({out})" if prec < parent else out


X, Y, S, T, G = Sym("x"), Sym("y"), Sym("s"), Sym("t"), Sym("g")

__all__ = ["Expr", "Sym", "Const", "Op", "lift", "compile_numpy", "cost", "sqrt", "exp", "expm1", "log", "tanh", "erf", "log1p", "sin", "cos", "erfc", "atan", "atan2", "abs_", "floor", "ceil", "trunc", "rint", "fmod",
           "eq", "ne", "select", "substitute", "symbols", "operations", "evaluate", "render",
           "text", "Dialect", "KERNEL", "SCALAR", "SCALAR32", "c_double", "X", "Y", "S", "T",
           "G"]
