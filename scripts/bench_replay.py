"""Device replay speed: gradtool's host (and cuda) backend next to PyTorch float64, in one run.

    python scripts/bench_replay.py [--repeats 7] [--steps 50] [--backends host,cuda]
                                   [--json out.json]

Workloads
  * the MLPs of scripts/bench_train.py: relu hidden layer, MSE on one-hot
    targets, Adam lr 1e-3; 64-128-10 at batch 64 and 784-256-10 at batch 128.
    One step = upload the next minibatch (cycling through 8) + forward +
    backward + Adam update + read the loss back.  PyTorch float64 runs the
    same step eagerly on the CPU, and on a GPU also eagerly and as a captured
    CUDA graph (static inputs, ``capturable=True`` Adam), the usual recipe.
  * every sample tape (samples/**/*.msgpack): one episode = forward +
    backward + Adam over every param, inputs as recorded.  That includes the
    LoRA block twice: as recorded now (take, axis means, reshape-grouped GQA,
    log_softmax cross-entropy) and its first recording (one-hot matmul
    embedding, ones-matmul RMSNorm, slice/concat GQA, log(softmax)), kept as
    samples/lora_block/legacy/block_onehot.msgpack; the last lines compare
    the two per step.
Figures are medians over ``--repeats`` runs of ``--steps`` steps after a
warm-up; "ratio" is gradtool's time over PyTorch's on the same device (below
1 means gradtool is faster).  PyTorch is optional: without it those columns
are skipped.  A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (LR, POOL, ROOT, SHAPES, gradtool_mlp, make_problem,  # noqa: E402
                          mlp_name, time_interleaved, torch_mlp_loss)

from gradtool.device import capture  # noqa: E402
from gradtool.device.cuda import cuda_status  # noqa: E402
from gradtool.optim import Adam  # noqa: E402
from gradtool.tapefile import load  # noqa: E402


def time_steps(step, n_steps, repeats, sync=None):
    """Median seconds per step of ``step(i)`` (see bench_common.time_interleaved)."""
    return time_interleaved([step], n_steps, repeats, sync=sync)[0][0]


def bench_gradtool_mlp(shape, backend, dtype, n_steps, repeats):
    params, xs, ys = make_problem(shape)
    tp, x, y, loss, opt = gradtool_mlp(params, xs, ys)
    rp = capture(tp, loss, backend, dtype, optimizer=opt)

    def step(i):
        rp.set_input(x, xs[i % POOL])
        rp.set_input(y, ys[i % POOL])
        rp.episode(train=True)           # reads the loss back: a full round trip

    return time_steps(step, n_steps, repeats), rp.launches(True)


def bench_torch_mlp(shape, device, n_steps, repeats, graph=False):
    import torch
    params, xs, ys = make_problem(shape)
    dev = torch.device(device)
    ws = [torch.tensor(p, dtype=torch.float64, device=dev, requires_grad=True) for p in params]
    host_x = [torch.from_numpy(a) for a in xs]
    host_y = [torch.from_numpy(a) for a in ys]

    def loss_of(x, y):
        return torch_mlp_loss(torch, ws, x, y)

    sync = torch.cuda.synchronize if dev.type == "cuda" else None
    if not graph:
        opt = torch.optim.Adam(ws, lr=LR)

        def step(i):
            x = host_x[i % POOL].to(dev)
            y = host_y[i % POOL].to(dev)
            opt.zero_grad()
            loss = loss_of(x, y)
            loss.backward()
            opt.step()
            loss.item()

        return time_steps(step, n_steps, repeats, sync=sync)

    opt = torch.optim.Adam(ws, lr=LR, capturable=True)
    static_x = host_x[0].to(dev).clone()
    static_y = host_y[0].to(dev).clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_of(static_x, static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        static_loss = loss_of(static_x, static_y)
        static_loss.backward()
        opt.step()

    def step(i):
        static_x.copy_(host_x[i % POOL])
        static_y.copy_(host_y[i % POOL])
        g.replay()
        static_loss.item()

    return time_steps(step, n_steps, repeats, sync=sync)


def sample_replay(path, backend, dtype):
    tf = load(path)
    opt = Adam(1e-3)
    for p in tf.tape.params():
        opt.add(tf.tape, p)
    return tf, capture(tf.tape, tf.loss, backend, dtype, optimizer=opt)


def bench_sample(path, backend, dtype, n_steps, repeats):
    _, rp = sample_replay(path, backend, dtype)
    return time_steps(lambda i: rp.episode(train=True), n_steps, repeats), rp.launches(True)


LORA_AFTER = ROOT / "samples" / "lora_block" / "block.msgpack"
LORA_BEFORE = ROOT / "samples" / "lora_block" / "legacy" / "block_onehot.msgpack"


def bench_lora_before_after(backend, dtype, n_steps, repeats):
    """The LoRA block's two recordings timed interleaved (the same machine load for
    both): [(label, nodes, launches, median seconds per step)]."""
    replays = [(label, *sample_replay(path, backend, dtype))
               for label, path in (("before", LORA_BEFORE), ("after", LORA_AFTER))]
    times = time_interleaved([lambda i, rp=rp: rp.episode(train=True) for _, _, rp in replays],
                             n_steps, repeats)
    return [(label, len(tf.tape), rp.launches(True), median)
            for (label, tf, rp), (median, _) in zip(replays, times)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--backends", default=None,
                    help="comma-separated: host, cuda (default: host, plus cuda when present)")
    ap.add_argument("--dtype", default="f64", choices=["f64", "f32"])
    ap.add_argument("--json", dest="json_path", help="also write every figure to this file")
    args = ap.parse_args(argv)

    has_cuda, cuda_note = cuda_status()
    backends = args.backends.split(",") if args.backends else \
        ["host"] + (["cuda"] if has_cuda else [])
    try:
        import torch
        torch_note = f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads"
        torch_cuda = torch.cuda.is_available()
    except ImportError:
        torch, torch_note, torch_cuda = None, "torch not installed: its columns are skipped", False
    print(f"# {os.cpu_count()} cores; {torch_note}; cuda: {cuda_note}; dtype {args.dtype}; "
          f"median of {args.repeats} x {args.steps} steps")
    rows = []

    def row(workload, backend, ours, launches, ref_name=None, ref=None):
        rows.append({"workload": workload, "backend": backend, "us_per_step": ours * 1e6,
                     "launches": launches, "reference": ref_name,
                     "reference_us_per_step": None if ref is None else ref * 1e6,
                     "ratio": None if ref is None else ours / ref})

    for shape in SHAPES:
        name = f"mlp {mlp_name(shape)} b{shape[3]}"
        for backend in backends:
            ours, launches = bench_gradtool_mlp(shape, backend, args.dtype, args.steps,
                                                args.repeats)
            if torch is None or (backend == "cuda" and not torch_cuda):
                row(name, backend, ours, launches)
                continue
            if backend == "host":
                ref = bench_torch_mlp(shape, "cpu", args.steps, args.repeats)
                row(name, backend, ours, launches, "torch cpu eager", ref)
            else:
                ref = bench_torch_mlp(shape, "cuda", args.steps, args.repeats)
                row(name, backend, ours, launches, "torch cuda eager", ref)
                ref = bench_torch_mlp(shape, "cuda", args.steps, args.repeats, graph=True)
                row(name, backend, ours, launches, "torch cuda graph", ref)
    for path in sorted((ROOT / "samples").rglob("*.msgpack")):
        for backend in backends:
            ours, launches = bench_sample(path, backend, args.dtype, args.steps, args.repeats)
            row(str(path.relative_to(ROOT)), backend, ours, launches)

    print(f"{'workload':<48} {'backend':<7} {'launches':>8} {'us/step':>10}  "
          f"{'reference':<17} {'ref us/step':>11} {'ratio':>6}")
    for r in rows:
        ref = f"{r['reference_us_per_step']:11.1f}" if r["reference"] else f"{'-':>11}"
        ratio = f"{r['ratio']:6.2f}" if r["ratio"] is not None else f"{'-':>6}"
        print(f"{r['workload']:<48} {r['backend']:<7} {r['launches']:>8} "
              f"{r['us_per_step']:10.1f}  {r['reference'] or '-':<17} {ref} {ratio}")
    lora = {}
    for backend in backends:
        lora[backend] = bench_lora_before_after(backend, args.dtype, args.steps, args.repeats)
        (_, n0, l0, t0), (_, n1, l1, t1) = lora[backend]
        print(f"lora_block per step on {backend} (forward + backward + Adam, interleaved): "
              f"before {t0 * 1e6:.1f} us ({n0} nodes, {l0} launches), after {t1 * 1e6:.1f} us "
              f"({n1} nodes, {l1} launches), after/before {t1 / t0:.2f}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(
            {"note": torch_note, "rows": rows,
             "lora_block": {b: [{"recording": label, "nodes": n, "launches": launches,
                                 "us_per_step": t * 1e6} for label, n, launches, t in v]
                            for b, v in lora.items()}}, indent=1))


if __name__ == "__main__":
    main()
