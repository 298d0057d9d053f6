"""Reading a tape file without trusting it: bounded decoding, the schema, the semantic checks.

Three gates, in order, each before anything the file claims is allocated:

1. :func:`decode` — msgpack with hard limits on string/bin/array/map lengths,
   no extension types, string map keys only, a cap on the number of
   containers, then a nesting-depth and value-type walk (of everything but
   the node maps, which :func:`check` walks one by one unless plainly flat).
   Nothing is ever executed (msgpack is data only; there is no pickle
   anywhere).
2. :func:`check` — the format tag and version, then the JSON Schema
   (``gradtool/schemas/tape.schema.json``) through the ``jsonschema``
   library, the first violation becoming a :class:`TapeFileError` that names
   the node and field.
3. The semantic rules the schema cannot state: input ids smaller than the
   node's own id and matching the op's arity, every op's shape recomputed
   from its inputs' stated shapes with :func:`gradtool.ops.infer_shape`
   (no arithmetic) and compared with the stated one, ``data``/``value``
   lengths equal to 8 bytes per element, integer ids (``dtype`` i64) read
   only by an op's ids input, which reads nothing else, every id in range,
   unique leaf names, finite l2, a one-element float loss, output ids in
   range, and the budgets of :mod:`gradtool.budget`: elements, the memory
   replay and backward will hold (values, gradients, the largest temporary)
   and their work — so a 200-byte file that broadcasts two leaves into a
   10^10-element array, or a 131 KB one whose backward needs 3 GiB, is
   rejected here, naming the node, instead of exhausting memory in numpy.

Gates 2 and 3 go through the nodes once, node by node, so the first bad node
in file order is the one reported; an ordinary node takes a fast path
(:func:`plain_node`) that returns only what the schema and the general checks
would, and a run of plain unary nodes (most of a tape at the node limit, 2^20
nodes) is checked in columns with numpy (:func:`~.runs._plain_runs`): only nodes the
fast path would accept for certain are taken, and every other node, or a run
that crosses a budget, goes node by node, so the messages are the same.  For a
long file, :mod:`gradtool.tapefile.scan` gives those columns without decoding the
plain nodes' maps at all (:func:`~.runs._scanned_runs`); a plain node the runs do not take
is decoded from its bytes when the node-by-node path reaches it.  A run stays columns
(:class:`~.runs.RunColumns`) through the budgets and the replay: a node of a run becomes a
Python object (:class:`~.runs.RunNode`) only where a check reads it (an input of a node
checked one by one, the loss, an output, a node a budget message names).  The
document's own fields are checked without jsonschema where plainly valid
(:func:`plain_top`), so a file of plain nodes never builds the validators.

Gate 1 and the reader's :class:`Limits` live in :mod:`gradtool.tapefile.decode`, gate 2 in
:mod:`gradtool.tapefile.schemacheck`; this module holds gate 3 and re-exports both.

The result, :class:`CheckedFile`, is plain validated data; turning it into a
Tape (which computes values) is :mod:`gradtool.tapefile`'s job.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..budget import estimate_memory, human_bytes, node_temporary, node_work, prod
from ..errors import DtypeError, ShapeError, TapeFileError
from ..ops import (FLOAT_DTYPES, INT_DTYPE, INTEGER_READERS, OPS, RNG_NAME, bad_id, bad_rng,
                   format_shape, inexact_int, infer_dtype, infer_shape)
# gate 1 (the limits, bounded decoding) and gate 2 (format, version, schema) live beside
# this module; their names stay importable here
from .decode import (_KIND, _LEAF_TYPES, _NOT_CONTAINER_BYTES, FORMAT, VERSION,  # noqa: F401
                     Limits, _describe_unpack_error, _TooManyContainers, check_structure,
                     decode, kind, show)
from .fields import FIELD_TESTS, INT_READERS, SCALAR_OPS
from .runs import (_CORE, IN_RUN, RunColumns, _plain_runs, _run_counts, _scanned_runs,
                   _take_run, node_at)
from .runs import _RUN_OPS, RunNode  # noqa: F401  (where the runs' ops and nodes were)
from .schemacheck import (_EXPECTED, _INT_CLASS, _TOP_REQUIRED, _TOP_TESTS,  # noqa: F401
                          SchemaCheck, _check_header, _node_id, _scalar_class, _schema_error,
                          _validator_class, plain_top, schema, schema_check, skeleton)


@dataclass(slots=True)
class CheckedNode:
    op: str
    a: int
    b: int
    s: float
    shape: tuple
    attrs: Optional[dict]             # exactly the aux dict recording produces
    name: Optional[str] = None
    l2: float = 0.0
    data: Optional[bytes] = None      # leaves: little-endian float64 (int64 for dtype i64)
    value: Optional[bytes] = None     # op nodes: the recorded value, if the writer stored it
    dtype: str = "f64"                # "i64": a const of integer data
    integral: bool = False            # integer-valued (ops.OpSpec.integral): may feed ids


class _Plain:
    """The placeholder of a plain node in a node list decoded by
    :func:`gradtool.tapefile.scan.scan`: its fields are the scan's columns, and its map is
    decoded from its bytes only where the node-by-node path needs it."""

    __slots__ = ()

    def __repr__(self):
        return "<plain node>"


PLAIN = _Plain()


@dataclass
class CheckedFile:
    nodes: list
    loss: int
    outputs: dict
    meta: dict
    optimizer: Optional[dict]
    numerics: int = 1                 # the contract recorded values came from (absent: 1)
    state: dict = dataclasses.field(default_factory=dict)   # state slot name -> output name
    runs: list = dataclasses.field(default_factory=list)
    # (start, stop) of runs of plain unary nodes (see _plain_runs): ops without attributes,
    # integer inputs or a stored value, reading one float node of their own shape, no
    # integer values anywhere in the file; replay takes them from ``columns`` in a few
    # calls, and ``nodes`` holds IN_RUN there (``node(k)`` builds one)
    columns: Optional[RunColumns] = None

    def node(self, k: int):
        """Node ``k`` as checked (a CheckedNode, or a RunNode for a node of a run)."""
        return node_at(self.nodes, k, self.columns)


# ── gate 3: semantic checks ────────────────────────────────────────────────

_RUN_MIN = 1024                   # fewer nodes: the columns (runs.py) cost more than they save

def check(doc, source: str, limits: Limits, scanned=None) -> CheckedFile:
    """Validate a decoded document completely; CheckedFile or TapeFileError.

    The nodes are checked in one pass, each against the schema and then the
    semantic rules, so the first bad node in file order is the one reported.
    ``scanned``: the plain nodes of a document decoded by
    :func:`gradtool.tapefile.scan.scan` (:data:`PLAIN` in its node list).
    """
    _check_header(doc, source)
    schema = None                     # jsonschema, built where a check needs it
    if not plain_top(doc):
        schema = schema_check()
        err = schema.top_error(doc)
        if err is not None:
            raise _schema_error(err, None, doc, source)
    raw_nodes = doc["nodes"]
    if len(raw_nodes) > limits.max_nodes:
        raise TapeFileError(f"{len(raw_nodes)} nodes, over this reader's limit of "
                            f"{limits.max_nodes}", source=source, field="nodes")
    nodes, names = [], {}
    sizes, works = [], []
    extra = [0] * len(raw_nodes)          # budget.node_temporary of the windowed ops
    elements_total = work_total = 0
    max_elements, max_work = limits.max_elements, limits.max_work
    unread_ids = {}                   # i64 consts no integer input has read yet, in order
    size_of = {}                      # shape -> elements, for the shapes seen so far
    append_node, append_size, append_work = nodes.append, sizes.append, works.append
    if _has_f32(raw_nodes):
        columns = None                # the runs are f64's fast path; f32 node by node
    elif scanned is not None:
        columns = _scanned_runs(raw_nodes, scanned)
    elif len(raw_nodes) >= _RUN_MIN:
        columns = _plain_runs(raw_nodes)
    else:
        columns = None
    runs = []                         # (start, stop) of the node runs checked as columns
    took = False                      # whether nodes holds IN_RUN anywhere
    run_start = run_stop = len(raw_nodes)
    if columns is not None:
        run_starts, run_stops = columns.starts, columns.stops
        next_run = 0
        if len(run_starts):
            run_start, run_stop = run_starts[0], run_stops[0]
    i = 0
    count_nodes = len(raw_nodes)
    while i < count_nodes:
        if i == run_start:
            done = _take_run(columns, i, run_stop, nodes, sizes, works,
                             max_elements - elements_total, max_work - work_total)
            if done is not None:
                took = True
            next_run += 1
            if next_run < len(run_starts):
                run_start, run_stop = run_starts[next_run], run_stops[next_run]
            else:
                run_start = run_stop = count_nodes
            if done is not None:      # the whole run fits the budgets: checked
                elements_total += done
                work_total += done
                runs.append((i, len(nodes)))
                i = len(nodes)
                continue
        raw = raw_nodes[i]
        if raw is PLAIN:              # a plain node the runs did not take: its map
            raw = raw_nodes[i] = scanned.node_map(i)
        if took and type(raw) is dict:      # its inputs as checked, where in a run
            for ref in (raw.get("a"), raw.get("b")):
                if type(ref) is int and 0 <= ref < i and nodes[ref] is IN_RUN:
                    nodes[ref] = columns.node(ref)
        node = plain_node(i, raw, nodes, names)
        if node is None:
            if schema is None:
                schema = schema_check()
            if skeleton(raw) not in schema.valid_skeletons:
                err = schema.node_error(raw, source, limits)
                if err is not None:
                    raise _schema_error(err, i, doc, source)
            node = _check_node(i, raw, nodes, names, source)
        shape, a, b, op = node.shape, node.a, node.b, node.op
        size = size_of.get(shape)
        if size is None:
            size = size_of[shape] = prod(shape)
        elements_total += size
        if a < 0:
            work = 0
        elif op in _PRODUCTS:
            work = node_work(op, shape, nodes[a].shape, nodes[b].shape)
        elif op in _WINDOWED:
            sb = nodes[b].shape if b >= 0 else None
            work = node_work(op, shape, nodes[a].shape, sb, node.attrs)
            extra[i] = node_temporary(op, shape, nodes[a].shape, sb, node.attrs)
        else:           # node_work's rule for every other op, from the sizes at hand
            work = size if size >= sizes[a] else sizes[a]
            if b >= 0 and sizes[b] > work:
                work = sizes[b]
        work_total += work
        if elements_total > max_elements:
            raise TapeFileError(
                f"shape {format_shape(shape)} brings the tape to {elements_total} elements, "
                f"over this reader's limit of {limits.max_elements}", source=source, node=i,
                field="shape")
        if work_total > max_work:
            raise _over_work(work_total, limits, source, i, op)
        append_node(node)
        append_size(size)
        append_work(work)
        if a < 0:
            if node.dtype == INT_DTYPE:
                unread_ids[i] = True
        elif op in _INT_INPUTS:
            for field in _INT_INPUTS[op]:
                unread_ids.pop(a if field == "a" else b, None)
        i += 1
    if unread_ids:
        raise _unread_ids(next(iter(unread_ids)), source)
    loss = doc.get("loss", len(nodes) - 1)
    if loss >= len(nodes):
        raise TapeFileError(f"is node {loss}, but the tape has only {len(nodes)} nodes",
                            source=source, field="loss")
    loss_node = node_at(nodes, loss, columns)
    if sizes[loss] != 1:
        raise TapeFileError(f"is the loss, but a loss must have one element and this "
                            f"{loss_node.op} has shape {format_shape(loss_node.shape)}",
                            source=source, node=loss)
    if loss_node.dtype == INT_DTYPE:
        raise TapeFileError("is the loss, but it holds integer ids", source=source, node=loss)
    outputs = doc.get("outputs", {})
    for name, ref in outputs.items():
        if ref >= len(nodes):
            raise TapeFileError(f"is node {ref}, but the tape has only {len(nodes)} nodes",
                                source=source, field=f"outputs.{name}")
        node_at(nodes, ref, columns)      # as checked, for the states
    state = doc.get("state", {})
    for slot, output in state.items():
        _check_state(slot, output, nodes, names, outputs, source)
    _check_budget(nodes, sizes, works, loss, work_total, source, limits, extra,
                  columns if runs else None, runs)
    return CheckedFile(nodes=nodes, loss=loss, outputs=dict(outputs), meta=doc.get("meta", {}),
                       optimizer=doc.get("optimizer"), numerics=doc.get("numerics", 1),
                       runs=runs, state=dict(state), columns=columns if runs else None)


def _has_f32(raw_nodes) -> bool:
    """Whether any node map says dtype f32 (an f32 leaf, a cast to f32): the only way a
    tape holds float32 values."""
    return any(type(raw) is dict and raw.get("dtype") == "f32" for raw in raw_nodes)


def _check_state(slot: str, output: str, nodes: list, names: dict, outputs: dict,
                 source: str) -> None:
    """One entry of the file's ``state`` map: a named float64 const, updated after every
    training step by a named output of its shape (docs/format.md)."""
    field = f"state.{slot}"
    i = names.get(slot)
    if i is None:
        raise TapeFileError(f"names no leaf: a state is a named const (the file's leaves "
                            f"have no name {show(slot)})", source=source, field=field)
    node = nodes[i]
    if node.op != "const":
        raise TapeFileError(f"names node {i}, a {node.op}; a state is a const (params are "
                            f"the optimizer's)", source=source, field=field)
    if slot == RNG_NAME:
        raise TapeFileError(f"names node {i}, the rng slot, which training sets itself "
                            f"(docs/training.md); it cannot be a state", source=source,
                            field=field)
    if node.dtype == INT_DTYPE:
        raise TapeFileError(f"names node {i}, which holds integer ids (dtype i64); a state "
                            f"holds float64", source=source, field=field)
    if output not in outputs:
        known = ", ".join(sorted(map(show, outputs))[:8]) or "none"
        raise TapeFileError(f"is updated by output {show(output)}, which the file does not "
                            f"have (its outputs: {known})", source=source, field=field)
    ref = outputs[output]
    if nodes[ref].shape != node.shape:
        raise TapeFileError(f"node {i} has shape {format_shape(node.shape)}, but output "
                            f"{show(output)} (node {ref}, {nodes[ref].op}) has "
                            f"{format_shape(nodes[ref].shape)}", source=source, field=field)
    if nodes[ref].dtype == INT_DTYPE:
        raise TapeFileError(f"is updated by output {show(output)} (node {ref}), which holds "
                            f"integer ids; a state holds float64", source=source, field=field)
    if nodes[ref].dtype != node.dtype:
        raise TapeFileError(f"node {i} is {node.dtype}, but output {show(output)} (node "
                            f"{ref}) is {nodes[ref].dtype}; a state and its output share "
                            f"one dtype", source=source, field=field)


_INT_INPUTS = {name: spec.int_inputs for name, spec in OPS.items() if spec.int_inputs}


def _unread_ids(i: int, source: str) -> TapeFileError:
    """An i64 const that no op's integer input reads.  The format promises that a file
    with integer data has an op reading it (one of the ops with integer inputs in the op
    table), which a reader that predates integer data refuses by name, instead of
    misreading the int64 bytes as floats."""
    return _bad(i, source, f"holds integer ids (dtype {INT_DTYPE}), but no op reads them; "
                           f"integer data must be read by an integer input of "
                           f"{_INT_READERS_TEXT} (a file with nothing reading it would "
                           f"pass an older reader, which reads the ids as floats)", "dtype")


def _over_work(total: int, limits: Limits, source: str, node: int, op: str) -> TapeFileError:
    return TapeFileError(f"replaying and differentiating the tape up to this {op} would take "
                         f"about {total} operations, over this reader's limit of "
                         f"{limits.max_work}", source=source, node=node)


def _check_budget(nodes, sizes, works, loss, forward_work, source, limits, extra,
                  columns=None, runs=()) -> None:
    """Memory and work of replay plus backward (:mod:`gradtool.budget`) within ``limits``.
    ``extra``: per node its budget.node_temporary.  ``columns``: the file's op, a and b
    of every node as :func:`~.runs._plain_runs` read them (:class:`~.runs.RunColumns`),
    which equal the checked nodes' once every node has passed; the sizes and works of
    the ``runs``' nodes are then taken from them too (a unary node's work is its size)."""
    if columns is None:
        ops, a, b = [n.op for n in nodes], [n.a for n in nodes], [n.b for n in nodes]
        size_col, work_col = sizes, works
    else:
        ops, a, b = columns.ops, columns.a, columns.b
        size_col, work_col = _run_counts(sizes, works, runs, columns)
    est = estimate_memory(ops, a, b, size_col, work_col, loss, extra if any(extra) else None)
    if forward_work + est.backward_work > limits.max_work:
        worst = max(range(len(nodes)), key=works.__getitem__)
        raise _over_work(forward_work + est.backward_work, limits, source, worst,
                         node_at(nodes, worst, columns).op)
    if est.bytes > limits.max_memory:
        at, where = est.temporary_node, ""
        if at >= 0:
            node = node_at(nodes, at, columns)
            operands = [node.shape] + [node_at(nodes, k, columns).shape for k in (node.a, node.b)
                                       if k >= 0]
            where = (f"; the largest temporary is this {node.op}'s, on "
                     f"{format_shape(max(operands, key=prod))} arrays")
        raise TapeFileError(f"replay and backward would need {est.describe()}, over this "
                            f"reader's memory limit of {human_bytes(limits.max_memory)}{where} "
                            f"(gradtool --max-memory SIZE raises it)", source=source,
                            node=at if at >= 0 else None)


_ARITY = {name: spec.arity for name, spec in OPS.items()}
# The fast path below takes the ops without attributes or integer inputs; what each of
# their nodes may carry, and each field's test, is the field table's (tapefile/fields.py),
# the same the schema is rendered from.
_PLAIN_TESTS = {name: FIELD_TESTS[name] for name, spec in OPS.items()
                if not spec.attrs and not spec.int_inputs}
_INT_READERS_TEXT = " and ".join(INT_READERS) if len(INT_READERS) <= 2 else \
    ", ".join(INT_READERS[:-1]) + " and " + INT_READERS[-1]
_SCALAR_OPS = frozenset(SCALAR_OPS)
_SAME_SHAPE = frozenset(name for name, spec in OPS.items() if spec.kind == "unary")


def plain_node(i: int, raw, earlier: list, names: dict) -> Optional[CheckedNode]:
    """The CheckedNode of an ordinary valid node (a leaf, or an op without attributes),
    or None: then the node goes through the schema and :func:`_check_node`, which give
    the same CheckedNode or the precise error.  Every test here is one the schema or
    :func:`_check_node` makes (the field table's, for the keys other than op, a, b, s
    and shape; ``tests/test_fuzz_files.py`` checks that over thousands of valid and
    mutated nodes); together they cost a third of the general path, which matters for
    a tape of a million nodes."""
    if type(raw) is not dict:
        return None
    op = raw.get("op")
    tests = _PLAIN_TESTS.get(op) if type(op) is str else None
    if tests is None:
        return None
    if not _CORE.issuperset(raw):
        for key, value in raw.items():
            if key not in _CORE:
                test = tests.get(key)
                if test is None or key == "dtype" or not test(value):
                    return None
    get = raw.get
    a, b, s, shape = get("a", -1), get("b", -1), get("s", 0.0), get("shape")
    if type(a) is not int or type(b) is not int or type(shape) is not list:
        return None
    if type(s) is not float and type(s) is not int or s != 0 and op not in _SCALAR_OPS:
        return None
    if len(shape) == 1:             # the common case, without the loop
        size = shape[0]
        if type(size) is not int or size < 1:
            return None
        shape = (size,)
    else:
        if not 0 < len(shape) <= 32:
            return None
        size = 1
        for d in shape:
            if type(d) is not int or d < 1:
                return None
            size *= d
        shape = tuple(shape)
    arity = _ARITY[op]
    if arity == 0:
        data, name, l2 = get("data"), get("name"), get("l2", 0.0)
        if a != -1 or b != -1 or type(data) is not bytes or len(data) != 8 * size:
            return None
        if name is not None and name in names:
            return None
        if not l2 < math.inf:       # the table tested l2 >= 0; NaN and inf: the general path
            return None
        if name is not None:
            if name == RNG_NAME:
                return None             # the general path checks the reserved slot
            names[name] = i
        return CheckedNode(op, -1, -1, 0.0, shape, None, name, float(l2), data)
    if not (0 <= a < i and (0 <= b < i if arity == 2 else b == -1)):
        return None
    first = earlier[a]
    if first.dtype != "f64" or b >= 0 and earlier[b].dtype != "f64":
        return None                 # integer data: the general path checks who reads it
    value = get("value")
    if value is not None and len(value) != 8 * size:
        return None
    if op in _SAME_SHAPE:           # the op table's promise for a unary op: a's shape
        inferred = first.shape
    else:
        try:
            inferred = infer_shape(op, first.shape, earlier[b].shape if b >= 0 else None,
                                   None)
        except ShapeError:
            return None
    if inferred != shape:
        return None
    return CheckedNode(op, a, b, float(s), shape, None, None, 0.0, None, value,
                       integral=_integral(op, a, b, earlier, float(s)))


def _integral(op: str, a: int, b: int, earlier: list, s: float = 0.0) -> bool:
    """Whether an op node's values are whole numbers (ops.OpSpec.integral), as the Tape
    tracks it."""
    spec = OPS[op]
    return bool(spec.integral) and spec.integral_of(earlier[a].integral,
                                                    b < 0 or earlier[b].integral, s)


def _check_node(i: int, raw: dict, earlier: list, names: dict, source: str) -> CheckedNode:
    op = raw["op"]
    arity = _ARITY[op]
    get = raw.get
    a, b = get("a", -1), get("b", -1)
    if not ((0 <= a < i if arity >= 1 else a == -1) and (0 <= b < i if arity == 2 else b == -1)):
        raise _bad_inputs(i, op, arity, a, b, source)
    shape = tuple(raw["shape"])
    if arity == 0:
        data = raw["data"]
        dtype = get("dtype", "f64")
        if op == "param" and dtype not in FLOAT_DTYPES:
            raise _bad(i, source, f"a param holds floats (f64 or f32), got dtype {show(dtype)}",
                       "dtype")
        width = 4 if dtype == "f32" else 8
        need = width * prod(shape)
        if len(data) != need:
            raise _bad(i, source, f"holds {len(data)} bytes, but shape {format_shape(shape)} "
                                  f"needs {need} ({width} per element, dtype {dtype})", "data")
        name = get("name")
        if name is not None:
            if name in names:
                raise _bad(i, source, f"{show(name)} is already the name of node {names[name]}",
                           "name")
            names[name] = i
        l2 = float(get("l2", 0.0))
        if not math.isfinite(l2):
            raise _bad(i, source, f"must be finite, got {l2}", "l2")
        if name == RNG_NAME:
            problem = ("it is reserved for a const" if op != "const" else
                       bad_rng(None if dtype != "f64" else np.frombuffer(data, "<f8"),
                               shape, dtype))
            if problem:
                raise _bad(i, source, problem, "name" if op != "const" else "data")
        return CheckedNode(op, -1, -1, 0.0, shape, None, name, l2, data, dtype=dtype,
                           integral=dtype == INT_DTYPE)

    spec = OPS[op]
    for field, ref in (("a", a), ("b", b)):
        if ref >= 0 and earlier[ref].dtype == INT_DTYPE and field not in spec.int_inputs:
            raise _bad(i, source, f"node {ref} holds integer data (dtype {INT_DTYPE}), which "
                                  f"{op} does not read here ({INTEGER_READERS})", field)
        if (ref >= 0 and earlier[ref].dtype == INT_DTYPE and field not in spec.id_inputs
                and inexact_int(np.frombuffer(earlier[ref].data, dtype="<i8"))):
            raise _bad(i, source, f"node {ref}: "
                                  f"{inexact_int(np.frombuffer(earlier[ref].data, '<i8'))}",
                       field)
        if field == "a" and spec.rng_input and earlier[ref].name != RNG_NAME:
            raise _bad(i, source, f"{op} reads the tape's rng slot (the const named "
                                  f"{RNG_NAME!r}), but node {ref} is a {earlier[ref].op}"
                                  + (f" named {show(earlier[ref].name)}"
                                     if earlier[ref].name else ""), field)
        if ref >= 0 and field in spec.id_inputs and not earlier[ref].integral:
            raise _bad(i, source, f"{op} reads integer ids here, but node {ref} is not a const "
                                  f"with dtype {INT_DTYPE}, nor integer-valued ops of one "
                                  f"(docs/ops.md; it is a {earlier[ref].op})", field)
    attrs = _attrs(op, raw) if spec.attrs else None
    for at in spec.attrs:           # the schema's maximum, which a valid skeleton skips
        if at.kind == "natural" and not FIELD_TESTS[op][at.name](raw.get(at.name)):
            raise _bad(i, source, f"must be an integer in [0, 2^63), got "
                                  f"{show(raw.get(at.name))}", at.name)
    sa = earlier[a].shape
    sb = earlier[b].shape if b >= 0 else None
    try:
        inferred = infer_shape(op, sa, sb, attrs)
    except ShapeError as exc:
        inputs = f"node {a} {format_shape(sa)}" + (f", node {b} {format_shape(sb)}" if b >= 0 else "")
        text = str(exc) if str(exc).startswith(op) else f"{op}: {exc}"
        raise _bad(i, source, f"{text} (inputs {inputs})") from None
    if inferred != shape:
        raise _bad(i, source, f"states {format_shape(shape)}, but {op} of its inputs gives "
                              f"{format_shape(inferred)}", "shape")
    da = earlier[a].dtype
    if op == "cast" and (attrs or {}).get("dtype") not in FLOAT_DTYPES:
        raise _bad(i, source, f"a cast's target is f32 or f64, got {show(get('dtype'))}",
                   "dtype")
    if op == "cast" and da == attrs["dtype"]:
        raise _bad(i, source, f"casts node {a}, already {da}, to {da}; a cast changes the "
                              f"dtype", "dtype")
    try:
        dtype = infer_dtype(op, da, earlier[b].dtype if b >= 0 else None, attrs)
    except DtypeError as exc:
        raise _bad(i, source, f"{op}: {exc}", "b") from None
    if spec.id_inputs and earlier[b].a < 0:     # computed ids: checked when replayed
        ids = np.frombuffer(earlier[b].data, dtype="<i8")
        problem = bad_id(ids.reshape(earlier[b].shape), spec.index_bound(sa, attrs))
        if problem:
            raise _bad(i, source, f"node {b}: {problem} for {op}'s input a {format_shape(sa)}",
                       "b")
    value = get("value")
    if value is not None and len(value) != 8 * prod(shape):
        raise _bad(i, source, f"holds {len(value)} bytes, but shape {format_shape(shape)} needs "
                              f"{8 * prod(shape)}", "value")
    return CheckedNode(op, a, b, float(get("s", 0.0)), shape, attrs, None, 0.0, None, value,
                       dtype=dtype,
                       integral=_integral(op, a, b, earlier, float(get("s", 0.0))))


def _bad(i: int, source: str, message: str, field=None) -> TapeFileError:
    return TapeFileError(message, source=source, node=i, field=field)


def _bad_inputs(i: int, op: str, arity: int, a: int, b: int, source: str) -> TapeFileError:
    for field, ref, used in (("a", a, arity >= 1), ("b", b, arity >= 2)):
        if not used:
            if ref != -1:
                return _bad(i, source, f"{op} takes {arity} input{'s' * (arity != 1)}, so "
                                       f"'{field}' must be -1, got {ref}", field)
        elif ref < 0:
            return _bad(i, source, f"{op} needs an input here, got -1", field)
        elif ref == i:
            return _bad(i, source, "the node refers to itself; inputs must be earlier nodes",
                        field)
        elif ref > i:
            return _bad(i, source, f"refers to node {ref}, which comes later; inputs must be "
                                   f"earlier nodes", field)
    raise AssertionError("unreachable: the inputs were valid")


_PRODUCTS = frozenset(("matmul", "bmm"))
_WINDOWED = frozenset(("conv2d", "max_pool2d", "avg_pool2d"))   # budget.node_temporary


def _attrs(op: str, raw: dict) -> Optional[dict]:
    """The node's aux dict, built exactly as the Tape's recording methods build it (an
    optional attribute absent or at its default is left out)."""
    aux = {}
    for at in OPS[op].attrs:
        if not at.stored:
            aux[at.name] = list(raw["shape"])
        elif at.name in raw and not (at.optional and raw[at.name] == at.default
                                     and type(raw[at.name]) is type(at.default)):
            aux[at.name] = (list(raw[at.name]) if at.kind in ("indices", "perm")
                            else raw[at.name])
    return aux or None
