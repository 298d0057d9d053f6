"""The CUDA backend against the CPU tape: the same bits as the host backend, on a real GPU.

Skipped (cleanly, at collection) without PyCUDA or a CUDA device: CI has
neither, and the same kernels are tested there through the host backend
(tests/test_device_host.py).  scripts/gpu_check.sh runs this file where a
GPU is lent.
"""

from pathlib import Path

import numpy as np
import pytest

from gradtool.device.cuda import cuda_status

OK, WHY = cuda_status()
pytestmark = pytest.mark.skipif(not OK, reason=f"no CUDA backend here: {WHY}")

import gradtool as gt  # noqa: E402
from conftest import assert_bits_equal  # noqa: E402
from gradtool.device import capture  # noqa: E402
from gradtool.device.engine import F32_BOUND, relative_error  # noqa: E402
from gradtool.optim import Adam, SGD  # noqa: E402
from gradtool.tapefile import load  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "samples").rglob("*.msgpack"))


def grads_match(tp, loss, rp):
    tp.zero_grad()
    tp.forward()
    tp.backward(loss)
    rp.forward()
    rp.backward()
    assert_bits_equal(np.array([rp.loss()]), tp.values[loss.id], "loss")
    for i in range(len(tp.nodes)):
        assert_bits_equal(rp.value(i), tp.values[i], f"node {i} value")
        cpu = tp.grads[i] if tp.grads[i] is not None else np.zeros(tp.values[i].shape)
        assert_bits_equal(rp.grad(i), cpu, f"node {i} grad")


@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_every_sample_bit_exact(sample, graph):
    tf = load(sample)
    rp = capture(tf.tape, tf.loss, "cuda", "f64", graph=graph)
    grads_match(tf.tape, tf.loss, rp)


def test_random_graphs_bit_exact():
    from test_device_host import random_graph
    for seed in range(25):
        tp, loss = random_graph(np.random.default_rng(seed))
        grads_match(tp, loss, capture(tp, loss, "cuda"))


@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_training_episodes_bit_exact(kind, graph):
    """30 fused episodes (one CUDA graph each with graph=True) against gradtool.optim."""
    from test_device_host import batches, mlp, run_cpu
    tapes = [mlp(np.random.default_rng(7), unused=True) for _ in range(2)]
    data = batches(np.random.default_rng(8), 30)
    opts = []
    for tp, *_ in tapes:
        opt = Adam(0.05) if kind == "adam" else SGD(0.2)
        for p in tp.params():
            opt.add(tp, p)
        opt.set_clip(1.2)
        opts.append(opt)
    cpu_losses = run_cpu(*tapes[0], opts[0], data)
    tp, x, y, loss = tapes[1]
    rp = capture(tp, loss, "cuda", optimizer=opts[1], graph=graph)
    dev_losses = []
    for xb, yb in data:
        rp.set_input(x, xb)
        rp.set_input(y, yb)
        dev_losses.append(rp.episode(train=True))
    assert_bits_equal(np.array(dev_losses), np.array(cpu_losses), "losses")
    rp.sync_params_to_tape(tp)
    rp.sync_optimizer(opts[1])
    for p in tapes[0][0].params():
        assert_bits_equal(tp.values[p.id], tapes[0][0].values[p.id], f"param {p.id}")
    assert opts[1].t == opts[0].t == 30


def test_graph_and_per_node_launches_agree():
    tf = load(ROOT / "samples" / "attention.msgpack")
    results = []
    for graph in (True, False):
        opt = Adam(0.01)
        for p in tf.tape.params():
            opt.add(tf.tape, p)
        rp = capture(tf.tape, tf.loss, "cuda", optimizer=opt, graph=graph)
        losses = [rp.episode(train=True) for _ in range(5)]
        results.append((losses, [rp.value(p) for p in tf.tape.params()]))
    assert_bits_equal(np.array(results[0][0]), np.array(results[1][0]), "losses")
    for a, b in zip(results[0][1], results[1][1]):
        assert_bits_equal(a, b, "param")


def test_f32_within_bound():
    for sample in SAMPLES:
        tf = load(sample)
        rp = capture(tf.tape, tf.loss, "cuda", "f32")
        rp.forward()
        rp.backward()
        tf.tape.zero_grad()
        tf.tape.backward(tf.loss)
        assert relative_error(rp.loss(), tf.tape.values[tf.loss.id]) <= F32_BOUND
        for p in tf.tape.params():
            assert relative_error(rp.grad(p), tf.tape.grad(p)) <= F32_BOUND, (sample, p.id)


def test_device_matches_host_backend_too():
    tp = gt.Tape()
    rng = np.random.default_rng(5)
    x = tp.param(rng.standard_normal((7, 9)))
    w = tp.param(rng.standard_normal((9, 5)))
    loss = tp.mean(tp.softmax(tp.tanh(x @ w), axis=0) * tp.const(rng.standard_normal((7, 5))))
    values = []
    for backend in ("cuda", "host"):
        rp = capture(tp, loss, backend)
        rp.forward()
        rp.backward()
        values.append([rp.grad(x), rp.grad(w)])
    for a, b in zip(*values):
        assert_bits_equal(a, b)
