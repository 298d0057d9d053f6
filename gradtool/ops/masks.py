"""The table's masks and integer data: comparisons, logical ops, conversions."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..expr import G, X, Y, Const, Expr, eq, ne, select
from .spec import OPS, NUMPY_DTYPES, Attr, OpSpec, _register
from .shapes import _same_shape
from .elementwise import binary, unary


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
# Integer-valued nodes (``integral``): an i64 const; a comparison; the rounding ops (floor,
# ceil, trunc, round) of anything; keep, keep_not, take and take_along of an integer-valued
# a (whatever the mask or ids: exact copies); to_f64, detach, add, sub, mul, neg, maximum,
# minimum, sum, max and the layout ops (reshape, transpose, permute, slice, concat) of
# integer-valued inputs; adds, muls, clamp_min and clamp_max of an integer-valued a by a
# whole s.  take and take_along read their ids from any integer-valued node
# (``id_inputs``): ids computed on the tape are checked, every one a whole number in [0, bound), by the CPU reference at every replay and by the
# device kernels (a bad id reads nothing, writes a NaN and raises the replay's error flag,
# which the engine turns into the same error).

def _elementwise_reading_ints(name, forward):
    """An elementwise numpy rule whose inputs may be int64 (an i64 const): converted to
    float64 first (exact below 2^53), so every rule sees the kernels' values; the result
    in the op's dtype (ops.infer_dtype: f32 where an input read as values is f32, as
    comparing an i64 const with an f32 node gives an f32 mask, every 0.0/1.0 exact)."""
    free = OPS[name].dtype_free

    def rule(a, b, s, at):
        want32 = a.dtype == np.float32 or (b is not None and "b" not in free
                                           and b.dtype == np.float32)
        if a.dtype.kind in "iu":
            a = a.astype(np.float64)
        if b is not None and b.dtype.kind in "iu":
            b = b.astype(np.float64)
        out = forward(a, b, s, at)
        return out.astype(np.float32) if want32 and out.dtype != np.float32 else out
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
       int_inputs=("a", "b"), grad_inputs=("a",), integral="a", dtype_free=("b",))
binary("keep_not", "a where the mask b == 0, else -0.0 (exact; half of Tape.where)",
       select(eq(Y, 0.0), X, -0.0), select(eq(Y, 0.0), G, 0.0), Const(0.0),
       int_inputs=("a", "b"), grad_inputs=("a",), integral="a", dtype_free=("b",))
unary("to_f64", "the values as float64 (integer data converted exactly; a float an exact "
      "copy)", X, G, int_inputs=("a",), integral="inputs")
# detach(a): an exact copy of a that carries NO gradient (a stop-gradient: torch's
# Tensor.detach, the straight-through estimator's x + (q - x).detach()).  Like a comparison
# its node never requires grad, so the backward walk stops there on every backend; fd-check
# holds its value fixed while it perturbs a parameter (gradcheck._descendants), which is
# the derivative the stop-gradient defines
unary("detach", "a copy of a that carries no gradient (a stop-gradient)", X, Const(0.0),
      grad_inputs=(), integral="inputs")
OPS["detach"] = dataclasses.replace(
    OPS["detach"], forward=lambda a, b, s, at: np.array(a, copy=True))
for _name in ("eq", "ne", "lt", "le", "gt", "ge", "keep", "keep_not"):
    OPS[_name] = dataclasses.replace(OPS[_name],
                                     forward=_elementwise_reading_ints(_name,
                                                                       OPS[_name].forward))
del _name
# to_f64's rule x is a copy: a new float64 array (never the input itself)
OPS["to_f64"] = dataclasses.replace(
    OPS["to_f64"], forward=lambda a, b, s, at: np.array(a, dtype=np.float64, copy=True))


# cast(a, dtype): a's values in the other float dtype, torch's Tensor.to(dtype): f64 -> f32
# rounds each value once to nearest even (overflow to +-inf, subnormals kept, NaN stays
# NaN); f32 -> f64 is exact.  The gradient is g cast back to a's dtype (rounded once, or
# exact).  The node's dtype is its attribute (docs/ops.md, "dtypes"); a cast to a's own
# dtype is refused (Tape.cast returns a itself), so every cast changes the dtype.
def _cast_dtype(da, db, at):
    return at["dtype"]


def _cast_f(a, b, s, at):
    return np.array(a, dtype=NUMPY_DTYPES[at["dtype"]], copy=True)


def _cast_b(g, a, b, t, s, at, na, nb):
    return (np.array(g, dtype=a.dtype, copy=True), None)


# kind "cast", not "unary": no device kernel renders it yet (the device engines refuse a
# tape holding f32 values, docs/device.md), and no f64 rule reads it
_register(OpSpec("cast", "cast", 1, "a's values in another float dtype: f64 -> f32 rounds "
                 "once to nearest even, f32 -> f64 is exact; the gradient is cast back",
                 _same_shape, _cast_f, _cast_b,
                 attrs=(Attr("dtype", "dtype", "the target float dtype, 'f32' or 'f64'"),),
                 dtype_rule=_cast_dtype))
# to_f64 always gives float64 (of integer data, or of a float node of either dtype); an f32
# input's gradient is g rounded to float32 once (cast's backward)
_to_f64_rule = OPS["to_f64"].backward


def _to_f64_b(g, a, b, t, s, at, na, nb):
    if a.dtype == np.float32:
        return (np.array(g, dtype=np.float32, copy=True), None)
    return _to_f64_rule(g, a, b, t, s, at, na, nb)


OPS["to_f64"] = dataclasses.replace(OPS["to_f64"], dtype_rule=lambda da, db, at: "f64",
                                    backward=_to_f64_b)
