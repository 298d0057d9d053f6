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

Integer ids (the i64 consts take, take_along and scatter read) sit in the arena as
exact float values, with the index of the positions reading each row
(:class:`TakeIndex`) for each learning take's backward and each scatter's forward;
setting new ids uploads both (:meth:`Program.id_writes`).

Restrictions raise :class:`CaptureError` (exit 2 from the CLI) before
anything is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .. import numerics as nx
from ..budget import DEFAULT_MEMORY, human_bytes
from ..ops import OPS, RNG_NAME, attr, bad_rng, inexact_int, infer_shape
from ..tape import reach
from .launch import CaptureError, Launch, launch
from ..optim import table as optim_table
from .optimizer import CTL_SIZE, plan_optimizer

MAX_DIMS = 8                      # GT_MAXD in kernels.cu
DTYPES = {"f64": np.float64, "f32": np.float32}
PHASES = ("forward", "backward", "optimizer")
EXACT_INTS = {"f64": 2 ** 53, "f32": 2 ** 24}    # every int below this is exact in the arena


@dataclass(frozen=True)
class TakeIndex:
    """Where the index of a take's backward, or of a scatter (numerics.take_index of its
    ids), lives in the arena.

    The ids are a leaf: they change only when the host sets them, and then the
    host recomputes this index and uploads it with them (:meth:`Program.id_writes`).
    """

    leaf: int                   # the ids leaf
    node: int                   # the take or scatter node
    rows: int                   # the table's (scatter: out's) rows: ids lie in [0, rows)
    order_off: int              # positions sorted by the row they read (N values)
    start_off: int              # row v's positions are order[start[v]:start[v+1]] (rows+1)


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
    id_bounds: dict = field(default_factory=dict)    # ids leaf -> [(reading node, bound)]
    computed_ids: list = field(default_factory=list)  # (take node, ids node, bound): checked
    err_off: int = -1                       # the bad-id flag take/take_along kernels raise
    int_values: set = field(default_factory=set)     # i64 leaves read as values (comparisons)
    take_indexes: list = field(default_factory=list)  # TakeIndex: _index_users

    def id_writes(self, leaf: int, ids: np.ndarray) -> list:
        """(offset, float64 values) to upload for new ids of ``leaf``: the ids themselves
        (exact integers, docs/device.md) and every take index built from them."""
        out = [(self.val_off[leaf], np.asarray(ids, dtype=np.float64))]
        for ti in self.take_indexes:
            if ti.leaf == leaf:
                order, start = nx.take_index(ids, ti.rows)
                out += [(ti.order_off, order.astype(np.float64)),
                        (ti.start_off, start.astype(np.float64))]
        return out
    fusion: Optional[object] = None         # gradtool.device.fusion.FusionPlan (--fuse)

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
            for ln in self.launches[ph]:
                if ln.kernel not in kernel_index:
                    raise CaptureError(f"kernel {ln.kernel} is missing from the kernel file")
                table += [kernel_index[ln.kernel], len(meta)]
                meta += list(ln.meta)
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
        self.take_index = {}          # take / scatter node -> its TakeIndex
        self.err_off = -1             # the bad-id flag (one element), if any op reads ids
        self.first = {}               # node -> (consumer, role): its first contribution
        self.fresh = set()            # gradients whose first contribution is stored
        self.stored = set()           # ... as the launches made so far did

    def stores(self, i: int, role: str, j: int) -> bool:
        """Whether node ``i``'s contribution to input ``j`` (as ``role``) is stored
        rather than added into a zero-filled gradient (recording that it was)."""
        if j not in self.fresh or self.first[j] != (i, role):
            return False
        self.stored.add(j)
        return True

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


def integer_data(tape) -> list:
    """Per node: whether its values derive from integer consts alone (an i64 const, the
    rng slot, or an op other than a draw all of whose inputs are such nodes: a comparison
    of ids, ``to_f64`` of them, the slot's train flag sliced out, ...).
    Those nodes hold whole numbers whatever their float type, and no gradient reaches
    them; every other node descends from a float leaf."""
    out = []
    for i, node in enumerate(tape.nodes):
        if node.a < 0:          # ids, or the rng slot's counters (whole numbers)
            out.append(tape.values[i].dtype == np.int64 or node.name == RNG_NAME)
        else:                   # a draw is no whole number, whatever reads the slot
            out.append(node.op != "uniform" and out[node.a] and (node.b < 0 or out[node.b]))
    return out


def f64_islands(tape) -> list:
    """Per node: whether it may hold float64 values in an f32 program, exactly.  Nodes of
    integer data (:func:`integer_data`: whole numbers), the rng slot (its counters are
    whole numbers, checked below 2^24 as in every f32 arena), and a draw (``uniform``,
    always f64 on the tape) that nothing reads but casts to f32: the f32 build's
    k_uniform rounds each draw to float once, which is exactly what the casts compute,
    so the draw's slot holds the casts' values and each cast is a copy of it."""
    out = integer_data(tape)
    readers = [[] for _ in tape.nodes]
    for i, node in enumerate(tape.nodes):
        for k in (node.a, node.b):
            if k >= 0:
                readers[k].append(i)
    for i, node in enumerate(tape.nodes):
        if (node.op == "uniform" and readers[i]
              and all(tape.nodes[r].op == "cast" and tape.values[r].dtype == np.float32
                      for r in readers[i])):
            out[i] = True
    return out


def tape_dtype(tape) -> str:
    """The float dtype of ``tape``'s values: "f32" when they are float32, else "f64" (a
    tape of integer consts only is f64).  Nodes of integer data (:func:`integer_data`:
    whole numbers, whatever their type) do not count.  A tape holding both (a ``cast``
    between them) is a CaptureError: a device program has one element type."""
    kinds = {}
    ints = f64_islands(tape)
    for i, value in enumerate(tape.values):
        dt = getattr(value, "dtype", None)
        if (dt == np.float32 or dt == np.float64) and not ints[i]:
            kinds.setdefault("f32" if dt == np.float32 else "f64", i)
    if len(kinds) > 1:
        raise CaptureError(f"node {kinds['f32']}: holds float32 values and node "
                           f"{kinds['f64']} float64 values; the device replay runs one float "
                           f"dtype per tape, an f32 or a float64 tape (a tape that casts "
                           f"between them runs on the cpu backend)")
    return next(iter(kinds), "f64")


def _check(tape, loss: int, dtype: str) -> None:
    if dtype not in DTYPES:
        raise CaptureError(f"dtype {dtype!r} is not supported (choose f64 or f32)")
    if dtype != tape_dtype(tape):
        raise CaptureError(f"the tape's values are {tape_dtype(tape)}; a {dtype} program "
                           f"needs a {dtype} tape (device.rounded_tape converts one)")
    if not tape.ok:
        raise CaptureError(f"the tape is poisoned: {tape.error}")
    if not 0 <= loss < len(tape.nodes):
        raise CaptureError(f"loss node {loss} does not exist (the tape has {len(tape.nodes)} nodes)")
    ints, islands = integer_data(tape), f64_islands(tape)
    for i, (node, value) in enumerate(zip(tape.nodes, tape.values)):
        if node.a >= 0 and OPS[node.op].kind not in _FORWARD:
            raise CaptureError(f"node {i}: op {node.op!r} has no device kernel")
        ids = node.op == "const" and getattr(value, "dtype", None) == np.int64
        whole = islands[i] and getattr(value, "dtype", None) == np.float64
        if not isinstance(value, np.ndarray) or (value.dtype != DTYPES[dtype] and not ids
                                                 and not whole):
            kind = getattr(value, "dtype", type(value).__name__)
            raise CaptureError(f"node {i}: holds {kind} values; the device replay needs a "
                               f"float64 or float32 tape")
        if whole and ints[i] and dtype != "f64" and inexact_int(value, EXACT_INTS[dtype]):
            raise CaptureError(f"node {i} ({node.op}): integer data "
                               f"{inexact_int(value, EXACT_INTS[dtype])} (a {dtype} arena)")
        if node.a >= 0:
            sb = tape.values[node.b].shape if node.b >= 0 else None
            want = infer_shape(node.op, tape.values[node.a].shape, sb, node.aux)
            if tuple(want) != tuple(value.shape):
                raise CaptureError(f"node {i}: value has shape {list(value.shape)} but {node.op} "
                                   f"of its inputs gives {list(want)}")
    if tape.values[loss].size != 1:
        raise CaptureError(f"loss node {loss} has shape {list(tape.values[loss].shape)}; "
                           f"backward needs a one-element loss")
    if tape.values[loss].dtype == np.int64:
        raise CaptureError(f"loss node {loss} holds integer ids, not a loss")
    for i, node in enumerate(tape.nodes):
        spec = OPS[node.op]
        for role, k in (("a", node.a), ("b", node.b)):
            if (k >= 0 and role not in spec.id_inputs and tape.holds_ids(k)
                    and inexact_int(tape.values[k], EXACT_INTS[dtype])):
                raise CaptureError(f"node {i} ({node.op}) reads integer data of node {k}: "
                                   f"{inexact_int(tape.values[k], EXACT_INTS[dtype])} "
                                   f"(a {dtype} arena)")
        if spec.rng_input and bad_rng(tape.values[node.a], limit=EXACT_INTS[dtype]):
            raise CaptureError(f"node {i} ({node.op}): "
                               f"{bad_rng(tape.values[node.a], limit=EXACT_INTS[dtype])} "
                               f"(a {dtype} arena)")
        if spec.id_inputs:
            # ids (< bound) and the take index (positions, counts <= N) become arena values
            most = max(spec.index_bound(tape.values[node.a].shape, node.aux),
                       tape.values[node.b].size if spec.kind in ("take", "scatter") else 0)
            if most >= EXACT_INTS[dtype]:
                raise CaptureError(f"node {i} ({node.op}): {most} ids or rows; a {dtype} arena "
                                   f"holds integers exactly only below {EXACT_INTS[dtype]}")


def rounded_tape(tape, dtype: str = "f32"):
    """A copy of the f64 ``tape`` as an f32 tape (``dtype`` "f32"; "f64": ``tape`` itself):
    every float leaf (params, consts, input slots) rounded to float32 once, to nearest
    even, integer consts kept, and every op node recomputed by the CPU reference in
    float32 (numerics32).  Node ids, names, scalars and attributes are unchanged, so the
    copy's replay answers for the original's nodes.  What ``replay-gpu --dtype f32`` and
    ``capture(..., dtype="f32")`` of an f64 tape run."""
    import copy

    if dtype not in DTYPES:
        raise CaptureError(f"dtype {dtype!r} is not supported (choose f64 or f32)")
    have = tape_dtype(tape)
    if have == dtype:
        return tape
    if dtype != "f32":
        raise CaptureError(f"an {have} tape cannot be replayed as {dtype}")
    if not tape.ok:
        raise CaptureError(f"the tape is poisoned: {tape.error}")
    out = copy.deepcopy(tape)
    for i, node in enumerate(out.nodes):
        value = out.values[i]
        if node.a < 0 and value.dtype == np.float64:
            with np.errstate(over="ignore"):        # past float32's range: +-inf, as torch
                out.values[i] = value.astype(np.float32)
    out.rounded_from = tape           # the optimizer's params are the original's
    out.grads = [None] * len(out.nodes)
    out.forward()
    if not out.ok:
        raise CaptureError(f"the tape rounded to f32 cannot be computed: {out.error}")
    return out


def capture_program(tape, loss: int, dtype: Optional[str] = None, optimizer=None,
                    max_bytes: Optional[int] = None) -> Program:
    """Mirror ``tape`` (with ``loss`` the node backward seeds) as a static :class:`Program`.

    ``dtype`` (default: the tape's own, :func:`tape_dtype`) is the arena's element type;
    it must be the tape's (:func:`rounded_tape` makes an f32 copy of an f64 tape).

    ``optimizer`` (a :class:`gradtool.optim.Optimizer` with its params
    registered) adds the device optimizer's buffers and launches.  ``max_bytes``
    (default :data:`gradtool.budget.DEFAULT_MEMORY`) bounds the device memory the
    program needs (:attr:`Program.nbytes`): a bigger one is a CaptureError before
    any backend allocates it.
    """
    if dtype is None:
        dtype = tape_dtype(tape)
    _check(tape, loss, dtype)

    b = _Builder(tape, loss, dtype)
    b.islands = f64_islands(tape)
    val_off = [b.alloc(b.n(i)) for i in range(len(tape.nodes))]
    reached = reach(tape, loss)
    needs = _contributions(b, reached)
    # the gradients that need the zero fill first, then those whose first contribution
    # stores (the fill is one range)
    grad_start = b.size
    grad_off = [b.alloc(b.n(i)) if reached[i] and i not in b.fresh else -1
                for i in range(len(tape.nodes))]
    fill_end = b.size
    for i in sorted(b.fresh):
        grad_off[i] = b.alloc(b.n(i))
    grad_end = b.size
    ctl_off = b.alloc(CTL_SIZE)
    if any(OPS[n.op].id_inputs for n in tape.nodes):
        b.err_off = b.alloc(1)
    takes = [TakeIndex(leaf, i, rows, b.alloc(b.n(leaf)), b.alloc(rows + 1))
             for i, leaf, rows in _index_users(tape, grad_off)]
    b.take_index = {ti.node: ti for ti in takes}
    b.scratch_off = b.size
    forward = [launch for i in range(len(tape.nodes)) if tape.nodes[i].a >= 0
               for launch in _forward_node(b, i, val_off)]
    backward = [launch("k_fill", fill_end - grad_start, -1, "zero gradients", dst=grad_start,
                       value=0.0),
                launch("k_fill", 1, loss, "seed loss", dst=grad_off[loss], value=1.0)]
    for i, need_a, need_b in needs:
        backward += _backward_node(b, i, need_a, need_b, val_off, grad_off)
    if b.stored != b.fresh:          # a gradient left out of the fill that nothing stored
        raise CaptureError(f"internal: the gradients of nodes {sorted(b.fresh - b.stored)} "
                           "were not stored by their first contribution")
    b.alloc(b.scratch_need)

    prog = Program(dtype=dtype, size=0, shapes=b.shapes, val_off=val_off, grad_off=grad_off,
                   loss=loss, ctl_off=ctl_off,
                   launches={"forward": forward, "backward": backward, "optimizer": []},
                   param_ids=[i for i, n in enumerate(tape.nodes) if n.op == "param"],
                   input_ids=[i for i, n in enumerate(tape.nodes) if n.op == "const" and n.name],
                   take_indexes=takes, err_off=b.err_off)
    for i, n in enumerate(tape.nodes):
        spec = OPS[n.op]
        if spec.id_inputs:
            bound = spec.index_bound(b.shapes[n.a], n.aux)
            if tape.nodes[n.b].a < 0:
                prog.id_bounds.setdefault(n.b, []).append((i, bound))
            else:
                prog.computed_ids.append((i, n.b, bound))
        for role, k in (("a", n.a), ("b", n.b)):
            if k >= 0 and role not in spec.id_inputs and tape.holds_ids(k):
                prog.int_values.add(k)
    prog.init = [(val_off[i], tape.values[i].astype(np.float64) if tape.holds_ids(i)
                  else tape.values[i]) for i in range(len(tape.nodes)) if i not in prog.id_bounds]
    for leaf in prog.id_bounds:
        prog.init += prog.id_writes(leaf, tape.values[leaf])
    if optimizer is not None:
        prog.optimizer = plan_optimizer(b, prog, optimizer)
        prog.launches["optimizer"] = prog.optimizer.launches
    prog.init.append((ctl_off, np.array([prog.optimizer.lr if prog.optimizer else 0.0, 1.0, 0.0,
                                          1.0] + [0.0] * optim_table.MAX_SCALARS)))
    if b.err_off >= 0:
        prog.init.append((b.err_off, np.zeros(1)))
    prog.size = b.size
    _check_arena(prog, grad_end - grad_start, DEFAULT_MEMORY if max_bytes is None else max_bytes)
    return prog


def _index_users(tape, grad_off) -> list:
    """(node, ids leaf, rows) of every node that walks numerics.take_index of leaf ids
    (k_take_bwd): a take whose table learns (its backward), a scatter (its forward).
    Ids computed on the tape have no uploaded index: their kernels scan them."""
    out = []
    for i, n in enumerate(tape.nodes):
        if n.a < 0 or tape.nodes[n.b].a >= 0:
            continue
        kind = OPS[n.op].kind
        if kind == "take" and grad_off[i] >= 0 and tape.requires[n.a]:
            out.append((i, n.b, tape.values[n.a].shape[0]))
        elif kind == "scatter":
            out.append((i, n.b, n.aux["rows"]))
    return out


def _check_arena(prog: Program, grad_elements: int, max_bytes: int) -> None:
    if prog.nbytes <= max_bytes:
        return
    values = sum(prog.size_of(i) for i in range(len(prog.shapes)))
    item = prog.itemsize
    raise CaptureError(
        f"the device program needs {human_bytes(prog.nbytes)} (values "
        f"{human_bytes(item * values)}, gradients {human_bytes(item * grad_elements)}, "
        f"optimizer state and scratch {human_bytes(item * (prog.size - values - grad_elements))}, "
        f"launch metadata {human_bytes(prog.nbytes - item * prog.size)}), over the memory "
        f"limit of {human_bytes(max_bytes)} (gradtool --max-memory SIZE raises it)")


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
