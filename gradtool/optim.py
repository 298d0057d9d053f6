"""Optimizers over tape parameters: SGD and Adam, per-parameter L2, global-norm clip.

An optimizer is built empty and parameters are registered one by one, each
with its own L2 coefficient (weights typically carry one, biases 0)::

    opt = Adam(1e-3)
    for p in tape.params():
        opt.add(tape, p)            # l2 defaults to the param node's `l2`
    opt.set_clip(1.0)               # optional
    ...
    tape.backward(loss)
    opt.step(tape)                  # updates the tape's live parameter values in place

The exact operation order of one ``step`` (every operation is one separately
rounded float64 operation; the device engine mirrors this bit for bit)
-------------------------------------------------------------------------
Constants: b1 = 0.9, b2 = 0.999, eps = 1e-8; ``one_minus_b1 = 1.0 - b1`` and
``one_minus_b2 = 1.0 - b2`` computed at run time in float64.

1. Active params: the registered params that backward touched
   (``tape.touched(p)``), in registration order.  An untouched param is
   SKIPPED entirely: not decayed, moments unchanged, not in the clip norm.
2. Clip (only when clip > 0), on the RAW gradients::

       sumsq = 0.0
       for p in active (registration order):
           for g in p's gradient (row-major):
               sumsq = sumsq + g*g
       norm = sqrt(sumsq)
       if norm > clip: scale = clip / norm; every active g = g * scale

3. L2, AFTER clipping (only where that param's l2 != 0.0): ``g = g + l2*w``.
4. SGD:  ``w = w - lr*g``.
   Adam: the step counter ``t`` advances once per ``step()`` (even when no
   param is active).  The bias powers are running products, never pow, so
   they are the same on every machine: ``b1t = b1t*b1; b2t = b2t*b2`` (both
   start at 1.0).  ``lr_t = (lr * sqrt(1.0 - b2t)) / (1.0 - b1t)`` (a host
   scalar), then per element::

       m = b1*m + one_minus_b1*g
       v = b2*v + one_minus_b2*(g*g)
       w = w - (lr_t*m) / (sqrt(v) + eps)

   This is scikit-learn's ``AdamOptimizer`` except that scikit-learn uses
   pow for ``b1**t`` and ``b2**t`` (identical for t <= 2, a few ulp apart
   later).

The loss is expected to be a mean already: there is no hidden batch divide.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import numerics
from .errors import GradtoolError
from .optim_state import B1, B2, EPS, KINDS, OptimizerError, check_saved_state


def advance_adam(lr: float, b1t: float, b2t: float) -> tuple:
    """One step of Adam's host-side scalars: ``(b1t, b2t, lr_t)`` after the step.

    The bias powers are running products (never pow) and ``lr_t`` is
    ``(lr * sqrt(1 - b2t)) / (1 - b1t)``.  The CPU optimizer and the device
    optimizer (which ships lr_t to its kernels) both call this.
    """
    b1t = b1t * B1
    b2t = b2t * B2
    return b1t, b2t, (lr * math.sqrt(1.0 - b2t)) / (1.0 - b1t)


@dataclass
class Entry:
    """One registered parameter: its node id, L2 coefficient and Adam moments.

    ``m`` and ``v`` have the param's shape (Adam) or are None (SGD).  A
    device engine uploads them and writes them back in place.
    """

    node_id: int
    l2: float
    m: Optional[np.ndarray] = None
    v: Optional[np.ndarray] = None
    serial: int = -1      # the node's birth stamp on its tape (Tape.serials)


def _finite_nonneg(x, what) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise OptimizerError(f"{what} must be a number, got {x!r}")
    x = float(x)
    if not math.isfinite(x) or x < 0.0:
        raise OptimizerError(f"{what} must be finite and >= 0, got {x!r}")
    return x


class Optimizer:
    """State and registration shared by SGD and Adam.  Use :class:`SGD` or :class:`Adam`."""

    kind = ""

    def __init__(self, lr: float):
        self.lr = _finite_nonneg(lr, "learning rate")
        self.clip = 0.0
        self.t = 0                # steps taken (Adam's bias-correction counter)
        self.b1t = 1.0            # B1 ** t as a running product
        self.b2t = 1.0
        self.entries: list[Entry] = []
        self._tape = None         # the tape the params belong to (set by the first add)

    # ── configuration ──────────────────────────────────────────────────────
    def add(self, tape, param, l2: Optional[float] = None) -> Entry:
        """Register one tape parameter (a GVar or node id) with its L2 coefficient.

        Every param of one optimizer belongs to one tape; :meth:`step` refuses
        another tape, and a param that ``reset_to`` has dropped since.
        """
        from .tape import Tape

        if not isinstance(tape, Tape):
            raise OptimizerError(f"add: expected a Tape, got {type(tape).__name__}")
        if self._tape is not None and tape is not self._tape:
            raise OptimizerError("add: this optimizer's params belong to another tape")
        try:
            node_id = tape.var(param).id     # a live GVar of this tape, or an id in range
        except GradtoolError as exc:
            raise OptimizerError(f"cannot register {param!r}: not a node of this tape "
                                 f"({exc})"[:300]) from None
        node = tape.nodes[node_id]
        if node.op != "param":
            raise OptimizerError(f"node {node_id} is a {node.op}, not a param; only params "
                                 f"can be optimized")
        if any(e.node_id == node_id for e in self.entries):
            raise OptimizerError(f"param node {node_id} is already registered")
        l2 = node.l2 if l2 is None else l2
        entry = Entry(node_id, _finite_nonneg(l2, f"l2 of param node {node_id}"),
                      serial=tape.serials[node_id])
        if self.kind == "adam":
            shape = tape.values[node_id].shape
            # the moments in the param's dtype (float32 for an f32 param, as torch keeps them)
            dtype = tape.values[node_id].dtype
            entry.m, entry.v = np.zeros(shape, dtype=dtype), np.zeros(shape, dtype=dtype)
        self.entries.append(entry)
        self._tape = tape
        return entry

    def check_tape(self, tape) -> None:
        """Refuse a tape other than the one the params were registered on, or one whose
        registered param nodes were dropped by ``reset_to``."""
        if self.entries and tape is not self._tape:
            raise OptimizerError("the optimizer's params belong to another tape")
        for e in self.entries:
            try:
                tape.check_serial(e.node_id, e.serial, f"optimizer param {e.node_id}")
            except GradtoolError as exc:
                raise OptimizerError(str(exc)) from None

    def set_clip(self, maxn: float) -> None:
        """Clip the global gradient norm at ``maxn`` (0 turns clipping off)."""
        self.clip = _finite_nonneg(maxn, "clip")

    # ── one step ───────────────────────────────────────────────────────────
    def step(self, tape) -> None:
        """One update from the gradients on ``tape``, in the module docstring's order.

        Each parameter's clip, L2 and update run as one compiled pass
        (``csrc/gt_optim.h`` through ``csrc/gt_cpu.c``, threaded on large
        parameters) when a C compiler is available, else as the numpy
        sequence below; both give the same bits (tests/test_optim.py runs
        every trajectory both ways).
        """
        self.check_tape(tape)
        active = [e for e in self.entries if tape.grads[e.node_id] is not None]
        grads = [tape.grads[e.node_id] for e in active]
        scale = self._clip_scale(grads) if self.clip > 0.0 and active else None
        self._begin_step()
        for e, g in zip(active, grads):
            w = tape.values[e.node_id]
            lib = _library(w) if _COMPILED[0] else None
            if lib is not None and _plain(w, w.dtype) and _plain(g, w.dtype):
                self._update_compiled(lib, e, w, g, scale)
                continue
            if scale is not None:
                g = g * scale
            if e.l2 != 0.0:
                g = g + e.l2 * w
            self._update(e, w, g)

    def _clip_scale(self, grads) -> Optional[float]:
        if grads and all(g.dtype == np.float32 for g in grads):
            # float32: numerics32's lane-tree sum of every g*g (binary32) in registration
            # order, row-major; sqrt, the comparison and clip / norm in binary32
            from . import numerics32
            sq = np.concatenate([np.ravel(g * g) for g in grads])
            norm = np.sqrt(numerics32.sum(sq))
            clip = np.float32(self.clip)
            return float(clip / norm) if norm > clip else None
        # 0.0 first, then every g*g in registration order, row-major; add.accumulate is
        # sequential by definition, so its last element is the serial sum.
        squares = [np.zeros(1)] + [np.ravel(g * g) for g in grads]
        sumsq = float(np.add.accumulate(np.concatenate(squares))[-1])
        norm = math.sqrt(sumsq)
        return self.clip / norm if norm > self.clip else None

    def _begin_step(self) -> None:
        self.t += 1

    def _update(self, entry: Entry, w: np.ndarray, g: np.ndarray) -> None:
        raise NotImplementedError

    def _update_compiled(self, lib, entry: Entry, w, g, scale) -> None:
        raise NotImplementedError

    # ── saved state ────────────────────────────────────────────────────────
    def state_dict(self) -> dict:
        """Everything needed to continue bit for bit; msgpack-able (moments as LE float64 bytes)."""
        params = []
        for e in self.entries:
            item = {"id": e.node_id, "l2": e.l2}
            if e.m is not None:
                item["m"] = _le_bytes(e.m)
                item["v"] = _le_bytes(e.v)
            params.append(item)
        state = {"kind": self.kind, "lr": self.lr, "clip": self.clip, "t": self.t,
                 "b1t": self.b1t, "b2t": self.b2t, "params": params}
        if self.kind == "adam":
            state.update(b1=B1, b2=B2, eps=EPS)
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output.  The same params must already be registered.

        Everything is validated before anything is changed: every field against the
        range it can take (``optim_state.check_saved_state``: the bias powers against
        ``t``, moments finite, ``v >= 0``, ...), then against the registered params.
        """
        if not isinstance(state, dict):
            raise OptimizerError(f"optimizer state must be a map, got {type(state).__name__}")
        if state.get("kind") in KINDS:
            check_saved_state(state, None)
        kind = state.get("kind")
        if kind != self.kind:
            raise OptimizerError(f"optimizer state is for {kind!r}, not {self.kind!r}")
        lr = _finite_nonneg(_field(state, "lr"), "optimizer state 'lr'")
        clip = _finite_nonneg(_field(state, "clip"), "optimizer state 'clip'")
        t = _field(state, "t")
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
            raise OptimizerError(f"optimizer state 't' must be an integer >= 0, got {t!r}")
        b1t = _finite_nonneg(_field(state, "b1t"), "optimizer state 'b1t'")
        b2t = _finite_nonneg(_field(state, "b2t"), "optimizer state 'b2t'")
        params = _field(state, "params")
        if not isinstance(params, (list, tuple)):
            raise OptimizerError("optimizer state 'params' must be a list")
        ids = [p.get("id") if isinstance(p, dict) else None for p in params]
        mine = [e.node_id for e in self.entries]
        if ids != mine:
            raise OptimizerError(f"optimizer state covers param nodes {ids}, but the "
                                 f"registered params are {mine}")
        restored = []
        for e, p in zip(self.entries, params):
            l2 = _finite_nonneg(p.get("l2"), f"optimizer state l2 of param node {e.node_id}")
            if e.m is None:
                restored.append((l2, None, None))
                continue
            m = _from_le_bytes(p.get("m"), e.m.shape, f"param node {e.node_id} 'm'")
            v = _from_le_bytes(p.get("v"), e.v.shape, f"param node {e.node_id} 'v'")
            restored.append((l2, m, v))
        self.lr, self.clip, self.t, self.b1t, self.b2t = lr, clip, int(t), b1t, b2t
        for e, (l2, m, v) in zip(self.entries, restored):
            e.l2 = l2
            if m is not None:
                e.m[...] = m      # in place: an engine may hold these arrays
                e.v[...] = v

    def __repr__(self):
        return (f"{type(self).__name__}(lr={self.lr}, clip={self.clip}, t={self.t}, "
                f"params={[e.node_id for e in self.entries]})")


class SGD(Optimizer):
    """``w = w - lr*g``."""

    kind = "sgd"

    def _update(self, entry, w, g):
        np.subtract(w, self.lr * g, out=w)

    def _update_compiled(self, lib, entry, w, g, scale):
        args = (scale is not None, 1.0 if scale is None else scale, entry.l2, self.lr,
                0.0, 0.0, 0.0, 0.0, 0.0)
        if lib.py_opt_step is None or lib.py_opt_step(0, w, g, None, None, *args):
            lib.gt_opt_step(0, w.size, w.ctypes.data, g.ctypes.data, None, None, *args)


class Adam(Optimizer):
    """Adam with b1 0.9, b2 0.999, eps 1e-8; bias powers as running products."""

    kind = "adam"

    def __init__(self, lr: float):
        super().__init__(lr)
        self._scratch = {}

    def _begin_step(self):
        self.t += 1
        self.b1t, self.b2t, self._lr_t = advance_adam(self.lr, self.b1t, self.b2t)
        self._one_minus_b1 = 1.0 - B1
        self._one_minus_b2 = 1.0 - B2

    def _update(self, entry, w, g):
        m, v = entry.m, entry.v
        # two scratch arrays per param, reused every step: large temporaries would be
        # fresh (page-faulting) allocations each time
        scratch = self._scratch.get(entry.node_id)
        if scratch is None or scratch[0].shape != w.shape:
            scratch = self._scratch[entry.node_id] = (np.empty(w.shape, dtype=w.dtype),
                                                      np.empty(w.shape, dtype=w.dtype))
        s, u = scratch
        # m = b1*m + one_minus_b1*g
        np.multiply(m, B1, out=m)
        np.multiply(g, self._one_minus_b1, out=s)
        np.add(m, s, out=m)
        # v = b2*v + one_minus_b2*(g*g)
        np.multiply(v, B2, out=v)
        np.multiply(g, g, out=s)
        np.multiply(s, self._one_minus_b2, out=s)
        np.add(v, s, out=v)
        # w = w - (lr_t*m) / (sqrt(v) + eps)
        np.sqrt(v, out=s)
        np.add(s, EPS, out=s)
        np.multiply(m, self._lr_t, out=u)
        np.divide(u, s, out=u)
        np.subtract(w, u, out=w)

    def _update_compiled(self, lib, entry, w, g, scale):
        args = (scale is not None, 1.0 if scale is None else scale, entry.l2, self._lr_t, B1,
                B2, self._one_minus_b1, self._one_minus_b2, EPS)
        if lib.py_opt_step is None or lib.py_opt_step(1, w, g, entry.m, entry.v, *args):
            lib.gt_opt_step(1, w.size, w.ctypes.data, g.ctypes.data, entry.m.ctypes.data,
                            entry.v.ctypes.data, *args)


_COMPILED = [True]      # tests set [False] to run the numpy sequence


def _plain(x: np.ndarray, dtype=np.float64) -> bool:
    """An array the compiled step can take as is: C-contiguous aligned ``dtype``."""
    return x.dtype == dtype and x.flags.c_contiguous and x.flags.aligned


def _library(w: np.ndarray):
    """The compiled step for ``w``'s dtype: gt_cpu (float64) or gt_cpu_f32 (float32, its
    scalars rounded to float32 once, as the numpy sequence rounds them), or None."""
    if w.dtype == np.float32:
        return numerics.cpu_kernels32()
    return numerics.cpu_kernels()


def make_optimizer(kind: str, lr: float) -> Optimizer:
    """An empty SGD or Adam by name."""
    if kind == "sgd":
        return SGD(lr)
    if kind == "adam":
        return Adam(lr)
    raise OptimizerError(f"unknown optimizer {kind!r} (choose from {', '.join(KINDS)})")


def optimizer_from_state(tape, state: dict) -> Optimizer:
    """Rebuild a saved optimizer over ``tape``: register its params, then load its state."""
    if not isinstance(state, dict):
        raise OptimizerError(f"optimizer state must be a map, got {type(state).__name__}")
    opt = make_optimizer(state.get("kind"), _finite_nonneg(_field(state, "lr"),
                                                           "optimizer state 'lr'"))
    params = _field(state, "params")
    if not isinstance(params, (list, tuple)):
        raise OptimizerError("optimizer state 'params' must be a list")
    for p in params:
        if not isinstance(p, dict):
            raise OptimizerError("optimizer state 'params' entries must be maps")
        opt.add(tape, p.get("id"), l2=0.0)
    opt.load_state_dict(state)
    return opt


def _field(state, key):
    if key not in state:
        raise OptimizerError(f"optimizer state has no {key!r}")
    return state[key]


def _le_bytes(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<f8").tobytes()


def _from_le_bytes(data, shape, what) -> np.ndarray:
    n = int(np.prod(shape))
    if not isinstance(data, (bytes, bytearray)):
        raise OptimizerError(f"optimizer state {what} must be bytes, got {type(data).__name__}")
    if len(data) != 8 * n:
        raise OptimizerError(f"optimizer state {what} has {len(data)} bytes, expected {8 * n} "
                             f"(shape {list(shape)})")
    return np.frombuffer(bytes(data), dtype="<f8").astype(np.float64).reshape(shape)


__all__ = ["SGD", "Adam", "Optimizer", "Entry", "OptimizerError", "make_optimizer",
           "optimizer_from_state", "B1", "B2", "EPS"]
