"""The PyTorch importer, measured: import time of a ~10M-param GPT, and one training step
of the shipped sample (samples/tiny_gpt) on gradtool cpu and host next to torch float64
eager on the same module.

    python scripts/bench_import.py [--layers 12] [--d 256] [--repeats 5] [--steps 10]
                                   [--skip-import] [--skip-steps]

Import: ``import_module`` end to end (float64 copy, torch.export, run_decompositions,
folding, the report, recording with every op's forward value computed), once after one
untimed warm-up import of a tiny model (torch's own first-call costs), wall clock.

Steps: one step = fill the two input slots with a batch + forward + backward + Adam
update; gradtool's engines and torch (Adam, same lr, float64, ``torch.set_num_threads``
as given, default torch's) run the same batches, interleaved ``--repeats`` times
(median and best seconds per step).  A benchmark, not a test: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "samples" / "tiny_gpt"))

from bench_common import cpu_name, time_interleaved            # noqa: E402


def bench_import(layers: int, d: int) -> None:
    import torch
    from model import TinyGPT
    from gradtool.interop.torch import import_module
    vocab, block, batch = 512, 64, 2
    torch.manual_seed(0)
    warm = TinyGPT(vocab=11, block=8, d=8, heads=2, layers=1).eval()
    ids = torch.randint(0, 11, (1, 8))
    import_module(warm, (ids, ids), dtype="f64")
    model = TinyGPT(vocab=vocab, block=block, d=d, heads=max(1, d // 64), layers=layers).eval()
    n = sum(p.numel() for p in model.parameters())
    idx = torch.randint(0, vocab, (batch, block))
    from gradtool.interop import torch as importer
    checked = []                      # the share of the check against torch's run
    check = importer.check_against_torch

    def timed_check(*args):
        c0 = time.perf_counter()
        check(*args)
        checked.append(time.perf_counter() - c0)

    importer.check_against_torch = timed_check
    try:
        t0 = time.perf_counter()
        result = import_module(model, (idx, idx), dtype="f64")
        dt = time.perf_counter() - t0
    finally:
        importer.check_against_torch = check
    print(f"import: {layers}-layer GPT, d={d}, {n / 1e6:.2f}M params, batch {batch} x "
          f"{block} tokens: {dt:.2f} s ({len(result.tape.nodes)} nodes; the check against "
          f"torch's run {sum(checked):.2f} s of it)")


def bench_steps(repeats: int, steps: int, threads) -> None:
    import torch
    from model import build, dataset
    from gradtool.interop.torch import import_module
    from gradtool.optim import Adam
    from gradtool.train import make_engine
    if threads:
        torch.set_num_threads(threads)
    lr = 3e-3
    model, inputs = build()
    _, idx, tgt = dataset()
    b = inputs[0].shape[0]
    batches = [(idx[i:i + b], tgt[i:i + b]) for i in range(0, len(idx) - b + 1, b)]

    def gradtool_step(backend):
        result = import_module(model, inputs, dtype="f64")
        tape = result.tape
        opt = Adam(lr)
        for p in tape.params():
            opt.add(tape, p)
        engine = make_engine(backend, tape, result.loss.id, opt)
        xi, ti = result.inputs["idx"].id, result.inputs["targets"].id

        def step(i):
            x, t = batches[i % len(batches)]
            engine.set_input(xi, x)
            engine.set_input(ti, t)
            engine.train_step()
        return step

    m64 = copy.deepcopy(model).double()
    opt = torch.optim.Adam(m64.parameters(), lr=lr)
    tb = [(torch.from_numpy(x), torch.from_numpy(t)) for x, t in batches]

    def torch_step(i):
        x, t = tb[i % len(tb)]
        opt.zero_grad()
        m64(x, t).backward()
        opt.step()

    fns = [gradtool_step("cpu"), gradtool_step("host"), torch_step]
    (cpu, cpu_best), (host, host_best), (tor, tor_best) = time_interleaved(
        fns, steps, repeats)
    n = sum(p.numel() for p in model.parameters())
    print(f"step: samples/tiny_gpt ({n} params, batch {b} x {inputs[0].shape[1]} tokens), "
          f"torch {torch.__version__} float64 eager + Adam, {torch.get_num_threads()} "
          f"threads; {repeats} x {steps} steps interleaved, median (best)")
    for name, med, best in [("gradtool cpu", cpu, cpu_best), ("gradtool host", host, host_best),
                            ("torch f64 eager", tor, tor_best)]:
        print(f"  {name:<16} {med * 1e3:8.3f} ms ({best * 1e3:.3f})   ratio to torch "
              f"{med / tor:5.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--torch-threads", type=int)
    ap.add_argument("--skip-import", action="store_true")
    ap.add_argument("--skip-steps", action="store_true")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    print(f"# {cpu_name()}, {os.cpu_count()} cores")
    if not args.skip_import:
        bench_import(args.layers, args.d)
    if not args.skip_steps:
        bench_steps(args.repeats, args.steps, args.torch_threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
