"""What a loaded tape file holds, for people and programs: the summary ``inspect``
prints (:func:`summary`, JSON-ready), the Graphviz rendering (:func:`to_dot`), and the
check of a file's recorded values against the replay (:func:`first_mismatch`).
The command line formats these; nothing here prints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from operator import attrgetter
from typing import Optional

import numpy as np

from . import rowtext
from .errors import GradtoolError
from .ops import dtype_of, format_shape
from .tapefile import TapeFile
from .tapefile.read import gc_paused


def node_entry(tape, i: int) -> dict:
    """One node as `inspect --json` lists it."""
    n = tape.nodes[i]
    entry = {"id": i, "op": n.op, "a": n.a, "b": n.b, "shape": list(tape.values[i].shape)}
    if n.op in ("adds", "muls"):
        entry["s"] = n.s
    if n.aux and n.op != "reshape":
        entry.update(n.aux)
    if n.name:
        entry["name"] = n.name
    if n.op == "param":
        entry["l2"] = n.l2
    if n.a < 0 and dtype_of(tape.values[i]) != "f64":     # an ids const, an f32 leaf
        entry["dtype"] = dtype_of(tape.values[i])
    return entry


def plain_node(n) -> bool:
    """Whether :func:`node_entry` has nothing beyond id, op, inputs and shape (an op
    without attributes: a leaf is named, a param has l2, an ids const a dtype)."""
    return not (n.name or n.aux or n.op in ("adds", "muls", "param", "const"))


_OP, _A, _B = attrgetter("op"), attrgetter("a"), attrgetter("b")
_NAME, _AUX, _SHAPE = attrgetter("name"), attrgetter("aux"), attrgetter("shape")
_INT = frozenset((int,))
_NOT_PLAIN = frozenset(("adds", "muls", "param", "const"))


def _tape_of(tf):
    if not isinstance(tf, TapeFile):
        raise GradtoolError(f"expected a loaded tape file (gradtool.load), got "
                            f"{type(tf).__name__}")
    return tf.tape


def summary(tf: TapeFile, nodes: bool = True) -> dict:
    """Everything `inspect` reports, as JSON-ready data (``nodes=False``: all but the
    node list)."""
    return _summary(tf, Columns.of(tf), nodes)


def _summary(tf: TapeFile, cols: "Columns", nodes: bool) -> dict:
    tape = tf.tape
    loss_id = tf.loss.id
    ops, records, values = cols.ops, tape.nodes, tape.values
    summary = {
        "file": tf.source,
        "format": "gradtool-tape",
        "version": 1,
        "node_count": len(tape.nodes),
        "ops": cols.op_counts(),
        # the ids of tape.params() and tape.input_slots(), found by list.index
        "params": [{"id": i, "name": records[i].name, "shape": list(values[i].shape),
                    "elements": int(values[i].size), "l2": records[i].l2,
                    "dtype": dtype_of(values[i])}
                   for i in _positions(ops, "param")],
        "inputs": [{"id": i, "name": records[i].name, "shape": list(values[i].shape),
                    "dtype": dtype_of(values[i])}
                   for i in _positions(ops, "const")
                   if records[i].name and records[i].name not in tf.state],
        "outputs": [{"name": k, "id": v.id, "op": tape.nodes[v.id].op, "shape": list(v.shape)}
                    for k, v in tf.outputs.items()],
        "loss": {"id": loss_id, "op": tape.nodes[loss_id].op,
                 "value": shortest(tape.values[loss_id])[0]},
        "meta": json_safe(tf.meta),
    }
    if tf.state:                    # named consts that training carries, not input slots
        slots = {tape.nodes[c.id].name: c for c in tape.input_slots()}
        summary["state"] = [{"name": k, "id": slots[k].id, "shape": list(slots[k].shape),
                             "output": v} for k, v in tf.state.items()]
    if nodes:
        summary["nodes"] = [node_entry(tape, i) for i in range(len(tape.nodes))]
    return summary


def _positions(items: list, item) -> list:
    """The indices where ``item`` is in ``items``, in order (list.index: no Python code
    per element)."""
    found, i = [], -1
    try:
        while True:
            i = items.index(item, i + 1)
            found.append(i)
    except ValueError:
        return found


class Columns:
    """A tape's nodes as columns, each made in one pass of C code over the nodes (a
    million nodes are a million Python objects): the op of each node (``ops``) and its
    index in ``op_names`` (``op_code``); when every input id is an int (a tape recorded
    or loaded here; ``ints``), the inputs ``a`` and ``b`` as int64, the distinct value
    shapes (``shapes``) and each node's index in it (``shape_code``), and the nodes with
    more than id, op, inputs and shape (``special``: see :func:`plain_node`).  Names and
    shapes are in the order of their first node.

    ``runs``: the tape's runs as the loader replayed them (:meth:`TapeFile.loaded_runs`):
    then only the nodes outside them are read (:meth:`_from_runs`)."""

    def __init__(self, tape, runs=None):
        self.n = len(tape.nodes)
        if runs is None or not self._from_runs(tape, runs):
            self._from_nodes(tape)

    @classmethod
    def of(cls, tf: TapeFile) -> "Columns":
        """The columns of a loaded file's tape, from the loader's runs while they hold."""
        return cls(_tape_of(tf), tf.loaded_runs())

    def _from_nodes(self, tape) -> None:
        nodes, n = tape.nodes, self.n
        self.ops = list(map(_OP, nodes))
        self.op_names = list(dict.fromkeys(self.ops))
        index = {op: k for k, op in enumerate(self.op_names)}
        self.op_code = np.fromiter(map(index.__getitem__, self.ops), dtype=np.intp, count=n)
        a, b = list(map(_A, nodes)), list(map(_B, nodes))
        self.ints = n > 0 and set(map(type, a)) <= _INT and set(map(type, b)) <= _INT
        if not self.ints:
            return
        self.a, self.b = np.array(a, dtype=np.int64), np.array(b, dtype=np.int64)
        shapes = list(map(_SHAPE, tape.values))
        self.shapes = list(dict.fromkeys(shapes))
        index = {shape: k for k, shape in enumerate(self.shapes)}
        self.shape_code = np.fromiter(map(index.__getitem__, shapes), dtype=np.intp,
                                      count=n)
        special = np.isin(self.op_code, [k for k, op in enumerate(self.op_names)
                                         if op in _NOT_PLAIN])
        for column in (list(map(_NAME, nodes)), list(map(_AUX, nodes))):
            if column.count(None) < n:      # a name or attributes somewhere
                special |= np.fromiter(map(bool, column), dtype=bool, count=n)
        self.special = np.flatnonzero(special).tolist()

    def _from_runs(self, tape, runs) -> bool:
        """The columns with the runs' nodes taken from ``runs`` (each is
        ``Node(op, a, -1, s)``, special only where the op is adds or muls), the other
        nodes read as :meth:`_from_nodes` reads them; False where one of these has an
        input id not an int."""
        nodes, values, n = tape.nodes, tape.values, self.n
        others = np.ones(n, dtype=bool)
        for start, stop in runs.runs:
            others[start:stop] = False
        others = np.flatnonzero(others)
        rest = list(map(nodes.__getitem__, others.tolist()))
        a, b = list(map(_A, rest)), list(map(_B, rest))
        if not (set(map(type, a)) <= _INT and set(map(type, b)) <= _INT):
            return False
        self.ints = True
        self.a = runs.a.copy()
        self.a[others] = a
        self.b = np.full(n, -1, dtype=np.int64)
        self.b[others] = b
        # ops: a run's node by its code (the index in names), the others' added after
        rest_ops = list(map(_OP, rest))
        index = dict.fromkeys(runs.code_ops)
        index.update(dict.fromkeys(rest_ops))
        index = {op: k for k, op in enumerate(index)}
        code = runs.code.copy()
        code[others] = list(map(index.__getitem__, rest_ops))
        self.op_names, self.op_code = _first_seen(list(index), code)
        self.ops = np.array(self.op_names, dtype=object)[self.op_code].tolist()
        # shapes: the runs' table (None: a shape no node of a run has), the others' added
        table = list(runs.shapes)
        index = {shape: k for k, shape in enumerate(table) if shape is not None}
        rest_shapes = list(map(_SHAPE, map(values.__getitem__, others.tolist())))
        for shape in dict.fromkeys(rest_shapes):
            if shape not in index:
                index[shape] = len(table)
                table.append(shape)
        code = runs.shape_id.copy()
        code[others] = list(map(index.__getitem__, rest_shapes))
        self.shapes, self.shape_code = _first_seen(table, code)
        special = np.array([op in _NOT_PLAIN for op in self.op_names])[self.op_code]
        special[others] |= np.fromiter((bool(nd.name or nd.aux) for nd in rest),
                                       dtype=bool, count=len(rest))
        self.special = np.flatnonzero(special).tolist()
        return True

    def op_counts(self) -> dict:
        """The op histogram, by op name."""
        counts = np.bincount(self.op_code, minlength=len(self.op_names)).tolist()
        return dict(sorted(zip(self.op_names, counts)))


def _first_seen(table: list, code: np.ndarray) -> tuple:
    """The entries of ``table`` that ``code`` (a nonempty int array) refers to, in the
    order of their first position in it, and ``code`` renumbered to that list (the first
    position of a code is one where the code changes)."""
    changes = np.flatnonzero(code[1:] != code[:-1]) + 1
    seen = list(dict.fromkeys(code[np.concatenate(([0], changes))].tolist()))
    renumber = np.zeros(len(table), dtype=np.intp)
    renumber[seen] = np.arange(len(seen))
    return [table[k] for k in seen], renumber[code]


def summary_json(tf: TapeFile) -> str:
    """``json.dumps(summary(tf))``, the same text, at a fraction of the time for a tape of
    a million nodes: the nodes with nothing beyond id, op, inputs and shape (see
    :func:`plain_node`) are written by columns (:mod:`gradtool.rowtext`) instead of built
    as dicts and encoded (``tests/test_cli_tapes.py`` compares the two texts on every
    sample)."""
    return b"".join(summary_json_parts(tf)).decode("ascii")


def summary_head(tf: TapeFile, cols: "Columns") -> dict:
    """``summary(tf, nodes=False)`` from the tape's columns (made once for the summary
    and the node list)."""
    _tape_of(tf)
    return _summary(tf, cols, nodes=False)


def summary_json_parts(tf: TapeFile) -> list:
    """:func:`summary_json` as bytes to join (JSON is ASCII)."""
    with gc_paused():               # a million new strings and tuples, no cycles
        return _summary_json(tf)


def _summary_json(tf: TapeFile) -> list:
    tape = _tape_of(tf)
    cols = Columns.of(tf)
    if not cols.ints:               # not a tape recorded here: every node in full
        return [json.dumps(_summary(tf, cols, nodes=True)).encode("ascii")]
    head = json.dumps(_summary(tf, cols, nodes=False))
    n = cols.n
    fields = [rowtext.const('{"id": '), rowtext.integers(np.arange(n)),
              rowtext.lookup([f', "op": {json.dumps(op)}, "a": ' for op in cols.op_names],
                             cols.op_code),
              rowtext.integers(cols.a), rowtext.const(', "b": '), rowtext.integers(cols.b),
              rowtext.lookup([f', "shape": {json.dumps(list(shape))}}}' for shape in cols.shapes],
                             cols.shape_code)]
    others = {i: json.dumps(node_entry(tape, i)).encode("ascii") for i in cols.special}
    return [f'{head[:-1]}, "nodes": ['.encode("ascii"),
            *rowtext.render(n, fields, ", ", others), b"]}"]


def shortest(values: np.ndarray) -> list:
    """``values`` as Python floats that print (repr, JSON) as their shortest exact text:
    float64 values as they are; float32 values as the shortest decimal that reads back
    as the same float32 (numpy's Dragon4), e.g. 0.1 rather than 0.10000000149011612
    (both denote float32(0.1); the first is what torch and numpy print)."""
    flat = np.ravel(values)
    if flat.dtype != np.float32:
        return flat.tolist()
    return [float(np.format_float_positional(v, unique=True, trim="-"))
            if np.isfinite(v) else float(v) for v in flat]


def json_safe(value):
    """meta as JSON: msgpack bin becomes a "<N bytes>" placeholder."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return value


_DOT_STYLE = {
    "param": 'shape=box, style=filled, fillcolor="#fde2b8"',
    "const": 'shape=box, style="filled,dashed", fillcolor="#e4e4e4"',
    "op": 'shape=ellipse',
}


def _dot_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def to_dot(tf: TapeFile) -> str:
    """Graphviz DOT: params orange boxes, consts grey dashed boxes, ops ellipses, the loss
    a red double octagon; edges run from input to consumer, labelled a/b for binary ops."""
    tape = _tape_of(tf)
    out_names = {}
    for name, v in tf.outputs.items():
        out_names.setdefault(v.id, []).append(name)
    lines = ["digraph tape {", "  rankdir=TB;",
             '  node [fontname="Helvetica", fontsize=10];', '  edge [fontsize=8];']
    for i, n in enumerate(tape.nodes):
        head = f"{i}: {n.op}"
        if n.name:
            head += f" {n.name}"
        if n.op in ("adds", "muls"):
            head += f" {n.s!r}"
        if n.aux and n.op != "reshape":
            head += " " + " ".join(f"{k}={v}" for k, v in n.aux.items())
        label = head + "\n" + format_shape(tape.values[i].shape)
        if i in out_names:
            label += "\noutput " + ", ".join(out_names[i])
        style = _DOT_STYLE.get(n.op, _DOT_STYLE["op"])
        if i == tf.loss.id:
            label += "\nloss"
            style = 'shape=doubleoctagon, style=filled, fillcolor="#f4b6b6"'
        lines.append(f'  n{i} [label="{_dot_text(label)}", {style}];')
    for i, n in enumerate(tape.nodes):
        if n.b >= 0:
            lines.append(f'  n{n.a} -> n{i} [label="a"];')
            lines.append(f'  n{n.b} -> n{i} [label="b"];')
        elif n.a >= 0:
            lines.append(f"  n{n.a} -> n{i};")
    lines.append("}")
    return "\n".join(lines) + "\n"




@dataclass(frozen=True)
class Mismatch:
    """The first op node whose replayed value differs from the value the file recorded."""

    node: int
    op: str
    count: int             # differing elements
    size: int              # elements
    index: int             # the first differing flat index
    replayed: float
    recorded: float

    def describe(self) -> str:
        return (f"node {self.node} ({self.op}): the replayed value differs from the recorded "
                f"one in {self.count} of {self.size} elements; first at flat index "
                f"{self.index}: replayed {self.replayed.hex()}, recorded "
                f"{self.recorded.hex()}")


def first_mismatch(tf: TapeFile) -> Optional[Mismatch]:
    """Compare every recorded op value (``save(..., values=True)``) bit for bit with the
    replay, in node order; the first difference, or None."""
    _tape_of(tf)
    for i in sorted(tf.recorded):
        got = np.ascontiguousarray(tf.tape.values[i], dtype=np.float64).reshape(-1)
        want = np.ascontiguousarray(tf.recorded[i], dtype=np.float64).reshape(-1)
        diff = np.flatnonzero(got.view(np.uint64) != want.view(np.uint64))
        if diff.size:
            k = int(diff[0])
            return Mismatch(i, tf.tape.nodes[i].op, int(diff.size), int(got.size), k,
                            float(got[k]), float(want[k]))
    return None


__all__ = ["summary", "node_entry", "plain_node", "json_safe", "to_dot", "Mismatch",
           "first_mismatch"]
