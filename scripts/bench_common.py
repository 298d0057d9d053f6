"""What the benchmark scripts share: the MLP workload (gradtool tape and
PyTorch loss side by side, so that both engines run the same graph), the
interleaved step timer, and the machine's description (CPU name, load).

Imported by those scripts from their own directory (``python scripts/X.py``
from the repo root puts scripts/ first on sys.path); importing it also puts
the repo root on sys.path, so that the scripts run from a checkout.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the seed's Adam (the rule gradtool.optim.Adam was until the optimizer table, 2026-12-05;
# Adam is torch's formula since): the same update on both sides of bench_compare.sh
# against a commit from before the table (SCRIPTS=after)
try:
    from gradtool.optim import AdamSeed as Adam  # noqa: E402
except ImportError:                              # a tree from before the table
    from gradtool.optim import Adam  # noqa: E402
from gradtool.tape import Tape  # noqa: E402

# (n_in, n_hidden, n_out, batch): 64-128-10 at batch 64, 784-256-10 at batch 128
SHAPES = [(64, 128, 10, 64), (784, 256, 10, 128)]
POOL = 8                               # distinct minibatches cycled through
LR = 1e-3


def cpu_name() -> str:
    """The CPU's model name as lscpu gives it (else /proc/cpuinfo's, else platform's)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages ("1.83 2.79 3.68"), or "unknown"."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def mlp_name(shape) -> str:
    return "-".join(str(d) for d in shape[:3])


def make_problem(shape):
    """(params, xs, ys) from seed 0: He-initialised w1, Xavier-ish w2, zero
    biases; POOL minibatches of normal inputs and one-hot targets."""
    n_in, n_hid, n_out, batch = shape
    rng = np.random.default_rng(0)
    params = [rng.standard_normal((n_in, n_hid)) * np.sqrt(2.0 / n_in), np.zeros((1, n_hid)),
              rng.standard_normal((n_hid, n_out)) * np.sqrt(1.0 / n_hid), np.zeros((1, n_out))]
    xs = rng.standard_normal((POOL, batch, n_in))
    ys = np.eye(n_out)[rng.integers(0, n_out, (POOL, batch))]
    return params, xs, ys


def gradtool_mlp(params, xs, ys):
    """The MLP on a gradtool tape, first minibatch in the named input slots
    "x" and "y", its params registered with Adam(LR): (tape, x, y, loss, opt)."""
    tp = Tape()
    x = tp.const(xs[0], name="x")
    y = tp.const(ys[0], name="y")
    w1, b1, w2, b2 = (tp.param(p) for p in params)
    loss = tp.mse(tp.relu(x @ w1 + b1) @ w2 + b2, y)
    opt = Adam(LR)
    for p in (w1, b1, w2, b2):
        opt.add(tp, p)
    return tp, x, y, loss, opt


def torch_mlp_loss(torch, ws, x, y):
    """The same MLP's loss in PyTorch; ws = [w1, b1, w2, b2]."""
    w1, b1, w2, b2 = ws
    return torch.mean((torch.relu(x @ w1 + b1) @ w2 + b2 - y) ** 2)


def time_interleaved(steps, n_steps, repeats, warmup=5, sync=None):
    """Time each ``step(i)`` function, runs of ``n_steps`` steps interleaved
    (step 0's run, step 1's run, ...) ``repeats`` times, after ``warmup``
    untimed steps each, so that all see the same machine load.  ``sync``
    (e.g. torch.cuda.synchronize) is called after the warm-up and at the end
    of every run.  Returns per function (median, best) seconds per step."""
    for step in steps:
        for i in range(warmup):
            step(i)
    if sync:
        sync()
    runs = [[] for _ in steps]
    for _ in range(repeats):
        for step, out in zip(steps, runs):
            t0 = time.perf_counter()
            for i in range(n_steps):
                step(i)
            if sync:
                sync()
            out.append((time.perf_counter() - t0) / n_steps)
    return [(statistics.median(r), min(r)) for r in runs]
