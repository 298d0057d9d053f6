"""The float32 contract (gradtool/numerics32.py) against its definitions, the machine's
fmaf, exact sums and its C rendering (gradtool/csrc/gt_real32.h), bit for bit."""

import ctypes
import math
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from gradtool import fdlibm, native
from gradtool import numerics as nx
from gradtool import numerics32 as n32
from conftest import require_c_compiler

F32 = np.float32

# ── the C rendering, compiled: gt_real32.h's functions behind plain entries ──

TEST_C = r"""
#include "gt_real32.h"
void t_fmaf(long long n, const float *a, const float *b, const float *c, float *out)
{
    for (long long i = 0; i < n; ++i) out[i] = gt_fmaf(a[i], b[i], c[i]);
}
/* rows of length n, row r at x + r*rstride, elements stride apart */
void t_sum32(long long rows, long long n, long long rstride, long long stride,
             const float *x, float *out)
{
    for (long long r = 0; r < rows; ++r) out[r] = gt_sum32(x + r * rstride, n, stride);
}
void t_sum32_bylanes(long long rows, long long n, long long rstride, long long stride,
                     const float *x, float *out)
{
    for (long long r = 0; r < rows; ++r) out[r] = gt_sum32_bylanes(x + r * rstride, n, stride);
}
double t_tree_sum64(long long n, const double *x) { return gt_tree_sum64(x, n, 1); }
void t_unary(int which, long long n, const float *x, float *out)
{
    for (long long i = 0; i < n; ++i) {
        float v = x[i], r;
        switch (which) {
        case 0: r = gt_expf(v); break;     case 1: r = gt_expm1f(v); break;
        case 2: r = gt_logf(v); break;     case 3: r = gt_log1pf(v); break;
        case 4: r = gt_tanhf(v); break;    case 5: r = gt_erff(v); break;
        case 6: r = gt_erfcf(v); break;    case 7: r = gt_sinf(v); break;
        case 8: r = gt_cosf(v); break;     default: r = gt_atanf(v); break;
        }
        out[i] = r;
    }
}
void t_atan2(long long n, const float *y, const float *x, float *out)
{
    for (long long i = 0; i < n; ++i) out[i] = gt_atan2f(y[i], x[i]);
}
"""
UNARY_ORDER = ["exp", "expm1", "log", "log1p", "tanh", "erf", "erfc", "sin", "cos", "atan"]


def _build(tmp_dir: Path, native_arch: bool):
    src = tmp_dir / "gt_test_real32.c"
    src.write_text(TEST_C)
    keys = [native.CSRC / "gt_real32.h", native.CSRC / "gt_math.h"]
    path = native.build_best("gt_test_real32", src, native.SAFE_FLAGS, keys,
                             native_arch=native_arch)
    lib = ctypes.CDLL(str(path))
    i64, ptr = ctypes.c_longlong, ctypes.c_void_p
    lib.t_fmaf.argtypes = [i64, ptr, ptr, ptr, ptr]
    lib.t_sum32.argtypes = [i64, i64, i64, i64, ptr, ptr]
    lib.t_sum32_bylanes.argtypes = [i64, i64, i64, i64, ptr, ptr]
    lib.t_tree_sum64.argtypes = [i64, ptr]
    lib.t_tree_sum64.restype = ctypes.c_double
    lib.t_unary.argtypes = [ctypes.c_int, i64, ptr, ptr]
    lib.t_atan2.argtypes = [i64, ptr, ptr, ptr]
    lib.path = path
    return lib


@pytest.fixture(scope="module")
def clibs(tmp_path_factory):
    """{"native": -march=native build, "portable": without}: both must give the same bits."""
    require_c_compiler()
    d = tmp_path_factory.mktemp("real32")
    libs = {"native": _build(d, True)}
    (d / "p").mkdir()
    libs["portable"] = _build(d / "p", False)
    return libs


def c_fmaf(lib, a, b, c):
    a, b, c = (np.ascontiguousarray(x, dtype=F32) for x in np.broadcast_arrays(a, b, c))
    out = np.empty_like(a)
    lib.t_fmaf(a.size, a.ctypes.data, b.ctypes.data, c.ctypes.data, out.ctypes.data)
    return out


def c_sum_rows(lib, x2d, entry="t_sum32"):
    """gt_sum32 (or ``entry``'s sum) over each row of a 2-d float32 array (any strides)."""
    x2d = np.asarray(x2d, dtype=F32)
    rows, n = x2d.shape
    out = np.empty(rows, dtype=F32)
    rs, s = (st // 4 for st in x2d.strides) if x2d.size else (0, 1)
    getattr(lib, entry)(rows, n, rs, s, x2d.ctypes.data, out.ctypes.data)
    return out


def same_bits(x, y):
    """Equal float32 bit patterns, any NaN equal to any NaN (payloads are not promised)."""
    x, y = np.asarray(x, dtype=F32), np.asarray(y, dtype=F32)
    return (x.view(np.int32) == y.view(np.int32)) | (np.isnan(x) & np.isnan(y))


def assert_same(got, want, what, *inputs):
    got, want = np.asarray(got, dtype=F32), np.asarray(want, dtype=F32)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    bad = np.flatnonzero(~same_bits(got, want).reshape(-1))
    assert bad.size == 0, "%s: %d differ, first at %d: %s -> %r, want %r" % (
        what, bad.size, bad[0], [float(np.ravel(i)[bad[0]]) for i in inputs],
        float(got.reshape(-1)[bad[0]]), float(want.reshape(-1)[bad[0]]))


# ── fmaf ────────────────────────────────────────────────────────────────────

def adversarial_triples(rng, n):
    """n float32 (a, b, c) triples, in classes, each of which some emulation gets wrong."""
    k = n // 10
    parts = []

    def sgn(size):
        return np.where(rng.random(size) < 0.5, -1.0, 1.0)

    def num(size, lo, hi, bits=24):
        m = rng.integers(1 << (bits - 1), 1 << bits, size).astype(np.float64)
        return sgn(size) * np.ldexp(m, rng.integers(lo, hi, size) - (bits - 1))

    # 1. any bit pattern: NaNs, infinities, subnormals, every exponent
    parts.append(tuple(rng.integers(0, 2**32, (3, k), dtype=np.uint32).view(F32)))
    # 2. ordinary numbers of mixed magnitude
    parts.append((num(k, -20, 20), num(k, -20, 20), num(k, -50, 40)))
    # 3. exact cancellation: c = -RN32(a*b) leaves the product's rounding error
    a, b = num(k, -60, 60), num(k, -60, 60)
    parts.append((a, b, -(a.astype(F32) * b.astype(F32)).astype(np.float64)))
    # 4. near ties: a*b = half an ulp of c times (1 - j^2 2^-46), either sign, j = 0 exact
    c = num(k, -100, 100)
    t = np.frexp(c)[1] - 24                              # c's ulp is 2^t
    j = rng.integers(0, 1 << 11, k).astype(np.float64)
    u = rng.integers(-20, 20, k)
    a = sgn(k) * np.ldexp(1.0 + j * 2.0**-23, u)
    b = np.ldexp(1.0 - j * 2.0**-23, t - 1 - u)
    parts.append((a, b, np.where(rng.random(k) < 0.2, np.copysign(np.ldexp(1.0, t + 23), c), c)))
    #    short significands: exact products landing on or next to a tie
    a, b = num(k, -10, 10, 12), num(k, -10, 10, 12)
    p = a * b
    half = np.ldexp(1.0, np.frexp(p)[1] - 26)
    parts.append((a, b, np.where(rng.random(k) < 0.5, half, -half) * rng.integers(1, 4, k)))
    # 5. subnormal and near-subnormal results
    a, b = num(k, -80, -60), num(k, -80, -60)
    c = np.where(rng.random(k) < 0.5, -(a * b).astype(F32).astype(np.float64),
                 num(k, -149, -120))
    parts.append((a, b, c))
    # 6. products that overflow float32, brought back (or not) by c
    a, b = num(k, 60, 70), num(k, 60, 68)
    big = float(np.finfo(F32).max)
    c = -np.sign(a * b) * np.where(rng.random(k) < 0.5, big, np.abs(num(k, 127, 128)))
    parts.append((a, b, np.where(rng.random(k) < 0.2, -c, c)))
    # 7. signed zeros, infinities and NaN against everything
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0**-149, -2.0**-149,
                        big, -big, 2.0**-126])

    def pick():
        return np.where(rng.random(k) < 0.5, special[rng.integers(0, len(special), k)],
                        num(k, -149, 127))
    parts.append((pick(), pick(), pick()))
    with np.errstate(all="ignore"):
        return tuple(np.concatenate([np.asarray(p[i], dtype=np.float64).astype(F32)
                                     for p in parts]) for i in range(3))


def test_fmaf_emulation_is_the_machines_fmaf_on_ten_million_triples(clibs):
    rng = np.random.default_rng(20261205)
    lib = clibs["native"]
    total = naive_wrong = plain_wrong = 0
    with np.errstate(all="ignore"):
        for _ in range(5):
            a, b, c = adversarial_triples(rng, 2_500_000)
            want = c_fmaf(lib, a, b, c)
            assert_same(n32.fmaf(a, b, c), want, "fmaf", a, b, c)
            total += a.size
            # what the emulation is not: one float64 rounding then one float32 rounding
            # (double rounding), and the unfused a*b then + c in float32
            naive = (a.astype(np.float64) * b + c.astype(np.float64)).astype(F32)
            naive_wrong += int(np.count_nonzero(~same_bits(naive, want)))
            plain_wrong += int(np.count_nonzero(~same_bits(a * b + c, want)))
            kinds = (np.isnan(want), np.isinf(want), want == 0, np.signbit(want) & (want == 0),
                     (np.abs(want) < 2.0**-126) & (want != 0))
            assert all(np.any(kk) for kk in kinds)
    assert total >= 10_000_000
    assert naive_wrong > 1000                # the ties do tell RO from a second RN
    assert plain_wrong > total // 10


def test_the_hardware_fmaf_is_an_fma_instruction_or_libms_fmaf(clibs):
    """The reference the emulation is checked against really is a fused multiply-add: the
    disassembly of t_fmaf shows an FMA instruction (-march=native on a CPU with FMA) or a
    call to libm's correctly rounded fmaf, never a multiply then an add."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump is not installed")
    for name, lib in clibs.items():
        text = subprocess.run([objdump, "-d", str(lib.path)], capture_output=True, text=True,
                              check=True).stdout
        body = text.split("<t_fmaf>:", 1)[1].split("\n\n", 1)[0]
        fused = any(op in body for op in ("vfmadd", "vfnmadd", "vfmsub")) or "fmaf@plt" in body
        assert fused, f"{name}: t_fmaf is not fused:\n{body[:2000]}"


def test_fmaf_signed_zeros_broadcasting_and_dtype():
    z = n32.fmaf([-1.0, 1.0, -1.0, 0.0], [0.0, 0.0, 0.0, -0.0], [0.0, -0.0, -0.0, -0.0])
    assert z.dtype == F32 and list(np.signbit(z)) == [False, False, True, True]
    tiny = n32.fmaf(-(2.0**-80), 2.0**-80, 0.0)           # rounds to zero, keeps the sign
    assert tiny == 0 and np.signbit(tiny)
    assert n32.fmaf(np.ones((3, 1), F32), np.arange(4, dtype=F32), 1.0).shape == (3, 4)
    # one rounding: (1 + 2^-12)^2 - 1 keeps the 2^-24 the unfused float32 loses
    x = F32(1 + 2.0**-12)
    assert n32.fmaf(x, x, F32(-1.0)) == F32(2.0**-11 + 2.0**-24)
    assert x * x - F32(1.0) == F32(2.0**-11)


# ── inner products ──────────────────────────────────────────────────────────

def loop_matmul(lib, a, b):
    """The chain in plain loops, every step the machine's fmaf (one C call per step)."""
    m, k = a.shape
    out = np.zeros((m, b.shape[1]), dtype=F32)
    for i in range(m):
        for j in range(b.shape[1]):
            acc = np.zeros(1, F32)
            for kk in range(k):
                acc = c_fmaf(lib, a[i, kk:kk + 1], b[kk:kk + 1, j], acc)
            out[i, j] = acc[0]
    return out


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 7, 5), (4, 0, 3), (2, 33, 3)])
def test_matmul_is_the_fmaf_chain(clibs, m, k, n):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a = rng.standard_normal((m, k)).astype(F32)
    b = rng.standard_normal((k, n)).astype(F32)
    got = n32.matmul(a, b)
    assert got.dtype == F32
    assert_same(got, loop_matmul(clibs["native"], a, b), "matmul")


def test_matmul_fuses_and_starts_from_positive_zero(clibs):
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((40, 64)) * 2.0 ** rng.integers(-8, 8, (40, 64))).astype(F32)
    b = rng.standard_normal((64, 30)).astype(F32)
    got = n32.matmul(a, b)
    # vectorised reference: the chain over k with the machine's fmaf
    acc = np.zeros((40, 30), F32)
    for kk in range(64):
        acc = c_fmaf(clibs["native"], a[:, kk:kk + 1], b[kk], acc)
    assert_same(got, acc, "matmul")
    unfused = np.zeros((40, 30), F32)
    for kk in range(64):
        unfused = unfused + a[:, kk:kk + 1] * b[kk]
    assert np.any(~same_bits(unfused, got))
    assert_same(n32.matmul(a.T.copy().T, b.T.copy().T), got, "matmul of views")
    z = n32.matmul(np.array([[-1.0, -2.0]], F32), np.zeros((2, 1), F32))
    assert z[0, 0] == 0 and not np.signbit(z[0, 0])


def test_compiled_products_are_the_numpy_chain(clibs):
    """The compiled f32 product (numerics32.matmul/bmm with a compiler: gt_matmul.h's
    tiles for float, csrc/gt_cpu.c -DGT_CPU_F32) against the numpy fmaf
    chain: tile edges, views of every layout, a stretched batch, K = 0, and NaN,
    infinities, subnormals and signed zeros among the operands."""
    assert n32.cpu_library() is not None
    rng = np.random.default_rng(17)
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 2.0**-149, 3e38], F32)
    for m, k, n in [(1, 1, 1), (4, 64, 64), (5, 70, 67), (9, 3, 130), (3, 0, 5), (0, 4, 2)]:
        a = (rng.standard_normal((m, k)) * 2.0 ** rng.integers(-30, 30, (m, k))).astype(F32)
        b = rng.standard_normal((k, n)).astype(F32)
        if a.size > 4:
            a.flat[rng.integers(0, a.size, 3)] = special[rng.integers(0, 7, 3)]
        want = n32.matmul_numpy(a, b)
        assert_same(n32.matmul(a, b), want, f"matmul {m}x{k}x{n}")
        assert_same(n32.matmul(np.asfortranarray(a), np.asfortranarray(b)), want, "F order")
        assert_same(n32.matmul(a.T.copy().T, b.T.copy().T), want, "transposed views")
    a = rng.standard_normal((3, 6, 70)).astype(F32)
    b = rng.standard_normal((3, 70, 66)).astype(F32)
    want = n32.bmm_numpy(a, b)
    assert_same(n32.bmm(a, b), want, "bmm")
    assert_same(n32.bmm(a, np.swapaxes(np.swapaxes(b, 1, 2).copy(), 1, 2)), want, "bmm b^T")
    assert_same(n32.bmm(a[:1], b), n32.bmm_numpy(a[:1], b), "bmm a of 1")
    assert_same(n32.bmm(np.broadcast_to(a[:1], a.shape), b), n32.bmm_numpy(a[:1], b),
                "bmm a stretched by stride 0")
    assert_same(n32.bmm(a, b[:1]), n32.bmm_numpy(a, b[:1]), "bmm b of 1")


def test_bmm_is_matmul_per_batch_and_stretches_a_batch_of_one():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 4, 6)).astype(F32)
    b = rng.standard_normal((3, 6, 5)).astype(F32)
    got = n32.bmm(a, b)
    for i in range(3):
        assert_same(got[i], n32.matmul(a[i], b[i]), "bmm")
    assert_same(n32.bmm(a[:1], b), np.stack([n32.matmul(a[0], b[i]) for i in range(3)]),
                "bmm, a stretched")
    assert_same(n32.bmm(a, b[:1]), np.stack([n32.matmul(a[i], b[0]) for i in range(3)]),
                "bmm, b stretched")


# ── the lane-tree sum ───────────────────────────────────────────────────────

def reference_sum(values) -> F32:
    """The documented order, literally: pad to whole blocks, lane sums serial over the
    chunks from +0.0, the perfect tree over the blocks padded to a power of two, the
    lane fold.  Python scalars, one np.float32 add at a time."""
    with np.errstate(over="ignore", invalid="ignore"):     # inf and NaN are sums too
        return _reference_sum(values)


def _reference_sum(values) -> F32:
    x = [F32(v) for v in np.ravel(values)]
    nb = max(1, -(-len(x) // n32.BLOCK))
    x += [F32(0.0)] * (nb * n32.BLOCK - len(x))
    parts = []
    for b in range(nb):
        lanes = []
        for lane in range(n32.LANES):
            acc = F32(0.0)
            for c in range(n32.CHUNK):
                acc = F32(acc + x[b * n32.BLOCK + c * n32.LANES + lane])
            lanes.append(acc)
        parts.append(lanes)
    while len(parts) & (len(parts) - 1):
        parts.append([F32(0.0)] * n32.LANES)
    while len(parts) > 1:
        parts = [[F32(p + q) for p, q in zip(parts[2 * j], parts[2 * j + 1])]
                 for j in range(len(parts) // 2)]
    v = parts[0]
    h = n32.LANES // 2
    while h:
        v = [F32(v[lane] + v[lane + h]) for lane in range(h)]
        h //= 2
    return v[0]


def awkward(rng, n):
    """Values whose sum depends on the order: mixed magnitudes with cancellation."""
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)
    pairs = np.arange(0, n - 1, 7)
    x[pairs] = -x[pairs + 1]
    return x.astype(F32)


SUM_LENGTHS = [0, 1, 2, 5, 31, 32, 33, 255, 256, 257, 511, 513, 1000, 2049, 4095, 8193]


@pytest.mark.parametrize("n", SUM_LENGTHS)
def test_sum_is_the_documented_order(n):
    rng = np.random.default_rng(n)
    x = awkward(rng, n)
    got = n32.sum(x)
    assert got.dtype == F32 and got.shape == ()
    assert_same(got, reference_sum(x), f"sum of {n}")


def test_sum_differs_from_the_serial_order_and_pairwise_numpy():
    rng = np.random.default_rng(1)
    x = awkward(rng, 5000)
    serial = np.add.accumulate(x)[-1]
    got = n32.sum(x)
    assert got != serial and got == reference_sum(x)


def test_sum_special_values():
    assert not np.signbit(n32.sum(np.array([-0.0, -0.0], F32)))     # +0.0, as documented
    assert not np.signbit(n32.sum(np.zeros(0, F32)))
    assert np.isnan(n32.sum(np.array([1.0, np.inf, -np.inf], F32)))
    assert n32.sum(np.array([np.inf] + [1.0] * 300, F32)) == np.inf
    big = np.full(600, np.finfo(F32).max / 4, F32)                   # overflows on the way
    assert n32.sum(big) == reference_sum(big) == np.inf
    sub = np.full(1000, 2.0**-149, F32)                              # subnormals kept
    assert n32.sum(sub) == F32(1000 * 2.0**-149)


@pytest.mark.parametrize("n", [10, 1000, 100_000, 1_000_000])
def test_sum_error_within_its_bound(n):
    rng = np.random.default_rng(n + 5)
    for x in (rng.standard_normal(n).astype(F32),                    # cancelling
              rng.random(n).astype(F32),                             # all positive
              awkward(rng, n)):
        exact = math.fsum(x.astype(np.float64))     # within 2^-53 relative of exact
        err = abs(float(n32.sum(x)) - exact)
        l1 = math.fsum(np.abs(x.astype(np.float64)))
        assert err <= n32.sum_bound(n) * l1 * (1 + 2.0**-40) + 2.0**-149, (n, err, l1)
    assert n32.sum_depth(1_000_000) == 24 and n32.sum_bound(1_000_000) < 1.5e-6


def test_axis_tuple_mean_and_broadcast_reductions_are_the_row_sums():
    rng = np.random.default_rng(11)
    x = awkward(rng, 3 * 300 * 5).reshape(3, 300, 5)
    rows = lambda arr: np.array([n32.sum(r) for r in arr], dtype=F32)
    assert_same(n32.sum_axis(x, 1), rows(np.moveaxis(x, 1, -1).reshape(15, 300))
                .reshape(3, 5)[:, None, :], "axis 1")
    assert_same(n32.sum_axis(x, -1), rows(x.reshape(900, 5)).reshape(3, 300, 1), "axis -1")
    # two axes: the reduced coordinates row-major (axis 0 slower than axis 2), however named
    want = rows(np.transpose(x, (1, 0, 2)).reshape(300, 15))
    for axes in ((0, 2), (2, 0)):
        assert_same(n32.sum_axes(x, axes), want.reshape(1, 300, 1), f"axes {axes}")
        assert_same(n32.sum(x, axes), want, f"sum axes {axes}")
    assert_same(n32.sum_all(x), [reference_sum(x)], "sum_all")
    assert_same(n32.mean(x, 1), n32.sum(x, 1) / F32(300), "mean")
    assert_same(n32.mean_all(x), n32.sum_all(x) / F32(x.size), "mean_all")
    # broadcast reduction: [3, 300, 5] onto [300, 1]: each element's 15 contributions
    assert_same(n32.reduce_to_shape(x, (300, 1)), want.reshape(300, 1), "reduce_to_shape")
    assert_same(n32.reduce_to_shape(x, (3, 1, 5)), n32.sum_axis(x, 1), "reduce middle")
    assert n32.reduce_to_shape(x, x.shape) is x
    with pytest.raises(ValueError):
        n32.sum(x, (0, 0))


def test_shard_mean_and_scatter_rows_in_float32():
    rng = np.random.default_rng(2)
    parts = [rng.standard_normal(7).astype(F32) for _ in range(3)]
    got = n32.shard_mean(parts)
    assert got.dtype == F32
    assert_same(got, ((parts[0] + parts[1]) + parts[2]) / F32(3), "shard_mean")
    x = rng.standard_normal((6, 2)).astype(F32)
    ids = np.array([1, 0, 1, 3, 1, 0])
    out = n32.scatter_rows(x, ids, 4)
    assert out.dtype == F32
    assert_same(out[1], ((F32(0) + x[0]) + x[2]) + x[4], "scatter row 1")
    assert_same(out[2], [0, 0], "scatter empty row")


# ── the C rendering gives the same bits ─────────────────────────────────────

def test_c_fmaf_and_sum_are_the_numpy_bits(clibs):
    rng = np.random.default_rng(99)
    a, b, c = adversarial_triples(rng, 200_000)
    with np.errstate(all="ignore"):
        want = n32.fmaf(a, b, c)
    for name, lib in clibs.items():
        assert_same(c_fmaf(lib, a, b, c), want, f"{name} gt_fmaf", a, b, c)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 2.0**-149, np.finfo(F32).max], F32)
    lengths = SUM_LENGTHS + [65536 * 2 + 77, 1_000_003]
    for n in lengths:
        x = awkward(rng, n)
        cases = [x]
        if n:
            y = x.copy()
            y[rng.integers(0, n, 3)] = specials[rng.integers(0, specials.size, 3)]
            cases.append(y)
            cases.append(np.full(n, -0.0, F32))
        for v in cases:
            want = n32.sum(v)
            for name, lib in clibs.items():
                assert_same(c_sum_rows(lib, v[None, :]), [want], f"{name} gt_sum32 n={n}")
            assert_same(c_sum_rows(clibs["native"], v[None, :], "t_sum32_bylanes"), [want],
                        f"gt_sum32_bylanes n={n}")
    # strided rows: a column sum (stride = row length) and many short rows
    m = awkward(rng, 600 * 9).reshape(600, 9)
    for name, lib in clibs.items():
        assert_same(c_sum_rows(lib, m.T), n32.sum(m, 0), f"{name} strided")
        assert_same(c_sum_rows(lib, m), n32.sum(m, 1), f"{name} rows")
        assert_same(c_sum_rows(lib, m.T, "t_sum32_bylanes"), n32.sum(m, 0), f"{name} by lanes")


def test_c_tree_sum64_is_the_same_order_in_float64(clibs):
    """gt_tree_sum64 (used only to time the order in float64) is the lane-tree order: the
    numpy tree in float64 gives its bits."""
    rng = np.random.default_rng(5)
    for n in (0, 1, 300, 4097, 100_001):
        x = rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)
        want = n32._lane_tree(x[:, None])[0] if n else 0.0
        got = clibs["native"].t_tree_sum64(n, np.ascontiguousarray(x).ctypes.data)
        assert np.float64(got).view(np.int64) == np.float64(want).view(np.int64), n


# ── transcendentals ─────────────────────────────────────────────────────────

def unary_inputs(rng, n):
    """float32 inputs: every kind of bit pattern plus each function's busy range."""
    x = [rng.integers(0, 2**32, n, dtype=np.uint32).view(F32),
         rng.uniform(-10, 10, n).astype(F32), rng.uniform(-1, 1, n).astype(F32),
         np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-149, -2.0**-149, 88.72, 88.73,
                   -103.9, -104.0, 1.0, -1.0, 3.4e38, 1e-30, 9.0, 4.0], F32)]
    return np.concatenate(x)


@pytest.mark.filterwarnings("ignore:.*encountered in cast")
def test_unary_is_fdlibm_then_one_rounding(clibs):
    rng = np.random.default_rng(31)
    x = unary_inputs(rng, 200_000)
    for which, name in enumerate(UNARY_ORDER):
        want = np.asarray(getattr(fdlibm, name)(x.astype(np.float64))).astype(F32)
        got = n32.unary(name, x)
        assert got.dtype == F32
        assert_same(got, want, name, x)
        for lib_name, lib in clibs.items():
            out = np.empty_like(x)
            lib.t_unary(which, x.size, x.ctypes.data, out.ctypes.data)
            assert_same(out, want, f"{lib_name} gt_{name}f", x)
    y = unary_inputs(rng, 50_000)
    xx = np.roll(y, 17)
    want = np.asarray(fdlibm.atan2(y.astype(np.float64), xx.astype(np.float64))).astype(F32)
    assert_same(n32.atan2(y, xx), want, "atan2", y, xx)
    for lib_name, lib in clibs.items():
        out = np.empty_like(y)
        lib.t_atan2(y.size, y.ctypes.data, xx.ctypes.data, out.ctypes.data)
        assert_same(out, want, f"{lib_name} gt_atan2f", y, xx)
    with pytest.raises(ValueError):
        n32.unary("sqrt", x)


def test_unary_within_one_float32_ulp_of_exact():
    """Spot check of the bound (the exhaustive measurement is scripts/accuracy_f32.py):
    each result is one of the two float32 neighbours of the exact value."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.prec = 80
    rng = np.random.default_rng(4)
    x = rng.uniform(-4, 4, 300).astype(F32)
    fns = {"exp": mpmath.exp, "log": mpmath.log, "tanh": mpmath.tanh, "erf": mpmath.erf,
           "sin": mpmath.sin, "atan": mpmath.atan}
    for name, fn in fns.items():
        xs = np.abs(x) + F32(1e-3) if name == "log" else x
        got = n32.unary(name, xs)
        for xi, gi in zip(xs, got):
            exact = fn(mpmath.mpf(float(xi)))
            lo = np.nextafter(gi, F32(-np.inf))
            hi = np.nextafter(gi, F32(np.inf))
            assert mpmath.mpf(float(lo)) <= exact <= mpmath.mpf(float(hi)), (name, xi, gi)


# ── CUDA: the header compiles under nvcc, and the PTX keeps the contract ────

CUDA_TEST = r"""
#include "gt_real32.h"
#define GT_I (blockIdx.x * (long long)blockDim.x + threadIdx.x)
extern "C" __global__ void k_fmaf(long long n, const float *a, const float *b,
                                  const float *c, float *o)
{ long long i = GT_I; if (i < n) o[i] = gt_fmaf(a[i], b[i], c[i]); }
extern "C" __global__ void k_sum32_warp(long long rows, long long n, const float *x, float *o)
{
    long long r = GT_I / 32;
    if (r < rows) { float s = gt_sum32_warp(x + r * n, n, 1); if ((threadIdx.x & 31) == 0) o[r] = s; }
}
extern "C" __global__ void k_sum32_thread(long long rows, long long n, const float *x, float *o)
{ long long r = GT_I; if (r < rows) o[r] = gt_sum32(x + r * n, n, 1); }
extern "C" __global__ void k_unary(long long n, const float *x, float *o)
{
    long long i = GT_I;
    if (i < n) o[i] = __fadd_rn(gt_expf(x[i]), __fmul_rn(gt_tanhf(x[i]), gt_erff(x[i])));
}
"""


def test_gt_real32_compiles_under_nvcc_with_fma_only_in_fmaf(tmp_path):
    """Real nvcc: the header builds for sm_90 with the device engine's options plus
    -ftz=false; its PTX has fma.rn.f32 in gt_fmaf's kernel only, no .ftz anywhere, the
    warp sum's five shuffles (and the broadcast), and each f32 function one rounding of
    a double (cvt.rn.f32.f64); no kernel has a stack frame.  Running it needs a GPU:
    scripts/gpu_check.sh."""
    import re
    from support import assert_fma_only_in_inner_products, ptx_entries
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    src = tmp_path / "k32.cu"
    src.write_text(CUDA_TEST)
    out = tmp_path / "k32.ptx"
    subprocess.run([nvcc, "--ptx", "-arch", "sm_90", "--fmad=false", "-ftz=false",
                    f"-I{native.CSRC}", str(src), "-o", str(out)], check=True,
                   capture_output=True, timeout=300)
    text = out.read_text()
    assert ".ftz" not in text
    assert_fma_only_in_inner_products(text, "f32", {"k_fmaf"})
    entries = ptx_entries(text)
    assert len(re.findall(r"shfl\.sync\.down", entries["k_sum32_warp"])) == 5
    assert re.search(r"shfl\.sync\.idx", entries["k_sum32_warp"])
    for name in ("k_sum32_warp", "k_sum32_thread"):
        assert re.search(r"add\.rn\.f32", entries[name]), name
    assert len(re.findall(r"cvt\.rn\.f32\.f64", entries["k_unary"])) == 3
    # no local memory: the sums' level stacks and the lane fold live in registers
    cubin = subprocess.run([nvcc, "--cubin", "-arch", "sm_90", "--fmad=false", "-ftz=false",
                            "-Xptxas", "-v", f"-I{native.CSRC}", str(src),
                            "-o", str(tmp_path / "k32.cubin")],
                           capture_output=True, text=True, timeout=300)
    assert cubin.returncode == 0, cubin.stderr
    frames = re.findall(r"(\d+) bytes stack frame", cubin.stderr)
    assert len(frames) == 4 and set(frames) == {"0"}, cubin.stderr


def test_gt_real32_on_the_gpu_gives_the_numpy_bits():
    """On a GPU (scripts/gpu_check.sh runs this test): gt_fmaf (__fmaf_rn), the warp and
    the one-thread lane-tree sums, and the f32 functions give numerics32's bits."""
    from gradtool.device.cuda import cuda_status
    ok, why = cuda_status()
    if not ok:
        pytest.skip(f"no CUDA backend here: {why}")
    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as drv
    from pycuda.compiler import SourceModule
    mod = SourceModule(CUDA_TEST, no_extern_c=True, options=["--fmad=false", "-ftz=false"],
                       include_dirs=[str(native.CSRC)])
    rng = np.random.default_rng(8)
    i64 = np.int64

    def run(name, n_threads, *args):
        mod.get_function(name)(*args, block=(128, 1, 1), grid=((n_threads + 127) // 128, 1))
        drv.Context.synchronize()

    a, b, c = adversarial_triples(rng, 1_000_000)
    out = np.empty_like(a)
    run("k_fmaf", a.size, i64(a.size), drv.In(a), drv.In(b), drv.In(c), drv.Out(out))
    with np.errstate(all="ignore"):
        assert_same(out, n32.fmaf(a, b, c), "gpu fmaf", a, b, c)
    for n in SUM_LENGTHS + [100_003]:
        rows = 3
        x = np.ascontiguousarray(np.stack([awkward(rng, n) for _ in range(rows)]))
        if n:
            x[1, n // 2] = np.inf
            x[2] = -0.0
        want = n32.sum(x, 1)
        for name, threads in (("k_sum32_warp", rows * 32), ("k_sum32_thread", rows)):
            got = np.empty(rows, np.float32)
            run(name, threads, i64(rows), i64(n), drv.In(x), drv.Out(got))
            assert_same(got, want, f"{name} n={n}")
    x = unary_inputs(rng, 200_000)
    got = np.empty_like(x)
    run("k_unary", x.size, i64(x.size), drv.In(x), drv.Out(got))
    with np.errstate(all="ignore"):
        want = n32.unary("exp", x) + n32.unary("tanh", x) * n32.unary("erf", x)
    assert_same(got, want, "gpu exp + tanh * erf", x)
