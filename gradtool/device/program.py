"""Capture: one recorded tape episode becomes a static device program.

:func:`capture_program` mirrors a tape onto ONE arena of device memory (a
value buffer per node, a gradient buffer per node the backward walk touches,
the optimizer's moments and control scalars, a host scratch area) and turns
every op into kernel launches of ``gradtool/csrc/kernels.cu``, with all
shape, stride and offset metadata computed here on the host.  A launch is a
kernel name and an int64 metadata block (see the kernel file for each
layout); after capture nothing changes, so a backend can replay the launch
list per node, as one host call, or as one CUDA graph.

The launch list mirrors the CPU tape exactly (:mod:`gradtool.tape`):

* forward: every op node in tape order (:meth:`Tape.forward`);
* backward: every gradient buffer set to +0.0, the loss seeded with 1.0,
  then the nodes from the loss down to 0; a node contributes only when the
  walk reached it and it requires grad, and each input that requires grad
  gets its contribution added once (``grad = grad + c``), input a before
  input b (:meth:`Tape.backward`);
* optimizer: see :mod:`gradtool.device.optimizer`.

Restrictions raise :class:`CaptureError` (exit 2 from the CLI) before
anything is allocated.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..errors import GradtoolError
from ..ops import infer_shape

MAX_DIMS = 8                      # GT_MAXD in kernels.cu
DTYPES = {"f64": np.float64, "f32": np.float32}
PHASES = ("forward", "backward", "optimizer")

UNARY_FORWARD = {op: f"k_{op}" for op in
                 ("neg", "adds", "muls", "relu", "sigmoid", "tanh", "exp", "log", "sqrt")}
UNARY_BACKWARD = {"neg": "k_bwd_neg", "adds": "k_bwd_id", "muls": "k_bwd_muls",
                  "relu": "k_bwd_relu", "sigmoid": "k_bwd_sigmoid", "tanh": "k_bwd_tanh",
                  "exp": "k_bwd_exp", "log": "k_bwd_log", "sqrt": "k_bwd_sqrt",
                  "reshape": "k_bwd_id"}
BINARY_FORWARD = {"add": "k_add", "sub": "k_sub", "mul": "k_mul", "div": "k_div"}
# (kernel, other operand) for each input's contribution: "b"/"a" = that
# input's value, None = no other operand read.
BINARY_BACKWARD = {
    "add": (("k_red_g", None), ("k_red_g", None)),          # g, g
    "sub": (("k_red_g", None), ("k_red_neg", None)),        # g, -g
    "mul": (("k_red_mul", "b"), ("k_red_mul", "a")),        # g*b, g*a
    "div": (("k_red_div", "b"), ("k_red_divb", "b")),       # g/b, -((g*t)/b)
}
SUPPORTED_OPS = (set(UNARY_FORWARD) | set(BINARY_FORWARD) |
                 {"param", "const", "sum", "mean", "matmul", "bmm", "transpose", "reshape",
                  "softmax", "slice", "concat"})


class CaptureError(GradtoolError):
    """The tape cannot be replayed on the device (the message names the node)."""


def f64_bits(x: float) -> int:
    """The IEEE-754 bit pattern of a float64, as the signed int64 a metadata slot holds."""
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


@dataclass(frozen=True)
class Launch:
    kernel: str                   # a kernel name of kernels.cu
    meta: tuple                   # its int64 metadata block; meta[0] = thread indices
    node: int = -1                # the tape node it belongs to (-1: bookkeeping)
    what: str = ""                # for messages and listings

    @property
    def work(self) -> int:
        return int(self.meta[0])


@dataclass
class Program:
    """A captured episode: arena layout, initial contents, and the launch list per phase."""

    dtype: str
    size: int                               # arena elements
    shapes: list                            # per node
    val_off: list                           # per node: offset of its value
    grad_off: list                          # per node: offset of its gradient, -1 = untouched
    loss: int
    ctl_off: int
    launches: dict                          # phase -> list[Launch]
    init: list = field(default_factory=list)  # (offset, float64 array) to upload once
    optimizer: Optional[object] = None      # gradtool.device.optimizer.OptimizerPlan
    param_ids: list = field(default_factory=list)
    input_ids: list = field(default_factory=list)

    @property
    def itemsize(self) -> int:
        return np.dtype(DTYPES[self.dtype]).itemsize

    @property
    def nbytes(self) -> int:
        """Device bytes: the arena plus the metadata array."""
        meta = sum(len(launch.meta) for ph in PHASES for launch in self.launches[ph])
        return self.size * self.itemsize + 8 * meta

    def size_of(self, node: int) -> int:
        return int(np.prod(self.shapes[node], dtype=np.int64))

    def count(self, phases=PHASES) -> int:
        return sum(len(self.launches[ph]) for ph in phases)

    def flatten(self, kernel_index: dict):
        """The metadata array, the launch table (kernel index, metadata offset) pairs in
        phase order, and each phase's [start, end) range in that table."""
        meta, table, ranges = [], [], {}
        for ph in PHASES:
            start = len(table) // 2
            for launch in self.launches[ph]:
                if launch.kernel not in kernel_index:
                    raise CaptureError(f"kernel {launch.kernel} is missing from the kernel file")
                table += [kernel_index[launch.kernel], len(meta)]
                meta += list(launch.meta)
            ranges[ph] = (start, len(table) // 2)
        return (np.array(meta or [0], dtype=np.int64), np.array(table or [0, 0], dtype=np.int64),
                ranges)


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


# ── the builder ───────────────────────────────────────────────────────────

class _Builder:
    def __init__(self, tape, loss: int, dtype: str):
        self.tape, self.loss, self.dtype = tape, loss, dtype
        self.shapes = [tuple(int(d) for d in v.shape) for v in tape.values]
        self.size = 0
        self.scratch_need = 0
        self.scratch_off = -1

    def alloc(self, n: int) -> int:
        off = self.size
        self.size += int(n)
        return off

    def n(self, node: int) -> int:
        return int(np.prod(self.shapes[node], dtype=np.int64))

    def need_scratch(self, n: int) -> int:
        self.scratch_need = max(self.scratch_need, int(n))
        return self.scratch_off

    def check_rank(self, dims, node: int, what: str):
        if len(dims) > MAX_DIMS:
            raise CaptureError(f"node {node} ({what}): index space of rank {len(dims)} after "
                               f"collapsing; the device kernels handle at most {MAX_DIMS}")


def reach(tape, loss: int) -> list:
    """Which nodes the CPU backward walk touches (their gradient is not None)."""
    nodes, requires = tape.nodes, tape.requires
    reached = [False] * len(nodes)
    reached[loss] = True
    for i in range(loss, -1, -1):
        node = nodes[i]
        if not reached[i] or node.a < 0 or not requires[i]:
            continue
        if requires[node.a]:
            reached[node.a] = True
        if node.b >= 0 and requires[node.b]:
            reached[node.b] = True
    return reached


def _check(tape, loss: int, dtype: str) -> None:
    if dtype not in DTYPES:
        raise CaptureError(f"dtype {dtype!r} is not supported (choose f64 or f32)")
    if not tape.ok:
        raise CaptureError(f"the tape is poisoned: {tape.error}")
    if not 0 <= loss < len(tape.nodes):
        raise CaptureError(f"loss node {loss} does not exist (the tape has {len(tape.nodes)} nodes)")
    for i, (node, value) in enumerate(zip(tape.nodes, tape.values)):
        if node.op not in SUPPORTED_OPS:
            raise CaptureError(f"node {i}: op {node.op!r} has no device kernel")
        if not isinstance(value, np.ndarray) or value.dtype != np.float64:
            kind = getattr(value, "dtype", type(value).__name__)
            raise CaptureError(f"node {i}: holds {kind} values; the device replay needs a "
                               f"float64 tape")
        if node.a >= 0:
            sb = tape.values[node.b].shape if node.b >= 0 else None
            want = infer_shape(node.op, tape.values[node.a].shape, sb, node.aux)
            if tuple(want) != tuple(value.shape):
                raise CaptureError(f"node {i}: value has shape {list(value.shape)} but {node.op} "
                                   f"of its inputs gives {list(want)}")
    if tape.values[loss].size != 1:
        raise CaptureError(f"loss node {loss} has shape {list(tape.values[loss].shape)}; "
                           f"backward needs a one-element loss")


def capture_program(tape, loss: int, dtype: str = "f64", optimizer=None) -> Program:
    """Mirror ``tape`` (with ``loss`` the node backward seeds) as a static :class:`Program`.

    ``optimizer`` (a :class:`gradtool.optim.Optimizer` with its params
    registered) adds the device optimizer's buffers and launches.
    """
    _check(tape, loss, dtype)
    from .optimizer import plan_optimizer      # optimizer.py builds on this module

    b = _Builder(tape, loss, dtype)
    val_off = [b.alloc(b.n(i)) for i in range(len(tape.nodes))]
    reached = reach(tape, loss)
    grad_start = b.size
    grad_off = [b.alloc(b.n(i)) if reached[i] else -1 for i in range(len(tape.nodes))]
    grad_end = b.size
    ctl_off = b.alloc(4)
    b.scratch_off = b.size
    forward = [launch for i in range(len(tape.nodes)) if tape.nodes[i].a >= 0
               for launch in _forward_node(b, i, val_off)]
    backward = [Launch("k_fill", (grad_end - grad_start, grad_start, f64_bits(0.0)),
                       -1, "zero gradients"),
                Launch("k_fill", (1, grad_off[loss], f64_bits(1.0)), loss, "seed loss")]
    for i in range(loss, -1, -1):
        node = tape.nodes[i]
        if grad_off[i] < 0 or node.a < 0 or not tape.requires[i]:
            continue
        need_a = tape.requires[node.a]
        need_b = node.b >= 0 and tape.requires[node.b]
        if need_a or need_b:
            backward += _backward_node(b, i, need_a, need_b, val_off, grad_off)
    b.alloc(b.scratch_need)

    prog = Program(dtype=dtype, size=0, shapes=b.shapes, val_off=val_off, grad_off=grad_off,
                   loss=loss, ctl_off=ctl_off,
                   launches={"forward": forward, "backward": backward, "optimizer": []},
                   param_ids=[i for i, n in enumerate(tape.nodes) if n.op == "param"],
                   input_ids=[i for i, n in enumerate(tape.nodes) if n.op == "const" and n.name])
    prog.init = [(val_off[i], tape.values[i]) for i in range(len(tape.nodes))]
    if optimizer is not None:
        prog.optimizer = plan_optimizer(b, prog, optimizer)
        prog.launches["optimizer"] = prog.optimizer.launches
    prog.init.append((ctl_off, np.array([prog.optimizer.lr if prog.optimizer else 0.0, 1.0, 0.0,
                                          1.0])))
    prog.size = b.size
    return prog


# ── forward launches, op by op ────────────────────────────────────────────

def _forward_node(b: _Builder, i: int, val) -> list:
    node = b.tape.nodes[i]
    op, ia, ib = node.op, node.a, node.b
    out, n = val[i], b.n(i)
    shape, sa = b.shapes[i], b.shapes[ia]
    if op in UNARY_FORWARD:
        return [Launch(UNARY_FORWARD[op], (n, out, val[ia], f64_bits(node.s)), i, op)]
    if op in BINARY_FORWARD:
        dims, (st_a, st_b) = collapse(shape, aligned_strides(sa, shape),
                                      aligned_strides(b.shapes[ib], shape))
        b.check_rank(dims, i, op)
        return [Launch(BINARY_FORWARD[op],
                       (n, out, val[ia], val[ib], len(dims), *dims, *st_a, *st_b), i, op)]
    if op in ("sum", "mean"):
        return [Launch("k_sum", (1, out, val[ia], b.n(ia), int(op == "mean")), i, op)]
    if op == "matmul":
        (m, k), nn = sa, shape[1]
        return [_matmul(b, i, out, val[ia], val[ib], 1, m, k, nn,
                        (0, k, 1), (0, nn, 1), acc=False, what="matmul")]
    if op == "bmm":
        bt, m, k = sa
        nn = shape[2]
        return [_matmul(b, i, out, val[ia], val[ib], bt, m, k, nn,
                        (m * k, k, 1), (k * nn, nn, 1), acc=False, what="bmm")]
    if op == "transpose":
        batch = int(np.prod(sa[:-2], dtype=np.int64))
        m, nn = sa[-2], sa[-1]
        # out[bt, j, i] = a[bt, i, j], walked in out order
        return [_copy(b, i, out, val[ia], [batch, nn, m], [nn * m, m, 1], [m * nn, 1, nn],
                      acc=False, what="transpose")]
    if op == "reshape":
        return [_copy(b, i, out, val[ia], [n], [1], [1], acc=False, what="reshape")]
    if op == "softmax":
        outer, length, inner = _axis_split(sa, node.aux["axis"])
        return [Launch("k_softmax", (outer * inner, out, val[ia], length, inner), i, "softmax")]
    if op == "slice":
        st = row_major_strides(sa)
        start = sum(lo * s for lo, s in zip(node.aux["starts"], st))
        return [_copy(b, i, out, val[ia] + start, shape, row_major_strides(shape), st,
                      acc=False, what="slice")]
    if op == "concat":
        axis = node.aux["axis"]
        ost = row_major_strides(shape)
        sbb = b.shapes[ib]
        return [_copy(b, i, out, val[ia], sa, ost, row_major_strides(sa), acc=False,
                      what="concat a"),
                _copy(b, i, out + sa[axis] * ost[axis], val[ib], sbb, ost,
                      row_major_strides(sbb), acc=False, what="concat b")]
    raise CaptureError(f"node {i}: op {op!r} has no device kernel")


def _axis_split(shape, axis):
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, int(shape[axis]), inner


def _copy(b, node, dst, src, dims, sd, ss, *, acc, what) -> Launch:
    n = int(np.prod(dims, dtype=np.int64))
    cdims, (csd, css) = collapse(dims, sd, ss)
    b.check_rank(cdims, node, what)
    return Launch("k_copy_nd", (n, dst, src, int(acc), len(cdims), *cdims, *csd, *css), node, what)


def _matmul(b, node, c, a, bb, batch, m, k, n, sa, sb, *, acc, what) -> Launch:
    """C[bt] (=|+=) A[bt] @ B[bt] with A strides (batch, row, k), B strides (batch, k, col)."""
    return Launch("k_matmul", (batch * m * n, c, a, bb, batch, m, k, n, *sa, *sb, int(acc)),
                  node, what)


# ── backward launches, op by op ───────────────────────────────────────────

def _backward_node(b: _Builder, i: int, need_a: bool, need_b: bool, val, grad) -> list:
    node = b.tape.nodes[i]
    op, ia, ib = node.op, node.a, node.b
    g = grad[i]
    shape, sa = b.shapes[i], b.shapes[ia]
    out = []
    if op in UNARY_BACKWARD:
        return [Launch(UNARY_BACKWARD[op], (b.n(ia), grad[ia], g, val[ia], val[i],
                                            f64_bits(node.s)), i, f"{op} backward")]
    if op in BINARY_BACKWARD:
        for side, need, target in (("a", need_a, ia), ("b", need_b, ib)):
            if not need:
                continue
            kernel, other = BINARY_BACKWARD[op][0 if side == "a" else 1]
            other_id = {"a": ia, "b": ib, None: target}[other]
            out.append(_reduce(b, i, kernel, grad[target], b.shapes[target], g, val[other_id],
                               b.shapes[other_id], val[i], shape, f"{op} backward {side}"))
        return out
    if op in ("sum", "mean"):
        return [Launch("k_sum_bwd", (b.n(ia), grad[ia], g, int(op == "mean")), i,
                       f"{op} backward")]
    if op == "matmul":
        (m, k), nn = sa, shape[1]
        if need_a:      # dA += G @ B^T: [m, nn] @ [nn, k], serial over nn
            out.append(_matmul(b, i, grad[ia], g, val[ib], 1, m, nn, k, (0, nn, 1), (0, 1, nn),
                               acc=True, what="matmul backward a"))
        if need_b:      # dB += A^T @ G: [k, m] @ [m, nn], serial over m
            out.append(_matmul(b, i, grad[ib], val[ia], g, 1, k, m, nn, (0, 1, k), (0, nn, 1),
                               acc=True, what="matmul backward b"))
        return out
    if op == "bmm":
        bt, m, k = sa
        nn = shape[2]
        if need_a:
            out.append(_matmul(b, i, grad[ia], g, val[ib], bt, m, nn, k, (m * nn, nn, 1),
                               (k * nn, 1, nn), acc=True, what="bmm backward a"))
        if need_b:
            out.append(_matmul(b, i, grad[ib], val[ia], g, bt, k, m, nn, (m * k, 1, k),
                               (m * nn, nn, 1), acc=True, what="bmm backward b"))
        return out
    if op == "transpose":
        batch = int(np.prod(sa[:-2], dtype=np.int64))
        m, nn = sa[-2], sa[-1]
        # ga[bt, i, j] += g[bt, j, i], walked in ga order
        return [_copy(b, i, grad[ia], g, [batch, m, nn], [m * nn, nn, 1], [nn * m, 1, m],
                      acc=True, what="transpose backward")]
    if op == "softmax":
        outer, length, inner = _axis_split(sa, node.aux["axis"])
        return [Launch("k_softmax_bwd", (outer * inner, grad[ia], g, val[i], length, inner), i,
                       "softmax backward")]
    if op == "slice":
        starts, stops = node.aux["starts"], node.aux["stops"]
        nd = len(sa)
        if nd > MAX_DIMS:
            raise CaptureError(f"node {i} (slice backward): rank {nd} is more than the device "
                               f"kernels handle ({MAX_DIMS})")
        return [Launch("k_slice_bwd", (b.n(ia), grad[ia], g, nd, *sa, *starts, *stops,
                                       *row_major_strides(shape)), i, "slice backward")]
    if op == "concat":
        axis = node.aux["axis"]
        gst = row_major_strides(shape)
        if need_a:
            out.append(_copy(b, i, grad[ia], g, sa, row_major_strides(sa), gst, acc=True,
                             what="concat backward a"))
        if need_b:
            sbb = b.shapes[ib]
            out.append(_copy(b, i, grad[ib], g + sa[axis] * gst[axis], sbb,
                             row_major_strides(sbb), gst, acc=True, what="concat backward b"))
        return out
    raise CaptureError(f"node {i}: op {op!r} has no device backward kernel")


def _reduce(b, node, kernel, ga, target_shape, g, o, other_shape, t, out_shape, what) -> Launch:
    """One input's contribution, reduced to its shape (numerics.reduce_to_shape), added once."""
    nd = len(out_shape)
    padded = (1,) * (nd - len(target_shape)) + tuple(target_shape)
    g_st = row_major_strides(out_shape)
    o_st = aligned_strides(other_shape, out_shape)
    kept = [d for d in range(nd) if out_shape[d] > 1 and padded[d] == out_shape[d]]
    bcast = [d for d in range(nd) if out_shape[d] > 1 and padded[d] == 1]
    kd, (kg, ko) = collapse([out_shape[d] for d in kept], [g_st[d] for d in kept],
                            [o_st[d] for d in kept])
    if bcast:
        bd, (bg, bo) = collapse([out_shape[d] for d in bcast], [g_st[d] for d in bcast],
                                [o_st[d] for d in bcast])
    else:
        bd, bg, bo = [], [], []
    b.check_rank(kd, node, what)
    b.check_rank(bd, node, what)
    n = int(np.prod(target_shape, dtype=np.int64))
    scratch = b.need_scratch(n) if bd else b.scratch_off
    return Launch(kernel, (n, ga, g, o, t, len(kd), *kd, *kg, *ko, len(bd), *bd, *bg, *bo,
                           scratch), node, what)
