"""The own-loop wrapper's overhead: ``gtt.wrap``'s step against ``gradtool train``'s.

    python scripts/bench_wrap.py [--backend host] [--steps 100] [--repeats 7] [--threads 2]

Workload: ``samples/tiny_gpt`` as built (float32, batch 8, train mode), the
sonnets' batches cycled.  Four step functions, timed in interleaved runs (medians
of ``--repeats`` runs of ``--steps`` steps each; every side sees the same load):

* ``gradtool train``: the engine ``gradtool train --backend B --optimizer adamw``
  drives (``gradtool.train.make_engine`` over the imported tape: set the two input
  slots, one ``train_step``: forward, backward, AdamW on the backend);
* ``gtt loop``: the loop of issue 40: ``loss = gm(x, y); loss.backward();
  opt.step(); opt.zero_grad()`` with ``gtt.optim.AdamW`` at the same options;
* ``gtt fwd+bwd``: ``gm(x, y).backward()`` alone (the wrapper's part), with the
  gradients set to None after it as ``zero_grad`` does;
* ``torch f32 loop``, ``torch f64 loop``: PyTorch's own loop on the module (its own
  forward, autograd and ``torch.optim.AdamW``, default kernels), in float32 and
  ``.double()``: what the user's loop costs without gradtool (timed with the gtt loop
  in an interleaved set of their own, after the others);
* ``torch side``: the loop's torch side with no gradtool run at all: the gradients'
  one copy out of an arena into the wrapper's grad set, the loss handed to torch as the
  wrapper hands it (:func:`gradtool.interop.handoff._lazy_loss`), its ``backward()``
  writing them into each ``.grad``, ``gtt.optim.AdamW``'s step and ``zero_grad``.
  What the loop's API costs in torch whatever computes the gradients; the loop's time
  beyond the engine's step, less this, is the wrapper's own.

With ``--cli``, also ``gradtool train`` itself (the command, in a subprocess, on the
same tape saved to a file and the same batches in an .npz): its step is the
difference of two runs' times over the difference of their step counts, so start-up
and saving cancel; medians over ``--repeats`` pairs.

The first two end on the same parameter bits (checked after the timing, as
``tests/test_wrap_optim.py`` checks them): a ratio compares the same computation.
Issue 40's target: ``gtt loop`` within 15% of ``gradtool train`` (ratio <= 1.15).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import ROOT, cpu_name, load_average, time_interleaved  # noqa: E402

GPT_DIR = ROOT / "samples" / "tiny_gpt"
LR, WD = 3e-4, 0.1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="host", help="host (the issue's), cpu or cuda")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2, help="gradtool's and torch's")
    ap.add_argument("--cli", action="store_true", help="also time the gradtool train command")
    args = ap.parse_args(argv)

    import os
    os.environ["GRADTOOL_THREADS"] = str(args.threads)
    import torch
    torch.set_num_threads(args.threads)
    import gradtool.interop.torch as gtt
    from gradtool.optim import make_optimizer
    from gradtool.train import make_engine
    sys.path.insert(0, str(GPT_DIR))
    from model import build, dataset

    model, inputs = build()
    model.train()
    _, idx, tgt = dataset()
    b = inputs[0].shape[0]
    batches = [(torch.from_numpy(idx[i:i + b]), torch.from_numpy(tgt[i:i + b]))
               for i in range(0, len(idx) - b + 1, b)]

    # gradtool train's engine over the tape gm records (the same importer, same dtype)
    m_eng = copy.deepcopy(model)
    gm_rec = gtt.wrap(m_eng, batches[0], backend=args.backend)
    graph = next(iter(gm_rec.graphs.values()))
    tape = graph.tape
    opt = make_optimizer("adamw", LR, {"weight_decay": WD})
    for _, i in graph.params:
        opt.add(tape, tape.var(i))
    engine = make_engine(args.backend, tape, graph.loss_id, opt)
    slots = [i for _, i, _ in graph.inputs]
    rng_id = graph.rng_id
    state = {"step": 0}

    def train_step(i):
        x, y = batches[i % len(batches)]
        engine.set_input(slots[0], x.numpy())
        engine.set_input(slots[1], y.numpy())
        if rng_id >= 0:
            engine.set_input(rng_id, np.array([state["step"], 0.0, 1.0]))
        state["step"] += 1
        engine.train_step()

    m_loop = copy.deepcopy(model)
    gm = gtt.wrap(m_loop, batches[0], backend=args.backend)
    gopt = gtt.optim.AdamW(m_loop.parameters(), lr=LR, weight_decay=WD)

    def loop_step(i):
        x, y = batches[i % len(batches)]
        loss = gm(x, y)
        loss.backward()
        gopt.step()
        gopt.zero_grad()

    m_fb = copy.deepcopy(model)
    gm_fb = gtt.wrap(m_fb, batches[0], backend=args.backend)
    fb_params = list(m_fb.parameters())

    def fwd_bwd(i):
        x, y = batches[i % len(batches)]
        gm_fb(x, y).backward()
        for p in fb_params:
            p.grad = None

    # the loop's torch side, without gradtool's run: the gradients' copy into the grad
    # set, the loss handed to torch as the wrapper hands it, its backward writing each
    # .grad, gtt.optim's step and zero_grad -- what the loop's API costs in torch
    from gradtool.interop.handoff import _GradSet, _lazy_class, _lazy_loss
    m_t = copy.deepcopy(model)
    t_params = list(m_t.parameters())
    t_set = _GradSet(torch, t_params)
    t_arena = np.full(t_set.flat.size, 1e-3, dtype=t_set.flat.dtype)
    t_loss = torch.zeros((), dtype=t_params[0].dtype)
    t_opt = gtt.optim.AdamW(t_params, lr=LR, weight_decay=WD)
    _lazy_class()

    def torch_side(i):
        np.copyto(t_set.flat, t_arena)
        _lazy_loss(t_loss.clone(), list(t_set.views), t_params).backward()
        t_opt.step()
        t_opt.zero_grad()

    # PyTorch's own loop on the same module, float32 and float64 (torch.optim.AdamW,
    # its default kernels): what the user's loop costs without gradtool
    def torch_loop(dtype):
        m = copy.deepcopy(model).to(dtype)
        topt = torch.optim.AdamW(m.parameters(), lr=LR, weight_decay=WD)

        def step(i):
            x, y = batches[i % len(batches)]
            m(x, y).backward()
            topt.step()
            topt.zero_grad()
        return step

    names = ["gradtool train", "gtt loop", "gtt fwd+bwd", "torch side"]
    print(f"# bench_wrap: samples/tiny_gpt, backend {args.backend}, {args.threads} threads, "
          f"{cpu_name()}, load {load_average()}")
    timed = time_interleaved([train_step, loop_step, fwd_bwd, torch_side],
                             args.steps, args.repeats)
    base = timed[0][0]
    for name, (med, best) in zip(names, timed):
        print(f"{name:16s} median {med * 1e3:8.3f} ms  best {best * 1e3:8.3f} ms  "
              f"ratio {med / base:5.2f}")
    # the same bits: both did the same number of steps on the same batches
    engine.finish()
    a = [tape.values[i] for _, i in graph.params]
    pl = dict(m_loop.named_parameters())
    same = all(np.array_equal(w, pl[k].detach().numpy().reshape(w.shape))
               for (k, _), w in zip(graph.params, a))
    print(f"# same parameter bits (gradtool train vs the gtt loop): {same}; "
          f"load {load_average()}")
    own = timed[1][0] - base - timed[3][0]
    print(f"# the loop's time beyond the engine's step: {(timed[1][0] - base) * 1e3:.3f} ms, "
          f"of which its torch side {timed[3][0] * 1e3:.3f} ms and the wrapper's own "
          f"{own * 1e3:.3f} ms")
    # PyTorch's own loops in an interleaved set of their own, with the gtt loop again
    # (torch's OpenMP threads spin for a while after its calls, and would slow the
    # gradtool runs after them in the set above)
    vs = time_interleaved([loop_step, torch_loop(torch.float32), torch_loop(torch.float64)],
                          args.steps, args.repeats)
    for name, (med, best) in zip(["gtt loop", "torch f32 loop", "torch f64 loop"], vs):
        print(f"{name:16s} median {med * 1e3:8.3f} ms  best {best * 1e3:8.3f} ms  "
              f"gtt loop / this {vs[0][0] / med:5.2f}")
    if args.cli:
        cli = cli_step(tape, graph, batches, args)
        print(f"{'gradtool train (CLI)':16s} median {cli * 1e3:8.3f} ms  (per step, from "
              f"{args.steps} and {4 * args.steps} steps)  gtt loop / CLI "
              f"{timed[1][0] / cli:5.2f}")
    return 0 if same else 1


def cli_step(tape, graph, batches, args) -> float:
    """The ``gradtool train`` command's time per step on ``tape`` (median of repeats)."""
    import statistics
    import subprocess
    import tempfile
    import time
    from gradtool.tapefile import save
    with tempfile.TemporaryDirectory() as tmp:
        path, data = Path(tmp) / "gpt.msgpack", Path(tmp) / "tokens.npz"
        save(tape, str(path), loss=tape.var(graph.loss_id))
        names = [k for k, _, _ in graph.inputs]
        np.savez(data, **{n: np.concatenate([b[j].numpy() for b in batches])
                          for j, n in enumerate(names)})
        env = dict(__import__("os").environ, GRADTOOL_THREADS=str(args.threads),
                   PYTHONPATH=str(ROOT))

        def run(steps: int) -> float:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "gradtool", "train", str(path), "--data",
                            str(data), "--backend", args.backend, "--optimizer", "adamw",
                            "--lr", str(LR), "--weight-decay", str(WD), "--steps",
                            str(steps), "--epochs", "1000"],
                           check=True, env=env, capture_output=True)
            return time.perf_counter() - t0
        per = []
        for _ in range(args.repeats):
            short, long = run(args.steps), run(4 * args.steps)
            per.append((long - short) / (3 * args.steps))
        return statistics.median(per)


if __name__ == "__main__":
    raise SystemExit(main())
