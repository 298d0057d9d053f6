"""The op table: the one place that says what every op is.

Each entry (:class:`OpSpec`) gives the op's name (the Tape method and the
tape file's ``op``), its arity, its attributes (:class:`Attr`), a shape rule
(used both when recording and when loading a file, so a bad file is rejected
before any arithmetic or allocation), and its rules:

* an **elementwise** op (kind ``unary``: same shape, or ``binary``: numpy
  broadcasting) states its forward rule and, right under it, each input's
  backward contribution as ONE expression each (:mod:`gradtool.expr`) over
  ``x``/``y`` (the inputs), ``s`` (the scalar operand), ``t`` (the output)
  and ``g`` (the output's gradient).  Those expressions are evaluated by
  numpy for the CPU reference and rendered to C for the device kernels (host
  and CUDA) and for the emitter: every layer runs the same rule by
  construction;
* every other op keeps a hand-written numpy rule here (its order documented
  in :mod:`gradtool.numerics`) and a hand-written kernel in
  ``gradtool/csrc/kernels.cu`` whose launches and metadata fields are
  declared by name right next to the entry (:data:`KERNELS`); the C
  decoders of those fields are generated from the declaration, and
  ``gradtool/device/program.py`` packs them by name.  Where such an op has
  elementwise parts (softmax) or a one-element form for the emitter (sum,
  mean), those are expressions in the entry too.

Everything else is generated from this table: the Tape's recording methods,
the file writer's node records and the loader's attribute checks, the JSON
Schema (``gradtool/schemas/tape.schema.json``), ``gradtool/csrc/gt_ops.h``
(elementwise kernels, field decoders, the kernel list), the emitter's scalar
rules, the device program's lowering, and the op reference ``docs/ops.md``.
``python -m gradtool.codegen`` regenerates the committed files; a test fails
when they are stale.  docs/ops.md ("Adding an op") lists what to write.

Conventions for the hand-written numpy rules
--------------------------------------------
shape(sa, sb, attrs) -> tuple      sa/sb are input shapes (None if absent).
                                   Raises ShapeError with a message naming
                                   the shapes; the caller adds the node id.
forward(a, b, s, attrs) -> array   a/b are input values, s the scalar operand.
backward(g, a, b, t, s, attrs, need_a, need_b) -> (ca, cb)
                                   g is dL/d(out), t the out value.  Returns the
                                   contribution to each input's gradient,
                                   already in that input's shape (None where
                                   not needed).  The tape adds it into the
                                   input's gradient slot: ``grad = grad + c``.
                                   A negated contribution (sub, div, neg) is
                                   exactly a subtraction, since x + (-y) is
                                   x - y in IEEE arithmetic.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from . import numerics as nx
from .errors import ShapeError
from .expr import (G, S, T, X, Y, Const, Expr, Sym, abs_, compile_numpy, cos, eq, erf, evaluate,
                   exp, expm1, log, log1p, ne, select, sin, sqrt, substitute, tanh)

LEAF_OPS = ("param", "const")
INT_DTYPE = "i64"                   # a const of integer ids (take's ids); every other value f64
KINDS = ("leaf", "unary", "binary", "reduce", "max", "matmul", "bmm", "transpose", "reshape",
         "softmax", "slice", "concat", "take", "take_along", "permute", "conv2d",
         "max_pool2d", "avg_pool2d")
_REQUIRED = object()


@dataclass(frozen=True)
class Attr:
    """One attribute of an op's nodes: in the Tape method's signature, the node's ``aux``
    dict, the tape file's node record and the schema.

    kind ``axis``: one int, negative counting from the end when recording (stored
    normalised, >= 0); ``indices``: one int >= 0 per axis of the input;
    ``perm``: a permutation of the input's axes, one int per axis, negative
    counting from the end when recording (stored normalised, >= 0);
    ``shape``: the node's own shape (a reshape's target), which the file
    already stores as ``shape``; ``flag``: True or False; ``count``: one int
    >= 1 (conv2d's groups).

    ``default`` is the Tape method's default.  An ``optional`` attribute may
    be absent from a file, meaning ``default``: it is written, and kept in
    the node's ``aux`` dict, only when it differs from the default (so files
    written before it existed read unchanged, and write the same bytes).
    """

    name: str
    kind: str
    doc: str
    default: object = _REQUIRED
    optional: bool = False

    @property
    def stored(self) -> bool:
        """Whether the file's node record carries this attribute under its own key."""
        return self.kind != "shape"

    @property
    def required(self) -> bool:
        """Whether the Tape method needs it (it has no default)."""
        return self.default is _REQUIRED

    @property
    def file_required(self) -> bool:
        """Whether every file node of the op must carry it."""
        return self.stored and not self.optional


@dataclass(frozen=True)
class OpSpec:
    name: str
    kind: str                        # one of KINDS: how the op is lowered and checked
    arity: int                       # number of node inputs (0 for leaves)
    doc: str                         # one line for the docs and the Tape method
    shape: Optional[Callable] = None
    forward: Optional[Callable] = None
    backward: Optional[Callable] = None
    attrs: tuple = ()                # Attr, in the Tape method's argument order
    scalar_operand: bool = False     # reads the node's `s` (adds, muls)
    fwd: Optional[Expr] = None       # elementwise ops: the forward rule
    bwd: tuple = ()                  # elementwise ops: each input's contribution
    scalar: Optional[tuple] = None   # non-elementwise ops with a one-element form: (fwd, bwd)
    domain: str = "real"             # where the rule is smooth: "real" or "positive" (tests)
    kernels: tuple = ()              # non-elementwise ops: the kernels its launches use
    parts: Optional[dict] = None     # elementwise parts of a hand-written kernel (GT_<OP>_<PART>)
    int_inputs: tuple = ()           # inputs ("a", "b") that may read integer data (an i64 const)
    index_bound: Optional[Callable] = None   # (sa, attrs) -> ids must lie in [0, bound)
    id_inputs: tuple = ()            # inputs that must be integer-valued ids (take's "b")
    grad_inputs: tuple = ("a", "b")  # inputs the gradient flows to (none: a comparison)
    integral: str = ""               # "always" / "inputs" / "a": its values are whole numbers
    fresh_grads: bool = False        # backward returns new arrays without a -0.0 (below)

    def grad_to(self, role: str) -> bool:
        """Whether the backward walk gives input ``role`` ("a"/"b") a contribution."""
        return role in self.grad_inputs

    def integral_of(self, a_integral: bool, b_integral: bool = True) -> bool:
        """Whether this op's values are whole numbers, given its inputs' (docs/ops.md)."""
        return (self.integral == "always" or (self.integral == "a" and a_integral)
                or (self.integral == "inputs" and a_integral and b_integral))

    @property
    def elementwise(self) -> bool:
        """out[i] depends only on the inputs' elements at i (after broadcasting)."""
        return self.kind in ("unary", "binary")

    @property
    def rules(self) -> Optional[tuple]:
        """(forward, contributions) as expressions: elementwise ops and one-element forms."""
        if self.elementwise:
            return self.fwd, self.bwd
        return self.scalar


OPS: dict[str, OpSpec] = {}


def _register(spec: OpSpec) -> None:
    assert spec.kind in KINDS and spec.name not in OPS, spec.name
    OPS[spec.name] = spec


def format_shape(shape) -> str:
    """[2,3]: how every message in gradtool writes a shape."""
    return "[" + ",".join(map(str, shape)) + "]"


def attr(attrs, name: str, default=None):
    """An attribute from a node's aux dict; an optional one at its default is absent."""
    return default if not attrs else attrs.get(name, default)


def bad_id(ids: np.ndarray, bound: int) -> Optional[str]:
    """None when every id lies in [0, bound); else what the first bad one is and where.

    Ids computed on the tape are float64 whole numbers: a fraction, an infinity or a
    NaN is a bad id too."""
    flat = np.ravel(ids)
    if flat.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(~((flat >= 0) & (flat < bound) & (flat == np.floor(flat))))
    else:
        bad = np.flatnonzero((flat < 0) | (flat >= bound))
    if not bad.size:
        return None
    where = list(np.unravel_index(int(bad[0]), np.shape(ids)))
    v = flat[bad[0]]
    whole = flat.dtype.kind in "iu" or (math.isfinite(v) and v == math.floor(v))
    fraction = not whole and math.isfinite(v)
    return (f"id {int(v) if whole else repr(float(v))} at position {[int(k) for k in where]} "
            + ("is not a whole number" if fraction else f"is outside [0, {bound})"))


EXACT_INT = 2 ** 53     # every integer of at most this magnitude is exact in a float64


def inexact_int(values: np.ndarray, limit: int = EXACT_INT) -> Optional[str]:
    """None when every integer in ``values`` converts exactly (|v| <= limit); else what
    the first one that does not is and where (integer data read as float64 values)."""
    flat = np.ravel(values)
    big = np.flatnonzero((flat > limit) | (flat < -limit))
    if not big.size:
        return None
    where = [int(k) for k in np.unravel_index(int(big[0]), np.shape(values))]
    return (f"integer {int(flat[big[0]])} at position {where} is beyond +-{limit}, where "
            f"floating-point values stop being exact")


def as_ids(b: np.ndarray) -> np.ndarray:
    """Ids as int64 for numpy's gathers: an i64 const as it is, computed (float64,
    checked whole and in range by the caller) ids converted exactly."""
    return b if b.dtype.kind in "iu" else b.astype(np.int64)


# ── device kernels: the metadata contract of every kernel, by field name ────
#
# A launch is (kernel, int64 metadata block).  M[0] is always the number of
# thread indices; the fields below follow in order.  Field kinds: ``w`` an
# arena offset the kernel writes (a gt_real pointer), ``r`` one it only
# reads, ``i`` an int, ``f`` a float64 stored as its bit pattern, ``i[c]`` an
# int array whose length is the int field ``c``.  codegen turns each
# declaration into a C decoder macro ``GT_ARGS_<kernel>``; the device
# program packs a block with :func:`pack` by field name.

@dataclass(frozen=True)
class KernelSpec:
    name: str
    fields: tuple          # (name, kind) pairs, after M[0]
    doc: str

    def field_names(self) -> list:
        return [f for f, _ in self.fields]


KERNELS: dict[str, KernelSpec] = {}


def kernel(name: str, fields: str, doc: str) -> KernelSpec:
    """Declare a kernel's metadata fields: ``"out:w a:r len:i dims:i[nd]"``."""
    spec = _spec(name, fields, doc)
    assert name not in KERNELS, name
    KERNELS[name] = spec
    return spec


def f64_bits(x: float) -> int:
    """The IEEE-754 bit pattern of a float64, as the signed int64 a metadata slot holds."""
    return int(np.array([float(x)], dtype=np.float64).view(np.int64)[0])


def f64_from_bits(bits: int) -> float:
    """The float64 a metadata slot's bit pattern stands for (the inverse of f64_bits)."""
    return float(np.array([bits], dtype=np.int64).view(np.float64)[0])


def pack(kernel_name: str, threads: int, /, **values) -> tuple:
    """The metadata block of one launch: M[0] = threads, then every declared field by name.

    An array field's length field is filled in from the array (and must agree
    between arrays sharing it); float fields take Python floats (packed as
    bit patterns).  A missing or unknown field is an error.
    """
    spec = contract(kernel_name)
    counts = {}
    for fname, kind in spec.fields:
        if kind.startswith("i["):
            count = kind[2:-1]
            length = len(values[fname])
            if counts.setdefault(count, length) != length:
                raise ValueError(f"{kernel_name}: arrays sharing {count} differ in length")
    block = [int(threads)]
    for fname, kind in spec.fields:
        if fname in counts:
            if fname in values and values[fname] != counts[fname]:
                raise ValueError(f"{kernel_name}: {fname} disagrees with its arrays")
            block.append(counts[fname])
        elif kind.startswith("i["):
            block.extend(int(v) for v in values[fname])
        elif kind == "f":
            block.append(f64_bits(values[fname]))
        else:
            block.append(int(values[fname]))
    unknown = set(values) - set(spec.field_names())
    if unknown:
        raise ValueError(f"{kernel_name}: unknown fields {sorted(unknown)}")
    return tuple(block)


def _spec(name: str, fields: str, doc: str) -> KernelSpec:
    return KernelSpec(name, tuple(tuple(f.split(":")) for f in fields.split()), doc)


# the elementwise families: one contract each (decoder GT_ARGS_<family>), one kernel per op
# and direction (and per input, backward of a binary op)
FAMILIES = {
    "UNARY_FWD": _spec("UNARY_FWD", "out:w a:r s:f", "every unary forward kernel"),
    "UNARY_BWD": _spec("UNARY_BWD", "ga:w g:r a:r t:r s:f", "every unary backward kernel"),
    "BINARY_FWD": _spec("BINARY_FWD", "out:w a:r b:r nd:i dims:i[nd] sa:i[nd] sb:i[nd]",
                        "every broadcasting binary forward kernel (strides 0 where an input "
                        "broadcasts)"),
    "BINARY_BWD": _spec("BINARY_BWD",
                        "ga:w g:r a:r b:r t:r nk:i kd:i[nk] kg:i[nk] ka:i[nk] kb:i[nk] "
                        "nb:i bd:i[nb] bg:i[nb] ba:i[nb] bb:i[nb] scratch:i",
                        "every broadcasting binary backward kernel: kept dims (k*) and "
                        "broadcast dims (b*) of the out index space"),
}


def kernel_names(spec: OpSpec) -> tuple:
    """The kernels an op's launches use (forward, then backward)."""
    if spec.kind == "unary":
        return (f"k_{spec.name}", f"k_{spec.name}_bwd")
    if spec.kind == "binary":         # a backward kernel per input the gradient flows to
        return (f"k_{spec.name}",) + tuple(f"k_{spec.name}_bwd_{side}" for side in "ab"
                                           if spec.grad_to(side))
    return spec.kernels


def contract(kernel_name: str) -> KernelSpec:
    """The metadata contract of any kernel: declared, or its elementwise family's."""
    spec = KERNELS.get(kernel_name) or _family_of().get(kernel_name)
    if spec is None:
        raise KeyError(f"no kernel {kernel_name!r} in the op table")
    return spec


@functools.lru_cache(maxsize=1)
def _family_of() -> dict:
    """Every elementwise op's kernel name -> its family's contract (built once, on first
    use, when the table is complete)."""
    out = {}
    for spec in OPS.values():
        if spec.elementwise:
            prefix = "UNARY_" if spec.kind == "unary" else "BINARY_"
            for k in kernel_names(spec):
                out[k] = FAMILIES[prefix + ("FWD" if k == f"k_{spec.name}" else "BWD")]
    return out


# ── shape rules ────────────────────────────────────────────────────────────

def broadcast_shape(sa, sb, _attrs=None):
    """numpy broadcasting: trailing dims aligned; 1 or a missing dim stretches."""
    nd = max(len(sa), len(sb))
    pa = (1,) * (nd - len(sa)) + tuple(sa)
    pb = (1,) * (nd - len(sb)) + tuple(sb)
    out = []
    for da, db in zip(pa, pb):
        if da != db and da != 1 and db != 1:
            raise ShapeError(f"shapes {format_shape(sa)} and {format_shape(sb)} do not broadcast")
        out.append(max(da, db))
    return tuple(out)


def _same_shape(sa, _sb, _attrs):
    return tuple(sa)


def _matmul_shape(sa, sb, _attrs):
    if len(sa) != 2 or len(sb) != 2 or sa[1] != sb[0]:
        raise ShapeError(f"matmul needs [M,K] @ [K,N], got {format_shape(sa)} @ {format_shape(sb)}")
    return (sa[0], sb[1])


def _bmm_shape(sa, sb, _attrs):
    if (len(sa) != 3 or len(sb) != 3 or sa[2] != sb[1]
            or (sa[0] != sb[0] and 1 not in (sa[0], sb[0]))):
        raise ShapeError(f"bmm needs [B,M,K] @ [B,K,N] (a batch of 1 on either side "
                         f"stretches), got {format_shape(sa)} @ {format_shape(sb)}")
    return (max(sa[0], sb[0]), sa[1], sb[2])


def _transpose_shape(sa, _sb, _attrs):
    if len(sa) < 2:
        raise ShapeError(f"transpose needs rank >= 2, got {format_shape(sa)}")
    return tuple(sa[:-2]) + (sa[-1], sa[-2])


def _reshape_shape(sa, _sb, attrs):
    target = tuple(attrs["shape"])
    if not target or any(d < 1 for d in target):
        raise ShapeError(f"reshape target {format_shape(target)} must have dims >= 1")
    if int(np.prod(target, dtype=object)) != int(np.prod(sa, dtype=object)):
        raise ShapeError(f"cannot reshape {format_shape(sa)} into {format_shape(target)}")
    return target


def _axis_check(sa, axis, opname):
    if not 0 <= axis < len(sa):
        raise ShapeError(f"{opname} axis {axis} out of range for {format_shape(sa)}")


def _softmax_shape(sa, _sb, attrs):
    _axis_check(sa, attrs["axis"], "softmax")
    return tuple(sa)


def _slice_steps(sa, attrs) -> tuple:
    steps = attr(attrs, "steps")
    return (1,) * len(sa) if steps is None else tuple(steps)


def _slice_shape(sa, _sb, attrs):
    starts, stops = tuple(attrs["starts"]), tuple(attrs["stops"])
    steps = _slice_steps(sa, attrs)
    if len(starts) != len(sa) or len(stops) != len(sa) or len(steps) != len(sa):
        raise ShapeError(f"slice needs one start, stop (and step) per axis of "
                         f"{format_shape(sa)}, got starts {list(starts)} stops {list(stops)}"
                         + ("" if attr(attrs, "steps") is None else f" steps {list(steps)}"))
    for lo, hi, dim in zip(starts, stops, sa):
        if not 0 <= lo < hi <= dim:
            raise ShapeError(f"slice [{lo}, {hi}) is empty or outside an axis of size {dim} "
                             f"in {format_shape(sa)}")
    if any(st < 1 for st in steps):
        raise ShapeError(f"slice steps {list(steps)} must be >= 1")
    return tuple(-(-(hi - lo) // st) for lo, hi, st in zip(starts, stops, steps))


def _equal_but_axis(sa, sb, axis) -> bool:
    """Same rank, and equal dims everywhere except on ``axis``."""
    return len(sa) == len(sb) and all(x == y for i, (x, y) in enumerate(zip(sa, sb))
                                      if i != axis)


def _concat_shape(sa, sb, attrs):
    axis = attrs["axis"]
    _axis_check(sa, axis, "concat")
    if not _equal_but_axis(sa, sb, axis):
        raise ShapeError(f"concat along axis {axis} needs equal other dims, got "
                         f"{format_shape(sa)} and {format_shape(sb)}")
    return tuple(sa[:axis]) + (sa[axis] + sb[axis],) + tuple(sa[axis + 1:])


def _permute_shape(sa, _sb, attrs):
    dims = tuple(attrs["dims"])
    if sorted(dims) != list(range(len(sa))):
        raise ShapeError(f"permute dims {list(dims)} are not a permutation of the "
                         f"{len(sa)} axes of {format_shape(sa)}")
    return tuple(sa[d] for d in dims)


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
unary("adds", "a + s (a Python number)", X + S, G, scalar_operand=True)
unary("muls", "a * s (a Python number)", X * S, G * S, scalar_operand=True)
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


def _pow_rule(x: Expr, e: Expr) -> Expr:
    """x ** e for a scalar e (the scalar operand s, or s - 1 in the gradient), as ONE
    expression: exact special cases where PyTorch's CPU pow has them, else
    exp(e * log(|x|)) with the sign of an odd integer power of a negative x.

    e == 0: 1.0 (also for a NaN x);  e == 1: x;  e == 2: x*x;  e == 3: (x*x)*x;
    e == 4: (x*x)*(x*x);  e == -1: 1/x;  e == -2: 1/(x*x);  e == 0.5: sqrt(x);
    e == -0.5: 1/sqrt(x);  otherwise p = exp(e * log(|x|)), and for a negative x (-0.0
    included: 1/x < 0): -p when e is an odd integer, else p, except NaN for a finite x < 0
    and an e that is not an integer (C's pow).  e is an integer when |e| >= 2^52 or
    (|e| + 2^52) - 2^52 == |e| (exact for an integer, a rounding to one otherwise); odd
    when moreover |e| < 2^53 and h = |e| * 0.5 is not an integer."""
    ae = abs_(e)
    big = 2.0 ** 52
    is_int = select(ae >= big, 1.0, select(eq((ae + big) - big, ae), 1.0, 0.0))
    h = ae * 0.5
    is_odd = select(eq(is_int, 0.0), 0.0,
                    select(ae >= 2.0 * big, 0.0, select(eq((h + big) - big, h), 0.0, 1.0)))
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
# minimum mirrors maximum: a where a <= b, b where a > b, NaN when either is NaN; ties
# (+0.0 against -0.0 too) give a.  The gradient goes to a where a <= b, else to b: on a tie
# all of it to a; when either is NaN all of it to b
binary("minimum", "elementwise min, numpy broadcasting; NaN wins",
       select(X <= Y, X, select(X > Y, Y, X + Y)), select(X <= Y, G, 0.0),
       select(X <= Y, 0.0, G))
# clamp_min / clamp_max: torch.clamp's halves (Tape.clamp records them): s where x < s
# (resp. x > s), else x (so a NaN x stays NaN, and a tie keeps x); the gradient passes
# where lo <= x (resp. x <= hi), inclusive like PyTorch's, +0.0 elsewhere and at a NaN
unary("clamp_min", "max(a, s) for a Python number s, NaN kept (torch.clamp's min)",
      select(X < S, S, X), select(X >= S, G, 0.0), scalar_operand=True)
unary("clamp_max", "min(a, s) for a Python number s, NaN kept (torch.clamp's max)",
      select(X > S, S, X), select(X <= S, G, 0.0), scalar_operand=True)


# ── the table: reductions ──────────────────────────────────────────────────
#
# sum, mean and max reduce one axis (``axis``) or, without one, every element.
# ``keepdims`` keeps the reduced axis (every axis, for a whole reduction) as
# size 1; without it the axis is dropped, and a result with no dims left is
# [1] (where numpy would give a 0-d array).  Every line of the reduced axis
# is a row of ``len`` elements at stride ``inner`` (a whole reduction: one row
# of every element); the kernels run one thread per row.

kernel("k_sum", "out:w a:r len:i inner:i is_mean:i acc:i",
       "per row: v = (0.0 + a0 + a1 + ...) [/ len], serial; out (=|+=) v "
       "(numerics.serial_sum_axis)")
kernel("k_sum_bwd", "ga:w g:r len:i inner:i is_mean:i",
       "ga[i] = ga[i] + v, v = g[row of i] (sum) or g[row of i] / len (mean)")
kernel("k_max", "out:w a:r len:i inner:i", "per row: out = the first maximal element "
       "(numerics.first_max)")
kernel("k_max_bwd", "ga:w g:r a:r len:i inner:i",
       "per row: ga = ga + (g at the first maximal element, +0.0 elsewhere)")

REDUCE_ATTRS = (
    Attr("axis", "axis", "the axis to reduce; negative counts from the end; None (absent "
         "from a file): every element", default=None, optional=True),
    Attr("keepdims", "flag", "keep the reduced axis as size 1, as numpy does", default=False,
         optional=True),
)


def _reduce_shape(sa, _sb, attrs):
    axis, keep = attr(attrs, "axis"), attr(attrs, "keepdims", False)
    if axis is None:
        return (1,) * len(sa) if keep else (1,)
    _axis_check(sa, axis, "reduction")
    if keep:
        return tuple(sa[:axis]) + (1,) + tuple(sa[axis + 1:])
    return tuple(sa[:axis]) + tuple(sa[axis + 1:]) or (1,)


def _rows(a, at):
    """(a as [..., len, ...] with the reduced axis, that axis): a whole reduction is one
    row of every element."""
    axis = attr(at, "axis")
    return (a.reshape(-1), 0) if axis is None else (a, axis)


def _sum_f(a, b, s, at):
    if attr(at, "axis") is None:
        return nx.serial_sum(a).reshape(_reduce_shape(a.shape, None, at))   # same order
    rows, axis = _rows(a, at)
    return nx.serial_sum_axis(rows, axis).reshape(_reduce_shape(a.shape, None, at))


def _mean_f(a, b, s, at):
    if attr(at, "axis") is None:
        return nx.serial_mean(a).reshape(_reduce_shape(a.shape, None, at))
    rows, axis = _rows(a, at)
    return (nx.serial_sum_axis(rows, axis) / float(rows.shape[axis])).reshape(
        _reduce_shape(a.shape, None, at))


def _spread(g, a, at):
    """g (one value per row) in a's keepdims layout, ready to broadcast over a."""
    axis = attr(at, "axis")
    kept = (1,) * a.ndim if axis is None else a.shape[:axis] + (1,) + a.shape[axis + 1:]
    return g.reshape(kept)


def _sum_b(g, a, b, t, s, at, na, nb):
    if attr(at, "axis") is None:
        return (np.full(a.shape, g.reshape(-1)[0]), None)   # one value: np.full is cheaper
    return (np.broadcast_to(_spread(g, a, at), a.shape).copy(), None)


def _mean_b(g, a, b, t, s, at, na, nb):
    if attr(at, "axis") is None:
        return (np.full(a.shape, g.reshape(-1)[0] / float(a.size)), None)
    rows, axis = _rows(a, at)
    return (np.broadcast_to(_spread(g, a, at) / float(rows.shape[axis]), a.shape).copy(),
            None)


def _max_f(a, b, s, at):
    rows, axis = _rows(a, at)
    return nx.first_max(rows, axis)[0].reshape(_reduce_shape(a.shape, None, at))


def _max_b(g, a, b, t, s, at, na, nb):
    rows, axis = _rows(a, at)
    idx = nx.first_max(rows, axis)[1]
    c = np.zeros(rows.shape)                        # g at each row's max, +0.0 elsewhere
    np.put_along_axis(c, idx, g.reshape(idx.shape), axis)
    return (c.reshape(a.shape), None)


# one-element forms (the emitter): the serial sum of one element is 0.0 + x; the mean
# divides that by n = 1 (a division, not a copy), and its gradient is g / 1.0; the max of
# one element is that element, and its gradient all of g
_register(OpSpec("sum", "reduce", 1, "serial sum along an axis, or of every element",
                 _reduce_shape, _sum_f, _sum_b, scalar=(0.0 + X, (G,)),
                 kernels=("k_sum", "k_sum_bwd"), attrs=REDUCE_ATTRS, integral="inputs"))
_register(OpSpec("mean", "reduce", 1, "serial sum / count, along an axis or of every element",
                 _reduce_shape, _mean_f, _mean_b, scalar=((0.0 + X) / 1.0, (G / 1.0,)),
                 kernels=("k_sum", "k_sum_bwd"), attrs=REDUCE_ATTRS))
_register(OpSpec("max", "max", 1, "the first maximal element along an axis, or of every "
                 "element; a NaN wins; the gradient goes to that one element",
                 _reduce_shape, _max_f, _max_b, scalar=(X, (G,)),
                 kernels=("k_max", "k_max_bwd"), attrs=REDUCE_ATTRS, integral="inputs"))


# ── the table: matrix products ─────────────────────────────────────────────

kernel("k_matmul", "c:w a:r b:r batch:i m:i k:i n:i sab:i sai:i sak:i sbb:i sbk:i sbj:i "
       "acc:i",
       "C[bt] (=|+=) A[bt] @ B[bt] with arbitrary strides, every element the FMA chain "
       "over k ascending from +0.0 (numerics.matmul)")


def _matmul_f(a, b, s, at):
    return nx.matmul(a, b)


def _matmul_b(g, a, b, t, s, at, na, nb):
    # dA = G @ B^T (serial over N), dB = A^T @ G (serial over M)
    return (nx.matmul(g, b.T) if na else None, nx.matmul(a.T, g) if nb else None)


def _batched(a, b):
    """a and b with a batch of 1 stretched to the other's batch (read-only views)."""
    bt = max(a.shape[0], b.shape[0])
    return np.broadcast_to(a, (bt,) + a.shape[1:]), np.broadcast_to(b, (bt,) + b.shape[1:])


def _bmm_f(a, b, s, at):
    return nx.bmm(*_batched(a, b))


def _batch_sum(p, shape):
    """A stretched side's gradient: the per-batch products summed over the batch
    (serial, from 0.0, batch ascending); a side that was not stretched keeps its own."""
    return nx.serial_sum_axis(p, 0) if p.shape[0] != shape[0] else p


def _bmm_b(g, a, b, t, s, at, na, nb):
    # dA[bt] = G[bt] @ B[bt]^T (serial over N), dB[bt] = A[bt]^T @ G[bt] (serial over M)
    wa, wb = _batched(a, b)
    return (_batch_sum(nx.bmm(g, np.swapaxes(wb, 1, 2)), a.shape) if na else None,
            _batch_sum(nx.bmm(np.swapaxes(wa, 1, 2), g), b.shape) if nb else None)


# fresh_grads: each contribution is a new array from an FMA chain started at +0.0
# (or a serial sum from 0.0 of such arrays), which never holds -0.0, so the backward
# walk keeps a first contribution as it is: 0.0 + c, its usual copy, would be c bit
# for bit (tape.Tape._accumulate).
_register(OpSpec("matmul", "matmul", 2, "[M,K] @ [K,N], serial over K", _matmul_shape,
                 _matmul_f, _matmul_b, kernels=("k_matmul",), fresh_grads=True))
_register(OpSpec("bmm", "bmm", 2, "[B,M,K] @ [B,K,N], the matmul order per batch; a batch of "
                 "1 on either side stretches, and its gradient is the batch's serial sum",
                 _bmm_shape, _bmm_f, _bmm_b, kernels=("k_matmul", "k_sum"), fresh_grads=True))


# ── the table: data movement ───────────────────────────────────────────────

kernel("k_copy_nd", "dst:w src:r acc:i nd:i dims:i[nd] sd:i[nd] ss:i[nd]",
       "dst[...] (=|+=) src[...] over an nd-dim row-major index space with strides")
kernel("k_slice_bwd", "ga:w g:r nd:i dims:i[nd] starts:i[nd] stops:i[nd] steps:i[nd] "
       "gst:i[nd]", "ga = ga + (g at the region's elements, +0.0 elsewhere), every input "
       "element")


def _transpose_f(a, b, s, at):
    return np.ascontiguousarray(np.swapaxes(a, -1, -2))


def _transpose_b(g, a, b, t, s, at, na, nb):
    return (np.ascontiguousarray(np.swapaxes(g, -1, -2)), None)


def _reshape_f(a, b, s, at):
    return a.reshape(tuple(at["shape"])).copy()


def _reshape_b(g, a, b, t, s, at, na, nb):
    return (g.reshape(a.shape), None)


def _slice_region(at):
    steps = attr(at, "steps") or [1] * len(at["starts"])
    return tuple(slice(lo, hi, st) for lo, hi, st in zip(at["starts"], at["stops"], steps))


def _slice_f(a, b, s, at):
    return a[_slice_region(at)].copy()


def _slice_b(g, a, b, t, s, at, na, nb):
    scattered = np.zeros(a.shape)                   # scatter into zeros
    scattered[_slice_region(at)] = g
    return (scattered, None)


def _concat_f(a, b, s, at):
    return np.concatenate([a, b], axis=at["axis"])


def _concat_b(g, a, b, t, s, at, na, nb):
    ga, gb = np.split(g, [a.shape[at["axis"]]], axis=at["axis"])
    return (np.ascontiguousarray(ga) if na else None, np.ascontiguousarray(gb) if nb else None)


AXIS = "an axis of the input; negative counts from the end"
_register(OpSpec("transpose", "transpose", 1, "swap the last two axes", _transpose_shape,
                 _transpose_f, _transpose_b, kernels=("k_copy_nd",), integral="inputs"))
_register(OpSpec("reshape", "reshape", 1, "the same elements in a new shape", _reshape_shape,
                 _reshape_f, _reshape_b, kernels=("k_copy_nd",), integral="inputs",
                 attrs=(Attr("shape", "shape", "the target shape (the node's own shape)"),)))
# softmax (between reshape and slice: the table's order is the file format's op list)
# Along an axis: m = max (exact in any order; a NaN makes the row NaN), e = exp(x - m),
# then y = e / serial_sum_axis(e).  Backward: d = serial_sum_axis(g * t), then
# contribution t * (g - d).  The elementwise parts, shared with the kernel:
SOFTMAX_EXP = exp(X - Sym("m"))
SOFTMAX_NORM = Sym("e") / Sym("sum")
SOFTMAX_DOT = G * T
SOFTMAX_BWD = T * (G - Sym("dot"))
SOFTMAX_PARTS = {"EXP": SOFTMAX_EXP, "NORM": SOFTMAX_NORM, "DOT": SOFTMAX_DOT,
                 "BWD": SOFTMAX_BWD}

kernel("k_softmax", "out:w a:r len:i inner:i",
       "per row of len elements at stride inner: e = exp(x - max); y = e / (0.0 + e0 + ...)")
kernel("k_softmax_bwd", "ga:w g:r t:r len:i inner:i",
       "ga = ga + t * (g - (0.0 + g0*t0 + g1*t1 + ...)) per row")


def _softmax_f(a, b, s, at):
    axis = at["axis"]
    e = evaluate(SOFTMAX_EXP, {"x": a, "m": np.max(a, axis=axis, keepdims=True)})
    return evaluate(SOFTMAX_NORM, {"e": e, "sum": nx.serial_sum_axis(e, axis)})


def _softmax_b(g, a, b, t, s, at, na, nb):
    dot = nx.serial_sum_axis(evaluate(SOFTMAX_DOT, {"g": g, "t": t}), at["axis"])
    return (evaluate(SOFTMAX_BWD, {"t": t, "g": g, "dot": dot}), None)


_register(OpSpec("softmax", "softmax", 1, "exp(a - max) / serial sum, along an axis",
                 _softmax_shape, _softmax_f, _softmax_b, kernels=("k_softmax", "k_softmax_bwd"),
                 attrs=(Attr("axis", "axis", AXIS, default=-1),), parts=SOFTMAX_PARTS))

# log_softmax along an axis: m = the first max (numerics.first_max, exact), d = x - m,
# y = d - log(serial_sum_axis(exp(d))): no division, so a confident row's small
# probabilities stay finite logs instead of underflowing to log(0).  Backward: gs =
# serial_sum_axis(g), contribution g - exp(t) * gs (exp(t) is the softmax).  The parts:
LOG_SOFTMAX_PARTS = {"SHIFT": X - Sym("m"), "EXP": exp(Sym("d")),
                     "OUT": Sym("d") - log(Sym("sum")), "BWD": G - exp(T) * Sym("gsum")}

kernel("k_log_softmax", "out:w a:r len:i inner:i",
       "per row: d = x - max; y = d - log(0.0 + exp(d0) + exp(d1) + ...)")
kernel("k_log_softmax_bwd", "ga:w g:r t:r len:i inner:i",
       "ga = ga + (g - exp(t) * (0.0 + g0 + g1 + ...)) per row")


def _log_softmax_f(a, b, s, at):
    axis, part = at["axis"], LOG_SOFTMAX_PARTS
    d = evaluate(part["SHIFT"], {"x": a, "m": nx.first_max(a, axis)[0]})
    e = evaluate(part["EXP"], {"d": d})
    return evaluate(part["OUT"], {"d": d, "sum": nx.serial_sum_axis(e, axis)})


def _log_softmax_b(g, a, b, t, s, at, na, nb):
    gsum = nx.serial_sum_axis(g, at["axis"])
    return (evaluate(LOG_SOFTMAX_PARTS["BWD"], {"g": g, "t": t, "gsum": gsum}), None)


def _one_element_log_softmax():
    """The parts on a row of one element (the emitter): m = x, the serial sum 0.0 + e."""
    part = LOG_SOFTMAX_PARTS
    d = substitute(part["SHIFT"], {"m": X})
    fwd = substitute(part["OUT"], {"d": d, "sum": 0.0 + substitute(part["EXP"], {"d": d})})
    return fwd, (substitute(part["BWD"], {"gsum": 0.0 + G}),)


_register(OpSpec("log_softmax", "softmax", 1, "a - max - log(serial sum of exp(a - max)), "
                 "along an axis", _softmax_shape, _log_softmax_f, _log_softmax_b,
                 kernels=("k_log_softmax", "k_log_softmax_bwd"),
                 attrs=(Attr("axis", "axis", AXIS, default=-1),), parts=LOG_SOFTMAX_PARTS,
                 scalar=_one_element_log_softmax()))


_register(OpSpec("slice", "slice", 1, "a[starts:stops:steps] on every axis", _slice_shape,
                 _slice_f, _slice_b, kernels=("k_copy_nd", "k_slice_bwd"), integral="inputs",
                 attrs=(Attr("starts", "indices", "first index per axis"),
                        Attr("stops", "indices", "one past the last index per axis"),
                        Attr("steps", "indices", "the step per axis, each >= 1; None (absent "
                             "from a file): every step 1", default=None, optional=True))))
_register(OpSpec("concat", "concat", 2, "a and b joined along an axis", _concat_shape,
                 _concat_f, _concat_b, kernels=("k_copy_nd",), integral="inputs",
                 attrs=(Attr("axis", "axis", AXIS, default=0),)))


# permute: out[j0, j1, ...] = a at the index whose axis dims[k] is j_k (numpy's transpose
# with axes=dims): exact copies.  Backward: the inverse permutation of g, added once.
def _permute_f(a, b, s, at):
    return np.ascontiguousarray(np.transpose(a, at["dims"]))


def _permute_b(g, a, b, t, s, at, na, nb):
    return (np.ascontiguousarray(np.transpose(g, np.argsort(at["dims"]))), None)


_register(OpSpec("permute", "permute", 1, "the axes in a new order: out axis k is input axis "
                 "dims[k] (numpy's transpose(a, dims), torch's permute)", _permute_shape,
                 _permute_f, _permute_b, kernels=("k_copy_nd",),
                 attrs=(Attr("dims", "perm", "the input axis of each out axis; negative "
                             "counts from the end"),)))


# ── the table: gathers by integer ids ──────────────────────────────────────
#
# ``take(table, ids)`` is ``np.take(table, ids, axis=0)``: ids of any shape pick rows of
# the table, out = [*ids.shape, *table.shape[1:]].  ``take_along(a, ids, axis)`` is
# ``np.take_along_axis``: ids shaped like a except along the axis pick one element of a's
# line each.  ids are an i64 const (docs/format.md), every id in [0, rows): checked when
# recording, loading and setting an input.  Backward scatters g back, each destination
# element summing what reaches it serially from 0.0 in ascending position order (take:
# numerics.take_index, which the device replay uploads with the ids; take_along: j
# ascending along the axis), one device thread per destination element: no atomics.

kernel("k_take", "out:w table:r ids:r rows:i width:i err:w",
       "out[p, j] = table[ids[p], j] (a NaN, and err = 1, for an id that is not a whole number "
       "in [0, rows))")
kernel("k_take_bwd", "ga:w g:r order:r start:r width:i",
       "per table element (v, j): ga = ga + (0.0 + g[p0, j] + g[p1, j] + ...) over the "
       "positions order[start[v]:start[v+1]] (numerics.take_index)")
kernel("k_take_bwd_scan", "ga:w g:r ids:r n:i rows:i width:i",
       "per table element (v, j): ga = ga + (0.0 + g[p0, j] + g[p1, j] + ...) over the "
       "positions p < n reading row v, ascending (ids computed on the device: the order of "
       "numerics.take_index without an uploaded index)")
kernel("k_take_along", "out:w a:r ids:r len:i k:i inner:i err:w",
       "out[o, j, r] = a[o, ids[o, j, r], r] (a NaN, and err = 1, for an id that is not a whole "
       "number in [0, len))")
kernel("k_take_along_bwd", "ga:w g:r ids:r len:i k:i inner:i",
       "per element (o, l, r) of a: ga = ga + (0.0 + each g[o, j, r] with ids[o, j, r] == l, "
       "j ascending)")


def _take_shape(sa, sb, _attrs):
    return tuple(sb) + tuple(sa[1:])


def _take_f(a, b, s, at):
    return np.take(a, as_ids(b), axis=0)


def _take_b(g, a, b, t, s, at, na, nb):
    rows = a.shape[0]
    order, start = nx.take_index(as_ids(b), rows)
    counts = np.diff(start)
    g_rows = g.reshape(-1, a.size // rows)
    c = np.zeros((rows, a.size // rows))
    for k in range(int(counts.max(initial=0))):      # each row's k-th position, in order
        hit = np.flatnonzero(counts > k)
        c[hit] = c[hit] + g_rows[order[start[hit] + k]]
    return (c.reshape(a.shape), None)


def _take_along_shape(sa, sb, attrs):
    axis = attrs["axis"]
    _axis_check(sa, axis, "take_along")
    if not _equal_but_axis(sa, sb, axis):
        raise ShapeError(f"take_along on axis {axis} needs ids shaped like {format_shape(sa)} "
                         f"except on that axis, got {format_shape(sb)}")
    return tuple(sb)


def _take_along_f(a, b, s, at):
    return np.take_along_axis(a, as_ids(b), axis=at["axis"])


def _take_along_b(g, a, b, t, s, at, na, nb):
    axis, b = at["axis"], as_ids(b)
    c = np.zeros(a.shape)
    for j in range(b.shape[axis]):                  # one id per line at a time, in order
        idx, gj = np.take(b, [j], axis=axis), np.take(g, [j], axis=axis)
        np.put_along_axis(c, idx, np.take_along_axis(c, idx, axis=axis) + gj, axis=axis)
    return (c, None)


_register(OpSpec("take", "take", 2, "rows of a table picked by integer ids (np.take on axis "
                 "0): [*ids.shape, *table.shape[1:]]", _take_shape, _take_f, _take_b,
                 kernels=("k_take", "k_take_bwd", "k_take_bwd_scan"), int_inputs=("b",),
                 index_bound=lambda sa, at: sa[0], id_inputs=("b",)))
_register(OpSpec("take_along", "take_along", 2, "one element of each line along an axis per "
                 "integer id (np.take_along_axis)", _take_along_shape, _take_along_f,
                 _take_along_b, kernels=("k_take_along", "k_take_along_bwd"),
                 attrs=(Attr("axis", "axis", AXIS, default=-1),), int_inputs=("b",),
                 index_bound=lambda sa, at: sa[at["axis"]], id_inputs=("b",)))


# ── the table: masks and integer data ──────────────────────────────────────
#
# A mask is a float64 tensor of 0.0/1.0; integer data (an i64 const: token ids,
# targets) is read by the ops below as exact float64 values (every int64 with
# |v| <= 2^53 converts exactly; on the device the arena holds them so already).
#
# * comparisons eq/ne/lt/le/gt/ge: 1.0 where the IEEE comparison holds, else 0.0 (a NaN
#   compares unequal to everything, itself included: ne gives 1.0, the others 0.0).
#   They carry NO gradient (grad_inputs=()): a comparison's node never requires grad,
#   so the backward walk stops there on every backend (no zero contributions are run);
# * keep(x, m) = x where m != 0 else -0.0, and keep_not(x, m) = x where m == 0 else -0.0:
#   exact copies.  Their gradient is g where the copy was taken, else +0.0, to x only
#   (none to the mask).  Tape.where(m, a, b) is the composite keep(a, m) + keep_not(b, m):
#   where m holds that is a + (-0.0), else (-0.0) + b, and x + (-0.0) == x exactly in IEEE
#   arithmetic for every x (+0.0, -0.0, the infinities; a NaN stays a NaN), so the add is
#   an exact copy.  A mask element that is NaN counts as holding (NaN != 0), as
#   torch's bool(nan) is True;
# * to_f64(a): the values of a (an i64 const: its ids as exact float64; a float64 node:
#   an exact copy), gradient g;
# * Tape.logical_and/or/not are the exact composites mul(m, n), maximum(m, n) and
#   eq(m, 0) on masks of 0.0/1.0; any and counts are max and sum over a mask.
#
# Integer-valued nodes (``integral``): an i64 const; a comparison; keep and keep_not of an
# integer-valued a (whatever the mask); to_f64, add, sub, mul, neg, maximum, sum, max and
# the layout ops (reshape, transpose, slice, concat) of integer-valued inputs.  take and
# take_along read their ids from any integer-valued node (``id_inputs``): ids computed on
# the tape are checked,
# every one a whole number in [0, bound), by the CPU reference at every replay and by the
# device kernels (a bad id reads nothing, writes a NaN and raises the replay's error flag,
# which the engine turns into the same error).

def _elementwise_reading_ints(forward):
    """An elementwise numpy rule whose inputs may be int64 (an i64 const): converted to
    float64 first (exact below 2^53), so every rule sees the kernels' values."""
    def rule(a, b, s, at):
        if a.dtype.kind in "iu":
            a = a.astype(np.float64)
        if b is not None and b.dtype.kind in "iu":
            b = b.astype(np.float64)
        return forward(a, b, s, at)
    return rule


def _compare(name: str, doc: str, cond: Expr) -> None:
    binary(name, doc, select(cond, 1.0, 0.0), Const(0.0), Const(0.0), int_inputs=("a", "b"),
           grad_inputs=(), integral="always")


_compare("eq", "1.0 where a == b, else 0.0 (a mask; no gradient)", eq(X, Y))
_compare("ne", "1.0 where a != b (a NaN too), else 0.0 (a mask; no gradient)", ne(X, Y))
_compare("lt", "1.0 where a < b, else 0.0 (a mask; no gradient)", X < Y)
_compare("le", "1.0 where a <= b, else 0.0 (a mask; no gradient)", X <= Y)
_compare("gt", "1.0 where a > b, else 0.0 (a mask; no gradient)", X > Y)
_compare("ge", "1.0 where a >= b, else 0.0 (a mask; no gradient)", X >= Y)
binary("keep", "a where the mask b != 0, else -0.0 (exact; half of Tape.where)",
       select(ne(Y, 0.0), X, -0.0), select(ne(Y, 0.0), G, 0.0), Const(0.0),
       int_inputs=("a", "b"), grad_inputs=("a",), integral="a")
binary("keep_not", "a where the mask b == 0, else -0.0 (exact; half of Tape.where)",
       select(eq(Y, 0.0), X, -0.0), select(eq(Y, 0.0), G, 0.0), Const(0.0),
       int_inputs=("a", "b"), grad_inputs=("a",), integral="a")
unary("to_f64", "the values as float64 (integer data converted exactly; a float an exact "
      "copy)", X, G, int_inputs=("a",), integral="inputs")
for _name in ("eq", "ne", "lt", "le", "gt", "ge", "keep", "keep_not"):
    OPS[_name] = dataclasses.replace(OPS[_name],
                                     forward=_elementwise_reading_ints(OPS[_name].forward))
del _name
# to_f64's rule x is a copy: a new float64 array (never the input itself)
OPS["to_f64"] = dataclasses.replace(
    OPS["to_f64"], forward=lambda a, b, s, at: np.array(a, dtype=np.float64, copy=True))


# ── the table: convolution and pooling (NCHW) ──────────────────────────────
#
# conv2d(x [N, C, H, W], w [OC, C/groups, KH, KW]) is torch's cross-correlation
# with stride, padding, dilation and groups (a bias is a broadcast add:
# gradtool.nn.conv2d).  Its products are the matmul's own: im2col columns, then
# per group w_g @ cols_g by the matmul kernel (numerics.conv2d), so conv2d follows
# whatever inner-product contract matmul has.  max_pool2d and avg_pool2d follow
# torch's output sizes (ceil_mode) and avg_pool2d torch's divisor
# (count_include_pad).  The orders: numerics.conv2d, max_pool2d, avg_pool2d.  On
# the device: conv2d's three products are one launch each, k_matmul_conv2d (one
# thread per output), k_matmul_conv2d_dw (per weight) and k_matmul_conv2d_dx (per
# input element), each the matmul's FMA chain in numerics' order (the tiled host
# build runs csrc/gt_conv.h, the CPU reference's code, instead); the pools are one
# thread per output (forward) and per input element (backward), no atomics.

_GEOMETRY = ("nb:i ch:i ih:i iw:i kh:i kw:i oh:i ow:i sh:i sw:i ph:i pw:i dh:i dw:i")
_CONV = "oc:i groups:i " + _GEOMETRY
kernel("k_matmul_conv2d", "out:w x:r w:r " + _CONV,
       "out[n, o, y, z] = the FMA chain over (c, i, j) ascending from +0.0 of w * x (+0.0 "
       "at padding; numerics.conv2d)")
kernel("k_matmul_conv2d_dw", "gw:w g:r x:r " + _CONV,
       "gw = gw + the FMA chain over (n, y, z) ascending from +0.0 of g * x, per weight "
       "(numerics.conv2d_backward)")
kernel("k_matmul_conv2d_dx", "gx:w g:r w:r " + _CONV,
       "gx = gx + (0.0 + term + ...) over (i, j) ascending, each term the FMA chain over "
       "the group's output channels of w * g, per input element (numerics.conv2d_backward)")
kernel("k_max_pool", "out:w x:r " + _GEOMETRY,
       "per window the first maximum inside the input, (i, j) row-major; -inf if none "
       "(numerics.max_pool2d)")
kernel("k_max_pool_bwd", "gx:w g:r x:r " + _GEOMETRY,
       "gx = gx + (0.0 + g of each window whose maximum it is, (i, j) ascending), per input "
       "element")
kernel("k_avg_pool", "out:w x:r incl:i " + _GEOMETRY,
       "per window (0.0 + x + ...) / torch's divisor (incl: count_include_pad)")
kernel("k_avg_pool_bwd", "gx:w g:r incl:i " + _GEOMETRY,
       "gx = gx + (0.0 + g/divisor + ...) over the windows reading it, (i, j) ascending")

PAIR = "two ints: (height, width)"


def _pairs(attrs, *names):
    return [tuple(attrs[name]) for name in names]


def _check_pairs(opname, attrs, positive=(), nonneg=()):
    for name in (*positive, *nonneg):
        value = attrs[name]
        low = 1 if name in positive else 0
        if len(value) != 2 or min(value) < low:
            raise ShapeError(f"{opname} {name} must be two ints >= {low}, got {list(value)}")


def _conv2d_shape(sa, sb, attrs):
    _check_pairs("conv2d", attrs, positive=("stride", "dilation"), nonneg=("padding",))
    groups = attrs["groups"]
    if len(sa) != 4 or len(sb) != 4:
        raise ShapeError(f"conv2d needs x [N,C,H,W] and w [OC,C/groups,KH,KW], got "
                         f"{format_shape(sa)} and {format_shape(sb)}")
    if groups < 1 or sa[1] % groups or sb[0] % groups or sb[1] * groups != sa[1]:
        raise ShapeError(f"conv2d with groups={groups} needs C and OC divisible by groups and "
                         f"w's dim 1 = C/groups, got x {format_shape(sa)} w {format_shape(sb)}")
    (sh, sw), (ph, pw), (dh, dw) = _pairs(attrs, "stride", "padding", "dilation")
    oh = nx.conv_out_size(sa[2], sb[2], sh, ph, dh)
    ow = nx.conv_out_size(sa[3], sb[3], sw, pw, dw)
    if oh < 1 or ow < 1:
        raise ShapeError(f"conv2d of {format_shape(sa)} by a {sb[2]}x{sb[3]} kernel (padding "
                         f"{[ph, pw]}, dilation {[dh, dw]}) leaves no output")
    return (sa[0], sb[0], oh, ow)


def _conv_geometry(at):
    return dict(stride=tuple(at["stride"]), padding=tuple(at["padding"]),
                dilation=tuple(at["dilation"]), groups=at["groups"])


def _conv2d_f(a, b, s, at):
    return nx.conv2d(a, b, **_conv_geometry(at))


def _conv2d_b(g, a, b, t, s, at, na, nb):
    return nx.conv2d_backward(g, a, b, **_conv_geometry(at), need_x=na, need_w=nb)


def _pool_shape(opname, sa, attrs, dilation):
    _check_pairs(opname, attrs, positive=("kernel", "stride") + (("dilation",) if dilation
                                                                  else ()),
                 nonneg=("padding",))
    if len(sa) != 4:
        raise ShapeError(f"{opname} needs x [N,C,H,W], got {format_shape(sa)}")
    (kh, kw), (sh, sw), (ph, pw) = _pairs(attrs, "kernel", "stride", "padding")
    if 2 * ph > kh or 2 * pw > kw:
        raise ShapeError(f"{opname} padding {[ph, pw]} must be at most half the kernel "
                         f"{[kh, kw]} (as torch)")
    dh, dw = tuple(attrs["dilation"]) if dilation else (1, 1)
    ceil = bool(attr(attrs, "ceil_mode", False))
    oh = nx.pool_out_size(sa[2], kh, sh, ph, dh, ceil)
    ow = nx.pool_out_size(sa[3], kw, sw, pw, dw, ceil)
    if oh < 1 or ow < 1:
        raise ShapeError(f"{opname} of {format_shape(sa)} by a {kh}x{kw} window leaves no "
                         f"output")
    return (sa[0], sa[1], oh, ow)


def _max_pool_args(at):
    return (tuple(at["kernel"]), tuple(at["stride"]), tuple(at["padding"]),
            tuple(at["dilation"]), bool(attr(at, "ceil_mode", False)))


def _max_pool_f(a, b, s, at):
    return nx.max_pool2d(a, *_max_pool_args(at))


def _max_pool_b(g, a, b, t, s, at, na, nb):
    return (nx.max_pool2d_backward(g, a, *_max_pool_args(at)), None)


def _avg_pool_args(at):
    return (tuple(at["kernel"]), tuple(at["stride"]), tuple(at["padding"]),
            bool(attr(at, "ceil_mode", False)), bool(attr(at, "count_include_pad", True)))


def _avg_pool_f(a, b, s, at):
    return nx.avg_pool2d(a, *_avg_pool_args(at))


def _avg_pool_b(g, a, b, t, s, at, na, nb):
    return (nx.avg_pool2d_backward(g, a, *_avg_pool_args(at)), None)


_WINDOW = (Attr("kernel", "indices", "the window: " + PAIR),
           Attr("stride", "indices", "the window's step: " + PAIR))
_CEIL = Attr("ceil_mode", "flag", "torch's ceil_mode: count a last partial window",
             default=False, optional=True)
_register(OpSpec("conv2d", "conv2d", 2, "NCHW cross-correlation of x [N,C,H,W] by w "
                 "[OC,C/groups,KH,KW] (torch's conv2d, no bias), the matmul's products",
                 _conv2d_shape, _conv2d_f, _conv2d_b,
                 kernels=("k_matmul_conv2d", "k_matmul_conv2d_dw", "k_matmul_conv2d_dx"),
                 attrs=(Attr("stride", "indices", "the step: " + PAIR, default=(1, 1)),
                        Attr("padding", "indices", "zeros on each side: " + PAIR,
                             default=(0, 0)),
                        Attr("dilation", "indices", "the kernel's spacing: " + PAIR,
                             default=(1, 1)),
                        Attr("groups", "count", "input and output channels in this many "
                             "groups (C: depthwise)", default=1))))
_register(OpSpec("max_pool2d", "max_pool2d", 1, "NCHW max pooling (torch's max_pool2d): the "
                 "first maximum of each window gets the gradient; a NaN wins",
                 lambda sa, sb, at: _pool_shape("max_pool2d", sa, at, True),
                 _max_pool_f, _max_pool_b, kernels=("k_max_pool", "k_max_pool_bwd"),
                 attrs=_WINDOW + (Attr("padding", "indices", "-inf on each side: " + PAIR,
                                       default=(0, 0)),
                                  Attr("dilation", "indices", "the window's spacing: " + PAIR,
                                       default=(1, 1)), _CEIL)))
_register(OpSpec("avg_pool2d", "avg_pool2d", 1, "NCHW average pooling (torch's avg_pool2d: "
                 "ceil_mode, count_include_pad)",
                 lambda sa, sb, at: _pool_shape("avg_pool2d", sa, at, False),
                 _avg_pool_f, _avg_pool_b, kernels=("k_avg_pool", "k_avg_pool_bwd"),
                 attrs=_WINDOW + (Attr("padding", "indices", "zeros on each side: " + PAIR,
                                       default=(0, 0)), _CEIL,
                                  Attr("count_include_pad", "flag", "torch's "
                                       "count_include_pad: padding counts in the divisor",
                                       default=True, optional=True))))


# ── kernels of the engine that belong to no op ─────────────────────────────

kernel("k_fill", "dst:w value:f", "dst[i] = value")
kernel("k_from_f64", "dst:w src:r",
       "dst[i] = the float64 at src[i] (a staging area) rounded to gt_real: f32 uploads")
kernel("k_guard", "ctl:w loss:r", "ctl[3] = 1 when the loss is finite, else 0")
kernel("k_clip_norm", "ctl:w clip:f np:i offs:i[np] lens:i[np]",
       "norm of every active gradient (offs[p], lens[p] elements), the clip scale into ctl")
kernel("k_sgd", "w:w g:r ctl:r use_clip:i l2:f", "w = w - lr*g after clip and L2")
kernel("k_adam", "w:w g:r m:w v:w ctl:r use_clip:i l2:f b1:f b2:f omb1:f omb2:f eps:f",
       "Adam's moments and update after clip and L2 (gradtool.optim's order)")


OP_NAMES = tuple(OPS)
# the ops that read integer data (an i64 const), for messages
INTEGER_READERS = "integer data is read by " + ", ".join(
    n for n, spec in OPS.items() if spec.int_inputs)


def infer_shape(opname: str, sa, sb, attrs) -> tuple:
    """The op's output shape, or ShapeError.  No arithmetic, no allocation."""
    return tuple(map(int, OPS[opname].shape(sa, sb, attrs)))


__all__ = ["OPS", "OP_NAMES", "OpSpec", "Attr", "LEAF_OPS", "KERNELS", "FAMILIES", "KernelSpec",
           "contract", "pack", "attr", "bad_id", "as_ids", "inexact_int", "EXACT_INT",
           "INT_DTYPE", "INTEGER_READERS",
           "kernel_names", "f64_bits", "f64_from_bits", "infer_shape", "broadcast_shape",
           "format_shape",
           "SOFTMAX_PARTS", "LOG_SOFTMAX_PARTS"]
