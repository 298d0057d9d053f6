"""erfc, atan and atan2 of gradtool.fdlibm and gradtool/csrc/gt_math.h, tested like erf and
sin (tests/test_fdlibm_more.py; the shared helpers are in tests/support.py): accuracy
against 50-digit mpmath branch by branch, special values bitwise (atan2: every sign, zero,
infinity and NaN combination), canonical NaNs, numpy == C bit for bit on >= 200k inputs
(pairs for atan2) under two compilers' flags, and fdlibm itself through Java's StrictMath
(atan, atan2; StrictMath has no erfc).  The header compiling as CUDA without an FMA is
tested for every function in tests/test_fdlibm.py.

fdlibm promises < 1 ulp for atan only.  Its erfc and atan2 are not within 1 ulp (erfc
subtracts and divides rounded pieces, atan2 rounds y/x before atan): the bounds below are
each branch's measured worst on these inputs with a margin, and the ports are fdlibm's
own bits (atan2 checked against StrictMath), so those figures are fdlibm's.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

from gradtool import fdlibm as F
from gradtool.fdlibm import _atan, _atan2
from support import (CANON_NAN, CC_FLAGS, assert_special_values, SPECIALS, around, assert_strictmath, bits,
                     c_parity_outputs, from_bits, hiword, mpmath, parity_inputs,
                     random_doubles, ulp_errors)

UNARY = ("erfc", "atan")
nan, inf = float("nan"), float("inf")
PI, PIO2, PIO4 = _atan2.PI, _atan2.PI_O_2, _atan2.PI_O_4


# ---------------------------------------------------------------------------
# inputs, branch by branch
# ---------------------------------------------------------------------------
def erfc_branches(rng, n):
    """{branch: x} for s_erf.c's erfc."""
    u = rng.uniform
    return {
        "|x| < 2^-56": random_doubles(rng, n, 0x001, 0x3C6),
        "x < 1/4": np.concatenate([u(-0.84375, 0.25, n),
                                   random_doubles(rng, n // 2, 0x3C7, 0x3FC)]),
        "1/4 <= x < 0.84375": u(0.25, 0.84375, n),
        "0.84375 <= x < 1.25": u(0.84375, 1.25, n),
        "-1.25 < x <= -0.84375": u(-1.25, -0.84375, n),
        "1.25 <= x < 1/0.35": np.concatenate([
            u(1.25, 1 / 0.35, n), around(rng, [hiword(0x4006DB6D), hiword(0x4006DB6E)], 20,
                                         1 << 31)[:40]]),
        "-1/0.35 < x <= -1.25": u(-1 / 0.35, -1.25, n),
        "1/0.35 <= x < 28": np.concatenate([u(1 / 0.35, 26.0, n),
                                            u(26.0, 27.3, n // 2)]),   # subnormal results
        "-6 < x <= -1/0.35": u(-6.0, -1 / 0.35, n),
        "x <= -6, x >= 28": np.concatenate([u(-40.0, -6.0, n // 4), u(28.0, 40.0, n // 4)]),
    }


def atan_branches(rng, n):
    """{branch: x} for s_atan.c."""
    u = rng.uniform
    sg = lambda k: rng.choice([-1.0, 1.0], k)  # noqa: E731
    return {
        "|x| < 2^-29": random_doubles(rng, n, 0x001, 0x3E1),
        "|x| < 7/16": np.concatenate([u(-0.4375, 0.4375, n),
                                      random_doubles(rng, n // 2, 0x3E2, 0x3FD)]),
        "7/16 <= |x| < 11/16": sg(n) * u(7 / 16, 11 / 16, n),
        "11/16 <= |x| < 19/16": sg(n) * u(11 / 16, 19 / 16, n),
        "19/16 <= |x| < 39/16": sg(n) * u(19 / 16, 39 / 16, n),
        "39/16 <= |x| < 2^66": np.concatenate([sg(n) * u(39 / 16, 100.0, n),
                                               random_doubles(rng, n // 2, 0x400, 0x440)]),
        "|x| >= 2^66": random_doubles(rng, n // 4, 0x441, 0x7FE),
    }


def atan2_branches(rng, n):
    """{case: (y, x)} for e_atan2.c: each quadrant m, |y/x| near 2^+-60 (k = +-60, +-61,
    where the shortcuts start), x = 1 (atan itself), subnormal arguments."""
    u = rng.uniform
    sg = lambda k: rng.choice([-1.0, 1.0], k)  # noqa: E731
    out = {}
    for m, (sy, sx) in enumerate([(1.0, 1.0), (-1.0, 1.0), (1.0, -1.0), (-1.0, -1.0)]):
        mag = lambda: np.concatenate([u(0.0, 10.0, n),  # noqa: E731
                                      random_doubles(rng, n // 2, 0x3C0, 0x440, sign=False)])
        out[f"m = {m}"] = (sy * mag(), sx * mag())
    x = sg(n) * random_doubles(rng, n, 0x200, 0x600, sign=False)
    e = rng.integers(56, 66, n) * rng.choice([-1, 1], n)
    out["|y/x| ~ 2^+-60"] = (sg(n) * np.abs(x) * 2.0 ** e * u(1.0, 2.0, n), x)
    out["x = 1"] = (np.concatenate([u(-5.0, 5.0, n // 2),
                                    random_doubles(rng, n // 2, 0x001, 0x7FE)]), np.ones(n))
    out["subnormal"] = (random_doubles(rng, n, 0, 0),
                        np.concatenate([random_doubles(rng, n // 2, 0x3C0, 0x400),
                                        random_doubles(rng, n - n // 2, 0, 0)]))
    return out


# ---------------------------------------------------------------------------
# accuracy against mpmath, per branch
# ---------------------------------------------------------------------------
# (bound on the error against the exact value in ulps, bound on the distance in doubles
# from the correctly rounded result), per branch.  atan: fdlibm's < 1 ulp everywhere.
# erfc: < 1 ulp where the result is a small correction to 1 or 2 (x < 1/4, x < 0), else
# up to ~3 ulp (measured 2.89 on 10^5 points a branch; 2.2-2.4 on these inputs).  atan2:
# the rounded y/x adds up to half an ulp to atan's error (measured 1.45 on 10^5 points a
# quadrant; 1.2 on these inputs).
ERFC_BOUNDS = {"|x| < 2^-56": (1.0, 1), "x < 1/4": (1.0, 1), "1/4 <= x < 0.84375": (3.0, 3),
               "0.84375 <= x < 1.25": (3.0, 3), "-1.25 < x <= -0.84375": (1.0, 1),
               "1.25 <= x < 1/0.35": (3.0, 3), "-1/0.35 < x <= -1.25": (1.0, 1),
               "1/0.35 <= x < 28": (3.0, 3), "-6 < x <= -1/0.35": (1.0, 1),
               "x <= -6, x >= 28": (1.0, 1)}
ATAN2_BOUNDS = (1.5, 1)


def _check_accuracy(label, x, y, bound, x2=None):
    errs, dists = ulp_errors(label.split()[0], x, y, x2=x2)
    worst = int(np.argmax(errs))
    at = f"{x[worst]!r}" + ("" if x2 is None else f", {x2[worst]!r}")
    assert errs.max() < bound[0], f"{label}: at ({at}) {y[worst]!r} is {errs.max():.3f} ulp"
    assert dists.max() <= bound[1], f"{label}: {dists.max()} doubles from correctly rounded"
    if "GT_FDLIBM_VERBOSE" in os.environ:
        print(f"\n{label}: {x.size} inputs, max {errs.max():.3f} ulp at ({at})",
              file=sys.stderr)


@pytest.mark.parametrize("fname", ("erfc", "atan", "atan2"))
def test_accuracy_vs_mpmath_by_branch(fname):
    if mpmath is None:
        pytest.skip("mpmath not installed")
    rng = np.random.default_rng(sum(map(ord, fname)))
    n = 3000
    if fname == "atan2":
        for case, (y, x) in atan2_branches(rng, n).items():
            z = F.atan2(y, x)
            assert np.isfinite(z).all()
            keep = y != 0.0                     # atan2(+-0, x) is exact: no ulp of 0 here
            _check_accuracy(f"atan2 {case}", y[keep], z[keep], ATAN2_BOUNDS, x2=x[keep])
        return
    branches = erfc_branches(rng, n) if fname == "erfc" else atan_branches(rng, n)
    for case, x in branches.items():
        y = getattr(F, fname)(x)
        assert np.isfinite(y).all()
        keep = x != 0.0                         # atan(+-0) is exact
        bound = ERFC_BOUNDS[case] if fname == "erfc" else (1.0, 1)
        _check_accuracy(f"{fname} {case}", x[keep], y[keep], bound)


def test_erfc_keeps_relative_accuracy_where_one_minus_erf_loses_it():
    """fdlibm's erfc, not 1 - erf: at x = 5 the difference is 1.5e-5 off (16 of 53 bits
    right), at x >= 6 nothing is left (erf rounds to 1), while erfc stays within a few ulps
    down to its subnormal range."""
    if mpmath is None:
        pytest.skip("mpmath not installed")
    x = np.array([5.0, 6.0, 10.0, 20.0, 26.0])
    errs, _ = ulp_errors("erfc", x, F.erfc(x))
    assert errs.max() < 3.0
    with mpmath.mp.workdps(30):
        rel = abs((1.0 - float(F.erf(5.0))) / mpmath.erfc(5) - 1)
    assert 1e-6 < rel < 1e-3                   # 1 - erf(5): 16 bits right
    assert (1.0 - F.erf(x[1:]) == 0.0).all() and (F.erfc(x[1:]) > 0.0).all()


# ---------------------------------------------------------------------------
# special values, bitwise
# ---------------------------------------------------------------------------
SPECIAL_CASES = {
    "erfc": [(inf, 0.0), (-inf, 2.0), (nan, nan), (-nan, nan), (0.0, 1.0), (-0.0, 1.0),
             (5e-324, 1.0), (-5e-324, 1.0), (1e-300, 1.0), (2.0 ** -57, 1.0),
             (-6.0, 2.0), (-1e308, 2.0), (28.0, 0.0), (1e308, 0.0),
             (27.0, 5.23705e-319), (1.0, 0.15729920705028513),
             (-1.0, 1.842700792949715),   # fdlibm's; correctly rounded is ...7148
             (0.5, 0.4795001221869535), (0.25, 0.7236736098317631)],
    "atan": [(inf, PIO2), (-inf, -PIO2), (nan, nan), (-nan, nan), (0.0, 0.0), (-0.0, -0.0),
             (5e-324, 5e-324), (-5e-324, -5e-324), (1e-300, 1e-300), (1e300, PIO2),
             (-2.0 ** 66, -PIO2), (1.0, PIO4), (-1.0, -PIO4), (0.5, 0.4636476090008061)],
}


@pytest.mark.parametrize("fname", UNARY)
def test_special_values_bitwise(fname):
    assert_special_values(getattr(F, fname), SPECIAL_CASES[fname])


ATAN2_EDGES = np.array([0.0, -0.0, inf, -inf, nan, 1.0, -1.0, 2.5, -2.5, 5e-324, -5e-324,
                        1.7976931348623157e308, -1.7976931348623157e308])


def _atan2_special_rule(y, x):
    """e_atan2.c's special cases, from its comment (None: not a special case)."""
    if math.isnan(x) or math.isnan(y):
        return nan
    sy = math.copysign(1.0, y)
    if y == 0.0:
        return y if math.copysign(1.0, x) > 0 else sy * PI
    if x == 0.0:
        return sy * PIO2
    if math.isinf(x):
        if math.isinf(y):
            return sy * (PIO4 if x > 0 else 3.0 * PIO4)
        return sy * 0.0 if x > 0 else sy * PI
    if math.isinf(y):
        return sy * PIO2
    return None


def test_atan2_every_sign_zero_infinity_and_nan_combination():
    """Every pair of ATAN2_EDGES: fdlibm's special cases (signed zeros kept, +-pi for a
    zero y and a negative x, +-pi/4 and +-3pi/4 for two infinities, ...) bit for bit,
    C99 Annex F's (numpy's arctan2) where both define one; the other pairs within 1 ulp
    of numpy's (the correctly rounded libm)."""
    y, x = (a.reshape(-1) for a in np.meshgrid(ATAN2_EDGES, ATAN2_EDGES, indexing="ij"))
    got = F.atan2(y, x)
    with np.errstate(all="ignore"):
        libm = np.arctan2(y, x)
    checked = 0
    for yi, xi, g, lm in zip(y.tolist(), x.tolist(), got.tolist(), libm.tolist(), strict=True):
        want = _atan2_special_rule(yi, xi)
        gb = int(np.float64(g).view(np.uint64))
        if want is None:
            assert abs(g - lm) <= np.spacing(abs(lm)), (yi, xi, g, lm)
            continue
        checked += 1
        wb = CANON_NAN if math.isnan(want) else int(np.float64(want).view(np.uint64))
        assert gb == wb, f"atan2({yi!r}, {xi!r}) = {g!r}, want {want!r}"
        if not math.isnan(want):
            assert gb == int(np.float64(lm).view(np.uint64)), (yi, xi, g, lm)
    assert checked >= 100


@pytest.mark.parametrize("fname", UNARY + ("atan2",))
def test_every_nan_is_canonical_and_shapes_are_kept(fname):
    f = getattr(F, fname)
    call = (lambda a: f(a, np.flip(a))) if fname == "atan2" else f
    x = np.concatenate([parity_inputs(seed=7, n_random=4000), SPECIALS])
    y = call(x)
    assert (bits(y[np.isnan(y)]) == CANON_NAN).all()
    one = call(np.float64(0.5))
    assert isinstance(one, np.ndarray) and one.shape == () and one.dtype == np.float64
    assert call(np.zeros((0, 3))).shape == (0, 3)
    a = np.linspace(0.1, 3.0, 24).reshape(2, 3, 4)
    before = a.copy()
    if fname == "atan2":
        b = np.linspace(-2.0, 2.0, 4)                  # broadcast against a's last axis
        assert F.atan2(a, b).shape == (2, 3, 4) and F.atan2(b, a).shape == (2, 3, 4)
        assert np.array_equal(bits(F.atan2(a, b)), bits(F.atan2(a, np.broadcast_to(b, a.shape))))
        assert np.array_equal(bits(F.atan2(a.transpose(2, 0, 1), -a.transpose(2, 0, 1))),
                              bits(F.atan2(a, -a).transpose(2, 0, 1)))
    else:
        assert np.array_equal(bits(f(a.transpose(2, 0, 1))), bits(f(a).transpose(2, 0, 1)))
    assert np.array_equal(a, before)


# ---------------------------------------------------------------------------
# numpy == C, bit for bit; fdlibm itself through StrictMath
# ---------------------------------------------------------------------------
ERFC_ATAN_WORDS = (0x3C700000, 0x3FD00000, 0x3FEB0000, 0x3FF40000, 0x4006DB6D, 0x4006DB6E,
                   0x40180000, 0x403C0000, 0x44100000, 0x3FDC0000, 0x3E200000, 0x3FE60000,
                   0x3FF30000, 0x40038000, 0x403A8000)


@pytest.fixture(scope="module")
def parity_data():
    rng = np.random.default_rng(78)
    parts = [parity_inputs(n_random=48_000), rng.uniform(-30.0, 30.0, 20_000),
             rng.uniform(-3.0, 3.0, 20_000),
             around(rng, [hiword(h) for h in ERFC_ATAN_WORDS], 40, 3000)]
    parts += list(erfc_branches(rng, 1000).values()) + list(atan_branches(rng, 1000).values())
    x = np.concatenate(parts)
    assert sys.byteorder == "little" and x.size >= 200_000
    return x


@pytest.fixture(scope="module")
def atan2_pairs(parity_data):
    """>= 200k (y, x) pairs: every pair of SPECIALS and ATAN2_EDGES, the parity inputs
    against a shuffle of themselves, and every case of atan2_branches."""
    rng = np.random.default_rng(79)
    edges = np.concatenate([SPECIALS, ATAN2_EDGES])
    ey, ex = (a.reshape(-1) for a in np.meshgrid(edges, edges, indexing="ij"))
    ys, xs = [ey, parity_data], [ex, rng.permutation(parity_data)]
    for y, x in atan2_branches(rng, 4000).values():
        ys.append(y)
        xs.append(x)
    y, x = np.concatenate(ys), np.concatenate(xs)
    assert x.size >= 200_000
    return y, x


def _assert_same_bits(label, got, want, x, x2=None):
    bad = np.flatnonzero(bits(got) != bits(want))
    if bad.size:
        at = f"{x[bad[0]]!r}" + ("" if x2 is None else f", {x2[bad[0]]!r}")
        raise AssertionError(f"{label} differs from C on {bad.size} of {x.size} inputs, e.g. "
                             f"({at}): numpy {int(bits(got)[bad[0]]):#018x}, "
                             f"C {int(bits(want)[bad[0]]):#018x}")


@pytest.mark.parametrize("flags", list(CC_FLAGS))
def test_c_parity_bitwise(tmp_path, parity_data, atan2_pairs, flags):
    x = parity_data
    c_out = c_parity_outputs(tmp_path, x, UNARY, flags)
    for row, fname in enumerate(UNARY):
        _assert_same_bits(fname, getattr(F, fname)(x), c_out[row], x)
    y, x = atan2_pairs
    c_out = c_parity_outputs(tmp_path, y, ("atan2",), flags, x2=x)
    _assert_same_bits("atan2", F.atan2(y, x), c_out[0], y, x)


def test_erf_is_unchanged_by_the_shared_pieces(tmp_path, parity_data):
    """erf and erfc share gtm_erf_y/_pq/_r (and their numpy twins): erf is still the C's."""
    c_out = c_parity_outputs(tmp_path, parity_data, ("erf",), "O2")
    _assert_same_bits("erf", F.erf(parity_data), c_out[0], parity_data)


def test_identical_to_fdlibm_via_java_strictmath(tmp_path, parity_data, atan2_pairs):
    assert_strictmath(tmp_path, parity_data, ("atan",))
    y, x = atan2_pairs
    assert_strictmath(tmp_path, y, ("atan2",), x2=x)


def test_atan_constants_are_fdlibms():
    """atanhi[k] + atanlo[k] is atan(0.5), atan(1), atan(1.5), pi/2 to ~107 bits, and
    atan2's pi and pi_lo are pi's first two doubles."""
    if mpmath is None:
        pytest.skip("mpmath not installed")
    with mpmath.mp.workprec(200):
        for hi, lo, v in zip(_atan.ATANHI, _atan.ATANLO, (0.5, 1.0, 1.5, None), strict=True):
            exact = mpmath.mp.pi / 2 if v is None else mpmath.atan(v)
            assert abs(mpmath.mpf(hi) + lo - exact) < exact * mpmath.mpf(2) ** -105
        assert abs(mpmath.mpf(PI) + _atan2.PI_LO - mpmath.mp.pi) < mpmath.mpf(2) ** -105
