"""Budgets: what replaying, differentiating and checking a tape will cost, known before
anything is allocated.

One model, used by the file loader (:mod:`gradtool.tapefile.checks`), the
device capture (:mod:`gradtool.device.program`), training data
(:mod:`gradtool.train.data`) and ``fd-check`` (:mod:`gradtool.gradcheck`):

* **Memory** of a tape, in float64 elements (``bytes = 8 * elements``): every
  node's value, plus the gradient of every node the backward walk reaches
  (the loss and each node that requires grad on a path to it), plus the
  largest *temporary* any one node needs while it is replayed or
  differentiated: :data:`FORWARD_TEMPORARIES` times, and for a node the
  backward walk differentiates :data:`BACKWARD_TEMPORARIES` times, the
  largest of its output's and inputs' element counts.  The factors bound
  the peaks measured with ``tracemalloc`` for every op, broadcasting
  included (``tests/test_budget.py`` keeps them true): a forward replay
  holds the new value next to the old one plus at most one array of that
  size (softmax's exponentials, a serial sum's running sums); a backward
  rule holds both inputs' contributions at the output's shape, the
  transposed copy and running sums that reduce a broadcast, and the fresh
  gradient slot (the worst measured, ``div`` of two broadcast operands,
  peaks at 3.2 times its output).
* **Work** of a tape, in element operations: a matmul, bmm or conv2d counts
  its multiply-adds, a pool its output times its window, every other op the
  largest of its output's and inputs' element counts; the backward walk
  counts a node's work once per input it differentiates.
* conv2d and the pools also hold arrays of other sizes than their output and
  inputs (:func:`node_temporary`): compiled (csrc/gt_conv.h), conv2d per thread one
  sample's columns and input-gradient sum, max_pool2d per thread one plane's window
  records; in numpy, conv2d its im2col columns (twice, backward: the columns and
  their gradient) and a zero-padded copy of its input, a pool its padded input;
  those add to the node's temporary.

The default memory budget is :data:`DEFAULT_MEMORY` (2 GiB); ``gradtool
--max-memory SIZE`` and ``Limits(max_memory=...)`` change it.
"""

from __future__ import annotations

import operator
import os
import re
from dataclasses import dataclass

import numpy as np

from .errors import GradtoolError

DEFAULT_MEMORY = 1 << 31          # bytes
FORWARD_TEMPORARIES = 2
BACKWARD_TEMPORARIES = 4


class BudgetError(GradtoolError):
    """A size or budget setting that is not a size, or a job over its budget."""


def prod(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def node_work(op: str, shape, sa, sb, attrs=None) -> int:
    """Element operations of computing one node from inputs of shapes ``sa``/``sb``
    (None where absent): multiply-adds for matmul/bmm/conv2d, a pool's output times its
    window, else the largest array."""
    if sa is None:
        return 0
    if op == "matmul":
        return sa[0] * sa[1] * shape[1]
    if op == "bmm":                 # the batch of the output: b may broadcast over a's
        return shape[0] * sa[1] * sa[2] * shape[2]
    if op == "conv2d":              # every output: C/groups * KH * KW multiply-adds
        return prod(shape) * prod(sb[1:])
    big = max(prod(shape), prod(sa), prod(sb) if sb is not None else 0)
    if op in ("max_pool2d", "avg_pool2d") and attrs:
        return max(big, prod(shape) * prod(attrs["kernel"]))
    return big


def compiled_windows() -> bool:
    """Whether conv2d and max_pool2d run compiled here (csrc/gt_conv.h: a C compiler on
    PATH and ``GRADTOOL_NATIVE`` not 0), holding one sample's (one plane's) buffers per
    thread instead of numpy's whole-batch columns and padded copies."""
    import shutil
    from . import native
    return native.enabled() and shutil.which(os.environ.get("CC", "cc")) is not None


def node_temporary(op: str, shape, sa, sb, attrs=None) -> int:
    """Elements a node holds besides arrays of its output's and inputs' sizes while it is
    replayed or differentiated (numerics.conv2d, max_pool2d, avg_pool2d); 0 for most ops."""
    if op in ("conv2d", "max_pool2d") and attrs and compiled_windows():
        from .native import num_threads
        if op == "conv2d":      # per thread one sample's columns and input-gradient sum
            per, count = prod(sb[1:]) * shape[2] * shape[3] + prod(sa[1:]), sa[0]
        else:                   # per thread one plane's window records and sum
            per, count = 3 * shape[2] * shape[3] + sa[2] * sa[3], sa[0] * sa[1]
        return max(1, min(num_threads(), count)) * per
    if op == "conv2d" and attrs:
        ph, pw = attrs["padding"]
        cols = prod(sb[1:]) * attrs["groups"] * shape[0] * shape[2] * shape[3]
        return 2 * cols + sa[0] * sa[1] * (sa[2] + 2 * ph) * (sa[3] + 2 * pw)
    if op in ("max_pool2d", "avg_pool2d") and attrs:
        (kh, kw), (sh, sw), (ph, pw) = attrs["kernel"], attrs["stride"], attrs["padding"]
        dh, dw = attrs.get("dilation", (1, 1))
        hp = max(sa[2] + 2 * ph, (shape[2] - 1) * sh + (kh - 1) * dh + 1)
        wp = max(sa[3] + 2 * pw, (shape[3] - 1) * sw + (kw - 1) * dw + 1)
        return 2 * sa[0] * sa[1] * hp * wp          # the padded input and its mask
    return 0


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak float64 elements of replaying and differentiating a tape (see the module doc)."""

    values: int
    grads: int
    temporary: int
    temporary_node: int           # the node that needs the largest temporary (-1: none)
    backward_work: int

    @property
    def elements(self) -> int:
        return self.values + self.grads + self.temporary

    @property
    def bytes(self) -> int:
        return 8 * self.elements

    def describe(self) -> str:
        return (f"about {human_bytes(self.bytes)} (values {human_bytes(8 * self.values)}, "
                f"gradients {human_bytes(8 * self.grads)}, the largest temporary "
                f"{human_bytes(8 * self.temporary)})")


def estimate_memory(ops, a, b, sizes, works, loss: int, extra=None) -> MemoryEstimate:
    """The model for a tape given per node its op, input ids (-1: none), element count
    and forward work (lists, or numpy integer arrays); ``loss`` is the node backward
    seeds; ``extra``: per node its :func:`node_temporary` (default none), added to the
    node's temporaries.

    Taken over all nodes at once with numpy (a tape at the node limit has 2^20 nodes):
    which nodes require grad (:func:`_requires`), which ones the backward walk reaches
    (:func:`_reached`), the temporaries and the backward work."""
    n = len(ops)
    if n == 0:
        return MemoryEstimate(0, 0, 0, -1, 0)
    size = _counts(sizes)
    ia, ib = np.array(a, dtype=np.int64), np.array(b, dtype=np.int64)
    op_node = ia >= 0
    has_b = ib >= 0
    a0, b0 = np.where(op_node, ia, 0), np.where(has_b, ib, 0)
    root, depth = _roots(ia, ib, op_node, has_b)
    req = _requires(ops, root, ia, ib, op_node, has_b)
    reached = _reached(req, root, depth, ia, ib, op_node, has_b, loss)
    big = np.maximum(size, size[a0])
    big = np.maximum(big, np.where(has_b, size[b0], 0))
    big = np.where(op_node, big, 0)
    if extra is None:
        xtra = np.zeros(n, dtype=size.dtype)
    else:
        xtra = np.where(op_node, np.array(extra, dtype=size.dtype), 0)   # node_temporary's
    grads = int(size[reached].sum())
    # the sides a node's backward differentiates: those of its inputs that require grad
    sides = (req[a0] & op_node).astype(np.int64) + (req[b0] & has_b)
    sides[~(reached & req & op_node)] = 0
    sides[loss + 1:] = 0
    walked = np.flatnonzero(sides)
    work = _counts(works)
    top_work = int(work.max()) if len(walked) else 0
    if 2 * n * top_work < 1 << 62:         # no sum can overflow int64
        backward_work = int((sides[walked] * work[walked].astype(np.int64)).sum())
    else:
        backward_work = sum(map(operator.mul, sides[walked].tolist(),
                                [int(work[i]) for i in walked.tolist()]))
    # the largest temporary: the first node of the largest forward one, unless a node the
    # backward walk differentiates needs more (the first such from the loss down)
    temporary, temporary_node = 0, -1
    if op_node.any():
        forward = FORWARD_TEMPORARIES * big + xtra
        temporary_node = int(np.argmax(forward))
        temporary = int(forward[temporary_node])
    if len(walked):
        backward = BACKWARD_TEMPORARIES * big[walked] + xtra[walked]
        top = int(backward.max())
        if top > temporary:
            temporary = top
            temporary_node = int(walked[np.flatnonzero(backward == top)[-1]])
    return MemoryEstimate(int(size.sum()), grads, temporary, temporary_node,
                          int(backward_work))


def _counts(counts) -> np.ndarray:
    """Non-negative counts as an int64 array, or of Python ints where one is 2^58 or more
    (then no sum of them in int64 is safe)."""
    if type(counts) is np.ndarray and counts.dtype == np.int64:
        if len(counts) and counts.max() >= 1 << 58:
            return counts.astype(object)
        return counts
    if type(counts) is np.ndarray:
        counts = counts.tolist()
    return np.array(counts, dtype=object if max(counts) >= 1 << 58 else np.int64)


def _roots(ia, ib, op_node, has_b):
    """(root, depth): per node the first node down its chain of unary inputs (``a``
    while ``b`` is -1) that is not a unary op node (a leaf or a binary node: itself, for
    those), and how many steps down it is, by pointer jumping (log2 of the longest chain
    passes; inputs are earlier nodes)."""
    index = np.arange(len(ia))
    unary = op_node & ~has_b
    ptr = np.where(unary, ia, index)
    depth = unary.astype(np.int64)
    # a stretch of nodes each reading the one before (a tape recorded in order) points
    # at once to the node before the stretch
    follows = unary & (ia == index - 1)
    before = np.maximum.accumulate(np.where(follows, 0, index))
    ptr = np.where(follows, before, ptr)
    depth = np.where(follows, index - before, depth)
    for _ in range(len(ia).bit_length() + 1):
        nxt = ptr[ptr]
        if np.array_equal(nxt, ptr):
            break
        depth = depth + depth[ptr]
        ptr = nxt
    return ptr, depth


def _requires(ops, root, ia, ib, op_node, has_b):
    """Which nodes require grad (a param among their ancestors): a unary node as its
    chain's root (:func:`_roots`), a binary node as either input, in order."""
    leaves = np.flatnonzero(~op_node).tolist()
    req_root = bytearray(len(ops))        # 1: the node requires grad (where a root)
    for i in leaves:
        if ops[i] == "param":
            req_root[i] = 1
    binary = np.flatnonzero(op_node & has_b)
    for i, x, y in zip(binary.tolist(), root[ia[binary]].tolist(), root[ib[binary]].tolist()):
        if req_root[x] or req_root[y]:
            req_root[i] = 1
    return np.frombuffer(req_root, dtype=bool)[root]


def _reached(req, root, depth, ia, ib, op_node, has_b, loss: int):
    """The nodes the backward walk from ``loss`` gives a gradient: the loss, and every
    node that requires grad with a path to the loss (a node's consumers require grad
    when it does, so the walk passes through requiring nodes only).

    Where no node is the unary input of two nodes, the unary chains are paths: an
    ancestor of the loss is then a node at most as far down its chain as the farthest
    node of that chain reached from above, and only the binary nodes are walked one by
    one; otherwise every node is."""
    n = len(req)
    if not req[loss]:
        reached = np.zeros(n, dtype=bool)
        reached[loss] = True
        return reached
    unary = op_node & ~has_b
    if not unary.any() or np.bincount(ia[unary], minlength=n).max() <= 1:
        need = {int(root[loss]): int(depth[loss])}   # per chain root: the deepest node
        get = need.get                                # reached on it (absent: none)
        binary = np.flatnonzero((op_node & has_b)[:loss + 1])[::-1]
        for r, xa, da, xb, db in zip(binary.tolist(), root[ia[binary]].tolist(),
                                     depth[ia[binary]].tolist(), root[ib[binary]].tolist(),
                                     depth[ib[binary]].tolist()):
            if r in need:             # r is an ancestor of the loss: so are its inputs
                if da > get(xa, -1):
                    need[xa] = da
                if db > get(xb, -1):
                    need[xb] = db
        deepest = np.full(n, -1, dtype=np.int64)
        deepest[list(need)] = list(need.values())
        reached = (depth <= deepest[root]) & req
        reached[loss] = True
        return reached
    reached = bytearray(n)
    reached[loss] = 1
    a, b = ia.tolist(), ib.tolist()
    reach = bytearray(req.tobytes())        # 1 where a node requires grad
    for i in range(loss, -1, -1):
        if reached[i]:
            x = a[i]
            if x >= 0:
                if reach[x]:
                    reached[x] = 1
                y = b[i]
                if y >= 0 and reach[y]:
                    reached[y] = 1
    return np.frombuffer(bytes(reached), dtype=bool)


# ── sizes as people write them ─────────────────────────────────────────────

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


def parse_size(text) -> int:
    """``"2G"``, ``"512MiB"``, ``"1.5g"``, ``"4096"`` -> bytes (binary units, 1K = 1024)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m and _UNITS.get(m.group(2).lower())
    if not unit:
        raise BudgetError(f"{text!r} is not a size (write e.g. 2G, 512M or 1048576)")
    value = float(m.group(1)) * unit
    if not 1 <= value < 2.0 ** 62:
        raise BudgetError(f"{text!r}: a size must be at least 1 byte and below 4 EiB")
    return int(value)


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'; exact byte counts below 1 KiB."""
    if n < 1024:
        return f"{n} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}"
    return str(n)


def tape_memory(tape, loss: int) -> MemoryEstimate:
    """:func:`estimate_memory` for a recorded :class:`gradtool.tape.Tape`."""
    nodes, values = tape.nodes, tape.values
    shapes = [v.shape for v in values]
    ins = [(shapes[n.a] if n.a >= 0 else None, shapes[n.b] if n.b >= 0 else None)
           for n in nodes]
    works = [node_work(n.op, shapes[i], *ins[i], n.aux) for i, n in enumerate(nodes)]
    extra = [node_temporary(n.op, shapes[i], *ins[i], n.aux) if n.a >= 0 else 0
             for i, n in enumerate(nodes)]
    return estimate_memory([n.op for n in nodes], [n.a for n in nodes], [n.b for n in nodes],
                           [v.size for v in values], works, loss, extra)
