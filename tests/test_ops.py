"""Every backward rule, checked two independent ways: finite differences, and
hand-derived identities that hold to the bit."""

import numpy as np
import pytest

import gradtool as gt
from gradtool import numerics as nx
from conftest import assert_bits_equal


def weighted_loss(tp, out, rng):
    """sum(out * W) with a fixed random W: every output element gets its own weight."""
    w = tp.const(rng.uniform(0.5, 1.5, tp.value(out).shape))
    return tp.sum(tp.mul(out, w))


def check_fd(tp, loss, rtol=1e-6, atol=1e-7):
    report = gt.fd_check(tp, loss, eps=1e-6, rtol=rtol, atol=atol)
    for p in report.params:
        assert p.passed, (p.name, p.max_abs_err, p.max_rel_err, p.analytic, p.numeric)
    return report


UNARY = {
    "neg": lambda r, s: r.standard_normal(s),
    "relu": lambda r, s: r.choice([-1, 1], s) * r.uniform(0.1, 2, s),   # away from the kink
    "sigmoid": lambda r, s: r.standard_normal(s) * 3,
    "tanh": lambda r, s: r.standard_normal(s) * 2,
    "exp": lambda r, s: r.standard_normal(s),
    "log": lambda r, s: r.uniform(0.2, 5, s),
    "sqrt": lambda r, s: r.uniform(0.2, 5, s),
    "sum": lambda r, s: r.standard_normal(s),
    "mean": lambda r, s: r.standard_normal(s),
    "transpose": lambda r, s: r.standard_normal(s),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_fd(rng, op):
    tp = gt.Tape()
    x = tp.param(UNARY[op](rng, (3, 4)), name="x")
    check_fd(tp, weighted_loss(tp, getattr(tp, op)(x), rng))


@pytest.mark.parametrize("op,s", [("adds", 0.7), ("muls", -1.3)])
def test_scalar_ops_fd(rng, op, s):
    tp = gt.Tape()
    x = tp.param(rng.standard_normal((2, 5)), name="x")
    check_fd(tp, weighted_loss(tp, getattr(tp, op)(x, s), rng))


BROADCASTS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 4), (3, 1)), ((3, 4), (1,)),
              ((4,), (3, 4)), ((2, 3, 4), (3, 1)), ((2, 1, 4), (1, 3, 1)), ((2, 3, 4), (2, 1, 4))]


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("sa,sb", BROADCASTS)
def test_binary_broadcast_fd(rng, op, sa, sb):
    tp = gt.Tape()
    a = tp.param(rng.uniform(0.5, 2, sa), name="a")
    b = tp.param(rng.uniform(0.5, 2, sb) * rng.choice([-1, 1], sb), name="b")
    out = getattr(tp, op)(a, b)
    assert tp.value(out).shape == np.broadcast_shapes(sa, sb)
    check_fd(tp, weighted_loss(tp, out, rng))


def test_matmul_bmm_fd(rng):
    tp = gt.Tape()
    a = tp.param(rng.standard_normal((3, 5)), name="a")
    b = tp.param(rng.standard_normal((5, 2)), name="b")
    c = tp.param(rng.standard_normal((2, 3, 4)), name="c")
    d = tp.param(rng.standard_normal((2, 4, 2)), name="d")
    loss = tp.add(weighted_loss(tp, a @ b, rng), weighted_loss(tp, c @ d, rng))
    check_fd(tp, loss)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_softmax_fd(rng, axis):
    tp = gt.Tape()
    x = tp.param(rng.standard_normal((2, 3, 4)), name="x")
    check_fd(tp, weighted_loss(tp, tp.softmax(x, axis), rng))


def test_reshape_slice_concat_fd(rng):
    tp = gt.Tape()
    x = tp.param(rng.standard_normal((4, 6)), name="x")
    y = tp.param(rng.standard_normal((4, 2)), name="y")
    r = tp.reshape(x, [2, 12])
    s = tp.slice(x, [1, 2], [3, 5])
    c = tp.concat(x, y, axis=1)
    loss = tp.add(tp.add(weighted_loss(tp, r, rng), weighted_loss(tp, s, rng)),
                  weighted_loss(tp, c, rng))
    check_fd(tp, loss)


def test_mse_fd(rng):
    tp = gt.Tape()
    y = tp.param(rng.standard_normal((5, 3)), name="y")
    t = tp.const(rng.standard_normal((5, 3)), name="t")
    check_fd(tp, tp.mse(y, t))


# ── identities that hold to the bit ────────────────────────────────────────

def test_d_sum_x_squared_is_2x(rng):
    x0 = rng.standard_normal((4, 7)) * 1e3
    tp = gt.Tape()
    x = tp.param(x0)
    tp.backward(tp.sum(x * x))
    assert_bits_equal(tp.grad(x), 2.0 * x0)


def test_d_mean_is_one_over_n(rng):
    tp = gt.Tape()
    x = tp.param(rng.standard_normal((3, 7)))
    tp.backward(tp.mean(x))
    assert_bits_equal(tp.grad(x), np.full((3, 7), 1.0 / 21.0))


def test_d_sum_xw_is_serial_column_sums(rng):
    x0 = rng.standard_normal((9, 4)) * 10.0 ** rng.integers(-6, 7, (9, 4))
    tp = gt.Tape()
    x = tp.const(x0)
    w = tp.param(rng.standard_normal((4, 3)))
    tp.backward(tp.sum(x @ w))
    col = np.array([nx.serial_sum(x0[:, k])[0] for k in range(4)])
    assert_bits_equal(tp.grad(w), np.repeat(col[:, None], 3, axis=1))


def test_bias_broadcast_grad_is_serial_row_sum(rng):
    g0 = rng.standard_normal((6, 3)) * 10.0 ** rng.integers(-6, 7, (6, 3))
    tp = gt.Tape()
    bias = tp.param(np.zeros(3))
    h = tp.add(tp.const(np.zeros((6, 3))), bias)
    tp.backward(tp.sum(tp.mul(h, tp.const(g0))))
    expected = g0[0].copy()
    for i in range(1, 6):
        expected = expected + g0[i]
    assert_bits_equal(tp.grad(bias), expected)


def test_fan_out_sums(rng):
    tp = gt.Tape()
    x = tp.param(rng.standard_normal(5))
    y = tp.add(tp.muls(x, 3.0), tp.exp(x))
    tp.backward(tp.sum(y))
    ex = nx.exp(tp.value(x))
    assert_bits_equal(tp.grad(x), (0.0 + np.full(5, 3.0)) + ex)


def test_div_second_input_gets_minus_g_t_over_b(rng):
    a0, b0 = rng.standard_normal(4), rng.uniform(0.5, 2, 4)
    tp = gt.Tape()
    a, b = tp.param(a0), tp.param(b0)
    q = tp.div(a, b)
    tp.backward(tp.sum(q))
    t = a0 / b0
    assert_bits_equal(tp.grad(b), -((1.0 * t) / b0))
    assert_bits_equal(tp.grad(a), 1.0 / b0)


def test_relu_gradient_is_zero_at_zero():
    tp = gt.Tape()
    x = tp.param(np.array([-1.0, 0.0, 2.0]))
    tp.backward(tp.sum(tp.relu(x)))
    assert_bits_equal(tp.grad(x), [0.0, 0.0, 1.0])


def test_a_kink_is_listed_by_fd_check_not_failed():
    """relu at exactly 0 (issue 42: a kink is reported as non-smooth, not counted as a
    failure; it used to fail): the element is listed with its figures, the smooth one
    is checked."""
    tp = gt.Tape()
    x = tp.param(np.array([0.0, 1.0]))
    report = gt.fd_check(tp, tp.sum(tp.relu(x)))
    assert report.passed
    (p,) = report.params
    (n,) = p.nonsmooth
    assert n.index == (0,) and n.analytic == 0.0
    assert n.numeric == pytest.approx(0.5, rel=1e-8) == n.numeric_small   # the mean slope
    assert p.checked == 2 and p.worst_index == (1,) and p.analytic == 1.0


def test_const_only_branch_gets_no_gradient(rng):
    tp = gt.Tape()
    c = tp.const(rng.standard_normal(3))
    w = tp.param(rng.standard_normal(3))
    cc = tp.exp(c)                       # depends on consts only
    tp.backward(tp.sum(tp.mul(cc, w)))
    assert not tp.touched(cc) and not tp.touched(c)
    assert tp.touched(w)
