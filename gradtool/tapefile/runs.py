"""The loader's columnar fast path: runs of plain unary nodes, checked and replayed as
columns (:mod:`gradtool.tapefile.checks` and :mod:`gradtool.tapefile.replay` take them).

A tape at the node limit is mostly ordinary elementwise nodes; even plain_node costs
~4 us each there.  _plain_runs reads every node's op, a, b, s and shape in a few passes
over the whole node list (map over dict.get, no Python code per node) and finds, with
numpy, the nodes that plain_node would accept for certain and that need nothing from
it but a CheckedNode: an op of kind "unary" without attributes or integer inputs, the
keys op/a/b/s/shape only (no value), b == -1, 0 <= a < i, s == 0 unless the op takes
a scalar operand, a valid shape equal to node a's (a unary op's shape is its
input's), not reading integer data (an i64 const).  A file holding whole numbers (i64
consts, ops whose values are always whole) has its nodes' ``integral`` flags found by
:func:`_integral_column`; in any other file they are all False.  Every other node,
and any file where a column holds a value of an unexpected type, goes through the
node-by-node path, which gives the exact messages; so does a run whose elements or
work would cross a budget (then the node-by-node path names the node that crosses).

A run stays columns (:class:`RunColumns`) through the budgets and the replay; its nodes
hold a placeholder (:data:`IN_RUN`) in the checked node list, and a node of a run becomes
a Python object (:class:`RunNode`, by :func:`node_at`) only where a check reads it.
"""

from __future__ import annotations

import heapq
import operator
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Optional

import numpy as np

from ..budget import prod
from ..ops import INT_DTYPE, OPS
from .fields import SCALAR_OPS

_CORE = frozenset({"op", "a", "b", "s", "shape"})     # a plain node's keys (the checks'
                                                      # plain_node tests them inline)


class RunNode(tuple):
    """A CheckedNode of a plain unary node checked in columns (see :func:`_plain_runs`):
    the same fields, as a tuple ``(op, a, s, shape)``; every other field is the same for
    all of them.  Built from the columns (:meth:`RunColumns.node`) only where a check
    reads that node (an input of a node checked one by one, the loss, an output)."""

    __slots__ = ()
    op = property(operator.itemgetter(0))
    a = property(operator.itemgetter(1))
    s = property(operator.itemgetter(2))
    shape = property(operator.itemgetter(3))
    b, attrs, name, l2, data, value, dtype, integral = -1, None, None, 0.0, None, None, "f64", \
        False

    def __repr__(self):
        return (f"RunNode(op={self.op!r}, a={self.a}, b=-1, s={self.s!r}, "
                f"shape={self.shape})")


class WholeRunNode(RunNode):
    """A :class:`RunNode` whose values are whole numbers (``integral``: it reads one, and
    its op keeps them whole)."""

    __slots__ = ()
    integral = True


class _InRun:
    """The placeholder, in :attr:`CheckedFile.nodes`, of a node of a run checked in
    columns: its fields are in :attr:`CheckedFile.columns` (:meth:`CheckedFile.node`)."""

    __slots__ = ()

    def __repr__(self):
        return "<node of a run>"


IN_RUN = _InRun()


@dataclass
class RunColumns:
    """Per node of a file, the fields :func:`_plain_runs` (or :func:`_scanned_runs`) read,
    as numpy arrays: ``code`` (``_RUN_CODE`` of the op; 0: not a run op), ``a``, ``b``,
    ``s`` (float64), ``shape_id`` (an index into ``shapes``, the distinct shapes as
    tuples, None where not a valid shape) and per shape id its elements (``sizes``);
    ``ops`` the op of every node (what the budget reads of the others); ``starts`` and
    ``stops`` the runs; ``whole`` each node's ``integral`` (:func:`_integral_column`), or
    None in a file without whole numbers.  Only a node of a run that the checks took is
    read from them."""

    starts: list
    stops: list
    ops: object
    code: np.ndarray
    a: np.ndarray
    b: np.ndarray
    s: np.ndarray
    shapes: list
    shape_id: np.ndarray
    sizes: np.ndarray
    whole: Optional[np.ndarray] = None

    def node(self, k: int) -> RunNode:
        """The CheckedNode of node ``k`` of a run."""
        kind = WholeRunNode if self.whole is not None and self.whole[k] else RunNode
        return tuple.__new__(kind, (_RUN_OPS[int(self.code[k]) - 1], int(self.a[k]),
                                    float(self.s[k]), self.shapes[self.shape_id[k]]))

    def integral(self, start: int, stop: int):
        """The ``integral`` flags of nodes ``start:stop`` (a run), for the replayed Tape."""
        if self.whole is None:
            return repeat(False, stop - start)
        return self.whole[start:stop].tolist()


def node_at(nodes: list, k: int, columns: Optional[RunColumns]):
    """``nodes[k]``, built from the columns first where it is a run's placeholder."""
    node = nodes[k]
    if node is IN_RUN:
        node = nodes[k] = columns.node(k)
    return node


_RUN_OPS = [name for name, spec in OPS.items()
            if spec.kind == "unary" and spec.arity == 1 and not spec.attrs
            and not spec.int_inputs and spec.integral in ("", "inputs", "a", "a_whole_s")]
_RUN_CODE = {name: k + 1 for k, name in enumerate(_RUN_OPS)}      # 0: not a run op
_RUN_SCALAR = np.array([False] + [name in SCALAR_OPS for name in _RUN_OPS])
_WHOLE_SOURCES = frozenset(name for name, spec in OPS.items() if spec.integral == "always")
_INT_TYPE = frozenset((int,))
_NUMBER_TYPES = frozenset((int, float))
_LIST_TYPE = frozenset((list,))
_CORE_ITEMS = tuple(map(operator.itemgetter, ("op", "a", "b", "s", "shape")))


def _plain_runs(raw_nodes):
    """The :class:`RunColumns` of the runs of plain unary nodes, or None: the node-by-node
    path for the whole file."""
    n = len(raw_nodes)
    get = dict.get
    try:
        try:                    # every node has the five core keys (as the writer writes)
            ops, a_col, b_col, s_col, shapes = (list(map(item, raw_nodes))
                                                for item in _CORE_ITEMS)
            lengths = np.fromiter(map(len, raw_nodes), dtype=np.int64, count=n)
            keys = lengths == len(_CORE)            # then no other key
            more = np.flatnonzero(~keys).tolist()   # the only nodes that may hold a dtype
            int_leaves = [k for k in more if raw_nodes[k].get("dtype") == INT_DTYPE]
        except KeyError:
            ops = list(map(get, raw_nodes, repeat("op")))
            keys = np.fromiter(map(_CORE.issuperset, raw_nodes), dtype=bool, count=n)
            a_col = list(map(get, raw_nodes, repeat("a"), repeat(-1)))
            b_col = list(map(get, raw_nodes, repeat("b"), repeat(-1)))
            s_col = list(map(get, raw_nodes, repeat("s"), repeat(0.0)))
            shapes = list(map(get, raw_nodes, repeat("shape")))
            int_leaves = [k for k, node in enumerate(raw_nodes)
                          if get(node, "dtype") == INT_DTYPE]
        # (TypeError above: a node that is not a map)
        codes = np.fromiter(map(_RUN_CODE.get, ops, repeat(0)), dtype=np.int64, count=n)
        if (not set(map(type, a_col)) <= _INT_TYPE or not set(map(type, b_col)) <= _INT_TYPE
                or not set(map(type, s_col)) <= _NUMBER_TYPES
                or not set(map(type, shapes)) <= _LIST_TYPE):
            return None
        a = np.fromiter(a_col, dtype=np.int64, count=n)
        b = np.fromiter(b_col, dtype=np.int64, count=n)
        s = np.fromiter(s_col, dtype=np.float64, count=n)
        if not set(map(type, chain.from_iterable(shapes))) <= _INT_TYPE:
            return None             # a dim not an int (a bool or a float equal to one)
    except (TypeError, OverflowError, ValueError):
        return None
    # every dim an int: equal tuples are equal shapes
    tuples = list(map(tuple, shapes))
    unique = dict.fromkeys(tuples)
    for k, dims in enumerate(unique):
        unique[dims] = k
    shape_id = np.fromiter(map(unique.__getitem__, tuples), dtype=np.int64, count=n)
    valid, canon, sizes = [], [], []
    for dims in unique:
        ok = 0 < len(dims) <= 32 and min(dims) >= 1
        valid.append(ok)
        canon.append(dims if ok else None)
        sizes.append(prod(dims) if ok else 0)
    index = np.arange(n)
    ok = (codes > 0) & keys & (b == -1) & (a >= 0) & (a < index)
    ok &= (s == 0) | _RUN_SCALAR[codes]
    ok &= np.array(valid, dtype=bool)[shape_id]
    ok &= shape_id == shape_id[np.where(ok, a, 0)]
    whole = None
    if int_leaves or not _WHOLE_SOURCES.isdisjoint(ops):
        whole = _whole_numbers(ops, np.where((a >= -1) & (a < n), a, -1),
                               np.where((b >= -1) & (b < n), b, -1), s, int_leaves, ok)
    edges = np.diff(np.concatenate(([False], ok, [False])).astype(np.int8))
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return RunColumns(starts.tolist(), stops.tolist(), ops, codes, a, b, s, canon, shape_id,
                      _size_table(sizes), whole)


def _whole_numbers(ops, a, b, s, int_leaves: list, ok: np.ndarray) -> np.ndarray:
    """:func:`_integral_column` of a file holding whole numbers; and ``ok`` (the nodes a
    run may take) cleared in place at every node reading an i64 const, which no run op
    reads (one by one, the checks name it)."""
    reads_ids = np.zeros(len(ops), dtype=bool)
    reads_ids[int_leaves] = True
    ok &= ~reads_ids[np.where(ok, a, 0)]
    return _integral_column(ops, a, b, s, int_leaves)


_INTEGRAL_SPECS = {name: spec for name, spec in OPS.items() if spec.integral}


def _integral_column(ops: list, a: np.ndarray, b: np.ndarray, s: np.ndarray,
                     int_leaves: list) -> np.ndarray:
    """Each node's ``integral`` (whole-number values: ``OpSpec.integral_of``, as the checks
    and the Tape compute it) in a file holding whole-number sources (i64 consts, ops like
    the comparisons and floor): what a run's nodes carry (:class:`WholeRunNode` for the
    checks, the replayed Tape's flags).

    ``a``, ``b`` (int64, -1 where a node has none or a malformed one) and ``s`` are the
    columns.  Only the nodes a source reaches are visited, in node order (a heap: every
    input of a node comes before it, so its inputs are final when it is taken), each found
    from its inputs through the columns sorted once.  A node whose fields are not
    well-formed counts as not integral (it is checked one by one, and refused there)."""
    n = len(ops)
    whole = np.zeros(n, dtype=bool)
    sources = set(int_leaves) | {k for k, op in enumerate(ops)
                                 if type(op) is str and op in _WHOLE_SOURCES}
    heap = sorted(sources)
    whole[heap] = True
    readers = []                             # per input column: (readers by input, bounds)
    for col in (a, b):
        inside = np.flatnonzero((col >= 0) & (col < n))
        order = inside[np.argsort(col[inside], kind="stable")]
        bounds = np.concatenate(([0], np.cumsum(np.bincount(col[inside], minlength=n))))
        readers.append((order.tolist(), bounds.tolist()))
    a_list, b_list, s_list = a.tolist(), b.tolist(), s.tolist()
    queued, specs = set(sources), _INTEGRAL_SPECS
    while heap:
        k = heapq.heappop(heap)
        if k not in sources:
            op, ak, bk = ops[k], a_list[k], b_list[k]
            spec = specs.get(op) if type(op) is str else None
            if spec is None or not 0 <= ak < k or bk >= k or not spec.integral_of(
                    bool(whole[ak]), bk < 0 or bool(whole[bk]), s_list[k]):
                continue
            whole[k] = True
        for order, bounds in readers:        # the nodes reading k: pushed once each
            for j in order[bounds[k]:bounds[k + 1]]:
                if j not in queued:
                    queued.add(j)
                    heapq.heappush(heap, j)
    return whole


def _size_table(sizes: list) -> np.ndarray:
    """Elements per shape id, as int64 where no sum over a file's nodes can overflow."""
    return np.array(sizes, dtype=np.int64 if max(sizes, default=0) < 1 << 40 else object)


def _scanned_runs(raw_nodes: list, scanned):
    """:func:`_plain_runs`'s columns for a node list decoded by
    :func:`gradtool.tapefile.scan.scan`: the plain nodes' fields from the scan's columns,
    the other nodes' (few: the scan gives up otherwise) read from their maps; a plain
    node is in a run on the same conditions."""
    n = len(raw_nodes)
    index = scanned.index
    codes = np.zeros(n, dtype=np.int64)
    codes[index] = np.array([_RUN_CODE[op] for op in scanned.ops], dtype=np.int64)[scanned.code]
    a = np.full(n, -1, dtype=np.int64)
    a[index] = scanned.a
    b = np.full(n, -1, dtype=np.int64)
    s = np.zeros(n, dtype=np.float64)
    s[index] = scanned.s
    # shape ids: the scan's distinct shapes first (two encodings of one shape: one id),
    # then the other nodes' as tuples
    canon, valid, sizes, unique, remap = [], [], [], {}, []

    def shape_code(dims: tuple) -> int:
        if dims not in unique:
            unique[dims] = len(canon)
            canon.append(dims)
            valid.append(True)
            sizes.append(prod(dims))
        return unique[dims]

    for dims in scanned.shapes:
        remap.append(-1 if dims is None or len(dims) > 32 else shape_code(tuple(dims)))
    shape_id = np.full(n, -1, dtype=np.int64)
    shape_id[index] = np.array(remap, dtype=np.int64)[scanned.shape_id]
    ops_full = np.empty(n, dtype=object)
    ops_full[index] = np.array(scanned.ops, dtype=object)[scanned.code]
    others = np.ones(n, dtype=bool)
    others[index] = False
    int_leaves, sources = [], False
    for k in np.flatnonzero(others).tolist():
        raw = raw_nodes[k]
        if type(raw) is not dict:
            continue
        ops_full[k] = raw.get("op")
        for column, key in ((a, "a"), (b, "b")):
            value = raw.get(key, -1)
            if type(value) is int and -1 <= value < n:
                column[k] = value
        value = raw.get("s", 0.0)
        if type(value) is float or type(value) is int and abs(value) < 1 << 63:
            s[k] = value
        if raw.get("dtype") == INT_DTYPE:
            int_leaves.append(k)
        sources = sources or type(ops_full[k]) is str and ops_full[k] in _WHOLE_SOURCES
        shape = raw.get("shape")
        if type(shape) is list and 0 < len(shape) <= 32 and set(map(type, shape)) <= _INT_TYPE \
                and min(shape) >= 1:
            shape_id[k] = shape_code(tuple(shape))
    valid.append(False)                   # shape id -1: a node whose shape is not plain
    sizes.append(0)
    # the same conditions as _plain_runs (the core keys only, b == -1: a plain node's
    # encoding; the other nodes have code 0)
    idx = np.arange(n)
    ok = (codes > 0) & (a >= 0) & (a < idx)
    ok &= (s == 0) | _RUN_SCALAR[codes]
    ok &= np.array(valid, dtype=bool)[shape_id]
    ok &= shape_id == shape_id[np.where(ok, a, 0)]
    whole = None
    if int_leaves or sources:           # as _plain_runs
        whole = _whole_numbers(ops_full.tolist(), a, b, s, int_leaves, ok)
    edges = np.diff(np.concatenate(([False], ok, [False])).astype(np.int8))
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return RunColumns(starts.tolist(), stops.tolist(), ops_full, codes, a, b, s, canon,
                      shape_id, _size_table(sizes), whole)


def _take_run(columns: RunColumns, start: int, stop: int, nodes: list, sizes: list,
              works: list, elements_left: int, work_left: int) -> Optional[int]:
    """Append the placeholders, sizes and works of the plain run ``start:stop`` and return
    its elements (its work too: a unary node's work is its size), or None, appending
    nothing, when that would cross ``elements_left`` or ``work_left``."""
    run_sizes = columns.sizes[columns.shape_id[start:stop]]
    total = int(run_sizes.sum())
    if total > elements_left or total > work_left:
        return None
    nodes.extend(repeat(IN_RUN, stop - start))
    run_sizes = run_sizes.tolist()
    sizes.extend(run_sizes)
    works.extend(run_sizes)
    return total


def _run_counts(sizes: list, works: list, runs: list, columns: RunColumns) -> tuple:
    """Every node's size and work as int64 arrays, the runs' nodes' from the columns and
    the others' from the lists (the lists where one is too large for int64)."""
    others = np.ones(len(sizes), dtype=bool)
    for start, stop in runs:
        others[start:stop] = False
    others = np.flatnonzero(others).tolist()
    other_sizes = [sizes[k] for k in others]
    other_works = [works[k] for k in others]
    if columns.sizes.dtype != np.int64 or max(other_sizes, default=0) >= 1 << 58 \
            or max(other_works, default=0) >= 1 << 58:
        return sizes, works
    size_col = columns.sizes[columns.shape_id]       # a run's node: a size of its shape
    work_col = size_col.copy()
    size_col[others] = other_sizes
    work_col[others] = other_works
    return size_col, work_col
