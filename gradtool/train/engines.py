"""The training engines: ``cpu`` (the numpy reference, :class:`CpuEngine`) and, through
:func:`make_engine`, the device engine on every backend of the device registry
(:mod:`gradtool.device.backends`: ``host``, ``cuda``, ..., and ``auto``).  The names
:func:`engine_names` lists are what ``gradtool train --backend`` offers.  The contract
every engine keeps is in :mod:`gradtool.train.loop`'s docstring."""

from __future__ import annotations

import math

import numpy as np

from .. import native
from .data import DataError
from .options import TrainError


class CpuEngine:
    """The numpy reference engine: replays the tape in place."""

    name = "cpu"

    def __init__(self, tape, loss_id: int, optimizer):
        self.tape, self.loss_id, self.optimizer = tape, int(loss_id), optimizer
        self._loss = tape.var(self.loss_id)
        native.keep_freed_memory()        # every step's temporaries reuse the last step's memory

    def set_input(self, node_id: int, batch: np.ndarray) -> None:
        slot = self.tape.values[node_id]
        if batch.shape != slot.shape:
            raise DataError(f"input for node {node_id} has shape {list(batch.shape)}, "
                            f"the slot {list(slot.shape)}")
        slot[...] = batch

    def set_input_rows(self, node_id: int, source: np.ndarray, rows) -> None:
        """``set_input(node_id, source[rows])`` without the intermediate array: the rows
        are gathered straight into the slot (the same values, one copy fewer)."""
        slot = self.tape.values[node_id]
        if (type(source) is np.ndarray and source.dtype == slot.dtype
                and source.shape[1:] == slot.shape[1:] and len(rows) == slot.shape[0]):
            # numpy buffers take's out= in its default mode="raise" (a second copy, about
            # 70 us of the 784-256-10 step); rows already in range pick the same rows
            # under "clip", unbuffered, and anything else keeps the checked default
            idx = np.asarray(rows)
            in_range = (idx.dtype.kind in "iu" and idx.size and int(idx.min()) >= 0
                        and int(idx.max()) < source.shape[0])
            np.take(source, idx, axis=0, out=slot, mode="clip" if in_range else "raise")
        else:
            self.set_input(node_id, source[rows])

    def train_step(self) -> float:
        loss = self.forward_backward()
        if math.isfinite(loss):           # else no update: keep the last good state
            self.optimizer.step(self.tape)
        return loss

    def forward_backward(self) -> float:
        tape = self.tape
        tape.forward()
        loss = float(tape.values[self.loss_id].reshape(-1)[0])   # any one-element shape
        if math.isfinite(loss):           # else no backward
            tape.zero_grad()              # leaf gradients would otherwise accumulate
            tape.backward(self._loss)
        return loss

    def grad(self, node_id: int) -> np.ndarray:
        return self.tape.grads[node_id]

    def params_from_tape(self) -> None:
        pass                              # the tape is this engine's state

    def evaluate(self) -> float:
        self.tape.forward()
        return float(self.tape.values[self.loss_id].reshape(-1)[0])

    def output(self, node_id: int) -> np.ndarray:
        return self.tape.values[node_id]

    def finish(self) -> None:
        pass                              # the tape and optimizer are already current


CPU = "cpu"


def _device_names() -> tuple:
    """The device registry's choices (``()`` where the device package is missing)."""
    try:
        from gradtool.device import backends
    except ModuleNotFoundError as exc:
        if exc.name in ("gradtool.device", "gradtool.device.backends"):
            return ()
        raise
    return backends.choices()


def engine_names() -> tuple:
    """Every training engine: ``cpu``, then the device registry's backends and ``auto``."""
    return (CPU, *_device_names())


def make_engine(backend: str, tape, loss_id: int, optimizer, **options):
    """``cpu`` -> CpuEngine; a registered device backend or ``auto`` -> the device engine
    (``options``: DeviceEngine's, e.g. ``fuse``, ``max_bytes``; the CPU engine needs
    none)."""
    if backend == CPU:
        return CpuEngine(tape, loss_id, optimizer)
    if backend not in engine_names():
        raise TrainError(f"unknown backend {backend!r} (choose from "
                         f"{', '.join(engine_names())})")
    try:
        from gradtool.device.engine import DeviceEngine
    except ModuleNotFoundError as exc:
        if exc.name in ("gradtool.device", "gradtool.device.engine"):
            raise TrainError(f"--backend {backend} needs the device engine "
                             f"(gradtool.device.engine), which this installation does not "
                             f"have; use --backend cpu") from None
        raise
    return DeviceEngine(tape, loss_id, optimizer, backend=backend, **options)



__all__ = ["CpuEngine", "make_engine", "engine_names", "CPU"]
