"""Training steps per second: gradtool's CPU engine next to PyTorch float64 eager + Adam.

    python scripts/bench_train.py [--repeats 7] [--steps 50] [--backend cpu]

Two MLPs, relu hidden layer, MSE loss on one-hot targets, Adam:
64-128-10 at batch 64 and 784-256-10 at batch 128.  Each engine runs the
same graph on the same minibatches; one "step" is fill inputs + forward +
backward + optimizer update.  Figures are the median over ``--repeats`` runs
of ``--steps`` steps each (after a short warm-up), the two engines' runs
interleaved so that both see the same machine load; the best run is shown
too, as a figure less sensitive to other processes.  PyTorch is optional
(``pip install torch``): without it, its column is skipped.  This is a
benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (LR, POOL, SHAPES, gradtool_mlp, make_problem,  # noqa: E402
                          mlp_name, time_interleaved, torch_mlp_loss)

from gradtool.train import make_engine  # noqa: E402


def gradtool_step(params, xs, ys, backend):
    tp, x, y, loss, opt = gradtool_mlp(params, xs, ys)
    engine = make_engine(backend, tp, loss.id, opt)

    def step(i):
        engine.set_input(x.id, xs[i % POOL])
        engine.set_input(y.id, ys[i % POOL])
        engine.train_step()

    return step


def torch_step(params, xs, ys):
    try:
        import torch
    except ImportError:
        return None
    xs, ys = torch.from_numpy(xs), torch.from_numpy(ys)
    ws = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in params]
    opt = torch.optim.Adam(ws, lr=LR)

    def step(i):
        x, y = xs[i % POOL], ys[i % POOL]
        opt.zero_grad()
        loss = torch_mlp_loss(torch, ws, x, y)
        loss.backward()
        opt.step()

    return step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--backend", default="cpu", help="gradtool engine (cpu, host, ...)")
    ap.add_argument("--torch-threads", type=int, help="torch.set_num_threads (default: torch's)")
    args = ap.parse_args(argv)
    try:
        import torch
        if args.torch_threads:
            torch.set_num_threads(args.torch_threads)
        torch_note = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    except ImportError:
        torch_note = "torch not installed: its column is skipped"
    print(f"# {os.cpu_count()} cores, numpy {np.__version__}, {torch_note}; "
          f"{args.repeats} x {args.steps} steps, interleaved; us/step median (best)")
    print(f"{'MLP':<12} {'batch':>5} {'gradtool ' + args.backend:>20} {'torch f64 eager':>20} "
          f"{'ratio':>13}")
    for shape in SHAPES:
        params, xs, ys = make_problem(shape)
        steps = [gradtool_step(params, xs, ys, args.backend)]
        theirs = torch_step(params, xs, ys)
        if theirs is not None:
            steps.append(theirs)
        timings = time_interleaved(steps, args.steps, args.repeats)
        name = mlp_name(shape)
        cols = [f"{med * 1e6:9.0f} ({best * 1e6:6.0f})" for med, best in timings]
        if len(timings) == 2:
            (m0, b0), (m1, b1) = timings
            cols.append(f"{m0 / m1:5.2f} ({b0 / b1:5.2f})")
        else:
            cols += [f"{'-':>20}", f"{'-':>13}"]
        print(f"{name:<12} {shape[3]:>5} {cols[0]:>20} {cols[1]:>20} {cols[2]:>13}")


if __name__ == "__main__":
    main()
