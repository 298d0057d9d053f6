"""gradtool.nn: each building block recorded from ops, against PyTorch float64.

Every function is checked on values (forward) and on the gradient of every
input that is a param, with a random weighting of the output so every output
element gets its own gradient; plus: what each records (no node type of its
own), device replay on the host backend bit for bit, and finite differences.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal, require_c_compiler
from gradtool import nn
from gradtool.device import capture


def _rel(ours, theirs) -> float:
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape
    scale = max(float(np.max(np.abs(theirs))), 1e-300)
    return float(np.max(np.abs(ours - theirs))) / scale


def _cases(rng):
    """label -> (inputs, gradtool builder, torch builder); the builders take the inputs
    (GVars / torch leaves) and, for cross-entropy, the ids."""
    import torch.nn.functional as F
    x = rng.standard_normal((5, 6))
    return {
        "linear": ([x, rng.standard_normal((6, 3)), rng.standard_normal(3)],
                   lambda v: nn.linear(*v), lambda v: F.linear(v[0], v[1].T, v[2])),
        "linear 3-d": ([rng.standard_normal((2, 4, 6)), rng.standard_normal((6, 3))],
                       lambda v: nn.linear(*v), lambda v: F.linear(v[0], v[1].T)),
        "rms_norm": ([x * 3.0, rng.uniform(0.5, 1.5, 6)],
                     lambda v: nn.rms_norm(v[0], v[1], eps=1e-6),
                     lambda v: F.rms_norm(v[0], (6,), v[1], eps=1e-6)),
        "layer_norm": ([x * 2.0 + 1.0, rng.uniform(0.5, 1.5, 6), rng.standard_normal(6)],
                       lambda v: nn.layer_norm(v[0], v[1], v[2], eps=1e-5),
                       lambda v: F.layer_norm(v[0], (6,), v[1], v[2], eps=1e-5)),
        "silu": ([x * 4.0], lambda v: nn.silu(v[0]), lambda v: F.silu(v[0])),
        "gelu": ([x * 4.0], lambda v: nn.gelu(v[0]), lambda v: F.gelu(v[0])),
        "gelu tanh": ([x * 4.0], lambda v: nn.gelu(v[0], approximate="tanh"),
                      lambda v: F.gelu(v[0], approximate="tanh")),
        "mse": ([x, rng.standard_normal((5, 6))], lambda v: nn.mse(*v),
                lambda v: F.mse_loss(v[0], v[1]).reshape(1)),
    }


CASES = ["linear", "linear 3-d", "rms_norm", "layer_norm", "silu", "gelu", "gelu tanh", "mse"]


@pytest.mark.parametrize("label", CASES)
def test_against_pytorch_float64(label):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(sum(map(ord, label)))
    inputs, ours, theirs = _cases(rng)[label]
    tp = gt.Tape()
    leaves = [tp.param(a) for a in inputs]
    y = ours(leaves)
    w = rng.uniform(0.5, 1.5, tp.value(y).shape)
    tp.backward(tp.sum(tp.mul(y, tp.const(w))))
    t_leaves = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in inputs]
    t_y = theirs(t_leaves)
    (t_y * torch.tensor(w)).sum().backward()
    assert _rel(tp.value(y), t_y.detach().numpy()) <= 1e-14, label
    for leaf, t_leaf in zip(leaves, t_leaves, strict=True):
        assert _rel(tp.grad(leaf), t_leaf.grad.numpy()) <= 1e-13, label


def test_softmax_cross_entropy_against_pytorch_float64():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((7, 10)) * 5.0
    logits[2, 3] = 900.0                       # confident and wrong: log(softmax) gives -inf
    labels = rng.integers(0, 10, 7)
    labels[2] = 4
    tp = gt.Tape()
    z = tp.param(logits)
    loss = nn.softmax_cross_entropy(z, tp.const(labels[:, None], name="y", dtype="i64"))
    tp.backward(loss)
    t_z = torch.tensor(logits, requires_grad=True)
    t_loss = torch.nn.functional.cross_entropy(t_z, torch.tensor(labels))
    t_loss.backward()
    assert np.isfinite(tp.value(loss)[0]) and tp.value(loss)[0] > 100.0
    assert abs(tp.value(loss)[0] - t_loss.item()) <= 1e-14 * abs(t_loss.item())
    assert _rel(tp.grad(z), t_z.grad.numpy()) <= 1e-14
    ops = {n.op for n in tp.nodes}
    assert ops == {"param", "const", "log_softmax", "take_along", "mean", "neg"}


def test_cross_entropy_on_another_axis_and_3_dim_logits():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    logits = rng.standard_normal((2, 5, 3))          # class axis 1, as torch's [N, C, d]
    labels = rng.integers(0, 5, (2, 1, 3))
    tp = gt.Tape()
    z = tp.param(logits)
    loss = nn.softmax_cross_entropy(z, tp.const(labels, dtype="i64"), axis=1)
    tp.backward(loss)
    t_z = torch.tensor(logits, requires_grad=True)
    t_loss = torch.nn.functional.cross_entropy(t_z, torch.tensor(labels[:, 0, :]))
    t_loss.backward()
    assert abs(tp.value(loss)[0] - t_loss.item()) <= 1e-14 * abs(t_loss.item())
    assert _rel(tp.grad(z), t_z.grad.numpy()) <= 1e-14


def test_building_blocks_are_plain_ops_that_replay_on_the_host_and_pass_fd():
    require_c_compiler()
    rng = np.random.default_rng(8)
    tp = gt.Tape()
    x = tp.const(rng.standard_normal((4, 6)), name="x")
    ids = tp.const(rng.integers(0, 3, (4, 1)), name="y", dtype="i64")
    w1, b1 = tp.param(rng.standard_normal((6, 8)) * 0.4), tp.param(np.zeros(8))
    g, beta = tp.param(rng.uniform(0.5, 1.5, 8)), tp.param(rng.standard_normal(8) * 0.1)
    w2 = tp.param(rng.standard_normal((8, 3)) * 0.4)
    h = nn.gelu(nn.layer_norm(nn.linear(x, w1, b1), g, beta), approximate="tanh")
    h = nn.gelu(h)
    h = nn.silu(nn.rms_norm(h, g))
    loss = nn.softmax_cross_entropy(nn.linear(h, w2), ids)
    assert {n.op for n in tp.nodes} <= set(gt.OP_NAMES)
    tp.backward(loss)
    rp = capture(tp, loss, "host")
    rp.forward()
    rp.backward()
    assert_bits_equal(np.array([rp.loss()]), tp.value(loss), "loss")
    for p in tp.params():
        assert_bits_equal(rp.grad(p), tp.grad(p), f"grad {p.id}")
    assert gt.fd_check(tp, loss, eps=1e-6, rtol=1e-5, atol=1e-8).passed


def test_misuse_is_a_gradtool_error():
    tp = gt.Tape()
    with pytest.raises(gt.TapeError, match="nn.gelu: approximate must be 'none' or 'tanh'"):
        nn.gelu(tp.param(np.ones(3)), approximate="fast")
    with pytest.raises(gt.TapeError, match="nn.silu: expected a GVar, got ndarray"):
        nn.silu(np.ones(3))


def test_convolutional_composites_refuse_misuse_naming_the_function():
    tp = gt.Tape()
    x, w = tp.param(np.ones((1, 4, 3, 3))), tp.param(np.ones((4, 2, 3, 3)))
    v, w3 = tp.param(np.ones((1, 4, 2, 3, 3))), tp.param(np.ones((4, 2, 2, 3, 3)))
    bad = [(lambda: nn.conv_transpose2d(x, w, groups=3), "divisible by groups=3"),
           (lambda: nn.conv_transpose2d(x, tp.param(np.ones((2, 2, 3, 3)))), "w's dim 0"),
           (lambda: nn.conv_transpose2d(x, w, stride=2, output_padding=2),
            "smaller than the stride or the dilation"),
           (lambda: nn.conv_transpose2d(x, w, padding=-1), "padding [-1, -1] >= 0"),
           (lambda: nn.conv_transpose2d(x, w, padding=3), "would be empty"),
           (lambda: nn.conv_transpose2d(x, w, stride="2"), "expected an int or two ints"),
           (lambda: nn.conv_transpose1d(x, w), "expected x [N,C,L]"),
           (lambda: nn.group_norm(x, 3), "num_groups=3 must divide the 4 channels"),
           (lambda: nn.group_norm(x, 2, tp.param(np.ones(3))), "weight and bias must be [4]"),
           (lambda: nn.adaptive_avg_pool2d(x, (2, 0)), "output_size must be ints >= 1"),
           (lambda: nn.adaptive_avg_pool2d(x, (1, 2, 3)), "an int or two"),
           (lambda: nn.adaptive_avg_pool2d(tp.param(np.ones((2, 3))), 1), "expected x [N,C,H,W]"),
           (lambda: nn.adaptive_max_pool2d(x, (2, -1)), "adaptive_max_pool2d: output_size must"),
           (lambda: nn.adaptive_max_pool2d(tp.param(np.ones(3)), 1), "expected x [N,C,H,W]"),
           (lambda: nn.upsample_bilinear2d(x, (0, 2)), "size must be ints >= 1"),
           (lambda: nn.upsample_bilinear2d(x, 3, scale_factor=(1, 2, 3)), "scale_factor"),
           (lambda: nn.grid_sample(x, tp.param(np.ones((1, 2, 2, 3)))),
            "grid_sample: expected x [N,C,H,W] and grid [N,OH,OW,2]"),
           (lambda: nn.grid_sample(x, tp.param(np.ones((2, 2, 2, 2)))), "grid [N,OH,OW,2]"),
           (lambda: nn.adaptive_avg_pool3d(x, 2), "expected x [N,C,D,H,W]"),
           (lambda: nn.adaptive_max_pool3d(v, (1, 2)), "an int or three"),
           (lambda: nn.conv_transpose3d(v, tp.param(np.ones((4, 2, 3, 3)))),
            "expected w [C, OC/groups, KD, KH, KW]"),
           (lambda: nn.conv_transpose3d(v, w3, groups=3), "divisible by groups=3"),
           (lambda: nn.conv_transpose3d(v, w3, padding=4), "would be empty")]
    for f, needle in bad:
        with pytest.raises(gt.TapeError) as err:
            f()
        assert needle in str(err.value), (needle, str(err.value))
