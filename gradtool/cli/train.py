"""`gradtool train`: train a tape file's params on an .npz dataset (thin over gradtool.train)."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time

import click

from ..optim import table as optim_table
from ..optim.schedule import KINDS as SCHEDULES

from ..errors import GradtoolError
from ..train import Reporter, StopFlag, TrainError, TrainOptions, Trainer
from ..train.distributed import (DEFAULT_TIMEOUT, DistributedError, RankFailure, StartRefused,
                                 error_line, mpi_world, start, supervise)
from ..train.engines import engine_names
from .choices import RegistryChoice
from .common import (EXIT_BAD_INPUT, EXIT_CHECK_FAILED, fail, load_tape, memory_budget,
                     output_file, silence_stdout, stream_file)


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)                       # "nan", "inf": JSON has no such numbers
    return x


class JsonlLog(Reporter):
    """--log FILE.jsonl: one JSON object per step, per epoch, and at the end."""

    def __init__(self, path):
        self.f = open(path, "w", encoding="utf-8")

    def _write(self, record):
        self.f.write(json.dumps({k: _json_safe(v) for k, v in record.items()}) + "\n")

    def step(self, record):
        self._write(record)

    def epoch(self, record):
        self._write(record)
        self.f.flush()

    def end(self, result):
        self._write({"event": "end", **result.summary()})
        self.f.close()


PROGRESS_ENV = "GRADTOOL_PROGRESS_SECONDS"
PROGRESS_SECONDS = 5.0          # stderr not a terminal: a plain progress line this often


def progress_interval() -> float:
    """Seconds between the plain progress lines when stderr is not a terminal:
    ``GRADTOOL_PROGRESS_SECONDS`` (0: every step; a negative number: none), else
    :data:`PROGRESS_SECONDS` (tqdm's ``mininterval`` idea)."""
    raw = os.environ.get(PROGRESS_ENV, "").strip()
    if not raw:
        return PROGRESS_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise GradtoolError(f"{PROGRESS_ENV} must be a number of seconds (0: every step, "
                            f"negative: no progress lines), got {raw!r}")
    return value


class Console(Reporter):
    """Epoch lines on stdout; notes and a progress line on stderr: on a terminal one line,
    refreshed at most ten times a second; elsewhere (a pipe, a file, CI, nohup) a plain
    line every :func:`progress_interval` seconds."""

    def __init__(self):
        self.tty = sys.stderr.isatty()
        self.interval = 0.1 if self.tty else progress_interval()
        self._shown = time.perf_counter() if not self.tty else 0.0
        self._mark = (time.perf_counter(), 0)      # for examples/s
        self._running = None
        self.stdout_gone = False

    def note(self, text):
        click.echo(f"gradtool: {text}", err=True)

    def step(self, r):
        loss = r["loss"]
        self._running = loss if self._running is None else 0.9 * self._running + 0.1 * loss
        if self.interval < 0:
            return
        now = time.perf_counter()
        if now - self._shown < self.interval and (not self.tty
                                                   or r["step"] != r["steps_per_epoch"]):
            return
        t_mark, s_mark = self._mark
        rate = (r["global_step"] - s_mark) * r["batch"] / max(now - t_mark, 1e-9)
        self._mark, self._shown = (now, r["global_step"]), now
        text = (f"epoch {r['epoch']} step {r['step']}/{r['steps_per_epoch']} "
                f"loss {self._running:.4g} {rate:,.0f} ex/s")
        if self.tty:
            sys.stderr.write(f"\r\033[K{text}")
        else:
            sys.stderr.write(f"gradtool: {text} ({r['seconds']:.1f} s)\n")
        sys.stderr.flush()

    def _clear(self):
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()

    def epoch(self, r):
        self._clear()
        parts = [f"epoch {r['epoch']}/{r['epochs']}", f"train_loss {r['train_loss']:.6g}"]
        if "val_loss" in r:
            parts.append(f"val_loss {r['val_loss']:.6g}")
        for key in ("val_accuracy", "train_accuracy"):
            if key in r:
                parts.append(f"{key[:-8]}acc {r[key]:.4f}")
        parts.append(f"({r['seconds']:.2f} s)")
        if not self.stdout_gone:
            try:
                click.echo("  ".join(parts))
            except OSError:
                # a reader that went away (`| head -1`) or a closed stdout must not cost
                # the run: training goes on and saves; only these lines are lost
                self.stdout_gone = True
                silence_stdout()

    def end(self, result):
        self._clear()


def optimizer_flags(command):
    """One flag per hyperparameter of the optimizer table (``--momentum``, ``--beta1``,
    ``--nesterov/--no-nesterov``, ...) and the lr schedule's flags."""
    seen = {}
    for entry in optim_table.TABLE.values():
        for h in entry.hypers:
            seen.setdefault(h.name, (h, []))[1].append((entry, h))
    for name, (h, users) in reversed(list(seen.items())):
        flag = "--" + name.replace("_", "-")
        docs = {u.doc for _, u in users}
        if h.kind == "bool":
            about = h.doc if len(docs) == 1 else "; ".join(f"{e.name}: {u.doc}"
                                                            for e, u in users)
            decl = click.option(f"{flag}/--no-{name.replace('_', '-')}", f"hp_{name}",
                                default=None,
                                help=f"{about} ({', '.join(e.name for e, _ in users)}).")
        else:
            about = "; ".join(f"{e.name}: {u.doc}, default {u.default!r}" for e, u in users)
            decl = click.option(flag, f"hp_{name}", type=float, default=None,
                                help=f"{h.name.replace('_', ' ')} ({about}).")
        command = decl(command)
    schedule = [
        click.option("--lr-schedule", "sch_kind", type=click.Choice(list(SCHEDULES)),
                     default=None, help="Learning-rate schedule after the warmup (default none)."),
        click.option("--warmup", "sch_warmup", type=click.IntRange(min=0), default=None,
                     metavar="N", help="Linear warmup from 0 over the first N steps."),
        click.option("--t-max", "sch_t_max", type=click.IntRange(min=1), default=None,
                     help="cosine: steps of the half period (T_max)."),
        click.option("--eta-min", "sch_eta_min", type=click.FloatRange(min=0), default=None,
                     help="cosine: the lowest lr (eta_min, default 0)."),
        click.option("--step-size", "sch_step_size", type=click.IntRange(min=1), default=None,
                     help="step: multiply the lr by gamma every this many steps."),
        click.option("--gamma", "sch_gamma", type=click.FloatRange(min=0), default=None,
                     help="step/exponential: the decay factor (default 0.1)."),
    ]
    for decl in reversed(schedule):
        command = decl(command)
    return command


def optimizer_settings(flags: dict) -> dict:
    """The TrainOptions fields the optimizer_flags give: hparams and schedule (None when
    none was given)."""
    hparams = {k[3:]: v for k, v in flags.items() if k.startswith("hp_") and v is not None}
    schedule = {k[4:]: v for k, v in flags.items() if k.startswith("sch_") and v is not None}
    return {"hparams": hparams or None, "schedule": schedule or None}


@click.command("train")
@click.argument("tape", metavar="TAPE")
@click.option("--data", "data", required=True, metavar="DATA.npz",
              help="Training arrays, one per input slot (named const), examples along axis 0.")
@click.option("--optimizer", type=click.Choice(list(optim_table.NAMES)),
              help="Optimizer: sgd, adam and adamw are torch.optim's formulas; adam-seed is "
                   "the seed's eps-hat Adam (default: the tape's meta, else adam-seed).")
@optimizer_flags
@click.option("--lr", type=float, help="Learning rate (default: meta, else 0.001).")
@click.option("--epochs", type=click.IntRange(min=1),
              help="Epochs to run (on a saved file: this many more; default: meta, else 1).")
@click.option("--steps", type=click.IntRange(min=1), help="Stop after this many steps.")
@click.option("--clip", type=click.FloatRange(min=0), help="Clip the global gradient norm "
              "(0 = off).")
@click.option("--l2", type=click.FloatRange(min=0), help="Set every param's L2 coefficient.")
@click.option("--seed", type=click.IntRange(min=0), help="Shuffle seed (default 0).")
@click.option("--shuffle/--no-shuffle", default=None,
              help="Shuffle each epoch (default on).")
@click.option("--val-split", type=float, metavar="FRACTION",
              help="Hold out the last FRACTION of DATA for validation.")
@click.option("--val", "val", metavar="VAL.npz", help="Validation arrays (same layout as DATA).")
@click.option("--accuracy", metavar="OUTPUT:TARGET",
              help="Report argmax accuracy of a named output against a one-hot or label slot.")
@click.option("--save", metavar="OUT.msgpack", callback=output_file,
              help="Write the trained tape and optimizer state here (atomically).")
@click.option("--every", type=click.IntRange(min=1), metavar="N",
              help="Also checkpoint to --save every N steps.")
@click.option("--log", "log", metavar="FILE.jsonl", callback=stream_file,
              help="Write one JSON object per step and per epoch.")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON summary as the last line of stdout.")
@click.option("--backend", type=RegistryChoice(engine_names), default="cpu",
              show_default=True,
              help="Engine that runs the steps: cpu (the numpy reference) or a device backend.")
@click.option("--fuse", is_flag=True,
              help="Device backends: run each step as the few fused kernels generated for this "
                   "tape (identical bits; compiled once per tape). Not implied by auto.")
@click.option("--plot", metavar="LOSS.png", callback=output_file,
              help="Plot the loss curve (needs matplotlib).")
@click.option("--shards", type=click.IntRange(min=1), metavar="S",
              help="Cut each step's minibatch into S shards of the tape's rows (minibatch = "
                   "S x rows); under mpiexec the ranks share them (default: meta, else 1).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULT_TIMEOUT, show_default=True, metavar="SEC",
              help="Under MPI: how long a rank waits for another before ending the job.")
def train(tape, data, optimizer, lr, epochs, steps, clip, l2, seed, shuffle, val_split, val,
          accuracy, save, every, log, as_json, backend, fuse, plot, shards, timeout,
          **flags):
    """Train TAPE's params on DATA.npz, minibatch by minibatch.

    The tape's named consts are the input slots; the batch size is their
    leading dim.  Defaults come from the tape's meta["train"]; a file written
    by --save continues where it stopped (docs/training.md).  Ctrl-C stops
    at a step boundary and saves; a non-finite loss stops with exit 1.
    Under mpiexec, the ranks train one model on shared shards, with the same
    bits as one process (docs/training.md, "Data-parallel training").
    """
    from ..train import plot_losses, require_plotting

    supervise()                       # under an MPI launcher the work runs in a child
    try:
        world = mpi_world(timeout)
    except StartRefused as exc:
        if exc.quiet:
            sys.exit(exc.status)      # rank 0 says it
        raise
    root = world.rank == 0
    options = TrainOptions(optimizer=optimizer, lr=lr, epochs=epochs, steps=steps, clip=clip,
                           l2=l2, seed=seed, shuffle=shuffle, val_split=val_split, val=val,
                           accuracy=accuracy, save=save, every=every, log=log, backend=backend,
                           fuse=fuse, plot=plot, shards=shards, max_memory=memory_budget(),
                           **optimizer_settings(flags))

    def build():
        if plot and root:
            require_plotting()
        if tape == "-" and world.size > 1:
            raise DistributedError("TAPE '-' (standard input) reaches rank 0 only under MPI; "
                                   "give every rank a file")
        return Trainer(load_tape(tape), data, options, [Console()] if root else [], world=world)

    try:
        trainer = start(world, build)     # one process: build(); MPI: all ranks, checked
    except StartRefused as exc:
        if exc.quiet:
            sys.exit(exc.status)
        raise
    if log and root:
        trainer.reporters.append(JsonlLog(log))
    trainer.describe()
    with StopFlag() as stop:
        result = _run(trainer, world, stop, keep_history=bool(plot))
    if not root:
        world.finish()
        return
    if plot:
        plot_losses(plot, result)
    world.finish()
    if as_json:
        summary = result.summary()
        if result.optimizer_state_bytes is not None:    # each rank's (ZeRO-1: about 1/W)
            summary["optimizer_state_bytes"] = result.optimizer_state_bytes
        click.echo(json.dumps({k: _json_safe(v) for k, v in summary.items()}))
    pos = result.position
    saved = f"; saved {result.saved}" if result.saved else ""
    if result.stopped == "nonfinite":
        # the failing step did not happen: the position points at it
        kept = ("; not saved: the parameters were already non-finite" if result.save_skipped
                else f"; saved {result.saved} with the parameters from before that step"
                if result.saved else "")
        fail(f"{tape}: non-finite loss ({result.bad_loss}) at step {pos['global_step'] + 1} "
             f"(epoch {pos['epoch'] + 1}, step {pos['step'] + 1}); training stopped{kept}",
             EXIT_CHECK_FAILED)
    where = f"step {pos['global_step']} (epoch {pos['epoch'] + 1}, step {pos['step']})"
    if result.stopped == "interrupted":
        signum = stop.signum or signal.SIGINT
        how = ("interrupted" if signum == signal.SIGINT
               else f"terminated by {signal.Signals(signum).name}")
        fail(f"{how} after {where}{saved}", 128 + signum)
    if result.stopped == "steps":
        click.echo(f"gradtool: stopped after {result.steps} steps, at {where}{saved}", err=True)


def _run(trainer, world, stop, keep_history):
    """trainer.run; under MPI an error names this rank and ends the job (an exit without
    MPI_Finalize makes the launcher stop the other ranks, which may be waiting)."""
    if world.size == 1:
        return trainer.run(stop, keep_history=keep_history)
    try:
        return trainer.run(stop, keep_history=keep_history)
    except RankFailure as exc:
        fail(f"rank {world.rank}: {error_line(exc)}", EXIT_CHECK_FAILED)
    except (GradtoolError, OSError, MemoryError) as exc:
        fail(f"rank {world.rank}: {error_line(exc)}", EXIT_BAD_INPUT)


commands = [train]

__all__ = ["train", "commands", "TrainError"]
