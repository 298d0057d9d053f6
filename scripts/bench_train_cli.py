"""Training through `gradtool train --json`, as users run it, next to PyTorch float64 eager.

    python scripts/bench_train_cli.py [--repeats 5] [--epochs 25] [--backends cpu,host]
                                      [--torch-threads N]

The MLPs of scripts/bench_train.py (relu hidden layer, MSE on one-hot
targets, Adam lr 1e-3; 64-128-10 at batch 64 and 784-256-10 at batch 128)
are written to a temporary tape file and an .npz of 8 minibatches, and
trained for ``--epochs`` epochs (file order, no validation) by

    gradtool train TAPE --data DATA.npz --backend B --epochs E --no-shuffle --json

in a fresh process; the figure is the run's own ``seconds`` (the training
loop: filling the input slots, the engine's steps, the loop's bookkeeping;
not start-up or loading) divided by its ``steps``.  PyTorch runs the same
steps on the same minibatches in this process (torch.optim.Adam, eager).
Runs are interleaved (each backend, then PyTorch, ``--repeats`` times) and the
median is shown.  A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (LR, POOL, ROOT, SHAPES, gradtool_mlp, make_problem,  # noqa: E402
                          mlp_name, torch_mlp_loss)

from gradtool.tapefile import save  # noqa: E402


def write_problem(shape, folder: Path):
    """The MLP's tape file and its data (POOL minibatches in order)."""
    params, xs, ys = make_problem(shape)
    tp, x, y, loss, _ = gradtool_mlp(params, xs, ys)
    tape = folder / f"mlp_{mlp_name(shape)}.msgpack"
    data = folder / f"mlp_{mlp_name(shape)}.npz"
    save(tp, str(tape), loss=loss)
    np.savez(data, x=xs.reshape(-1, shape[0]), y=ys.reshape(-1, shape[2]))
    return tape, data, (params, xs, ys)


def gradtool_run(tape, data, backend, epochs) -> float:
    """Seconds per step of one `gradtool train --json` run."""
    cmd = [sys.executable, "-c", "from gradtool.cli import main; main()", "train", str(tape),
           "--data", str(data), "--backend", backend, "--epochs", str(epochs), "--no-shuffle",
           "--optimizer", "adam", "--lr", str(LR), "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"bench_train_cli: {' '.join(cmd[3:])} failed: {proc.stderr.strip()}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return summary["seconds"] / summary["steps"]


def torch_run(problem, epochs) -> float:
    import torch
    params, xs, ys = problem
    ws = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in params]
    opt = torch.optim.Adam(ws, lr=LR)
    bx, by = torch.from_numpy(xs), torch.from_numpy(ys)
    t0 = time.perf_counter()
    for _ in range(epochs):
        for i in range(POOL):
            opt.zero_grad()
            loss = torch_mlp_loss(torch, ws, bx[i], by[i])
            loss.backward()
            opt.step()
            loss.item()
    return (time.perf_counter() - t0) / (epochs * POOL)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=25)
    ap.add_argument("--backends", default="cpu,host")
    ap.add_argument("--torch-threads", type=int, help="torch.set_num_threads (default: torch's)")
    args = ap.parse_args(argv)
    backends = args.backends.split(",")
    try:
        import torch
        if args.torch_threads:
            torch.set_num_threads(args.torch_threads)
        torch_note = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    except ImportError:
        torch, torch_note = None, "torch not installed: its column is skipped"
    threads = os.environ.get("GRADTOOL_NUM_THREADS", "default (usable cores)")
    print(f"# {os.cpu_count()} cores, GRADTOOL_NUM_THREADS {threads}, {torch_note}; "
          f"{args.epochs} epochs x {POOL} steps per run, median of {args.repeats} runs, "
          f"interleaved; us/step from `gradtool train --json` seconds / steps")
    print(f"{'MLP':<12} {'batch':>5} {'backend':>8} {'gradtool':>10} {'torch':>10} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in SHAPES:
            tape, data, problem = write_problem(shape, Path(tmp))
            runs = {b: [] for b in backends}
            theirs = []
            for _ in range(args.repeats):
                for b in backends:
                    runs[b].append(gradtool_run(tape, data, b, args.epochs))
                if torch is not None:
                    theirs.append(torch_run(problem, args.epochs))
            ref = statistics.median(theirs) if theirs else None
            for b in backends:
                mine = statistics.median(runs[b])
                ratio = f"{mine / ref:7.2f}" if ref else f"{'-':>7}"
                ref_col = f"{ref * 1e6:10.0f}" if ref else f"{'-':>10}"
                print(f"{mlp_name(shape):<12} {shape[3]:>5} {b:>8} {mine * 1e6:10.0f} "
                      f"{ref_col} {ratio}")


if __name__ == "__main__":
    main()
