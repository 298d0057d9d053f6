"""A tape in another float dtype: every float leaf rounded once, every op re-recorded.

:func:`to_dtype` is how an f64 recording becomes the float32 run its user has (the
importer's ``dtype="f32"``): the params and float consts are rounded to float32 once
(to nearest even), the integer consts (ids) and the rng slot stay as they are, and
every op node is recorded again from the converted inputs by the op table, so each
value is that op's f32 rule (docs/ops.md, "dtypes").  A node whose dtype rule gives
float64 whatever its inputs (``to_f64``, ``uniform``, a comparison of integer data)
keeps it, and is cast to the target where a float input of another op reads it
(``cast``, recorded once per such node); so do the integer-valued nodes (whole numbers
computed from ids: ``tape.integral``), which may feed ids and keep their exact values.  A ``cast`` of the source tape becomes its converted input (both
sides have the target dtype).
"""

from __future__ import annotations

from typing import Optional

from .errors import TapeError
from .ops import FLOAT_DTYPES, INT_DTYPE, OPS, RNG_NAME, dtype_of
from .tape import GVar, Tape


def to_dtype(tape: Tape, dtype: str) -> tuple:
    """(new tape, ids): ``tape`` recorded again in the float dtype ``dtype``; ``ids[i]``
    is the new node id of node ``i``'s value (a float node of another dtype there: see
    :func:`as_dtype`)."""
    if dtype not in FLOAT_DTYPES:
        raise TapeError(f"to_dtype: dtype must be 'f32' or 'f64', got {dtype!r}"[:200])
    if not tape.ok:
        raise TapeError(f"to_dtype: the tape is poisoned: {tape.error}")
    new = Tape()
    ids: list = []
    casts: dict = {}

    def float_input(i: int) -> GVar:
        k = ids[i]
        if dtype_of(new.values[k]) in (dtype, INT_DTYPE):
            return new.var(k)
        if k not in casts:
            casts[k] = new.cast(new.var(k), dtype).id
        return new.var(casts[k])

    for i, node in enumerate(tape.nodes):
        value = tape.values[i]
        if node.a < 0:
            if node.op == "param":
                v = new.param(value, name=node.name, l2=node.l2, dtype=dtype)
            elif tape.holds_ids(i):
                v = new.const(value, name=node.name, dtype=INT_DTYPE)
            elif node.name == RNG_NAME:
                v = new.const(value, name=node.name, dtype="f64")
            else:
                v = new.const(value, name=node.name, dtype=dtype)
            ids.append(v.id)
            continue
        if node.op == "cast":
            ids.append(float_input(node.a).id)
            continue
        spec = OPS[node.op]
        args = []
        for role, k in (("a", node.a), ("b", node.b)):
            if k < 0:
                continue
            keep = (role in spec.id_inputs or role in spec.dtype_free or spec.rng_input
                    or node.op == "to_f64" or (tape.integral[i] and tape.integral[k]))
            args.append(new.var(ids[k]) if keep else float_input(k))
        attrs = {at.name: node.aux[at.name] for at in spec.attrs
                 if node.aux and at.name in node.aux}
        v = new.record(node.op, *args, s=node.s, attrs=attrs)
        ids.append(v.id)
    return new, ids


def as_dtype(tape: Tape, ids: list, i: int, dtype: str) -> GVar:
    """Node ``i`` of the source tape in ``tape`` (from :func:`to_dtype`) with the float
    dtype ``dtype``: its converted node, or a cast of it (recorded once)."""
    v = tape.var(ids[i])
    if dtype_of(tape.values[v.id]) in (dtype, INT_DTYPE):
        return v
    return tape.cast(v, dtype)


def module_dtype(dtypes) -> Optional[str]:
    """The gradtool dtype of a torch module from the dtypes (names: "float32", ...) of its
    floating params, buffers and inputs: "f32" or "f64"; None for float16/bfloat16 (the
    caller refuses it without an explicit dtype); "f32" when there are none (torch's
    default dtype)."""
    names = set(dtypes)
    if names & {"float16", "bfloat16"}:
        return None
    if "float64" in names:
        return "f64"
    return "f32"


__all__ = ["to_dtype", "as_dtype", "module_dtype"]
