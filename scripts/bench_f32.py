"""float32 training steps and products: gradtool's engines next to PyTorch float32 eager.

    python scripts/bench_f32.py [--repeats 5] [--steps 30] [--threads 2] [--json]

The MLPs of scripts/bench_train.py (relu hidden layer, MSE, Adam), every array float32:
64-128-10 at batch 64 and 784-256-10 at batch 128.  One step is fill inputs + forward +
backward + the Adam update: gradtool's engine step (what `gradtool train` runs per step)
on the CPU engine, the host backend per node and fused, against torch float32 eager with
torch.optim.Adam.  Both sides run ``--threads`` threads (GRADTOOL_NUM_THREADS /
torch.set_num_threads).  Then one large float32 product (1024 x 1024 x 1024): the compiled
fmaf-chain tiles (numerics32.matmul) against torch.matmul float32, in GFLOP/s.  Medians
over interleaved runs (bench_common.time_interleaved); the CPU is named (lscpu).  A
benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (LR, POOL, SHAPES, gradtool_mlp, make_problem,  # noqa: E402
                          mlp_name, time_interleaved, torch_mlp_loss)

import gradtool.ops  # noqa: E402,F401  (numerics' float32 twin)
from gradtool import native, numerics32  # noqa: E402
from gradtool.train import make_engine  # noqa: E402


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown CPU"


def f32_problem(shape):
    params, xs, ys = make_problem(shape)
    return ([p.astype(np.float32) for p in params], xs.astype(np.float32),
            ys.astype(np.float32))


def gradtool_step(params, xs, ys, backend, fuse=False):
    tp, x, y, loss, opt = gradtool_mlp(params, xs, ys)
    assert tp.values[loss.id].dtype == np.float32
    engine = make_engine(backend, tp, loss.id, opt, **({"fuse": True} if fuse else {}))

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
    ws = [torch.tensor(p, dtype=torch.float32, requires_grad=True) for p in params]
    opt = torch.optim.Adam(ws, lr=LR)

    def step(i):
        x, y = xs[i % POOL], ys[i % POOL]
        opt.zero_grad()
        loss = torch_mlp_loss(torch, ws, x, y)
        loss.backward()
        opt.step()

    return step


def products(repeats: int) -> dict:
    n = 1024
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    flops = 2.0 * n ** 3
    out = {}
    fns = {"gradtool f32 (fmaf chains)": lambda: numerics32.matmul(a, b)}
    try:
        import torch
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        fns["torch f32 matmul"] = lambda: torch.matmul(ta, tb)
    except ImportError:
        pass
    for name, fn in fns.items():
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[name] = flops / sorted(times)[len(times) // 2] / 1e9
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    native.set_num_threads(args.threads)
    try:
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
    rows = []
    for shape in SHAPES:
        params, xs, ys = f32_problem(shape)
        names = ["cpu", "host", "host --fuse"]
        steps = [gradtool_step(params, xs, ys, "cpu"), gradtool_step(params, xs, ys, "host"),
                 gradtool_step(params, xs, ys, "host", fuse=True)]
        ts = torch_step(params, xs, ys)
        if ts is not None:
            names.append("torch f32 eager")
            steps.append(ts)
        timed = time_interleaved(steps, args.steps, args.repeats)
        ref = timed[-1][0] if ts is not None else None
        for name, (median, best) in zip(names, timed):
            rows.append({"mlp": mlp_name(shape), "engine": name, "median_ms": median * 1e3,
                         "best_ms": best * 1e3,
                         "ratio_to_torch": (median / ref) if ref else None})
    report = {"cpu": cpu_name(), "threads": args.threads, "steps": rows,
              "products_gflops": products(args.repeats)}
    if args.json:
        print(json.dumps(report))
        return
    print(f"# {report['cpu']}, {args.threads} threads each; medians of {args.repeats} runs "
          f"of {args.steps} steps")
    print(f"{'mlp':<24} {'engine':<16} {'median ms':>10} {'best ms':>9} {'x torch f32':>12}")
    for r in rows:
        ratio = f"{r['ratio_to_torch']:.2f}x" if r["ratio_to_torch"] else "-"
        print(f"{r['mlp']:<24} {r['engine']:<16} {r['median_ms']:>10.3f} {r['best_ms']:>9.3f} "
              f"{ratio:>12}")
    for name, gf in report["products_gflops"].items():
        print(f"1024^3 product, {name}: {gf:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
