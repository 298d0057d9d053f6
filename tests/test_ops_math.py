"""The elementwise math ops for imported models (erf, sin, cos, expm1, log1p, rsqrt, erfc,
atan, atan2, pows, minimum, clamp_min/clamp_max and Tape.clamp) beyond what every op gets from
tests/test_ops_table.py:

* the reference against PyTorch float64, forward (1e-12 relative) and backward (1e-11),
  including where PyTorch puts infinities, NaNs and signed zeros;
* the documented special cases (pows' exact exponents and its conventions at 0 and for
  negative bases, minimum's ties and NaNs, clamp's NaN and bounds), pinned on the numpy
  reference and, bit for bit, on the host backend in all three kernel variants.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal, bits
from support import (VARIANTS, assert_elementwise_close, check_specials, check_unary,
                     host_matches, torch_oracle)

NAN, INF = math.nan, math.inf

# op -> (torch function, inputs drawn in its domain)
UNARY = {
    "erf": ("erf", lambda rng: np.concatenate([rng.uniform(-6.5, 6.5, 300),
                                               rng.standard_normal(100) * 1e-3])),
    "sin": ("sin", lambda rng: np.concatenate([rng.uniform(-20.0, 20.0, 300),
                                               rng.uniform(-1e7, 1e7, 50)])),
    "cos": ("cos", lambda rng: np.concatenate([rng.uniform(-20.0, 20.0, 300),
                                               rng.uniform(-1e7, 1e7, 50)])),
    "expm1": ("expm1", lambda rng: np.concatenate([rng.uniform(-30.0, 30.0, 300),
                                                   rng.standard_normal(100) * 1e-6])),
    "log1p": ("log1p", lambda rng: np.concatenate([rng.uniform(-0.999, 5.0, 300),
                                                   rng.standard_normal(100) * 1e-6,
                                                   np.exp(rng.uniform(-5, 50, 50))])),
    "rsqrt": ("rsqrt", lambda rng: np.exp(rng.uniform(-30.0, 30.0, 300))),
    "erfc": ("erfc", lambda rng: np.concatenate([rng.uniform(-6.5, 26.0, 300),
                                                 rng.standard_normal(100) * 1e-3])),
    "atan": ("atan", lambda rng: np.concatenate([rng.uniform(-5.0, 5.0, 300),
                                                 np.exp(rng.uniform(-40, 60, 100))
                                                 * rng.choice([-1.0, 1.0], 100)])),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_against_pytorch_float64(name):
    fname, draw = UNARY[name]
    check_unary(lambda tp, a: getattr(tp, name)(a), fname, draw, name)


def test_unary_specials_match_pytorch():
    """inf, NaN, signed zeros and domain edges: the same values as PyTorch's."""
    x = np.array([0.0, -0.0, INF, -INF, NAN, -1.0, -2.0, 1e-310, 710.0, -800.0, 1e300])
    check_specials(lambda tp, name, a: getattr(tp, name)(a), UNARY, x)


POW_EXPONENTS = [0.0, 1.0, 2.0, 3.0, 4.0, -1.0, -2.0, 0.5, -0.5, 1.7, -2.3, 5.0, -3.0, 7.0,
                 0.25, 2.0 ** 53, 2.0 ** 52 + 1.0, -1e300, 100.0]
POW_BASES = np.array([-2.5, -1.0, -0.0, 0.0, 0.3, 1.0, 2.0, INF, -INF, NAN, 1e-300, 1e10,
                      -1e-5, 1e-320, 0.999, 1.001])


@pytest.mark.parametrize("s", POW_EXPONENTS)
def test_pows_against_pytorch_float64_everywhere(s):
    """Values and gradients match ``x ** s`` in PyTorch float64 on every base, zeros,
    infinities, NaNs and negative bases included (signs of zeros and infinities too)."""
    torch = pytest.importorskip("torch")
    tp = gt.Tape()
    p = tp.param(POW_BASES)
    y = tp.pows(p, s)
    tp.backward(tp.sum(y))
    tx = torch.tensor(POW_BASES, requires_grad=True)
    ty = tx ** s
    ty.sum().backward()
    assert_elementwise_close(tp.value(y), ty.detach().numpy(), 1e-12, f"x ** {s}")
    want = ty.detach().numpy()
    zero = want == 0
    assert np.array_equal(np.signbit(tp.value(y)[zero]), np.signbit(want[zero])), s
    assert_elementwise_close(tp.grad(p), tx.grad.numpy(), 1e-11, f"d(x ** {s})")


def test_pows_exact_exponents_are_the_documented_operations():
    rng = np.random.default_rng(4)
    x = rng.uniform(-3.0, 3.0, 200)
    tp = gt.Tape()
    a = tp.const(x)
    with np.errstate(all="ignore"):
        cases = {2.0: x * x, 3.0: (x * x) * x, 4.0: (x * x) * (x * x), -1.0: 1.0 / x,
                 -2.0: 1.0 / (x * x), 0.5: np.sqrt(x), -0.5: 1.0 / np.sqrt(x),
                 1.0: x, 0.0: np.ones_like(x)}
    for s, want in cases.items():
        assert_bits_equal(tp.value(tp.pows(a, s)), want, f"x ** {s}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_pows_minimum_clamp_specials_on_the_host_backend(variant):
    tp = gt.Tape()
    x = tp.param(POW_BASES)
    total = None
    for s in (0.0, 1.0, 3.0, -2.0, 0.5, -0.5, 1.7, 5.0, 2.0 ** 53):
        term = tp.sum(tp.clamp(tp.pows(x, s), -1e300, 1e300))
        total = term if total is None else tp.add(total, term)
    b = tp.param(np.array([-2.5, 0.0, -0.0, 1.0, 1.0, NAN, 0.5, INF, -INF, 1.0, 0.0, 1e10,
                           -1e-5, 2.0, NAN, 1.0]))
    total = tp.add(total, tp.sum(tp.minimum(x, b)))
    total = tp.add(total, tp.sum(tp.clamp(x, lo=-1.0, hi=1.0)))
    total = tp.add(total, tp.sum(tp.clamp(x, hi=0.3)))
    host_matches(tp, total, variant)


MIN_CASES = [
    # a, b, the documented min (an exact copy), where the gradient goes ("a" or "b")
    (1.0, 2.0, 1.0, "a"), (3.0, -1.0, -1.0, "b"), (2.0, 2.0, 2.0, "a"),
    (0.0, -0.0, 0.0, "a"), (-0.0, 0.0, -0.0, "a"),           # a tie: a, sign and all
    (NAN, 1.0, NAN, "b"), (1.0, NAN, NAN, "b"), (-INF, INF, -INF, "a"), (INF, INF, INF, "a"),
]


@pytest.mark.parametrize("a,b,value,to", MIN_CASES)
def test_minimum_ties_and_nans(a, b, value, to):
    tp = gt.Tape()
    pa, pb = tp.param(np.array([a])), tp.param(np.array([b]))
    m = tp.minimum(pa, pb)
    got = float(tp.value(m)[0])
    assert bits(got) == bits(value) or (math.isnan(value) and math.isnan(got))
    tp.backward(tp.muls(tp.sum(m), 2.5))
    ga, gb = float(tp.grad(pa)[0]), float(tp.grad(pb)[0])
    assert (ga, gb) == ((2.5, 0.0) if to == "a" else (0.0, 2.5))


def test_minimum_broadcasts_against_pytorch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((3, 1, 4)), rng.standard_normal((2, 1))
    (v, tv), grads = torch_oracle(lambda tp, x, y: tp.minimum(x, y), torch.minimum, [a, b])
    assert_elementwise_close(v, tv, 0.0, "minimum")
    for (g, tg), what in zip(grads, "ab", strict=True):     # no ties: every gradient exact
        assert_elementwise_close(g, tg, 1e-15, f"d minimum / d{what}")


def test_atan2_broadcasts_against_pytorch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(10)
    a = rng.standard_normal((3, 1, 4)) * rng.choice([1e-3, 1.0, 1e3], (3, 1, 4))
    b = rng.standard_normal((2, 1)) * np.array([[1e-2], [10.0]])
    (v, tv), grads = torch_oracle(lambda tp, y, x: tp.atan2(y, x), torch.atan2, [a, b])
    assert_elementwise_close(v, tv, 1e-12, "atan2")
    for (g, tg), what in zip(grads, "ab", strict=True):
        assert_elementwise_close(g, tg, 1e-11, f"d atan2 / d{what}")


ATAN2_EDGES = [0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 1e-200, 3e-162, -2.5]


def test_atan2_signed_zeros_infinities_and_the_origin_match_pytorch():
    """Every pair of ATAN2_EDGES: fdlibm's atan2 gives PyTorch's values there (signed zeros,
    +-pi, +-pi/2, +-pi/4, +-3pi/4, NaN), and the gradient rules give PyTorch's gradients
    bit for bit, among them the zeros at the origin and where a*a + b*b underflows to 0,
    and the NaN and -inf where it underflows only to a subnormal (1/(a*a + b*b)
    overflows).  The tape's gradients are the same values, a zero's sign aside: a leaf's
    gradient is accumulated from +0.0, so a -0.0 contribution reads +0.0 there."""
    torch = pytest.importorskip("torch")
    a, b = (m.reshape(-1) for m in np.meshgrid(ATAN2_EDGES, ATAN2_EDGES, indexing="ij"))
    w = np.ones(a.shape)
    (v, tv), grads = torch_oracle(lambda tp, y, x: tp.atan2(y, x), torch.atan2, [a, b], w=w)
    special = ~np.isfinite(a) | ~np.isfinite(b) | (a == 0.0) | (b == 0.0)
    assert_bits_equal(np.where(np.isnan(v), NAN, v)[special],
                      np.where(np.isnan(tv), NAN, tv)[special], "atan2 special values")
    assert_elementwise_close(v, tv, 1e-15, "atan2")
    spec = gt.ops.OPS["atan2"]
    for k, ((g, tg), what) in enumerate(zip(grads, "ab", strict=True)):
        with np.errstate(all="ignore"):          # 0 * inf where the squares are subnormal
            rule = gt.expr.compile_numpy(spec.bwd[k], ("g", "x", "y", "t"))(w, a, b, v)
        assert_bits_equal(np.where(np.isnan(rule), NAN, rule), np.where(np.isnan(tg), NAN, tg),
                          f"d atan2 / d{what}, the rule")
        assert np.array_equal(g, tg, equal_nan=True), f"d atan2 / d{what}"
    origin = (a == 0.0) & (b == 0.0)
    assert origin.sum() == 4 and (grads[0][0][origin] == 0.0).all()
    assert (grads[1][0][origin] == 0.0).all()


CLAMP_CASES = [(-1.0, 1.0), (None, 0.5), (-0.25, None), (0.5, 0.5), (1.0, -1.0)]


@pytest.mark.parametrize("lo,hi", CLAMP_CASES)
def test_clamp_against_pytorch_float64(lo, hi):
    """torch.clamp's values and gradient: NaN kept, the gradient where lo <= x <= hi
    (bounds included, x exactly at a bound too), none when lo > hi."""
    torch = pytest.importorskip("torch")
    x = np.array([-2.0, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0, 3.0, NAN, INF, -INF])
    (v, tv), grads = torch_oracle(lambda tp, a: tp.clamp(a, lo, hi),
                             lambda t: torch.clamp(t, min=lo, max=hi), [x])
    assert_elementwise_close(v, tv, 0.0, "clamp")
    assert_bits_equal(grads[0][0], grads[0][1], f"clamp({lo}, {hi}) gradient")


def test_clamp_records_clamp_min_and_clamp_max_and_needs_a_bound():
    tp = gt.Tape()
    x = tp.param(np.array([0.5, 2.0]))
    tp.clamp(x, 0.0, 1.0)
    assert [n.op for n in tp.nodes[1:]] == ["clamp_min", "clamp_max"]
    with pytest.raises(gt.TapeError, match="clamp: give lo, hi or both"):
        tp.clamp(x)
    with pytest.raises(gt.TapeError, match="scalar operand must be a real number"):
        tp.clamp(x, lo="0")


def test_gelu_exact_and_tanh_against_pytorch_including_extremes():
    torch = pytest.importorskip("torch")
    from gradtool import nn
    rng = np.random.default_rng(12)
    x = np.concatenate([rng.standard_normal(300) * 3.0, [0.0, -0.0, 8.0, -8.0, 40.0, -40.0]])
    for approximate in ("none", "tanh"):
        (v, tv), grads = torch_oracle(lambda tp, a: nn.gelu(a, approximate=approximate),
                                 lambda t: torch.nn.functional.gelu(t, approximate=approximate),
                                 [x])
        assert_elementwise_close(v, tv, 1e-12, f"gelu {approximate}")
        # the gradient norm-wise (issue 20's measure): in the far tails it is a small
        # difference of larger terms, rounded differently by PyTorch's fused formula
        g, tg = grads[0]
        assert np.max(np.abs(g - tg)) <= 1e-11 * np.max(np.abs(tg)), approximate


# ── rounding: floor, ceil, trunc, round ─────────────────────────────────────

ROUNDING_X = np.array([0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999999999999994,
                       -0.4, 2.0 ** 52 + 0.5 + 0.5, 2.0 ** 52 - 0.5, -(2.0 ** 52) + 0.5,
                       2.0 ** 53, 1e300, -1e300, 5e-324, -5e-324, INF, -INF, NAN, 7.3, -7.3])


@pytest.mark.parametrize("name", ["floor", "ceil", "trunc", "round"])
def test_rounding_is_torchs_bits_and_carries_no_gradient(name):
    """Every value torch's, bit for bit, signed zeros and ties to even included (round(2.5)
    = 2, round(-0.5) = -0.0, at 2^52 - 0.5 the tie goes to the even 2^52); the gradient is
    torch's zeros, and on the host backend (all three kernel variants) the bits again."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(sum(map(ord, name)))
    x = np.concatenate([ROUNDING_X, rng.uniform(-10.0, 10.0, 200),
                        np.round(rng.uniform(-10.0, 10.0, 50)) + 0.5])
    tp = gt.Tape()
    p = tp.param(x)
    y = getattr(tp, name)(p)
    want = getattr(torch, name)(torch.tensor(x)).numpy()
    assert np.array_equal(np.isnan(tp.value(y)), np.isnan(want))
    ok = ~np.isnan(want)
    assert_bits_equal(tp.value(y)[ok], want[ok], name)
    loss = tp.add(tp.sum(tp.mul(p, p)), tp.sum(y))
    tp.backward(loss)
    assert not tp.touched(y)
    tx = torch.tensor(x, requires_grad=True)
    ((tx * tx).sum() + getattr(torch, name)(tx).sum()).backward()
    assert_bits_equal(tp.grad(p), tx.grad.numpy(), name)
    for variant in VARIANTS:
        host_matches(tp, loss, variant)


@pytest.mark.parametrize("s", [2.0, -2.0, 0.7, -0.3, 1e-3])
def test_fmods_and_mods_are_torchs_fmod_and_remainder_bits(s):
    """torch.fmod and torch.remainder by a number, bit for bit (signed zeros, subnormals,
    infinities, huge values, exact multiples), gradient g as torch's, and the host
    backend's bits in all three variants.  (Where a / s overflows, 1e300 by 1e-300,
    torch's vectorised fmod gives NaN and gradtool C's exact remainder.)"""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(31)
    x = np.concatenate([[-3.5, -2.0, -0.0, 0.0, 0.3, 2.9, 7.25, -7.25, INF, -INF, NAN,
                         1e300, -1e-310, 4.0, -4.0], rng.uniform(-10.0, 10.0, 100)])
    tp = gt.Tape()
    p = tp.param(x)
    f, m = tp.fmods(p, s), tp.mods(p, s)
    for got, want in ((f, torch.fmod(torch.tensor(x), s)), (m, torch.remainder(torch.tensor(x), s))):
        got, want = tp.value(got), want.numpy()
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert_bits_equal(got[~np.isnan(want)], want[~np.isnan(want)])
    loss = tp.add(tp.sum(f), tp.sum(tp.mul(m, m)))
    tp.backward(loss)
    tx = torch.tensor(x, requires_grad=True)
    (torch.fmod(tx, s).sum() + (torch.remainder(tx, s) ** 2).sum()).backward()
    ok = np.isfinite(x)
    assert_bits_equal(tp.grad(p)[ok], tx.grad.numpy()[ok])
    for variant in VARIANTS:
        host_matches(tp, loss, variant)


@pytest.mark.parametrize("s", [5e-324, -3e-310, 1e-300, 0.1, -7.5, 3e200, INF, NAN, 0.0])
def test_gt_fmod_is_np_fmod_across_every_binade(s):
    """The kernels' gt_fmod (integer shift-and-subtract) against numpy's fmod (the
    spec) over significands and exponents from subnormal to huge, both signs, on the
    host backend in all three variants: identical bits, NaN where numpy's is."""
    rng = np.random.default_rng(32)
    x = rng.uniform(1.0, 2.0, 3000) * np.exp2(rng.integers(-1074, 1024, 3000).astype(float))
    x = np.concatenate([x * rng.choice([-1.0, 1.0], x.size),
                        [0.0, -0.0, INF, -INF, NAN, 5e-324, -5e-324, 1.7976931348623157e308]])
    tp = gt.Tape()
    p = tp.param(x)
    f = tp.fmods(p, s)
    loss = tp.add(tp.sum(f), tp.sum(tp.mods(p, s)))
    with np.errstate(all="ignore"):
        want = np.fmod(x, s)
    got = tp.value(f)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert_bits_equal(got[~np.isnan(want)], want[~np.isnan(want)])
    for variant in VARIANTS:
        host_matches(tp, loss, variant)
