"""A validated tape file becomes a Tape: :class:`TapeFile` and :func:`replay`."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import TapeFileError
from ..ops import INT_DTYPE, OPS, bad_id
from ..tape import GVar, Tape, ieee_silent
from .checks import CheckedFile
from .write import dumps, write


class TapeFile:
    """A loaded tape file: the replayed Tape plus the file's loss, outputs, meta, optimizer.

    ``recorded`` maps op-node ids to the values the writer stored (``values=True``),
    for bit-for-bit verification of the replay.
    """

    def __init__(self, tape: Tape, loss: GVar, outputs: dict, meta: dict,
                 optimizer: Optional[dict], source: str, recorded: dict):
        self.tape = tape
        self.loss = loss
        self.outputs = outputs
        self.meta = meta
        self.optimizer = optimizer
        self.source = source
        self.recorded = recorded

    def __repr__(self):
        return (f"TapeFile({self.source!r}, {len(self.tape)} nodes, loss=node {self.loss.id}, "
                f"outputs={sorted(self.outputs)})")

    def dumps(self, *, values: bool = False) -> bytes:
        """This file's tape re-encoded with the same loss, outputs, meta and optimizer."""
        return dumps(self.tape, loss=self.loss, outputs=self.outputs, meta=self.meta,
                     values=values, optimizer=self.optimizer)

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
    with ieee_silent():
        for i, node in enumerate(checked.nodes):
            op, a, b = node.op, node.a, node.b
            if a < 0:
                ids = node.dtype == INT_DTYPE
                data = np.frombuffer(node.data, dtype="<i8" if ids else "<f8").reshape(node.shape)
                if op == "param":
                    tape.param(data, name=node.name, l2=node.l2)
                else:
                    tape.const(data, name=node.name, dtype=node.dtype)
                continue
            spec = OPS[op]
            if spec.id_inputs and checked.nodes[b].a >= 0:     # ids computed on the tape
                problem = bad_id(values[b], spec.index_bound(values[a].shape, node.attrs))
                if problem:
                    raise TapeFileError(f"its ids, computed by node {b}: {problem} (table "
                                        f"{list(values[a].shape)})", source=source, node=i,
                                        field="b")
            value = spec.forward(values[a], values[b] if b >= 0 else None, node.s,
                                 node.attrs)
            if value.shape != node.shape:        # defensive: the checks prevent it
                raise TapeFileError(f"replay gave shape {list(value.shape)}, not the "
                                    f"checked {list(node.shape)}", source=source, node=i)
            tape._append_op(op, a, b, node.s, node.attrs, value)
            if node.value is not None:
                recorded[i] = np.frombuffer(node.value, dtype="<f8").reshape(node.shape)
    outputs = {k: tape.var(v) for k, v in checked.outputs.items()}
    return TapeFile(tape, tape.var(checked.loss), outputs, checked.meta, checked.optimizer,
                    source, recorded)


__all__ = ["TapeFile", "replay"]
