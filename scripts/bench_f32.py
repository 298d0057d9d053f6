"""float32 training steps and products: gradtool's engines next to PyTorch float32 eager.

    python scripts/bench_f32.py [--repeats 5] [--steps 30] [--big-steps 8] [--threads 2]
                                [--workloads mlp,ae,gpt,resnet,products] [--json out.json]

One run gives issue 38's speed figures side by side, each as the ratio gradtool time /
torch time (below 1: gradtool is faster), every array float32 on both sides:

  mlp       the MLPs of scripts/bench_train.py (relu hidden layer, MSE, Adam lr 1e-3):
            784-256-10 at batch 128 and 64-128-10 at batch 64; gradtool's cpu engine,
            host backend and host --fuse
  ae        the seed's autoencoder (samples/autoencoder/ae.msgpack, 6-64-32-64-6, batch
            200) converted to f32 (gradtool.convert.to_dtype), Adam with the tape's lr
            (0.003), the data's six batches in file order; cpu and host, against the same
            network, init and batches in torch float32 with torch.optim.Adam
  gpt       the samples/tiny_gpt sample's step (model.py's TinyGPT, batch 8 x 16 tokens,
            eval mode as recorded) imported at f32 (import_module(..., dtype="f32")),
            Adam lr 3e-3 (its meta["train"]); cpu and host against the torch.nn module
            itself in float32 with torch.optim.Adam
  resnet    a ResNet-style CNN defined here (3x32x32 input, batch 16, a conv stem and
            three stages of basic blocks, 16/32/64 channels, BatchNorm in train mode,
            relu, global mean, linear head, cross-entropy), imported at f32, Adam lr
            1e-3; host (and cpu) against the module in torch float32 with torch.optim.Adam
  products  numerics32.matmul (the f32 fmaf-chain tiles every f32 product of the cpu
            engine and the host backend runs) and torch.mm float32 on 1024^3 and on the
            784-256-10 step's large products (X @ W1, X^T @ G1), in GFLOP/s and as a
            share of the measured float32 FMA peak (scripts/bench_matmul.py's peak loop
            on float vectors), on 1 and 2 threads

A step is fill the input slots + forward + backward + the Adam update: gradtool's engine
step (gradtool.train.make_engine, what `gradtool train` runs per step, each engine on its
own copy of the tape file's bytes) against zero_grad + forward + backward + Adam step in
torch.  Both sides run ``--threads`` threads (gradtool.native.set_num_threads /
torch.set_num_threads).  Step figures are medians (and bests) over ``--repeats`` runs of
``--steps`` steps (``--big-steps`` for gpt and resnet), the engines' runs interleaved
(bench_common.time_interleaved) so that all see the same machine load, in one process
(PyTorch's OpenMP threads spin on the other core for a moment after each of its calls, so
gradtool's first products after a torch run may find a worker descheduled; the product
pool then runs serially for 1 ms, doubling only while that repeats, docs/cpu-kernels.md:
at most a step's worth, where until step32 a count of up to 4096 serial products kept
whole runs on one thread -- in separate processes the same spinning would meet the same
first step, so one process it stays, and nothing here slows PyTorch); the products are
bench_matmul's samples (one call between two runs of the FMA peak loop).  Every gradtool
engine of a workload runs the same steps on the same batches, so their parameters must
end on the same bits: checked after the timing, a difference is reported (exit 1).  The
CPU (lscpu) and the load average at the start and the end are printed, with a note when
the load says other work competes for the threads' cores (on a busy 2-core machine PyTorch's
two OpenMP threads run 5-30x slower than one: compare with ``--threads 1``).  A benchmark,
not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (LR, POOL, ROOT, SHAPES, cpu_name, gradtool_mlp,  # noqa: E402
                          load_average, make_problem, mlp_name, time_interleaved,
                          torch_mlp_loss)
from bench_matmul import SHAPES as PRODUCT_SHAPES  # noqa: E402
from bench_matmul import Peak, operands, sampled, warm_up  # noqa: E402
from bench_ae import TorchAutoencoder  # noqa: E402

import gradtool.ops  # noqa: E402,F401  (numerics' float32 twin)
from gradtool import native, numerics32  # noqa: E402
from gradtool.convert import to_dtype  # noqa: E402
from gradtool.optim import make_optimizer  # noqa: E402
from gradtool.tapefile import dumps, load  # noqa: E402
from gradtool.train import make_engine  # noqa: E402

WORKLOADS = ("mlp", "ae", "gpt", "resnet", "products")
AE_TAPE = ROOT / "samples" / "autoencoder" / "ae.msgpack"
AE_DATA = ROOT / "samples" / "autoencoder" / "ae_data.npz"
GPT_DIR = ROOT / "samples" / "tiny_gpt"
GPT_LR = 3e-3                       # samples/tiny_gpt/record.py's meta["train"]
RESNET_BATCH, RESNET_LR = 16, 1e-3

# issue 38's targets: (workload, engine) -> the largest ratio gradtool time / torch time
TARGETS = {("784-256-10", "host"): 0.8, ("784-256-10", "cpu"): 1.0,
           ("64-128-10", "host"): 0.8, ("autoencoder", "host"): 0.4,
           ("tiny_gpt", "host"): 1.0, ("resnet", "host"): 1.5}
PEAK_TARGET = 0.85                  # the large f32 products: share of the FMA peak
# the products timed: 1024^3 and the 784-256-10 step's large products (bench_matmul's rows)
PRODUCTS = [row for row in PRODUCT_SHAPES
            if row[0].strip() in ("square 1024", "784-256-10 fwd 1     X@W1",
                                  "784-256-10 dW1     X^T@G1")]


# ── gradtool's side ────────────────────────────────────────────────────────

class GradtoolStep:
    """One engine's step on its own tape: ``step(i)`` fills the slots with batch ``i``
    (cycled) and trains one step; :meth:`params` reads the parameters back."""

    def __init__(self, tape, loss_id, opt, slots, batches, backend, fuse=False):
        self.tape, self.opt, self.slots, self.batches = tape, opt, slots, batches
        self.engine = make_engine(backend, tape, loss_id, opt,
                                  **({"fuse": True} if fuse else {}))

    def __call__(self, i):
        for node_id, value in zip(self.slots, self.batches[i % len(self.batches)]):
            self.engine.set_input(node_id, value)
        self.engine.train_step()

    def params(self) -> list:
        self.engine.finish()
        return [self.tape.values[e.node_id].copy() for e in self.opt.entries]


def tape_step(raw: bytes, slot_names, batches, lr, backend, fuse=False) -> GradtoolStep:
    """An engine over a fresh load of the tape file ``raw`` (as `gradtool train` reads
    it), Adam(lr) on every param, the named input slots filled from ``batches``."""
    tf = load(raw)
    tape = tf.tape
    named = {tape.nodes[v.id].name: v.id for v in tape.input_slots()}
    opt = make_optimizer("adam", lr)
    for p in tape.params():
        opt.add(tape, p)
    if tape.values[tf.loss.id].dtype != np.float32:
        raise SystemExit(f"bench_f32: the tape's loss is {tape.values[tf.loss.id].dtype}, "
                         f"not float32")
    return GradtoolStep(tape, tf.loss.id, opt, [named[n] for n in slot_names], batches, backend,
                        fuse)


def mlp_step(params, xs, ys, backend, fuse=False) -> GradtoolStep:
    tp, x, y, loss, opt = gradtool_mlp(params, xs, ys)
    assert tp.values[loss.id].dtype == np.float32
    return GradtoolStep(tp, loss.id, opt, [x.id, y.id], list(zip(xs, ys)), backend, fuse)


def same_bits(steps) -> bool:
    """Whether every engine's parameters equal the first's, bit for bit."""
    ref = steps[0].params()
    return all(len(p) == len(ref) and all(
        a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
        for a, b in zip(p, ref)) for p in (s.params() for s in steps[1:]))


# ── torch's side ───────────────────────────────────────────────────────────

def torch_module_step(torch, module, batches, lr):
    """torch float32 eager + torch.optim.Adam on ``module(*batch)`` (its scalar loss)."""
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    tb = [tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in b) for b in batches]

    def step(i):
        opt.zero_grad()
        module(*tb[i % len(tb)]).backward()
        opt.step()
    return step


def torch_mlp_step(torch, params, xs, ys):
    xs, ys = torch.from_numpy(xs), torch.from_numpy(ys)
    ws = [torch.tensor(p, dtype=torch.float32, requires_grad=True) for p in params]
    opt = torch.optim.Adam(ws, lr=LR)

    def step(i):
        opt.zero_grad()
        torch_mlp_loss(torch, ws, xs[i % POOL], ys[i % POOL]).backward()
        opt.step()
    return step


def resnet_module(torch):
    """The ResNet-style CNN: stem conv3x3(3->16) + BN + relu, then three stages of one
    basic block each (16, 32 and 64 channels; the second and third stride 2 with a 1x1
    conv + BN shortcut), global mean, linear 64->10; the module returns the mean
    cross-entropy.  Seeded; BatchNorm in train mode."""
    nn, F = torch.nn, torch.nn.functional

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                           nn.BatchNorm2d(cout))

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return F.relu(out + (x if self.short is None else self.short(x)))

    class ResNet(nn.Module):
        def __init__(self, classes=10):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False),
                                      nn.BatchNorm2d(16), nn.ReLU())
            self.stages = nn.Sequential(Basic(16, 16, 1), Basic(16, 32, 2), Basic(32, 64, 2))
            self.fc = nn.Linear(64, classes)

        def forward(self, x, y):
            h = self.stages(self.stem(x))
            return F.cross_entropy(self.fc(h.mean(dim=(2, 3))), y)

    torch.manual_seed(0)
    return ResNet().train()


# ── the workloads: each returns its rows ───────────────────────────────────

def rows_of(workload, names, steps, timed, gradtool_count):
    """Rows for one interleaved timing; the last step function is torch's (when there)."""
    has_torch = len(names) > gradtool_count
    ref = timed[-1][0] if has_torch else None
    rows = []
    bits = same_bits(steps[:gradtool_count]) if gradtool_count > 1 else None
    for name, (median, best) in zip(names, timed):
        ratio = median / ref if ref else None
        target = TARGETS.get((workload, name))
        rows.append({"workload": workload, "engine": name, "median_ms": median * 1e3,
                     "best_ms": best * 1e3, "ratio_to_torch": ratio, "target": target,
                     "met": (ratio <= target) if (ratio is not None and target) else None,
                     "same_bits": bits if name in names[:gradtool_count] else None})
    return rows


def bench_mlp(torch, args) -> list:
    rows = []
    for shape in sorted(SHAPES, key=lambda s: -s[0]):           # 784-256-10 first
        params, xs, ys = make_problem(shape)
        params = [p.astype(np.float32) for p in params]
        xs, ys = xs.astype(np.float32), ys.astype(np.float32)
        names = ["cpu", "host", "host --fuse"]
        steps = [mlp_step(params, xs, ys, "cpu"), mlp_step(params, xs, ys, "host"),
                 mlp_step(params, xs, ys, "host", fuse=True)]
        fns = steps + ([torch_mlp_step(torch, params, xs, ys)] if torch else [])
        timed = time_interleaved(fns, args.steps, args.repeats)
        rows += rows_of(mlp_name(shape), names + ["torch f32 eager"], steps, timed, len(steps))
    return rows


def bench_ae(torch, args) -> list:
    raw_f64 = AE_TAPE.read_bytes()
    source = load(raw_f64, name=str(AE_TAPE))
    tape, ids = to_dtype(source.tape, "f32")
    raw = dumps(tape, loss=ids[source.loss.id], meta=source.meta)
    batch = source.meta["config"]["batch"]
    lr = float(source.meta["train"]["lr"])
    data = np.load(AE_DATA)["x"].astype(np.float32)      # rounded once, as `gradtool train`
    batches = [(data[i:i + batch],) for i in range(0, len(data) - batch + 1, batch)]
    steps = [tape_step(raw, ["x"], batches, lr, b) for b in ("cpu", "host")]
    fns = list(steps)
    if torch:                         # bench_ae's network, init and batch order, in float32
        fns.append(TorchAutoencoder(torch, raw_f64, np.load(AE_DATA)["x"], "cpu", optim=True,
                                    dtype=torch.float32).episode)
    timed = time_interleaved(fns, args.steps, args.repeats)
    return rows_of("autoencoder", ["cpu", "host", "torch f32 eager"], steps, timed, len(steps))


def bench_gpt(torch, args) -> list:
    sys.path.insert(0, str(GPT_DIR))
    from model import build, dataset
    from gradtool.interop.torch import import_module
    model, inputs = build()
    result = import_module(model, inputs, dtype="f32")
    raw = dumps(result.tape, loss=result.loss)
    names = list(result.inputs)                              # idx, targets
    _, idx, tgt = dataset()
    b = inputs[0].shape[0]
    batches = [(idx[i:i + b], tgt[i:i + b]) for i in range(0, len(idx) - b + 1, b)]
    steps = [tape_step(raw, names, batches, GPT_LR, e) for e in ("cpu", "host")]
    fns = steps + ([torch_module_step(torch, copy.deepcopy(model).float(), batches, GPT_LR)]
                   if torch else [])
    timed = time_interleaved(fns, args.big_steps, args.repeats)
    return rows_of("tiny_gpt", ["cpu", "host", "torch f32 eager"], steps, timed, len(steps))


def resnet_problem(torch) -> tuple:
    """(the module, its f32 tape file's bytes, the input slots' names, four batches):
    the ResNet workload, imported at f32 (scripts/profile_f32.py times it too)."""
    from gradtool.interop.torch import import_module
    model = resnet_module(torch)
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((RESNET_BATCH, 3, 32, 32)).astype(np.float32),
                rng.integers(0, 10, RESNET_BATCH).astype(np.int64)) for _ in range(4)]
    example = tuple(torch.from_numpy(a) for a in batches[0])
    result = import_module(copy.deepcopy(model), example, dtype="f32")
    return model, dumps(result.tape, loss=result.loss), list(result.inputs), batches


def bench_resnet(torch, args) -> list:
    model, raw, names, batches = resnet_problem(torch)       # names: x, y
    steps = [tape_step(raw, names, batches, RESNET_LR, e) for e in ("host", "cpu")]
    fns = steps + ([torch_module_step(torch, model, batches, RESNET_LR)] if torch else [])
    timed = time_interleaved(fns, args.big_steps, args.repeats)
    return rows_of("resnet", ["host", "cpu", "torch f32 eager"], steps, timed, len(steps))


def bench_products(torch, args) -> list:
    """numerics32.matmul and torch.mm (float32) per product and thread count: GFLOP/s of
    the median time, and the median share of the float32 FMA peak (bench_matmul.sampled)."""
    tmp = tempfile.TemporaryDirectory()
    peak = Peak(Path(tmp.name), "float32")
    if not peak.ok:
        print("bench_f32: no C compiler for the peak loop: the products' %peak is skipped",
              file=sys.stderr)
    else:
        warm_up(peak)
        core = statistics.median(peak.gflops("fast", 0.02) for _ in range(5))
        print(f"# float32 FMA peak loop, one core, at the start: {core:.1f} GFLOP/s "
              f"(median of 5 x 0.02 s after a 0.5 s warm-up)")
    native.keep_freed_memory()            # as the training engine has it
    rng = np.random.default_rng(0)
    rows = []
    for label, m, k, n, at, bt in PRODUCTS:
        a, b = operands(rng, m, k, n, at, bt, np.float32)
        fns = {"gradtool": lambda: numerics32.matmul(a, b)}
        if torch:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            fns["torch"] = lambda: torch.mm(ta, tb)
        flop = 2.0 * m * k * n
        for threads in sorted({1, args.threads}):
            native.set_num_threads(threads)
            if torch:
                torch.set_num_threads(threads)
            times = {name: [] for name in fns}
            fracs = {name: [] for name in fns}
            for _ in range(args.repeats):                     # interleaved
                for name, fn in fns.items():
                    t, f = sampled(fn, peak, args.samples, flop, threads, args.min_sample)
                    times[name] += t
                    fracs[name] += f
            for name in fns:
                med = statistics.median(times[name])
                rows.append({"product": label.strip(), "M": m, "K": k, "N": n,
                             "library": name, "threads": threads, "median_ms": med * 1e3,
                             "gflops": flop / med / 1e9,
                             "peak_share": statistics.median(fracs[name])
                             if fracs[name] else None})
    native.set_num_threads(args.threads)
    if torch:
        torch.set_num_threads(args.threads)
    return rows


# ── the report ─────────────────────────────────────────────────────────────

def print_steps(rows) -> None:
    print(f"{'workload':<12} {'engine':<16} {'median ms':>10} {'best ms':>9} {'x torch':>8} "
          f"{'target':>7} {'met':>4} {'same bits':>9}")
    for r in rows:
        ratio = f"{r['ratio_to_torch']:.2f}x" if r["ratio_to_torch"] is not None else "-"
        target = f"<={r['target']}" if r["target"] else ""
        met = {True: "yes", False: "NO", None: ""}[r["met"]]
        bits = {True: "yes", False: "NO", None: ""}[r["same_bits"]]
        print(f"{r['workload']:<12} {r['engine']:<16} {r['median_ms']:>10.3f} "
              f"{r['best_ms']:>9.3f} {ratio:>8} {target:>7} {met:>4} {bits:>9}")


def print_products(rows) -> None:
    print(f"{'product':<28} {'library':<9} {'threads':>7} {'median ms':>10} {'GFLOP/s':>8} "
          f"{'%peak':>6} {'target':>7}")
    for r in rows:
        share = f"{100 * r['peak_share']:.0f}%" if r["peak_share"] else "-"
        target = f">={100 * PEAK_TARGET:.0f}%" if r["library"] == "gradtool" else ""
        print(f"{r['product']:<28} {r['library']:<9} {r['threads']:>7} {r['median_ms']:>10.3f} "
              f"{r['gflops']:>8.1f} {share:>6} {target:>7}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="interleaved runs (median)")
    ap.add_argument("--steps", type=int, default=30, help="steps per run: mlp, ae")
    ap.add_argument("--big-steps", type=int, default=8, help="steps per run: gpt, resnet")
    ap.add_argument("--threads", type=int, default=2, help="threads, gradtool and torch")
    ap.add_argument("--samples", type=int, default=4,
                    help="products: samples per repeat, library and thread count")
    ap.add_argument("--min-sample", type=float, default=2e-4,
                    help="products: seconds of back-to-back calls a sample lasts at least")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"comma-separated, from {', '.join(WORKLOADS)}")
    ap.add_argument("--json", dest="json_path", help="also write every figure to this file")
    args = ap.parse_args(argv)
    chosen = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)} (choose from {', '.join(WORKLOADS)})")
    if min(args.repeats, args.steps, args.big_steps, args.samples, args.threads) < 1:
        ap.error("--repeats, --steps, --big-steps, --samples and --threads must be >= 1")
    warnings.simplefilter("ignore")
    native.set_num_threads(args.threads)
    try:
        import torch
        torch.set_num_threads(args.threads)
        torch_note = f"torch {torch.__version__} float32 eager + torch.optim.Adam"
    except ImportError:
        torch, torch_note = None, "torch not installed: no torch rows, no ratios"
        chosen = [w for w in chosen if w not in ("gpt", "resnet")]
    report = {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": args.threads,
              "torch": torch_note, "load_start": load_average(), "repeats": args.repeats,
              "steps": args.steps, "big_steps": args.big_steps, "workloads": chosen}
    print(f"# {report['cpu']} ({report['cores']} cores); {args.threads} threads each; "
          f"{torch_note}")
    print(f"# load average at the start: {report['load_start']}")
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if args.threads > 1 and busy > max(0, (os.cpu_count() or 1) - args.threads) + 0.5:
        print(f"# note: the machine is busy (load {busy:.2f}, {os.cpu_count()} cores, "
              f"{args.threads} threads asked for): a thread that waits for a descheduled "
              f"one slows the threaded figures, PyTorch's OpenMP steps most; compare with "
              f"--threads 1")
    print(f"# steps: medians of {args.repeats} interleaved runs of {args.steps} steps "
          f"({args.big_steps} for tiny_gpt, resnet); ratio = gradtool time / torch time",
          flush=True)
    step_rows = []
    for name, fn in (("mlp", bench_mlp), ("ae", bench_ae), ("gpt", bench_gpt),
                     ("resnet", bench_resnet)):
        if name in chosen:
            step_rows += fn(torch, args)
    if step_rows:
        print_steps(step_rows)
    product_rows = []
    if "products" in chosen:
        print(f"# products, float32: medians of {args.repeats} x {args.samples} samples; %peak "
              f"= median share of (threads x) one core's f32 FMA peak loop run around each",
              flush=True)
        product_rows = bench_products(torch, args)
        print_products(product_rows)
    report["load_end"] = load_average()
    print(f"# load average at the end: {report['load_end']}")
    report["step_rows"], report["product_rows"] = step_rows, product_rows
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report, indent=1) + "\n")
    differ = [f"{r['workload']} {r['engine']}" for r in step_rows if r["same_bits"] is False]
    if differ:
        print(f"bench_f32: the engines' parameters differ after the same steps: "
              f"{', '.join(differ)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
