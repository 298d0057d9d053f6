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

Each node's launches are :mod:`gradtool.device.lowering`'s; this module owns the arena,
the builder and the capture.

Restrictions raise :class:`CaptureError` (exit 2 from the CLI) before
anything is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .. import numerics as nx
from ..budget import DEFAULT_MEMORY, human_bytes
from ..ops import OPS, RNG_NAME, bad_rng, inexact_int, infer_shape
from ..tape import reach
from .launch import CaptureError, launch
# each node's launches (and the shape helpers they use) live in lowering.py; their names
# stay importable here
from .lowering import (_BACKWARD, _FORWARD, MAX_DIMS, _backward_node,  # noqa: F401
                       _contributions, _forward_node, aligned_strides, collapse,
                       row_major_strides)
from ..optim import table as optim_table
from .optimizer import CTL_SIZE, plan_optimizer

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
        self.views = set()            # reshapes sharing their input's memory (views=True)

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
                    max_bytes: Optional[int] = None, fills: str = "ahead",
                    views: bool = False) -> Program:
    """Mirror ``tape`` (with ``loss`` the node backward seeds) as a static :class:`Program`.

    ``dtype`` (default: the tape's own, :func:`tape_dtype`) is the arena's element type;
    it must be the tape's (:func:`rounded_tape` makes an f32 copy of an f64 tape).

    ``optimizer`` (a :class:`gradtool.optim.Optimizer` with its params
    registered) adds the device optimizer's buffers and launches.  ``max_bytes``
    (default :data:`gradtool.budget.DEFAULT_MEMORY`) bounds the device memory the
    program needs (:attr:`Program.nbytes`): a bigger one is a CaptureError before
    any backend allocates it.

    ``fills``: how the gradients that accumulate (all but those a product stores
    whole, ``_contributions``) start from zeros: ``"ahead"``, one ``k_fill`` of all of
    them first in the backward (they are laid out as one range); ``"each"``, one per
    gradient just before the launches of its first contribution (and, first, those of
    the gradients nothing contributes to), so that the zeros are still in the cache
    when that kernel adds into them (the host's choice: 5% of the ResNet-style CNN's
    step).  The same values in the same order either way: the same bits.

    ``views``: a ``reshape`` of a computed node (not a leaf: a leaf's slot is written
    between runs) shares that node's memory (``val_off``) and has no forward launch:
    a reshape of a row-major value is the same elements in the same order.  Its
    gradient keeps a slot of its own.  (The host's choice: 1.1 ms of copies in the
    ResNet-style CNN's forward.)
    """
    if fills not in ("ahead", "each"):
        raise CaptureError(f"fills must be 'ahead' or 'each', got {fills!r}"[:200])
    if dtype is None:
        dtype = tape_dtype(tape)
    _check(tape, loss, dtype)

    b = _Builder(tape, loss, dtype)
    b.islands = f64_islands(tape)
    val_off = []
    for i, node in enumerate(tape.nodes):
        a = node.a
        if (views and node.op == "reshape" and tape.nodes[a].a >= 0
                and b.islands[a] == b.islands[i]):
            val_off.append(val_off[a])             # the same elements, another shape
            b.views.add(i)
        else:
            val_off.append(b.alloc(b.n(i)))
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
               and i not in b.views for launch in _forward_node(b, i, val_off)]
    firsts: dict = {}                # consumer -> the gradients its contribution starts
    if fills == "each":
        zeroed = [j for j in range(len(tape.nodes)) if grad_off[j] >= 0 and j not in b.fresh]
        for j in zeroed:
            if j in b.first:
                firsts.setdefault(b.first[j][0], []).append(j)
        backward = [launch("k_fill", b.n(j), -1, "zero gradients", dst=grad_off[j], value=0.0)
                    for j in zeroed if j not in b.first]
    else:
        backward = [launch("k_fill", fill_end - grad_start, -1, "zero gradients",
                           dst=grad_start, value=0.0)]
    backward.append(launch("k_fill", 1, loss, "seed loss", dst=grad_off[loss], value=1.0))
    for i, need_a, need_b in needs:
        backward += [launch("k_fill", b.n(j), -1, "zero gradient", dst=grad_off[j], value=0.0)
                     for j in firsts.get(i, ())]
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
