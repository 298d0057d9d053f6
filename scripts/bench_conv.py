"""LeNet-sized training steps through gradtool (cpu, host) next to PyTorch float64, and the
conv2d products' GFLOP/s next to the matmul kernel's.

    python scripts/bench_conv.py [--steps 10] [--repeats 5] [--torch-threads N] [--json F]

The workload: batch 64 of 1x28x28 inputs (normal noise, 10 classes), conv 6@5x5 + bias,
relu, max_pool 2, conv 16@5x5 + bias, relu, max_pool 2, reshape [64, 256], linear
256-120 + relu, linear 120-10, mean cross-entropy (log_softmax, take_along); one step =
forward + backward + Adam (lr 1e-3).  The same init and data in every row:

  cpu            gradtool.train.CpuEngine (the numpy reference: im2col + the compiled
                 matmul kernel, numerics.conv2d)
  host           the device engine's host backend (kernels.cu compiled by cc)
  torch          PyTorch float64 eager on the CPU, torch.optim.Adam(foreach), all cores
                 (torch.get_num_threads(), or --torch-threads)

Per row: the median and best seconds per step (interleaved runs, so all rows see the
same machine load), and the ratio to torch (below 1: faster).  The cpu and host rows
must end on the same parameter bits (checked; exit 1 if not).

Then the products alone: conv2d's three products of the first conv layer (forward,
weight gradient, input-gradient columns) as numerics.bmm calls on the im2col columns,
and one square matmul of about the same multiply-adds, in GFLOP/s (2 flops per
multiply-add).  A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np

from bench_common import ROOT, time_interleaved  # noqa: F401  (puts the repo on sys.path)

import gradtool as gt  # noqa: E402
from gradtool import nn  # noqa: E402
from gradtool import numerics as nx  # noqa: E402
from gradtool.optim import Adam  # noqa: E402
from gradtool.train import make_engine  # noqa: E402

BATCH, POOL, LR = 64, 4, 1e-3


def make_problem():
    rng = np.random.default_rng(0)

    def he(shape, fan_in):
        return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
    params = [he((6, 1, 5, 5), 25), np.zeros(6), he((16, 6, 5, 5), 150), np.zeros(16),
              he((256, 120), 256), np.zeros((1, 120)), he((120, 10), 120), np.zeros((1, 10))]
    xs = rng.standard_normal((POOL, BATCH, 1, 28, 28))
    ys = rng.integers(0, 10, (POOL, BATCH, 1))
    return params, xs, ys


def gradtool_lenet(params, xs, ys):
    tp = gt.Tape()
    x = tp.const(xs[0], name="x")
    y = tp.const(ys[0], name="y", dtype="i64")
    k1, c1, k2, c2, w1, b1, w2, b2 = ps = [tp.param(p) for p in params]
    h = nn.max_pool2d(tp.relu(nn.conv2d(x, k1, c1)), 2)
    h = nn.max_pool2d(tp.relu(nn.conv2d(h, k2, c2)), 2)
    h = tp.relu(nn.linear(tp.reshape(h, [BATCH, 256]), w1, b1))
    loss = nn.softmax_cross_entropy(nn.linear(h, w2, b2), y)
    opt = Adam(LR)
    for p in ps:
        opt.add(tp, p)
    return tp, x, y, loss, opt, ps


def torch_lenet(torch, params):
    F = torch.nn.functional
    ws = [torch.tensor(p, requires_grad=True) for p in params]
    opt = torch.optim.Adam(ws, lr=LR)

    def step(x, y):
        k1, c1, k2, c2, w1, b1, w2, b2 = ws
        h = F.max_pool2d(F.relu(F.conv2d(x, k1, c1)), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, k2, c2)), 2)
        h = F.relu(h.reshape(BATCH, 256) @ w1 + b1)
        loss = F.cross_entropy(h @ w2 + b2, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def gflops(fn, madds, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 2.0 * madds / statistics.median(times) / 1e9


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="steps per timed run")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per row")
    ap.add_argument("--torch-threads", type=int, default=None, help="torch threads")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)

    params, xs, ys = make_problem()
    rows, engines = {}, {}
    for backend in ("cpu", "host"):
        tp, x, y, loss, opt, ps = gradtool_lenet(params, xs, ys)
        eng = make_engine(backend, tp, loss.id, opt)
        engines[backend] = (eng, tp, x, y, ps)

    def gt_step(backend):
        eng, tp, x, y, _ = engines[backend]

        def step(i):
            eng.set_input(x.id, xs[i % POOL])
            eng.set_input(y.id, ys[i % POOL])
            eng.train_step()
        return step
    steps = [gt_step("cpu"), gt_step("host")]
    names = ["cpu", "host"]
    try:
        import torch
        if args.torch_threads:
            torch.set_num_threads(args.torch_threads)
        tstep = torch_lenet(torch, params)
        txs = [torch.tensor(v) for v in xs]
        tys = [torch.tensor(v[:, 0]) for v in ys]
        steps.append(lambda i: tstep(txs[i % POOL], tys[i % POOL]))
        names.append("torch")
    except ImportError:
        torch = None
    timed = time_interleaved(steps, args.steps, args.repeats)
    for name, (med, best) in zip(names, timed):
        rows[name] = {"median_s": med, "best_s": best}
    base = rows.get("torch", {}).get("median_s")
    for eng, _tp, _x, _y, _ps in engines.values():
        eng.finish()
    same = all(np.array_equal(engines["cpu"][1].value(a), engines["host"][1].value(b))
               for a, b in zip(engines["cpu"][4], engines["host"][4]))

    print(f"LeNet step (batch {BATCH}, forward + backward + Adam), {cpu_name()}, "
          f"{nx.matmul_config()['threads']} gradtool threads"
          + (f", torch {torch.get_num_threads()} threads" if torch else ""))
    for name, r in rows.items():
        ratio = f"{r['median_s'] / base:5.2f}x torch" if base else ""
        print(f"  {name:<6} median {r['median_s'] * 1e3:8.2f} ms  best {r['best_s'] * 1e3:8.2f} "
              f"ms  {ratio}")
        r["ratio"] = r["median_s"] / base if base else None
    print(f"  cpu and host end on the same parameter bits: {same}")

    # the products alone: conv1's three products, then a square matmul of similar size
    rng = np.random.default_rng(1)
    x = rng.standard_normal((BATCH, 1, 28, 28))
    w = rng.standard_normal((6, 1, 5, 5))
    cols = nx.im2col(x, (5, 5), (1, 1), (0, 0), (1, 1), 1)            # [1, 25, 36864]
    wg = w.reshape(1, 6, 25)
    g = rng.standard_normal((1, 6, cols.shape[2]))
    madds = 6 * 25 * cols.shape[2]
    prod = {
        "conv1 forward  [6,25]@[25,36864]": gflops(lambda: nx.bmm(wg, cols), madds, 9),
        "conv1 dW  [6,36864]@[36864,25]": gflops(
            lambda: nx.bmm(g, cols.transpose(0, 2, 1)), madds, 9),
        "conv1 dcols  [25,6]@[6,36864]": gflops(
            lambda: nx.bmm(wg.transpose(0, 2, 1), g), madds, 9),
    }
    x2 = rng.standard_normal((BATCH, 6, 12, 12))
    cols2 = nx.im2col(x2, (5, 5), (1, 1), (0, 0), (1, 1), 1)          # [1, 150, 4096]
    w2 = rng.standard_normal((1, 16, 150))
    prod["conv2 forward  [16,150]@[150,4096]"] = gflops(
        lambda: nx.bmm(w2, cols2), 16 * 150 * 4096, 9)
    n = int(round(madds ** (1 / 3)))
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    prod[f"matmul  [{n},{n}]@[{n},{n}]"] = gflops(lambda: nx.matmul(a, b), n ** 3, 9)
    im2col_s = statistics.median(
        [(lambda t0: (nx.im2col(x, (5, 5), (1, 1), (0, 0), (1, 1), 1),
                      time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(5)])
    print("products (numerics.bmm / matmul, the compiled kernel), GFLOP/s:")
    for k, v in prod.items():
        print(f"  {k:<40} {v:6.2f}")
    print(f"  conv1 im2col (numpy copies): {im2col_s * 1e3:.2f} ms")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"cpu": cpu_name(), "rows": rows, "same_bits": same,
                       "gflops": prod, "im2col_ms": im2col_s * 1e3}, fh, indent=2)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
