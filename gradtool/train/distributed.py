"""Data-parallel training: S shards per minibatch on W MPI ranks, the same bits for every W.

docs/training.md ("Data-parallel training") is the user-level description.  In short:

* A minibatch is S shards of b rows (b: the tape's input slots).  Each shard is one
  forward + backward replay; the S gradients and losses are combined by
  :func:`gradtool.numerics.shard_mean` (a left fold in shard order, then one division
  by S), and the optimizer takes one step on the result.  S = 1 is plain training.
* W ranks (W divides S) each run S/W shards, rank r the contiguous block W-1-r.  The
  fold runs as a pipelined chain W-1 -> W-2 -> ... -> 0 (each rank adds its shards, in
  order, to the running sum it receives); rank 0 divides by S, computes the clip scale
  (the global norm's one serial chain, registration order then row-major, as one
  process) and sends the combined gradient and the scale back up the chain 0 -> 1 ->
  ... -> W-1.
* The optimizer is sharded (ZeRO-1, :class:`Zero1`): the P trained parameter values,
  flattened in registration order and row-major, are cut into W contiguous slices,
  rank k's the k-th; each rank holds the optimizer state (Adam's moments, SGD's
  momentum ...) of its slice only and updates only its slice, with the same scalars,
  clip scale and per-param L2 as one process; the table's rules are elementwise, so
  every element gets the same bits.  Every rank then sends its updated slice to every
  other rank (point to point, received in rank order).  Before a checkpoint the slices'
  state is gathered to rank 0, which writes the file as one process would.
  Every rank sends at most 2 (P + T + HEAD) + (W - 1) * ceil(P / W) float64 values per
  step for T state values (the file's state slots: each shard's outputs for them ride
  in the same fold, so a state slot takes the shard mean of its output, in shard order).
  Only point-to-point messages are used: MPI's reductions sum in an unspecified order.

The pieces:

* :func:`launcher_rank` and :func:`supervise`: under an MPI launcher, each rank's work
  runs in a child process that the launched process waits for, so a rank that dies
  (SIGKILL, a crash) is reported in one line naming the rank and the signal.
* :class:`SingleWorld` and :class:`MpiWorld` (:func:`mpi_world`): the ranks; objects
  and buffers sent point to point; every wait polls with a timeout, so no rank waits
  forever for a hung one; ``bytes_sent`` counts what this rank handed MPI.
* :func:`start`: build the trainer on every rank and refuse, with one line, unless
  every rank could and all agree on the tape, the data and the settings (SHA-256).
* :class:`DataParallel`: what :class:`gradtool.train.Trainer` delegates to when S > 1
  or W > 1: the step, the shared validation, the stop decision, the agreement of the
  parameters before a checkpoint.

From Python (under ``mpiexec``; a single process gets a :class:`SingleWorld`)::

    world = mpi_world()
    trainer = start(world, lambda: Trainer(load(path), data, TrainOptions(shards=4),
                                           world=world))
    result = trainer.run()
    world.finish()
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import signal
import socket
import sys
import time
from typing import Callable, Optional

import numpy as np

from ..errors import GradtoolError
from ..numerics import shard_accumulate, shard_divide
from .data import count_correct
from .options import TrainError

# launcher variables holding this process's rank: MPICH/Hydra and Intel MPI (PMI), PMIx
# (Open MPI 5, srun --mpi=pmix), Open MPI, MVAPICH
LAUNCHER_RANK_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
WORKER_ENV = "GRADTOOL_MPI_WORKER"      # set in the child that does a rank's work
DEFAULT_TIMEOUT = 300.0                 # seconds a rank waits for another
FORWARDED_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP",
                                                        "SIGUSR1", "SIGUSR2")
                          if hasattr(signal, n))

HEAD = 5               # per-step message header: loss, correct rows, stop signal, updated,
                       # the clip scale (-1: no clipping this step)
CHUNK = 1 << 17        # values per message (1 MiB): the chains are pipelined in these
LOST_GRACE = 3.0       # seconds a rank that lost a peer waits for the launcher to stop it

TAG_START, TAG_VERDICT, TAG_GRAD, TAG_PARAMS, TAG_VAL, TAG_AGREE = 11, 12, 21, 22, 31, 41
TAG_SLICE, TAG_STATE = 23, 42


class DistributedError(GradtoolError):
    """Data-parallel training cannot start (exit 2)."""


class StartRefused(DistributedError):
    """The ranks did not all start, or not from the same tape, data and settings.

    Raised on every rank; ``quiet`` on all but rank 0, which says why (one line)."""

    def __init__(self, message: str, status: int = 2, quiet: bool = False):
        super().__init__(message)
        self.status, self.quiet = status, quiet


class RankFailure(GradtoolError):
    """A rank gave up during training: another rank hung, or the ranks' parameters
    disagree (exit 1)."""


# ── the launcher and the supervisor ────────────────────────────────────────

def launcher_rank() -> Optional[int]:
    """This process's rank when an MPI launcher started it, else None (no MPI at all)."""
    for var in LAUNCHER_RANK_VARS:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return None


def supervise() -> None:
    """Under an MPI launcher: fork; the child returns and does the rank's work, while the
    process the launcher started waits for it, forwards signals to it and, when it dies
    of a signal, says so in one line and exits 128 + the signal (which makes the
    launcher stop the other ranks).  Otherwise it exits with the child's status.

    Returns at once without a launcher, in the child itself, and where there is no fork.
    """
    rank = launcher_rank()
    if rank is None or os.environ.get(WORKER_ENV) == "1" or not hasattr(os, "fork"):
        return
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.environ[WORKER_ENV] = "1"
        _die_with(parent)
        try:
            os.setpgid(0, 0)      # signals reach the work once, through the supervisor
        except OSError:
            pass
        return
    _wait_for_work(pid, rank)


def _die_with(parent: int) -> None:
    """Linux: the child gets SIGKILL when the supervisor dies (the launcher kills only
    the process it started)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)         # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:                            # it died before prctl
        os._exit(1)


def _wait_for_work(pid: int, rank: int):
    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(15, b"gradtool-rank", 0, 0, 0)           # PR_SET_NAME, for ps and top
    except (OSError, AttributeError):
        pass
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(1)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        how = "crashed" if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL,
                                   signal.SIGFPE, signal.SIGABRT) else "killed"
        sys.stderr.write(f"gradtool: rank {rank}: {how} by {name} (pid {pid} on "
                         f"{socket.gethostname()}); the job stops\n")
        sys.stderr.flush()
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


# ── the ranks ──────────────────────────────────────────────────────────────

class SingleWorld:
    """One process: rank 0 of 1.  Nothing is sent."""

    rank, size, local_rank = 0, 1, 0
    bytes_sent = 0

    def gather_obj(self, obj, tag, what):
        return [obj]

    def bcast_obj(self, obj, tag, what):
        return obj

    def finish(self) -> None:
        pass


class MpiWorld:
    """The ranks of ``MPI.COMM_WORLD``, point to point, every wait bounded by ``timeout``.

    Waits poll ``Test`` (spinning briefly, then sleeping up to 50 us between polls), so a
    rank waiting for another leaves the CPU to the ranks still computing, and gives up
    after ``timeout`` seconds with a :class:`RankFailure` naming the rank it waited for.
    """

    def __init__(self, comm, timeout: float = DEFAULT_TIMEOUT):
        from mpi4py import MPI
        self.MPI, self.comm = MPI, comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timeout = float(timeout)
        self.bytes_sent = 0
        self.local_rank = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()

    # ── buffers (numpy float64, contiguous) ────────────────────────────────
    def isend(self, buf: np.ndarray, dest: int, tag: int):
        self.bytes_sent += buf.nbytes
        return self._call(lambda: self.comm.Isend(buf, dest, tag), dest, "sending")

    def irecv(self, buf: np.ndarray, source: int, tag: int):
        return self._call(lambda: self.comm.Irecv(buf, source, tag), source, "receiving")

    def wait(self, request, peer: int, what: str) -> None:
        self._poll(request.Test, peer, what)

    def _call(self, fn: Callable, peer: int, what: str):
        """``fn()``; an MPI error (MPICH reports a dead peer so) ends the job."""
        try:
            return fn()
        except self.MPI.Exception as exc:
            # the launcher is stopping the job: a rank's supervisor is saying why (one
            # line); speak only if nobody stops this rank within LOST_GRACE seconds
            time.sleep(LOST_GRACE)
            short = " ".join(str(exc).split(", error stack")[0].split())
            raise RankFailure(f"lost rank {peer} ({what}): MPI error: {short}; the job "
                              f"stops") from None

    def _poll(self, ready: Callable[[], bool], peer: int, what: str) -> None:
        if self._call(ready, peer, what):
            return
        spins, delay, deadline = 0, 2e-5, time.monotonic() + self.timeout
        while not self._call(ready, peer, what):
            spins += 1
            if spins < 64:
                continue
            if time.monotonic() > deadline:
                raise RankFailure(f"waited {self.timeout:g} s for rank {peer} ({what}): it "
                                  f"is hung or unreachable; the job stops (a step, "
                                  f"validation or checkpoint that takes longer needs a "
                                  f"larger --timeout)")
            time.sleep(delay)
            delay = min(delay * 2, 5e-5)

    # ── small Python objects (pickled) ─────────────────────────────────────
    def send_obj(self, obj, dest: int, tag: int, what: str) -> None:
        request = self.comm.isend(obj, dest, tag)
        self._poll(lambda: request.test()[0], dest, what)

    def recv_obj(self, source: int, tag: int, what: str):
        self._poll(lambda: self.comm.Iprobe(source, tag), source, what)
        return self._call(lambda: self.comm.recv(source=source, tag=tag), source, what)

    def gather_obj(self, obj, tag: int, what: str):
        """Every rank's ``obj``, in rank order, on rank 0 (None elsewhere)."""
        if self.rank != 0:
            self.send_obj(obj, 0, tag, what)
            return None
        return [obj] + [self.recv_obj(r, tag, what) for r in range(1, self.size)]

    def bcast_obj(self, obj, tag: int, what: str):
        """Rank 0's ``obj`` on every rank."""
        if self.rank != 0:
            return self.recv_obj(0, tag, what)
        for r in range(1, self.size):
            self.send_obj(obj, r, tag, what)
        return obj

    def finish(self) -> None:
        """MPI_Finalize: only on a clean end.  A rank that exits without it (an error)
        makes the launcher stop the others, which may be waiting for it."""
        if not self.MPI.Is_finalized():
            self.MPI.Finalize()


def mpi_world(timeout: float = DEFAULT_TIMEOUT):
    """:class:`MpiWorld` when an MPI launcher started this process, else :class:`SingleWorld`."""
    rank = launcher_rank()
    if rank is None:
        return SingleWorld()
    if not timeout > 0:
        raise StartRefused(f"--timeout must be > 0 seconds, got {timeout!r}",
                           quiet=rank != 0)
    try:
        import mpi4py
        mpi4py.rc.finalize = False          # see MpiWorld.finish
        mpi4py.rc.thread_level = "funneled"
        from mpi4py import MPI
    except ImportError:
        raise StartRefused("started by an MPI launcher, but mpi4py is not installed: "
                           "pip install 'gradtool[mpi]' (docs/training.md)",
                           quiet=rank != 0) from None
    except Exception as exc:  # noqa: BLE001 - no MPI library, a broken one
        raise StartRefused(f"started by an MPI launcher, but MPI cannot start: "
                           f"{' '.join(str(exc).split())}", quiet=rank != 0) from None
    return MpiWorld(MPI.COMM_WORLD, timeout)


def error_line(exc: BaseException) -> str:
    """The one line the command line would print for ``exc``."""
    if isinstance(exc, OSError) and not isinstance(exc, GradtoolError):
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        return " ".join(f"{where}{exc.strerror or exc}".split())
    if isinstance(exc, MemoryError):
        return "out of memory"
    return " ".join(str(exc).split())


# ── start-up: every rank builds, and they agree ────────────────────────────

def start(world, build: Callable):
    """``build()`` (a Trainer) on every rank, then one verdict for all: the trainer, or
    :class:`StartRefused` on every rank when a rank could not build it, or when the
    ranks' tapes, data or settings differ."""
    if world.size == 1:
        return build()
    trainer, report = None, {"host": socket.gethostname(), "pid": os.getpid()}
    try:
        trainer = build()
        report.update(ok=True, backend=trainer.engine.name, **fingerprint(trainer))
    except (GradtoolError, OSError, MemoryError) as exc:
        report.update(ok=False, error=error_line(exc))
    reports = world.gather_obj(report, TAG_START, "the start-up check")
    verdict = judge(reports) if world.rank == 0 else None
    verdict = world.bcast_obj(verdict, TAG_VERDICT, "the start-up check")
    if verdict["error"]:
        world.finish()
        raise StartRefused(verdict["error"], 2, quiet=world.rank != 0)
    trainer.parallel.ranks = verdict["ranks"]
    return trainer


def fingerprint(trainer) -> dict:
    """SHA-256 digests of what must be the same on every rank, and what to name them by."""
    from ..tapefile import dumps
    tf = trainer.tf
    tape = dumps(tf.tape, loss=tf.loss, outputs=tf.outputs, meta=tf.meta,
                 optimizer=tf.optimizer, state=tf.state)
    return {"tape": hashlib.sha256(tape).hexdigest(), "tape_source": str(tf.source),
            "data": _data_digest(trainer.data), "data_source": str(trainer.data.source),
            "val": _data_digest(trainer.val),
            "val_source": str(trainer.val.source) if trainer.val is not None else "none",
            "settings": settings_of(trainer)}


def _data_digest(data) -> str:
    if data is None:
        return "none"
    h = hashlib.sha256(str(data.count).encode())
    for name in sorted(data.arrays):
        a = np.ascontiguousarray(data.arrays[name], dtype="<f8")
        h.update(f"{name}{list(a.shape)}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def settings_of(trainer) -> dict:
    """Everything besides tape and data that decides the bits and the message pattern."""
    opt = trainer.opt
    return {"shards": trainer.shards, "batch": trainer.batch, "seed": trainer.seed,
            "shuffle": trainer.shuffle, "epoch": trainer.epoch, "step": trainer.step,
            "global_step": trainer.global_step, "end_epoch": trainer.end_epoch,
            "steps": trainer.max_steps, "every": trainer.options.every,
            "save": trainer.options.save is not None, "accuracy": str(trainer.acc),
            "optimizer": opt.kind, "hparams": opt.hparams, "schedule": opt.schedule.to_dict(),
            "lr": opt.lr, "clip": opt.clip, "t": opt.t,
            "l2": [e.l2 for e in opt.entries]}


def judge(reports: list) -> dict:
    """Rank 0's verdict on every rank's start-up report."""
    failed = [(r, rep["error"]) for r, rep in enumerate(reports) if not rep["ok"]]
    if failed:
        if len(failed) == len(reports) and len({e for _, e in failed}) == 1:
            return {"error": failed[0][1]}          # the same everywhere: no rank to name
        r, error = failed[0]
        more = (f" (rank{'s' if len(failed) > 2 else ''} "
                f"{', '.join(str(q) for q, _ in failed[1:])} failed too)" if failed[1:] else "")
        return {"error": f"rank {r}: {error}{more}"}
    first = reports[0]
    for r, rep in enumerate(reports[1:], 1):
        for key, what, hint in (("tape", "tape", "start from the same tape"),
                                ("data", "training data", "train on the same data"),
                                ("val", "validation data", "validate on the same data")):
            if rep[key] != first[key]:
                return {"error": f"rank {r}: {what} {rep[key + '_source']} differs from rank "
                                 f"0's {first[key + '_source']} (sha256 {rep[key][:12]} vs "
                                 f"{first[key][:12]}); every rank must {hint}"}
        if rep["settings"] != first["settings"]:
            diff = ", ".join(f"{k} {rep['settings'][k]} vs {first['settings'][k]}"
                             for k in first["settings"]
                             if rep["settings"].get(k) != first["settings"][k])
            return {"error": f"rank {r}: settings differ from rank 0's: {diff}; give every "
                             f"rank the same options"}
    return {"error": None,
            "ranks": [(rep["host"], rep["pid"], rep["backend"]) for rep in reports]}


def select_gpu(world, backend: str) -> None:
    """Several ranks on a machine: each picks its device as the backend says (the device
    registry's ``select_device`` hook; cuda: GPU local rank mod count), before any opens."""
    if world.size == 1 or backend == "cpu":
        return
    from ..device import backends
    backends.select_devices(backend, world.local_rank)


# ── the data-parallel step ─────────────────────────────────────────────────

class Decision:
    """Where every rank stops: set from rank 0's decision, never by a local signal."""

    def __init__(self):
        self.stop = False
        self.signum = None


class DataParallel:
    """S shards per step on the trainer's world of W ranks (see the module docstring).

    The trainer's engine is built here, without an optimizer: on the shards it runs
    forward and backward only, and rank 0 steps ``trainer.opt`` on the host tape.
    """

    def __init__(self, trainer):
        from ..tape import reach
        from .engines import make_engine

        world, shards = trainer.world, trainer.shards
        if shards % world.size:
            raise TrainError(f"--shards {shards} cannot be shared by {world.size} ranks: "
                             f"the number of ranks must divide the number of shards")
        self.trainer, self.world, self.S, self.W = trainer, world, shards, world.size
        per_rank = shards // world.size
        block = world.size - 1 - world.rank
        self.mine = range(block * per_rank, (block + 1) * per_rank)
        select_gpu(world, trainer.options.backend)
        tape, loss_id = trainer.tape, trainer.tf.loss.id
        self.engine = make_engine(trainer.options.backend, tape, loss_id, None,
                                  **({"fuse": True} if trainer.options.fuse else {}),
                                  max_bytes=trainer.options.max_memory)
        # the flat layout of one message: HEAD values, then every parameter the backward
        # walk reaches, in registration order, row-major (what the optimizer steps)
        reached = reach(tape, loss_id)
        self.layout, offset = [], HEAD
        for e in trainer.opt.entries:
            if reached[e.node_id]:
                n = tape.values[e.node_id].size
                self.layout.append((e.node_id, offset, n))
                offset += n
        self.n_params = offset - HEAD
        # then each state output's values: folded in shard order like the gradients, so
        # the state after a step is the shard mean of the shards' outputs
        self.state_layout = []
        for slot, output in trainer.state:
            n = tape.values[slot].size
            self.state_layout.append((slot, output, offset, n))
            offset += n
        self.length = offset
        self.zero = Zero1(trainer.opt, trainer.tape, self.layout, world.rank, world.size)
        self.parts = [np.zeros(offset) for _ in self.mine]    # this rank's shard results
        self.acc = np.zeros(offset)                            # the running fold
        self.out = np.zeros(offset)                            # rank 0's answer
        self.chunks = [(lo, min(lo + CHUNK, offset)) for lo in range(0, offset, CHUNK)]
        self.decided, self.local = Decision(), None
        self.ranks = None                                      # (host, pid, backend), by start()

    @property
    def params(self) -> int:
        """P: the trained parameter values one step exchanges."""
        return self.n_params

    def describe(self) -> str:
        t = self.trainer
        what = (f"data parallel: {self.S} shards of {t.shard_rows} rows per step "
                f"(minibatch {t.batch})")
        if self.W == 1:
            return what + ", all in this process"
        ranks = "; ".join(f"rank {r} {host} pid {pid} {backend}"
                          for r, (host, pid, backend) in enumerate(self.ranks or ()))
        state = (f" and {self.length - HEAD - self.n_params} state values"
                 if self.state_layout else "")
        most = 8 * (2 * self.length + (self.W - 1) * self.zero.widest)
        return (f"{what} on {self.W} MPI ranks, {self.S // self.W} each; {self.params} "
                f"parameter values{state}, optimizer state sharded (this rank "
                f"{self.zero.state_bytes()} bytes), at most {most} bytes sent per "
                f"rank per step; {ranks}")

    def watch(self, local) -> Decision:
        """The trainer's stop flag from now on; ``local`` (a StopFlag) only votes."""
        self.local = local
        return self.decided

    # ── one step ───────────────────────────────────────────────────────────
    def step(self, rows) -> tuple:
        """Every rank's shards of the minibatch ``rows``, combined; one optimizer step.
        Returns (the step's loss, the rows classified right for training accuracy)."""
        w, r, last = self.world, self.world.rank, self.W - 1
        what = f"step {self.trainer.global_step + 1}"
        # post the receives first: data can arrive while this rank computes
        grads_in = ([w.irecv(self.acc[lo:hi], r + 1, TAG_GRAD) for lo, hi in self.chunks]
                    if r < last else [])
        params_in = ([w.irecv(self.out[lo:hi], r - 1, TAG_PARAMS) for lo, hi in self.chunks]
                     if r > 0 else [])
        self._run_shards(rows)
        stop = 0
        if self.local is not None and self.local.stop:
            stop = int(self.local.signum or signal.SIGINT)
        sends = []
        for c, (lo, hi) in enumerate(self.chunks):           # the fold, W-1 down to 0
            acc, rest = self.acc[lo:hi], self.parts
            if r == last:
                acc[...] = self.parts[0][lo:hi]               # shard 0 starts the fold
                rest = self.parts[1:]
            else:
                w.wait(grads_in[c], r + 1, f"gradients of {what}")
            for part in rest:
                shard_accumulate(acc, part[lo:hi])
            if c == 0:
                acc[2] = max(acc[2], stop)                    # any rank's signal stops all
            if r > 0:
                sends.append((w.isend(acc, r - 1, TAG_GRAD), r - 1))
        if r == 0:
            self._combine()
        for c, (lo, hi) in enumerate(self.chunks):           # the parameters, 0 up to W-1
            if r > 0:
                w.wait(params_in[c], r - 1, f"parameters of {what}")
            if r < last:
                sends.append((w.isend(self.out[lo:hi], r + 1, TAG_PARAMS), r + 1))
        for request, peer in sends:
            w.wait(request, peer, f"delivering {what}'s messages")
        loss, correct, stop, updated, scale = self.out[:HEAD]
        if updated:
            # this rank's slice of the update, then every slice to every rank
            self.zero.step(self.out, None if scale < 0.0 else float(scale))
            self.zero.exchange(w, what)
            self.engine.params_from_tape()
            if self.state_layout:
                values = self.trainer.tape.values
                self.trainer.set_state([self.out[off:off + n].reshape(values[slot].shape)
                                        for slot, _, off, n in self.state_layout])
        if stop and not self.decided.stop:
            self.decided.stop, self.decided.signum = True, int(stop)
            if self.local is not None and self.local.signum is None:
                self.local.signum = int(stop)             # the exit status names the signal
        return float(loss), int(correct)

    def _run_shards(self, rows) -> None:
        t = self.trainer
        b = t.shard_rows
        counting = t.acc is not None and t.val is None
        for part, k in zip(self.parts, self.mine):
            shard = rows[k * b:(k + 1) * b]
            t._fill(t.data, shard, shard=k)       # k: the global shard index (the rng slot)
            loss = self.engine.forward_backward()
            part[:HEAD] = (loss, 0.0, 0.0, 0.0, 0.0)
            if not math.isfinite(loss):
                continue                  # the combined loss is not finite: no update
            if counting:
                part[1] = count_correct(t.acc, self.engine.output(t.acc.output_id),
                                        t.data.arrays[t.acc.target][shard])
            for node_id, off, n in self.layout:
                part[off:off + n] = self.engine.grad(node_id).reshape(-1)
            for _, output, off, n in self.state_layout:
                part[off:off + n] = self.engine.output(output).reshape(-1)

    def _combine(self) -> None:
        """Rank 0: finish the fold (divide by S), the clip scale; fill ``out`` with the
        combined gradient every rank's slice of the update reads."""
        acc, out, opt = self.acc, self.out, self.trainer.opt
        shard_divide(acc[0:1], self.S)                     # the loss
        out[:HEAD] = acc[:HEAD]
        out[3], out[4] = 0.0, -1.0
        if not math.isfinite(acc[0]):
            return                        # updates nothing, like a single process
        shard_divide(acc[HEAD:], self.S)
        out[HEAD:] = acc[HEAD:]            # the combined gradients, then the shards' mean output
        if opt.clip > 0.0 and self.layout:
            scale = opt._clip_scale([acc[off:off + n] for _, off, n in self.layout])
            if scale is not None:
                out[4] = scale
        out[3] = 1.0

    # ── validation, checkpoints ────────────────────────────────────────────
    def state_bytes_by_rank(self) -> Optional[list]:
        """Every rank's optimizer-state bytes, in rank order (rank 0; None elsewhere)."""
        return self.world.gather_obj(self.zero.state_bytes(), TAG_STATE,
                                     "the optimizer state sizes")

    def val_batches(self, count: int) -> range:
        return range(self.world.rank, count, self.W)

    def gather_val(self, batches, losses: list, correct: int) -> tuple:
        """Every validation batch's loss, in batch order, and the total of correct rows."""
        if self.W == 1:
            return losses, correct
        what = f"validation after step {self.trainer.global_step}"
        parts = self.world.gather_obj((list(batches), losses, correct), TAG_VAL, what)
        if parts is not None:
            ordered = {}
            for idx, vals, _ in parts:
                ordered.update(zip(idx, vals))
            result = ([ordered[i] for i in range(len(ordered))], sum(c for _, _, c in parts))
        else:
            result = None
        return self.world.bcast_obj(result, TAG_VAL, what)

    def agree(self) -> bool:
        """Before a checkpoint: every rank's parameters, as SHA-256, must equal rank 0's.
        Returns whether this rank writes the file (rank 0)."""
        if self.W == 1:
            self.zero.gather_state(self.world, "the optimizer state")
            return True
        h = hashlib.sha256()
        for e in self.trainer.opt.entries:
            h.update(np.ascontiguousarray(self.trainer.tape.values[e.node_id], dtype="<f8"))
        for slot, _ in self.trainer.state:
            h.update(np.ascontiguousarray(self.trainer.tape.values[slot], dtype="<f8"))
        step = self.trainer.global_step
        self.zero.gather_state(self.world, f"the optimizer state before saving step {step}")
        digests = self.world.gather_obj(h.hexdigest(), TAG_AGREE,
                                        f"the parameter check before saving step {step}")
        if digests is None:
            return False
        for r, d in enumerate(digests):
            if d != digests[0]:
                raise RankFailure(f"rank {r}'s parameters differ from rank 0's after step "
                                  f"{step} (sha256 {d[:12]} vs {digests[0][:12]}); nothing "
                                  f"saved")
        return True


class Zero1:
    """The sharded optimizer of one rank: its slice [lo, hi) of the P trained parameter
    values (flattened in registration order, row-major; rank k holds the k-th of W
    contiguous slices) and that slice's optimizer state only.

    ``step`` updates the slice with the optimizer table's rule through
    :meth:`gradtool.optim.Optimizer.update_piece`, the same scalars, clip scale and L2
    as one process; ``exchange`` sends it to every other rank; ``gather_state`` puts
    the whole state on rank 0 before a checkpoint (and rank 0 keeps only its slice again
    after the file is written, at the next step)."""

    def __init__(self, opt, tape, layout, rank: int, size: int):
        self.opt, self.tape, self.rank, self.size = opt, tape, rank, size
        total = sum(n for _, _, n in layout)
        self.bounds = [(HEAD + total * k // size, HEAD + total * (k + 1) // size)
                       for k in range(size)]
        self.widest = max(hi - lo for lo, hi in self.bounds)
        self.layout = layout
        by_id = {e.node_id: e for e in opt.entries}
        for node_id, _, _ in layout:       # slices are views: the tape's arrays are whole
            if not tape.values[node_id].flags.c_contiguous:
                tape.values[node_id] = np.ascontiguousarray(tape.values[node_id])
        self.pieces = {k: self._pieces(k) for k in range(size)}
        # this rank's state: a copy of its pieces' slots, then the full arrays dropped
        self.state = []
        for node_id, a, b in self.pieces[rank]:
            e = by_id[node_id]
            self.state.append({s: np.ascontiguousarray(e.state[s].reshape(-1)[a:b])
                               for s in opt.slots})
        self.sharded = {node_id for node_id, _, _ in layout}
        self._entries = by_id
        self._drop_full_state()

    def _pieces(self, k: int) -> list:
        """(node id, first, end) element ranges of the params that slice k covers."""
        lo, hi = self.bounds[k]
        out = []
        for node_id, off, n in self.layout:
            a, b = max(lo, off), min(hi, off + n)
            if a < b:
                out.append((node_id, a - off, b - off))
        return out

    def _drop_full_state(self) -> None:
        for node_id in self.sharded:
            self._entries[node_id].state = {}

    def state_bytes(self) -> int:
        """The optimizer-state bytes this rank holds (its slice's slots)."""
        return sum(a.nbytes for st in self.state for a in st.values())

    def step(self, out: np.ndarray, scale) -> None:
        """One optimizer step on this rank's slice, from the combined gradient in ``out``."""
        opt = self.opt
        self._drop_full_state()           # rank 0 after a checkpoint: its slice only again
        scalars = opt.begin_step()
        offsets = {node_id: off for node_id, off, _ in self.layout}
        for (node_id, a, b), st in zip(self.pieces[self.rank], self.state):
            w = self.tape.values[node_id].reshape(-1)[a:b]
            g = out[offsets[node_id] + a:offsets[node_id] + b]
            if g.dtype != w.dtype:        # an f32 param: its combined gradient rounded once
                g = g.astype(w.dtype)
            opt.update_piece(self._entries[node_id], w, g, st, scale, scalars)

    def exchange(self, world, what: str) -> None:
        """Every rank's updated slice to every other rank, received in rank order."""
        if self.size == 1:
            return
        mine = self._pack(self.rank)
        sends = [(world.isend(mine, k, TAG_SLICE), k) for k in range(self.size)
                 if k != self.rank]
        for k in range(self.size):
            if k == self.rank:
                continue
            buf = np.empty(sum(b - a for _, a, b in self.pieces[k]),
                           self._dtype(k))           # the params' own type (f32 or f64)
            world.wait(world.irecv(buf, k, TAG_SLICE), k, f"rank {k}'s parameters of {what}")
            pos = 0
            for node_id, a, b in self.pieces[k]:
                self.tape.values[node_id].reshape(-1)[a:b] = buf[pos:pos + b - a]
                pos += b - a
        for request, peer in sends:
            world.wait(request, peer, f"delivering {what}'s parameters")

    def _pack(self, k: int) -> np.ndarray:
        parts = [self.tape.values[node_id].reshape(-1)[a:b] for node_id, a, b in self.pieces[k]]
        return np.concatenate(parts) if parts else np.empty(0, self._dtype(k))

    def _dtype(self, k: int):
        """The float type of rank ``k``'s slice: its params' (one per tape)."""
        return (self.tape.values[self.pieces[k][0][0]].dtype if self.pieces[k]
                else np.dtype(np.float64))

    def gather_state(self, world, what: str) -> None:
        """Rank 0 rebuilds the full optimizer state (for ``state_dict``) from every
        rank's slices; the other ranks keep their slices."""
        parts = world.gather_obj([{s: a.tobytes() for s, a in st.items()} for st in self.state],
                                 TAG_STATE, what)
        if parts is None:
            return
        for node_id in self.sharded:
            e = self._entries[node_id]
            shape = self.tape.values[node_id].shape
            e.state = {s: np.empty(shape, self.tape.values[node_id].dtype)
                       for s in self.opt.slots}
        for k, states in enumerate(parts):
            for (node_id, a, b), st in zip(self.pieces[k], states):
                for s, data in st.items():
                    target = self._entries[node_id].state[s]      # the param's dtype
                    target.reshape(-1)[a:b] = np.frombuffer(data, dtype=target.dtype)


__all__ = ["DataParallel", "Zero1", "MpiWorld", "SingleWorld", "mpi_world", "start", "supervise",
           "launcher_rank", "DistributedError", "StartRefused", "RankFailure", "HEAD",
           "CHUNK", "DEFAULT_TIMEOUT"]
