"""What a tape's backward walk reaches, and questions asked of a whole tape.

:func:`reach` and :func:`requires_wrt` are the set the CPU walk (:meth:`Tape.backward`),
the device program and the emitter all give gradient slots; :func:`first_f32` and
:func:`f32_refusal` the engines' refusal of a float32 tape; :func:`ids_culprit` the input
slot a bad id came from.  Functions of a :class:`gradtool.tape.Tape`, re-exported from
:mod:`gradtool.tape`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from .errors import IdsError
from .ops import OPS

if TYPE_CHECKING:
    from .tape import Tape

def first_f32(tape: Tape) -> int:
    """The first node holding float32 values (an f32 leaf, a cast, what reads them), or
    -1: the device engines and the emitter refuse such a tape until their f32 kernels
    exist (docs/device.md), in one line naming this node."""
    for i, value in enumerate(tape.values):
        if value.dtype == np.float32:
            return i
    return -1


def f32_refusal(tape: Tape, what: str, hint: str = "") -> Optional[str]:
    """The one-line refusal of an f32 tape by ``what`` (an engine, emit-cuda), or None."""
    i = first_f32(tape)
    if i < 0:
        return None
    node = tape.nodes[i]
    return (f"node {i}: a {node.op}{' ' + repr(node.name) if node.name else ''} holding "
            f"float32 values (dtype f32); {what} needs a float64 tape for now (its f32 "
            f"kernels are not built yet){hint}")


def ids_culprit(tape: Tape, err: IdsError, slot_values: dict) -> Optional[tuple]:
    """(input slot name, example row or None) that ``err``'s bad id came from: the one
    named integer const among the ancestors of the ids (None where there is none, or
    several), and the row of its leading dim holding the bad id (``slot_values``: node id
    -> the values the slot held; the id at the same flat position when the ids are as
    many as the slot's values, else the first equal one).  For messages that name the
    data: ``labels: example 37 ... has id 9``."""
    seen, stack, slots = set(), [err.ids_node], []
    while stack:
        j = stack.pop()
        if j in seen or j < 0:
            continue
        seen.add(j)
        node = tape.nodes[j]
        if node.a < 0:
            if node.op == "const" and node.name and tape.holds_ids(j):
                slots.append(j)
            continue
        stack += [node.a, node.b]
    if len(slots) != 1:
        return None
    slot = slots[0]
    values = slot_values.get(slot)
    if values is None:
        return tape.nodes[slot].name, None
    flat = np.ravel(values)
    ids_size = int(np.prod(tape.values[err.ids_node].shape))
    if flat.size == ids_size and err.index is not None and flat[err.index] == err.value:
        k = err.index
    else:
        equal = np.flatnonzero(flat == err.value)
        if not equal.size:
            return tape.nodes[slot].name, None
        k = int(equal[0])
    shape = np.shape(values)
    per_row = max(1, flat.size // shape[0]) if shape else 1
    return tape.nodes[slot].name, k // per_row


def requires_wrt(tape: Tape, wrt) -> list:
    """``tape.requires`` as if only the params ``wrt`` (node ids) were params.

    A node requires a gradient when one of the chosen params is among its
    ancestors (a chosen param requires one itself).  With every param chosen
    this equals ``tape.requires``.
    """
    chosen = set(wrt)
    req = []
    for i, node in enumerate(tape.nodes):
        if node.a < 0:
            req.append(i in chosen)
        else:
            grad_in = OPS[node.op].grad_inputs
            req.append(("a" in grad_in and req[node.a])
                       or (node.b >= 0 and "b" in grad_in and req[node.b]))
    return req


def reach(tape: Tape, loss: int, requires: Optional[Sequence[bool]] = None) -> list:
    """Which nodes the backward walk from ``loss`` touches (their gradient is not None).

    The loss itself, and every input of a touched node that requires a
    gradient: ``requires`` (default ``tape.requires``; see
    :func:`requires_wrt` for a chosen subset of params).  This is the set the
    CPU walk, the device program and the emitter all give gradient slots.
    """
    nodes = tape.nodes
    requires = tape.requires if requires is None else requires
    reached = [False] * len(nodes)
    reached[loss] = True
    for i in range(loss, -1, -1):
        node = nodes[i]
        if not reached[i] or node.a < 0 or not requires[i]:
            continue
        spec = OPS[node.op]
        if requires[node.a] and spec.grad_to("a"):
            reached[node.a] = True
        if node.b >= 0 and requires[node.b] and spec.grad_to("b"):
            reached[node.b] = True
    return reached
