"""A validated tape file becomes a Tape: :class:`TapeFile` and :func:`replay`."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import ClassVar, Optional

import numpy as np

from ..errors import TapeFileError
from ..ops import INT_DTYPE, OPS, bad_id, kernel_names
from ..tape import GVar, Node, Tape, ieee_silent
from .checks import CheckedFile
from .runs import _RUN_OPS, RunColumns
from .write import dumps, write


class TapeFile:
    """A loaded tape file: the replayed Tape plus the file's loss, outputs, meta, optimizer.

    ``recorded`` maps op-node ids to the values the writer stored (``values=True``),
    for bit-for-bit verification of the replay; ``numerics`` is the contract they were
    computed under (the file's ``numerics`` field, 1 when absent:
    :data:`gradtool.numerics.NUMERICS_VERSION`).  ``state`` maps each state slot's name
    to the output that updates it after a training step (the file's ``state``; ``{}``).
    """

    def __init__(self, tape: Tape, loss: GVar, outputs: dict, meta: dict,
                 optimizer: Optional[dict], source: str, recorded: dict, numerics: int = 1,
                 state: Optional[dict] = None):
        self.tape = tape
        self.loss = loss
        self.outputs = outputs
        self.meta = meta
        self.optimizer = optimizer
        self.source = source
        self.recorded = recorded
        self.numerics = numerics
        self.state = dict(state or {})
        self._runs: Optional[LoadedRuns] = None      # replay's, for loaded_runs

    def loaded_runs(self) -> Optional["LoadedRuns"]:
        """The runs of plain unary nodes the loader replayed from columns
        (:class:`LoadedRuns`), while ``self.tape`` still holds the nodes of the load: the
        same tape, node and value lists, node count and next serial (every node appended
        since, also after ``reset_to``, took a fresh serial; ``set_value`` and ``forward``
        keep every value's shape); else None (also for a file without runs)."""
        runs, tape = self._runs, self.tape
        if (runs is None or tape is not runs.tape or tape.nodes is not runs.nodes
                or tape.values is not runs.values or len(tape.nodes) != runs.count
                or len(tape.values) != runs.count or tape._next_serial != runs.serial):
            return None
        return runs

    def __repr__(self):
        return (f"TapeFile({self.source!r}, {len(self.tape)} nodes, loss=node {self.loss.id}, "
                f"outputs={sorted(self.outputs)})")

    def dumps(self, *, values: bool = False) -> bytes:
        """This file's tape re-encoded with the same loss, outputs, state, meta and
        optimizer."""
        return dumps(self.tape, loss=self.loss, outputs=self.outputs, meta=self.meta,
                     values=values, optimizer=self.optimizer, state=self.state)

    def save(self, dest, *, values: bool = False) -> None:
        write(self.dumps(values=values), dest)


@dataclass(frozen=True, eq=False)
class LoadedRuns:
    """What the loader knew of a loaded tape without reading its Nodes: the runs
    (``(start, stop)``, :attr:`CheckedFile.runs`), each node k of one being
    ``Node(code_ops[code[k]], a[k], -1, s)`` with a value of shape ``shapes[shape_id[k]]``
    (the checks' :class:`~.runs.RunColumns`; their entries at the other nodes mean
    nothing here), and the tape as loaded (:meth:`TapeFile.loaded_runs` compares)."""

    code_ops: ClassVar[tuple] = (None, *_RUN_OPS)      # the op of each code (runs._RUN_CODE)
    runs: list
    code: np.ndarray
    a: np.ndarray
    shapes: list
    shape_id: np.ndarray
    tape: Tape
    nodes: list
    values: list
    count: int
    serial: int

    def __repr__(self):
        return f"LoadedRuns({len(self.runs)} runs, {self.count} nodes, serial {self.serial})"


def replay(checked: CheckedFile, source: str) -> TapeFile:
    """Build the Tape from the validated nodes: leaves through ``param``/``const``, op
    values recomputed by the op table's forward rules and appended by
    ``Tape._append_op``, as ``Tape._record`` appends them.  Every check ``_record`` would
    repeat (handles, shapes, ids) has passed in :mod:`gradtool.tapefile.checks`
    already, so this costs a third of recording node by node, which matters for a tape
    of a million nodes."""
    tape = Tape()
    recorded = {}
    values = tape.values
    # op nodes are appended as Tape._append_op appends them, without the handle it returns
    append_node, append_value = tape.nodes.append, values.append
    requires = tape.requires
    append_requires = requires.append
    integral = tape.integral
    append_integral = integral.append
    ops_from = len(tape.nodes)
    nodes = checked.nodes
    runs = {start: stop for start, stop in checked.runs}
    with ieee_silent():
        i, count = 0, len(nodes)
        while i < count:
            stop = runs.get(i)
            if stop is not None:
                _replay_run(checked.columns, i, stop, tape, source)
                i = stop
                continue
            node, k = nodes[i], i
            i += 1
            op, a, b = node.op, node.a, node.b
            if a < 0:
                _finish_ops(tape, ops_from)
                ids = node.dtype == INT_DTYPE
                code = "<i8" if ids else "<f4" if node.dtype == "f32" else "<f8"
                data = np.frombuffer(node.data, dtype=code).reshape(node.shape)
                if op == "param":
                    tape.param(data, name=node.name, l2=node.l2, dtype=node.dtype)
                else:
                    tape.const(data, name=node.name, dtype=node.dtype)
                ops_from = len(tape.nodes)
                continue
            spec = OPS[op]
            if spec.id_inputs and checked.node(b).a >= 0:      # ids computed on the tape
                problem = bad_id(values[b], spec.index_bound(values[a].shape, node.attrs))
                if problem:
                    raise TapeFileError(f"its ids, computed by node {b}: {problem} (table "
                                        f"{list(values[a].shape)})", source=source, node=k,
                                        field="b")
            value = spec.forward(values[a], values[b] if b >= 0 else None, node.s, node.attrs)
            if value.shape != node.shape:        # defensive: the checks prevent it
                raise TapeFileError(f"replay gave shape {list(value.shape)}, not the "
                                    f"checked {list(node.shape)}", source=source, node=k)
            if value.base is not None:           # never alias an input (as _append_op)
                value = value.copy()
            append_node(Node(op, a, b, node.s, node.attrs))
            append_value(value)
            grad_in = spec.grad_inputs                 # as Tape._append_op decides both
            append_requires(("a" in grad_in and requires[a])
                            or (b >= 0 and "b" in grad_in and requires[b]))
            append_integral(bool(spec.integral)
                            and spec.integral_of(integral[a], b < 0 or integral[b], node.s))
            if node.value is not None:       # float64 bytes (an f32 value widened exactly)
                recorded[k] = np.frombuffer(node.value, dtype="<f8").reshape(node.shape)
        _finish_ops(tape, ops_from)
    outputs = {k: tape.var(v) for k, v in checked.outputs.items()}
    tf = TapeFile(tape, tape.var(checked.loss), outputs, checked.meta, checked.optimizer,
                  source, recorded, checked.numerics, checked.state)
    if checked.runs:                          # kept for describe.Columns
        c = checked.columns
        tf._runs = LoadedRuns(list(checked.runs), c.code, c.a, c.shapes, c.shape_id, tape,
                              tape.nodes, values, len(tape.nodes), tape._next_serial)
    return tf


def _run_rule(op: str):
    return OPS[op].forward


_RUN_NAMES = np.array([None, *_RUN_OPS], dtype=object)       # per runs._RUN_CODE
_RUN_GRAD_A = np.array([False, *("a" in OPS[op].grad_inputs for op in _RUN_OPS)])


RUN_SOURCES = ("gt_replay.c", "gt_real.h", "gt_ops.h", "gt_math.h", "host_prelude.h")
COMPILED_RUN_MIN = 64          # shorter stretches replay node by node (a call costs more)
_RUN_LIBRARY: list = []        # [(library, {op: code}) or None], once per process


def run_library():
    """``csrc/gt_replay.c`` (built and cached on first use), the code of each op it
    knows, and the same per ``runs._RUN_CODE`` (-1: not compiled) as an array; or None:
    no C compiler, or ``GRADTOOL_NATIVE=0``."""
    if not _RUN_LIBRARY:
        found = None
        from .. import native
        if native.enabled():
            import ctypes
            try:
                lib = native.load("gt_replay", native.CSRC / RUN_SOURCES[0],
                                  native.SAFE_FLAGS,
                                  [native.CSRC / name for name in RUN_SOURCES[1:]])
                lib.gt_run_op_name.restype = ctypes.c_char_p
                lib.gt_run_op_name.argtypes = [ctypes.c_int]
                lib.gt_run_unary.restype = ctypes.c_longlong
                lib.gt_run_unary.argtypes = [ctypes.c_longlong, ctypes.c_longlong,
                                             *[ctypes.c_void_p] * 4]
                codes = {}
                for code in range(lib.gt_run_op_count()):
                    kernel = lib.gt_run_op_name(code).decode()
                    op = kernel[2:]
                    if op in OPS and OPS[op].kind == "unary" and kernel_names(OPS[op])[0] == kernel:
                        codes[op] = code
                lib_code = np.array([-1, *(codes.get(op, -1) for op in _RUN_OPS)],
                                    dtype=np.intc)               # per runs._RUN_CODE
                found = (lib, codes, lib_code)
            except (native.NativeUnavailable, OSError):
                found = None
        _RUN_LIBRARY.append(found)
    return _RUN_LIBRARY[0]


def _replay_run(columns: RunColumns, start: int, stop: int, tape: Tape, source: str) -> None:
    """The nodes ``start:stop`` of a run of plain unary nodes (CheckedFile.runs: no
    attributes, stored value or integer data; a float input of the node's own shape),
    read from the checks' columns, as the general loop of :func:`replay` appends them,
    with less per node: each stretch of one shape in one call of the compiled rules
    (:func:`run_library`; its nodes' values are the rows of one array), else the values
    one by one; whether each requires grad in a few numpy passes (:func:`run_requires`);
    the Nodes in one call."""
    code = columns.code[start:stop]
    ids = columns.a[start:stop]
    shape_id = columns.shape_id[start:stop]
    ops = _RUN_NAMES[code].tolist()
    scalars = columns.s[start:stop]
    if scalars.any() or np.signbit(scalars).any():
        scalars = scalars.tolist()
    else:                                     # mostly: +0.0 everywhere, one float object
        scalars = [0.0] * (stop - start)
    id_list = ids.tolist()
    shapes = columns.shapes
    compiled = run_library()
    # the stretches of one shape (mostly: one)
    cuts = [0, *(np.flatnonzero(shape_id[1:] != shape_id[:-1]) + 1).tolist(), stop - start]
    for first, last in zip(cuts, cuts[1:]):
        shape = shapes[int(shape_id[first])]
        if compiled is None or last - first < COMPILED_RUN_MIN or not _run_compiled(
                compiled, tape.values, code[first:last], ids[first:last],
                columns.s[start + first:start + last], shape, start + first):
            part = slice(first, last)
            _run_values(tape.values, ops[part], id_list[part], scalars[part], shape,
                        start + first, source)
    requires = tape.requires
    inside = ids >= start
    outside = np.flatnonzero(~inside)
    outside_req = np.fromiter(map(requires.__getitem__, ids[outside].tolist()), dtype=bool,
                              count=len(outside))
    requires.extend(run_requires(_RUN_GRAD_A[code], ids - start, outside, outside_req).tolist())
    tape.nodes.extend(map(Node, ops, id_list, repeat(-1), scalars))
    tape.integral.extend(columns.integral(start, stop))


def run_requires(grad_a: np.ndarray, local: np.ndarray, outside: np.ndarray,
                 outside_req: np.ndarray) -> np.ndarray:
    """Whether each node of a run of unary nodes requires grad, as ``Tape._append_op``
    decides it node by node: ``grad_a[k] and requires[a]``, node k's input being node
    ``local[k]`` of the run, or, at the positions ``outside``, a node before the run
    whose requires is ``outside_req``.  Node k requires grad when every node down its
    chain of inputs inside the run passes gradients to its input and the chain's input
    outside the run requires grad: by pointer jumping (log2 of the longest chain passes;
    a stretch of nodes each reading the one before, as a tape is recorded, is one)."""
    m = len(grad_a)
    index = np.arange(m)
    acc = grad_a.copy()                  # node k requires grad iff acc[k] and node ptr[k]
    acc[outside] &= outside_req          # ... does; ptr[k] == k: iff acc[k]
    ptr = local.copy()
    ptr[outside] = outside
    # node k reads node k - 1, which reads k - 2, ..., down to node j, which does not:
    # node k requires grad iff every node j+1..k passes gradients on, and node j does
    follows = ptr == index - 1
    follows[outside] = False
    if follows.any():
        before = np.maximum.accumulate(np.where(follows, 0, index))
        blocked = np.cumsum(~grad_a)
        acc = np.where(follows, blocked == blocked[before], acc)
        ptr = np.where(follows, before, ptr)
    while True:
        acc &= acc[ptr]
        nxt = ptr[ptr]
        if np.array_equal(nxt, ptr):
            return acc
        ptr = nxt


def _run_values(values, ops, ids, scalars, shape, start, source) -> None:
    """A stretch of one shape of a run, its values node by node by the numpy rules."""
    append_value = values.append
    last = forward = None
    for k, op, a, s in zip(range(start, start + len(ops)), ops, ids, scalars):
        if op is not last:                   # the rule of a new op (runs are mostly one)
            forward = _run_rule(op)
            last = op
        value = forward(values[a], None, s, None)
        if value.shape != shape:             # defensive: the checks prevent it
            raise TapeFileError(f"replay gave shape {list(value.shape)}, not the "
                                f"checked {list(shape)}", source=source, node=k)
        if value.base is not None:           # never alias an input (as _append_op)
            value = value.copy()
        append_value(value)


def _run_compiled(compiled, values, code, ids, scalars, shape, start) -> bool:
    """A stretch of one shape, nodes ``start`` onwards (run op codes ``code``, inputs
    ``ids``, scalar operands ``scalars``), in one call of gt_run_unary: the values are the
    rows of one new array (they alias each other, never an input).  False, with nothing
    appended, when some op is not compiled."""
    lib, _, lib_code = compiled
    op_codes = lib_code[code]
    if (op_codes < 0).any():
        return False
    n = len(code)
    size = int(np.prod(shape, dtype=np.int64))
    out = np.empty((n, size))
    inside = ids >= start
    row_bytes = size * 8
    ptrs = np.empty(n, dtype=np.uintp)
    ptrs[inside] = out.ctypes.data + (ids[inside] - start) * row_bytes
    keep = []                                # inputs before the stretch, contiguous
    for j in np.flatnonzero(~inside).tolist():
        x = np.ascontiguousarray(values[int(ids[j])], dtype=np.float64)
        keep.append(x)
        ptrs[j] = x.ctypes.data
    sv = np.ascontiguousarray(scalars, dtype=np.float64)
    done = lib.gt_run_unary(n, size, op_codes.ctypes.data, ptrs.ctypes.data, sv.ctypes.data,
                            out.ctypes.data)
    if done != n:                            # defensive: every code came from the library
        raise RuntimeError(f"gt_run_unary stopped at row {done} of {n}")
    values.extend(out.reshape((n, *shape)))    # a file's shapes are never empty
    return True


def _finish_ops(tape: Tape, start: int) -> None:
    """The gradients (none yet) and birth stamps of the op nodes appended since ``start``,
    as ``Tape._append`` gives them one by one."""
    count = len(tape.nodes) - start
    if count:
        tape.grads.extend([None] * count)
        tape.serials.extend(range(tape._next_serial, tape._next_serial + count))
        tape._next_serial += count


__all__ = ["TapeFile", "LoadedRuns", "replay"]
