"""The documented floating-point orders, checked against plain scalar Python loops."""

import math
from fractions import Fraction

import numpy as np
import pytest

from gradtool import cpulib, numerics as nx
from gradtool.expr import select_numpy
from gradtool.ops import OPS
from conftest import assert_bits_equal, require_c_compiler


def loop_sum(values):
    acc = 0.0
    for v in np.ravel(values):
        acc = acc + float(v)
    return acc


def exact_fma(a: float, b: float, c: float) -> float:
    """a*b + c rounded once, for finite operands, from the exact rational (Python's
    int/int division is correctly rounded, ties to even); a zero keeps IEEE's sign."""
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        return -0.0 if math.copysign(1, a * b) < 0 and math.copysign(1, c) < 0 else 0.0
    return exact.numerator / exact.denominator


def loop_matmul(a, b):
    """The FMA chain in plain Python: acc = +0.0, then acc = fma(a[i,k], b[k,j], acc)."""
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n))
    for i in range(m):
        for j in range(n):
            acc = 0.0
            for kk in range(k):
                acc = exact_fma(float(a[i, kk]), float(b[kk, j]), acc)
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
        monkeypatch.setattr(cpulib, "_DEFAULT", [None])       # as without a C compiler
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


@pytest.mark.parametrize("out_shape,in_shape", [
    ((5, 6, 7, 3), (1, 6, 1, 1)),         # a conv bias over NCHW: N, then H*W, broadcast
    ((3, 1, 130, 4), (1, 130, 1)),        # size-1 axes aside; kept blocks of 64 and more
    ((2, 3, 4, 5), (3, 4, 1)),            # two kept axes between broadcast ones
])
def test_reduce_to_shape_with_leading_and_trailing_broadcast_axes(rng, out_shape, in_shape):
    """The compiled path that sums straight from c (gt_sum_outer_inner) against the
    transposed row walk (gt_sum_rows) and the numpy one: the same bits."""
    require_c_compiler()
    c = rng.standard_normal(out_shape) * 10.0 ** rng.integers(-8, 9, out_shape)
    c.flat[::3] = -0.0
    got = nx.reduce_to_shape(c, in_shape)
    nd = len(out_shape)
    padded = (1,) * (nd - len(in_shape)) + tuple(in_shape)
    bcast = [ax for ax in range(nd) if padded[ax] == 1 and out_shape[ax] != 1]
    kept = [ax for ax in range(nd) if ax not in bcast]
    rows = np.ascontiguousarray(np.transpose(c, bcast + kept)).reshape(
        math.prod(out_shape[ax] for ax in bcast), -1)
    expected = np.add.accumulate(rows, axis=0)[-1].reshape(in_shape)
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


def test_the_compiled_select_against_zero_gives_np_where_bits(rng, monkeypatch):
    """expr.select_numpy's two ways of ``np.where(cond, x, +0.0)`` (and of
    ``np.where(cond, +0.0, x)``): csrc/gt_cpu.c's gt_select_zero and the numpy bit mask
    it falls back to, each against np.where's bit patterns, NaN payloads and signed
    zeros included."""
    require_c_compiler()
    assert nx.cpu_kernels() is not None, "a C compiler is here, yet the CPU kernels failed"
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 5e-324, -5e-324,
                         1e308, -1.5, 2.5])
    payload = np.array([0x7ff0000000000001, 0xfff8dead0000beef], dtype=np.uint64).view(
        np.float64)
    x = rng.choice(np.concatenate([specials, payload, rng.standard_normal(5)]), 10_007)
    cond = rng.random(x.size) < 0.5
    want = {False: np.where(cond, x, 0.0), True: np.where(cond, 0.0, x)}
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(nx, "cpu_kernels", lambda: None)
        for invert, got in ((False, select_numpy(cond, x, 0.0)),
                            (True, select_numpy(cond, 0.0, x))):
            assert np.array_equal(got.view(np.int64), want[invert].view(np.int64)), \
                (compiled, invert)
        # a strided value is made contiguous first; the result is the same
        got = select_numpy(cond[::2].copy(), x[::2], 0.0)
        assert np.array_equal(got.view(np.int64), np.where(cond[::2], x[::2], 0.0).view(
            np.int64))


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


# ── the fused multiply-add: numpy's exact emulation against the machine's fma ──

HW_FMA_C = r"""
#include <math.h>
/* fma() from <math.h>: one vfmadd instruction under -march=native on a CPU with FMA,
 * else the C library's correctly rounded fma */
void gt_test_fma(long long n, const double *a, const double *b, const double *c, double *out)
{
    for (long long i = 0; i < n; ++i) out[i] = fma(a[i], b[i], c[i]);
}
"""


@pytest.fixture(scope="module")
def hardware_fma(tmp_path_factory):
    import ctypes
    from gradtool import native
    require_c_compiler()
    src = tmp_path_factory.mktemp("hwfma") / "gt_test_fma.c"
    src.write_text(HW_FMA_C)
    lib = ctypes.CDLL(str(native.build_best("gt_test_fma", src, native.SAFE_FLAGS)))
    ptr = ctypes.c_void_p
    lib.gt_test_fma.argtypes = [ctypes.c_longlong, ptr, ptr, ptr, ptr]
    lib.gt_test_fma.restype = None

    def run(a, b, c):
        a, b, c = (np.ascontiguousarray(x, dtype=np.float64) for x in (a, b, c))
        out = np.empty_like(a)
        lib.gt_test_fma(a.size, a.ctypes.data, b.ctypes.data, c.ctypes.data, out.ctypes.data)
        return out
    return run


def adversarial_triples(rng, n):
    """n (a, b, c) float64 triples, in classes, each of which some fma emulation gets wrong."""
    k = n // 10
    parts = []

    def mant(size, bits=53):
        # a significand in [1, 2) with `bits` significant bits
        m = rng.integers(1 << (bits - 1), 1 << bits, size, dtype=np.int64).astype(np.float64)
        return np.ldexp(m, -(bits - 1))

    def sgn(size):
        return np.where(rng.random(size) < 0.5, -1.0, 1.0)

    def num(size, lo, hi, bits=53):
        return sgn(size) * np.ldexp(mant(size, bits), rng.integers(lo, hi, size))

    # 1. any bit pattern: NaNs, infinities, subnormals, every exponent
    parts.append(tuple(rng.integers(0, 2**63, (3, k), dtype=np.int64).view(np.float64)
                       * sgn((3, k))))
    # 2. ordinary numbers of mixed magnitude
    parts.append((num(2 * k, -30, 30), num(2 * k, -30, 30), num(2 * k, -80, 60)))
    # 3. exact cancellation: c = -RN(a*b) leaves the product's rounding error
    a, b = num(k, -500, 500), num(k, -500, 500)
    parts.append((a, b, -(a * b)))
    # 4. short significands: exact products, results exactly on or next to a tie
    a, b = num(k, -40, 40, 27), num(k, -40, 40, 27)
    c = num(k, -40, 40)
    p = a * b
    e = np.frexp(c)[1]
    half = np.ldexp(1.0, e - 54)                        # half an ulp of c
    a2 = np.ldexp(np.floor(rng.random(k) * 8) + 1, e - 57)
    b2 = sgn(k) * np.where(rng.random(k) < 0.5, 1.0, 1.0 + 2.0 ** -52)
    parts.append((np.concatenate([a, a2]), np.concatenate([b, b2]),
                  np.concatenate([-p + half * sgn(k), c])))
    # 5. subnormal and near-subnormal results: tiny products against tiny c
    m = k // 25
    a, b = num(m, -560, -500), num(m, -560, -500)
    c = np.where(rng.random(m) < 0.5, -(a * b), num(m, -1074, -1020))
    parts.append((a, b, c))
    #    products below the subnormals against c = +-2^-1074 and friends: ties at 2^-1075
    a = np.ldexp(mant(m, 3), rng.integers(-560, -530, m))
    b = sgn(m) * np.ldexp(1.0, -1075 - np.frexp(a)[1] + 1 + rng.integers(-2, 3, m))
    c = sgn(m) * np.ldexp(rng.integers(1, 8, m).astype(float), -1074)
    parts.append((a, b, c))
    # 6. products that overflow before the add, brought back by c
    a, b = num(k, 500, 530), num(k, 494, 500)
    c = -np.sign(a * b) * np.where(rng.random(k) < 0.5, np.finfo(float).max,
                                   np.ldexp(mant(k), 1023))
    parts.append((a, b, c))
    # 7. products that underflow before the add, meeting a normal c
    a, b = num(k, -600, -500), num(k, -600, -520)
    parts.append((a, b, num(k, -1030, -900)))
    # 8. signed zeros, infinities and NaN against everything
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 5e-324, -5e-324,
                        np.finfo(float).max, -np.finfo(float).max, 2.0 ** -1022])
    pick = lambda: np.where(rng.random(k) < 0.5, special[rng.integers(0, len(special), k)],
                            num(k, -1074, 1023))
    parts.append((pick(), pick(), pick()))
    a, b, c = (np.concatenate([np.broadcast_to(p[i], p[0].shape) for p in parts])
               for i in range(3))
    return a, b, c


def _same_bits(x, y):
    """Equal bit patterns, any NaN equal to any NaN (payloads are not promised)."""
    return (x.view(np.int64) == y.view(np.int64)) | (np.isnan(x) & np.isnan(y))


def test_fma_emulation_is_the_machines_fma_on_ten_million_triples(hardware_fma):
    rng = np.random.default_rng(20261202)
    total = 0
    naive_wrong = 0
    with np.errstate(all="ignore"):
        for _ in range(5):
            a, b, c = adversarial_triples(rng, 2_250_000)
            want = hardware_fma(a, b, c)
            got = nx.fma(a, b, c)
            same = _same_bits(got, want)
            bad = np.flatnonzero(~same)
            assert bad.size == 0, "fma(%s, %s, %s): numpy %s, machine %s" % tuple(
                x[bad[0]].hex() for x in (a, b, c, got, want))
            total += a.size
            naive_wrong += int(np.count_nonzero(~_same_bits(a * b + c, want)))
            kinds = (np.isnan(want), np.isinf(want), want == 0,
                     (np.abs(want) < 2.0 ** -1022) & (want != 0))
            assert all(np.any(k) for k in kinds)
    assert total >= 10_000_000
    assert naive_wrong > total // 10       # the triples do tell a*b + c from the fma


def test_fma_signed_zeros_and_broadcasting():
    z = nx.fma(np.array([-1.0, 1.0, -1.0, 0.0]), np.array([0.0, 0.0, 0.0, -0.0]),
               np.array([0.0, -0.0, -0.0, -0.0]))
    assert list(np.signbit(z)) == [False, False, True, True]
    tiny = nx.fma(-2.0 ** -600, 2.0 ** -600, 0.0)        # rounds to zero, keeps the sign
    assert tiny == 0 and np.signbit(tiny)
    assert nx.fma(np.ones((3, 1)), np.arange(4.0), 1.0).shape == (3, 4)
    # the chain's start +0.0: an all-zero-product dot is +0.0, like the old contract
    assert not np.signbit(nx.matmul_numpy(np.array([[-1.0, -2.0]]), np.zeros((2, 1))))[0, 0]
