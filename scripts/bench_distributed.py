"""Data-parallel training over MPI: steps per second on 1 and 2 ranks, and the bytes sent.

    python scripts/bench_distributed.py [--steps 300] [--shards 2]

Two workloads, Adam, ``--shards S`` (default 2), one thread per rank
(OMP/OpenBLAS/MKL threads = 1):

* the digits sample, 64-64-10 (``samples/digits_mlp.msgpack``), 32 rows per shard,
  on its 1,477 training images (no validation: only steps are timed);
* the 784-256-10 relu MLP of bench_train.py, 64 rows per shard (a minibatch of 128 with
  S = 2), on 4,096 synthetic examples.

For W = 1 (one process running all S shards, no MPI) and W = 2 (``mpiexec -n 2``, S/2
shards each): steps per second (1 / the median step time seen on rank 0, after a
warm-up), the scaling efficiency (steps/s at W = 2 over twice the steps/s at W = 1),
the bytes each rank handed MPI per step (counted by ``MpiWorld.bytes_sent``), and
whether both runs saved byte-identical files.  Side by side, when torch is installed:
PyTorch DDP (gloo over loopback, float64, ``torch.optim.Adam``) on an MLP of the same
shapes with an MSE loss and the same minibatch, 1 and 2 processes of 1 thread each.
One run of each; the machine's load moves the figures.  Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WARMUP = 20
ONE_THREAD = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def _env():
    env = dict(os.environ, **ONE_THREAD)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _mpiexec():
    import shutil
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


# ── the workloads (files in a temporary folder) ────────────────────────────

def make_workloads(folder: Path) -> dict:
    """{name: (tape path, data path, rows per shard, (n_in, n_hidden, n_out))}"""
    from gradtool.npzio import write_npz
    from gradtool.tape import Tape
    from gradtool.tapefile import save

    digits = np.load(ROOT / "samples" / "digits.npz")
    write_npz(folder / "digits.npz", {"x": digits["x"], "y": digits["y"]})
    rng = np.random.default_rng(0)
    n_in, n_hid, n_out, rows = 784, 256, 10, 64
    xs = rng.standard_normal((4096, n_in))
    ys = np.eye(n_out)[rng.integers(0, n_out, 4096)]
    write_npz(folder / "mlp784.npz", {"x": xs, "y": ys})
    tp = Tape()
    x = tp.const(xs[:rows], name="x")
    y = tp.const(ys[:rows], name="y")
    w1 = tp.param(rng.standard_normal((n_in, n_hid)) * np.sqrt(2.0 / n_in), name="w1")
    b1 = tp.param(np.zeros((1, n_hid)), name="b1")
    w2 = tp.param(rng.standard_normal((n_hid, n_out)) * np.sqrt(1.0 / n_hid), name="w2")
    b2 = tp.param(np.zeros((1, n_out)), name="b2")
    loss = tp.mse(tp.relu(x @ w1 + b1) @ w2 + b2, y)
    save(tp, folder / "mlp784.msgpack", loss=loss,
         meta={"train": {"optimizer": "adam", "lr": 1e-3}})
    return {"digits 64-64-10": (ROOT / "samples" / "digits_mlp.msgpack", folder / "digits.npz",
                                32, (64, 64, 10)),
            "MLP 784-256-10": (folder / "mlp784.msgpack", folder / "mlp784.npz", rows,
                               (n_in, n_hid, n_out))}


# ── one gradtool run (a process, or a rank of mpiexec) ─────────────────────

def worker(tape: str, data: str, shards: int, steps: int, out: str) -> None:
    from gradtool.tapefile import load
    from gradtool.train import Reporter, TrainOptions, Trainer
    from gradtool.train.distributed import mpi_world, start

    stamps = []

    class Clock(Reporter):
        def step(self, record):
            stamps.append(time.perf_counter())

    world = mpi_world()
    options = TrainOptions(shards=shards, steps=WARMUP + steps, epochs=100000,
                           save=out)                 # only rank 0 writes it
    trainer = start(world, lambda: Trainer(load(tape), data, options, [Clock()], world=world))
    sent0 = world.bytes_sent
    trainer.run()
    per_step = (world.bytes_sent - sent0) / (WARMUP + steps)
    sent = world.gather_obj(per_step, 99, "the byte counts")
    world.finish()
    if world.rank == 0:
        gaps = np.diff(stamps[WARMUP - 1:])
        print(json.dumps({"step_s": statistics.median(gaps), "bytes": sent,
                          "params": trainer.parallel.params}))


def run_gradtool(tape, data, shards, steps, ranks, out) -> dict:
    args = [sys.executable, __file__, "--worker", str(tape), str(data), str(shards), str(steps),
            str(out)]
    if ranks > 1:
        args = [_mpiexec(), "-n", str(ranks)] + args
    p = subprocess.run(args, capture_output=True, text=True, env=_env())
    if p.returncode != 0:
        raise SystemExit(f"bench_distributed: {' '.join(args)} failed:\n{p.stderr}")
    return json.loads(p.stdout.splitlines()[-1])


# ── PyTorch DDP, the same shapes (MSE), for comparison ─────────────────────

def torch_worker(rank: int, world: int, port: int, shape, rows: int, steps: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    n_in, n_hid, n_out = shape
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(n_in, n_hid), torch.nn.ReLU(),
                                torch.nn.Linear(n_hid, n_out)).double()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    local = rows * 2 // world                # the same minibatch as gradtool's S = 2
    xs = torch.randn(8, local, n_in, dtype=torch.float64, generator=gen)
    ys = torch.randn(8, local, n_out, dtype=torch.float64, generator=gen)
    stamps = []
    for i in range(WARMUP + steps):
        opt.zero_grad()
        loss = torch.mean((ddp(xs[i % 8]) - ys[i % 8]) ** 2)
        loss.backward()
        opt.step()
        stamps.append(time.perf_counter())
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"step_s": statistics.median(np.diff(stamps[WARMUP - 1:]))}))


def run_torch(shape, rows, steps, ranks):
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--torch-worker", str(r), str(ranks),
                               str(port), ",".join(map(str, shape)), str(rows), str(steps)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env()) for r in range(ranks)]
    outs = [p.communicate() for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"bench_distributed: PyTorch DDP failed:\n{outs}")
    return json.loads(outs[0][0].splitlines()[-1])


# ── the table ──────────────────────────────────────────────────────────────

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300, help="timed steps per run")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--worker", nargs=5, metavar=("TAPE", "DATA", "S", "STEPS", "OUT"))
    ap.add_argument("--torch-worker", nargs=6,
                    metavar=("RANK", "W", "PORT", "SHAPE", "ROWS", "STEPS"))
    args = ap.parse_args(argv)
    if args.worker:
        tape, data, shards, steps, out = args.worker
        return worker(tape, data, int(shards), int(steps), out)
    if args.torch_worker:
        r, w, port, shape, rows, steps = args.torch_worker
        return torch_worker(int(r), int(w), int(port), tuple(map(int, shape.split(","))),
                            int(rows), int(steps))
    if _mpiexec() is None:
        raise SystemExit("bench_distributed: no mpiexec (pip install -e '.[mpi]')")
    from mpi4py import __version__ as mpi4py_version
    print(f"# {os.cpu_count()} cores, numpy {np.__version__}, mpi4py {mpi4py_version}, "
          f"1 thread per rank, --shards {args.shards}, {args.steps} timed steps after "
          f"{WARMUP}; one run each")
    print(f"{'workload':<17} {'rows/step':>9} {'P':>7} {'W=1 steps/s':>12} "
          f"{'W=2 steps/s':>12} {'efficiency':>10} {'bytes/step/rank (W=2)':>22} "
          f"{'same file':>9} {'DDP W=1':>8} {'DDP W=2':>8} {'DDP eff.':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, (tape, data, rows, shape) in make_workloads(folder).items():
            one = run_gradtool(tape, data, args.shards, args.steps, 1, folder / "w1.msgpack")
            two = run_gradtool(tape, data, args.shards, args.steps, 2, folder / "w2.msgpack")
            same = (folder / "w1.msgpack").read_bytes() == (folder / "w2.msgpack").read_bytes()
            s1, s2 = 1 / one["step_s"], 1 / two["step_s"]
            sent = " / ".join(f"{b:,.0f}" for b in two["bytes"])
            cols = [f"{s1:12.1f}", f"{s2:12.1f}", f"{s2 / (2 * s1):10.2f}", f"{sent:>22}",
                    f"{'yes' if same else 'NO':>9}"]
            t1 = run_torch(shape, rows, args.steps, 1)
            if t1 is not None:
                t2 = run_torch(shape, rows, args.steps, 2)
                d1, d2 = 1 / t1["step_s"], 1 / t2["step_s"]
                cols += [f"{d1:8.1f}", f"{d2:8.1f}", f"{d2 / (2 * d1):8.2f}"]
            print(f"{name:<17} {rows * args.shards:>9} {one['params']:>7} " + " ".join(cols))
    print("# bytes/step/rank: what ranks 0 / 1 handed MPI per step; the formula is "
          "8 x (P + 4) per chain a rank sends on (docs/training.md)")


if __name__ == "__main__":
    main()
