"""exp: fdlibm 5.3 ``e_exp.c`` (C twin ``gt_exp`` in gradtool/csrc/gt_math.h).

``exp`` (whose docstring gives the method, special cases and constants),
its early returns ``_exp_special``, the mask-by-mask reference path
``_exp_ref``/``_exp_core`` and the vectorised kernel ``_exp_block``.

Also the parts of exp that expm1 (``_expm1``) reuses: step 1's reduction
with fdlibm's k = 0 and k = +-1 branches (``_exp_reduction``), the bound
``_EXP_BIG`` and the band W that both kernels leave to the reference path
(``_W_LO``, ``_W_LEN``, ``_K_W_LO``, ``_K_W_HI``).
"""

from __future__ import annotations

import numpy as np

from ._common import (
    INF, LN2_HI, LN2_LO, NAN, O_THRESHOLD, U_THRESHOLD, _F64, _K_MAGIC, _K_ONE, _K_TWO, _U64,
    _add_exponent, _add_exponent_block, _c, _half_with_sign_of, _hex, _hiword_bound, _poly_block,
    _reduce, _reduce_block,
)
from ._driver import _masked, _patch, _run

# exp's constants besides the shared ones (hex = exact value, decimal = fdlibm's)
TWOM1000 = _hex("0x1p-1000")            # 9.33263618503218878990e-302 0x0170000000000000

# exp's polynomial (e_exp.c)
P1 = _hex("0x1.555555555553ep-3")   # 1.66666666666666019037e-01  0x3FC555555555553E
P2 = _hex("-0x1.6c16c16bebd93p-9")  # -2.77777777770155933842e-03 0xBF66C16C16BEBD93
P3 = _hex("0x1.1566aaf25de2cp-14")  # 6.61375632143793436117e-05  0x3F11566AAF25DE2C
P4 = _hex("-0x1.bbd41c5d26bf1p-20")  # -1.65339022054652515390e-06 0xBEBBBD41C5D26BF1
P5 = _hex("0x1.6376972bea4d0p-25")  # 4.13813679705723846039e-08  0x3E66376972BEA4D0

_EXP_BIG = _hiword_bound(0x40862E42)   # |x| >= this: overflow/underflow tests
_EXP_HALF_LN2 = 0x3FD62E42             # hx > this: |x| > 0.5*ln2, reduce
_EXP_3HALF_LN2 = 0x3FF0A2B2            # hx < this: |x| < 1.5*ln2, k = +-1
_EXP_TINY = 0x3E300000                 # hx < this: |x| < 2^-28

# The kernels of exp and expm1 skip the band W of |x| where fdlibm forces
# k = 0 (high word <= 0x3fd62e42) although trunc(invln2*|x| + 0.5) is
# already 1: from round(0.5*ln2) = 0x3FD62E42FEFA39EF, the first double with
# trunc(invln2*x + 0.5) = 1 (found by bisection; tested), to the end of high
# word 0x3fd62e42.  About 1.7e7 doubles, 1e-9 wide.
_W_LO = 0x3FD62E42FEFA39EF
_W_LEN = (0x3FD62E43 << 32) - _W_LO

# exp's kernel domain: |x| < 704 (|k| <= 1016, so 2^k*y stays normal), minus
# the band W, minus [2^-54, 2^-28): below 2^-28 fdlibm returns 1 + x, and
# below 2^-54 the kernel's formula provably returns 1.0 = round(1 + x) too
# (t = +-0, r = x, |(lo - q) - hi| <= 2^-54, and 1 - v rounds to 1.0 for
# |v| <= 2^-54, ties going to the even 1.0).
_EXP_TB_LO = _hex("0x1p-54")
_EXP_TB_HI = _hex("0x1p-28")
_EXP_KHI = 704.0
# the same bands as doubles: for |x| >= 0 (not NaN), bits(|x|) >= B is
# |x| >= the double with bits B, so float compares test them exactly
_W_LO_F, _W_HI_F = np.array([_W_LO, _W_LO + _W_LEN], dtype=_U64).view(_F64).tolist()
_K_W_LO, _K_W_HI = _c(_W_LO_F), _c(_W_HI_F)
_K_P = tuple(map(_c, (P1, P2, P3, P4, P5)))


def _exp_special(x: np.ndarray):
    """fdlibm's early returns of exp: (y, rest); y is final where rest is False."""
    hx = (x.view(_U64) >> _U64(32)) & _U64(0x7FFFFFFF)
    tiny = hx < _EXP_TINY                       # |x| < 2^-28: 1 + x
    over = x > O_THRESHOLD                      # includes +inf
    under = x < U_THRESHOLD                     # includes -inf
    nan = x != x
    y = np.where(tiny, 1.0 + x, np.where(over, INF, np.where(under, 0.0, NAN)))
    return y, ~(tiny | over | under | nan)


def _exp_ref(x: np.ndarray) -> np.ndarray:
    """Literal vectorised transcription of gt_exp: every branch is a mask."""
    return _masked(x, _exp_special, _exp_core)


def _exp_reduction(x: np.ndarray):
    """Step 1 of exp and of expm1 (e_exp.c and s_expm1.c branch alike):
    (red, k, hi, lo), red False where hx <= 0x3fd62e42 (k = 0, r = x; hi
    and lo are +0 there and unused)."""
    u = x.view(_U64)
    xsb = (u >> _U64(63)) != 0
    hx = (u >> _U64(32)) & _U64(0x7FFFFFFF)
    red = hx > _EXP_HALF_LN2                    # |x| > 0.5 ln2: reduce
    mid = red & (hx < _EXP_3HALF_LN2)           # and |x| < 1.5 ln2: k = +-1
    big = red & ~mid
    k = np.zeros_like(x)
    hi = np.zeros_like(x)
    lo = np.zeros_like(x)
    # |k| == 1: e_exp.c writes hi = x - (xsb ? -LN2_HI : LN2_HI), s_expm1.c
    # xsb ? x + LN2_HI : x - LN2_HI; the same double, as IEEE defines a - b
    # as a + (-b)
    hi[mid] = x[mid] - np.where(xsb[mid], -LN2_HI, LN2_HI)
    lo[mid] = np.where(xsb[mid], -LN2_LO, LN2_LO)
    k[mid] = np.where(xsb[mid], -1.0, 1.0)
    k[big], hi[big], lo[big] = _reduce(x[big], np.where(xsb[big], -0.5, 0.5))
    return red, k, hi, lo


def _exp_core(x: np.ndarray) -> np.ndarray:
    """gt_exp from the argument reduction on (finite, not tiny, no overflow)."""
    red, k, hi, lo = _exp_reduction(x)
    r = np.where(red, hi - lo, x)
    t = r * r
    c = r - t * (P1 + t * (P2 + t * (P3 + t * (P4 + t * P5))))
    y0 = 1.0 - ((r * c) / (c - 2.0) - r)                  # k == 0
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)           # k != 0
    normal = k >= -1021
    y = _add_exponent(y, np.where(normal, k, k + 1000.0))
    y = np.where(normal, y, y * TWOM1000)
    return np.where(red, y, y0)


def _exp_block(x, out, bufs):
    (v, h, lo, r, z, p, *_), (bm, bm2, bm3, *_), _ = bufs
    # which lanes may use the kernel: |x| < 704 (max() is NaN if a NaN is
    # there), and none in the band W or in [2^-54, 2^-28); the latter needs
    # a lane below 2^-28, which min() rules out for most blocks
    np.abs(x, out=z)
    flagged = not z.max() < _EXP_KHI
    np.greater_equal(z, _K_W_LO, out=bm)
    np.less(z, _K_W_HI, out=bm2)
    np.logical_and(bm, bm2, out=bm)
    if not z.min() >= _EXP_TB_HI:
        np.greater_equal(z, _EXP_TB_LO, out=bm2)
        np.less(z, _EXP_TB_HI, out=bm3)
        np.logical_and(bm2, bm3, out=bm2)
        np.logical_or(bm, bm2, out=bm)
    flagged = flagged or bm.any()
    # t = (double)(int)(INVLN2*x + halF[sign]) (v), hi = x - t*LN2_HI (h),
    # lo = t*LN2_LO, r = hi - lo
    _half_with_sign_of(x, h)
    _reduce_block(x, h, v, h, lo, r)
    # c = r - t*(P1 + t*(P2 + t*(P3 + t*(P4 + t*P5)))), t = r*r
    np.multiply(r, r, out=z)
    _poly_block(z, _K_P, p)
    np.multiply(p, z, out=p)
    np.subtract(r, p, out=p)                     # p = c
    # y = 1 - ((lo - (r*c)/(2 - c)) - hi)
    np.multiply(r, p, out=z)
    np.subtract(_K_TWO, p, out=p)
    np.divide(z, p, out=z)
    np.subtract(lo, z, out=z)
    np.subtract(z, h, out=z)
    np.subtract(_K_ONE, z, out=out)
    # y * 2^k (exponent field)
    np.add(v, _K_MAGIC, out=v)
    _add_exponent_block(out, v)
    return _patch(x, out, flagged, ~(np.abs(x) < _EXP_KHI) | bm if flagged else None,
                  _exp_special)


def exp(x) -> np.ndarray:
    """e**x: fdlibm 5.3 ``e_exp.c``; error < 1 ulp (fdlibm's analysis;
    measured max 0.87); C twin ``gt_exp``.

    Method::

      1. Argument reduction: x = k*ln2 + r, |r| <= 0.5*ln2, r = hi - lo.
         hx = high word of |x| (bits 63..32 without the sign).
         0x3fd62e42 < hx < 0x3ff0a2b2 (0.5ln2 < |x| < 1.5ln2):
             hi = x - (+-LN2_HI), lo = +-LN2_LO, k = +-1   (sign of x)
         hx >= 0x3ff0a2b2:
             k  = (int)(INVLN2*x + (x < 0 ? -0.5 : 0.5))   (C truncation)
             t  = (double)k
             hi = x - t*LN2_HI      (exact: LN2_HI ends in 21 zero bits)
             lo = t*LN2_LO
         in both cases r = hi - lo;   hx <= 0x3fd62e42: k = 0, r = x.
      2. exp(r) from a degree-5 Remez fit of R(r*r) = r*(e^r+1)/(e^r-1)
         (error < 2^-59):
             t = r*r
             c = r - t*(P1 + t*(P2 + t*(P3 + t*(P4 + t*P5))))
             k == 0:  return 1 - ((r*c)/(c - 2) - r)
             k != 0:  y = 1 - ((lo - (r*c)/(2 - c)) - hi)
      3. k >= -1021: add k to y's exponent field (exact);
         k <  -1021: add k + 1000, multiply by 2^-1000 (one rounding into
         the subnormal range).

    Every operation above is one rounded binary64 operation, evaluated
    innermost parenthesis first, left to right; nothing is fused.

    Special cases (tested first)::

      hx >= 0x40862e42 (|x| >= 709.78):
          NaN -> NaN (0x7ff8000000000000);  +inf -> +inf;  -inf -> +0.0;
          x > O_THRESHOLD -> +inf;  x < U_THRESHOLD -> +0.0
      hx < 0x3e300000 (|x| < 2^-28): 1 + x
      exp(+-0) = 1 is the only exact finite case.

    Constants (hex bits are exact; decimals are fdlibm's)::

      O_THRESHOLD  0x1.62e42fefa39efp+9     0x40862E42FEFA39EF  7.09782712893383973096e+02
      U_THRESHOLD  -0x1.74910d52d3051p+9    0xC0874910D52D3051  -7.45133219101941108420e+02
      LN2_HI       0x1.62e42fee00000p-1     0x3FE62E42FEE00000  6.93147180369123816490e-01
      LN2_LO       0x1.a39ef35793c76p-33    0x3DEA39EF35793C76  1.90821492927058770002e-10
      INVLN2       0x1.71547652b82fep+0     0x3FF71547652B82FE  1.44269504088896338700e+00
      TWOM1000     0x1.0000000000000p-1000  0x0170000000000000  9.33263618503218878990e-302
      P1           0x1.555555555553ep-3     0x3FC555555555553E  1.66666666666666019037e-01
      P2           -0x1.6c16c16bebd93p-9    0xBF66C16C16BEBD93  -2.77777777770155933842e-03
      P3           0x1.1566aaf25de2cp-14    0x3F11566AAF25DE2C  6.61375632143793436117e-05
      P4           -0x1.bbd41c5d26bf1p-20   0xBEBBBD41C5D26BF1  -1.65339022054652515390e-06
      P5           0x1.6376972bea4d0p-25    0x3E66376972BEA4D0  4.13813679705723846039e-08

    Vectorised kernel, bit-identical to the above on its domain
    ``|x| < 704`` minus the bands ``[2^-54, 2^-28)`` and W (see ``_W_LO``,
    ``_EXP_TB_LO``); it uses the |x| >= 1.5ln2 formulas for every lane:
      * |k| == 1 lanes: the general reduction also yields k = +-1 there, and
        t*LN2_HI = +-LN2_HI, t*LN2_LO = +-LN2_LO exactly: same hi, lo;
      * k == 0 lanes: t = +-0, so hi = x, lo = +-0, r = x, and
        1 - ((lo - q) - hi) with q = (r*c)/(2-c) equals 1 - (q' - r) with
        q' = (r*c)/(c-2) = -q, because IEEE subtraction and division are
        symmetric under negation;
      * 2^k: adding k<<52 to the bits of y, computed as shown in the code.
    """
    return _run(x, _exp_block, _exp_ref)
