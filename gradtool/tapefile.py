"""Tape files, format v1: write a Tape as one msgpack map, read one back.

The format (``docs/format.md``; schema ``schemas/tape.schema.json``) is an
interchange contract: any program that writes one msgpack map with the keys
below produces a file gradtool loads.

    {"format": "gradtool-tape", "version": 1,
     "nodes": [{"op", "a", "b", "s", "shape", "data"|"value", "name", "l2", "dtype",
                "axis", "keepdims", "starts", "stops"}, ...],
     "loss": id, "outputs": {name: id}, "meta": {...}, "optimizer": {...}}

Writing is byte-for-byte reproducible: keys in a fixed order, floats as
float64, no timestamps.  Reading never trusts the file: every check in
:mod:`gradtool.tapefile_checks` passes before any value is allocated, and
then op values are recomputed from the leaves with the op table's forward
rules and appended as the Tape's recording methods append them, so a loaded
tape is exactly the tape recording would have produced (requires flags,
names, l2, aux dicts and all; ``tests/test_tapefile.py`` compares them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import numbers
import os
from typing import Optional

import msgpack
import numpy as np

from .errors import TapeError, TapeFileError
from .fileio import atomic_write_bytes
from .ops import INT_DTYPE, LEAF_OPS, OPS
from .tape import GVar, Tape, ieee_silent
from .tapefile_checks import FORMAT, VERSION, CheckedFile, Limits, check, decode

__all__ = ["FORMAT", "VERSION", "Limits", "TapeFile", "save", "dumps", "load"]

_DEFAULT = Limits()


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
        _write(self.dumps(values=values), dest)


# ── writing ────────────────────────────────────────────────────────────────

def save(tape: Tape, dest, *, loss=None, outputs=None, meta=None, values=False,
         optimizer=None) -> None:
    """Write ``tape`` as a v1 tape file.

    dest: a path (written atomically) or a binary file object.  loss: GVar or
    node id of a one-element node (default: the last node).  outputs: {name:
    GVar or id}.  meta: a msgpack-able dict (free-form).  values=True also
    stores every op node's current value, for ``gradtool backward --verify``.
    optimizer: a msgpack-able dict stored verbatim.
    """
    _write(dumps(tape, loss=loss, outputs=outputs, meta=meta, values=values,
                 optimizer=optimizer), dest)


def _write(data: bytes, dest) -> None:
    if isinstance(dest, (str, os.PathLike)):
        atomic_write_bytes(dest, data)
    else:
        dest.write(data)


def dumps(tape: Tape, *, loss=None, outputs=None, meta=None, values=False,
          optimizer=None, limits: Optional[Limits] = None) -> bytes:
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
    if meta:
        doc["meta"] = _mapping(meta, "meta")
    if optimizer is not None:
        doc["optimizer"] = _mapping(optimizer, "optimizer")
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
        out["data"] = _le_bytes(value)
        return out
    aux = node.aux or {}
    for at in OPS[node.op].attrs:
        # a reshape's target IS the node's shape; an optional attribute at its default
        # is absent from aux and from the file
        if at.stored and at.name in aux:
            attr = aux[at.name]
            if at.kind == "axis":
                out[at.name] = int(attr)
            elif at.kind == "flag":
                out[at.name] = bool(attr)
            else:
                out[at.name] = [int(x) for x in attr]
    if values:
        out["value"] = _le_bytes(value)
    return out


def _le_bytes(arr: np.ndarray) -> bytes:
    """Little-endian bytes: int64 for ids, float64 for everything else."""
    return np.ascontiguousarray(arr, dtype="<i8" if arr.dtype == np.int64 else "<f8").tobytes()


def _node_id(tape: Tape, ref, what: str) -> int:
    if isinstance(ref, GVar):
        return tape.node_id(ref, what)
    if isinstance(ref, bool) or not isinstance(ref, numbers.Integral) \
            or not 0 <= int(ref) < len(tape.nodes):
        raise TapeError(f"{what}: {ref!r} is not a node of this tape "
                        f"(it has {len(tape.nodes)} nodes)")
    return int(ref)


def _output_name(name) -> str:
    if not isinstance(name, str) or not name:
        raise TapeError(f"output names must be non-empty strings, got {name!r}")
    return name


def _mapping(value, what: str) -> dict:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise TapeError(f"{what} must be a dict with string keys, got {type(value).__name__}")
    return value


# ── reading ────────────────────────────────────────────────────────────────

def load(src, *, name: Optional[str] = None, max_elements: int = _DEFAULT.max_elements,
         limits: Optional[Limits] = None) -> TapeFile:
    """Read and validate a tape file, then replay it into a fresh Tape.

    src: a path, bytes, or a binary file object.  name: what error messages
    call the file (default: the path, or ``<stdin>`` for a file object).
    max_elements bounds the total element count of all nodes; ``limits``
    (a :class:`Limits`) sets every bound at once.  Raises TapeFileError,
    whose message reads ``FILE: node N: field 'x': problem``.
    """
    limits = limits or _DEFAULT
    if max_elements != _DEFAULT.max_elements:
        limits = dataclasses.replace(limits, max_elements=max_elements)
    raw, source = _read(src, name, limits)
    with gc_paused():
        checked = check(decode(raw, source, limits), source, limits)
        return _replay(checked, source)


@contextlib.contextmanager
def gc_paused():
    """Python's cycle collector off for a while: a tape of a million nodes is millions of
    new containers, and the collector would walk them all again and again (it frees
    nothing here: decoded files and tapes hold no reference cycles)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _read(src, name: Optional[str], limits: Limits) -> tuple:
    if isinstance(src, (bytes, bytearray, memoryview)):
        raw, source = bytes(src), name or "<bytes>"
    elif isinstance(src, (str, os.PathLike)):
        source = name or os.fspath(src)
        try:
            with open(src, "rb") as f:
                raw = _read_bounded(f, source, limits)
        except OSError as exc:
            raise TapeFileError(f"cannot read: {exc.strerror or exc}", source=source) from None
    elif hasattr(src, "read"):
        source = name or "<stdin>"
        try:
            raw = _read_bounded(src, source, limits)
        except OSError as exc:
            raise TapeFileError(f"cannot read: {exc.strerror or exc}", source=source) from None
    else:
        raise TapeError(f"load: expected a path, bytes or a binary file, got {type(src).__name__}")
    if len(raw) > limits.max_bytes:
        raise TapeFileError(f"{len(raw)} bytes, over this reader's limit of {limits.max_bytes}",
                            source=source)
    return raw, source


_CHUNK = 1 << 24


def _read_bounded(f, source: str, limits: Limits) -> bytes:
    """Never more than the limit plus one byte, in chunks: ``f.read(limit + 1)`` would
    ask for a buffer of the limit's size (1 GiB) whatever the file holds."""
    chunks, total = [], 0
    while total <= limits.max_bytes:
        chunk = f.read(min(_CHUNK, limits.max_bytes + 1 - total))
        if isinstance(chunk, str):
            raise TapeFileError("opened in text mode; tape files are binary", source=source)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limits.max_bytes:
        raise TapeFileError(f"larger than this reader's limit of {limits.max_bytes} bytes",
                            source=source)
    return b"".join(chunks)


def _replay(checked: CheckedFile, source: str) -> TapeFile:
    """Build the Tape from the validated nodes: leaves through ``param``/``const``, op
    values recomputed by the op table's forward rules and appended by
    ``Tape._append_op``, as ``Tape._record`` appends them.  Every check ``_record`` would
    repeat (handles, shapes, ids) has passed in :mod:`gradtool.tapefile_checks`
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
            value = OPS[op].forward(values[a], values[b] if b >= 0 else None, node.s,
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
