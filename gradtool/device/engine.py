"""Replaying a captured tape on a device, and training with it.

:func:`capture` mirrors one recorded episode onto a backend and returns a
:class:`DeviceReplay`: per step the caller uploads fresh rows into input
slots (:meth:`~DeviceReplay.set_input`), runs :meth:`~DeviceReplay.forward`,
:meth:`~DeviceReplay.backward` and the device optimizer
(:meth:`~DeviceReplay.step`), or all three at once
(:meth:`~DeviceReplay.episode`), and reads back only the loss.
:meth:`~DeviceReplay.value` and :meth:`~DeviceReplay.grad` download any node;
:meth:`~DeviceReplay.sync_params_to_tape` writes trained parameters back into
the CPU tape.

:class:`DeviceEngine` is the training loop's engine for ``gradtool train
--backend host|cuda|auto`` (the same methods as ``gradtool.train.CpuEngine``).

Backends come from the registry, :mod:`gradtool.device.backends`: ``host``
(:mod:`gradtool.device.host`, everywhere a C compiler exists) and ``cuda``
(:mod:`gradtool.device.cuda`, PyCUDA and a GPU); ``auto`` picks cuda when PyCUDA
and a device are present, else host.  Every backend gives the CPU tape's bits, for
f64 and f32 tapes alike.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..errors import GradtoolError, IdsError
from ..limits import MAX_DIMS
from ..ops import bad_id, bad_rng, first_bad_id, inexact_int
from ..tape import GVar, as_float64_array, as_ids_array, check_ids, is_index
from . import backends
from .optimizer import CTL_SCALARS
from .program import DTYPES, EXACT_INTS, CaptureError, capture_program, rounded_tape

# the registry's names when this module was imported (kept for old imports; the
# registry itself, gradtool.device.backends.choices(), is what commands read)
BACKENDS = backends.choices()


def resolve_backend(name: str) -> tuple:
    """(backend actually used, why) for a requested registry name or ``auto``
    (:func:`gradtool.device.backends.resolve`)."""
    return backends.resolve(name)


class DeviceReplay:
    """One captured episode on one backend.  Build it with :func:`capture`."""

    def __init__(self, tape, loss, *, backend: str = "auto", dtype: Optional[str] = None,
                 optimizer=None, graph: bool = True, host_kernels: str = "tiled",
                 fuse: bool = False, max_bytes: Optional[int] = None):
        from ..tape import Tape

        if not isinstance(tape, Tape):
            raise GradtoolError(f"capture: expected a Tape, got {type(tape).__name__}")
        try:
            loss_id = tape.var(loss).id          # a live GVar of this tape, or an id
        except GradtoolError as exc:
            raise CaptureError(f"loss: {exc}") from None
        if optimizer is not None and hasattr(optimizer, "check_tape"):
            optimizer.check_tape(tape)
        # dtype None: the tape's own; "f32" for an f64 tape: its f32 copy (rounded_tape),
        # whose node ids are the tape's, so the accessors below answer for the tape's nodes
        captured = rounded_tape(tape, dtype) if dtype is not None else tape
        self.backend, self.backend_reason = backends.resolve(backend)
        # (the fusion pass takes the one fill ahead: its backward starts with it)
        entry = backends.get(self.backend)
        self.program = capture_program(captured, loss_id, dtype, optimizer, max_bytes,
                                       fills="ahead" if fuse else entry.zero_fills,
                                       views=entry.reshape_views and not fuse)
        self.element = np.dtype(DTYPES[self.program.dtype])
        # what value() gives back per node: its own float type (a node of integer data
        # may be f64 in an f32 tape: whole numbers, exact in either)
        self._types = [v.dtype if v.dtype != np.int64 else self.element
                       for v in captured.values]
        self.unfused_counts = {ph: len(la) for ph, la in self.program.launches.items()}
        if fuse:
            from .fusion import fuse as fuse_program
            self.program = fuse_program(captured, self.program)
        self.fused = bool(fuse)
        # the accessors take GVars of this tape as captured (or plain node ids)
        self.tape, self._serials = tape, list(tape.serials)
        self._leaf = [node.a < 0 for node in tape.nodes]
        self._ids = {i for i in range(len(tape.nodes)) if tape.holds_ids(i)}
        self._rng = tape.rng_id()           # the rng slot's counters are checked when set
        self.dev = backends.get(self.backend).create(
            self.program, backends.Options(graph=graph, host_kernels=host_kernels))
        self.dtype = self.program.dtype
        self.loss_id = loss_id
        self.optimizer = self.program.optimizer

    # ── inputs and phases ──────────────────────────────────────────────────
    def node_id(self, node, role: str = "node") -> int:
        """The captured node a GVar (of the captured tape, as captured) or a node id names."""
        n = len(self.program.shapes)
        if type(node) is int and 0 <= node < n:       # the training loop's common case
            return node
        if isinstance(node, GVar):
            i = self.tape.node_id(node, role)
            if i >= n or self.tape.serials[i] != self._serials[i]:
                raise GradtoolError(f"{role}: node {i} was recorded after this replay was "
                                    f"captured")
            return i
        if not is_index(node) or not 0 <= int(node) < n:
            raise GradtoolError(f"{role}: no node {node!r} (the captured tape has {n} nodes; "
                                f"pass a GVar or a node id)"[:300])
        return int(node)

    def set_input(self, node, data, what: Optional[str] = None, error=GradtoolError) -> None:
        """Fresh values for a leaf (an input slot's minibatch rows, or a param).

        Ids take integer data only, every id in range; their take index
        (:meth:`Program.id_writes`) is rebuilt and uploaded with them.  A bad id is
        ``error`` naming ``what`` (default: the node).
        """
        i = self.node_id(node, "set_input")
        prog = self.program
        if not self._leaf[i]:
            raise GradtoolError(f"set_input: node {i} is not a leaf; only leaves take data")
        what = what or f"set_input node {i}"
        if (i not in self._ids and prog.dtype == "f32" and type(data) is np.ndarray
                and data.dtype == np.float32 and 0 < data.ndim <= MAX_DIMS and data.size
                and data.flags.c_contiguous):
            arr = data          # float32 into an f32 arena: exact as it is (write() copies)
        else:
            arr = (as_ids_array(data, what) if i in self._ids
                   else as_float64_array(data, what, copy=False))     # write() copies it
        if arr.shape != prog.shapes[i]:
            raise GradtoolError(f"node {i} has shape {list(prog.shapes[i])}, got "
                                f"{list(arr.shape)}")
        if i not in self._ids:
            if i == self._rng and bad_rng(arr, limit=EXACT_INTS[prog.dtype]):
                raise GradtoolError(f"{what}: {bad_rng(arr, limit=EXACT_INTS[prog.dtype])}")
            self.dev.write(prog.val_off[i], arr)      # float64: the device converts
            return
        check_ids(arr, prog.id_bounds.get(i, ()), what, error)
        if i in prog.int_values and inexact_int(arr, EXACT_INTS[prog.dtype]):
            raise error(f"{what}: {inexact_int(arr, EXACT_INTS[prog.dtype])} "
                        f"(a {prog.dtype} arena)")
        for off, values in prog.id_writes(i, arr):
            self.dev.write(off, np.asarray(values, dtype=np.float64))

    def forward(self) -> None:
        self.dev.run("forward", "forward")
        self._check_ids()

    def _check_ids(self) -> None:
        """After a forward: when a take/take_along kernel met an id computed on the tape
        that is not a whole number in range (it read nothing, wrote a NaN and raised the
        flag), the CPU reference's error for the first such node, in tape order."""
        prog = self.program
        if not prog.computed_ids or self.dev.scalar(prog.err_off) == 0.0:
            return
        self.dev.write(prog.err_off, np.zeros(1))
        for node, ids, bound in prog.computed_ids:
            values = self.dev.read(prog.val_off[ids], prog.size_of(ids)).reshape(
                prog.shapes[ids])
            problem = bad_id(values, bound)
            if problem:
                k = first_bad_id(values, bound)
                raise IdsError(f"node {node} ({self.tape.nodes[node].op}): its ids, "
                               f"computed by node {ids} ({self.tape.nodes[ids].op}): "
                               f"{problem} (table "
                               f"{list(prog.shapes[self.tape.nodes[node].a])})",
                               node=node, ids_node=ids, bound=bound, index=k,
                               value=float(np.ravel(values)[k]))
        raise GradtoolError("a take/take_along kernel met a bad id, but no computed ids "
                            "hold one now")

    def backward(self) -> None:
        self.dev.run("backward", "backward")

    def _prepare_step(self) -> tuple:
        if self.optimizer is None:
            raise GradtoolError("this replay was captured without an optimizer")
        before = self.optimizer.counters()
        self.dev.set_scalars(self.program.ctl_off + CTL_SCALARS, self.optimizer.begin_step())
        return before

    def _settle_step(self, before: tuple) -> float:
        # the device skipped the update after a non-finite loss (k_guard); so does the
        # host half, like the CPU engine, which never calls step() then
        loss = self.loss()
        if not math.isfinite(loss):
            self.optimizer.restore(before)
        return loss

    def step(self) -> None:
        """One device optimizer step from the gradients on the device.

        Like every device step it updates nothing when the last forward's loss
        is not finite.
        """
        before = self._prepare_step()
        self.dev.run("optimizer", "optimizer")
        self._settle_step(before)

    def episode(self, train: bool = True) -> float:
        """Forward, backward and (with ``train``) the optimizer, as one run; the loss."""
        if not train:
            self.dev.run("forward", "backward")
            self._check_ids()
            return self.loss()
        before = self._prepare_step()
        self.dev.run("forward", "optimizer")
        loss = self._settle_step(before)
        self._check_ids()       # after the step (it ran, as its loss allowed): the run stops
        return loss

    # ── reading back ───────────────────────────────────────────────────────
    def loss(self) -> float:
        return self.dev.scalar(self.program.val_off[self.loss_id])

    def value(self, node) -> np.ndarray:
        i = self.node_id(node, "value")
        prog = self.program
        out = self.dev.read(prog.val_off[i], prog.size_of(i)).reshape(prog.shapes[i])
        return out.astype(np.int64 if i in self._ids else self._types[i])

    def grad(self, node) -> np.ndarray:
        """dL/d(node) from the last backward; zeros for a node backward never touches."""
        i = self.node_id(node, "grad")
        prog = self.program
        if prog.grad_off[i] < 0:
            return np.zeros(prog.shapes[i], self.element)
        out = self.dev.read(prog.grad_off[i], prog.size_of(i)).reshape(prog.shapes[i])
        return out.astype(self.element, copy=False)

    def touched(self, node) -> bool:
        return self.program.grad_off[self.node_id(node, "touched")] >= 0

    def sync_params_to_tape(self, tape) -> None:
        """Write every param's device value into the tape's own array, in place."""
        for i in self.program.param_ids:
            tape.values[i][...] = self.value(i)

    def sync_optimizer(self, opt) -> None:
        """Write the device optimizer's counters and moments back into ``opt``."""
        if self.optimizer is not None:
            self.optimizer.write_back(opt, self.dev.read)

    # ── facts for reports ──────────────────────────────────────────────────
    def launches(self, train: bool = True) -> int:
        phases = ("forward", "backward", "optimizer") if train else ("forward", "backward")
        return self.program.count(phases)

    @property
    def nbytes(self) -> int:
        return self.dev.nbytes


def capture(tape, loss, backend: str = "auto", dtype: Optional[str] = None, *, optimizer=None,
            graph: bool = True, host_kernels: str = "tiled", fuse: bool = False,
            max_bytes: Optional[int] = None) -> DeviceReplay:
    """Mirror ``tape``'s episode (backward seeded at ``loss``) onto a device backend.

    ``optimizer``: a gradtool.optim SGD/Adam with its params registered (for
    :meth:`DeviceReplay.step` and training episodes).  ``graph``: cuda only, one
    CUDA graph per episode.  ``host_kernels="per-thread"``: the host backend runs
    the GPU's one-thread-per-output kernel bodies instead of its tiled ones (same
    bits, slower; how the tests check the GPU's code without a GPU).  ``fuse``: run the
    episode as the few kernels :mod:`gradtool.device.fusion` generates for this tape
    (same bits; compiled once per tape, cached).  ``max_bytes``: the device memory
    budget (default :data:`gradtool.budget.DEFAULT_MEMORY`); a program that needs more is
    a CaptureError before anything is allocated.

    ``dtype``: the arena's element type; default the tape's own (an f32 tape, whose
    values are float32, replays in float32 with the CPU reference's bits: numerics32).
    ``"f32"`` for an f64 tape replays its f32 copy (:func:`rounded_tape`: the leaves
    rounded once), whose CPU reference it then equals bit for bit.
    """
    return DeviceReplay(tape, loss, backend=backend, dtype=dtype, optimizer=optimizer,
                        graph=graph, host_kernels=host_kernels, fuse=fuse, max_bytes=max_bytes)


def fusion_plan(tape, loss, dtype: Optional[str] = None, *, optimizer=None):
    """The program ``capture(..., fuse=True)`` would run, with its ``fusion`` plan
    (:class:`gradtool.device.fusion.FusionPlan`); nothing is compiled or allocated."""
    from ..tape import Tape
    from .fusion import fuse

    if not isinstance(tape, Tape):
        raise GradtoolError(f"fusion_plan: expected a Tape, got {type(tape).__name__}")
    try:
        loss_id = tape.var(loss).id
    except GradtoolError as exc:
        raise CaptureError(f"loss: {exc}") from None
    captured = rounded_tape(tape, dtype) if dtype is not None else tape
    return fuse(captured, capture_program(captured, loss_id, dtype, optimizer))


class DeviceEngine:
    """The training engine on a registered device backend, or ``auto`` (same interface as
    train.CpuEngine)."""

    def __init__(self, tape, loss_id: int, optimizer, backend: str = "auto",
                 dtype: Optional[str] = None,
                 graph: bool = True, fuse: bool = False, max_bytes: Optional[int] = None,
                 **options):
        if options:
            raise GradtoolError(f"unknown device engine option(s): {', '.join(sorted(options))}")
        self.tape = tape
        self.optimizer = optimizer
        self.replay = capture(tape, loss_id, backend, dtype, optimizer=optimizer, graph=graph,
                              fuse=fuse, max_bytes=max_bytes)
        self.name = self.replay.backend
        rp = self.replay
        self.label = self.name + (f" (fused: {rp.launches()} launches per step instead of "
                                  f"{sum(rp.unfused_counts.values())})" if fuse else "")

    def set_input(self, node_id: int, batch: np.ndarray) -> None:
        self.replay.set_input(node_id, batch)

    def train_step(self) -> float:
        return self.replay.episode(train=True)

    def evaluate(self) -> float:
        self.replay.forward()
        return self.replay.loss()

    def forward_backward(self) -> float:
        return self.replay.episode(train=False)

    def grad(self, node_id: int) -> np.ndarray:
        return self.replay.grad(node_id)

    def params_from_tape(self) -> None:
        for i in self.replay.program.param_ids:
            self.replay.set_input(i, self.tape.values[i])

    def output(self, node_id: int) -> np.ndarray:
        return self.replay.value(node_id)

    def finish(self) -> None:
        self.replay.sync_params_to_tape(self.tape)
        self.replay.sync_optimizer(self.optimizer)


__all__ = ["capture", "DeviceReplay", "DeviceEngine", "resolve_backend", "CaptureError",
           "BACKENDS", "fusion_plan"]


# ── parity with the CPU tape, and timing (used by `gradtool replay-gpu`) ───

F32_BOUND = 1e-5          # documented float32 parity bound: max|dev - cpu| / max|cpu| per tensor


def ulp_distance(a, b) -> float:
    """Largest distance in units in the last place between two float64 arrays.

    0 only when the arrays are identical to the bit (+0.0 and -0.0 are 1
    apart), except that a NaN matches any NaN: NaN sign and payload bits are
    not part of the promise (x86 and CUDA make different default NaNs, and
    compilers treat ``a + (-b)`` and ``a - b`` as the same operation).  inf
    where exactly one side is NaN.
    """
    a = np.ascontiguousarray(a, dtype=np.float64).reshape(-1)
    b = np.ascontiguousarray(b, dtype=np.float64).reshape(-1)
    ia, ib = a.view(np.int64), b.view(np.int64)
    differ = np.nonzero(ia != ib)[0]
    worst = 0.0
    for k in differ:
        x, y = int(ia[k]), int(ib[k])
        if np.isnan(a[k]) and np.isnan(b[k]):
            continue
        if np.isnan(a[k]) or np.isnan(b[k]):
            return float("inf")
        # map the bit patterns onto a line where neighbouring doubles are 1 apart
        ox = x if x >= 0 else -(x & 0x7FFFFFFFFFFFFFFF) - 1
        oy = y if y >= 0 else -(y & 0x7FFFFFFFFFFFFFFF) - 1
        worst = max(worst, float(abs(ox - oy)))
    return worst


def relative_error(dev, ref) -> float:
    """max|dev - ref| / max|ref| over one tensor: 0 when every element is equal (equal
    infinities included), inf on a NaN or infinity mismatch; the scale is the largest
    finite |ref|."""
    dev = np.asarray(dev, dtype=np.float64).reshape(-1)
    ref = np.asarray(ref, dtype=np.float64).reshape(-1)
    if not np.array_equal(np.isnan(dev), np.isnan(ref)):
        return float("inf")
    ok = ~np.isnan(ref)
    dev, ref = dev[ok], ref[ok]
    differ = dev != ref
    if not differ.any():
        return 0.0
    with np.errstate(all="ignore"):
        worst = float(np.max(np.abs(dev[differ] - ref[differ])))
    finite = np.abs(ref[np.isfinite(ref)])
    scale = float(np.max(finite)) if finite.size else 0.0
    if not math.isfinite(worst) or scale == 0.0:
        return float("inf")
    return worst / scale


def parity_item(what: str, node: int, dev, ref, dtype: str) -> dict:
    ulps = ulp_distance(dev, ref)
    rel = relative_error(dev, ref)
    ok = ulps == 0.0            # f64 and f32 tapes alike: the CPU reference's bits
    return {"what": what, "node": node, "ulps": ulps, "rel": rel, "ok": bool(ok)}


def check_gradients(replay: DeviceReplay, tape, loss_id: int) -> list:
    """One episode on the device and on the CPU tape; the loss and every param gradient.

    Both dtypes pass only bit for bit (an f32 replay against its f32 tape's CPU
    reference, numerics32).
    """
    with np.errstate(all="ignore"):
        tape.zero_grad()
        tape.forward()
        tape.backward(tape.var(loss_id))
    replay.forward()
    replay.backward()
    items = [parity_item("loss", loss_id, replay.loss(), tape.values[loss_id], replay.dtype)]
    for p in tape.params():
        label = f"grad {p.id}" + (f" ({tape.nodes[p.id].name})" if tape.nodes[p.id].name else "")
        items.append(parity_item(label, p.id, replay.grad(p.id), tape.grad(p), replay.dtype))
    return items


def check_step(replay: DeviceReplay, tape, cpu_optimizer) -> list:
    """After :func:`check_gradients`: one optimizer step on both sides; every param."""
    replay.step()
    loss = float(np.asarray(tape.values[replay.loss_id]).reshape(-1)[0])
    if math.isfinite(loss):
        # the training contract on both engines: a non-finite loss updates nothing (the
        # device's guard kernel skips the step; the CPU engine stops before it)
        with np.errstate(all="ignore"):
            cpu_optimizer.step(tape)
    items = []
    for p in tape.params():
        label = f"param {p.id}" + (f" ({tape.nodes[p.id].name})" if tape.nodes[p.id].name else "")
        items.append(parity_item(label + " after one step", p.id, replay.value(p.id),
                                 tape.values[p.id], replay.dtype))
    return items


def time_episodes(replay: DeviceReplay, episodes: int, warmup: int, train: bool) -> dict:
    """Run ``warmup`` then ``episodes`` episodes; per-episode wall times and losses."""
    import time

    for _ in range(warmup):
        replay.episode(train)
    times, losses = [], []
    clock = time.perf_counter
    for _ in range(episodes):
        t0 = clock()
        loss = replay.episode(train)
        times.append(clock() - t0)
        losses.append(loss)
    arr = np.array(times)
    median = float(np.median(arr))
    return {"episodes": episodes, "warmup": warmup, "median": median,
            "p10": float(np.percentile(arr, 10)), "p90": float(np.percentile(arr, 90)),
            "episodes_per_second": (1.0 / median) if median > 0 else float("inf"),
            "loss_first": losses[0], "loss_last": losses[-1]}
