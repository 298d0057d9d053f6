"""Lowering: each tape node becomes its device launches (``gradtool/csrc/kernels.cu``).

:func:`gradtool.device.program.capture_program` walks the tape and asks this module for
every node's forward launches (:func:`_forward_node`, by the op's kind in
:mod:`gradtool.ops`) and, from the loss down, its backward contributions
(:func:`_backward_node`), each with its shape, stride and offset metadata computed here on
the host; the shape helpers (row-major and broadcast strides, :func:`collapse`) are the
ones every launch's index space goes through.  The names stay importable from
:mod:`gradtool.device.program`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ops import OPS, attr
from .launch import CaptureError, Launch, launch

if TYPE_CHECKING:
    from .program import _Builder

MAX_DIMS = 8                      # GT_MAXD in kernels.cu


# ── shape helpers ─────────────────────────────────────────────────────────

def row_major_strides(shape) -> list:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= int(d)
    return strides[::-1]


def aligned_strides(shape, out_shape) -> list:
    """An input's strides over the out dims (numpy alignment; 0 where it broadcasts)."""
    pad = len(out_shape) - len(shape)
    padded = (1,) * pad + tuple(shape)
    own = row_major_strides(padded)
    return [0 if padded[d] == 1 and out_shape[d] != 1 else own[d] for d in range(len(out_shape))]


def collapse(dims, *strides):
    """Drop size-1 dims and merge neighbours that every operand walks contiguously.

    The row-major walk over the result visits the same (offset, offset, ...)
    tuples in the same order as the walk over the original dims.
    """
    keep = [d for d in range(len(dims)) if dims[d] != 1]
    out_dims = [int(dims[d]) for d in keep]
    out_st = [[int(s[d]) for d in keep] for s in strides]
    k = len(out_dims) - 2
    while k >= 0:
        if all(s[k] == s[k + 1] * out_dims[k + 1] for s in out_st):
            out_dims[k] *= out_dims[k + 1]
            for s in out_st:
                s[k] = s[k + 1]
                del s[k + 1]
            del out_dims[k + 1]
        k -= 1
    if not out_dims:
        return [1], [[0] for _ in strides]
    return out_dims, out_st


# ── forward launches, op by op ────────────────────────────────────────────
# ── forward launches, by the op's kind (gradtool.ops) ─────────────────────

def _forward_node(b: _Builder, i: int, val) -> list:
    spec = OPS[b.tape.nodes[i].op]
    lower = _FORWARD.get(spec.kind)
    if lower is None:
        raise CaptureError(f"node {i}: op {spec.name!r} has no device kernel")
    return lower(b, i, spec, val)


def _fwd_unary(b, i, spec, val):
    node = b.tape.nodes[i]
    return [launch(f"k_{spec.name}", b.n(i), i, spec.name, out=val[i], a=val[node.a],
                   s=node.s)]


def _fwd_binary(b, i, spec, val):
    node = b.tape.nodes[i]
    shape = b.shapes[i]
    dims, (st_a, st_b) = collapse(shape, aligned_strides(b.shapes[node.a], shape),
                                  aligned_strides(b.shapes[node.b], shape))
    b.check_rank(dims, i, spec.name)
    return [launch(f"k_{spec.name}", b.n(i), i, spec.name, out=val[i], a=val[node.a],
                   b=val[node.b], dims=dims, sa=st_a, sb=st_b)]


def _reduce_rows(b, i):
    """(outer, len, inner) of a reduction: one row of every element without an axis."""
    node = b.tape.nodes[i]
    axis = attr(node.aux, "axis")
    return (1, b.n(node.a), 1) if axis is None else _axis_split(b.shapes[node.a], axis)


def _fwd_reduce(b, i, spec, val):
    ia = b.tape.nodes[i].a
    outer, length, inner = _reduce_rows(b, i)
    return [launch("k_sum", outer * inner, i, spec.name, out=val[i], a=val[ia], len=length,
                   inner=inner, is_mean=int(spec.name == "mean"), acc=0)]


def _fwd_max(b, i, spec, val):
    outer, length, inner = _reduce_rows(b, i)
    return [launch("k_max", outer * inner, i, spec.name, out=val[i], a=val[b.tape.nodes[i].a],
                   len=length, inner=inner)]


def _fwd_matmul(b, i, spec, val):
    node = b.tape.nodes[i]
    (m, k), nn = b.shapes[node.a], b.shapes[i][1]
    return [_matmul(b, i, val[i], val[node.a], val[node.b], 1, m, k, nn,
                    (0, k, 1), (0, nn, 1), acc=False, what="matmul")]


def _bmm_dims(b, i):
    """(batch, m, k, n, a's batch stride, b's batch stride): 0 on a stretched side."""
    node = b.tape.nodes[i]
    bt, m, nn = b.shapes[i]
    k = b.shapes[node.a][2]
    return (bt, m, k, nn, m * k if b.shapes[node.a][0] == bt else 0,
            k * nn if b.shapes[node.b][0] == bt else 0)


def _fwd_bmm(b, i, spec, val):
    node = b.tape.nodes[i]
    bt, m, k, nn, sab, sbb = _bmm_dims(b, i)
    return [_matmul(b, i, val[i], val[node.a], val[node.b], bt, m, k, nn,
                    (sab, k, 1), (sbb, nn, 1), acc=False, what="bmm")]


def _fwd_transpose(b, i, spec, val):
    sa = b.shapes[b.tape.nodes[i].a]
    batch = int(np.prod(sa[:-2], dtype=np.int64))
    m, nn = sa[-2], sa[-1]
    # out[bt, j, i] = a[bt, i, j], walked in out order
    return [_copy(b, i, val[i], val[b.tape.nodes[i].a], [batch, nn, m], [nn * m, m, 1],
                  [m * nn, 1, nn], acc=False, what="transpose")]


def _fwd_reshape(b, i, spec, val):
    n = b.n(i)
    return [_copy(b, i, val[i], val[b.tape.nodes[i].a], [n], [1], [1], acc=False,
                  what="reshape")]


def _fwd_softmax(b, i, spec, val):
    node = b.tape.nodes[i]
    outer, length, inner = _axis_split(b.shapes[node.a], node.aux["axis"])
    return [launch(spec.kernels[0], outer * inner, i, spec.name, out=val[i], a=val[node.a],
                   len=length, inner=inner)]


def _fwd_slice(b, i, spec, val):
    node = b.tape.nodes[i]
    sa, shape = b.shapes[node.a], b.shapes[i]
    st = row_major_strides(sa)
    start = sum(lo * s for lo, s in zip(node.aux["starts"], st))
    steps = attr(node.aux, "steps") or [1] * len(sa)
    return [_copy(b, i, val[i], val[node.a] + start, shape, row_major_strides(shape),
                  [s * k for s, k in zip(st, steps)], acc=False, what="slice")]


def _fwd_concat(b, i, spec, val):
    node = b.tape.nodes[i]
    axis, shape = node.aux["axis"], b.shapes[i]
    sa, sbb = b.shapes[node.a], b.shapes[node.b]
    ost = row_major_strides(shape)
    return [_copy(b, i, val[i], val[node.a], sa, ost, row_major_strides(sa), acc=False,
                  what="concat a"),
            _copy(b, i, val[i] + sa[axis] * ost[axis], val[node.b], sbb, ost,
                  row_major_strides(sbb), acc=False, what="concat b")]


def _fwd_take(b, i, spec, val):
    node = b.tape.nodes[i]
    rows = b.shapes[node.a][0]
    return [launch("k_take", b.n(i), i, "take", out=val[i], table=val[node.a], ids=val[node.b],
                   rows=rows, width=b.n(node.a) // rows, err=b.err_off)]


def _fwd_take_along(b, i, spec, val):
    node = b.tape.nodes[i]
    axis = node.aux["axis"]
    _, length, inner = _axis_split(b.shapes[node.a], axis)
    return [launch("k_take_along", b.n(i), i, "take_along", out=val[i], a=val[node.a],
                   ids=val[node.b], len=length, k=b.shapes[node.b][axis], inner=inner,
                   err=b.err_off)]


def _fwd_scatter(b, i, spec, val):
    """out = +0.0, then take's backward kernels add src's rows in (numerics.scatter_rows):
    0.0 + (0.0 + src[p0] + ...) is that sum's bits, which is never -0.0."""
    node = b.tape.nodes[i]
    rows = node.aux["rows"]
    width = b.n(i) // rows
    fill = launch("k_fill", b.n(i), i, "scatter (zeros)", dst=val[i], value=0.0)
    if i not in b.take_index:           # ids computed on the device: no uploaded index
        return [fill, launch("k_take_bwd_scan", b.n(i), i, "scatter", ga=val[i],
                             g=val[node.a], ids=val[node.b], n=b.n(node.b), rows=rows,
                             width=width, err=b.err_off)]
    index = b.take_index[i]
    return [fill, launch("k_take_bwd", b.n(i), i, "scatter", ga=val[i], g=val[node.a],
                         order=index.order_off, start=index.start_off, width=width)]


def _fwd_uniform(b, i, spec, val):
    """numerics.uniform: integer arithmetic on the counters the rng slot holds."""
    node = b.tape.nodes[i]
    return [launch("k_uniform", b.n(i), i, "uniform", out=val[i], ctr=val[node.a],
                   salt=int(node.aux["salt"]))]


def _fwd_permute(b, i, spec, val):
    node = b.tape.nodes[i]
    shape, st = b.shapes[i], row_major_strides(b.shapes[node.a])
    # out[j] = a[j at the input's axes]: walked in out order, out axis k reads axis dims[k]
    return [_copy(b, i, val[i], val[node.a], shape, row_major_strides(shape),
                  [st[d] for d in node.aux["dims"]], acc=False, what="permute")]


# conv2d and the pools (numerics.conv2d, max_pool2d, avg_pool2d): each of conv2d's
# products is one launch (k_matmul_conv2d, _dw, _dx: the matmul's FMA chains in
# numerics' order), the pools one launch each way

def _window_geometry(b, i, kernel, dilation=(1, 1)):
    node = b.tape.nodes[i]
    n, c, h, w = b.shapes[node.a]
    oh, ow = b.shapes[i][2:]
    (sh, sw), (ph, pw) = node.aux["stride"], node.aux["padding"]
    return dict(nb=n, ch=c, ih=h, iw=w, kh=kernel[0], kw=kernel[1], oh=oh, ow=ow, sh=sh,
                sw=sw, ph=ph, pw=pw, dh=dilation[0], dw=dilation[1])


def _conv_geometry(b, i):
    """The conv2d launches' geometry fields (gradtool/ops/conv.py's _CONV)."""
    node = b.tape.nodes[i]
    oc, cg, kh, kw = b.shapes[node.b]
    return dict(_window_geometry(b, i, (kh, kw), node.aux["dilation"]), oc=oc,
                groups=node.aux["groups"])


def _fwd_conv2d(b, i, spec, val):
    node = b.tape.nodes[i]
    return [launch("k_matmul_conv2d", b.n(i), i, "conv2d", out=val[i], x=val[node.a],
                   w=val[node.b], **_conv_geometry(b, i))]


def _fwd_max_pool2d(b, i, spec, val):
    node = b.tape.nodes[i]
    geo = _window_geometry(b, i, node.aux["kernel"], node.aux["dilation"])
    return [launch("k_max_pool", b.n(i), i, "max_pool2d", out=val[i], x=val[node.a], **geo)]


def _fwd_avg_pool2d(b, i, spec, val):
    node = b.tape.nodes[i]
    geo = _window_geometry(b, i, node.aux["kernel"])
    return [launch("k_avg_pool", b.n(i), i, "avg_pool2d", out=val[i], x=val[node.a],
                   incl=int(attr(node.aux, "count_include_pad", True)), **geo)]


def _fwd_cast(b, i, spec, val):
    """A cast to f32 of an f64 island (f64_islands) in an f32 program: whole numbers
    (exact in the arena, checked) or a draw, whose slot already holds its float32
    rounding: the cast copies the slot.  Any other cast has no kernel (one arena type)."""
    node = b.tape.nodes[i]
    if not (b.dtype == "f32" and b.islands[node.a] and b.tape.values[i].dtype == np.float32):
        raise CaptureError(f"node {i} (cast): a device program has one float type; only a "
                           f"draw cast to f32 in an f32 program runs (the cpu backend runs "
                           f"this tape)")
    n = b.n(i)
    return [_copy(b, i, val[i], val[node.a], [n], [1], [1], acc=False, what="cast to f32")]


_FORWARD = {"unary": _fwd_unary, "binary": _fwd_binary, "reduce": _fwd_reduce,
            "max": _fwd_max, "matmul": _fwd_matmul, "bmm": _fwd_bmm,
            "transpose": _fwd_transpose, "reshape": _fwd_reshape, "softmax": _fwd_softmax,
            "slice": _fwd_slice, "concat": _fwd_concat, "take": _fwd_take,
            "take_along": _fwd_take_along, "permute": _fwd_permute, "conv2d": _fwd_conv2d,
            "max_pool2d": _fwd_max_pool2d, "avg_pool2d": _fwd_avg_pool2d,
            "scatter": _fwd_scatter, "uniform": _fwd_uniform, "cast": _fwd_cast}


def _contributions(b: _Builder, reached) -> list:
    """(node, need_a, need_b) for every node whose backward contributes, from the loss
    down (the order of the backward launches), and each input's first contribution
    (b.first).  b.fresh: the gradients whose first contribution is a product written
    whole -- FMA chains from +0.0, which are never -0.0, so storing one (c = s) gives
    the bits of adding it into zeros (0.0 + s), as the CPU engine's first
    contribution does (tape.py, OpSpec.fresh_grads) -- which skip the zero fill."""
    tape, needs = b.tape, []
    for i in range(b.loss, -1, -1):
        node = tape.nodes[i]
        if not reached[i] or node.a < 0 or not tape.requires[i]:
            continue
        spec = OPS[node.op]
        need_a = tape.requires[node.a] and spec.grad_to("a")
        need_b = node.b >= 0 and tape.requires[node.b] and spec.grad_to("b")
        if need_a or need_b:
            needs.append((i, need_a, need_b))
            # within a node, a's launches come before b's (x @ x: a stores, b adds)
            for role, j, need in (("a", node.a, need_a), ("b", node.b, need_b)):
                if need and j not in b.first:
                    b.first[j] = (i, role)
                    if spec.fresh_grads and _product_writes_whole(b, i, role):
                        b.fresh.add(j)
    return needs


def _product_writes_whole(b: _Builder, i: int, role: str) -> bool:
    """Whether product node ``i``'s contribution to its ``role`` input is one launch
    writing every element (_bwd_matmul, _batch_product's direct case)."""
    if b.tape.nodes[i].op != "bmm":
        return True
    bt, _m, _k, _nn, sab, sbb = _bmm_dims(b, i)
    return _batch_direct((sab if role == "a" else sbb) == 0, bt)


def _batch_direct(stretched: bool, bt: int) -> bool:
    """Whether a bmm side's contribution is one product launch into its gradient (else
    products in scratch and their batch sum: _batch_product)."""
    return not stretched or bt == 1


def _axis_split(shape, axis):
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, int(shape[axis]), inner


def _copy(b, node, dst, src, dims, sd, ss, *, acc, what) -> Launch:
    n = int(np.prod(dims, dtype=np.int64))
    cdims, (csd, css) = collapse(dims, sd, ss)
    b.check_rank(cdims, node, what)
    return launch("k_copy_nd", n, node, what, dst=dst, src=src, acc=int(acc), dims=cdims,
                  sd=csd, ss=css)


def _matmul(b, node, c, a, bb, batch, m, k, n, sa, sb, *, acc, what) -> Launch:
    """C[bt] (=|+=) A[bt] @ B[bt] with A strides (batch, row, k), B strides (batch, k, col)."""
    return launch("k_matmul", batch * m * n, node, what, c=c, a=a, b=bb, batch=batch, m=m,
                  k=k, n=n, sab=sa[0], sai=sa[1], sak=sa[2], sbb=sb[0], sbk=sb[1], sbj=sb[2],
                  acc=int(acc))


# ── backward launches, by the op's kind ───────────────────────────────────

def _backward_node(b: _Builder, i: int, need_a: bool, need_b: bool, val, grad) -> list:
    spec = OPS[b.tape.nodes[i].op]
    lower = _BACKWARD.get(spec.kind)
    if lower is None:
        raise CaptureError(f"node {i}: op {spec.name!r} has no device backward kernel")
    return lower(b, i, spec, need_a, need_b, val, grad)


def _bwd_unary(b, i, spec, need_a, need_b, val, grad):
    node = b.tape.nodes[i]
    return [launch(f"k_{spec.name}_bwd", b.n(node.a), i, f"{spec.name} backward",
                   ga=grad[node.a], g=grad[i], a=val[node.a], t=val[i], s=node.s)]


def _bwd_binary(b, i, spec, need_a, need_b, val, grad):
    node = b.tape.nodes[i]
    out = []
    for side, need, target in (("a", need_a, node.a), ("b", need_b, node.b)):
        if need:
            out.append(_reduce(b, i, f"k_{spec.name}_bwd_{side}", target, val, grad,
                               f"{spec.name} backward {side}"))
    return out


def _bwd_reduce(b, i, spec, need_a, need_b, val, grad):
    ia = b.tape.nodes[i].a
    _, length, inner = _reduce_rows(b, i)
    return [launch("k_sum_bwd", b.n(ia), i, f"{spec.name} backward", ga=grad[ia], g=grad[i],
                   len=length, inner=inner, is_mean=int(spec.name == "mean"))]


def _bwd_max(b, i, spec, need_a, need_b, val, grad):
    ia = b.tape.nodes[i].a
    outer, length, inner = _reduce_rows(b, i)
    return [launch("k_max_bwd", outer * inner, i, "max backward", ga=grad[ia], g=grad[i],
                   a=val[ia], len=length, inner=inner)]


def _bwd_matmul(b, i, spec, need_a, need_b, val, grad):
    node = b.tape.nodes[i]
    ia, ib, g = node.a, node.b, grad[i]
    (m, k), nn = b.shapes[ia], b.shapes[i][1]
    out = []
    if need_a:      # dA += G @ B^T: [m, nn] @ [nn, k], serial over nn
        out.append(_matmul(b, i, grad[ia], g, val[ib], 1, m, nn, k, (0, nn, 1), (0, 1, nn),
                           acc=not b.stores(i, "a", ia), what="matmul backward a"))
    if need_b:      # dB += A^T @ G: [k, m] @ [m, nn], serial over m
        out.append(_matmul(b, i, grad[ib], val[ia], g, 1, k, m, nn, (0, 1, k), (0, nn, 1),
                           acc=not b.stores(i, "b", ib), what="matmul backward b"))
    return out


def _bwd_bmm(b, i, spec, need_a, need_b, val, grad):
    node = b.tape.nodes[i]
    ia, ib, g = node.a, node.b, grad[i]
    bt, m, k, nn, sab, sbb = _bmm_dims(b, i)
    out = []
    if need_a:      # dA[bt] += G[bt] @ B[bt]^T: [m, nn] @ [nn, k], serial over nn
        out += _batch_product(b, i, (ia, "a"), grad[ia], sab == 0, bt, m, nn, k, g,
                              (m * nn, nn, 1), val[ib], (sbb, 1, nn), "bmm backward a")
    if need_b:      # dB[bt] += A[bt]^T @ G[bt]: [k, m] @ [m, nn], serial over m
        out += _batch_product(b, i, (ib, "b"), grad[ib], sbb == 0, bt, k, m, nn, val[ia],
                              (sab, 1, k), g, (m * nn, nn, 1), "bmm backward b")
    return out


def _batch_product(b, i, target, dst, stretched, bt, m, k, n, x, sx, y, sy, what) -> list:
    """dst += X[bt] @ Y[bt] for every batch (dst = ..., when it may store: target is
    (input node, role)); for a side the forward stretched (bt > 1, dst one batch), the
    products land in scratch first and their serial batch sum is added."""
    if _batch_direct(stretched, bt):
        acc = not b.stores(i, target[1], target[0])
        return [_matmul(b, i, dst, x, y, bt, m, k, n, sx, sy, acc=acc, what=what)]
    products = b.need_scratch(bt * m * n)
    return [_matmul(b, i, products, x, y, bt, m, k, n, sx, sy, acc=False, what=what),
            launch("k_sum", m * n, i, f"{what} (batch sum)", out=dst, a=products, len=bt,
                   inner=m * n, is_mean=0, acc=1)]


def _bwd_transpose(b, i, spec, need_a, need_b, val, grad):
    ia = b.tape.nodes[i].a
    sa = b.shapes[ia]
    batch = int(np.prod(sa[:-2], dtype=np.int64))
    m, nn = sa[-2], sa[-1]
    # ga[bt, i, j] += g[bt, j, i], walked in ga order
    return [_copy(b, i, grad[ia], grad[i], [batch, m, nn], [m * nn, nn, 1], [nn * m, 1, m],
                  acc=True, what="transpose backward")]


def _bwd_reshape(b, i, spec, need_a, need_b, val, grad):
    ia = b.tape.nodes[i].a
    n = b.n(ia)         # ga = ga + g, element for element
    return [_copy(b, i, grad[ia], grad[i], [n], [1], [1], acc=True, what="reshape backward")]


def _bwd_softmax(b, i, spec, need_a, need_b, val, grad):
    node = b.tape.nodes[i]
    outer, length, inner = _axis_split(b.shapes[node.a], node.aux["axis"])
    return [launch(spec.kernels[1], outer * inner, i, f"{spec.name} backward",
                   ga=grad[node.a], g=grad[i], t=val[i], len=length, inner=inner)]


def _bwd_slice(b, i, spec, need_a, need_b, val, grad):
    node = b.tape.nodes[i]
    sa = b.shapes[node.a]
    if len(sa) > MAX_DIMS:
        raise CaptureError(f"node {i} (slice backward): rank {len(sa)} is more than the device "
                           f"kernels handle ({MAX_DIMS})")
    return [launch("k_slice_bwd", b.n(node.a), i, "slice backward", ga=grad[node.a],
                   g=grad[i], dims=sa, starts=node.aux["starts"], stops=node.aux["stops"],
                   steps=attr(node.aux, "steps") or [1] * len(sa),
                   gst=row_major_strides(b.shapes[i]))]


def _bwd_concat(b, i, spec, need_a, need_b, val, grad):
    node = b.tape.nodes[i]
    axis, g = node.aux["axis"], grad[i]
    sa = b.shapes[node.a]
    gst = row_major_strides(b.shapes[i])
    out = []
    if need_a:
        out.append(_copy(b, i, grad[node.a], g, sa, row_major_strides(sa), gst, acc=True,
                         what="concat backward a"))
    if need_b:
        sbb = b.shapes[node.b]
        out.append(_copy(b, i, grad[node.b], g + sa[axis] * gst[axis], sbb,
                         row_major_strides(sbb), gst, acc=True, what="concat backward b"))
    return out


def _bwd_take(b, i, spec, need_a, need_b, val, grad):
    node = b.tape.nodes[i]
    rows = b.shapes[node.a][0]
    if i not in b.take_index:           # ids computed on the device: no uploaded index
        return [launch("k_take_bwd_scan", b.n(node.a), i, "take backward", ga=grad[node.a],
                       g=grad[i], ids=val[node.b], n=b.n(node.b), rows=rows,
                       width=b.n(node.a) // rows, err=b.err_off)]
    index = b.take_index[i]
    return [launch("k_take_bwd", b.n(node.a), i, "take backward", ga=grad[node.a], g=grad[i],
                   order=index.order_off, start=index.start_off, width=b.n(node.a) // rows)]


def _bwd_scatter(b, i, spec, need_a, need_b, val, grad):
    """src's gradient: take(g, ids), gathered into scratch, then added once (ga = ga +
    gathered, as the CPU engine's grad = grad + c: a gathered -0.0 adds as +0.0)."""
    node = b.tape.nodes[i]
    rows = node.aux["rows"]
    n = b.n(node.a)
    gathered = b.need_scratch(n)
    return [launch("k_take", n, i, "scatter backward (gather)", out=gathered, table=grad[i],
                   ids=val[node.b], rows=rows, width=b.n(i) // rows, err=b.err_off),
            _copy(b, i, grad[node.a], gathered, [n], [1], [1], acc=True,
                  what="scatter backward")]


def _bwd_take_along(b, i, spec, need_a, need_b, val, grad):
    node = b.tape.nodes[i]
    axis = node.aux["axis"]
    _, length, inner = _axis_split(b.shapes[node.a], axis)
    return [launch("k_take_along_bwd", b.n(node.a), i, "take_along backward",
                   ga=grad[node.a], g=grad[i], ids=val[node.b], len=length,
                   k=b.shapes[node.b][axis], inner=inner)]


def _bwd_permute(b, i, spec, need_a, need_b, val, grad):
    node = b.tape.nodes[i]
    sa, gst = b.shapes[node.a], row_major_strides(b.shapes[i])
    where = {d: k for k, d in enumerate(node.aux["dims"])}     # input axis -> out axis
    # ga[p] += g[p at the out's axes], walked in ga order
    return [_copy(b, i, grad[node.a], grad[i], sa, row_major_strides(sa),
                  [gst[where[d]] for d in range(len(sa))], acc=True,
                  what="permute backward")]


def _bwd_conv2d(b, i, spec, need_a, need_b, val, grad):
    node = b.tape.nodes[i]
    geo = _conv_geometry(b, i)
    out = []
    if need_b:      # gw += the chain over (n, oh, ow) ascending, per weight
        out.append(launch("k_matmul_conv2d_dw", b.n(node.b), i, "conv2d backward w",
                          gw=grad[node.b], g=grad[i], x=val[node.a], **geo))
    if need_a:      # gx += (i, j) ascending sums of chains over the group's channels
        out.append(launch("k_matmul_conv2d_dx", b.n(node.a), i, "conv2d backward x",
                          gx=grad[node.a], g=grad[i], w=val[node.b], **geo))
    return out


def _bwd_max_pool2d(b, i, spec, need_a, need_b, val, grad):
    node = b.tape.nodes[i]
    geo = _window_geometry(b, i, node.aux["kernel"], node.aux["dilation"])
    return [launch("k_max_pool_bwd", b.n(node.a), i, "max_pool2d backward", gx=grad[node.a],
                   g=grad[i], x=val[node.a], **geo)]


def _bwd_avg_pool2d(b, i, spec, need_a, need_b, val, grad):
    node = b.tape.nodes[i]
    geo = _window_geometry(b, i, node.aux["kernel"])
    return [launch("k_avg_pool_bwd", b.n(node.a), i, "avg_pool2d backward", gx=grad[node.a],
                   g=grad[i], incl=int(attr(node.aux, "count_include_pad", True)), **geo)]


_BACKWARD = {"unary": _bwd_unary, "binary": _bwd_binary, "reduce": _bwd_reduce,
             "max": _bwd_max, "matmul": _bwd_matmul, "bmm": _bwd_bmm,
             "transpose": _bwd_transpose, "reshape": _bwd_reshape, "softmax": _bwd_softmax,
             "slice": _bwd_slice, "concat": _bwd_concat, "take": _bwd_take,
             "take_along": _bwd_take_along, "permute": _bwd_permute, "conv2d": _bwd_conv2d,
             "max_pool2d": _bwd_max_pool2d, "avg_pool2d": _bwd_avg_pool2d,
             "scatter": _bwd_scatter}


def _reduce(b, node, kernel, target, val, grad, what) -> Launch:
    """One input's contribution, reduced to its shape (numerics.reduce_to_shape), added once.

    The kernel reads both inputs (xv, yv), the node's gradient (gv) and value (tv)."""
    i = node
    n_a, n_b = b.tape.nodes[i].a, b.tape.nodes[i].b
    out_shape, target_shape = b.shapes[i], b.shapes[target]
    nd = len(out_shape)
    padded = (1,) * (nd - len(target_shape)) + tuple(target_shape)
    g_st = row_major_strides(out_shape)
    a_st = aligned_strides(b.shapes[n_a], out_shape)
    b_st = aligned_strides(b.shapes[n_b], out_shape)
    kept = [d for d in range(nd) if out_shape[d] > 1 and padded[d] == out_shape[d]]
    bcast = [d for d in range(nd) if out_shape[d] > 1 and padded[d] == 1]
    kd, (kg, ka, kb) = collapse([out_shape[d] for d in kept], [g_st[d] for d in kept],
                                [a_st[d] for d in kept], [b_st[d] for d in kept])
    if bcast:
        bd, (bg, ba, bb) = collapse([out_shape[d] for d in bcast], [g_st[d] for d in bcast],
                                    [a_st[d] for d in bcast], [b_st[d] for d in bcast])
    else:
        bd, bg, ba, bb = [], [], [], []
    b.check_rank(kd, node, what)
    b.check_rank(bd, node, what)
    n = int(np.prod(target_shape, dtype=np.int64))
    scratch = b.need_scratch(n) if bd else b.scratch_off
    return launch(kernel, n, node, what, ga=grad[target], g=grad[i], a=val[n_a], b=val[n_b],
                  t=val[i], kd=kd, kg=kg, ka=ka, kb=kb, bd=bd, bg=bg, ba=ba, bb=bb,
                  scratch=scratch)
