"""The documented floating-point orders, checked against plain scalar Python loops."""

import numpy as np
import pytest

from gradtool import numerics as nx
from gradtool.ops import OPS
from conftest import assert_bits_equal, require_c_compiler


def loop_sum(values):
    acc = 0.0
    for v in np.ravel(values):
        acc = acc + float(v)
    return acc


def loop_matmul(a, b):
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n))
    for i in range(m):
        for j in range(n):
            acc = 0.0
            for kk in range(k):
                acc = acc + float(a[i, kk]) * float(b[kk, j])
            out[i, j] = acc
    return out


def test_serial_sum_is_the_scalar_loop(rng):
    # values of wildly different magnitude make any reordering visible
    x = rng.standard_normal(1000) * 10.0 ** rng.integers(-8, 9, 1000)
    assert_bits_equal(nx.serial_sum(x), [loop_sum(x)])


def test_serial_sum_differs_from_pairwise_somewhere(rng):
    # proof that the order matters, so the test above could fail
    found = False
    for _ in range(50):
        x = rng.standard_normal(4096) * 10.0 ** rng.integers(-8, 9, 4096)
        if nx.serial_sum(x)[0] != np.sum(x):
            found = True
            break
    assert found


def test_serial_sum_of_negative_zeros_is_positive_zero():
    out = nx.serial_sum(np.array([-0.0, -0.0]))
    assert out[0] == 0.0 and not np.signbit(out[0])


def test_mean_is_sum_divided_by_n(rng):
    x = rng.standard_normal(37)
    assert_bits_equal(nx.serial_mean(x), [loop_sum(x) / 37.0])


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 7, 5), (8, 33, 4)])
def test_matmul_is_serial_k(rng, m, k, n):
    a = rng.standard_normal((m, k)) * 10.0 ** rng.integers(-6, 7, (m, k))
    b = rng.standard_normal((k, n))
    assert_bits_equal(nx.matmul(a, b), loop_matmul(a, b))


def test_bmm_is_matmul_per_batch(rng):
    a = rng.standard_normal((3, 4, 6))
    b = rng.standard_normal((3, 6, 2))
    out = nx.bmm(a, b)
    for i in range(3):
        assert_bits_equal(out[i], loop_matmul(a[i], b[i]))


def test_sum_axis_is_serial(rng):
    x = rng.standard_normal((4, 9, 3)) * 10.0 ** rng.integers(-8, 9, (4, 9, 3))
    out = nx.serial_sum_axis(x, 1)
    assert out.shape == (4, 1, 3)
    for i in range(4):
        for j in range(3):
            assert_bits_equal(out[i, 0, j], loop_sum(x[i, :, j]))


@pytest.mark.parametrize("out_shape,in_shape", [
    ((4, 5), (5,)), ((4, 5), (4, 1)), ((4, 5), (1, 1)), ((4, 5), (1,)),
    ((2, 3, 4), (3, 1)), ((2, 3, 4), (2, 1, 4)), ((2, 3, 4), (1, 3, 4)), ((2, 3, 4), (2, 3, 4)),
])
@pytest.mark.parametrize("path", ["compiled", "numpy"])
def test_reduce_to_shape_walks_out_row_major(rng, out_shape, in_shape, path, monkeypatch):
    if path == "compiled":
        require_c_compiler()
        assert nx.cpu_kernels() is not None
    else:
        monkeypatch.setattr(nx, "_DEFAULT", [None])       # as without a C compiler
    c = rng.standard_normal(out_shape) * 10.0 ** rng.integers(-8, 9, out_shape)
    c.flat[::3] = -0.0                                  # -0.0 + -0.0 stays -0.0: no 0.0 seed
    got = nx.reduce_to_shape(c, in_shape)
    # reference: a row-major walk over c, the first contribution starting each slot
    expected = np.zeros(in_shape)
    seen = np.zeros(in_shape, dtype=bool)
    padded = (1,) * (len(out_shape) - len(in_shape)) + tuple(in_shape)
    for idx in np.ndindex(*out_shape):
        tgt = tuple(0 if padded[ax] == 1 else idx[ax] for ax in range(len(out_shape)))
        tgt = tgt[len(out_shape) - len(in_shape):]
        if seen[tgt]:
            expected[tgt] = expected[tgt] + c[idx]
        else:
            expected[tgt] = c[idx]
            seen[tgt] = True
    assert_bits_equal(got, expected)


def test_relu_passes_nan_and_clears_negative_zero():
    out = OPS["relu"].forward(np.array([np.nan, -0.0, -1.0, 2.0]), None, 0.0, None)
    assert np.isnan(out[0]) and out[1] == 0.0 and not np.signbit(out[1])
    assert out[2] == 0.0 and out[3] == 2.0


def test_relu_and_its_gradient_match_their_definitions_on_every_special(rng):
    """relu = ``x if not (x <= 0) else +0.0`` and its gradient ``g if x > 0 else +0.0``,
    element for element, against np.where on specials and odd layouts (the table's
    rules run through expr.select_numpy's bit-mask path here)."""
    relu = OPS["relu"]
    specials = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 5e-324, -5e-324, 1e308, -1.5, 2.5]
    x = rng.choice(specials, (7, 9))
    g = rng.choice(specials, (7, 9))
    for xv, gv in [(x, g), (x.T, g.T), (x[:, ::2], g[:, ::2])]:
        want = np.where(xv <= 0.0, 0.0, xv)
        got = relu.forward(xv, None, 0.0, None)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert_bits_equal(got[~np.isnan(got)], want[~np.isnan(want)])
        assert_bits_equal(relu.backward(gv, xv, None, got, 0.0, None, True, False)[0],
                          np.where(xv > 0.0, gv, 0.0))


def test_softmax_rows_sum_close_to_one(rng):
    x = rng.standard_normal((5, 7)) * 30
    for axis in (0, 1):
        y = OPS["softmax"].forward(x, None, 0.0, {"axis": axis})
        assert np.allclose(y.sum(axis=axis), 1.0, rtol=0, atol=1e-14)


def test_native_and_numpy_matmul_give_identical_bits(rng):
    require_c_compiler()
    assert nx._native_kernels() is not None, "a C compiler is here, yet the native build failed"
    for m, k, n in [(1, 1, 1), (7, 13, 5), (64, 64, 128), (3, 300, 17)]:
        a = rng.standard_normal((m, k)) * 10.0 ** rng.integers(-8, 9, (m, k))
        b = rng.standard_normal((k, n)) * 10.0 ** rng.integers(-8, 9, (k, n))
        assert_bits_equal(nx.matmul(a, b), nx.matmul_numpy(a, b))
        assert_bits_equal(nx.matmul(a, b), loop_matmul(a, b)) if m * k * n < 2000 else None
        # transposed (non-contiguous) operands, as in the backward rules
        assert_bits_equal(nx.matmul(b.T, a.T), nx.matmul_numpy(b.T, a.T))
    a = rng.standard_normal((4, 6, 9))
    b = rng.standard_normal((4, 9, 3))
    assert_bits_equal(nx.bmm(a, b), nx.bmm_numpy(a, b))
    assert_bits_equal(nx.bmm(np.swapaxes(b, 1, 2), np.swapaxes(a, 1, 2)),
                      nx.bmm_numpy(np.swapaxes(b, 1, 2), np.swapaxes(a, 1, 2)))
