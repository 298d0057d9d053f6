"""The op table: the one place that says what every op is.

Each entry gives the op's name (as used by the Tape method and the tape
file), its numeric code, its arity, the attributes it carries, a shape rule
(used both when recording and when loading a file, so a bad file is rejected
before any arithmetic or allocation), the forward rule, and right under it the
backward rule.  Rounding orders come from :mod:`gradtool.numerics`.

Conventions for the rule functions
----------------------------------
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

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from . import numerics as nx
from .errors import ShapeError


@dataclass(frozen=True)
class OpSpec:
    name: str
    code: int
    arity: int                      # number of node inputs (0 for leaves)
    shape: Optional[Callable]
    forward: Optional[Callable]
    backward: Optional[Callable]
    attrs: tuple = ()               # attribute names kept in the node's aux
    scalar_operand: bool = False    # uses the node's `s`
    elementwise: bool = False       # out[i] depends only on in[i] (same shapes)


OPS: dict[str, OpSpec] = {}
OPS_BY_CODE: dict[int, OpSpec] = {}


def _register(spec: OpSpec) -> None:
    OPS[spec.name] = spec
    OPS_BY_CODE[spec.code] = spec


def format_shape(shape) -> str:
    """[2,3]: how every message in gradtool writes a shape."""
    return "[" + ",".join(str(d) for d in shape) + "]"


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


def _scalar_shape(_sa, _sb, _attrs):
    return (1,)


def _matmul_shape(sa, sb, _attrs):
    if len(sa) != 2 or len(sb) != 2 or sa[1] != sb[0]:
        raise ShapeError(f"matmul needs [M,K] @ [K,N], got {format_shape(sa)} @ {format_shape(sb)}")
    return (sa[0], sb[1])


def _bmm_shape(sa, sb, _attrs):
    if len(sa) != 3 or len(sb) != 3 or sa[0] != sb[0] or sa[2] != sb[1]:
        raise ShapeError(f"bmm needs [B,M,K] @ [B,K,N], got {format_shape(sa)} @ {format_shape(sb)}")
    return (sa[0], sa[1], sb[2])


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


def _slice_shape(sa, _sb, attrs):
    starts, stops = tuple(attrs["starts"]), tuple(attrs["stops"])
    if len(starts) != len(sa) or len(stops) != len(sa):
        raise ShapeError(f"slice needs one start and stop per axis of {format_shape(sa)}, "
                         f"got starts {list(starts)} stops {list(stops)}")
    for lo, hi, dim in zip(starts, stops, sa):
        if not 0 <= lo < hi <= dim:
            raise ShapeError(f"slice [{lo}, {hi}) is empty or outside an axis of size {dim} "
                             f"in {format_shape(sa)}")
    return tuple(hi - lo for lo, hi in zip(starts, stops))


def _concat_shape(sa, sb, attrs):
    axis = attrs["axis"]
    _axis_check(sa, axis, "concat")
    if len(sa) != len(sb) or any(x != y for i, (x, y) in enumerate(zip(sa, sb)) if i != axis):
        raise ShapeError(f"concat along axis {axis} needs equal other dims, got "
                         f"{format_shape(sa)} and {format_shape(sb)}")
    return tuple(sa[:axis]) + (sa[axis] + sb[axis],) + tuple(sa[axis + 1:])


# ── forward and backward rules, op by op ───────────────────────────────────

def _red(c, shape):
    return nx.reduce_to_shape(c, shape)


def _add_f(a, b, s, at):
    return a + b


def _add_b(g, a, b, t, s, at, na, nb):
    return (_red(g, a.shape) if na else None, _red(g, b.shape) if nb else None)


def _sub_f(a, b, s, at):
    return a - b


def _sub_b(g, a, b, t, s, at, na, nb):
    return (_red(g, a.shape) if na else None, _red(-g, b.shape) if nb else None)


def _mul_f(a, b, s, at):
    return a * b


def _mul_b(g, a, b, t, s, at, na, nb):
    return (_red(g * b, a.shape) if na else None, _red(g * a, b.shape) if nb else None)


def _div_f(a, b, s, at):
    return a / b


def _div_b(g, a, b, t, s, at, na, nb):
    # dL/db = -g * t / b, rounded as -((g * t) / b)
    return (_red(g / b, a.shape) if na else None,
            _red(-((g * t) / b), b.shape) if nb else None)


def _neg_f(a, b, s, at):
    return -a


def _neg_b(g, a, b, t, s, at, na, nb):
    return (-g, None)


def _adds_f(a, b, s, at):
    return a + s


def _adds_b(g, a, b, t, s, at, na, nb):
    return (g, None)


def _muls_f(a, b, s, at):
    return a * s


def _muls_b(g, a, b, t, s, at, na, nb):
    return (g * s, None)


def _relu_f(a, b, s, at):
    return nx.relu(a)


def _relu_b(g, a, b, t, s, at, na, nb):
    return (nx.relu_backward(g, a), None)           # 0 at 0 (and at NaN)


def _sigmoid_f(a, b, s, at):
    return nx.sigmoid(a)


def _sigmoid_b(g, a, b, t, s, at, na, nb):
    return ((g * t) * (1.0 - t), None)


def _tanh_f(a, b, s, at):
    return nx.tanh(a)


def _tanh_b(g, a, b, t, s, at, na, nb):
    return (g * (1.0 - t * t), None)


def _exp_f(a, b, s, at):
    return nx.exp(a)


def _exp_b(g, a, b, t, s, at, na, nb):
    return (g * t, None)


def _log_f(a, b, s, at):
    return nx.log(a)


def _log_b(g, a, b, t, s, at, na, nb):
    return (g / a, None)


def _sqrt_f(a, b, s, at):
    return np.sqrt(a)                               # IEEE sqrt: correctly rounded


def _sqrt_b(g, a, b, t, s, at, na, nb):
    return (g / (2.0 * t), None)


def _sum_f(a, b, s, at):
    return nx.serial_sum(a)


def _sum_b(g, a, b, t, s, at, na, nb):
    return (np.full(a.shape, g[0]), None)


def _mean_f(a, b, s, at):
    return nx.serial_mean(a)


def _mean_b(g, a, b, t, s, at, na, nb):
    return (np.full(a.shape, g[0] / float(a.size)), None)


def _matmul_f(a, b, s, at):
    return nx.matmul(a, b)


def _matmul_b(g, a, b, t, s, at, na, nb):
    # dA = G @ B^T (serial over N), dB = A^T @ G (serial over M)
    return (nx.matmul(g, b.T) if na else None, nx.matmul(a.T, g) if nb else None)


def _bmm_f(a, b, s, at):
    return nx.bmm(a, b)


def _bmm_b(g, a, b, t, s, at, na, nb):
    return (nx.bmm(g, np.swapaxes(b, 1, 2)) if na else None,
            nx.bmm(np.swapaxes(a, 1, 2), g) if nb else None)


def _transpose_f(a, b, s, at):
    return np.ascontiguousarray(np.swapaxes(a, -1, -2))


def _transpose_b(g, a, b, t, s, at, na, nb):
    return (np.ascontiguousarray(np.swapaxes(g, -1, -2)), None)


def _reshape_f(a, b, s, at):
    return a.reshape(tuple(at["shape"])).copy()


def _reshape_b(g, a, b, t, s, at, na, nb):
    return (g.reshape(a.shape), None)


def _softmax_f(a, b, s, at):
    return nx.softmax(a, at["axis"])


def _softmax_b(g, a, b, t, s, at, na, nb):
    return (nx.softmax_backward(g, t, at["axis"]), None)


def _slice_region(at):
    return tuple(slice(lo, hi) for lo, hi in zip(at["starts"], at["stops"]))


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


def _table():
    E = dict(elementwise=True)
    rows = [
        OpSpec("param", 0, 0, None, None, None),
        OpSpec("const", 1, 0, None, None, None),
        OpSpec("add", 2, 2, broadcast_shape, _add_f, _add_b),
        OpSpec("sub", 3, 2, broadcast_shape, _sub_f, _sub_b),
        OpSpec("mul", 4, 2, broadcast_shape, _mul_f, _mul_b),
        OpSpec("div", 5, 2, broadcast_shape, _div_f, _div_b),
        OpSpec("neg", 6, 1, _same_shape, _neg_f, _neg_b, **E),
        OpSpec("adds", 7, 1, _same_shape, _adds_f, _adds_b, scalar_operand=True, **E),
        OpSpec("muls", 8, 1, _same_shape, _muls_f, _muls_b, scalar_operand=True, **E),
        OpSpec("relu", 9, 1, _same_shape, _relu_f, _relu_b, **E),
        OpSpec("sigmoid", 10, 1, _same_shape, _sigmoid_f, _sigmoid_b, **E),
        OpSpec("tanh", 11, 1, _same_shape, _tanh_f, _tanh_b, **E),
        OpSpec("exp", 12, 1, _same_shape, _exp_f, _exp_b, **E),
        OpSpec("log", 13, 1, _same_shape, _log_f, _log_b, **E),
        OpSpec("sqrt", 14, 1, _same_shape, _sqrt_f, _sqrt_b, **E),
        OpSpec("sum", 15, 1, _scalar_shape, _sum_f, _sum_b),
        OpSpec("mean", 16, 1, _scalar_shape, _mean_f, _mean_b),
        OpSpec("matmul", 17, 2, _matmul_shape, _matmul_f, _matmul_b),
        OpSpec("bmm", 18, 2, _bmm_shape, _bmm_f, _bmm_b),
        OpSpec("transpose", 19, 1, _transpose_shape, _transpose_f, _transpose_b),
        OpSpec("reshape", 20, 1, _reshape_shape, _reshape_f, _reshape_b, attrs=("shape",)),
        OpSpec("softmax", 21, 1, _softmax_shape, _softmax_f, _softmax_b, attrs=("axis",)),
        OpSpec("slice", 22, 1, _slice_shape, _slice_f, _slice_b, attrs=("starts", "stops")),
        OpSpec("concat", 23, 2, _concat_shape, _concat_f, _concat_b, attrs=("axis",)),
    ]
    for spec in rows:
        _register(spec)


_table()

OP_NAMES = tuple(OPS)
LEAF_OPS = ("param", "const")


def infer_shape(opname: str, sa, sb, attrs) -> tuple:
    """The op's output shape, or ShapeError.  No arithmetic, no allocation."""
    return tuple(int(d) for d in OPS[opname].shape(sa, sb, attrs))
