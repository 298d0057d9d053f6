"""The table's data movement (transpose, reshape, slice, concat, permute), softmaxes and
gathers by integer ids."""

from __future__ import annotations

import numpy as np

from .. import numerics as nx
from ..expr import G, T, X, Sym, evaluate, exp, log, substitute
from .spec import Attr, OpSpec, _register, as_ids, attr, kernel
from .shapes import (_concat_shape, _permute_shape, _reshape_shape, _scatter_shape,
                     _slice_shape, _softmax_shape, _take_along_shape, _take_shape,
                     _transpose_shape)


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
    scattered = np.zeros(a.shape, dtype=g.dtype)    # scatter into zeros
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
                 _permute_f, _permute_b, kernels=("k_copy_nd",), integral="inputs",
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
kernel("k_take_bwd_scan", "ga:w g:r ids:r n:i rows:i width:i err:w",
       "per table element (v, j): ga = ga + (0.0 + g[p0, j] + g[p1, j] + ...) over the "
       "positions p < n reading row v, ascending (ids computed on the device: the order of "
       "numerics.take_index without an uploaded index; err = 1 for an id that is not a "
       "whole number in [0, rows), which adds nowhere)")
kernel("k_take_along", "out:w a:r ids:r len:i k:i inner:i err:w",
       "out[o, j, r] = a[o, ids[o, j, r], r] (a NaN, and err = 1, for an id that is not a whole "
       "number in [0, len))")
kernel("k_take_along_bwd", "ga:w g:r ids:r len:i k:i inner:i",
       "per element (o, l, r) of a: ga = ga + (0.0 + each g[o, j, r] with ids[o, j, r] == l, "
       "j ascending)")


def _take_f(a, b, s, at):
    return np.take(a, as_ids(b), axis=0)


def _take_b(g, a, b, t, s, at, na, nb):
    rows = a.shape[0]
    g_rows = g.reshape(-1, a.size // rows)
    return (nx.scatter_rows(g_rows, as_ids(b), rows, dtype=g.dtype).reshape(a.shape), None)


def _take_along_f(a, b, s, at):
    return np.take_along_axis(a, as_ids(b), axis=at["axis"])


def _take_along_b(g, a, b, t, s, at, na, nb):
    axis, b = at["axis"], as_ids(b)
    c = np.zeros(a.shape, dtype=g.dtype)
    for j in range(b.shape[axis]):                  # one id per line at a time, in order
        idx, gj = np.take(b, [j], axis=axis), np.take(g, [j], axis=axis)
        np.put_along_axis(c, idx, np.take_along_axis(c, idx, axis=axis) + gj, axis=axis)
    return (c, None)


_register(OpSpec("take", "take", 2, "rows of a table picked by integer ids (np.take on axis "
                 "0): [*ids.shape, *table.shape[1:]]", _take_shape, _take_f, _take_b,
                 kernels=("k_take", "k_take_bwd", "k_take_bwd_scan"), int_inputs=("b",),
                 index_bound=lambda sa, at: sa[0], id_inputs=("b",), integral="a"))
_register(OpSpec("take_along", "take_along", 2, "one element of each line along an axis per "
                 "integer id (np.take_along_axis)", _take_along_shape, _take_along_f,
                 _take_along_b, kernels=("k_take_along", "k_take_along_bwd"),
                 attrs=(Attr("axis", "axis", AXIS, default=-1),), int_inputs=("b",),
                 index_bound=lambda sa, at: sa[at["axis"]], id_inputs=("b",), integral="a"))


# ── the table: the scatter-add of rows, take's adjoint ─────────────────────
#
# ``scatter(src, ids, rows=R)``: src is [*ids.shape, *rest], out [R, *rest]; out row v is
# ``0.0 + src[p0] + src[p1] + ...`` over the positions p (row-major over ids) with
# ids[p] == v, ascending; a row nobody writes is +0.0.  That is take's backward rule
# exactly (numerics.scatter_rows, one implementation), and on a device take's backward
# kernels on a zero-filled out: k_take_bwd walking the uploaded index
# (numerics.take_index) where the ids are a leaf, k_take_bwd_scan where they are computed
# on the tape (which raises the bad-id flag, as the gathers do).  Backward: src's
# gradient is take(g, ids), an exact gather (k_take into scratch, added once); the ids
# get none.  torch's index_add / scatter_add / index_put(accumulate=True) record it
# (Tape.index_add, gradtool/composites/layout.py).

def _scatter_f(a, b, s, at):
    ids, rows = as_ids(b), at["rows"]
    return nx.scatter_rows(a.reshape(ids.size, -1), ids, rows, dtype=a.dtype).reshape(
        (rows,) + a.shape[ids.ndim:])


def _scatter_b(g, a, b, t, s, at, na, nb):
    return (np.take(g, as_ids(b), axis=0), None)


_register(OpSpec("scatter", "scatter", 2, "the sum of src's rows into out's rows by integer "
                 "ids (take's adjoint, torch's index_add into zeros): [rows, *src.shape["
                 "ids.ndim:]], each row 0.0 + its rows of src, ascending", _scatter_shape,
                 _scatter_f, _scatter_b,
                 kernels=("k_fill", "k_take_bwd", "k_take_bwd_scan", "k_take", "k_copy_nd"),
                 attrs=(Attr("rows", "count", "out's rows: every id lies in [0, rows)"),),
                 int_inputs=("b",), index_bound=lambda sa, at: at["rows"], id_inputs=("b",),
                 grad_inputs=("a",), integral="inputs"))
