"""Training data: DATA.npz arrays matched to a tape's input slots, splits, epoch orders.

A tape's input slots are its named consts.  DATA.npz holds one array per
slot, with the same name, examples along axis 0; every other dim must equal
the slot's.  A slot of integer ids (a const with dtype i64) takes an integer
array only, every id in the range of every op reading it: float ids are
refused, even whole ones.  The batch size is the slots' (common) leading dim.  Arrays in
the file that name no slot are ignored.

Validation data is, in order of precedence, a separate file with the same
layout (``--val``), the LAST ``floor(fraction * N)`` examples of DATA
(``--val-split``, so the split never depends on the shuffle seed), or
arrays named ``<slot>_val`` in DATA itself (one for every slot).

An epoch visits ``N // batch`` batches; the last partial batch is dropped.
The visiting order of epoch ``e`` (0-based, counted over the whole life of
a saved file) is ``np.random.Generator(np.random.PCG64([seed, e])).permutation(N)``
with shuffling on, ``0..N-1`` with it off: any epoch's order can be rebuilt
on its own, which is what makes a resumed run identical to a straight one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..budget import DEFAULT_MEMORY, human_bytes, prod
from ..errors import GradtoolError
from ..npzio import NpzArchive
from ..ops import bad_id, format_shape, inexact_int


class DataError(GradtoolError):
    """Training data that does not fit the tape's input slots."""


@dataclass(frozen=True)
class Slot:
    name: str
    node_id: int
    shape: tuple
    id_bounds: tuple = ()      # ids slots: (node, bound) per op reading them; () for floats
    ids: bool = False
    as_values: bool = False    # integer data some op reads as float64 values (comparisons)
    dtype: str = "f64"         # a float slot's dtype: "f32" takes its data rounded once


@dataclass
class Dataset:
    """Arrays keyed by slot name, all with ``count`` examples along axis 0."""

    arrays: dict
    count: int
    source: str

    def take(self, start: int, stop: int) -> "Dataset":
        return Dataset({k: a[start:stop] for k, a in self.arrays.items()}, stop - start,
                       self.source)


def input_slots(tape, state=()) -> list:
    """The tape's named consts as Slots, with a common batch size (their leading dim).

    ``state``: the names of the file's state slots (its ``state`` map), which training
    carries from step to step instead of filling from the data: they are left out."""
    slots = [Slot(tape.nodes[v.id].name, v.id, tuple(tape.values[v.id].shape),
                  tuple(tape.id_bounds(v.id)), tape.holds_ids(v.id),
                  tape.holds_ids(v.id) and tape.read_as_values(v.id),
                  "f32" if tape.values[v.id].dtype == np.float32 else "f64")
             for v in tape.input_slots() if tape.nodes[v.id].name not in state]
    if not slots:
        raise DataError("the tape has no input slots (named consts) to feed training data into")
    sizes = {s.shape[0] for s in slots}
    if len(sizes) > 1:
        listing = ", ".join(f"{s.name} {format_shape(s.shape)}" for s in slots)
        raise DataError(f"input slots disagree on the batch size (leading dim): {listing}")
    return slots


def batch_size(slots) -> int:
    return slots[0].shape[0]


VAL_SUFFIX = "_val"


def has_val_arrays(raw: dict, slots) -> bool:
    """Whether DATA carries its own validation set: ``<slot>_val`` for every slot."""
    present = [s.name + VAL_SUFFIX in raw for s in slots]
    if any(present) and not all(present):
        missing = [s.name + VAL_SUFFIX for s, p in zip(slots, present) if not p]
        raise DataError(f"validation arrays are incomplete: {', '.join(missing)} missing "
                        f"(give every slot a '<slot>{VAL_SUFFIX}' array, or none)")
    return all(present)


def load_dataset(path, slots, max_bytes: int = DEFAULT_MEMORY) -> Dataset:
    """Read an .npz and check one array per slot: [N, *slot.shape[1:]], equal N."""
    with NpzArchive(path) as raw:
        return dataset_from(raw, slots, max_bytes=max_bytes)


def dataset_from(raw: NpzArchive, slots, suffix: str = "",
                 max_bytes: int = DEFAULT_MEMORY) -> Dataset:
    """The arrays named ``<slot><suffix>``, checked against the slots' shapes from their
    headers before any of them is read, and together (8 bytes per element) within
    ``max_bytes``.
    Arrays that name no slot are never looked at."""
    source = raw.source
    for s in slots:
        key = s.name + suffix
        if key not in raw:
            raise DataError(f"{source}: no array {key!r} for input slot {s.name!r} "
                            f"(node {s.node_id}, shape {format_shape(s.shape)}); the file has "
                            f"{', '.join(raw) or 'no arrays'}")
        a = raw[key]
        want = "[N" + "".join(f",{d}" for d in s.shape[1:]) + "]"
        if a.ndim != len(s.shape) or tuple(a.shape[1:]) != s.shape[1:]:
            raise DataError(f"{source}: array {key!r} has shape {format_shape(a.shape)}, but input "
                            f"slot {s.name!r} (node {s.node_id}) has shape {format_shape(s.shape)}, so "
                            f"the array must be {want}")
        if a.dtype.kind not in "biuf":
            raise DataError(f"{source}: array {key!r} has dtype {a.dtype}; expected numbers")
        if s.ids and a.dtype.kind not in "iu":
            hint = ("; float ids are refused, even whole ones: store integers "
                    "(.astype(np.int64))" if a.dtype.kind == "f" else "")
            raise DataError(f"{source}: array {key!r} has dtype {a.dtype}, but input slot "
                            f"{s.name!r} (node {s.node_id}) takes integer ids{hint}")
    counts = {s.name + suffix: raw[s.name + suffix].shape[0] for s in slots}
    if len(set(counts.values())) > 1:
        listing = ", ".join(f"{k} {n}" for k, n in counts.items())
        raise DataError(f"{source}: arrays have different example counts (axis 0): {listing}")
    need = sum(8 * prod(raw[key].shape) for key in counts)
    if need > max_bytes:
        listing = ", ".join(f"{key} {format_shape(raw[key].shape)}" for key in counts)
        raise DataError(f"{source}: the input slots' arrays ({listing}) take "
                        f"{human_bytes(need)} as float64 or int64, over the memory limit of "
                        f"{human_bytes(max_bytes)} (gradtool --max-memory SIZE raises it)")
    arrays = {s.name: _slot_array(raw.load(s.name + suffix), s, s.name + suffix, source)
              for s in slots}
    return Dataset(arrays, next(iter(counts.values())), source)


def _slot_array(a: np.ndarray, slot: Slot, key: str, source: str) -> np.ndarray:
    """The array as the slot takes it: float64 (float32 for an f32 slot: float64 data
    rounded to float32 once, here; float32 and integer data as they are, exactly up to
    2^24), or int64 ids all in range."""
    if not slot.ids:
        with np.errstate(over="ignore"):
            return np.ascontiguousarray(a, dtype=np.float32 if slot.dtype == "f32"
                                        else np.float64)
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise DataError(f"{source}: array {key!r}: id {int(a.max())} does not fit in an int64")
    ids = np.ascontiguousarray(a, dtype=np.int64)
    for node, bound in slot.id_bounds:
        problem = bad_id(ids, bound)
        if problem:
            raise DataError(f"{source}: array {key!r}: {problem}, the range of the "
                            f"{bound}-row table that node {node} reads")
    if slot.as_values and inexact_int(ids):
        raise DataError(f"{source}: array {key!r}: {inexact_int(ids)}")
    return ids


def split_validation(data: Dataset, fraction: float) -> tuple:
    """(train, validation): the validation part is the last floor(fraction * N) examples."""
    if not 0.0 < fraction < 1.0:
        raise DataError(f"validation split must be between 0 and 1, got {fraction!r}")
    n_val = math.floor(fraction * data.count)
    return data.take(0, data.count - n_val), data.take(data.count - n_val, data.count)


def require_batches(data: Dataset, batch: int, what: str,
                    unit: str = "the input slots' leading dim") -> int:
    """The number of full batches in ``data``; at least one, or a clear error."""
    if data.count < batch:
        raise DataError(f"{data.source}: {what} has {data.count} examples, fewer than one "
                        f"batch of {batch} ({unit})")
    return data.count // batch


def epoch_order(seed: int, epoch: int, count: int, shuffle: bool) -> np.ndarray:
    """The example order of one epoch (see the module docstring)."""
    if not shuffle:
        return np.arange(count)
    return np.random.Generator(np.random.PCG64([seed, epoch])).permutation(count)


# ── the gradient summed over a dataset ────────────────────────────────────

@dataclass
class GradientSum:
    """``loss``: the serial sum of the batch losses; ``grads``: param node id -> the
    serial sum of its batch gradients; ``batches``/``examples``: how many were replayed."""

    loss: float
    grads: dict
    batches: int
    examples: int


def gradient_sum(tape, loss, data: Dataset, slots) -> GradientSum:
    """Replay ``data`` one batch at a time, in example order, and sum the results.

    Each batch (the slots' leading dim; one example for a scalar tape) is
    written into the input slots, the tape is replayed forward and backward
    from ``loss``, and every param's gradient is added into its sum as
    ``acc = acc + g`` (each sum starting at +0.0; an untouched param adds
    zeros), the loss likewise: the order a worker that calls
    ``swarm_g_add(g, j, val)`` once per example and param accumulates in.
    Every example must be used: a count that is not a multiple of the batch
    is a DataError, not a silently dropped remainder.  With no slots, every
    one of ``data.count`` batches replays the recorded leaves.
    """
    batch = batch_size(slots) if slots else 1
    n = require_batches(data, batch, "DATA")
    if data.count % batch:
        raise DataError(f"{data.source}: {data.count} examples are not a whole number of "
                        f"batches of {batch} (the input slots' leading dim)")
    params = tape.params()
    sums = {p.id: np.zeros(tape.values[p.id].shape) for p in params}
    total = 0.0
    for k in range(n):
        rows = slice(k * batch, (k + 1) * batch)
        for s in slots:
            tape.set_value(tape.var(s.node_id), data.arrays[s.name][rows])
        tape.forward()
        tape.zero_grad()
        tape.backward(loss)
        total = total + float(tape.values[loss.id].reshape(-1)[0])
        with np.errstate(all="ignore"):          # inf + -inf = nan, as in C
            for p in params:
                np.add(sums[p.id], tape.grad(p), out=sums[p.id])
    return GradientSum(total, sums, n, n * batch)


# ── --accuracy OUTPUT:TARGET ───────────────────────────────────────────────

@dataclass(frozen=True)
class AccuracySpec:
    output: str
    output_id: int
    target: str
    one_hot: bool


def parse_accuracy(spec: str, outputs: dict, slots, tape) -> AccuracySpec:
    """Check ``OUTPUT:TARGET``: OUTPUT a file output of shape [B, C>=2], TARGET a slot
    holding one-hot rows [B, C] or integer labels [B] / [B, 1]."""
    out_name, sep, target = str(spec).partition(":")
    if not sep or not out_name or not target:
        raise DataError(f"accuracy {spec!r}: expected OUTPUT:TARGET, e.g. logits:y")
    if out_name not in outputs:
        raise DataError(f"accuracy {spec!r}: the tape file has no output {out_name!r} "
                        f"(outputs: {', '.join(sorted(outputs)) or 'none'})")
    by_name = {s.name: s for s in slots}
    if target not in by_name:
        raise DataError(f"accuracy {spec!r}: {target!r} is not an input slot "
                        f"(slots: {', '.join(by_name)})")
    out_id = outputs[out_name].id
    oshape = tuple(tape.values[out_id].shape)
    tshape = by_name[target].shape
    batch = tshape[0]
    if len(oshape) != 2 or oshape[0] != batch or oshape[1] < 2:
        raise DataError(f"accuracy {spec!r}: output {out_name!r} (node {out_id}) has shape "
                        f"{format_shape(oshape)}; expected [{batch},C] with C >= 2 classes")
    if tshape == oshape:
        one_hot = True
    elif tshape in ((batch,), (batch, 1)):
        one_hot = False
    else:
        raise DataError(f"accuracy {spec!r}: target slot {target!r} has shape {format_shape(tshape)}; "
                        f"expected one-hot {format_shape(oshape)} or labels [{batch}] / [{batch},1]")
    return AccuracySpec(out_name, out_id, target, one_hot)


def count_correct(spec: AccuracySpec, output: np.ndarray, target: np.ndarray) -> int:
    """How many rows' argmax (first maximum) matches the target class."""
    predicted = np.argmax(output, axis=1)
    if spec.one_hot:
        labels = np.argmax(target, axis=1)
    else:
        labels = np.rint(target.reshape(-1)).astype(np.int64)
    return int(np.count_nonzero(predicted == labels))
