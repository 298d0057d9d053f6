#!/usr/bin/env python3
"""Benchmark: one forward + backward of a ~10,000-node scalar graph, three ways.

    python scripts/bench_emitc.py [--nodes 10000] [--seed 0] [--cc cc]

1. the CPU tape: ``tape.forward()`` + ``tape.backward(loss)`` (the replay path
   of ``gradtool backward``);
2. PyTorch eager autograd on float64 [1] tensors, if torch is importable: the
   graph is rebuilt op by op every evaluation, then ``loss.backward()``;
3. the ``gradtool emit-cuda`` function compiled by gcc
   (``-O2 -ffp-contract=off``), timed inside C over many repetitions.

Prints the per-evaluation medians and the ratios.  The emitted C's loss and
gradients are also checked bit for bit against the tape (exit 1 if not).
Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import emitc_harness as H  # noqa: E402

from gradtool.emit import emit_cuda, layout  # noqa: E402
from gradtool.emit.render import c_double  # noqa: E402


def build_graph(nodes: int, seed: int):
    """A connected random scalar graph with about ``nodes`` nodes."""
    rng = np.random.default_rng(seed)
    n_ops = int(nodes * 0.72)          # the connecting adds bring it to ~nodes
    return H.random_scalar_tape(rng, n_ops=n_ops, n_params=16, n_consts=16, connect=True)


def time_per_call(fn, min_batch_s=0.2, batches=5):
    fn()                                # warm up
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    reps = max(1, int(min_batch_s / one))
    out = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        out.append((time.perf_counter() - t0) / reps)
    return statistics.median(out)


def bench_tape(tp, loss):
    def run():
        tp.forward()
        tp.zero_grad()
        tp.backward(loss)
    with np.errstate(all="ignore"):
        return time_per_call(run)


def bench_torch(tp, loss):
    try:
        import torch
    except ImportError:
        return None, None
    torch.set_num_threads(1)
    nodes = tp.nodes
    leaves = {}
    for i, n in enumerate(nodes):
        if n.op in ("param", "const"):
            leaves[i] = torch.tensor(tp.values[i], dtype=torch.float64,
                                     requires_grad=n.op == "param")
    # one-element nodes: every reduction is the element itself, log_softmax of one
    # element is x - x
    unary = {"neg": torch.neg, "relu": torch.relu, "sigmoid": torch.sigmoid,
             "tanh": torch.tanh, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
             "abs": torch.abs, "erf": torch.erf, "sin": torch.sin, "cos": torch.cos,
             "expm1": torch.expm1, "log1p": torch.log1p, "rsqrt": lambda a: 1.0 / torch.sqrt(a),
             "to_f64": lambda a: a, "sum": lambda a: a.sum().reshape(1),
             "mean": lambda a: a.mean().reshape(1), "max": lambda a: a.max().reshape(1),
             "log_softmax": lambda a: torch.log_softmax(a, dim=-1)}
    def mask(compare):
        return lambda a, b: compare(a, b).to(torch.float64)
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
              "maximum": torch.maximum, "minimum": torch.minimum,
              "eq": mask(torch.eq), "ne": mask(torch.ne), "lt": mask(torch.lt),
              "le": mask(torch.le), "gt": mask(torch.gt), "ge": mask(torch.ge),
              "keep": lambda a, m: torch.where(m != 0, a, 0.0),
              "keep_not": lambda a, m: torch.where(m == 0, a, 0.0)}
    scalar = {"adds": lambda a, s: a + s, "muls": lambda a, s: a * s,
              "pows": lambda a, s: a ** s, "clamp_min": lambda a, s: torch.clamp(a, min=s),
              "clamp_max": lambda a, s: torch.clamp(a, max=s)}
    plan = [(i, n.op, n.a, n.b, n.s) for i, n in enumerate(nodes[:loss.id + 1]) if n.a >= 0]
    params = [leaves[p.id] for p in tp.params()]

    def run():
        vals = dict(leaves)
        for i, op, a, b, s in plan:
            if op in binary:
                vals[i] = binary[op](vals[a], vals[b])
            elif op in scalar:
                vals[i] = scalar[op](vals[a], s)
            else:
                vals[i] = unary[op](vals[a])
        for p in params:
            p.grad = None
        vals[loss.id].backward()
        return vals[loss.id]

    out = run()
    grads = [p.grad.item() if p.grad is not None else 0.0 for p in params]
    return time_per_call(run, batches=3), (out.item(), grads)


TIMING_MAIN = r"""
static double gt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    long reps = atol(argv[1]);
    int batches = atoi(argv[2]);
    const double p[] = {%(p)s};
    const double x[] = {%(x)s};
    double g[%(np)d];
    /* through a volatile pointer: no inlining into the loop, no hoisting */
    double (*volatile fn)(const double *, const double *, double *) = bench_grad;
    volatile double sink = 0.0;
    for (int b = 0; b < batches; ++b) {
        double t0 = gt_now();
        for (long r = 0; r < reps; ++r) {
            for (int j = 0; j < %(np)d; ++j) g[j] = 0.0;
            sink = sink + fn(p, x, g);
        }
        printf("time %%.9e\n", (gt_now() - t0) / (double)reps);
    }
    for (int j = 0; j < %(np)d; ++j) g[j] = 0.0;
    gt_print("bench_grad", "loss", -1, fn(p, x, g));
    for (int j = 0; j < %(nparams)d; ++j) gt_print("bench_grad", "p", j, g[j]);
    return 0;
}
"""


def bench_c(tp, loss, cc):
    lay = layout(tp, loss)
    src = emit_cuda(tp, loss, name="bench_grad")
    program = "\n".join([
        "#define _POSIX_C_SOURCE 199309L",
        "#include <stdlib.h>", "#include <time.h>",
        src, H.HARNESS_HEAD,
        TIMING_MAIN % {
            "p": ", ".join(c_double(tp.values[i].item()) for i in lay.params) or "0.0",
            "x": ", ".join(c_double(tp.values[i].item()) for i in lay.data) or "0.0",
            "np": max(len(lay.params), 1), "nparams": len(lay.params)},
    ])
    with tempfile.TemporaryDirectory() as work:
        c_file, exe = os.path.join(work, "bench.c"), os.path.join(work, "bench")
        with open(c_file, "w") as f:
            f.write(program)
        t0 = time.perf_counter()
        subprocess.run([cc, "-std=c99", "-O2", "-ffp-contract=off", "-o", exe, c_file, "-lm"],
                       check=True)
        compile_s = time.perf_counter() - t0
        probe = subprocess.run([exe, "100", "1"], capture_output=True, text=True, check=True)
        one = float(probe.stdout.split()[1])
        reps = max(100, int(0.2 / max(one, 1e-9)))
        out = subprocess.run([exe, str(reps), "7"], capture_output=True, text=True,
                             check=True).stdout
    times = [float(line.split()[1]) for line in out.splitlines() if line.startswith("time")]
    result = H.parse_output("\n".join(l for l in out.splitlines() if l.startswith("bench_grad")))
    return statistics.median(times), compile_s, len(src), result["bench_grad"], lay


def fmt(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if seconds >= scale:
            return f"{seconds / scale:8.3f} {unit}"
    return f"{seconds / 1e-9:8.3f} ns"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cc", default=shutil.which("cc") or "gcc")
    args = ap.parse_args(argv)

    tp, loss = build_graph(args.nodes, args.seed)
    ancestors = {loss.id}
    for i in range(loss.id, -1, -1):
        n = tp.nodes[i]
        if i in ancestors and n.a >= 0:
            ancestors |= {n.a} | ({n.b} if n.b >= 0 else set())
    print(f"graph: {len(tp.nodes)} nodes ({len(ancestors)} reach the loss), "
          f"{len(tp.params())} params, seed {args.seed}")

    t_tape = bench_tape(tp, loss)
    t_c, compile_s, src_len, c_out, lay = bench_c(tp, loss, args.cc)
    t_torch, torch_out = bench_torch(tp, loss)

    # the emitted C must agree with the tape to the bit
    with np.errstate(all="ignore"):
        tp.forward()
        tp.zero_grad()
        tp.backward(loss)
    want = [H.to_bits(tp.values[loss.id].item())] + \
        [H.to_bits(tp.grads[i].item()) if tp.grads[i] is not None else 0 for i in lay.params]
    have = [c_out["loss"]] + [c_out["p"][j] for j in range(len(lay.params))]
    exact = all(H.same_bits(a, b) for a, b in zip(have, want))

    print(f"emitted C: {src_len / 1e6:.2f} MB of source, gcc -O2 compile {compile_s:.1f} s; "
          f"bit-identical to the tape: {'yes' if exact else 'NO'}")
    print("per evaluation (forward + backward), median:")
    print(f"  CPU tape (numpy)         {fmt(t_tape)}")
    if t_torch is not None:
        print(f"  PyTorch eager autograd   {fmt(t_torch)}")
    else:
        print("  PyTorch eager autograd   (torch not installed)")
    print(f"  emitted C (gcc)          {fmt(t_c)}")
    print("ratios:")
    print(f"  CPU tape / emitted C     {t_tape / t_c:10.0f}x")
    if t_torch is not None:
        print(f"  PyTorch  / emitted C     {t_torch / t_c:10.0f}x   (target >= 1000x)")
        loss_t, grads_t = torch_out
        ref = [tp.values[loss.id].item()] + [tp.grad(p).item() for p in tp.params()]
        pairs = [(a, b) for a, b in zip([loss_t] + grads_t, ref)
                 if math.isfinite(a) and math.isfinite(b)]
        scale = max((abs(b) for _, b in pairs), default=0.0) or 1.0
        worst = max((abs(a - b) for a, b in pairs), default=0.0) / scale
        print(f"  (torch vs tape: max |difference| / max |value| {worst:.2e}; torch uses its "
              f"own libm and its own log_softmax/maximum rounding)")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
