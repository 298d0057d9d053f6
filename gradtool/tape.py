"""The tape: a flat, single-owner arena of op records, and the backward walk.

Every op computes its value eagerly and appends one :class:`Node`.  Inputs
always have smaller ids than the node that reads them, so walking the ids in
reverse is a topological order: :meth:`Tape.backward` is one reverse loop.
Values and gradients live in lists parallel to ``nodes``; the tape owns them
and hands out read-only views (borrows, valid until the node is dropped by
:meth:`Tape.reset_to`).  No closures per node: a tape is plain data, which is
what lets it be saved to a file, emitted as C, or replayed on a device.
"""

from __future__ import annotations

import numbers
from typing import Optional, Sequence

import numpy as np

from .errors import GradtoolError, ShapeError, TapeError
from .ops import OPS, infer_shape


# Overflow to inf, 0/0 = nan and the like are IEEE results the tape records
# faithfully, like the C and CUDA mirrors do; numpy's warnings about them are noise.
def ieee_silent():
    return np.errstate(all="ignore")


class Node:
    """One tape record: op name, input ids (-1 = none), scalar operand, attributes.

    Leaves carry ``name`` (consts with a name are training input slots) and,
    for params, ``l2`` (the weight-decay coefficient the optimizers default to).
    """

    __slots__ = ("op", "a", "b", "s", "aux", "name", "l2")

    def __init__(self, op, a=-1, b=-1, s=0.0, aux=None, name=None, l2=0.0):
        self.op, self.a, self.b, self.s = op, a, b, s
        self.aux, self.name, self.l2 = aux, name, l2

    def __repr__(self):
        extra = f", aux={self.aux}" if self.aux else ""
        label = f", name={self.name!r}" if self.name else ""
        return f"Node({self.op}, a={self.a}, b={self.b}, s={self.s}{extra}{label})"


class GVar:
    """A handle to one tape node: (tape, id).  Supports + - * / @ and unary -."""

    __slots__ = ("tape", "id")

    def __init__(self, tape: "Tape", node_id: int):
        self.tape, self.id = tape, node_id

    @property
    def shape(self) -> tuple:
        return self.tape._checked_value(self).shape

    def __repr__(self):
        if self.id < 0:
            return "GVar(poisoned)"
        return f"GVar(id={self.id}, op={self.tape.nodes[self.id].op}, shape={list(self.shape)})"

    # Operators.  A Python number on either side becomes a scalar op:
    # x + c -> adds(x, c); x - c -> adds(x, -c) (negation is exact);
    # c - x -> adds(neg(x), c); x * c -> muls(x, c); x / c divides by a const
    # leaf holding c, because muls(x, 1/c) would round twice.
    def __add__(self, other):
        return self.tape.adds(self, other) if _is_number(other) else self.tape.add(self, other)

    def __radd__(self, other):
        return self.tape.adds(self, other) if _is_number(other) else NotImplemented

    def __sub__(self, other):
        return self.tape.adds(self, -float(other)) if _is_number(other) else self.tape.sub(self, other)

    def __rsub__(self, other):
        return self.tape.adds(self.tape.neg(self), other) if _is_number(other) else NotImplemented

    def __mul__(self, other):
        return self.tape.muls(self, other) if _is_number(other) else self.tape.mul(self, other)

    def __rmul__(self, other):
        return self.tape.muls(self, other) if _is_number(other) else NotImplemented

    def __truediv__(self, other):
        if _is_number(other):
            return self.tape.div(self, self.tape.const(np.array([float(other)])))
        return self.tape.div(self, other)

    def __rtruediv__(self, other):
        if _is_number(other):
            return self.tape.div(self.tape.const(np.array([float(other)])), self)
        return NotImplemented

    def __matmul__(self, other):
        if self.tape.ok and len(self.shape) == 3:
            return self.tape.bmm(self, other)
        return self.tape.matmul(self, other)

    def __neg__(self):
        return self.tape.neg(self)


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, np.ndarray)


def as_float64_array(data, what: str) -> np.ndarray:
    """A C-contiguous float64 copy of ``data`` with at least one dim, or a clear error."""
    try:
        arr = np.asarray(data)
    except Exception as exc:  # e.g. ragged nested lists
        raise TapeError(f"{what}: cannot convert to an array ({exc})") from None
    if arr.dtype.kind not in "biuf":
        raise TapeError(f"{what}: expected real numbers, got dtype {arr.dtype}")
    if arr.size == 0:
        raise TapeError(f"{what}: empty array (shape {list(arr.shape)}); every dim must be >= 1")
    arr = np.array(arr, dtype=np.float64, order="C", copy=True)
    return arr.reshape((1,)) if arr.ndim == 0 else arr


def _readonly(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


class Tape:
    """A define-by-run tape.  See the module docstring."""

    def __init__(self, raise_on_error: bool = True):
        self.raise_on_error = raise_on_error
        self.nodes: list[Node] = []
        self.values: list[np.ndarray] = []
        self.grads: list[Optional[np.ndarray]] = []   # None = untouched (reads as zeros)
        self.requires: list[bool] = []                # a param is an ancestor
        self.ok = True
        self.error: Optional[str] = None
        self._names: dict[str, int] = {}

    # ── leaves ─────────────────────────────────────────────────────────────
    def param(self, array, name: Optional[str] = None, l2: float = 0.0) -> GVar:
        """Register a parameter (requires grad).  The array is copied in."""
        return self._leaf("param", array, name, float(l2))

    def const(self, array, name: Optional[str] = None) -> GVar:
        """Register a constant.  A named const is an input slot training refills."""
        return self._leaf("const", array, name, 0.0)

    def _leaf(self, op, array, name, l2) -> GVar:
        if not self.ok:
            return self._poisoned_noop()
        if name is not None:
            if not isinstance(name, str) or not name:
                raise TapeError(f"{op} name must be a non-empty string, got {name!r}")
            if name in self._names:
                raise TapeError(f"{op} name {name!r} is already node {self._names[name]}")
        value = as_float64_array(array, f"{op} {name or len(self.nodes)}")
        self._names.update({name: len(self.nodes)} if name else {})
        return self._append(Node(op, name=name, l2=l2), value, op == "param")

    def _append(self, node: Node, value: np.ndarray, requires: bool) -> GVar:
        self.nodes.append(node)
        self.values.append(value)
        self.grads.append(None)
        self.requires.append(requires)
        return GVar(self, len(self.nodes) - 1)

    # ── recording ──────────────────────────────────────────────────────────
    def _id(self, v, role: str) -> int:
        if not isinstance(v, GVar):
            raise TapeError(f"{role}: expected a GVar, got {type(v).__name__}")
        if v.tape is not self:
            raise TapeError(f"{role}: GVar {v.id} belongs to another tape")
        if v.id >= len(self.nodes):
            raise TapeError(f"{role}: node {v.id} no longer exists (dropped by reset_to; "
                            f"the tape has {len(self.nodes)} nodes)")
        return v.id

    def _record(self, op: str, a: GVar, b: Optional[GVar] = None, s: float = 0.0,
                aux: Optional[dict] = None) -> GVar:
        if not self.ok:
            return self._poisoned_noop()
        ia = self._id(a, f"{op} input a")
        ib = self._id(b, f"{op} input b") if b is not None else -1
        sa = self.values[ia].shape
        sb = self.values[ib].shape if ib >= 0 else None
        try:
            infer_shape(op, sa, sb, aux)
        except ShapeError as exc:
            inputs = f"node {ia} {list(sa)}" + (f", node {ib} {list(sb)}" if ib >= 0 else "")
            return self._poison(f"{op} at node {len(self.nodes)}: {exc} (inputs {inputs})")
        vb = self.values[ib] if ib >= 0 else None
        with ieee_silent():
            value = OPS[op].forward(self.values[ia], vb, s, aux)
        requires = self.requires[ia] or (ib >= 0 and self.requires[ib])
        return self._append(Node(op, ia, ib, float(s), aux), value, requires)

    def _poisoned_noop(self) -> GVar:
        if self.raise_on_error:
            raise TapeError(f"the tape is poisoned: {self.error}")
        return GVar(self, -1)

    def _poison(self, message: str) -> GVar:
        self.ok = False
        self.error = message
        if self.raise_on_error:
            raise ShapeError(message)
        return GVar(self, -1)

    def add(self, a, b): return self._record("add", a, b)
    def sub(self, a, b): return self._record("sub", a, b)
    def mul(self, a, b): return self._record("mul", a, b)
    def div(self, a, b): return self._record("div", a, b)
    def neg(self, a): return self._record("neg", a)
    def relu(self, a): return self._record("relu", a)
    def sigmoid(self, a): return self._record("sigmoid", a)
    def tanh(self, a): return self._record("tanh", a)
    def exp(self, a): return self._record("exp", a)
    def log(self, a): return self._record("log", a)
    def sqrt(self, a): return self._record("sqrt", a)
    def sum(self, a): return self._record("sum", a)
    def mean(self, a): return self._record("mean", a)
    def matmul(self, a, b): return self._record("matmul", a, b)
    def bmm(self, a, b): return self._record("bmm", a, b)
    def transpose(self, a): return self._record("transpose", a)

    def adds(self, a, s: float) -> GVar:
        return self._record("adds", a, s=_scalar(s, "adds"))

    def muls(self, a, s: float) -> GVar:
        return self._record("muls", a, s=_scalar(s, "muls"))

    def reshape(self, a, shape: Sequence[int]) -> GVar:
        return self._record("reshape", a, aux={"shape": _int_list(shape, "reshape shape")})

    def softmax(self, a, axis: int = -1) -> GVar:
        return self._record("softmax", a, aux={"axis": self._axis(a, axis, "softmax")})

    def slice(self, a, starts: Sequence[int], stops: Sequence[int]) -> GVar:
        return self._record("slice", a, aux={"starts": _int_list(starts, "slice starts"),
                                             "stops": _int_list(stops, "slice stops")})

    def concat(self, a, b, axis: int = 0) -> GVar:
        return self._record("concat", a, b, aux={"axis": self._axis(a, axis, "concat")})

    def mse(self, y, t) -> GVar:
        """mean((y - t) * (y - t)), recorded as its primitive nodes."""
        d = self.sub(y, t)
        return self.mean(self.mul(d, d))

    def _axis(self, a, axis, what) -> int:
        axis = _int_list([axis], f"{what} axis")[0]
        if not self.ok or not isinstance(a, GVar) or a.tape is not self or a.id < 0:
            return axis          # _record reports the bad input
        rank = len(self._checked_value(a).shape)
        return axis + rank if -rank <= axis < 0 else axis

    # ── reading ────────────────────────────────────────────────────────────
    def __len__(self) -> int:
        return len(self.nodes)

    def _checked_value(self, v) -> np.ndarray:
        if isinstance(v, GVar) and v.id < 0:
            raise TapeError("this GVar is poisoned: " + (self.error or "the tape is poisoned"))
        return self.values[self._id(v, "node")]

    def value(self, v: GVar) -> np.ndarray:
        """The node's value as a read-only view (valid until the node is dropped)."""
        return _readonly(self._checked_value(v))

    def grad(self, v: GVar) -> np.ndarray:
        """dL/d(node) from the last backward, read-only; zeros if untouched."""
        value = self._checked_value(v)
        g = self.grads[v.id]
        return _readonly(g if g is not None else np.zeros(value.shape))

    def touched(self, v: GVar) -> bool:
        """Whether backward reached this node (optimizers skip untouched params)."""
        self._checked_value(v)
        return self.grads[v.id] is not None

    def var(self, ref) -> GVar:
        """A GVar from a node id or a leaf name."""
        if isinstance(ref, str):
            if ref not in self._names:
                raise TapeError(f"no leaf named {ref!r}")
            return GVar(self, self._names[ref])
        if isinstance(ref, numbers.Integral) and 0 <= int(ref) < len(self.nodes):
            return GVar(self, int(ref))
        raise TapeError(f"no node {ref!r} (the tape has {len(self.nodes)} nodes)")

    def params(self) -> list[GVar]:
        return [GVar(self, i) for i, n in enumerate(self.nodes) if n.op == "param"]

    def consts(self) -> list[GVar]:
        return [GVar(self, i) for i, n in enumerate(self.nodes) if n.op == "const"]

    def input_slots(self) -> list[GVar]:
        """Named consts: the slots training fills per minibatch."""
        return [GVar(self, i) for i, n in enumerate(self.nodes) if n.op == "const" and n.name]

    # ── replay ─────────────────────────────────────────────────────────────
    def set_value(self, v: GVar, array) -> None:
        """Overwrite a leaf's value in place (same shape): a new minibatch, a new weight."""
        i = self._id(v, "set_value")
        if self.nodes[i].op not in ("param", "const"):
            raise TapeError(f"node {i} is a {self.nodes[i].op}, not a leaf; only leaves can be set")
        data = as_float64_array(array, f"value for node {i}")
        if data.shape != self.values[i].shape:
            raise ShapeError(f"node {i} ({self.nodes[i].name or self.nodes[i].op}) has shape "
                             f"{list(self.values[i].shape)}, got {list(data.shape)}")
        self.values[i][...] = data

    def forward(self, start: int = 0, only: Optional[Sequence[bool]] = None) -> None:
        """Recompute every op node's value from the leaves, in tape order.

        ``only`` (one flag per node) limits the replay to the flagged nodes,
        e.g. the descendants of one perturbed parameter.
        """
        self._require_ok()
        with ieee_silent():
            self._replay(start, only)

    def _replay(self, start, only) -> None:
        values, nodes = self.values, self.nodes
        for i in range(start, len(nodes)):
            node = nodes[i]
            if node.a < 0 or (only is not None and not only[i]):
                continue
            vb = values[node.b] if node.b >= 0 else None
            values[i] = OPS[node.op].forward(values[node.a], vb, node.s, node.aux)

    # ── backward ───────────────────────────────────────────────────────────
    def backward(self, loss: GVar) -> None:
        """Accumulate dL/d(node) for every ancestor of the one-element ``loss``.

        The loss is seeded with 1.0.  Intermediate gradients are recomputed
        from scratch; leaf gradients accumulate across calls (use
        :meth:`zero_grad` or :meth:`reset_to` between episodes).  Each
        contribution is added into its input's slot as ``grad = grad + c``
        (a slot starts as +0.0), in reverse node order.
        """
        self._require_ok()
        li = self._id(loss, "backward loss")
        if self.values[li].size != 1:
            raise TapeError(f"loss node {li} has shape {list(self.values[li].shape)}; "
                            f"backward needs a one-element loss")
        with ieee_silent():
            self._backward_walk(li)

    def _backward_walk(self, li: int) -> None:
        nodes, values, grads, requires = self.nodes, self.values, self.grads, self.requires
        for i, node in enumerate(nodes):
            if node.a >= 0:
                grads[i] = None
        grads[li] = np.ones(values[li].shape)
        for i in range(li, -1, -1):
            g = grads[i]
            node = nodes[i]
            if g is None or node.a < 0 or not requires[i]:
                continue
            a, b = node.a, node.b
            need_a = requires[a]
            need_b = b >= 0 and requires[b]
            if not (need_a or need_b):
                continue
            vb = values[b] if b >= 0 else None
            ca, cb = OPS[node.op].backward(g, values[a], vb, values[i], node.s, node.aux,
                                           need_a, need_b)
            if need_a:
                self._accumulate(a, ca)
            if need_b:
                self._accumulate(b, cb)

    def _accumulate(self, i: int, c: np.ndarray) -> None:
        slot = self.grads[i]
        if slot is None:
            self.grads[i] = c + 0.0       # = zeros + c, as a fresh array
        else:
            np.add(slot, c, out=slot)

    def zero_grad(self) -> None:
        """Forget every gradient (all read as zeros, all untouched)."""
        self.grads = [None] * len(self.nodes)

    # ── files ──────────────────────────────────────────────────────────────
    def save(self, dest, loss=None, outputs=None, meta=None, values=False, optimizer=None):
        """Write this tape as a v1 tape file (see :mod:`gradtool.tapefile`)."""
        from .tapefile import save
        save(self, dest, loss=loss, outputs=outputs, meta=meta, values=values, optimizer=optimizer)

    # ── episodes ───────────────────────────────────────────────────────────
    def mark(self) -> int:
        """A watermark for :meth:`reset_to`: the current node count."""
        return len(self.nodes)

    def reset_to(self, mark: int) -> None:
        """Drop every node with id >= mark and zero the gradients of the rest."""
        if not isinstance(mark, numbers.Integral) or not 0 <= mark <= len(self.nodes):
            raise TapeError(f"mark {mark!r} is outside [0, {len(self.nodes)}]")
        for node in self.nodes[mark:]:
            if node.name:
                self._names.pop(node.name, None)
        del self.nodes[mark:], self.values[mark:], self.requires[mark:]
        self.grads = [None] * mark
        self.ok, self.error = True, None

    def _require_ok(self):
        if not self.ok:
            raise TapeError(f"the tape is poisoned: {self.error}")


# ── what backward reaches ──────────────────────────────────────────────────

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
            req.append(req[node.a] or (node.b >= 0 and req[node.b]))
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
        if requires[node.a]:
            reached[node.a] = True
        if node.b >= 0 and requires[node.b]:
            reached[node.b] = True
    return reached


def _scalar(s, what) -> float:
    if not _is_number(s):
        raise TapeError(f"{what}: scalar operand must be a real number, got {type(s).__name__}")
    return float(s)


def _int_list(values, what) -> list:
    try:
        items = list(values)
    except TypeError:
        raise TapeError(f"{what}: expected a sequence of integers, got {values!r}") from None
    out = []
    for x in items:
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise TapeError(f"{what}: expected integers, got {x!r}")
        out.append(int(x))
    return out


__all__ = ["Tape", "GVar", "Node", "GradtoolError"]
