"""The training loop, backend-agnostic: minibatches in, optimizer steps, checkpoints out.

    tf = tapefile.load("model.msgpack")
    result = train(tf, "data.npz", TrainOptions(epochs=3, save="out.msgpack"))

Per step the loop fills the tape's input slots (named consts) with the next
minibatch, then asks the engine for one training step: forward replay,
backward, optimizer step.  The tape's node structure never changes, so
memory does not grow with the number of steps.  After a step whose loss is finite,
each state slot (the file's ``state`` map: a named const, not an input slot) takes
the value of its output from that step's forward (data-parallel: the shard mean of
the shards' outputs), in the tape, which checkpoints write, and in the engine.

Engines (:mod:`gradtool.train.engines`, ``make_engine``): ``cpu`` is :class:`CpuEngine`, the numpy
reference; ``host``/``cuda``/``auto`` are ``gradtool.device.engine.DeviceEngine``,
with the same methods.  An engine's contract:

* ``set_input(node_id, batch)``: fill a slot (exact slot shape).  Optionally
  ``set_input_rows(node_id, source, rows)``: the same with ``source[rows]``,
  gathered without an intermediate array.
* ``train_step() -> float``: forward, backward, ``optimizer.step`` semantics;
  returns the loss of THIS forward (before the update).  When that loss is
  not finite the engine must leave parameters and optimizer state exactly as
  they were (the CPU engine stops before backward), so a checkpoint written
  after a non-finite loss holds the last good parameters.
* ``evaluate() -> float``: forward only.  ``output(node_id)``: a node's value
  after the last forward.
* ``finish()``: make the tape's parameter values and the optimizer's state
  (``entries[i].m/.v`` in place, ``t``, ``b1t``, ``b2t``) current.  Called at
  every checkpoint; training may continue afterwards.

For data-parallel training (:mod:`gradtool.train.distributed`) an engine is
built without an optimizer and driven shard by shard instead:

* ``forward_backward() -> float``: forward, then (only when the loss is
  finite) backward; no optimizer step.  ``grad(node_id)``: a param's
  gradient from that backward.
* ``params_from_tape()``: the tape's parameter values changed on the host
  (the optimizer ran there): use them from now on.

Settings and their precedence: :mod:`gradtool.train.options`; data:
:mod:`gradtool.train.data`; results and reporting: :mod:`gradtool.train.report`.
``docs/training.md`` is the user-level description.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from typing import Optional

import numpy as np

from ..budget import DEFAULT_MEMORY
from ..errors import GradtoolError, IdsError
from ..fileio import nul_free
from ..npzio import NpzArchive
from ..optim import Schedule, make_optimizer, optimizer_from_state
from ..optim_state import check_saved_state, legacy_kind
from ..tape import ids_culprit
from .data import (VAL_SUFFIX, AccuracySpec, DataError, batch_size, count_correct,
                   dataset_from, epoch_order, has_val_arrays, input_slots, load_dataset,
                   parse_accuracy, require_batches, split_validation)
from .distributed import DataParallel, SingleWorld
from .engines import make_engine
from .options import (Precedence, TrainError, TrainOptions, check_options, meta_defaults,
                      position_int)
from .report import TrainResult


# ── the loop ───────────────────────────────────────────────────────────────

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))


class StopFlag:
    """Set by the first SIGINT (Ctrl-C), SIGTERM or SIGHUP; the loop stops at the next
    step boundary, so the run is saved as after Ctrl-C.  ``signum`` says which came.

    A second signal gets the handler that was there before (Ctrl-C: KeyboardInterrupt
    at once).
    """

    def __init__(self):
        self.stop = False
        self.signum = None

    def __enter__(self):
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            self._old = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def _handle(self, signum, frame):
        self.stop = True
        self.signum = self.signum or signum
        again = signal.default_int_handler if signum == signal.SIGINT else self._old.get(signum)
        signal.signal(signum, again if again is not None else signal.SIG_DFL)

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        return False


# ── the trainer ────────────────────────────────────────────────────────────

class Trainer:
    """Everything resolved and validated up front; :meth:`run` then only trains."""

    def __init__(self, tf, data_path, options: TrainOptions, reporters=(), world=None):
        self.world = world if world is not None else SingleWorld()
        nul_free(data_path, "the training data")
        check_options(options, outputs=self.world.rank == 0)
        self.tf, self.tape, self.options = tf, tf.tape, options
        self.reporters = list(reporters)
        self.source = tf.source
        self.state = state_pairs(tf)      # (slot id, output id): carried from step to step
        meta = meta_defaults(tf.meta, self.source)
        self.saved = tf.optimizer
        position = check_saved_state(self.saved, self.source) if self.saved is not None else {}
        self.settings = Precedence(options, meta)
        # a saved file without "shards" in its position was trained with one shard
        saved_shards = (position_int(position, "shards", self.source, minimum=1)
                        if "shards" in position else 1 if self.saved is not None else None)
        self.shards = self.settings.pick("shards", saved_shards)
        self._load_data(data_path, meta)
        accuracy = self.settings.pick("accuracy")
        self.acc: Optional[AccuracySpec] = (parse_accuracy(accuracy, tf.outputs, self.slots,
                                                           self.tape) if accuracy else None)
        self.opt = self._build_optimizer()
        self._restore_position(position)
        self.max_steps = self.settings.pick("steps")
        self.parallel = None              # data-parallel steps: S > 1 shards, or MPI ranks
        if self.shards > 1 or self.world.size > 1:
            self.parallel = DataParallel(self)
            self.engine = self.parallel.engine
        else:
            self.engine = make_engine(options.backend, self.tape, tf.loss.id, self.opt,
                                      **({"fuse": True} if options.fuse else {}),
                                      max_bytes=options.max_memory)
        self._slot_originals = {s.node_id: self.tape.values[s.node_id].copy() for s in self.slots}
        # the rng slot (dropout's counters): set before every forward (_fill), and saved
        # as it was recorded
        self.rng_id = self.tape.rng_id()
        if self.rng_id >= 0:
            self._slot_originals[self.rng_id] = self.tape.values[self.rng_id].copy()

    def _load_data(self, data_path, meta) -> None:
        """Training and validation sets (see gradtool.train.data for the precedence of the latter)."""
        self.slots = input_slots(self.tape, self.tf.state)
        self.shard_rows = batch_size(self.slots)           # b: the rows the tape holds
        self.batch = self.shard_rows * self.shards          # B: one step's minibatch
        val_file, val_split = self.options.val, self.options.val_split
        if val_file is None and val_split is None:
            val_file, val_split = meta.get("val"), meta.get("val_split")
            if val_file is not None and not os.path.isabs(val_file):     # relative to the tape
                val_file = os.path.join(os.path.dirname(os.path.abspath(self.source)), val_file)
        self.val = None
        budget = self.options.max_memory or DEFAULT_MEMORY
        with NpzArchive(data_path) as raw:
            data = dataset_from(raw, self.slots, max_bytes=budget)
            if val_split is not None:
                data, self.val = split_validation(data, val_split)
            elif val_file is not None:
                try:
                    self.val = load_dataset(val_file, self.slots, budget)
                except GradtoolError as exc:
                    if self.options.val is not None:
                        raise
                    raise DataError(f"{self.source}: meta 'train' 'val': {exc}") from None
            elif has_val_arrays(raw, self.slots):
                self.val = dataset_from(raw, self.slots, VAL_SUFFIX, budget)
        self.data = data
        unit = (f"{self.shards} shards of {self.shard_rows} rows" if self.shards > 1
                else "the input slots' leading dim")
        self.n_batches = require_batches(data, self.batch, "the training data", unit)
        self.n_val_batches = (require_batches(self.val, self.shard_rows, "the validation data")
                              if self.val is not None else 0)

    def _build_optimizer(self):
        """The saved optimizer continues; otherwise a fresh one over every param."""
        o, saved, pick = self.options, self.saved, self.settings.pick
        if saved is not None:
            if o.optimizer is not None and o.optimizer != legacy_kind(saved):
                raise TrainError(f"{self.source}: the saved optimizer state is "
                                 f"{legacy_kind(saved)!r}; it cannot continue as "
                                 f"{o.optimizer!r} (train the original tape to start over)")
            try:
                opt = optimizer_from_state(self.tape, saved)
            except GradtoolError as exc:
                raise TrainError(f"{self.source}: {exc}") from None
            self._check_continues(opt)
        else:
            try:
                opt = make_optimizer(pick("optimizer"), pick("lr"), o.hparams,
                                     Schedule(**(o.schedule or {})))
            except GradtoolError as exc:
                raise TrainError(str(exc)) from None
            for p in self.tape.params():
                opt.add(self.tape, p)
            if not opt.entries:
                raise TrainError(f"{self.source}: the tape has no params to train")
        if o.lr is not None or saved is None:
            opt.lr = float(pick("lr"))
        if o.clip is not None or saved is None:
            opt.set_clip(pick("clip"))
        if o.l2 is not None:
            for e in opt.entries:
                e.l2 = float(o.l2)
        return opt

    def _check_continues(self, opt) -> None:
        """Hyperparameters or a schedule given for a saved run must be the saved ones."""
        o = self.options
        try:
            given = opt.table_entry.hparams({**opt.hparams, **(o.hparams or {})})
            schedule = Schedule(**{**opt.schedule.to_dict(), **(o.schedule or {})})
        except GradtoolError as exc:
            raise TrainError(str(exc)) from None
        if given != opt.hparams or schedule.to_dict() != opt.schedule.to_dict():
            raise TrainError(f"{self.source}: the saved {opt.kind} runs with "
                             f"{opt.hparams} and schedule {opt.schedule.to_dict()}; it cannot "
                             f"continue with others (train the original tape to start over)")

    def _restore_position(self, position: dict) -> None:
        """Where a saved run stopped (0-based epoch, steps taken in it), and where to stop."""
        pick = self.settings.pick
        self.seed = int(pick("seed", position.get("seed")))
        self.shuffle = bool(pick("shuffle", position.get("shuffle")))
        self.epoch = position_int(position, "epoch", self.source)
        self.step = position_int(position, "step", self.source)
        self.global_step = position_int(position, "global_step", self.source)
        if self.step and position.get("examples") != self.data.count:
            raise TrainError(f"{self.source}: saved in the middle of epoch {self.epoch + 1} "
                             f"(step {self.step}) of {position.get('examples')} training "
                             f"examples, but the data now gives {self.data.count}; continue "
                             f"on the same data")
        if self.step and position.get("batch", self.batch) != self.batch:
            raise TrainError(f"{self.source}: saved in the middle of epoch {self.epoch + 1} "
                             f"(step {self.step}) with minibatches of {position.get('batch')} "
                             f"rows ({position.get('shards', 1)} shard(s)), but --shards "
                             f"{self.shards} makes them {self.batch}; continue with --shards "
                             f"{position.get('shards', 1)}")
        if self.step >= self.n_batches:
            self.epoch, self.step = self.epoch + 1, 0
        target = position.get("target_epoch")
        if self.options.epochs is None and isinstance(target, int) and target > self.epoch:
            self.end_epoch = target                 # an unfinished run finishes its plan
        else:
            self.end_epoch = self.epoch + int(pick("epochs"))

    # ── notes ──────────────────────────────────────────────────────────────
    def _emit(self, method, arg):
        for r in self.reporters:
            getattr(r, method)(arg)

    def describe(self) -> None:
        b = self.batch
        dropped = self.data.count - self.n_batches * b
        self._emit("note", f"training: {self.data.count} examples, batch {b}, "
                           f"{self.n_batches} steps per epoch"
                   + (f"; the last partial batch of {dropped} is dropped" if dropped else ""))
        if self.val is not None:
            vdrop = self.val.count - self.n_val_batches * self.shard_rows
            self._emit("note", f"validation: {self.val.count} examples in {self.n_val_batches} "
                               f"batches" + (f" ({vdrop} left out)" if vdrop else ""))
        resumed = self.saved is not None
        self._emit("note", f"{self.opt.kind} lr {self.opt.lr:g}"
                   + (f" clip {self.opt.clip:g}" if self.opt.clip else "")
                   + f", seed {self.seed}, shuffle {'on' if self.shuffle else 'off'}, "
                   f"backend {getattr(self.engine, 'label', self.engine.name)}"
                   + (f"; continuing at epoch {self.epoch + 1} step {self.step}" if resumed
                      else ""))
        if self.state:
            names = ", ".join(self.tf.state)
            self._emit("note", f"state: {names}, each replaced after every step by its output")
        if self.parallel is not None:
            self._emit("note", self.parallel.describe())

    # ── checkpoints ────────────────────────────────────────────────────────
    def position(self) -> dict:
        position = {"epoch": self.epoch, "step": self.step, "global_step": self.global_step,
                    "target_epoch": self.end_epoch, "seed": self.seed, "shuffle": self.shuffle,
                    "examples": self.data.count, "batch": self.batch}
        if self.shards > 1:
            position["shards"] = self.shards
        return position

    def save(self, path) -> None:
        """Write the tape with the current parameters and optimizer state, atomically."""
        from ..tapefile import save
        if self.parallel is None:
            self.engine.finish()
        elif not self.parallel.agree():
            return                        # every rank checked its parameters; rank 0 writes
        for node_id, original in self._slot_originals.items():
            self.tape.values[node_id][...] = original    # the file keeps its own example inputs
        state = self.opt.state_dict()
        state["position"] = self.position()
        save(self.tape, path, loss=self.tf.loss, outputs=self.tf.outputs, meta=self.tf.meta,
             optimizer=state, state=self.tf.state)

    def params_finite(self) -> bool:
        if self.parallel is None:         # data-parallel: the tape is always current
            self.engine.finish()
        return all(np.isfinite(self.tape.values[e.node_id]).all() for e in self.opt.entries)

    # ── the loop ───────────────────────────────────────────────────────────
    def _fill(self, data, rows, shard: int = 0, train: bool = True) -> None:
        """The input slots take ``data``'s ``rows``; the rng slot, when the tape has one,
        takes [global step, shard, 1] to train (the step this forward belongs to, counted
        over the file's life, so a resumed run draws the same numbers; ``shard`` the
        global shard index, 0 on the single-shard path), [global step, 0, 0] to validate
        (the train flag off: dropout gives its input). docs/training.md."""
        gather = getattr(self.engine, "set_input_rows", None)
        for s in self.slots:
            if gather is not None and not isinstance(rows, slice):
                gather(s.node_id, data.arrays[s.name], rows)   # no intermediate batch
            else:
                self.engine.set_input(s.node_id, data.arrays[s.name][rows])
        if self.rng_id >= 0:
            self.engine.set_input(self.rng_id, np.array(
                [float(self.global_step), float(shard) if train else 0.0, float(train)]))

    def validate(self) -> tuple:
        """(mean batch loss, accuracy or None) over the validation batches; forward only.

        Batches of the tape's own rows, whatever the shards; data-parallel ranks share
        them out and the losses are summed in batch order all the same."""
        b, losses, correct = self.shard_rows, [], 0
        batches = (range(self.n_val_batches) if self.parallel is None
                   else self.parallel.val_batches(self.n_val_batches))
        for i in batches:
            rows = slice(i * b, (i + 1) * b)
            self._fill(self.val, rows, train=False)
            try:
                losses.append(self.engine.evaluate())
            except IdsError as exc:
                raise self._bad_ids(exc, self.val, rows, "the validation data") from None
            if self.acc:
                correct += count_correct(self.acc, self.engine.output(self.acc.output_id),
                                         self.val.arrays[self.acc.target][rows])
        if self.parallel is not None:
            losses, correct = self.parallel.gather_val(batches, losses, correct)
        total = 0.0
        for loss in losses:
            total = total + loss
        acc = correct / (self.n_val_batches * b) if self.acc else None
        return total / self.n_val_batches, acc

    def run(self, stop: Optional[StopFlag] = None, keep_history: bool = False) -> TrainResult:
        res = TrainResult(accuracy_on=("val" if self.val is not None else "train")
                          if self.acc else None)
        self._t0 = time.perf_counter()
        self._last_ckpt = self.global_step
        if self.parallel is not None:
            stop = self.parallel.watch(stop)    # every rank stops where rank 0 decides
        with np.errstate(all="ignore"):
            while self.epoch < self.end_epoch and res.stopped == "done":
                self._run_epoch(res, stop, keep_history)
        res.seconds = time.perf_counter() - self._t0
        res.optimizer_state_bytes = (
            self.parallel.state_bytes_by_rank() if self.parallel is not None
            else [sum(a.nbytes for e in self.opt.entries for a in e.state.values())])
        if self.options.save:
            # after a non-finite loss the engine has not updated anything, so the
            # parameters are the last good ones unless an earlier step already broke them
            if res.stopped == "nonfinite" and not self.params_finite():
                res.save_skipped = True
            else:
                self.save(self.options.save)
                res.saved = self.options.save
        res.position = self.position()
        self._emit("end", res)
        return res

    def _run_epoch(self, res, stop, keep_history) -> None:
        b = self.batch
        order = epoch_order(self.seed, self.epoch, self.data.count, self.shuffle)
        losses, correct, seen, t_epoch = 0.0, 0, 0, time.perf_counter()
        while self.step < self.n_batches:
            if stop is not None and stop.stop:
                res.stopped = "interrupted"
            elif self.max_steps is not None and res.steps >= self.max_steps:
                res.stopped = "steps"
            if res.stopped != "done":
                break
            rows = order[self.step * b:(self.step + 1) * b]
            t_step = time.perf_counter()
            loss, step_correct = self._train_rows(rows)
            now = time.perf_counter()
            if not math.isfinite(loss):
                res.stopped, res.bad_loss = "nonfinite", loss
                break
            correct += step_correct
            self.step += 1
            self.global_step += 1
            res.steps += 1
            res.final_loss = loss
            losses = losses + loss
            seen += 1
            if keep_history:
                res.step_losses.append((self.global_step, loss))
            self._emit("step", {"event": "step", "epoch": self.epoch + 1, "step": self.step,
                                "steps_per_epoch": self.n_batches,
                                "global_step": self.global_step, "loss": loss, "batch": b,
                                "seconds": now - self._t0, "step_seconds": now - t_step})
            if self.step < self.n_batches:
                self._maybe_checkpoint()
        if seen:
            res.train_loss = losses / seen
        if self.step == self.n_batches:
            self._end_epoch(res, res.train_loss if seen else None,
                            correct / (seen * b) if seen else None, t_epoch)
            self._maybe_checkpoint()      # after the epoch closes: the position is normalized

    def _train_rows(self, rows) -> tuple:
        """One step on the minibatch ``rows``: (its loss, the rows it classified right
        when training accuracy is measured, else 0)."""
        if self.parallel is not None:
            return self.parallel.step(rows)
        self._fill(self.data, rows)
        try:
            loss = self.engine.train_step()
        except IdsError as exc:
            raise self._bad_ids(exc, self.data, rows, "the training data") from None
        if self.state and math.isfinite(loss):
            self.set_state([np.array(self.engine.output(o)) for _, o in self.state])
        if not (self.acc and self.val is None and math.isfinite(loss)):
            return loss, 0
        return loss, count_correct(self.acc, self.engine.output(self.acc.output_id),
                                   self.data.arrays[self.acc.target][rows])

    def _bad_ids(self, exc: IdsError, data, rows, what: str) -> GradtoolError:
        """A take's bad id traced back to the input slot and the example of ``data`` it came
        from (:func:`gradtool.tape.ids_culprit`), else the engine's error as it is."""
        values = {s.node_id: data.arrays[s.name][rows] for s in self.slots}
        found = ids_culprit(self.tape, exc, values)
        if found is None:
            return exc
        name, row = found
        if row is not None:
            index = np.arange(data.count)[rows][row]
            where = f"example {int(index)} of {what}"
        else:
            where = f"a batch of {what}"
        return DataError(f"{name}: {where}: {exc}")

    def set_state(self, values) -> None:
        """The state slots take ``values`` (one array per :attr:`state` entry): in the tape,
        which a checkpoint writes, and in the engine, which the next step reads."""
        for (slot, _), value in zip(self.state, values):
            self.tape.values[slot][...] = value
            self.engine.set_input(slot, self.tape.values[slot])

    def _maybe_checkpoint(self) -> None:
        every = self.options.every
        if every and self.global_step - self._last_ckpt >= every:
            self.save(self.options.save)
            self._last_ckpt = self.global_step

    def _end_epoch(self, res, train_loss, train_acc, t_epoch):
        record = {"event": "epoch", "epoch": self.epoch + 1, "epochs": self.end_epoch,
                  "global_step": self.global_step, "train_loss": train_loss}
        if self.val is not None:
            res.val_loss, acc = self.validate()
            record["val_loss"] = res.val_loss
            res.val_losses.append((self.global_step, res.val_loss))
            if self.acc:
                res.accuracy = record["val_accuracy"] = acc
        elif self.acc:
            res.accuracy = record["train_accuracy"] = train_acc
        record["seconds"] = time.perf_counter() - t_epoch      # training and validation
        res.epochs += 1
        self.epoch, self.step = self.epoch + 1, 0
        self._emit("epoch", record)


def state_pairs(tf) -> list:
    """(slot node id, output node id) for each entry of the file's ``state`` map, in file
    order (the loader checked both: a named float64 const, an output of its shape)."""
    if not tf.state:
        return []
    names = {n.name: i for i, n in enumerate(tf.tape.nodes) if n.op == "const" and n.name}
    return [(names[slot], tf.outputs[out].id) for slot, out in tf.state.items()]


def train(tf, data_path, options: Optional[TrainOptions] = None, reporters=(),
          stop: Optional[StopFlag] = None, keep_history: bool = False) -> TrainResult:
    """Train a loaded tape file on ``data_path`` (see the module docstring), in this one
    process (``options.shards`` included); over MPI see gradtool.train.distributed."""
    trainer = Trainer(tf, data_path, options or TrainOptions(), reporters)
    trainer.describe()
    return trainer.run(stop, keep_history=keep_history)


__all__ = ["Trainer", "train", "StopFlag", "state_pairs"]
