"""erf, sin, cos and log1p of gradtool.fdlibm and gradtool/csrc/gt_math.h, tested like
exp and log (tests/test_fdlibm.py; the shared helpers are in tests/support.py): accuracy against
50-digit mpmath, special values bitwise, canonical NaNs, numpy == C bit for bit on ~200k
inputs (two compilers' flags), fdlibm itself through Java's StrictMath (sin, cos, log1p),
(the header compiling as CUDA, without an FMA, is tested for every function in
tests/test_fdlibm.py)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from gradtool import fdlibm as F
from gradtool.fdlibm import _rem_pio2
from support import (CANON_NAN, CC_FLAGS, assert_special_values, SPECIALS, around, assert_strictmath, bits,
                     c_parity_outputs, from_bits, hiword, mpmath, parity_inputs,
                     random_doubles, ulp_errors)

FUNCS = ("erf", "sin", "cos", "log1p")
nan, inf = float("nan"), float("inf")
PIO2 = np.pi / 2


def trig_inputs(rng, n):
    """Where sin and cos are hard: near multiples of pi/2 (small and large), every
    branch of the reduction (|x| < 3pi/4, medium up to 2^19*pi/2, large), huge values,
    and the classic worst case of the reduction (6381956970095103 * 2^797)."""
    k = rng.integers(-40, 40, n // 4).astype(float)
    return np.concatenate([
        rng.uniform(-10.0, 10.0, n), rng.uniform(-1e6, 1e6, n // 2),
        random_doubles(rng, n, 0x3E0, 0x7FE),                      # 2^-33 .. 1.8e308
        around(rng, np.arange(1, 64) * PIO2, 4, 2000),            # near n*pi/2 (medium)
        around(rng, [hiword(h) for h in (0x3FE921FB, 0x4002D97C, 0x413921FB, 0x3FF921FB,
                                         0x3E400000, 0x3FD33333, 0x3FE90000)], 20, 3000),
        k * PIO2, np.array([6381956970095103.0 * 2.0 ** 797, 5.319372648326541e255,
                            1e22, 1e300, 1.7976931348623157e308]),
    ])


def accuracy_inputs(fname, rng, n=600):
    if fname == "erf":
        return np.concatenate([rng.uniform(-6.5, 6.5, n), random_doubles(rng, n, 0x3C0, 0x401),
                               random_doubles(rng, n // 4, 0x001, 0x3C0),
                               rng.uniform(0.8, 1.3, n // 2), rng.uniform(2.7, 3.0, n // 2)])
    if fname in ("sin", "cos"):
        return trig_inputs(rng, n)
    if fname == "log1p":
        x = np.concatenate([rng.uniform(-1.0, 1.0, n), random_doubles(rng, n, 0x3C0, 0x7FE),
                            -1.0 + 2.0 ** rng.uniform(-50, -1, n // 2),
                            rng.uniform(-3e-6, 3e-6, n // 4), rng.uniform(0.4, 0.45, n // 4),
                            rng.uniform(-0.3, -0.28, n // 4)])
        return x[x > -1.0]
    raise AssertionError(fname)


@pytest.mark.parametrize("fname", FUNCS)
def test_accuracy_vs_mpmath(fname):
    """Within 1 ulp of the exact value: at most one double from the correctly rounded."""
    if mpmath is None:
        pytest.skip("mpmath not installed")
    rng = np.random.default_rng(sum(map(ord, fname)))
    x = accuracy_inputs(fname, rng)
    y = getattr(F, fname)(x)
    assert np.isfinite(y).all()
    keep = y != 0.0                             # erf(0), sin(0): exact; no ulp of 0 here
    x, y = x[keep], y[keep]
    errs, dists = ulp_errors(fname, x, y)
    worst = int(np.argmax(errs))
    assert errs.max() < 1.0, f"{fname}({x[worst]!r}) = {y[worst]!r}: {errs.max():.3f} ulp"
    assert dists.max() <= 1, fname
    if "GT_FDLIBM_VERBOSE" in os.environ:
        print(f"\n{fname}: {x.size} inputs, max {errs.max():.3f} ulp", file=sys.stderr)


SPECIAL_CASES = {
    "erf": [(inf, 1.0), (-inf, -1.0), (nan, nan), (-nan, nan), (0.0, 0.0), (-0.0, -0.0),
            (5e-324, 5e-324), (-5e-324, -5e-324), (1e-300, 1.1283791670955126e-300),
            (6.0, 1.0), (-6.0, -1.0),
            (30.0, 1.0), (-1e308, -1.0), (1.0, 0.8427007929497149),
            (-1.0, -0.8427007929497149), (0.5, 0.5204998778130465)],
    "sin": [(inf, nan), (-inf, nan), (nan, nan), (-nan, nan), (0.0, 0.0), (-0.0, -0.0),
            (5e-324, 5e-324), (-5e-324, -5e-324), (1e-300, 1e-300), (1.0, 0.8414709848078965),
            (-1.0, -0.8414709848078965), (np.pi, 1.2246467991473532e-16),
            (1e22, -0.8522008497671888), (1.7976931348623157e308, 0.004961954789184062)],
    "cos": [(inf, nan), (-inf, nan), (nan, nan), (-nan, nan), (0.0, 1.0), (-0.0, 1.0),
            (5e-324, 1.0), (1e-300, 1.0), (1.0, 0.5403023058681398),
            (-1.0, 0.5403023058681398), (np.pi, -1.0), (np.pi / 2, 6.123233995736766e-17),
            (1e22, 0.523214785395139), (1.7976931348623157e308, -0.9999876894265599)],
    "log1p": [(inf, inf), (-inf, nan), (nan, nan), (-nan, nan), (0.0, 0.0), (-0.0, -0.0),
              (-1.0, -inf), (-1.5, nan), (5e-324, 5e-324), (-5e-324, -5e-324),
              (1e-300, 1e-300), (1.0, 0.6931471805599453), (-0.5, -0.6931471805599453),
              (1.7976931348623157e308, 709.782712893384), (np.e - 1.0, 1.0)],
}


@pytest.mark.parametrize("fname", FUNCS)
def test_special_values_bitwise(fname):
    assert_special_values(getattr(F, fname), SPECIAL_CASES[fname])


@pytest.mark.parametrize("fname", FUNCS)
def test_every_nan_is_canonical_and_shapes_are_kept(fname):
    f = getattr(F, fname)
    x = np.concatenate([parity_inputs(seed=7, n_random=4000), SPECIALS])
    y = f(x)
    assert (bits(y[np.isnan(y)]) == CANON_NAN).all()
    assert isinstance(f(0.5), np.ndarray) and f(0.5).shape == () and f(0.5).dtype == np.float64
    assert f(np.zeros((0, 3))).shape == (0, 3)
    a = np.linspace(0.1, 3.0, 24).reshape(2, 3, 4)
    assert np.array_equal(bits(f(a.transpose(2, 0, 1))), bits(f(a).transpose(2, 0, 1)))
    before = a.copy()
    f(a)
    assert np.array_equal(a, before)


def test_reduction_of_large_arguments_is_exact():
    """rem_pio2's y0 + y1 is x - n*pi/2 to fdlibm's prec-2 accuracy (64 bits: 2^-64
    relative; measured 2^-71.9 on 300 such x), checked with mpmath at 1300 bits (more
    than the 2/pi table's 1584 bits need for doubles) on large and huge x; n agrees mod 8."""
    if mpmath is None:
        pytest.skip("mpmath not installed")
    rng = np.random.default_rng(3)
    x = np.concatenate([random_doubles(rng, 60, 0x413, 0x7FE, sign=True),
                        np.array([6381956970095103.0 * 2.0 ** 797, 1e22, 1.7976931348623157e308])])
    n, y0, y1 = _rem_pio2._rem_pio2(x)
    with mpmath.mp.workprec(1300):
        half_pi = mpmath.mp.pi / 2
        for xi, ni, a, b in zip(x.tolist(), n.tolist(), y0.tolist(), y1.tolist(), strict=True):
            exact = mpmath.mpf(xi) - mpmath.nint(mpmath.mpf(xi) / half_pi) * half_pi
            assert abs(a) <= float(half_pi / 2) * (1 + 1e-15)
            assert abs(mpmath.mpf(a) + b - exact) <= abs(exact) * mpmath.mpf(2) ** -64, xi
            k = int(mpmath.nint(mpmath.mpf(xi) / half_pi))
            assert (k - ni) % 8 == 0, xi


# ---------------------------------------------------------------------------
# numpy == C, bit for bit
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parity_data():
    rng = np.random.default_rng(77)
    x = np.concatenate([parity_inputs(n_random=48_000), trig_inputs(rng, 8000),
                        rng.uniform(-6.5, 6.5, 20_000), rng.uniform(-1.0, 1.0, 10_000),
                        around(rng, [hiword(h) for h in (0x3FEB0000, 0x3FF40000, 0x40180000,
                                                         0x4006DB6E, 0x3FDA827A, 0x3E200000,
                                                         0x43400000, 0xBFD2BEC3)], 40, 3000)])
    assert sys.byteorder == "little" and x.size >= 200_000
    return x


@pytest.mark.parametrize("flags", list(CC_FLAGS))
def test_c_parity_bitwise(tmp_path, parity_data, flags):
    x = parity_data
    c_out = c_parity_outputs(tmp_path, x, FUNCS, flags)
    for row, fname in enumerate(FUNCS):
        got, want = bits(getattr(F, fname)(x)), bits(c_out[row])
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (
            f"{fname} differs from C gt_{fname} on {bad.size} of {x.size} inputs, e.g. "
            f"x={x[bad[0]]!r}: numpy {int(got[bad[0]]):#018x}, C {int(want[bad[0]]):#018x}")


# ---------------------------------------------------------------------------
# fdlibm itself: Java's StrictMath returns fdlibm's sin, cos and log1p (it has no erf)
# ---------------------------------------------------------------------------
def test_identical_to_fdlibm_via_java_strictmath(tmp_path, parity_data):
    assert_strictmath(tmp_path, parity_data, ("sin", "cos", "log1p"))



def test_the_medium_reduction_reads_fdlibms_table_as_a_product():
    """e_rem_pio2.c's npio2_hw[n-1] (the high word of n*pi/2) is the high word of the
    exact product n*PIO2_1 for n = 1..32: the numpy and C code compare with that."""
    n = np.arange(1, 33, dtype=np.float64)
    words = ((n * _rem_pio2.PIO2_1).view(np.uint64) >> np.uint64(32)).astype(np.int64)
    assert np.array_equal(words, _rem_pio2.NPIO2_HW)
