"""Fused episodes (gradtool/device/fusion.py) on the host backend: the same bits as the
per-node replay and the CPU tape, in every kernel variant, including the reversed-thread
race detector; the plan; the generated source under nvcc; the f32 gate.

The fused kernels are the GPU's code (one thread's body per element, a block per row,
barriers); the host build runs each barrier-separated segment over the block's threads,
in order or (per-thread-reversed) last to first, so a missing barrier gives other bits
(test_dropping_a_barrier_is_caught).
"""

import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import gradtool as gt
from conftest import assert_bits_equal, assert_bits_equal_nan_any
from gradtool.cli import main
from gradtool.device import CaptureError, capture
from gradtool.device.cuda import cuda_status, fused_source, nvcc_options
from gradtool.device.engine import F32_BOUND, fusion_plan, relative_error
from gradtool.device.fusion import render
from gradtool.device.host import HostBackend, Staging
from gradtool.optim import AdamSeed as Adam
from gradtool.tapefile import load
from support import (assert_fma_only_in_inner_products, perturb_leaves, random_graph, random_unary,
                     weighted_loss)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))          # f32_gate.py
SAMPLES = sorted((ROOT / "samples").rglob("*.msgpack"))     # the f32 samples too
AE = ROOT / "samples" / "autoencoder" / "ae.msgpack"
AE_DATA = ROOT / "samples" / "autoencoder" / "ae_data.npz"
VARIANTS = ["tiled", "per-thread", "per-thread-reversed"]
NVCC = shutil.which("nvcc")
OK, WHY = cuda_status()
needs_gpu = pytest.mark.skipif(not OK, reason=f"no CUDA backend here: {WHY}")

# every op the random (f64) graphs exercise: cast runs only in an f32 program, as a copy
# of whole numbers or of a draw (tests/test_device_f32.py); any other cast is refused
DEVICE_OPS = set(gt.OP_NAMES) - {"cast"}


def assert_fused_matches(tp, loss, rng, kernels="tiled", dtype=None, optimizer=None,
                         backend="host", graph=True):
    """Fused forward + backward == the CPU tape (every node's value and gradient, to the
    bit) after new leaf values (so a stale read cannot pass); returns the replay.
    ``dtype`` None: the tape's own (f64 or f32, compared); "f32" of an f64 tape: its
    rounded copy, not compared here."""
    rp = capture(tp, loss, backend, dtype, host_kernels=kernels, fuse=True, optimizer=optimizer,
                 graph=graph)
    perturb_leaves(tp, rp, rng)
    with np.errstate(all="ignore"):
        tp.forward()
        tp.zero_grad()
        tp.backward(tp.var(loss))
    rp.forward()
    rp.backward()
    rp.backward()       # idempotent: it starts by zeroing the gradients
    for i in range(len(tp.nodes)):
        what = f"node {i} ({tp.nodes[i].op})"
        want = tp.grads[i] if tp.grads[i] is not None else np.zeros(tp.values[i].shape)
        if dtype in (None, "f64"):
            assert_bits_equal(rp.value(i), tp.values[i], what + " value")
            assert_bits_equal(rp.grad(i), want, what + " grad")
    return rp


# ── random graphs the fusion pass groups ──────────────────────────────────

def random_row_graph(rng):
    """A random run of row-local nodes (matmuls by leaves, biases and column vectors of
    every broadcast shape, unary ops, activations combined), broken now and then by a
    node outside the fusion classes, ending in a loss chain.  -> (tape, loss)."""
    tp = gt.Tape()
    rows = int(rng.choice([1, 2, 3, 5, 8]))
    width = int(rng.integers(1, 6))
    deep = rng.random() < 0.25                      # rank 3: [rows, 2, width]
    shape = (rows, 2, width) if deep else (rows, width)
    x = tp.const(rng.uniform(-1.0, 1.0, shape), name="x") if rng.random() < 0.7 else \
        tp.param(rng.uniform(-1.0, 1.0, shape))
    acts = [x]
    h = x

    def leaf(s, const=None):
        const = rng.random() < 0.2 if const is None else const
        data = rng.uniform(0.5, 1.5, s) * rng.choice([-1.0, 1.0], s)
        return tp.const(data) if const else tp.param(data, l2=float(rng.choice([0.0, 1e-3])))

    def positive(v):
        return tp.adds(tp.sigmoid(v), 0.5)

    for _ in range(int(rng.integers(4, 13))):
        kind = rng.choice(["matmul", "bias", "column", "unary", "unary", "combine", "other"],
                          p=[0.2, 0.2, 0.1, 0.2, 0.1, 0.1, 0.1])
        s = tuple(h.shape)
        if kind == "matmul" and len(s) == 2:
            h = h @ leaf((s[1], int(rng.integers(1, 6))), const=rng.random() < 0.15)
        elif kind in ("bias", "matmul"):
            cands = [(1,) * (len(s) - 1) + s[-1:], s[-1:], (1,), s[1:], (1,) * len(s)]
            b = leaf(cands[int(rng.integers(len(cands)))])
            op = rng.choice(["add", "sub", "mul", "div"])
            if op == "div":
                b = positive(b) if rng.random() < 0.5 else b
            h = getattr(tp, op)(h, b) if rng.random() < 0.8 else getattr(tp, op)(b, h)
        elif kind == "column":
            v = leaf(s[:1] + (1,) * (len(s) - 1))
            h = getattr(tp, rng.choice(["add", "mul", "sub"]))(v, h)
        elif kind == "unary":
            h = random_unary(tp, rng, h)
        elif kind == "combine":
            other = [a for a in acts if tuple(a.shape) == s]
            h = getattr(tp, rng.choice(["add", "mul", "sub"]))(
                h, other[int(rng.integers(len(other)))])
        else:
            pick = rng.choice(["softmax", "transpose", "scaled", "reshape"])
            if pick == "softmax":
                h = tp.softmax(h, axis=len(s) - 1)
            elif pick == "transpose" and len(s) == 2:
                h = tp.transpose(tp.transpose(h))
            elif pick == "scaled":
                h = h * tp.mean(h)                      # a computed scalar read by every row
            else:
                h = tp.reshape(h, list(s))
        acts.append(h)
    loss = weighted_loss(tp, h, rng)
    for v in [acts[int(i)] for i in rng.choice(len(acts), size=2)]:
        loss = loss + tp.muls(tp.sum(v * v), 0.25)
    return tp, loss


def test_row_graphs_fuse():
    """The generator exercises the fusion classes: most graphs get row and param kernels."""
    kinds = set()
    fused = 0
    for seed in range(20):
        tp, loss = random_row_graph(np.random.default_rng(seed))
        plan = fusion_plan(tp, loss).fusion
        kinds |= {k.kind for k in plan.kernels}
        fused += bool(plan.kernels)
    assert kinds >= {"rows", "serial", "params"} and fused >= 15, (kinds, fused)


@pytest.mark.parametrize("kernels", VARIANTS)
def test_random_graphs_bit_exact(kernels):
    """100 random graphs (60 built for the fusion classes, 40 over every op), fused, in
    every host kernel variant: every node's value and gradient is the CPU tape's."""
    seen = set()
    for seed in range(60):
        rng = np.random.default_rng(1000 + seed)
        tp, loss = random_row_graph(rng)
        assert_fused_matches(tp, loss, rng, kernels=kernels)
    for seed in range(400):              # 40 graphs, then more until every op was seen
        if seed >= 40 and seen >= DEVICE_OPS:
            break
        rng = np.random.default_rng(seed)
        tp, loss = random_graph(rng)
        seen |= {n.op for n in tp.nodes}
        assert_fused_matches(tp, loss, rng, kernels=kernels)
    assert seen >= DEVICE_OPS


@pytest.mark.parametrize("kernels", ["tiled", "per-thread-reversed"])
@pytest.mark.parametrize("rows", [1, 3, 4, 6, 9])
def test_host_groups_of_rows_and_elements_bit_exact(rows, kernels, rng):
    """The host build runs a block kernel's rows, and a param kernel's elements, four at
    a time, their matmul chains interleaved over k (gt_fused.h): a two-layer MLP whose
    rows (1, 3, 4, 6, 9) and weight gradients (35 and 21 elements) leave whole and
    partial groups gives the CPU tape's bits, in order and walked last to first."""
    tp = gt.Tape()
    x = tp.const(rng.uniform(-1.0, 1.0, (rows, 5)), name="x")
    w1, b1 = tp.param(rng.uniform(-1.0, 1.0, (5, 7))), tp.param(rng.uniform(-1.0, 1.0, (7,)))
    w2 = tp.param(rng.uniform(-1.0, 1.0, (7, 3)))
    loss = weighted_loss(tp, tp.tanh(x @ w1 + b1) @ w2, rng)
    plan = fusion_plan(tp, loss).fusion
    kinds = {k.kind for k in plan.kernels}
    assert "rows" in kinds and (rows == 1 or "params" in kinds), kinds
    assert "GT_MATMUL_GROUP" in plan.source
    assert_fused_matches(tp, loss, rng, kernels=kernels)


# ── the samples, the autoencoder, training ────────────────────────────────

def adam_on(tp, lr=0.003, clip=0.0):
    opt = Adam(lr)
    for p in tp.params():
        opt.add(tp, p)
    if clip:
        opt.set_clip(clip)
    return opt


@pytest.mark.parametrize("kernels", VARIANTS)
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_every_sample_bit_exact_with_an_adam_step(sample, kernels, rng):
    """Every node's value and gradient, then the params after one Adam step: the CPU tape's
    bits (the check helpers of `replay-gpu --check`, plus every node)."""
    from gradtool.device.engine import check_step
    from gradtool.optim import optimizer_from_state

    tf = load(sample)
    tp = tf.tape
    opt = adam_on(tp)
    cpu_opt = optimizer_from_state(tp, opt.state_dict())
    rp = assert_fused_matches(tp, tf.loss.id, rng, kernels=kernels, optimizer=opt)
    items = check_step(rp, tp, cpu_opt)
    assert items and all(it["ulps"] == 0.0 for it in items), items


def test_autoencoder_is_eight_launches():
    """47 per-node launches per training episode become 8: forward (row kernel, mean),
    backward (zero fill, seed + mean backward, row kernel, param kernel), optimizer
    (guard, every Adam update)."""
    tf = load(AE)
    prog = fusion_plan(tf.tape, tf.loss.id, optimizer=adam_on(tf.tape))
    assert sum(prog.fusion.unfused.values()) == 47
    assert prog.count() == 8 <= 8
    assert {ph: len(prog.launches[ph]) for ph in prog.launches} == \
        {"forward": 2, "backward": 4, "optimizer": 2}
    rows = [k for k in prog.fusion.kernels if k.kind == "rows"]
    assert [k.rows for k in rows] == [200, 200]
    # the forward row kernel holds every node from the first matmul to the squared error
    assert [m.node for m in rows[0].members] == [3, 4, 5, 8, 9, 10, 13, 14, 15, 18, 19, 20, 21]
    params = [k for k in prog.fusion.kernels if k.kind == "params"][0]
    assert [s.size for s in params.segments] == [6, 384, 64, 2048, 32, 2048, 64, 384]


def test_autoencoder_trains_50_steps_with_clip_like_the_cpu(tmp_path):
    """50 Adam steps with a clip that binds sometimes, through `gradtool train`'s Trainer:
    --backend host --fuse saves the same file, byte for byte, as --backend cpu."""
    from gradtool.train import TrainOptions, Trainer

    saved = {}
    for backend, fuse in (("cpu", False), ("host", True)):
        out = tmp_path / f"{backend}.msgpack"
        options = TrainOptions(steps=50, epochs=10, clip=0.05, backend=backend, fuse=fuse,
                               save=str(out))
        trainer = Trainer(load(AE), str(AE_DATA), options)
        result = trainer.run()
        assert result.stopped == "steps", result.stopped
        saved[backend] = out.read_bytes()
        if fuse:
            assert trainer.engine.replay.launches() == 8       # the clip norm joins the guard
    assert saved["cpu"] == saved["host"]
    # the clip binds in some of these steps and not in others (the norm kernel's verdict)
    tf = load(AE)
    tp = tf.tape
    rp = capture(tp, tf.loss, "host", optimizer=adam_on(tp, clip=0.05), fuse=True)
    data = np.load(AE_DATA)["x"]
    clipped = 0
    for s in range(50):
        rp.set_input(tp.input_slots()[0], data[(s % 6) * 200:(s % 6 + 1) * 200])
        rp.episode(train=True)
        clipped += rp.dev.scalar(rp.program.ctl_off + 2) == 1.0
    assert 0 < clipped < 50, clipped


def test_a_program_that_fuses_nothing_runs_as_before():
    """Nodes outside the fusion classes keep their per-node launches; with nothing to fuse
    the program is the per-node one: no source, no library, the same launches."""
    tp = gt.Tape()
    x = tp.param(np.arange(6.0).reshape(2, 3) / 7.0)
    y = tp.softmax(tp.transpose(x), axis=0)
    loss = tp.reshape(tp.slice(y, [1, 0], [2, 1]), [1])
    plan = fusion_plan(tp, loss)
    from gradtool.device.program import capture_program
    base = capture_program(tp, loss.id)
    assert plan.fusion.kernels == [] and plan.fusion.source == ""
    assert plan.launches == base.launches
    rp = capture(tp, loss, "host", fuse=True)
    assert rp.dev.fusion_build is None
    rp.forward()
    rp.backward()
    tp.backward(loss)
    assert_bits_equal(rp.grad(x), tp.grad(x), "grad x")


def test_plan_text_names_every_node():
    tf = load(AE)
    prog = fusion_plan(tf.tape, tf.loss.id, optimizer=adam_on(tf.tape))
    text = "\n".join(prog.fusion.describe(prog))
    assert "47 launches per episode -> 8" in text
    for i, node in enumerate(tf.tape.nodes):
        if node.a >= 0:
            assert re.search(rf"\b{i}:{node.op}\b", text), (i, node.op)


# ── barriers: the race detector is real ───────────────────────────────────

def run_with_source(prog, tp, source, kernels):
    """One forward + backward of ``prog`` with its fused kernels built from ``source``,
    after new leaf values; the whole arena."""
    program = replace(prog, fusion=replace(prog.fusion, source=source))
    dev = HostBackend(program, kernels)
    rng = np.random.default_rng(0)
    for i, node in enumerate(tp.nodes):
        if node.a < 0:            # new inputs: stale reads would see the captured values
            dev.write(prog.val_off[i], tp.values[i] * rng.uniform(0.5, 1.5, tp.values[i].shape))
    dev.run("forward", "backward")
    return dev.arena.view(np.uint64).copy()


@pytest.mark.parametrize("sample", ["autoencoder/ae", "digits_mlp", "mlp_regression"])
def test_dropping_a_barrier_is_caught(sample):
    """Every barrier the pass places is needed: leave any one out of the generated source
    and the host run gives other bits, in thread order or (the race detector) last thread
    first; and some are caught by the reversed walk alone (a value thread 0 writes and the
    others read: in thread order thread 0 always comes first)."""
    tf = load(ROOT / "samples" / f"{sample}.msgpack")
    prog = fusion_plan(tf.tape, tf.loss.id)
    good = run_with_source(prog, tf.tape, prog.fusion.source, "tiled")
    assert np.array_equal(good, run_with_source(prog, tf.tape, prog.fusion.source,
                                                "per-thread-reversed"))
    barriers, reversed_only = 0, 0
    for k in prog.fusion.kernels:
        for b in range(1, k.barriers + 1):
            racy = render(prog.fusion, drop_barriers={(k.name, b)})
            assert racy != prog.fusion.source
            caught = [not np.array_equal(good, run_with_source(prog, tf.tape, racy, v))
                      for v in ("tiled", "per-thread-reversed")]
            assert any(caught), (k.name, b)
            reversed_only += caught == [False, True]
            barriers += 1
    assert barriers >= 2 and reversed_only >= 1


# ── float32 ───────────────────────────────────────────────────────────────

@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_f32_fused_equals_f32_per_node(sample):
    """In float32 the fused kernels give the per-node float32 replay's bits (same bodies,
    same orders), which are the f32 copy's CPU reference bits (rounded_tape), within the
    documented bound of the CPU tape.  A sample whose draws feed float64 arithmetic has
    a mixed f32 copy: refused in one line."""
    from gradtool.device import rounded_tape, tape_dtype
    tf = load(sample)
    tp = tf.tape
    copy = rounded_tape(tp, "f32")
    try:
        tape_dtype(copy)
    except CaptureError as exc:
        assert "float64 values" in str(exc)
        with pytest.raises(CaptureError, match="one float dtype per tape"):
            capture(tp, tf.loss.id, "host", "f32")
        return
    copy.backward(copy.var(tf.loss.id))
    runs = []
    for fuse in (False, True):
        rp = capture(tp, tf.loss.id, "host", "f32", fuse=fuse)
        rp.forward()
        rp.backward()
        runs.append([rp.value(i) for i in range(len(tp.nodes))] +
                    [rp.grad(p) for p in tp.params()])
    for a, b in zip(*runs, strict=True):
        assert_bits_equal(a, b)
    want = copy.values + [copy.grad(p) for p in copy.params()]
    for i, (a, b) in enumerate(zip(runs[0], want, strict=True)):
        assert_bits_equal_nan_any(a, b, f"f32 copy's reference, item {i}")
    tp.zero_grad()
    tp.backward(tf.loss)
    assert relative_error(runs[1][tf.loss.id], tp.values[tf.loss.id]) <= F32_BOUND


def test_f32_uploads_convert_on_the_device(monkeypatch):
    """float64 data goes through the staging area and k_from_f64: the arena holds what
    numpy's astype(float32) gives (round to nearest even), also piece by piece."""
    monkeypatch.setattr(Staging, "LIMIT", 7)
    rng = np.random.default_rng(5)
    tp = gt.Tape()
    data = rng.standard_normal((5, 9))
    data[0, :4] = [1.0 + 2.0 ** -24, 1.0 + 3 * 2.0 ** -24, 3.4e38 * 1.5, 1e-45]
    x = tp.const(data, name="x")
    loss = tp.sum(tp.mul(x, x))
    rp = capture(tp, loss, "host", "f32")
    assert rp.dev.staging.chunk == 7
    new = rng.standard_normal((5, 9))
    new[1, :3] = [np.nextafter(1.0, 2.0), -0.0, np.inf]
    for arr in (data, new):
        rp.set_input(x, arr)
        with np.errstate(over="ignore"):
            want = arr.astype(np.float32).astype(np.float64)
        assert_bits_equal(rp.value(x), want, "uploaded")


def test_f32_gate_autoencoder_30_adam_steps():
    """The seed design's gate: 30 Adam steps of the autoencoder in f32 and f64, fused and
    per-node; worst relative gap <= 1e-5 on the loss trajectory, <= 4e-4 on the final
    params (docs/device.md has the measured figures: `python scripts/f32_gate.py`)."""
    from f32_gate import LOSS_BOUND, PARAM_BOUND, gaps, run_autoencoder

    runs = {(dt, fuse): run_autoencoder(dt, fuse) for dt in ("f64", "f32")
            for fuse in (False, True)}
    for dt in ("f64", "f32"):        # fusion changes no bit, in either precision
        assert_bits_equal(runs[dt, True][0], runs[dt, False][0], f"{dt} losses")
        for a, b in zip(runs[dt, True][1], runs[dt, False][1]):
            assert_bits_equal(a, b, f"{dt} params")
    loss_gap, param_gap = gaps(runs["f32", True], runs["f64", True])
    assert 0.0 < loss_gap <= LOSS_BOUND and 0.0 < param_gap <= PARAM_BOUND, (loss_gap, param_gap)


# ── the generated CUDA source ─────────────────────────────────────────────

LANE_TREE_KERNELS = ("k_sum", "k_clip_norm", "k_softmax", "k_log_softmax")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("dtype", ["f64", "f32"])
def test_fused_source_compiles_with_nvcc(dtype, tmp_path):
    """What the cuda backend hands SourceModule for the autoencoder's and the LoRA block's
    fused kernels: nvcc --cubin -arch=sm_90, no warning, every fused kernel an unmangled
    entry, no stack frame (the constant arrays fold away; float32's lane-tree sums keep
    their partials in one), fma.rn exactly in the kernels
    that run a matmul phase (the FMA chain) and in no other."""
    for name in ("autoencoder/ae", "lora_block/block"):
        tf = load(ROOT / "samples" / f"{name}.msgpack")
        prog = fusion_plan(tf.tape, tf.loss.id, dtype, optimizer=adam_on(tf.tape))
        (tmp_path / "fused.cu").write_text(fused_source(prog.fusion))
        opts = [*nvcc_options(dtype), "-arch", "sm_90"]
        cubin = subprocess.run([NVCC, "--cubin", *opts, "-Xptxas", "-v", "fused.cu"],
                               cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert cubin.returncode == 0, cubin.stderr
        assert "warning" not in (cubin.stdout + cubin.stderr).lower(), cubin.stderr
        frames = dict(re.findall(r"Function properties for (\w+)\n\s*(\d+) bytes stack frame",
                                 cubin.stderr))
        # float32: a kernel with a lane-tree sum keeps its per-thread stack of 32-lane
        # partials in local memory (gt_real.h, GT_ROW_SUM); nothing else has a frame
        sums = {k.name for k in prog.fusion.kernels
                if any(la.kernel.startswith(LANE_TREE_KERNELS)
                       or la.kernel.endswith(("_bwd_a", "_bwd_b"))
                       for la in k.members)} if dtype == "f32" else set()
        assert {f for f, size in frames.items() if size != "0"} <= sums, cubin.stderr
        ptx = subprocess.run([NVCC, "--ptx", *opts, "fused.cu"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
        assert ptx.returncode == 0, ptx.stderr
        text = (tmp_path / "fused.ptx").read_text()
        assert set(re.findall(r"\.entry\s+(\w+)\(", text)) == \
            {k.name for k in prog.fusion.kernels}
        inner = {k.name for k in prog.fusion.kernels
                 if any(la.kernel == "k_matmul" for la in k.members)}
        assert inner, f"{name}: no fused kernel runs a matmul"
        assert_fma_only_in_inner_products(text, dtype, inner)
        assert "bar.sync" in text            # __syncthreads at the barriers


# ── the command line ──────────────────────────────────────────────────────

def cli(*args):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_replay_gpu_fuse_json_reports_both_counts():
    code, out, err = cli("replay-gpu", str(AE), "--backend", "host", "--fuse", "--train",
                         "adam-seed", "--check", "--episodes", "3", "--warmup", "1", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["fuse"] is True and r["check"]["ok"] and r["check"]["max_ulps"] == 0.0
    assert r["launches"]["episode"] == 8 and r["launches_unfused"]["episode"] == 47
    assert r["fused_kernels"] == 5 and r["compile_seconds"] >= 0.0
    code, out, err = cli("replay-gpu", str(AE), "--backend", "host", "--episodes", "2",
                         "--json")
    r = json.loads(out)
    assert r["fuse"] is False and r["launches"]["episode"] == r["launches_unfused"]["episode"]
    assert r["compile_seconds"] is None


def test_replay_gpu_plan():
    code, out, err = cli("replay-gpu", str(AE), "--plan", "--train", "adam-seed")
    assert code == 0, err
    assert "fusion plan: 47 launches per episode -> 8" in out
    assert "3:matmul, 4:add, 5:relu" in out and "per-node: node 22 mean" in out
    code, out, err = cli("replay-gpu", str(AE), "--plan", "--json")
    plan = json.loads(out)
    assert plan["launches_unfused"] == {"forward": 14, "backward": 24, "optimizer": 0}
    assert plan["launches_fused"] == 6
    fused = [k for k in plan["kernels"] if k["fused"]]
    assert fused[0]["kind"] == "rows" and fused[0]["rows"] == 200


def test_train_fuse_needs_a_device_backend():
    code, out, err = cli("train", str(AE), "--data", str(AE_DATA), "--fuse")
    assert code == 2 and err.strip() == \
        "gradtool: --fuse needs a device backend (--backend host, cuda or auto)"


# ── on a GPU (scripts/gpu_check.sh) ───────────────────────────────────────

@needs_gpu
@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_cuda_every_sample_fused_bit_exact(sample, graph, rng):
    from gradtool.device.engine import check_step
    from gradtool.optim import optimizer_from_state

    tf = load(sample)
    opt = adam_on(tf.tape)
    cpu_opt = optimizer_from_state(tf.tape, opt.state_dict())
    rp = assert_fused_matches(tf.tape, tf.loss.id, rng, optimizer=opt, backend="cuda",
                              graph=graph)
    assert all(it["ulps"] == 0.0 for it in check_step(rp, tf.tape, cpu_opt))


@needs_gpu
def test_cuda_random_graphs_fused_bit_exact():
    for seed in range(40):
        rng = np.random.default_rng(1000 + seed)
        tp, loss = random_row_graph(rng)
        assert_fused_matches(tp, loss, rng, backend="cuda")
    for seed in range(15):
        rng = np.random.default_rng(seed)
        tp, loss = random_graph(rng)
        assert_fused_matches(tp, loss, rng, backend="cuda")


@needs_gpu
@pytest.mark.parametrize("graph", [True, False])
def test_cuda_rows_past_the_grid(graph, monkeypatch, rng):
    """Two blocks for 200 rows (each block strides over its rows, barriers inside the row
    loop) and 32-thread blocks for the flat kernels."""
    from gradtool.device import cuda as cuda_backend
    monkeypatch.setattr(cuda_backend, "BLOCK", 32)
    monkeypatch.setattr(cuda_backend, "MAX_GRID", 2)
    tf = load(AE)
    assert_fused_matches(tf.tape, tf.loss.id, rng, backend="cuda", graph=graph)
    for seed in range(5):
        r = np.random.default_rng(2000 + seed)
        tp, loss = random_row_graph(r)
        assert_fused_matches(tp, loss, r, backend="cuda", graph=graph)


@needs_gpu
def test_cuda_autoencoder_fused_trains_like_the_cpu(tmp_path):
    from gradtool.train import TrainOptions, Trainer

    saved = {}
    for backend, fuse in (("cpu", False), ("cuda", True)):
        out = tmp_path / f"{backend}.msgpack"
        Trainer(load(AE), str(AE_DATA), TrainOptions(steps=50, epochs=10, clip=0.05,
                                                     backend=backend, fuse=fuse,
                                                     save=str(out))).run()
        saved[backend] = out.read_bytes()
    assert saved["cpu"] == saved["cuda"]


@needs_gpu
def test_cuda_f32_gate():
    from f32_gate import measure
    rows = measure("cuda")
    assert all(r["ok"] and r["fused_bits_equal_per_node"] for r in rows), rows


def test_very_wide_rows_keep_their_per_node_launches(rng):
    """A block per row would leave most of a GPU idle on a few very wide rows: such nodes
    (and a sum over more elements than a block takes on) stay per-node."""
    from gradtool.device.fusion import MAX_ROW_WIDTH
    tp = gt.Tape()
    wide = tp.param(rng.uniform(-1.0, 1.0, (2, MAX_ROW_WIDTH + 1)))
    narrow = tp.param(rng.uniform(-1.0, 1.0, (2, MAX_ROW_WIDTH)))
    loss = tp.sum(tp.tanh(tp.relu(wide))) + tp.mean(tp.tanh(tp.relu(narrow)))
    plan = fusion_plan(tp, loss).fusion
    fused_nodes = {m.node for k in plan.kernels for m in k.members}
    # 2-4 (too wide, a sum of too many) and 7 (a mean of 2 x MAX_ROW_WIDTH) stay per-node
    assert fused_nodes == {5, 6, 8}, fused_nodes
    assert_fused_matches(tp, loss, rng)
