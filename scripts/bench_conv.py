"""LeNet-sized training steps through gradtool (cpu, host) next to PyTorch float64, and the
conv2d products' GFLOP/s next to the matmul kernel's.

    python scripts/bench_conv.py [--steps 10] [--repeats 5] [--torch-threads N] [--json F]

The workload: batch 64 of 1x28x28 inputs (normal noise, 10 classes), conv 6@5x5 + bias,
relu, max_pool 2, conv 16@5x5 + bias, relu, max_pool 2, reshape [64, 256], linear
256-120 + relu, linear 120-10, mean cross-entropy (log_softmax, take_along); one step =
forward + backward + Adam (lr 1e-3).  The same init and data in every row:

  cpu            gradtool.train.CpuEngine (the numpy reference; conv2d and max_pool2d
                 compiled, csrc/gt_conv.h: numerics.conv2d)
  host           the device engine's host backend (kernels.cu compiled by cc)
  torch          PyTorch float64 eager on the CPU, torch.optim.Adam(foreach), all cores
                 (torch.get_num_threads(), or --torch-threads)

Per row: the median and best seconds per step (interleaved runs, so all rows see the
same machine load), and the ratio to torch (below 1: faster).  The cpu and host rows
must end on the same parameter bits (checked; exit 1 if not).

Then the products alone, in GFLOP/s (2 flops per multiply-add): each conv layer's
products as the step runs them (numerics.conv2d / conv2d_backward, csrc/gt_conv.h:
sample by sample, im2col copies included), the same as whole-batch im2col + numerics.bmm
(conv2d_numpy, conv2d_backward_numpy), the per-sample matmul shapes alone, and a square
matmul.  A benchmark, not a test: nothing here asserts a time.
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

    # the products alone, as the step runs them (numerics.conv2d and conv2d_backward:
    # csrc/gt_conv.h, sample by sample, the im2col copies included), then the same
    # products as whole-batch im2col + numerics.bmm, and plain matmuls for scale
    rng = np.random.default_rng(1)
    geo = dict(stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1)
    layers = {"conv1": ((BATCH, 1, 28, 28), (6, 1, 5, 5)), "conv2": ((BATCH, 6, 12, 12),
                                                                     (16, 6, 5, 5))}
    prod = {}
    for name, (xs_, ws_) in layers.items():
        x, w = rng.standard_normal(xs_), rng.standard_normal(ws_)
        g = rng.standard_normal(nx.conv2d(x, w, **geo).shape)
        kg, p = ws_[1] * ws_[2] * ws_[3], g.shape[2] * g.shape[3]
        madds = BATCH * ws_[0] * kg * p
        shape = f"[{ws_[0]},{kg}]@[{kg},{BATCH}x{p}]"
        prod[f"{name} forward {shape}"] = gflops(lambda: nx.conv2d(x, w, **geo), madds, 9)
        prod[f"{name} weight gradient"] = gflops(
            lambda: nx.conv2d_backward(g, x, w, **geo, need_x=False, need_w=True), madds, 9)
        if name == "conv2":
            prod[f"{name} input gradient"] = gflops(
                lambda: nx.conv2d_backward(g, x, w, **geo, need_x=True, need_w=False), madds, 9)
        prod[f"{name} forward, whole-batch im2col + bmm"] = gflops(
            lambda: nx.conv2d_numpy(x, w, **geo), madds, 9)
        prod[f"{name} weight gradient, whole-batch"] = gflops(
            lambda: nx.conv2d_backward_numpy(g, x, w, **geo, need_x=False, need_w=True),
            madds, 9)
    a1, b1 = rng.standard_normal((6, 25)), rng.standard_normal((25, 576))
    prod["matmul [6,25]@[25,576] (conv1's per-sample product)"] = gflops(
        lambda: nx.matmul(a1, b1), 6 * 25 * 576, 9)
    a2, b2 = rng.standard_normal((16, 150)), rng.standard_normal((150, 64))
    prod["matmul [16,150]@[150,64] (conv2's per-sample product)"] = gflops(
        lambda: nx.matmul(a2, b2), 16 * 150 * 64, 9)
    n = 211                                       # about conv2's multiply-adds
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    prod[f"matmul [{n},{n}]@[{n},{n}]"] = gflops(lambda: nx.matmul(a, b), n ** 3, 9)
    print("products (compiled; GFLOP/s, 2 flops per multiply-add, median of 9):")
    for k, v in prod.items():
        print(f"  {k:<54} {v:6.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"cpu": cpu_name(), "rows": rows, "same_bits": same,
                       "gflops": prod}, fh, indent=2)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
