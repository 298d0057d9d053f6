"""The autoencoder benchmark: 360 Adam episodes through every gradtool backend and PyTorch.

    python scripts/bench_ae.py [--repeats 5] [--episodes 360] [--warmup 1]
                               [--backends cpu,host,host-fuse,cuda,cuda-fuse,cuda-nograph]
                               [--no-torch]
                               [--torch-threads N] [--json out.json]

The workload is ``samples/autoencoder/`` (see its README): a 6-64-32-64-6
ReLU autoencoder, batch 200, MSE reconstruction of a noisy 2-D manifold in
6-D, 1,200 examples = 6 batches per epoch in file order, Adam with the
tape's defaults (lr 0.003).  One episode = upload the next batch + forward
+ backward + Adam update + read the loss back.

gradtool backends (each from a fresh load of the same tape file):
  cpu           gradtool.train.CpuEngine, the numpy reference
  host          the device engine's host backend (kernels.cu compiled by cc)
  host-fuse     the same with --fuse: the fused kernels generated for the tape
                (the GPU's per-thread bodies, run by cc-compiled code)
  cuda          the device engine on a GPU, one CUDA graph per episode
  cuda-fuse     the same with --fuse: the fused kernels, one CUDA graph
  cuda-nograph  per-node launches, kernel by kernel, no graph
cuda needs PyCUDA and a GPU; without them those rows are skipped.  The
fused kernels are built before the timed runs (on capture; cached).  Every
gradtool run goes through ``gradtool.train.Trainer.run`` -- the loop behind
``gradtool train`` -- with the data already in memory, so the time is the
engine's (plus the loop's few microseconds a step), not file IO or capture.

PyTorch float64 rows (when torch imports; on the same init, data and order):
  torch-eager          the same episodes eagerly on the CPU, with the Adam
                       update written out in torch ``_foreach`` ops in
                       gradtool's exact order (m = b1*m + (1-b1)*g,
                       v = b2*v + (1-b2)*(g*g), lr_t = lr*sqrt(1-b2^t)/(1-b1^t)
                       from running products, w = w - (lr_t*m)/(sqrt(v)+eps))
  torch-eager-optim    the same with ``torch.optim.Adam`` (default foreach
                       implementation: eps is added to sqrt(v)/sqrt(1-b2^t),
                       so its trajectory differs slightly); for reference
  torch-cuda-eager     torch-eager on the GPU
  torch-cuda-graph     one CUDA graph per episode (forward, backward and the
                       hand-written Adam captured once; lr_t and the batch
                       are copied into static tensors before each replay)
PyTorch's matmuls and reductions round in other orders, so its results are
compared by the final MSE only.

Reported per row: total milliseconds for all episodes (median of
``--repeats`` timed runs after ``--warmup`` untimed ones, and the range),
the ratio to PyTorch eager on the same kind of device (CPU rows to
torch-eager, GPU rows to torch-cuda-eager; below 1 = faster than PyTorch),
the final MSE (the mean of the 6 batch losses over all 1,200 examples after
the last update, forward only), for device rows the kernel launches per
episode, and, for gradtool rows, whether the final
parameters are bit-equal to the first gradtool backend's (every repeat is
checked).  Exit status 1 if any gradtool backend ends on other bits.
A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gradtool.device.cuda import cuda_status  # noqa: E402
from gradtool.errors import GradtoolError  # noqa: E402
from gradtool.tapefile import load  # noqa: E402
from gradtool.train import Trainer, TrainOptions, make_engine  # noqa: E402

SAMPLE = ROOT / "samples" / "autoencoder"
TAPE_PATH = SAMPLE / "ae.msgpack"
DATA_PATH = SAMPLE / "ae_data.npz"
GRADTOOL_BACKENDS = {"cpu": ("cpu", {}), "host": ("host", {}), "host-fuse": ("host", {"fuse": True}),
                     "cuda": ("cuda", {"graph": True}),
                     "cuda-fuse": ("cuda", {"graph": True, "fuse": True}),
                     "cuda-nograph": ("cuda", {"graph": False})}
B1, B2, EPS = 0.9, 0.999, 1e-8


# ── gradtool ───────────────────────────────────────────────────────────────

class GradtoolRun:
    """One fresh tape + optimizer + engine, set up by the same Trainer `gradtool train` uses."""

    def __init__(self, tape_bytes: bytes, data_path, name: str, episodes: int,
                 steps_per_epoch: int):
        backend, engine_options = GRADTOOL_BACKENDS[name]
        self.tf = load(tape_bytes, name=str(TAPE_PATH))
        # the tape's meta["train"] supplies the rest (adam, lr, no shuffle), as in `gradtool train`
        options = TrainOptions(epochs=math.ceil(episodes / steps_per_epoch), steps=episodes,
                               backend="cpu")
        self.trainer = Trainer(self.tf, data_path, options)
        if backend != "cpu":
            # Trainer builds its engine from the backend name alone; the cuda modes need
            # the graph switch, so the engine is swapped in before anything has run.
            self.trainer.engine = make_engine(backend, self.tf.tape, self.tf.loss.id,
                                              self.trainer.opt, **engine_options)

    def train(self) -> float:
        """Seconds for the episodes (Trainer.run: fill the slot, engine.train_step, repeat)."""
        t0 = time.perf_counter()
        result = self.trainer.run()
        seconds = time.perf_counter() - t0
        if result.stopped not in ("done", "steps"):
            raise SystemExit(f"bench_ae: the {self.trainer.engine.name} run stopped: "
                             f"{result.stopped}")
        return seconds

    def params(self) -> list:
        self.trainer.engine.finish()
        tape = self.tf.tape
        return [tape.values[e.node_id].copy() for e in self.trainer.opt.entries]

    def final_mse(self) -> float:
        """Mean of the batch losses over every full batch of the data, forward only."""
        engine, trainer = self.trainer.engine, self.trainer
        total, b = 0.0, trainer.batch
        for i in range(trainer.n_batches):
            for s in trainer.slots:
                engine.set_input(s.node_id, trainer.data.arrays[s.name][i * b:(i + 1) * b])
            total = total + engine.evaluate()
        return total / trainer.n_batches


def bench_gradtool(name, tape_bytes, steps_per_epoch, episodes, repeats, warmup):
    times, runs = [], []
    for r in range(warmup + repeats):
        run = GradtoolRun(tape_bytes, DATA_PATH, name, episodes, steps_per_epoch)
        seconds = run.train()
        if r >= warmup:
            times.append(seconds)
            runs.append(run)
    first = runs[0]
    replay = getattr(first.trainer.engine, "replay", None)
    return {"times": times, "params": [run.params() for run in runs],
            "mse": first.final_mse(), "engine": first.trainer.engine.name,
            "launches": replay.launches(train=True) if replay is not None else None}


# ── PyTorch ────────────────────────────────────────────────────────────────

class TorchAutoencoder:
    """The same network, init, data and batch order in torch tensors of ``dtype`` (float64
    here; scripts/bench_f32.py runs it in float32: init and data rounded once)."""

    def __init__(self, torch, tape_bytes, data: np.ndarray, device: str, optim: bool = False,
                 dtype=None):
        self.torch, self.dev = torch, torch.device(device)
        dtype = torch.float64 if dtype is None else dtype
        tf = load(tape_bytes)
        tape = tf.tape
        self.params = [torch.tensor(tape.values[p.id], dtype=dtype, device=self.dev,
                                    requires_grad=True) for p in tape.params()]
        self.batch = tape.values[tape.input_slots()[0].id].shape[0]
        self.lr = float(tf.meta["train"]["lr"])
        self.n_batches = data.shape[0] // self.batch
        # batches stay in host memory and are uploaded per episode, as gradtool's engines do
        self.batches = [torch.from_numpy(np.ascontiguousarray(
            data[i * self.batch:(i + 1) * self.batch])).to(dtype) for i in range(self.n_batches)]
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.b1t = self.b2t = 1.0
        self.optim = torch.optim.Adam(self.params, lr=self.lr) if optim else None

    def loss_of(self, x):
        torch, h = self.torch, x
        pairs = list(zip(self.params[0::2], self.params[1::2]))
        for k, (w, b) in enumerate(pairs):
            h = h @ w + b
            if k < len(pairs) - 1:
                h = torch.relu(h)
        d = h - x
        return (d * d).mean()

    def lr_t(self) -> float:
        """Advance the running bias powers; gradtool's host-side scalar, same expression."""
        self.b1t = self.b1t * B1
        self.b2t = self.b2t * B2
        return (self.lr * math.sqrt(1.0 - self.b2t)) / (1.0 - self.b1t)

    def adam(self, lr_t) -> None:
        """gradtool's Adam order, one rounding per op (no addcmul/alpha: no fused steps)."""
        f, grads = self.torch, [p.grad for p in self.params]
        f._foreach_mul_(self.m, B1)
        f._foreach_add_(self.m, f._foreach_mul(grads, 1.0 - B1))
        sq = f._foreach_mul(grads, grads)
        f._foreach_mul_(sq, 1.0 - B2)
        f._foreach_mul_(self.v, B2)
        f._foreach_add_(self.v, sq)
        denom = f._foreach_sqrt(self.v)
        f._foreach_add_(denom, EPS)
        step = f._foreach_mul(self.m, lr_t)
        f._foreach_div_(step, denom)
        f._foreach_sub_(self.params, step)

    def episode(self, i: int) -> float:
        for p in self.params:
            p.grad = None
        loss = self.loss_of(self.batches[i % self.n_batches].to(self.dev))
        loss.backward()
        with self.torch.no_grad():
            if self.optim is not None:
                self.optim.step()
            else:
                self.adam(self.lr_t())
        return loss.item()

    def train(self, episodes: int) -> float:
        sync = self.torch.cuda.synchronize if self.dev.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        for i in range(episodes):
            self.episode(i)
        sync()
        return time.perf_counter() - t0

    def final_mse(self) -> float:
        with self.torch.no_grad():
            total = 0.0
            for x in self.batches:
                total = total + self.loss_of(x.to(self.dev)).item()
        return total / self.n_batches


class TorchGraphAutoencoder(TorchAutoencoder):
    """One CUDA graph per episode: forward, backward and the hand-written Adam, captured once."""

    def __init__(self, torch, tape_bytes, data, device="cuda"):
        super().__init__(torch, tape_bytes, data, device)
        self.static_x = self.batches[0].to(self.dev).clone()
        self.static_lr = torch.zeros((), dtype=torch.float64, device=self.dev)
        initial = [p.detach().clone() for p in self.params]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):            # warm-up, as the CUDA-graph recipe asks
            for _ in range(3):
                self._captured_body()
        torch.cuda.current_stream().wait_stream(side)
        with torch.no_grad():                    # undo the warm-up: the run starts at the init
            for p, p0 in zip(self.params, initial):
                p.copy_(p0)
            for buf in self.m + self.v:
                buf.zero_()
        for p in self.params:
            p.grad = None
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_loss = self._captured_body()

    def _captured_body(self):
        loss = self.loss_of(self.static_x)
        loss.backward()
        with self.torch.no_grad():
            self.adam(self.static_lr)
        return loss

    def episode(self, i: int) -> float:
        self.static_x.copy_(self.batches[i % self.n_batches])
        self.static_lr.fill_(self.lr_t())
        self.graph.replay()
        return self.static_loss.item()


def bench_torch(make, episodes, repeats, warmup):
    times, mse = [], None
    for r in range(warmup + repeats):
        model = make()
        seconds = model.train(episodes)
        if r >= warmup:
            times.append(seconds)
            if mse is None:
                mse = model.final_mse()
    return {"times": times, "mse": mse}


# ── the table ──────────────────────────────────────────────────────────────

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per backend (median)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    ap.add_argument("--episodes", type=int, default=360, help="Adam episodes per run")
    ap.add_argument("--backends", default=None,
                    help="comma-separated gradtool backends (default: cpu,host plus "
                         "cuda,cuda-nograph when a GPU answers)")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch rows")
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch.set_num_threads for the PyTorch rows (default: torch's own)")
    ap.add_argument("--json", dest="json_path", help="also write every figure to this file")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.episodes < 1 or args.warmup < 0:
        ap.error("--repeats and --episodes must be >= 1, --warmup >= 0")

    has_cuda, cuda_note = cuda_status()
    names = (args.backends.split(",") if args.backends else
             ["cpu", "host", "host-fuse"] +
             (["cuda", "cuda-fuse", "cuda-nograph"] if has_cuda else []))
    unknown = [n for n in names if n not in GRADTOOL_BACKENDS]
    if unknown:
        ap.error(f"unknown backend(s) {', '.join(unknown)} "
                 f"(choose from {', '.join(GRADTOOL_BACKENDS)})")
    if not has_cuda and any(GRADTOOL_BACKENDS[n][0] == "cuda" for n in names):
        print(f"bench_ae: the cuda backend is unavailable: {cuda_note}", file=sys.stderr)
        return 2
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            torch = None
    if torch is not None and args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    torch_note = (f"torch {torch.__version__}, CPU threads {torch.get_num_threads()}"
                  if torch else "no PyTorch rows" + (" (--no-torch)" if args.no_torch
                                                     else ": torch is not installed"))
    print(f"# autoencoder 6-64-32-64-6, batch 200, {args.episodes} Adam episodes; "
          f"{os.cpu_count()} cores; {torch_note}; cuda: {cuda_note}; "
          f"median of {args.repeats} runs after {args.warmup} warm-up", flush=True)

    tape_bytes = TAPE_PATH.read_bytes()
    data = np.load(DATA_PATH)["x"]
    steps_per_epoch = data.shape[0] // load(tape_bytes).meta["config"]["batch"]
    rows = []
    reference = None                    # the first gradtool backend's final parameters
    all_equal = True
    for name in names:
        res = bench_gradtool(name, tape_bytes, steps_per_epoch, args.episodes, args.repeats,
                             args.warmup)
        if reference is None:
            reference = res["params"][0]
        equal = all(len(run) == len(reference) and all(
            a.shape == b.shape and np.array_equal(a.view(np.uint64), b.view(np.uint64))
            for a, b in zip(run, reference)) for run in res["params"])
        all_equal = all_equal and equal
        rows.append({"backend": name, "device": "gpu" if name.startswith("cuda") else "cpu",
                     "times_ms": [t * 1e3 for t in res["times"]], "mse": res["mse"],
                     "launches": res["launches"], "bit_equal": equal})
    if torch is not None:
        makers = [("torch-eager", "cpu", lambda: TorchAutoencoder(torch, tape_bytes, data, "cpu")),
                  ("torch-eager-optim", "cpu",
                   lambda: TorchAutoencoder(torch, tape_bytes, data, "cpu", optim=True))]
        if torch.cuda.is_available():
            makers += [("torch-cuda-eager", "gpu",
                        lambda: TorchAutoencoder(torch, tape_bytes, data, "cuda")),
                       ("torch-cuda-graph", "gpu",
                        lambda: TorchGraphAutoencoder(torch, tape_bytes, data))]
        for name, device, make in makers:
            res = bench_torch(make, args.episodes, args.repeats, args.warmup)
            rows.append({"backend": name, "device": device,
                         "times_ms": [t * 1e3 for t in res["times"]], "mse": res["mse"],
                         "launches": None, "bit_equal": None})

    eager = {r["device"]: statistics.median(r["times_ms"]) for r in rows
             if r["backend"] in ("torch-eager", "torch-cuda-eager")}
    print(f"{'backend':<18} {'total ms':>9} {'range ms':>15} {'vs torch':>8} "
          f"{'final MSE':>22} {'launches':>8} {'bit-equal':>9}")
    for r in rows:
        r["median_ms"] = statistics.median(r["times_ms"])
        ref = eager.get(r["device"])
        r["ratio"] = r["median_ms"] / ref if ref else None
        span = f"{min(r['times_ms']):.1f}-{max(r['times_ms']):.1f}"
        ratio = f"{r['ratio']:8.2f}" if r["ratio"] is not None else f"{'-':>8}"
        same = "-" if r["bit_equal"] is None else ("yes" if r["bit_equal"] else "NO")
        launches = "-" if r["launches"] is None else str(r["launches"])
        print(f"{r['backend']:<18} {r['median_ms']:9.1f} {span:>15} {ratio} "
              f"{r['mse']:22.17g} {launches:>8} {same:>9}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(
            {"episodes": args.episodes, "repeats": args.repeats, "warmup": args.warmup,
             "cores": os.cpu_count(), "torch": torch_note, "cuda": cuda_note,
             "all_gradtool_bit_equal": all_equal, "rows": rows}, indent=1) + "\n")
    if not all_equal:
        bad = ", ".join(r["backend"] for r in rows if r["bit_equal"] is False)
        print(f"bench_ae: {bad} ended on other parameter bits than {names[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except GradtoolError as exc:            # e.g. --backends cuda without PyCUDA or a GPU
        print(f"bench_ae: {exc}", file=sys.stderr)
        sys.exit(2)
