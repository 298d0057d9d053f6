"""A validated tape file becomes a Tape: :class:`TapeFile` and :func:`replay`."""

from __future__ import annotations

from itertools import repeat
from typing import Optional

import numpy as np

from ..errors import TapeFileError
from ..ops import INT_DTYPE, OPS, bad_id
from ..tape import GVar, Node, Tape, ieee_silent
from .checks import CheckedFile
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
                _replay_run(nodes, i, stop, tape, source)
                i = stop
                continue
            node, k = nodes[i], i
            i += 1
            op, a, b = node.op, node.a, node.b
            if a < 0:
                _finish_ops(tape, ops_from)
                ids = node.dtype == INT_DTYPE
                data = np.frombuffer(node.data, dtype="<i8" if ids else "<f8").reshape(node.shape)
                if op == "param":
                    tape.param(data, name=node.name, l2=node.l2)
                else:
                    tape.const(data, name=node.name, dtype=node.dtype)
                ops_from = len(tape.nodes)
                continue
            spec = OPS[op]
            if spec.id_inputs and checked.nodes[b].a >= 0:     # ids computed on the tape
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
                            and spec.integral_of(integral[a], b < 0 or integral[b]))
            if node.value is not None:
                recorded[k] = np.frombuffer(node.value, dtype="<f8").reshape(node.shape)
        _finish_ops(tape, ops_from)
    outputs = {k: tape.var(v) for k, v in checked.outputs.items()}
    return TapeFile(tape, tape.var(checked.loss), outputs, checked.meta, checked.optimizer,
                    source, recorded, checked.numerics, checked.state)


_RUN_RULES = {}


def _run_rule(op: str) -> tuple:
    rule = _RUN_RULES.get(op)
    if rule is None:
        spec = OPS[op]
        rule = _RUN_RULES[op] = (spec.forward, "a" in spec.grad_inputs)
    return rule


def _replay_run(nodes: list, start: int, stop: int, tape: Tape, source: str) -> None:
    """The nodes ``start:stop`` of a run of plain unary nodes (CheckedFile.runs: no
    attributes, stored value or integer data; a float input of the node's own shape;
    checks.RunNode tuples ``(op, a, s, shape)``), as
    the general loop of :func:`replay` appends them, with less per node: the values one
    by one, the Nodes in one call."""
    values, requires = tape.values, tape.requires
    append_value, append_requires = values.append, requires.append
    ops, ids, scalars, shapes = zip(*nodes[start:stop])
    last = forward = grad_a = None
    for k, op, a, s, shape in zip(range(start, stop), ops, ids, scalars, shapes):
        if op is not last:                   # the rule of a new op (runs are mostly one)
            forward, grad_a = _run_rule(op)
            last = op
        value = forward(values[a], None, s, None)
        if value.shape != shape:             # defensive: the checks prevent it
            raise TapeFileError(f"replay gave shape {list(value.shape)}, not the "
                                f"checked {list(shape)}", source=source, node=k)
        if value.base is not None:           # never alias an input (as _append_op)
            value = value.copy()
        append_value(value)
        append_requires(grad_a and requires[a])
    tape.nodes.extend(map(Node, ops, ids, repeat(-1), scalars))
    tape.integral.extend(repeat(False, stop - start))    # no integer data in the file


def _finish_ops(tape: Tape, start: int) -> None:
    """The gradients (none yet) and birth stamps of the op nodes appended since ``start``,
    as ``Tape._append`` gives them one by one."""
    count = len(tape.nodes) - start
    if count:
        tape.grads.extend([None] * count)
        tape.serials.extend(range(tape._next_serial, tape._next_serial + count))
        tape._next_serial += count


__all__ = ["TapeFile", "replay"]
