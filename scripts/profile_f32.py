"""Where a float32 training step's time goes: per kernel (host) and per op (cpu).

    python scripts/profile_f32.py [--workload resnet] [--engines host,cpu] [--steps 5]
                                  [--threads 2] [--top 25] [--launches 0]

Builds bench_f32.py's ResNet-style CNN (or its 784-256-10 MLP: ``--workload mlp``),
imports it at f32, and times one step's pieces:

  host  every launch of the episode run on its own (``gt_run`` over one launch, in
        table order, so the arena sees exactly the episode's sequence), summed per
        kernel name and phase (forward, backward, optimizer), median over ``--steps``
        steps after one warm-up step; the conv products are k_matmul_conv2d (forward),
        _dx and _dw, batch norm's row sums k_sum, ...
  cpu   the numpy reference engine's forward and backward rules per op name (the tape's
        op table wrapped by timers for the profile), and the optimizer step as a whole.

The sum of the pieces is printed beside an untouched step's time (the difference is
the per-call overhead the piecewise run adds, or the Python between the pieces).
A benchmark tool, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_f32  # noqa: E402
from bench_f32 import RESNET_LR, tape_step  # noqa: E402

from gradtool import native  # noqa: E402
from gradtool.device.program import PHASES  # noqa: E402


def resnet_problem():
    import torch
    _, raw, names, batches = bench_f32.resnet_problem(torch)
    return lambda engine: tape_step(raw, names, batches, RESNET_LR, engine)


def mlp_problem():
    from bench_common import SHAPES, make_problem
    params, xs, ys = make_problem(max(SHAPES, key=lambda s: s[0]))
    params = [p.astype(np.float32) for p in params]
    xs, ys = xs.astype(np.float32), ys.astype(np.float32)
    return lambda engine: bench_f32.mlp_step(params, xs, ys, engine)


def median_step(step, steps) -> float:
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profile_host(step, steps) -> tuple:
    """{(phase, kernel): median seconds per step}, the untouched step's median."""
    replay = step.engine.replay
    dev, prog = replay.dev, replay.program
    kernels = [(ph, la.kernel) for ph in PHASES for la in prog.launches[ph]]
    if len(kernels) * 2 != len(dev.table):
        raise SystemExit("profile_f32: the launch table does not match the program "
                         "(a fused program? profile without --fuse)")
    whole = median_step(step, steps + 1)
    per, each = defaultdict(list), defaultdict(list)
    for i in range(steps + 1):
        for node_id, value in zip(step.slots, step.batches[i % len(step.batches)]):
            step.engine.set_input(node_id, value)
        before = replay._prepare_step()
        acc = defaultdict(float)
        for q, key in enumerate(kernels):
            t0 = time.perf_counter()
            dev._run(*dev._ptrs, q, q + 1)
            dt = time.perf_counter() - t0
            acc[key] += dt
            if i:
                each[q].append(dt)
        replay._settle_step(before)
        if i:                                       # the first is the warm-up
            for key, t in acc.items():
                per[key].append(t)
    flat = [la for ph in PHASES for la in prog.launches[ph]]
    slowest = sorted(((statistics.median(v), q) for q, v in each.items()), reverse=True)
    launches = [(t, kernels[q][0], flat[q]) for t, q in slowest]
    return {key: statistics.median(v) for key, v in per.items()}, whole, launches


class _Timed:
    """An op spec whose forward and backward add their time to ``acc``."""

    def __init__(self, spec, acc):
        self._spec, self._acc = spec, acc

    def __getattr__(self, name):
        return getattr(self._spec, name)

    def forward(self, *args):
        t0 = time.perf_counter()
        out = self._spec.forward(*args)
        self._acc["forward", self._spec.name] += time.perf_counter() - t0
        return out

    def backward(self, *args):
        t0 = time.perf_counter()
        out = self._spec.backward(*args)
        self._acc["backward", self._spec.name] += time.perf_counter() - t0
        return out


def profile_cpu(step, steps) -> tuple:
    import gradtool.tape as tape_mod
    whole = median_step(step, steps + 1)
    original = tape_mod.OPS
    per = defaultdict(list)
    try:
        for i in range(steps + 1):
            acc = defaultdict(float)
            tape_mod.OPS = {k: _Timed(v, acc) for k, v in original.items()}
            eng = step.engine
            for node_id, value in zip(step.slots, step.batches[i % len(step.batches)]):
                eng.set_input(node_id, value)
            t0 = time.perf_counter()
            loss = eng.forward_backward()
            t1 = time.perf_counter()
            if np.isfinite(loss):
                eng.optimizer.step(eng.tape)
            acc["optimizer", "step"] += time.perf_counter() - t1
            spent = sum(t for (ph, _), t in acc.items() if ph != "optimizer")
            acc["(walk)", "tape overhead"] += (t1 - t0) - spent
            if i:
                for key, t in acc.items():
                    per[key].append(t)
    finally:
        tape_mod.OPS = original
    return {key: statistics.median(v) for key, v in per.items()}, whole, []


def report(name, table, whole, top, launches=(), nlaunch=0) -> None:
    total = sum(table.values())
    print(f"\n{name}: step {whole * 1e3:.2f} ms untouched, pieces sum {total * 1e3:.2f} ms")
    rows = sorted(table.items(), key=lambda kv: -kv[1])
    for (phase, kernel), t in rows[:top]:
        print(f"  {phase:10s} {kernel:28s} {t * 1e3:8.3f} ms  {100 * t / total:5.1f}%")
    if len(rows) > top:
        rest = sum(t for _, t in rows[top:])
        print(f"  {'':10s} {'(the rest)':28s} {rest * 1e3:8.3f} ms  {100 * rest / total:5.1f}%")
    if launches and nlaunch:
        print(f"  the {nlaunch} slowest launches:")
        for t, phase, la in launches[:nlaunch]:
            print(f"    {t * 1e3:7.3f} ms  {phase:9s} {la.kernel:22s} node {la.node:4d} "
                  f"indices {la.work:8d}  {la.what}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=("resnet", "mlp"), default="resnet")
    ap.add_argument("--engines", default="host,cpu")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--launches", type=int, default=0,
                    help="host: also list this many of the slowest single launches")
    args = ap.parse_args(argv)
    native.set_num_threads(args.threads)
    make = resnet_problem() if args.workload == "resnet" else mlp_problem()
    print(f"profile_f32: {args.workload}, {args.threads} thread(s), median of {args.steps} "
          f"steps, load average {os.getloadavg()[0]:.2f}")
    for engine in args.engines.split(","):
        step = make(engine)
        table, whole, launches = (profile_host if engine != "cpu" else profile_cpu)(
            step, args.steps)
        report(engine, table, whole, args.top, launches, args.launches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
