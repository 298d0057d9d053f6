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

import inspect
import math
import numbers
from typing import Optional, Sequence

import numpy as np

from .errors import DtypeError, GradtoolError, IdsError, ShapeError, TapeError
from .limits import MAX_DIMS
from .ops import (FLOAT_DTYPES, INT_DTYPE, INTEGER_READERS, OPS, RNG_NAME,
                  RNG_RECORDED, bad_id, bad_rng, dtype_of, first_bad_id, inexact_int,
                  infer_dtype, infer_shape)
# the handle, the leaf arrays, the argument checks and the walk live beside this module
# (gvar.py, leaves.py, tape_checks.py, tape_walk.py); their names stay importable here
from .gvar import GVar, _operand, _rscalar, _unsupported  # noqa: F401
from .leaves import (_KIND_NAMES, _kind_name, _leaf_array, _leaf_dtype,  # noqa: F401
                     as_float64_array, as_ids_array)
from .tape_checks import (_int_list, _one_line, _readonly, _real, _scalar,  # noqa: F401
                          check_ids, check_name, is_index, is_number, show_int)
from .tape_walk import f32_refusal, first_f32, ids_culprit, reach, requires_wrt  # noqa: F401


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
        # one store per field: a fifth faster than tuple assignments (a million nodes
        # are made when a tape at the node limit is loaded)
        self.op = op
        self.a = a
        self.b = b
        self.s = s
        self.aux = aux
        self.name = name
        self.l2 = l2

    def __repr__(self):
        extra = f", aux={self.aux}" if self.aux else ""
        label = f", name={self.name!r}" if self.name else ""
        return f"Node({self.op}, a={self.a}, b={self.b}, s={self.s}{extra}{label})"


_UNARY = object()      # _record's "no second input" (None is a bad input, not an absent one)


class Tape:
    """A define-by-run tape.  See the module docstring.

    Handles: every node is born with a serial number that is never reused,
    and a :class:`GVar` carries its node's serial.  :meth:`node_id` -- the one
    check every entry point goes through -- refuses a handle that is poisoned,
    dropped by :meth:`reset_to` (even when a new node has taken its id),
    from another tape, or not a GVar at all.

    Poison: an op whose inputs' shapes do not combine (or whose result cannot
    be allocated) records nothing and poisons the tape (``ok`` False,
    ``error`` the message).  With ``raise_on_error=True`` (the default) it
    raises :class:`~gradtool.errors.ShapeError` (or ``TapeError``); otherwise
    it returns a poisoned GVar.  Poison propagates: while the tape is
    poisoned, every op and leaf returns a poisoned GVar without computing
    (or raises ``TapeError`` with ``raise_on_error=True``), and ``forward``,
    ``backward``, saving and capture refuse the tape.  :meth:`reset_to` clears
    it.  A poisoned GVar is refused everywhere else, also after the reset.
    """

    def __init__(self, raise_on_error: bool = True):
        if not isinstance(raise_on_error, (bool, np.bool_)):
            raise TapeError(f"raise_on_error must be True or False, got {raise_on_error!r}")
        self.raise_on_error = bool(raise_on_error)
        self.nodes: list[Node] = []
        self.values: list[np.ndarray] = []
        self.grads: list[Optional[np.ndarray]] = []   # None = untouched (reads as zeros)
        self.requires: list[bool] = []                # a param is an ancestor
        self.integral: list[bool] = []                # values are whole numbers (ids)
        self.serials: list[int] = []                  # each node's birth stamp, never reused
        self._next_serial = 0
        self.ok = True
        self.error: Optional[str] = None
        self._names: dict[str, int] = {}

    # ── handles ────────────────────────────────────────────────────────────
    def node_id(self, v, role: str = "node") -> int:
        """The id of ``v`` if it is a live handle of this tape; TapeError otherwise."""
        if not isinstance(v, GVar):
            raise TapeError(f"{role}: expected a GVar, got {type(v).__name__}")
        if v.tape is not self:
            raise TapeError(f"{role}: GVar {v.id} belongs to another tape")
        if v.id < 0:
            raise TapeError(f"{role}: this GVar is poisoned (the op that returned it failed"
                            + (f": {self.error})" if self.error else "; see tape.error then)"))
        if v.serial < 0:
            raise TapeError(f"{role}: GVar {v.id} was not made by this tape (build handles with "
                            f"tape.var(id), not GVar(tape, id))")
        if v.id >= len(self.nodes) or self.serials[v.id] != v.serial:
            now = ("another node has its id now" if v.id < len(self.nodes)
                   else f"the tape has {len(self.nodes)} nodes")
            raise TapeError(f"{role}: node {v.id} was dropped by reset_to ({now})")
        return v.id

    def _live(self, v: GVar) -> bool:
        return 0 <= v.id < len(self.nodes) and self.serials[v.id] == v.serial

    def check_serial(self, node_id: int, serial: int, role: str) -> None:
        """Refuse a node id recorded earlier (an optimizer's entry, a capture) that no
        longer names the same node."""
        if not (0 <= node_id < len(self.nodes) and self.serials[node_id] == serial):
            raise TapeError(f"{role}: node {node_id} was dropped by reset_to since it was "
                            f"registered")

    def _handle(self, i: int) -> GVar:
        return GVar(self, i, self.serials[i])

    # ── leaves ─────────────────────────────────────────────────────────────
    def param(self, array, name: Optional[str] = None, l2: float = 0.0,
              dtype: Optional[str] = None) -> GVar:
        """Register a parameter (requires grad).  The array is copied in.

        ``l2`` (a finite number >= 0) is the weight-decay coefficient optimizers
        default to for this param.  ``dtype`` ("f64" or "f32"; default: "f32" for a
        float32 array, else "f64") is the param's float dtype; data of another dtype
        is converted (float64 to float32: rounded once to nearest even).
        """
        l2 = _real(l2, f"param {name or len(self.nodes)} l2", nonneg=True)
        return self._leaf("param", array, name, l2, dtype=_leaf_dtype(array, dtype, "param"))

    def const(self, array, name: Optional[str] = None, dtype: Optional[str] = None) -> GVar:
        """Register a constant.  A named const is an input slot training refills.

        ``dtype`` (default: "f32" for a float32 array, else "f64") is the const's
        dtype; "f32"/"f64" convert float or integer data (float64 to float32:
        rounded once).  ``dtype="i64"``: integer data (int data only; float data is
        refused): ids for ``take`` and ``take_along``, or values the ops reading
        integer data (comparisons, ``where``, ``to_f64``) read as exact float64
        (docs/ops.md).
        """
        if dtype is not None and dtype not in FLOAT_DTYPES + (INT_DTYPE,):
            raise TapeError(f"const dtype must be 'f64' or '{INT_DTYPE}' (or 'f32': float32 "
                            f"values), got {dtype!r}"[:200])
        if dtype == INT_DTYPE:
            return self._leaf("const", array, name, 0.0, ids=True)
        return self._leaf("const", array, name, 0.0, dtype=_leaf_dtype(array, dtype, "const"))

    def cast(self, a, dtype: str) -> GVar:
        """``a``'s values in the float dtype ``dtype`` ("f32" or "f64"): torch's
        ``Tensor.to(dtype)``.  f64 -> f32 rounds each value once to nearest even; f32 ->
        f64 is exact; the gradient is cast back.  ``a`` itself when it already has that
        dtype (no node is recorded).  Integer data converts with ``to_f64`` first."""
        if dtype not in FLOAT_DTYPES:
            raise TapeError(f"cast: dtype must be 'f32' or 'f64', got {dtype!r}"[:200])
        ia = self._input(a, "cast input a")
        if ia >= 0 and self.ok and dtype_of(self.values[ia]) == dtype:
            return a
        return self._record_op(OPS["cast"], a, _UNARY, 0.0, {"dtype": dtype})

    def _leaf(self, op, array, name, l2, ids=False, dtype="f64") -> GVar:
        if not self.ok:
            return self._poisoned_noop()
        if name is not None:
            check_name(name, f"{op} name")
            if name in self._names:
                raise TapeError(f"{op} name {name!r} is already node {self._names[name]}")
        value = _leaf_array(array, f"{op} {name or len(self.nodes)}", ids, dtype)
        if name == RNG_NAME:
            problem = ("it is reserved for a const" if op != "const" else
                       bad_rng(value, dtype=INT_DTYPE if ids else "f64"))
            if problem:
                raise TapeError(f"{op} name {name!r}: {problem} (Tape.rng() records it)")
        self._names.update({name: len(self.nodes)} if name else {})
        return self._append(Node(op, name=name, l2=l2), value, op == "param")

    def _append(self, node: Node, value: np.ndarray, requires: bool) -> GVar:
        self.nodes.append(node)
        self.values.append(value)
        self.grads.append(None)
        self.requires.append(requires)
        self.integral.append(node.a < 0 and value.dtype == np.int64)
        self.serials.append(self._next_serial)
        self._next_serial += 1
        return GVar(self, len(self.nodes) - 1, self.serials[-1])

    # ── recording ──────────────────────────────────────────────────────────
    def _input(self, v, role: str) -> int:
        """An op input: a live handle; on a poisoned tape also a poisoned one (-1)."""
        if not self.ok and isinstance(v, GVar) and v.tape is self and v.id < 0:
            return -1
        return self.node_id(v, role)

    def _record(self, op: str, a: GVar, b=_UNARY, s: float = 0.0,
                aux: Optional[dict] = None) -> GVar:
        ia = self._input(a, f"{op} input a")
        ib = self._input(b, f"{op} input b") if b is not _UNARY else -1
        if not self.ok:
            return self._poisoned_noop()
        sa = self.values[ia].shape
        sb = self.values[ib].shape if ib >= 0 else None
        here = f"{op} at node {len(self.nodes)}"
        spec = OPS[op]
        for role, ix in (("a", ia), ("b", ib)):
            if ix >= 0 and self.holds_ids(ix) and role not in spec.int_inputs:
                return self._poison(f"{here}: input {role} (node {ix}) holds integer data, "
                                    f"which {op} does not read ({INTEGER_READERS})", TapeError)
            if (ix >= 0 and self.holds_ids(ix) and role not in spec.id_inputs
                    and inexact_int(self.values[ix])):
                return self._poison(f"{here}: input {role} (node {ix}): "
                                    f"{inexact_int(self.values[ix])}", TapeError)
            if ix >= 0 and role == "a" and spec.rng_input and self.nodes[ix].name != RNG_NAME:
                return self._poison(f"{here}: input a (node {ix}) must be the tape's rng slot, "
                                    f"the const named {RNG_NAME!r} (Tape.rng()); node {ix} is "
                                    f"a {self.nodes[ix].op}", TapeError)
            if ix >= 0 and role in spec.id_inputs and not self.integral[ix]:
                return self._poison(f"{here}: input {role} (node {ix}) must be integer ids: a "
                                    f"const recorded with dtype='{INT_DTYPE}', or integer-valued "
                                    f"ops of one (docs/ops.md; node {ix} is a "
                                    f"{self.nodes[ix].op})", TapeError)
        try:
            infer_dtype(op, dtype_of(self.values[ia]),
                        dtype_of(self.values[ib]) if ib >= 0 else None, aux)
        except DtypeError as exc:
            return self._poison(f"{here}: {exc}", DtypeError)
        try:
            shape = infer_shape(op, sa, sb, aux)
        except ShapeError as exc:
            inputs = f"node {ia} {list(sa)}" + (f", node {ib} {list(sb)}" if ib >= 0 else "")
            return self._poison(f"{here}: {exc} (inputs {inputs})")
        if len(shape) > MAX_DIMS:
            return self._poison(f"{here}: the result has {len(shape)} dims; a tape file "
                                f"allows at most {MAX_DIMS}")
        if spec.id_inputs:
            problem = bad_id(self.values[ib], spec.index_bound(sa, aux))
            if problem:
                return self._poison(f"{here}: ids node {ib}: {problem} "
                                    f"({_ids_reader(spec, sa, aux)})",
                                    TapeError)
        vb = self.values[ib] if ib >= 0 else None
        try:
            with ieee_silent():
                value = OPS[op].forward(self.values[ia], vb, s, aux)
        except MemoryError:
            n = math.prod(shape)
            return self._poison(f"{here}: out of memory for the result {list(shape)} "
                                f"({n} elements)", TapeError)
        return self._append_op(op, ia, ib, s, aux, value)

    def _append_op(self, op: str, ia: int, ib: int, s: float, aux: Optional[dict],
                   value: np.ndarray) -> GVar:
        """Append an op node whose inputs, shape and ids are checked and whose value is
        computed (by :meth:`_record`, or by the file loader, which checked them itself)."""
        if value.base is not None:       # never alias an input (a transpose of a [1,n] leaf)
            value = value.copy()
        spec = OPS[op]
        grad_in = spec.grad_inputs
        requires = (("a" in grad_in and self.requires[ia])
                    or (ib >= 0 and "b" in grad_in and self.requires[ib]))
        out = self._append(Node(op, ia, ib, float(s), aux), value, requires)
        if spec.integral:
            self.integral[-1] = spec.integral_of(self.integral[ia], ib < 0 or self.integral[ib],
                                                 float(s))
        return out

    def _poisoned_noop(self) -> GVar:
        if self.raise_on_error:
            raise TapeError(f"the tape is poisoned: {self.error}")
        return GVar(self, -1, -1)

    def _poison(self, message: str, kind=ShapeError) -> GVar:
        self.ok = False
        self.error = message
        if self.raise_on_error:
            raise kind(message)
        return GVar(self, -1, -1)

    # the op methods (add, exp, softmax, ...) are generated from the op table below the
    # class: one per op, with the op's inputs, scalar operand and attributes as arguments

    def record(self, op: str, a, b=None, *, s: float = 0.0, attrs: Optional[dict] = None) -> GVar:
        """Record any op of the table by name (what the op methods and the file loader use).

        ``attrs`` holds the op's attributes by name (``{"axis": 1}``), checked
        and normalised like the op method's arguments.
        """
        spec = OPS.get(op) if isinstance(op, str) else None
        if spec is None or spec.arity == 0:
            raise TapeError(f"record: {op!r} is not an op of the table")
        if (b is None) != (spec.arity == 1):
            raise TapeError(f"record: {op} takes {spec.arity} input(s)")
        attrs = dict(attrs or {})
        unknown = set(attrs) - {at.name for at in spec.attrs}
        if unknown:
            raise TapeError(f"record: {op} has no attribute(s) {sorted(unknown)}")
        missing = [at.name for at in spec.attrs if at.required and at.name not in attrs]
        if missing:
            raise TapeError(f"record: {op} needs attribute(s) {missing}")
        values = {at.name: attrs.get(at.name, at.default) for at in spec.attrs}
        return self._record_op(spec, a, b if spec.arity == 2 else _UNARY,
                               _scalar(s, op) if spec.scalar_operand else 0.0, values)

    def _record_op(self, spec, a, b, s: float, values: dict) -> GVar:
        aux = {}
        for at in spec.attrs:
            value = self._attr(spec.name, at, values[at.name], a)
            if not (at.optional and value == at.default and type(value) is type(at.default)):
                aux[at.name] = value        # an optional attribute at its default is absent
        return self._record(spec.name, a, b, s, aux or None)

    def _attr(self, op: str, at, value, a):
        if at.kind == "axis":
            return None if value is None and at.optional else self._axis(a, value, op)
        if at.kind == "dtype":
            if value not in FLOAT_DTYPES:
                raise TapeError(f"{op} {at.name}: expected 'f32' or 'f64', got {value!r}"[:200])
            return value
        if at.kind == "flag":
            if not isinstance(value, (bool, np.bool_)):
                raise TapeError(f"{op} {at.name}: expected True or False, got {value!r}"[:200])
            return bool(value)
        if value is None and at.optional:
            return None
        what = f"{op} {at.name}"
        if at.kind == "perm":
            return [self._axis(a, d, what) for d in _int_list(value, what)]
        if at.kind == "count":
            count = _int_list([value], what)[0]
            if count < 1:
                raise TapeError(f"{what}: expected an integer >= 1, got {count}")
            return count
        if at.kind == "natural":
            n = _int_list([value], what)[0]
            if not 0 <= n < 2 ** 63:
                raise TapeError(f"{what}: expected an integer in [0, 2^63), got {n}"[:200])
            return n
        return _int_list(value, what)

    # ── masks (composites over the op table's comparisons, keep and keep_not) ──
    def where(self, mask, a, b) -> GVar:
        """``a`` where ``mask`` holds (is not 0.0), else ``b``, broadcasting all three like
        torch.where; exact copies (signed zeros, infinities and NaNs kept).

        Recorded as ``keep(a, mask) + keep_not(b, mask)`` (docs/ops.md: x + (-0.0) is
        x exactly).  The gradient goes to ``a`` where the mask holds, to ``b``
        elsewhere, none to the mask.  ``a`` or ``b`` may be a Python number (an int
        becomes an i64 const, so ids stay integer-valued; a float an f64 const).
        """
        if is_number(mask):
            raise TapeError("where: the mask must be a GVar (a comparison's mask), got "
                            f"{type(mask).__name__}")
        a = self._number_leaf(a, "where input a", like=b)
        b = self._number_leaf(b, "where input b", like=a)
        return self.add(self.keep(a, mask), self.keep_not(b, mask))

    def logical_and(self, m, n) -> GVar:
        """m AND n on masks of 0.0/1.0: ``m * n`` (exact on {0, 1})."""
        return self.mul(m, n)

    def logical_or(self, m, n) -> GVar:
        """m OR n on masks of 0.0/1.0: ``maximum(m, n)`` (exact on {0, 1})."""
        return self.maximum(m, n)

    def logical_not(self, m) -> GVar:
        """NOT m: ``eq(m, 0)``, 1.0 where m is 0.0 (either sign), else 0.0 (a NaN counts
        as true, as in where)."""
        return self.eq(m, self._number_leaf(0.0, "logical_not", like=m))

    def _number_leaf(self, x, what: str, like=None):
        """A Python number as a one-element const, else ``x``: beside an f32 node ``like``
        (a GVar) a const of dtype f32 (the number rounded to float32 once, as torch
        rounds a Python number with a float32 tensor); otherwise an int gives an i64
        const and a float an f64 const."""
        if not is_number(x):
            return x
        f32 = self._float_like(like) == "f32"
        if isinstance(x, numbers.Integral) and not f32:
            if not -2 ** 63 <= int(x) < 2 ** 63:
                raise TapeError(f"{what}: {show_int(x)} does not fit in an int64")
            return self.const(np.array([int(x)], dtype=np.int64), dtype=INT_DTYPE)
        return self.const(np.array([_scalar(x, what)]), dtype="f32" if f32 else "f64")

    def const_like(self, like, array, name: Optional[str] = None) -> GVar:
        """A const of ``array`` in the float dtype of ``like`` (a GVar): what a composite
        records beside its operand (a count, ones, an eps), rounded to float32 once
        beside an f32 value; f64 beside anything else."""
        return self.const(array, name=name,
                          dtype="f32" if self._float_like(like) == "f32" else "f64")

    def _float_like(self, like) -> Optional[str]:
        """The float dtype of ``like`` when it is a live GVar of this tape holding floats."""
        if isinstance(like, GVar) and like.tape is self and self._live(like):
            d = dtype_of(self.values[like.id])
            return d if d in FLOAT_DTYPES else None
        return None

    def mse(self, y, t) -> GVar:
        """mean((y - t) * (y - t)), recorded as its primitive nodes."""
        d = self.sub(y, t)
        return self.mean(self.mul(d, d))

    def clamp(self, a, lo=None, hi=None) -> GVar:
        """``torch.clamp(a, min=lo, max=hi)`` for Python numbers lo and hi (either may be
        None, not both): ``clamp_max(clamp_min(a, lo), hi)``, recorded as those ops.  A
        NaN stays NaN; the gradient passes where lo <= a <= hi (inclusive, as PyTorch's),
        and nowhere when lo > hi (every value is then hi, as PyTorch gives)."""
        if lo is None and hi is None:
            raise TapeError("clamp: give lo, hi or both (as torch.clamp)")
        out = a if lo is None else self.clamp_min(a, _scalar(lo, "clamp"))
        return out if hi is None else self.clamp_max(out, _scalar(hi, "clamp"))

    def _axis(self, a, axis, what) -> int:
        """An axis argument as an int, a negative one counted from the end of ``a``'s shape."""
        axis = _int_list([axis], f"{what} axis")[0]
        if not self.ok or not isinstance(a, GVar) or not self._live(a) or a.tape is not self:
            return axis          # _record reports the bad input
        rank = len(self.values[a.id].shape)
        return axis + rank if -rank <= axis < 0 else axis

    # ── reading ────────────────────────────────────────────────────────────
    def __len__(self) -> int:
        return len(self.nodes)

    def _checked_value(self, v) -> np.ndarray:
        return self.values[self.node_id(v)]

    def value(self, v: GVar) -> np.ndarray:
        """The node's value now: a read-only COPY (a snapshot that a later
        :meth:`set_value` or :meth:`forward` does not change), like :meth:`grad`.

        (A live view would make every replay copy each node's result into the
        old buffer, an extra memory pass per node on the hot path.)
        """
        return _readonly(self._checked_value(v).copy())

    def grad(self, v: GVar) -> np.ndarray:
        """dL/d(node) from the last backward: a read-only COPY (a snapshot that a later
        backward does not change); zeros if backward did not reach the node."""
        value = self._checked_value(v)
        g = self.grads[v.id]
        return _readonly(g.copy() if g is not None else np.zeros(value.shape,
                                                                  dtype=value.dtype))

    def touched(self, v: GVar) -> bool:
        """Whether backward reached this node (optimizers skip untouched params)."""
        return self.grads[self.node_id(v, "touched")] is not None

    def var(self, ref, *args, **kwargs) -> GVar:
        """A GVar from a node id or a leaf name (the variance is :meth:`variance`)."""
        if args or kwargs:
            raise TapeError("var(ref) gives the handle of a node id or leaf name; torch's "
                            "var(a, dim, correction, keepdim) is "
                            "tp.variance(a, axis, correction, keepdims)")
        if isinstance(ref, str):
            if ref not in self._names:
                raise TapeError(f"no leaf named {ref!r}")
            return self._handle(self._names[ref])
        if isinstance(ref, GVar):
            return self._handle(self.node_id(ref, "var"))
        if is_index(ref) and 0 <= int(ref) < len(self.nodes):
            return self._handle(int(ref))
        raise TapeError(f"node {ref!r} does not exist (the tape has {len(self.nodes)} nodes; "
                        f"pass a GVar, a node id or a leaf name)"[:300])

    def params(self) -> list[GVar]:
        return [self._handle(i) for i, n in enumerate(self.nodes) if n.op == "param"]

    def consts(self) -> list[GVar]:
        return [self._handle(i) for i, n in enumerate(self.nodes) if n.op == "const"]

    def input_slots(self) -> list[GVar]:
        """Named consts: the slots training fills per minibatch (not the rng slot, which
        training sets itself: :meth:`rng`)."""
        return [self._handle(i) for i, n in enumerate(self.nodes)
                if n.op == "const" and n.name and n.name != RNG_NAME]

    def rng(self) -> GVar:
        """The tape's one rng slot: the [3] float64 const named ``gradtool.rng`` holding
        (step, shard, train flag), which every ``uniform`` node (so every
        ``gradtool.nn.dropout``) reads.  Recorded as [0, 0, 1] on first use; later calls
        return the same node.  ``gradtool train`` sets it before every forward
        (docs/training.md): [global step, shard, 1] when training, flag 0 to validate."""
        if RNG_NAME in self._names:
            return self._handle(self._names[RNG_NAME])
        return self.const(np.array(RNG_RECORDED), name=RNG_NAME)

    def rng_id(self) -> int:
        """The rng slot's node id, or -1 when the tape has none."""
        return self._names.get(RNG_NAME, -1)

    # ── replay ─────────────────────────────────────────────────────────────
    def set_value(self, v: GVar, array) -> None:
        """Overwrite a leaf's value in place (same shape): a new minibatch, a new weight.

        An ids leaf takes integer data only, every id in range for every op reading it.
        """
        i = self.node_id(v, "set_value")
        if self.nodes[i].op not in ("param", "const"):
            raise TapeError(f"node {i} is a {self.nodes[i].op}, not a leaf; only leaves can be set")
        data = _leaf_array(array, f"value for node {i}", self.holds_ids(i),
                           dtype_of(self.values[i]) if not self.holds_ids(i) else "f64")
        if data.shape != self.values[i].shape:
            raise ShapeError(f"node {i} ({self.nodes[i].name or self.nodes[i].op}) has shape "
                             f"{list(self.values[i].shape)}, got {list(data.shape)}")
        if self.nodes[i].name == RNG_NAME and bad_rng(data):
            raise TapeError(f"value for node {i}: {bad_rng(data)}")
        if self.holds_ids(i):
            check_ids(data, self.id_bounds(i), f"value for node {i}")
            if self.read_as_values(i) and inexact_int(data):
                raise TapeError(f"value for node {i}: {inexact_int(data)}")
        self.values[i][...] = data

    def holds_ids(self, i: int) -> bool:
        """Whether node ``i`` is a const of integer data (dtype i64)."""
        return self.values[i].dtype == np.int64

    def read_as_values(self, i: int) -> bool:
        """Whether some op reads integer node ``i`` as float64 values (a comparison, keep,
        to_f64: every value must then be exact, |v| <= 2^53), not only as ids."""
        return any(OPS[n.op].int_inputs and ((n.a == i and "a" not in OPS[n.op].id_inputs)
                                             or (n.b == i and "b" not in OPS[n.op].id_inputs))
                   for n in self.nodes)

    def id_bounds(self, i: int) -> list:
        """[(node, bound)] for every op reading node ``i`` as ids: each id must be < bound."""
        out = []
        for j, node in enumerate(self.nodes):
            spec = OPS[node.op]
            if spec.id_inputs and node.b == i:
                out.append((j, spec.index_bound(self.values[node.a].shape, node.aux)))
        return out

    def forward(self, start: int = 0, only: Optional[Sequence[bool]] = None) -> None:
        """Recompute every op node's value from the leaves, in tape order.

        ``start`` skips the nodes before it (their values must be current).
        ``only`` (one flag per node) limits the replay to the flagged nodes,
        e.g. the descendants of one perturbed parameter.
        """
        self._require_ok()
        if not is_index(start) or not 0 <= int(start) <= len(self.nodes):
            raise TapeError(f"forward start must be a node id in [0, {len(self.nodes)}], "
                            f"got {start!r}")
        if only is not None:
            try:
                ok = len(only) == len(self.nodes)
            except TypeError:
                ok = False
            if not ok:
                raise TapeError(f"forward only= must be a sequence of {len(self.nodes)} flags "
                                f"(one per node)")
        with ieee_silent():
            self._replay(int(start), only)

    def _replay(self, start, only) -> None:
        values, nodes = self.values, self.nodes
        for i in range(start, len(nodes)):
            node = nodes[i]
            if node.a < 0 or (only is not None and not only[i]):
                continue
            vb = values[node.b] if node.b >= 0 else None
            spec = OPS[node.op]
            if spec.id_inputs and nodes[node.b].a >= 0:
                self.check_computed_ids(i)
            value = spec.forward(values[node.a], vb, node.s, node.aux)
            values[i] = value if value.base is None else value.copy()   # never an alias

    def check_computed_ids(self, i: int) -> None:
        """Raise GradtoolError unless every id node ``i`` (take/take_along) reads from the
        node computing them is a whole number in range."""
        node = self.nodes[i]
        spec = OPS[node.op]
        bound = spec.index_bound(self.values[node.a].shape, node.aux)
        ids = self.values[node.b]
        problem = bad_id(ids, bound)
        if problem:
            k = first_bad_id(ids, bound)
            raise IdsError(f"node {i} ({node.op}): its ids, computed by node {node.b} "
                           f"({self.nodes[node.b].op}): {problem} "
                           f"({_ids_reader(spec, self.values[node.a].shape, node.aux)})",
                           node=i, ids_node=node.b, bound=bound, index=k,
                           value=float(np.ravel(ids)[k]))

    # ── backward ───────────────────────────────────────────────────────────
    def backward(self, loss: GVar) -> None:
        """Accumulate dL/d(node) for every ancestor of the one-element ``loss``.

        The loss is seeded with 1.0.  Intermediate gradients are recomputed
        from scratch; leaf gradients accumulate across calls (use
        :meth:`zero_grad` or :meth:`reset_to` between episodes).  Each
        contribution is added into its input's slot as ``grad = grad + c``
        (a slot starts as +0.0), in reverse node order.
        """
        li = self.node_id(loss, "backward loss")
        self._require_ok()
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
        grads[li] = np.ones(values[li].shape, dtype=values[li].dtype)
        for i in range(li, -1, -1):
            g = grads[i]
            node = nodes[i]
            if g is None or node.a < 0 or not requires[i]:
                continue
            a, b = node.a, node.b
            spec = OPS[node.op]
            need_a = requires[a] and spec.grad_to("a")
            need_b = b >= 0 and requires[b] and spec.grad_to("b")
            if not (need_a or need_b):
                continue
            vb = values[b] if b >= 0 else None
            ca, cb = spec.backward(g, values[a], vb, values[i], node.s, node.aux,
                                           need_a, need_b)
            if need_a:
                self._accumulate(a, ca, spec.fresh_grads)
            if need_b:
                self._accumulate(b, cb, spec.fresh_grads)

    def _accumulate(self, i: int, c: np.ndarray, fresh: bool = False) -> None:
        slot = self.grads[i]
        if slot is None:
            # = zeros + c, as a fresh array; an op whose contributions are new arrays
            # without -0.0 (ops.OpSpec.fresh_grads: the products) gives c itself, which
            # is that sum bit for bit
            self.grads[i] = c if fresh and c.dtype.kind == "f" else c + 0.0
        else:
            np.add(slot, c, out=slot)

    def zero_grad(self) -> None:
        """Forget every gradient (all read as zeros, all untouched)."""
        self.grads = [None] * len(self.nodes)

    # ── episodes ───────────────────────────────────────────────────────────
    def mark(self) -> int:
        """A watermark for :meth:`reset_to`: the current node count."""
        return len(self.nodes)

    def reset_to(self, mark: int) -> None:
        """Drop every node with id >= mark and zero the gradients of the rest.

        Handles to the dropped nodes are refused from now on, also once new
        nodes take their ids.  Clears the poison.
        """
        if not is_index(mark) or not 0 <= int(mark) <= len(self.nodes):
            raise TapeError(f"mark {mark!r} is not a mark of this tape (an int in "
                            f"[0, {len(self.nodes)}] from tape.mark())")
        mark = int(mark)
        for node in self.nodes[mark:]:
            if node.name:
                self._names.pop(node.name, None)
        del self.nodes[mark:], self.values[mark:], self.requires[mark:], self.serials[mark:]
        del self.integral[mark:]
        self.grads = [None] * mark
        self.ok, self.error = True, None

    def _require_ok(self):
        if not self.ok:
            raise TapeError(f"the tape is poisoned: {self.error}")


def _op_method(spec):
    """The Tape method that records ``spec``'s op (generated once per table entry)."""
    name = spec.name
    params = ["a", "b"][:spec.arity] + (["s"] if spec.scalar_operand else [])
    if not spec.attrs and not spec.scalar_operand:
        if spec.arity == 1:
            def method(self, a):
                return self._record(name, a)
        else:
            def method(self, a, b):
                return self._record(name, a, b)
    elif not spec.attrs:
        def method(self, a, s):
            return self._record(name, a, s=_scalar(s, name))
    else:
        sig = inspect.Signature(
            [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD)
             for p in ["self"] + params] +
            [inspect.Parameter(at.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                               **({} if at.required else {"default": at.default}))
             for at in spec.attrs])

        def method(self, *args, **kwargs):
            try:
                bound = sig.bind(self, *args, **kwargs)
            except TypeError as exc:
                raise TapeError(f"{name}: {exc}") from None
            bound.apply_defaults()
            v = bound.arguments
            return self._record_op(spec, v["a"], v.get("b", _UNARY), 0.0,
                                   {at.name: v[at.name] for at in spec.attrs})

        method.__signature__ = sig
    method.__name__ = name
    method.__qualname__ = f"Tape.{name}"
    lines = [f"Record ``{name}``: {spec.doc}."]
    lines += [f"``{at.name}``: {at.doc}." for at in spec.attrs if at.kind != "shape"]
    if any(at.kind == "shape" for at in spec.attrs):
        lines.append("``shape``: the target shape, a sequence of ints.")
    method.__doc__ = "\n\n".join(lines)
    return method


for _spec in OPS.values():
    if _spec.arity and _spec.name != "cast":      # Tape.cast: no node for a no-op cast
        setattr(Tape, _spec.name, _op_method(_spec))
del _spec


def _ids_reader(spec, sa, aux) -> str:
    """What a bad id was meant to index, for messages: a gather's table, a scatter's rows."""
    if spec.kind == "scatter":
        return f"scatter of src {list(sa)} into {aux['rows']} rows"
    return f"table {list(sa)}"


def _composite_method(fn):
    """The Tape method of a composite ``fn(tape, ...)`` (gradtool/composites/methods.py)."""
    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)

    params = list(inspect.signature(fn).parameters.values())
    method.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + params[1:])
    method.__name__ = fn.__name__
    method.__qualname__ = f"Tape.{fn.__name__}"
    method.__doc__ = fn.__doc__
    return method


# sum/mean/max with a tuple of axes, and the layout, reduction and sorting composites
# (gradtool/composites/): Tape methods that record the table's ops, no node types of their
# own.  Imported here, once GVar and Tape exist: the composites record on them.
from .composites import methods as _methods  # noqa: E402

for _name in ("sum", "mean", "max"):
    setattr(Tape, f"_{_name}_one", getattr(Tape, _name))
    setattr(Tape, _name, _methods.reduction_method(getattr(Tape, _name)))
for _name, _fn in _methods.METHODS.items():
    setattr(Tape, _name, _composite_method(_fn))
del _name, _fn


def _comparison(op_method):
    """A comparison's Tape method: ``b`` may also be a Python number (a one-element const)."""
    def method(self, a, b):
        return op_method(self, a, self._number_leaf(b, f"{op_method.__name__} input b",
                                                    like=a))
    method.__name__, method.__qualname__ = op_method.__name__, op_method.__qualname__
    method.__doc__ = (op_method.__doc__ or "") + "\n\n``b`` may be a Python number."
    return method


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(Tape, _name, _comparison(getattr(Tape, _name)))
del _name


# ── what backward reaches ──────────────────────────────────────────────────


__all__ = ["Tape", "GVar", "Node", "GradtoolError"]
