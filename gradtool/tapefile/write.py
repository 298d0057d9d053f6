"""Writing a tape file (format v1): a Tape as one msgpack map, byte-for-byte reproducible.

Keys in a fixed order, floats as float64, no timestamps.  Whatever :func:`dumps`
writes passes the reader's own checks (:mod:`gradtool.tapefile.checks`), run on
the bytes before they are returned, so whatever ``save`` writes, ``load`` reads.
"""

from __future__ import annotations

import numbers
from typing import Optional

import msgpack
import numpy as np

from ..errors import TapeError, TapeFileError
from ..fileio import atomic_write_bytes, check_binary_writer, is_path
from ..numerics import NUMERICS_VERSION
from ..ops import INT_DTYPE, LEAF_OPS, OPS
from ..tape import GVar, Tape
from .checks import FORMAT, VERSION, Limits, check, decode

_DEFAULT = Limits()

def save(tape: Tape, dest, *, loss=None, outputs=None, meta=None, values=False,
         optimizer=None, state=None) -> None:
    """Write ``tape`` as a v1 tape file.

    dest: a path (written atomically) or a binary file object.  loss: GVar or
    node id of a one-element node (default: the last node).  outputs: {name:
    GVar or id}.  meta: a msgpack-able dict (free-form).  values=True also
    stores every op node's current value, for ``gradtool backward --verify``.
    optimizer: a msgpack-able dict stored verbatim.  state: {slot name: output name},
    each a named float64 const that training overwrites after every step with that
    output's value (docs/format.md, "state").
    """
    write(dumps(tape, loss=loss, outputs=outputs, meta=meta, values=values,
                 optimizer=optimizer, state=state), dest)


def write(data: bytes, dest) -> None:
    """Tape-file bytes to a path (atomically) or a binary file object (anything else,
    a text stream included, is a DestinationError before a byte is written)."""
    if is_path(dest):
        atomic_write_bytes(dest, data)
    else:
        check_binary_writer(dest, "save")
        dest.write(data)


def dumps(tape: Tape, *, loss=None, outputs=None, meta=None, values=False,
          optimizer=None, state=None, limits: Optional[Limits] = None) -> bytes:
    """The bytes :func:`save` would write.

    The bytes pass :func:`load`'s checks under ``limits`` (default: the
    loader's defaults) or TapeError says which one fails.
    """
    if not isinstance(tape, Tape):
        raise TapeError(f"expected a Tape, got {type(tape).__name__}")
    if not tape.ok:
        raise TapeError(f"cannot save a poisoned tape: {tape.error}")
    if not tape.nodes:
        raise TapeError("cannot save an empty tape (a tape file needs at least one node)")
    loss_id = _node_id(tape, len(tape.nodes) - 1 if loss is None else loss, "loss")
    if tape.values[loss_id].size != 1:
        raise TapeError(f"loss node {loss_id} has shape {list(tape.values[loss_id].shape)}; "
                        f"a tape file's loss must have one element (pass loss=...)")
    doc = {"format": FORMAT, "version": VERSION,
           "nodes": [_encode_node(tape, i, values) for i in range(len(tape.nodes))],
           "loss": loss_id}
    if outputs:
        doc["outputs"] = {_output_name(k): _node_id(tape, v, f"output {k!r}")
                          for k, v in outputs.items()}
    if state:
        doc["state"] = {_output_name(k, "state slot names"): _output_name(v, "state outputs")
                        for k, v in state.items()}
    if meta:
        doc["meta"] = _mapping(meta, "meta")
    if optimizer is not None:
        doc["optimizer"] = _mapping(optimizer, "optimizer")
    if values:            # which arithmetic the stored values came from (numerics.py)
        doc["numerics"] = NUMERICS_VERSION
    try:
        raw = msgpack.packb(doc, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TapeError(f"meta/optimizer cannot be written as msgpack: {exc}") from None
    # whatever save writes, load reads: the writer runs the reader's own checks (not the
    # replay) on the bytes, so a limit exists once, in the reader
    try:
        check(decode(raw, "<save>", limits or _DEFAULT), "<save>", limits or _DEFAULT)
    except TapeFileError as exc:
        raise TapeError(f"cannot save: gradtool.load would refuse the file: "
                        f"{str(exc).removeprefix('<save>: ')}") from None
    return raw


def _encode_node(tape: Tape, i: int, values: bool) -> dict:
    node, value = tape.nodes[i], tape.values[i]
    # Key order is fixed here; msgpack keeps dict order, so output is reproducible.
    out = {"op": node.op, "a": int(node.a), "b": int(node.b), "s": float(node.s),
           "shape": [int(d) for d in value.shape]}
    if node.op in LEAF_OPS:
        if node.name:
            out["name"] = node.name
        if node.op == "param":
            out["l2"] = float(node.l2)
        if tape.holds_ids(i):
            out["dtype"] = INT_DTYPE
        elif value.dtype == np.float32:
            out["dtype"] = "f32"
        out["data"] = _le_bytes(value)
        return out
    aux = node.aux or {}
    for at in OPS[node.op].attrs:
        # a reshape's target IS the node's shape; an optional attribute at its default
        # is absent from aux and from the file
        if at.stored and at.name in aux:
            attr = aux[at.name]
            if at.kind in ("axis", "count", "natural"):
                out[at.name] = int(attr)
            elif at.kind == "flag":
                out[at.name] = bool(attr)
            elif at.kind == "dtype":
                out[at.name] = str(attr)
            else:
                out[at.name] = [int(x) for x in attr]
    if values:
        out["value"] = _le_bytes(value, wide=True)
    return out


def _le_bytes(arr: np.ndarray, wide: bool = False) -> bytes:
    """Little-endian bytes: int64 for ids, float32 for f32 data, float64 for everything
    else (``wide``: float32 values widened to float64, exactly: a stored op value)."""
    if arr.dtype == np.int64:
        code = "<i8"
    else:
        code = "<f4" if arr.dtype == np.float32 and not wide else "<f8"
    return np.ascontiguousarray(arr, dtype=code).tobytes()


def _node_id(tape: Tape, ref, what: str) -> int:
    if isinstance(ref, GVar):
        return tape.node_id(ref, what)
    if isinstance(ref, bool) or not isinstance(ref, numbers.Integral) \
            or not 0 <= int(ref) < len(tape.nodes):
        raise TapeError(f"{what}: {ref!r} is not a node of this tape "
                        f"(it has {len(tape.nodes)} nodes)")
    return int(ref)


def _output_name(name, what: str = "output names") -> str:
    if not isinstance(name, str) or not name:
        raise TapeError(f"{what} must be non-empty strings, got {name!r}")
    return name


def _mapping(value, what: str) -> dict:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise TapeError(f"{what} must be a dict with string keys, got {type(value).__name__}")
    return value




__all__ = ["save", "dumps", "write"]
