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
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gradtool.optim import Adam        # noqa: E402
from gradtool.tape import Tape         # noqa: E402
from gradtool.train import make_engine  # noqa: E402

SHAPES = [(64, 128, 10, 64), (784, 256, 10, 128)]
POOL = 8                               # distinct minibatches cycled through


def make_data(n_in, n_out, batch, rng):
    xs = rng.standard_normal((POOL, batch, n_in))
    ys = np.eye(n_out)[rng.integers(0, n_out, (POOL, batch))]
    return xs, ys


def init_params(n_in, n_hid, n_out, rng):
    return [rng.standard_normal((n_in, n_hid)) * np.sqrt(2.0 / n_in), np.zeros((1, n_hid)),
            rng.standard_normal((n_hid, n_out)) * np.sqrt(1.0 / n_hid), np.zeros((1, n_out))]


def time_pair(steps, n_steps, repeats, warmup=5):
    """Interleaved timing of each ``step(i)`` function: per function (median, best) s/step."""
    for step in steps:
        for i in range(warmup):
            step(i)
    runs = [[] for _ in steps]
    for _ in range(repeats):
        for step, out in zip(steps, runs):
            t0 = time.perf_counter()
            for i in range(n_steps):
                step(i)
            out.append((time.perf_counter() - t0) / n_steps)
    return [(statistics.median(r), min(r)) for r in runs]


def gradtool_step(shape, params, data, backend):
    n_in, n_hid, n_out, batch = shape
    xs, ys = data
    tp = Tape()
    x = tp.const(xs[0], name="x")
    y = tp.const(ys[0], name="y")
    w1, b1, w2, b2 = (tp.param(p) for p in params)
    loss = tp.mse(tp.relu(x @ w1 + b1) @ w2 + b2, y)
    opt = Adam(1e-3)
    for p in (w1, b1, w2, b2):
        opt.add(tp, p)
    engine = make_engine(backend, tp, loss.id, opt)

    def step(i):
        engine.set_input(x.id, xs[i % POOL])
        engine.set_input(y.id, ys[i % POOL])
        engine.train_step()

    return step


def torch_step(params, data):
    try:
        import torch
    except ImportError:
        return None
    xs, ys = (torch.from_numpy(a) for a in data)
    w1, b1, w2, b2 = (torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in params)
    opt = torch.optim.Adam([w1, b1, w2, b2], lr=1e-3)

    def step(i):
        x, y = xs[i % POOL], ys[i % POOL]
        opt.zero_grad()
        loss = torch.mean((torch.relu(x @ w1 + b1) @ w2 + b2 - y) ** 2)
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
        rng = np.random.default_rng(0)
        params = init_params(shape[0], shape[1], shape[2], rng)
        data = make_data(shape[0], shape[2], shape[3], rng)
        steps = [gradtool_step(shape, params, data, args.backend)]
        theirs = torch_step(params, data)
        if theirs is not None:
            steps.append(theirs)
        timings = time_pair(steps, args.steps, args.repeats)
        name = "-".join(str(d) for d in shape[:3])
        cols = [f"{med * 1e6:9.0f} ({best * 1e6:6.0f})" for med, best in timings]
        if len(timings) == 2:
            (m0, b0), (m1, b1) = timings
            cols.append(f"{m0 / m1:5.2f} ({b0 / b1:5.2f})")
        else:
            cols += [f"{'-':>20}", f"{'-':>13}"]
        print(f"{name:<12} {shape[3]:>5} {cols[0]:>20} {cols[1]:>20} {cols[2]:>13}")


if __name__ == "__main__":
    main()
