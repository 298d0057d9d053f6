"""The device replay engine on the host backend: every kernel against the CPU tape, bit for bit.

The host backend compiles gradtool/csrc/kernels.cu with the system C
compiler, so these tests run every kernel on every commit.  Each check
changes the leaves (on the tape and on the device) before the forward
replay, so a forward kernel that computed nothing would still show the
captured values and fail; then it compares every node's value and every
node's gradient with the CPU tape to the bit.
"""

import math

import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal, assert_bits_equal_nan_any
from gradtool.device import CaptureError, capture
from gradtool.device.engine import F32_BOUND, DeviceEngine, relative_error, ulp_distance
from gradtool.device.host import CSRC, kernel_names, library_path, load_library
from gradtool.device.program import MAX_DIMS, capture_program
from gradtool.errors import GradtoolError
from gradtool.optim import SGD, AdamSeed as Adam
from gradtool.train import make_engine
from support import (UNARY, assert_engines_end_alike, assert_replay_trained_like_cpu, batches,
                     mlp, nonfinite_batch_setup, perturb_leaves, random_graph,
                     replay_losses, run_cpu, train_step_all, weighted_loss, with_params)

# every op the random (f64) graphs exercise: cast runs only in an f32 program, as a copy
# of whole numbers or of a draw (tests/test_device_f32.py); any other cast is refused
DEVICE_OPS = set(gt.OP_NAMES) - {"cast"}


def assert_replay_matches(tp, loss, rng, dtype="f64", kernels="tiled"):
    """Forward and backward on the host backend == the CPU tape, every node, to the bit."""
    rp = capture(tp, loss, "host", dtype, host_kernels=kernels)
    perturb_leaves(tp, rp, rng)
    tp.forward()
    tp.zero_grad()
    tp.backward(loss)
    rp.forward()
    rp.backward()
    rp.backward()       # idempotent: it starts by zeroing the gradients the first one left
    for i in range(len(tp.nodes)):
        what = f"node {i} ({tp.nodes[i].op})"
        assert_bits_equal(rp.value(i), tp.values[i], what + " value")
        cpu_grad = tp.grads[i] if tp.grads[i] is not None else np.zeros(tp.values[i].shape)
        assert_bits_equal(rp.grad(i), cpu_grad, what + " grad")
        assert rp.touched(i) == (tp.grads[i] is not None), what
    return rp


# ── one op at a time ──────────────────────────────────────────────────────



@pytest.mark.parametrize("shape", [(1,), (3, 4), (2, 3, 5)])
@pytest.mark.parametrize("op", UNARY + ["adds", "muls"])
def test_unary_op(op, shape, rng):
    tp = gt.Tape()
    if op in ("log", "sqrt"):
        data = rng.uniform(0.1, 3.0, shape)
    else:
        data = rng.uniform(-3.0, 3.0, shape)
        data.reshape(-1)[0] = 0.0           # relu's x <= 0 edge; exact zeros elsewhere too
        if data.size > 2:
            data.reshape(-1)[1] = -0.0
    x = tp.param(data)
    if op == "adds":
        y = tp.adds(x, 0.37)
    elif op == "muls":
        y = tp.muls(x, -1.7)
    else:
        y = getattr(tp, op)(x)
    assert_replay_matches(tp, weighted_loss(tp, y, rng), rng)


OUT = (2, 3, 4)
PATTERNS = [(2, 3, 4), (1, 3, 4), (2, 1, 4), (2, 3, 1), (1, 1, 4), (1, 3, 1), (2, 1, 1),
            (1, 1, 1), (3, 4), (4,), (3, 1), (1,)]


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_broadcast_binary_every_axis_pattern(op, rng):
    """Every combination of broadcast axes on either side, both inputs requiring grad."""
    for sa in PATTERNS:
        for sb in PATTERNS:
            tp = gt.Tape()
            a = tp.param(rng.uniform(-2.0, 2.0, sa))
            b = tp.param(rng.uniform(0.5, 2.0, sb) * rng.choice([-1.0, 1.0], sb))
            y = getattr(tp, op)(a, b)
            assert_replay_matches(tp, weighted_loss(tp, y, rng), rng)


def test_broadcast_one_side_const(rng):
    for sa, sb in [((2, 3, 4), (3, 1)), ((1, 4), (2, 3, 4)), ((4,), (2, 1, 1))]:
        for op in ("add", "sub", "mul", "div"):
            tp = gt.Tape()
            a = tp.const(rng.uniform(0.5, 2.0, sa))
            b = tp.param(rng.uniform(0.5, 2.0, sb))
            assert_replay_matches(tp, weighted_loss(tp, getattr(tp, op)(a, b), rng), rng)
            tp = gt.Tape()
            a = tp.param(rng.uniform(0.5, 2.0, sa))
            b = tp.const(rng.uniform(0.5, 2.0, sb))
            assert_replay_matches(tp, weighted_loss(tp, getattr(tp, op)(a, b), rng), rng)


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_reductions(op, rng):
    for shape in [(1,), (7,), (3, 5), (2, 3, 4)]:
        tp = gt.Tape()
        x = tp.param(rng.uniform(-1.0, 1.0, shape))
        y = getattr(tp, op)(x * x)
        assert_replay_matches(tp, tp.mul(y, tp.const([0.7])), rng)


@pytest.mark.parametrize("mkn", [(1, 1, 1), (1, 7, 1), (3, 5, 2), (5, 9, 17), (13, 33, 40),
                                 (4, 16, 32), (64, 3, 10), (2, 1, 9)])
def test_matmul(mkn, rng):
    m, k, n = mkn
    tp = gt.Tape()
    a = tp.param(rng.uniform(-1.0, 1.0, (m, k)))
    b = tp.param(rng.uniform(-1.0, 1.0, (k, n)))
    assert_replay_matches(tp, weighted_loss(tp, a @ b, rng), rng)


@pytest.mark.parametrize("bmkn", [(2, 3, 4, 5), (3, 1, 7, 2), (1, 5, 5, 5), (4, 6, 2, 11)])
def test_bmm(bmkn, rng):
    bt, m, k, n = bmkn
    tp = gt.Tape()
    a = tp.param(rng.uniform(-1.0, 1.0, (bt, m, k)))
    b = tp.param(rng.uniform(-1.0, 1.0, (bt, k, n)))
    assert_replay_matches(tp, weighted_loss(tp, tp.bmm(a, b), rng), rng)


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (2, 1, 3, 5), (1, 1)])
def test_transpose(shape, rng):
    tp = gt.Tape()
    x = tp.param(rng.uniform(-1.0, 1.0, shape))
    assert_replay_matches(tp, weighted_loss(tp, tp.transpose(x) * 2.5, rng), rng)


def test_reshape(rng):
    tp = gt.Tape()
    x = tp.param(rng.uniform(-1.0, 1.0, (2, 3, 4)))
    y = tp.reshape(tp.exp(x), [4, 6])
    assert_replay_matches(tp, weighted_loss(tp, tp.reshape(y, [24]), rng), rng)


@pytest.mark.parametrize("shape,axis", [((2, 3, 4), 0), ((2, 3, 4), 1), ((2, 3, 4), 2),
                                        ((5,), 0), ((1, 4), 0), ((3, 1), 1)])
def test_softmax_each_axis(shape, axis, rng):
    tp = gt.Tape()
    x = tp.param(rng.uniform(-3.0, 3.0, shape))
    assert_replay_matches(tp, weighted_loss(tp, tp.softmax(x, axis=axis), rng), rng)


@pytest.mark.parametrize("shape,starts,stops", [
    ((6,), [1], [4]), ((6,), [0], [6]), ((4, 5), [1, 0], [3, 5]), ((4, 5), [3, 4], [4, 5]),
    ((2, 3, 4), [0, 1, 1], [2, 3, 3]), ((2, 3, 4, 5), [1, 0, 2, 1], [2, 3, 4, 4])])
def test_slice(shape, starts, stops, rng):
    tp = gt.Tape()
    x = tp.param(rng.uniform(-1.0, 1.0, shape))
    assert_replay_matches(tp, weighted_loss(tp, tp.slice(tp.tanh(x), starts, stops), rng), rng)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_concat_each_axis(axis, rng):
    sa = [2, 3, 4]
    sb = list(sa)
    sb[axis] = 1 + axis
    tp = gt.Tape()
    a = tp.param(rng.uniform(-1.0, 1.0, sa))
    b = tp.param(rng.uniform(-1.0, 1.0, sb))
    assert_replay_matches(tp, weighted_loss(tp, tp.concat(a, b, axis=axis), rng), rng)


def test_fan_out(rng):
    """One value read by many consumers, including both inputs of one node."""
    tp = gt.Tape()
    x = tp.param(rng.uniform(0.5, 1.5, (3, 3)))
    terms = [x * x, x + x, x - x, x / x, x @ x, tp.concat(x, x, axis=1), tp.softmax(x, 0),
             tp.slice(x, [0, 1], [2, 3])]
    loss = tp.mean(terms[0])
    for t in terms[1:]:
        loss = loss + weighted_loss(tp, t, rng)
    assert_replay_matches(tp, loss, rng)


def test_a_products_first_contribution_stores_and_its_gradient_is_not_filled(rng):
    """The first contribution a gradient gets, when a product writes it whole, is stored
    (FMA chains from +0.0 have no -0.0, so 0.0 + s is s) and that gradient is left out of
    the zero fill; every later contribution still adds.  x @ x stores its a side, then
    adds its b side; h is read by a later matmul (first: stores) and an earlier add."""
    from gradtool.device.fusion import unpack
    tp = gt.Tape()
    x = tp.param(rng.uniform(-1.0, 1.0, (4, 4)))
    w = tp.param(rng.uniform(-1.0, 1.0, (4, 3)))
    v = tp.param(rng.uniform(-1.0, 1.0, (4, 3)))
    xx = x @ x
    h = tp.tanh(xx)
    s = h + tp.const(rng.uniform(-1.0, 1.0, (4, 4)))
    sv, hw = s @ v, h @ w
    loss = weighted_loss(tp, tp.concat(sv, hw, axis=0), rng)
    prog = capture_program(tp, loss.id)
    grad_of = {prog.grad_off[i]: i for i in range(len(tp.nodes)) if prog.grad_off[i] >= 0}
    filled = set()
    for la in prog.launches["backward"]:
        if la.what == "zero gradients":
            f = unpack(la)
            filled |= {i for off, i in grad_of.items() if f["dst"] <= off < f["dst"] + la.work}
    stores = {(la.node, grad_of[unpack(la)["c"]]) for la in prog.launches["backward"]
              if la.kernel == "k_matmul" and not unpack(la)["acc"]}
    # h @ w runs first (the last matmul), then s @ v; x @ x stores its a side only
    assert stores == {(hw.id, h.id), (hw.id, w.id), (sv.id, s.id), (sv.id, v.id),
                      (xx.id, x.id)}
    assert not filled & {h.id, w.id, s.id, v.id, x.id}
    assert {xx.id, sv.id, hw.id} <= filled      # tanh's input, concat's inputs: filled
    assert_replay_matches(tp, loss, rng)


def test_each_gradient_is_zeroed_just_before_its_first_contribution(rng):
    """fills="each" (the host's): one k_fill per gradient that accumulates, right before
    the launches of its first contribution (those nothing contributes to, and the loss's
    before the seed, first); no whole-range fill; the products' stored gradients none.
    The replay gives the CPU tape's bits, and the "ahead" program's."""
    from gradtool.device import backends
    from gradtool.device.fusion import unpack
    tp = gt.Tape()
    x = tp.param(rng.uniform(-1.0, 1.0, (4, 4)))
    w = tp.param(rng.uniform(-1.0, 1.0, (4, 3)))
    h = tp.tanh(x @ w)
    s = h + tp.const(rng.uniform(-1.0, 1.0, (4, 3)))
    ids = tp.const(np.array([0, 2, 3]), dtype="i64")
    loss = tp.mean(s * h) + tp.sum(tp.take(tp.relu(x), ids))
    assert backends.get("host").zero_fills == "each"
    assert backends.get("cuda").zero_fills == "ahead"
    ahead = capture_program(tp, loss.id)
    each = capture_program(tp, loss.id, fills="each")
    grad_of = {each.grad_off[i]: i for i in range(len(tp.nodes)) if each.grad_off[i] >= 0}
    fills = [(q, grad_of[unpack(la)["dst"]], la.work) for q, la in
             enumerate(each.launches["backward"]) if la.kernel == "k_fill"
             and la.what != "seed loss"]
    filled = [j for _, j, _ in fills]
    assert len(filled) == len(set(filled))                       # each once
    assert all(work == each.size_of(j) for _, j, work in fills)  # whole, not a range
    stored = {grad_of[unpack(la)["c"]] for la in each.launches["backward"]
              if la.kernel == "k_matmul" and not unpack(la)["acc"]}
    # (x gets relu's contribution first: it is zeroed and added into, then the product adds)
    assert stored == {w.id} and x.id in filled
    zeroed = {i for i in grad_of.values()} - stored
    assert set(filled) == zeroed
    # before any launch of the node whose contribution comes first
    first_launch = {}
    for q, la in enumerate(each.launches["backward"]):
        if la.kernel != "k_fill":                    # (the seed names the loss node)
            first_launch.setdefault(la.node, q)
    launches = each.launches["backward"]
    for q, j, _ in fills:
        consumers = [k for k, n in enumerate(tp.nodes) if j in (n.a, n.b) and k in first_launch]
        assert all(q < first_launch[k] for k in consumers), j
        if j != loss.id:                             # and just before the first of them
            assert next(la for la in launches[q + 1:] if la.kernel != "k_fill").node \
                in consumers, j
    assert len(ahead.launches["backward"]) < len(each.launches["backward"])
    with pytest.raises(CaptureError, match="fills must be"):
        capture_program(tp, loss.id, fills="later")
    assert_replay_matches(tp, loss, rng)


def test_a_reshape_of_a_computed_value_shares_its_memory_on_host(rng):
    """views=True (the host's): a reshape of a computed node has its input's val_off and
    no forward launch; a reshape of a leaf (written between runs) keeps its own slot and
    copy; a chain of reshapes shares one slot.  Values and gradients are the CPU tape's
    bits, before and after Adam episodes."""
    from gradtool.device import backends
    tp = gt.Tape()
    w = tp.param(rng.uniform(-1.0, 1.0, (4, 6)))
    x = tp.const(rng.uniform(-1.0, 1.0, (3, 4)), name="x")
    h = tp.tanh(x @ w)                                   # [3, 6], computed
    r1 = tp.reshape(h, (6, 3))
    r2 = tp.reshape(r1, (18,))
    rw = tp.reshape(w, (24,))                            # of a leaf
    loss = tp.mean(r2 * r2) + tp.mean(tp.exp(rw)) + tp.sum(r1 @ tp.reshape(h, (3, 6)))
    assert backends.get("host").reshape_views and not backends.get("cuda").reshape_views
    prog = capture_program(tp, loss.id, views=True)
    assert prog.val_off[r1.id] == prog.val_off[r2.id] == prog.val_off[h.id]
    assert prog.val_off[rw.id] != prog.val_off[w.id]
    forward_nodes = {la.node for la in prog.launches["forward"]}
    assert r1.id not in forward_nodes and r2.id not in forward_nodes and rw.id in forward_nodes
    plain = capture_program(tp, loss.id)
    assert len({plain.val_off[i] for i in (h.id, r1.id, r2.id)}) == 3
    rp = assert_replay_matches(tp, loss, rng)
    assert rp.program.val_off[r2.id] == rp.program.val_off[h.id]      # capture's choice
    opt_host, opt_cpu = Adam(0.05), Adam(0.05)
    opt_host.add(tp, w)
    trained = capture(tp, loss, "host", optimizer=opt_host)
    for _ in range(3):
        trained.episode(train=True)
    opt_cpu.add(tp, w)
    for _ in range(3):
        tp.forward()
        tp.zero_grad()
        tp.backward(loss)
        opt_cpu.step(tp)
    tp.forward()
    trained.forward()
    for node in (w, h, r1, r2, rw, loss):
        assert_bits_equal(trained.value(node), tp.values[node.id], f"node {node.id} after")


def test_const_branches_dead_nodes_and_untouched_params(rng):
    tp = gt.Tape()
    w = tp.param(rng.uniform(-1.0, 1.0, (3, 2)), name="w")
    unused = tp.param(rng.uniform(-1.0, 1.0, (2,)), name="unused")
    c = tp.const(rng.uniform(0.5, 1.0, (4, 3)), name="x")
    const_branch = tp.log(tp.exp(c) * 2.0)             # requires no grad
    h = tp.tanh(const_branch @ w)
    loss = tp.mean(h * h)
    after = tp.sigmoid(h) + unused                      # recorded after the loss: forward only
    rp = assert_replay_matches(tp, loss, rng)
    assert not rp.touched(unused) and not rp.touched(c) and not rp.touched(after)
    assert rp.touched(w)


def test_loss_is_a_leaf_or_const_only(rng):
    tp = gt.Tape()
    p = tp.param([2.5])
    assert_replay_matches(tp, p, rng)
    tp = gt.Tape()
    c = tp.const(rng.uniform(0.5, 1.0, (3,)))
    tp.param([1.0])
    assert_replay_matches(tp, tp.sum(tp.log(c)), rng)


def test_special_values_propagate_like_the_tape(rng):
    """Infinities, NaNs and signed zeros go through the same IEEE operations."""
    tp = gt.Tape()
    x = tp.param(np.array([[0.0, -0.0, 1e308, -1e308], [3.0, -2.0, 1e-310, 5e-324]]))
    with np.errstate(all="ignore"):         # 4 * 1e308 overflows; softmax of inf is NaN
        y = tp.relu(x) * 4.0 + tp.sigmoid(x) + tp.tanh(x) * tp.exp(tp.neg(tp.relu(x)))
        loss = tp.sum(tp.softmax(y, axis=1) * tp.const(np.arange(8.0).reshape(2, 4)))
    rp = capture(tp, loss, "host")
    rp.forward()
    rp.backward()
    with np.errstate(all="ignore"):
        tp.zero_grad()
        tp.backward(loss)
    for i in range(len(tp.nodes)):
        assert_bits_equal_nan_any(rp.value(i), tp.values[i], f"node {i}")
        assert_bits_equal_nan_any(rp.grad(i), tp.grad(tp.var(i)), f"grad {i}")
    assert np.isnan(rp.grad(x)).any() and np.isinf(rp.value(y.id - 8)).any()


# ── random graphs covering every op ───────────────────────────────────────


@pytest.mark.parametrize("kernels", ["tiled", "per-thread", "per-thread-reversed"])
def test_random_graphs_cover_every_op(kernels):
    """Also with the GPU's one-thread-per-output kernel bodies compiled for the host, and
    with those bodies run last thread first: a kernel whose threads read or add into each
    other's outputs (a race on a GPU, where threads run in no order) fails one of them."""
    seen = set()
    for seed in range(400):              # 40 graphs, then more until every op was seen
        if seed >= 40 and seen >= DEVICE_OPS:
            break
        rng = np.random.default_rng(seed)
        tp, loss = random_graph(rng)
        seen |= {n.op for n in tp.nodes}
        assert_replay_matches(tp, loss, rng, kernels=kernels)
    assert seen >= DEVICE_OPS, f"ops never generated: {DEVICE_OPS - seen}"


@pytest.mark.parametrize("kernels", ["per-thread", "per-thread-reversed"])
def test_gpu_kernel_bodies_on_broadcasts_and_products(kernels, rng):
    """The per-thread bodies (what CUDA runs), in thread order and reversed, on every
    broadcast pattern and odd products."""
    for op in ("add", "sub", "mul", "div"):
        for sa in PATTERNS:
            for sb in PATTERNS[::3]:
                tp = gt.Tape()
                a = tp.param(rng.uniform(-2.0, 2.0, sa))
                b = tp.param(rng.uniform(0.5, 2.0, sb))
                y = getattr(tp, op)(a, b)
                assert_replay_matches(tp, weighted_loss(tp, y, rng), rng, kernels=kernels)
    for m, k, n in [(1, 1, 1), (5, 9, 17), (13, 33, 40)]:
        tp = gt.Tape()
        a = tp.param(rng.uniform(-1.0, 1.0, (m, k)))
        b = tp.param(rng.uniform(-1.0, 1.0, (k, n)))
        c = tp.param(rng.uniform(-1.0, 1.0, (2, m, k)))
        y = tp.sum(a @ b) + weighted_loss(tp, tp.bmm(c, tp.concat(tp.reshape(b, [1, k, n]),
                                                                   tp.reshape(b, [1, k, n]), 0)),
                                          rng)
        assert_replay_matches(tp, y, rng, kernels=kernels)


# ── training: the device optimizer against gradtool.optim ─────────────────


@pytest.mark.parametrize("kind,clip,kernels,fuse", [
    ("adam", 1.2, "tiled", False), ("adam", 0.0, "tiled", False), ("sgd", 1.1, "tiled", False),
    ("adam", 1.2, "per-thread-reversed", False),
    ("adam", 1.2, "tiled", True), ("sgd", 1.1, "per-thread", True),
    ("adam", 1.2, "per-thread-reversed", True)])
def test_training_steps_bit_exact_with_optim(kind, clip, kernels, fuse):
    """50 steps: every loss and, at the end, every param and moment identical to the bit
    (the optimizer kernels also run last thread first, as a GPU may; and fused)."""
    rng = np.random.default_rng(7)
    tp_cpu, x_cpu, y_cpu, loss_cpu = mlp(rng, unused=True)
    rng = np.random.default_rng(7)
    tp_dev, x_dev, y_dev, loss_dev = mlp(rng, unused=True)
    data = batches(np.random.default_rng(8), 50)
    opts = [with_params(Adam(0.05) if kind == "adam" else SGD(0.2), tp, clip)
            for tp in (tp_cpu, tp_dev)]
    cpu_losses = run_cpu(tp_cpu, x_cpu, y_cpu, loss_cpu, opts[0], data)

    rp = capture(tp_dev, loss_dev, "host", optimizer=opts[1], host_kernels=kernels, fuse=fuse)
    assert (rp.launches() < sum(rp.unfused_counts.values())) == fuse
    dev_losses, clipped = [], 0
    for xb, yb in data:
        rp.set_input(x_dev, xb)
        rp.set_input(y_dev, yb)
        dev_losses.append(rp.episode(train=True))
        clipped += rp.dev.scalar(rp.program.ctl_off + 2) == 1.0     # the norm kernel's verdict
    assert_bits_equal(np.array(dev_losses), np.array(cpu_losses), "losses")
    assert_replay_trained_like_cpu(rp, tp_dev, opts[1], tp_cpu, opts[0])
    if clip:      # both branches of the clip were taken
        assert 0 < clipped < len(data), clipped


# every optimizer of the table, with the options that change its rule, and a schedule
TABLE_CASES = [
    ("sgd", {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}, None),
    ("sgd", {"momentum": 0.8, "dampening": 0.2, "maximize": False}, {"kind": "step",
                                                                     "step_size": 7}),
    ("adam", {"amsgrad": True, "weight_decay": 0.02}, {"kind": "cosine", "warmup": 5,
                                                       "t_max": 30}),
    ("adam", {"beta1": 0.3}, None),
    ("adamw", {}, {"kind": "exponential", "gamma": 0.97}),
    ("adamw", {"amsgrad": True}, None),
    ("adam-seed", {}, {"kind": "cosine", "t_max": 20}),
]


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("kind,hparams,schedule", TABLE_CASES,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(TABLE_CASES)])
def test_every_table_optimizer_cpu_equals_host_and_fused(kind, hparams, schedule, fuse):
    """50 steps with clip and L2: losses, params and every slot identical to the bit on
    the CPU engine and the host backend (per-node, last thread first, and fused)."""
    from gradtool.optim import Schedule, make_optimizer
    rng = np.random.default_rng(7)
    tp_cpu, x_cpu, y_cpu, loss_cpu = mlp(rng, unused=True)
    rng = np.random.default_rng(7)
    tp_dev, x_dev, y_dev, loss_dev = mlp(rng, unused=True)
    data = batches(np.random.default_rng(8), 50)
    opts = [with_params(make_optimizer(kind, 0.05, hparams, Schedule(**(schedule or {}))),
                        tp, 1.2) for tp in (tp_cpu, tp_dev)]
    cpu_losses = run_cpu(tp_cpu, x_cpu, y_cpu, loss_cpu, opts[0], data)
    rp = capture(tp_dev, loss_dev, "host", optimizer=opts[1],
                 host_kernels="per-thread-reversed", fuse=fuse)
    dev_losses = replay_losses(rp, x_dev, y_dev, data)
    assert_bits_equal(np.array(dev_losses), np.array(cpu_losses), "losses")
    assert_replay_trained_like_cpu(rp, tp_dev, opts[1], tp_cpu, opts[0])
    assert opts[0].entries[0].state or kind == "sgd"


def test_clip_really_clips():
    """A tiny clip changes the trajectory (so the clipped path is exercised above)."""
    rng = np.random.default_rng(3)
    tp, x, y, loss = mlp(rng, l2=(0.0, 0.0))
    opt = with_params(SGD(0.5), tp, clip=1e-3)
    rp = capture(tp, loss, "host", optimizer=opt)
    rp.forward()
    rp.backward()
    norm = math.sqrt(sum(float(np.sum(rp.grad(p) ** 2)) for p in tp.params()))
    assert norm > 1e-3
    before = rp.value(tp.params()[0])
    rp.step()
    moved = np.abs(rp.value(tp.params()[0]) - before).max()
    assert 0.0 < moved <= 0.5 * 1e-3 * (1 + 1e-12)


def test_engine_matches_cpu_engine_and_skips_nonfinite_steps():
    """make_engine('host') == make_engine('cpu'), including a NaN batch that updates nothing."""
    engines, tapes, data = nonfinite_batch_setup(
        lambda tp, loss_id, opt: make_engine("host", tp, loss_id, opt))
    for xb, yb in data:
        losses = train_step_all(engines, xb, yb)
        assert_bits_equal(np.array(losses[1]), np.array(losses[0]), "loss")
        probs = next(i for i, n in enumerate(tapes[0].nodes) if n.op == "softmax")
        out = [engine.output(probs) for engine, *_ in engines]
        assert_bits_equal(out[1], out[0], "output")
    assert_engines_end_alike(engines, tapes)
    for engine, x, y, _ in engines:
        engine.set_input(x.id, data[0][0])
        engine.set_input(y.id, data[0][1])
    assert_bits_equal(np.array(engines[1][0].evaluate()), np.array(engines[0][0].evaluate()))
    assert isinstance(engines[1][0], DeviceEngine) and engines[1][0].name == "host"


# ── float32 ───────────────────────────────────────────────────────────────

def test_f32_within_bound(rng):
    assert F32_BOUND <= 1e-5            # the documented float32 target (docs/device.md)
    from gradtool.device import rounded_tape
    for seed in range(6):
        r = np.random.default_rng(100 + seed)
        tp, loss = random_graph(r, n_ops=10)
        if any(n.op == "uniform" for n in tp.nodes):     # a draw feeds float64 arithmetic:
            with pytest.raises(CaptureError, match="one float dtype per tape"):
                capture(tp, loss, "host", "f32")         # the f32 copy is mixed, refused
            continue
        rp = capture(tp, loss, "host", "f32")
        # the replay of the f32 copy (leaves rounded once) is its CPU reference, bit for bit
        copy = rounded_tape(tp, "f32")
        copy.backward(copy.var(loss.id))
        rp.forward()
        rp.backward()
        assert_bits_equal_nan_any(rp.value(loss.id), copy.values[loss.id], f"seed {seed} loss")
        for p in copy.params():
            assert_bits_equal_nan_any(rp.grad(p.id), copy.grad(p), f"seed {seed} grad {p.id}")
        rp.forward()
        rp.backward()
        tp.zero_grad()
        tp.backward(loss)
        assert relative_error(rp.loss(), tp.values[loss.id]) <= F32_BOUND
        for p in tp.params():
            assert relative_error(rp.grad(p), tp.grad(p)) <= F32_BOUND, f"seed {seed} param {p.id}"
    # and it is really float32, not float64 in disguise
    tp = gt.Tape()
    x = tp.param([1.0 / 3.0])
    rp = capture(tp, tp.muls(x, 3.0), "host", "f32")
    rp.forward()
    assert rp.value(x)[0] == float(np.float32(1.0 / 3.0)) != 1.0 / 3.0


# ── restrictions, errors, the build ───────────────────────────────────────

def test_capture_restrictions_raise_clear_errors(rng):
    tp = gt.Tape(raise_on_error=False)
    a = tp.param(np.ones((2, 3)))
    tp.matmul(a, a)
    with pytest.raises(CaptureError, match="poisoned"):
        capture_program(tp, 0)

    tp = gt.Tape()
    a = tp.param(np.ones((2, 3)))
    b = tp.exp(a)
    tp.values[b.id] = tp.values[b.id].astype(np.float32)
    with pytest.raises(CaptureError, match=rf"node {b.id}: .*float32.*float64 tape"):
        capture(tp, tp.sum(a), "host")

    tp = gt.Tape()
    a = tp.param(np.ones((2, 3)))
    with pytest.raises(CaptureError, match="one-element loss"):
        capture(tp, a, "host")
    with pytest.raises(CaptureError, match="does not exist"):
        capture(tp, 7, "host")
    with pytest.raises(CaptureError, match="dtype"):
        capture(tp, tp.sum(a), "host", "f16")
    with pytest.raises(GradtoolError, match="unknown backend"):
        capture(tp, tp.sum(a), "tpu")

    # a broadcast that alternates kept and stretched axes cannot be collapsed below rank 9
    tp = gt.Tape()
    sa = (2, 1) * 9
    sb = (1, 2) * 9
    a = tp.param(np.ones(sa))
    b = tp.param(np.ones(sb))
    with pytest.raises(CaptureError, match=f"at most {MAX_DIMS}"):
        capture(tp, tp.sum(a * b), "host")


def test_set_input_checks_shape(rng):
    tp = gt.Tape()
    x = tp.const(np.ones((2, 3)), name="x")
    rp = capture(tp, tp.sum(x), "host")
    with pytest.raises(GradtoolError, match=r"shape \[2, 3\], got \[3, 2\]"):
        rp.set_input(x, np.ones((3, 2)))


def test_cuda_backend_request_fails_cleanly_without_a_gpu():
    from gradtool.device.cuda import cuda_status
    if cuda_status()[0]:
        pytest.skip("a CUDA device is present")
    tp = gt.Tape()
    x = tp.param([1.0])
    with pytest.raises(GradtoolError, match="cuda backend is unavailable"):
        capture(tp, x, "cuda")
    assert capture(tp, x, "auto").backend == "host"


def test_library_is_cached_and_lists_every_kernel():
    lib = load_library("f64")
    assert load_library("f64") is lib
    assert library_path("f64").exists()
    names = kernel_names("f64")
    used = set()
    for seed in range(5):
        tp, loss = random_graph(np.random.default_rng(seed))
        prog = capture_program(tp, loss.id, optimizer=with_params(Adam(0.1), tp, clip=1.0))
        used |= {ln.kernel for ph in prog.launches.values() for ln in ph}
    assert used <= set(names)
    src = (CSRC / "kernels.cu").read_text() + (CSRC / "gt_ops.h").read_text()
    for name in names:      # hand-written, or an instance of a family (gt_ops.h's lists)
        assert f"GT_KERNEL {name}(" in src or f"X({name}," in src


def test_ulp_distance():
    assert ulp_distance(np.array([1.0]), np.array([1.0])) == 0.0
    assert ulp_distance(np.array([1.0]), np.array([np.nextafter(1.0, 2.0)])) == 1.0
    assert ulp_distance(np.array([0.0]), np.array([-0.0])) == 1.0
    assert ulp_distance(np.array([-1.0]), np.array([np.nextafter(-1.0, -2.0)])) == 1.0
    assert ulp_distance(np.array([1.0]), np.array([np.nan])) == math.inf
    assert ulp_distance(np.array([np.nan]), -np.array([np.nan])) == 0.0
