"""Layout ops' speed: one forward + backward of a grouped-query-attention-style layout
graph (permute, repeat_interleave = reshape/expand/reshape, a product, a multi-axis sum,
a stepped slice, index_select), on the CPU tape, the host backend, and PyTorch float64
eager, interleaved in one run (medians).

    python scripts/bench_layout.py [--repeats 7] [--steps 5]
"""

from __future__ import annotations

import argparse
import platform

import numpy as np
from bench_common import time_interleaved

import gradtool as gt
from gradtool.device import capture

B, T, H, KV, D = 8, 128, 8, 2, 64


def inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((B, T, H, D)), rng.standard_normal((B, T, KV, D)),
            rng.uniform(0.5, 1.5, (H, T // 2)), rng.integers(0, H, 16))


def gradtool_graph(q0, k0, w0, ids0):
    tp = gt.Tape()
    q, k = tp.param(q0), tp.param(k0)
    qh = tp.permute(q, [0, 2, 1, 3])                                  # [B,H,T,D]
    kh = tp.repeat_interleave(tp.permute(k, [0, 2, 1, 3]), H // KV, 1)  # [B,H,T,D]
    s = tp.sum(tp.mul(qh, kh), (0, 3))                                # [H,T]
    s = tp.slice(s, [0, 0], [H, T], [1, 2])                           # [H,T/2]
    s = tp.index_select(s, 0, ids0)                                   # [16,T/2]
    loss = tp.sum(tp.mul(s, tp.const(w0[ids0])))
    return tp, loss


def torch_step(torch, q0, k0, w0, ids0):
    q = torch.tensor(q0, requires_grad=True)
    k = torch.tensor(k0, requires_grad=True)
    w, ids = torch.tensor(w0[ids0]), torch.tensor(ids0)

    def step(_):
        q.grad = k.grad = None
        qh = q.permute(0, 2, 1, 3)
        kh = k.permute(0, 2, 1, 3).repeat_interleave(H // KV, 1)
        s = (qh * kh).sum((0, 3))[:, ::2].index_select(0, ids)
        (s * w).sum().backward()
    return step


def main():
    import torch
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(2)
    data = inputs()
    tp, loss = gradtool_graph(*data)
    rp = capture(tp, loss, "host")

    def tape_step(_):
        tp.forward()
        tp.backward(loss)

    def host_step(_):
        rp.forward()
        rp.backward()

    names = ["gradtool cpu (tape)", "gradtool host", "torch float64 eager"]
    times = time_interleaved([tape_step, host_step, torch_step(torch, *data)], args.steps,
                             args.repeats, warmup=2)
    print(f"# layout graph B={B} T={T} H={H} KV={KV} D={D}, forward + backward; "
          f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} torch threads")
    base = times[2][0]
    for name, (med, best) in zip(names, times):
        print(f"{name:<22} median {med * 1e3:8.2f} ms  best {best * 1e3:8.2f} ms  "
              f"ratio to torch {med / base:5.2f}")


if __name__ == "__main__":
    main()
