"""Optimizers over tape parameters, each one entry of :mod:`gradtool.optim.table`:
registration, per-parameter L2, the global-norm clip, learning-rate schedules, saved state.

The exact operation order of one ``step`` (every operation is one separately
rounded float64 operation; the compiled step and the device engine mirror it bit
for bit)::

1. Active params: the registered params that backward touched
   (``tape.touched(p)``), in registration order.  An untouched param is
   SKIPPED entirely: not decayed, state unchanged, not in the clip norm.
2. Clip (only when clip > 0), on the RAW gradients::

       sumsq = 0.0
       for p in active (registration order):
           for g in p's gradient (row-major):
               sumsq = sumsq + g*g
       norm = sqrt(sumsq)
       if norm > clip: scale = clip / norm; every active g = g * scale

   (one serial chain from 0.0, registration order then row-major; the device's
   ``k_clip_norm`` and the sharded trainer keep the same chain).
3. Per-param L2, AFTER clipping (only where that param's l2 != 0.0): ``g = g + l2*w``.
4. The step counter ``t`` advances once per ``step()`` (even when no param is
   active); the running products ``b1t = b1t*beta1``, ``b2t = b2t*beta2`` (entries
   with bias corrections) advance with it; the learning rate of this step is the
   schedule's (:mod:`gradtool.optim.schedule`) at ``t - 1``; the entry's host
   scalars are computed once; then every active param gets the entry's per-element
   rule (``table.get(name).text(switches)`` prints them; docs/training.md lists them).

The loss is expected to be a mean already: there is no hidden batch divide.
"""

from __future__ import annotations

import sys
import math
import numbers
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .. import numerics
from ..errors import GradtoolError
from ..optim_state import (B1, B2, EPS, KINDS, STATE_VERSION, OptimizerError, check_saved_state,
                           legacy_kind)
from . import table as _table
from .schedule import Schedule


def advance_adam(lr: float, b1t: float, b2t: float) -> tuple:
    """One step of the seed Adam's host-side scalars: ``(b1t, b2t, lr_t)`` after the step
    (kept for callers of the seed's API; the table's ``adam-seed`` host scalars are this)."""
    b1t = b1t * B1
    b2t = b2t * B2
    return b1t, b2t, (lr * math.sqrt(1.0 - b2t)) / (1.0 - b1t)


@dataclass
class Entry:
    """One registered parameter: its node id, L2 coefficient and state slots.

    ``state`` maps each slot of the optimizer (``m``, ``v``, ``vmax``, ``buf``) to an
    array of the param's shape.  A device engine uploads them and writes them back in place.
    """

    node_id: int
    l2: float
    state: dict = field(default_factory=dict)
    serial: int = -1      # the node's birth stamp on its tape (Tape.serials)

    @property
    def m(self):
        return self.state.get("m")

    @property
    def v(self):
        return self.state.get("v")


def _finite_nonneg(x, what) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise OptimizerError(f"{what} must be a number, got {x!r}")
    x = float(x)
    if not math.isfinite(x) or x < 0.0:
        raise OptimizerError(f"{what} must be finite and >= 0, got {x!r}")
    return x



def global_norm(grads) -> float:
    """The clip's norm of ``grads`` (float64 arrays, in registration order):
    ``sqrt(sumsq)`` with ``sumsq`` the serial sum from 0.0 of every ``g*g``, row-major,
    array after array.  ``gradtool train --clip`` and
    ``gradtool.interop.torch.clip_grad_norm_`` both compute it here."""
    # add.accumulate is sequential by definition, so its last element is the serial sum
    squares = [np.zeros(1)] + [np.ravel(g * g) for g in grads]
    return math.sqrt(float(np.add.accumulate(np.concatenate(squares))[-1]))


def clip_scale(norm: float, clip: float) -> Optional[float]:
    """``clip / norm`` where ``norm > clip`` (every gradient is then ``g * scale``), else
    None: the gradients stay as they are."""
    return clip / norm if norm > clip else None

class Optimizer:
    """One table entry over registered tape params.  Use :class:`SGD`, :class:`Adam`,
    :class:`AdamW`, :class:`AdamSeed` or :func:`make_optimizer`."""

    kind = ""

    def __init__(self, lr: float, kind: Optional[str] = None, hparams: Optional[dict] = None,
                 schedule: Optional[Schedule] = None):
        if kind is not None:
            self.kind = kind
        self.table_entry = _table.get(self.kind)
        self.hparams = self.table_entry.hparams(hparams)
        self.lr = _finite_nonneg(lr, "learning rate")
        self.clip = 0.0
        self.schedule = schedule if schedule is not None else Schedule()
        self.t = 0                # steps taken
        self.b1t = 1.0            # beta1 ** t as a running product (1.0 without powers)
        self.b2t = 1.0
        self.entries: list[Entry] = []
        self._tape = None         # the tape the params belong to (set by the first add)
        self._update = Update(self.table_entry, self.hparams)
        self._variant = self._update.variant
        self._slots = self._update.slots
        self._packed = np.zeros(_table.MAX_SCALARS)   # step()'s scalars for the C step

    @property
    def slots(self) -> tuple:
        return self._slots

    # ── configuration ──────────────────────────────────────────────────────
    def add(self, tape, param, l2: Optional[float] = None) -> Entry:
        """Register one tape parameter (a GVar or node id) with its L2 coefficient.

        Every param of one optimizer belongs to one tape; :meth:`step` refuses
        another tape, and a param that ``reset_to`` has dropped since.
        """
        from ..tape import Tape

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
        # the slots in the param's dtype (float32 for an f32 param, as torch keeps them)
        value = tape.values[node_id]
        entry.state = {s: np.zeros(value.shape, dtype=value.dtype) for s in self._slots}
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
    def step_lr(self, t: Optional[int] = None) -> float:
        """The learning rate step ``t`` (1-based; default the next) runs with."""
        t = self.t + 1 if t is None else t
        return self.schedule.lr(self.lr, t - 1)

    def begin_step(self) -> dict:
        """Advance ``t`` and the running products; the entry's scalars for this step."""
        return dict(zip(self.table_entry.scalar_names(), self._begin_values()))

    def _begin_values(self) -> list:
        """:meth:`begin_step` with the scalars as a list in ``scalar_names`` order."""
        self.t += 1
        self.b1t, self.b2t = self.table_entry.advance(self.hparams, self.b1t, self.b2t)
        return self.table_entry.scalar_values(self.hparams, self.step_lr(self.t), self.t,
                                              self.b1t, self.b2t)

    def step(self, tape) -> None:
        """One update from the gradients on ``tape``, in the module docstring's order.

        Each parameter's clip, L2 and update run as one compiled pass
        (``csrc/gt_optim_table.h`` through ``csrc/gt_cpu.c``, threaded on large
        parameters) when a C compiler is available, else as the table's numpy
        rendering; both give the same bits (tests/test_optim.py runs every
        trajectory both ways).  Without clip and L2 the passes of every param go
        in one call (:meth:`_step_all`).
        """
        self.check_tape(tape)
        active = [e for e in self.entries if tape.grads[e.node_id] is not None]
        grads = [tape.grads[e.node_id] for e in active]
        scale = self._clip_scale(grads) if self.clip > 0.0 and active else None
        values = self._begin_values()
        # the package's switch (tests replace it): read, not imported (no cycle)
        packed = self._packed
        packed[:len(values)] = values
        update = self._update
        compiled = sys.modules[__package__]._COMPILED[0]
        if compiled and scale is None and active and self._step_all(tape.values, active,
                                                                     grads, packed):
            return
        libs: dict = {}                      # per dtype, looked up once a step
        for e, g in zip(active, grads):
            w = tape.values[e.node_id]
            lib = None
            if compiled:
                lib = libs.get(w.dtype, libs)
                if lib is libs:
                    lib = libs[w.dtype] = _library(w)
            if lib is not None and _plain(w, w.dtype) and _plain(g, w.dtype):
                update.compiled(lib, w, g, e.state, scale, e.l2, packed)  # own slots: plain
            else:
                update(w, g, e.state, scale, e.l2, None, packed)

    def _step_all(self, values, active: list, grads: list, packed) -> bool:
        """Every active param in one compiled call (``gt_opt_table_steps_py``: the same
        per-param pass, without clip or L2) where it applies: no clip this step, every
        active l2 0.0, the library there, every array as it takes them (C-contiguous,
        aligned, of the first param's dtype).  False, with nothing written (it takes every
        array before it writes any), where not: the step then goes param by param."""
        ws = [values[e.node_id] for e in active if e.l2 == 0.0]
        if len(ws) != len(active):
            return False
        lib = compiled_library(ws[0].dtype)
        if lib is None or lib.py_opt_table_steps is None:
            return False
        update = self._update
        slots = [[e.state[s] for e in active] for s in update.slots] + update._pad
        return not lib.py_opt_table_steps(update.variant, ws, grads, *slots, packed)

    def update_piece(self, entry: Entry, w, g, state: dict, scale, scalars: dict) -> None:
        """Steps 2 and 3 and the rule on a contiguous piece of one registered param
        (``w`` a view, updated in place; ``state`` its slots' pieces): what :meth:`step`
        does to those elements, bit for bit (the sharded optimizer's update)."""
        self._update(w, g, state, scale, entry.l2, scalars)

    def _clip_scale(self, grads) -> Optional[float]:
        if grads and all(g.dtype == np.float32 for g in grads):
            # float32: numerics32's lane-tree sum of every g*g (binary32) in registration
            # order, row-major; sqrt, the comparison and clip / norm in binary32 (as the
            # device's k_clip_norm)
            from .. import numerics32
            norm = np.sqrt(numerics32.sum(np.concatenate([np.ravel(g * g) for g in grads])))
            clip = np.float32(self.clip)
            return float(clip / norm) if norm > clip else None
        return clip_scale(global_norm(grads), self.clip)

    # ── saved state ────────────────────────────────────────────────────────
    def state_dict(self) -> dict:
        """Everything needed to continue bit for bit; msgpack-able (slots as LE float64
        bytes).  ``version`` 2: ``kind`` is a table name (files without it are read by
        :func:`gradtool.optim_state.legacy_kind`: their ``adam`` is ``adam-seed``)."""
        params = []
        for e in self.entries:
            item = {"id": e.node_id, "l2": e.l2}
            for s in self._slots:
                item[s] = _le_bytes(e.state[s])
            params.append(item)
        state = {"version": STATE_VERSION, "kind": self.kind, "lr": self.lr, "clip": self.clip,
                 "t": self.t, "b1t": self.b1t, "b2t": self.b2t,
                 "hparams": dict(self.hparams), "schedule": self.schedule.to_dict(),
                 "params": params}
        if self.kind == "adam-seed":
            state.update(b1=B1, b2=B2, eps=EPS)
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output.  The same params must already be registered.

        Everything is validated before anything is changed: every field against the
        range it can take (``optim_state.check_saved_state``: unknown and missing keys,
        the bias powers against ``t``, slots finite, ``v >= 0``, ...), then against the
        registered params.
        """
        if not isinstance(state, dict):
            raise OptimizerError(f"optimizer state must be a map, got {type(state).__name__}")
        kind = legacy_kind(state)
        if kind in KINDS:
            check_saved_state(state, None)
        if kind != self.kind:
            raise OptimizerError(f"optimizer state is for {kind!r}, not {self.kind!r}")
        hparams = self.table_entry.hparams(state.get("hparams"), "optimizer state: ")
        if hparams != self.hparams:
            raise OptimizerError(f"optimizer state has hyperparameters {hparams}, this "
                                 f"optimizer {self.hparams}")
        schedule = Schedule.from_dict(state.get("schedule"))
        lr = _finite_nonneg(_field(state, "lr"), "optimizer state 'lr'")
        clip = _finite_nonneg(_field(state, "clip"), "optimizer state 'clip'")
        t = _field(state, "t")
        b1t, b2t = float(_field(state, "b1t")), float(_field(state, "b2t"))
        params = _field(state, "params")
        ids = [p.get("id") if isinstance(p, dict) else None for p in params]
        mine = [e.node_id for e in self.entries]
        if ids != mine:
            raise OptimizerError(f"optimizer state covers param nodes {ids}, but the "
                                 f"registered params are {mine}")
        restored = []
        for e, p in zip(self.entries, params):
            l2 = _finite_nonneg(p.get("l2"), f"optimizer state l2 of param node {e.node_id}")
            slots = {s: _from_le_bytes(p.get(s), e.state[s].shape,
                                       f"param node {e.node_id} {s!r}") for s in self._slots}
            restored.append((l2, slots))
        self.lr, self.clip, self.t, self.b1t, self.b2t = lr, clip, int(t), b1t, b2t
        self.schedule = schedule
        for e, (l2, slots) in zip(self.entries, restored):
            e.l2 = l2
            for s, a in slots.items():
                e.state[s][...] = a      # in place: an engine may hold these arrays

    def __repr__(self):
        return (f"{type(self).__name__}(lr={self.lr}, clip={self.clip}, t={self.t}, "
                f"params={[e.node_id for e in self.entries]})")


def _pack(entry, scalars: dict):
    """The entry's scalars in its order, padded with 0.0 to MAX_SCALARS (the float32
    library converts that many)."""
    return _pack_values([scalars[n] for n in entry.scalar_names()])


def _pack_values(values: list):
    """Scalars already in the entry's order, as :func:`_pack` gives them."""
    return np.array(values + [0.0] * (_table.MAX_SCALARS - len(values)))


class SGD(Optimizer):
    """torch.optim.SGD: ``SGD(lr, momentum=0, dampening=0, nesterov=False, weight_decay=0,
    maximize=False)``; with the defaults ``w = w - lr*g``."""

    kind = "sgd"

    def __init__(self, lr: float, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0,
                 maximize=False, schedule: Optional[Schedule] = None):
        super().__init__(lr, hparams=dict(momentum=momentum, dampening=dampening,
                                          nesterov=nesterov, weight_decay=weight_decay,
                                          maximize=maximize), schedule=schedule)


def _betas(betas):
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise OptimizerError(f"betas must be a pair, got {betas!r}")
    return betas


class Adam(Optimizer):
    """torch.optim.Adam (eps on the bias-corrected sqrt(v-hat)): ``Adam(lr, betas=(0.9,
    0.999), eps=1e-8, weight_decay=0, amsgrad=False, maximize=False)``.  The seed's
    eps-hat variant is :class:`AdamSeed`."""

    kind = "adam"

    def __init__(self, lr: float, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, maximize=False, schedule: Optional[Schedule] = None):
        b1, b2 = _betas(betas)
        super().__init__(lr, hparams=dict(beta1=b1, beta2=b2, eps=eps,
                                          weight_decay=weight_decay, amsgrad=amsgrad,
                                          maximize=maximize), schedule=schedule)


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay (``w *= 1 - lr*weight_decay``
    first), ``weight_decay=0.01`` by default."""

    kind = "adamw"

    def __init__(self, lr: float, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 amsgrad=False, maximize=False, schedule: Optional[Schedule] = None):
        super().__init__(lr, betas, eps, weight_decay, amsgrad, maximize, schedule)


class AdamSeed(Optimizer):
    """The seed's Adam (scikit-learn's eps-hat form): b1 0.9, b2 0.999, eps 1e-8,
    ``w = w - (lr_t*m) / (sqrt(v) + eps)`` with ``lr_t = lr*sqrt(1-b2^t)/(1-b1^t)``."""

    kind = "adam-seed"

    def __init__(self, lr: float, schedule: Optional[Schedule] = None):
        super().__init__(lr, schedule=schedule)


CLASSES = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "adam-seed": AdamSeed}
assert set(CLASSES) == set(KINDS) == set(_table.NAMES)



class Update:
    """One table entry at fixed hyperparameters, applied to one array at a time: the
    clip factor, the L2 term and the rule (steps 2 and 3 and the rule of the module
    docstring) on ``w`` and its slots, in place.  :class:`Optimizer` and
    ``gtt.optim`` (:mod:`gradtool.interop.torch_optim`) both step through it.

    One compiled pass (``csrc/gt_optim_table.h`` through ``csrc/gt_cpu.c``, threaded on
    large arrays) where a C compiler is available and the arrays are C-contiguous of
    ``w``'s dtype, else the table's numpy rendering; both give the same bits
    (tests/test_optim.py runs every trajectory both ways).  ``g`` is only read.  The
    step's scalars come as the map ``scalars`` or packed (``packed``: their values in
    ``scalar_names`` order, padded to MAX_SCALARS), or both."""

    def __init__(self, entry, hp: dict):
        self.entry, self.hp = entry, hp
        self.variant = _table.variant_id(entry, hp)
        self.slots = entry.slot_names(hp)
        self._pad = [None] * (_table.MAX_SLOTS - len(self.slots))

    def pack(self, scalars: dict):
        return _pack(self.entry, scalars)

    def compiled(self, lib, w, g, state: dict, scale, l2: float, packed) -> None:
        """The compiled pass, for arrays the caller knows are C-contiguous, aligned and of
        ``w``'s dtype (``lib``: :func:`compiled_library` of it)."""
        clipped, factor = scale is not None, 1.0 if scale is None else scale
        # the Python entry takes the arrays themselves (about 1 us a call, where ctypes'
        # addresses and converted arguments cost several); 1: not as it wants, ctypes then
        if lib.py_opt_table_step is not None and not lib.py_opt_table_step(
                self.variant, w, g, *[state[s] for s in self.slots], *self._pad, clipped,
                factor, l2, packed):
            return
        ptrs = [state[s].ctypes.data for s in self.slots] + self._pad
        lib.gt_opt_table_step(self.variant, w.size, w.ctypes.data, g.ctypes.data, *ptrs,
                              clipped, factor, l2, packed.ctypes.data)

    def __call__(self, w, g, state: dict, scale, l2: float, scalars=None,
                 packed=None) -> None:
        slots = [state[s] for s in self.slots]
        # the package's switch (tests replace it): read, not imported (no cycle)
        lib = _library(w) if sys.modules[__package__]._COMPILED[0] else None
        if lib is not None and _plain(w, w.dtype) and _plain(g, w.dtype) and all(
                _plain(a, w.dtype) for a in slots):
            self.compiled(lib, w, g, state, scale, l2,
                          _pack(self.entry, scalars) if packed is None else packed)
            return
        if scalars is None:
            names = self.entry.scalar_names()
            scalars = dict(zip(names, packed.tolist()[:len(names)]))
        if scale is not None:
            g = g * scale
        if l2 != 0.0:
            g = g + l2 * w
        self.entry.apply(w, g, state, self.hp, scalars)


def _plain(x: np.ndarray, dtype=np.float64) -> bool:
    """An array the compiled step can take as is: C-contiguous aligned ``dtype``."""
    return x.dtype == dtype and x.flags.c_contiguous and x.flags.aligned


def compiled_library(dtype):
    """The compiled step for ``dtype``: gt_cpu (float64) or gt_cpu_f32 (float32: its
    scalars rounded to float32 once, as the table's numpy rendering rounds them), or None."""
    if dtype == _F32:
        return numerics.cpu_kernels32()
    return numerics.cpu_kernels()


_F32 = np.dtype(np.float32)


def _library(w: np.ndarray):
    return compiled_library(w.dtype)


def make_optimizer(kind: str, lr: float, hparams: Optional[dict] = None,
                   schedule: Optional[Schedule] = None) -> Optimizer:
    """An empty optimizer by table name (``sgd``, ``adam``, ``adamw``, ``adam-seed``)."""
    entry = _table.get(kind)
    opt = Optimizer.__new__(CLASSES[entry.name])
    Optimizer.__init__(opt, lr, kind=entry.name, hparams=hparams, schedule=schedule)
    return opt


def optimizer_from_state(tape, state: dict) -> Optimizer:
    """Rebuild a saved optimizer over ``tape``: register its params, then load its state."""
    if not isinstance(state, dict):
        raise OptimizerError(f"optimizer state must be a map, got {type(state).__name__}")
    check_saved_state(state, None)
    kind = legacy_kind(state)
    opt = make_optimizer(kind, _finite_nonneg(_field(state, "lr"), "optimizer state 'lr'"),
                         hparams=state.get("hparams"),
                         schedule=Schedule.from_dict(state.get("schedule")))
    for p in _field(state, "params"):
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
