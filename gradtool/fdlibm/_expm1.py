"""expm1: fdlibm 5.3 ``s_expm1.c`` (C twin ``gt_expm1`` in
gradtool/csrc/gt_math.h).

``expm1`` (whose docstring gives the method, special cases and constants),
its early returns ``_expm1_special``, the mask-by-mask reference path
``_expm1_ref``/``_expm1_core`` and the vectorised kernel ``_expm1_block``
with its reconstruction tables ``_EM1_A/_EM1_T/_EM1_C``.

Also expm1's polynomial, which tanh (``_tanh``) builds on: the constants
Q1..Q5, ``_expm1_poly`` for the reference paths and ``_expm1_poly_block``
for the kernels (C twin ``gtm_expm1_poly``).  Step 1 is exp's reduction,
imported from ``_exp``.
"""

from __future__ import annotations

import numpy as np

from ._common import (
    INF, NAN, O_THRESHOLD, _F64, _K_MAGIC, _K_ONE, _MAGIC_BITS, _U64, _add_exponent,
    _add_exponent_block, _c, _half_with_sign_of, _hex, _hiword_bound, _poly_block, _reduce_block,
    _sparse_nonzero,
)
from ._driver import _masked, _patch, _run
from ._exp import _EXP_BIG, _K_W_HI, _K_W_LO, _exp_reduction

# expm1's polynomial (s_expm1.c), coefficients pre-scaled by 2^i
Q1 = _hex("-0x1.11111111110f4p-5")  # -3.33333333333331316428e-02 0xBFA11111111110F4
Q2 = _hex("0x1.a01a019fe5585p-10")  # 1.58730158725481460165e-03  0x3F5A01A019FE5585
Q3 = _hex("-0x1.4ce199eaadbb7p-14")  # -7.93650757867487942473e-05 0xBF14CE199EAADBB7
Q4 = _hex("0x1.0cfca86e65239p-18")  # 4.00821782732936239552e-06  0x3ED0CFCA86E65239
Q5 = _hex("-0x1.afdb76e09c32dp-23")  # -2.01099218183624371326e-07 0xBE8AFDB76E09C32D

_EM1_NEG = _hiword_bound(0x4043687A)   # hx >= 0x4043687a: |x| >= 56*ln2
_EM1_TINY = 0x3C900000                 # hx < this: |x| < 2^-54
_EM1_KLO = _hex("0x1p-54")

# Kernel reconstruction tables, indexed by k + 56 (the kernel domain
# -56*ln2 < x < 709.78 gives -56 <= k <= 1024).  fdlibm's final step is,
# with D = r - E (see expm1's docstring):
#     k <= -2 or k > 56:  (1 - (E - r)) * 2^k - 1  =  (1 + D)*2^k - 1
#     k == -1:            0.5*(r - E) - 0.5        =  (-1 + D)*2^-1
#     k == 0:             r - E                    =  (0 + D)*2^0
#     k == 1, r >= -0.25: 1 + 2*(r - E)            =  (0.5 + D)*2^1
#     2 <= k <= 19:       ((1-2^-k) - (E - r))*2^k =  ((1-2^-k) + D)*2^k
#     20 <= k <= 56:      ((r - (E + 2^-k)) + 1)*2^k
# (E - r = -(r - E) exactly; 0.5*v and 2*v are exact for these magnitudes,
# so the power of two can move outside the rounding.)  All of them are
#     y = A[k] + (r - (E + T[k]));  y *= 2^k (exponent field);  y - C[k]
# with T[k] = 2^-k for 20 <= k <= 56 and +0 otherwise (E + 0 = E up to the
# sign of a zero, which r - E does not see).  The remaining case k == 1,
# r < -0.25, -2*(E - (r + 0.5)) = 2*((r + 0.5) - E), is patched afterwards.
_EM1_KMIN, _EM1_KMAX = -56, 1024
_em1_k = np.arange(_EM1_KMIN, _EM1_KMAX + 1)
_EM1_A = np.ones(_em1_k.size)
_EM1_A[_em1_k == -1] = -1.0
_EM1_A[_em1_k == 0] = 0.0
_EM1_A[_em1_k == 1] = 0.5
for _k in range(2, 20):
    _EM1_A[_k - _EM1_KMIN] = 1.0 - 2.0 ** -_k      # exact
_EM1_T = np.zeros(_em1_k.size)
for _k in range(20, 57):
    _EM1_T[_k - _EM1_KMIN] = 2.0 ** -_k
_EM1_C = ((_em1_k <= -2) | (_em1_k > 56)).astype(_F64)
del _k, _em1_k
# the kernel gathers A[k], T[k], C[k] with one np.take of 32-byte rows
# (~0.8 ns per element, plus ~0.25 ns for each strided use of a column)
# instead of three np.take of 8-byte ones (~0.65 ns each, measured)
_EM1_ATC = np.stack([_EM1_A, _EM1_T, _EM1_C, np.zeros_like(_EM1_A)], axis=1)
_K_R1 = tuple(map(_c, (1.0, Q1, Q2, Q3, Q4, Q5)))   # r1 = 1 + hxs*(Q1 + ...)
_K_HALF, _K_THREE, _K_SIX, _K_QUARTER = _c(0.5), _c(3.0), _c(6.0), _c(-0.25)


def _expm1_poly(r):
    """Step 2 of expm1 (and of tanh) up to e, for the reference path (C twin
    ``gtm_expm1_poly``):
        hfx = 0.5*r;  hxs = r*hfx
        r1  = 1 + hxs*(Q1 + hxs*(Q2 + hxs*(Q3 + hxs*(Q4 + hxs*Q5))))
        t   = 3 - r1*hfx;  e = hxs*((r1 - t)/(6 - r*t))
    Returns (hxs, e)."""
    hfx = 0.5 * r
    hxs = r * hfx
    r1 = 1.0 + hxs * (Q1 + hxs * (Q2 + hxs * (Q3 + hxs * (Q4 + hxs * Q5))))
    t = 3.0 - r1 * hfx
    return hxs, hxs * ((r1 - t) / (6.0 - r * t))


def _expm1_poly_block(r, hfx, hxs, e) -> None:
    """The kernels' ``_expm1_poly``, one ufunc call per operation, into the
    buffers hxs and e; hfx is scratch (it ends up holding 6 - r*t)."""
    np.multiply(r, _K_HALF, out=hfx)            # hfx = 0.5*r
    np.multiply(r, hfx, out=hxs)                # hxs = r*hfx
    # r1 = 1 + hxs*(Q1 + hxs*(Q2 + hxs*(Q3 + hxs*(Q4 + hxs*Q5))))
    _poly_block(hxs, _K_R1, e)                  # e = r1
    # t = 3 - r1*hfx;  e = hxs*((r1 - t)/(6 - r*t))
    np.multiply(e, hfx, out=hfx)
    np.subtract(_K_THREE, hfx, out=hfx)         # hfx = t
    np.subtract(e, hfx, out=e)
    np.multiply(r, hfx, out=hfx)
    np.subtract(_K_SIX, hfx, out=hfx)
    np.divide(e, hfx, out=e)
    np.multiply(hxs, e, out=e)


def _expm1_special(x: np.ndarray):
    """fdlibm's early returns of expm1: (y, rest); y is final where rest is False."""
    u = x.view(_U64)
    hx = (u >> _U64(32)) & _U64(0x7FFFFFFF)
    tiny = hx < _EM1_TINY                       # |x| < 2^-54: x
    nan = x != x
    over = x > O_THRESHOLD                      # includes +inf
    minus1 = ((u >> _U64(63)) != 0) & (hx >= 0x4043687A) & ~nan  # x <= -56 ln2, -inf
    y = np.where(tiny, x, np.where(over, INF, np.where(minus1, -1.0, NAN)))
    return y, ~(tiny | over | minus1 | nan)


def _expm1_ref(x: np.ndarray) -> np.ndarray:
    """Literal vectorised transcription of gt_expm1: every branch is a mask."""
    return _masked(x, _expm1_special, _expm1_core)


def _expm1_core(x: np.ndarray) -> np.ndarray:
    """gt_expm1 from the argument reduction on."""
    red, k, hi, lo = _exp_reduction(x)
    r = np.where(red, hi - lo, x)
    c = np.where(red, (hi - r) - lo, 0.0)
    hxs, e = _expm1_poly(r)
    y_k0 = r - (r * e - hxs)                                  # k == 0 (c is 0)
    e = r * (e - c) - c
    e = e - hxs
    y_km1 = 0.5 * (r - e) - 0.5                               # k == -1
    y_k1 = np.where(r < -0.25, -2.0 * (e - (r + 0.5)),       # k == 1
                    1.0 + 2.0 * (r - e))
    y_far = _add_exponent(1.0 - (e - r), k) - 1.0             # k <= -2 or k > 56
    ka = np.clip(k, 2, 19).astype(_U64)                       # 2 <= k < 20
    t_a = ((_U64(0x3FF00000) - (_U64(0x200000) >> ka)) << _U64(32)).view(_F64)
    y_a = _add_exponent(t_a - (e - r), k)                     # t_a = 1 - 2^-k
    kb = np.clip(k, 20, 56).astype(_U64)                      # 20 <= k <= 56
    t_b = ((_U64(0x3FF) - kb) << _U64(52)).view(_F64)         # t_b = 2^-k
    y_b = _add_exponent((r - (e + t_b)) + 1.0, k)
    return np.select(
        [k == 0, k == -1, k == 1, (k <= -2) | (k > 56), k < 20],
        [y_k0, y_km1, y_k1, y_far, y_a], y_b)


def _expm1_block(x, out, bufs):
    (v, h, lo, r, c, e, w, *_), (bm, bm2, bm3, words), atc = bufs
    # which lanes may use the kernel (max() and min() are NaN if a NaN is there)
    np.abs(x, out=w)
    np.greater_equal(w, _K_W_LO, out=bm)
    np.less(w, _K_W_HI, out=bm2)
    np.logical_and(bm, bm2, out=bm)
    flagged = (not (w.min() >= _EM1_KLO and x.min() > -_EM1_NEG and x.max() < _EXP_BIG)
               or bm.any())
    # argument reduction (as exp) with c = (hi - r) - lo: t (v), r, c
    _half_with_sign_of(x, h)
    _reduce_block(x, h, v, h, lo, r, c)
    # expm1's polynomial: hxs (lo), e
    _expm1_poly_block(r, h, lo, e)
    # E = (r*(e - c) - c) - hxs
    np.subtract(e, c, out=e)
    np.multiply(r, e, out=e)
    np.subtract(e, c, out=e)
    np.subtract(e, lo, out=e)
    # lanes with k == 1 and r < -0.25 take -2*(E - (r + 0.5)): remember them
    np.less(r, _K_QUARTER, out=bm2)
    np.equal(v, _K_ONE, out=bm3)
    np.logical_and(bm2, bm3, out=bm2)
    patch = _sparse_nonzero(bm2, words)
    if patch.size:
        r_p, e_p = r[patch], e[patch]
    # k from the bits of t + 1.5*2^52, as a row index into _EM1_ATC
    np.add(v, _K_MAGIC, out=v)
    ib = c.view(np.int64)                        # c is not needed any more
    np.subtract(v.view(np.int64), _MAGIC_BITS + _EM1_KMIN, out=ib)
    np.take(_EM1_ATC, ib, axis=0, out=atc, mode="clip")
    # y = A[k] + (r - (E + T[k]))
    np.add(e, atc[:, 1], out=e)
    np.subtract(r, e, out=e)
    np.add(atc[:, 0], e, out=out)
    # y *= 2^k (exponent field; v = t + 1.5*2^52 already), then y - C[k]
    _add_exponent_block(out, v)
    np.subtract(out, atc[:, 2], out=out)
    if patch.size:
        out[patch] = -2.0 * (e_p - (r_p + 0.5))
    return _patch(x, out, flagged, ~((np.abs(x) >= _EM1_KLO) & (x > -_EM1_NEG) & (x < _EXP_BIG))
                  | bm if flagged else None, _expm1_special)


def expm1(x) -> np.ndarray:
    """e**x - 1: fdlibm 5.3 ``s_expm1.c``; error < 1 ulp (fdlibm's analysis;
    measured max 0.84); C twin ``gt_expm1``.

    Method (hx = high word of |x|, as in exp)::

      1. Argument reduction: x = k*ln2 + r, |r| <= 0.5*ln2 (as exp), plus a
         correction c for the rounding of r = hi - lo:
         0x3fd62e42 < hx < 0x3ff0a2b2:  x >= 0: hi = x - LN2_HI, lo =  LN2_LO, k =  1
                                        x <  0: hi = x + LN2_HI, lo = -LN2_LO, k = -1
         hx >= 0x3ff0a2b2:  k = (int)(INVLN2*x + (x < 0 ? -0.5 : 0.5)),
                            t = (double)k, hi = x - t*LN2_HI, lo = t*LN2_LO
         then r = hi - lo, c = (hi - r) - lo;   hx <= 0x3fd62e42: k = 0, r = x.
      2. R1(z) ~ r*(e^r+1)/(e^r-1) scaled: a degree-5 Remez fit on [0, 0.347]
         with error < 2^-61, evaluated as
             hfx = 0.5*r
             hxs = r*hfx
             r1  = 1 + hxs*(Q1 + hxs*(Q2 + hxs*(Q3 + hxs*(Q4 + hxs*Q5))))
             t   = 3 - r1*hfx
             e   = hxs*((r1 - t)/(6 - r*t))
         k == 0:  return r - (r*e - hxs)
         E = (r*(e - c) - c) - hxs
      3. Reconstruction, by k:
         k == -1:             0.5*(r - E) - 0.5
         k == 1, r < -0.25:   -2*(E - (r + 0.5))
         k == 1, r >= -0.25:  1 + 2*(r - E)
         k <= -2 or k > 56:   y = 1 - (E - r); add k to y's exponent; y - 1
         2 <= k < 20:         y = (1 - 2^-k) - (E - r); add k to the exponent
         20 <= k <= 56:       y = r - (E + 2^-k); y = y + 1; add k to the exponent
         (1 - 2^-k and 2^-k are built from bits: high word
         0x3ff00000 - (0x200000 >> k), resp. exponent field 0x3ff - k.)

    Every operation is one rounded binary64 operation, innermost first.

    Special cases (tested first)::

      hx >= 0x4043687a (|x| >= 56*ln2):
          NaN -> NaN (0x7ff8000000000000);  +inf -> +inf;  -inf -> -1.0;
          x > O_THRESHOLD -> +inf;  x <= -56*ln2 (negative) -> -1.0
      hx < 0x3c900000 (|x| < 2^-54): x itself (keeps -0.0)

    Constants::

      O_THRESHOLD  0x1.62e42fefa39efp+9     0x40862E42FEFA39EF  7.09782712893383973096e+02
      LN2_HI       0x1.62e42fee00000p-1     0x3FE62E42FEE00000  6.93147180369123816490e-01
      LN2_LO       0x1.a39ef35793c76p-33    0x3DEA39EF35793C76  1.90821492927058770002e-10
      INVLN2       0x1.71547652b82fep+0     0x3FF71547652B82FE  1.44269504088896338700e+00
      Q1           -0x1.11111111110f4p-5    0xBFA11111111110F4  -3.33333333333331316428e-02
      Q2           0x1.a01a019fe5585p-10    0x3F5A01A019FE5585  1.58730158725481460165e-03
      Q3           -0x1.4ce199eaadbb7p-14   0xBF14CE199EAADBB7  -7.93650757867487942473e-05
      Q4           0x1.0cfca86e65239p-18    0x3ED0CFCA86E65239  4.00821782732936239552e-06
      Q5           -0x1.afdb76e09c32dp-23   0xBE8AFDB76E09C32D  -2.01099218183624371326e-07

    Vectorised kernel: domain ``2^-54 <= |x|``, ``-56*ln2 < x < 709.78``
    (high word below 0x40862e42), minus the band W of exp.  The reduction
    is exp's general one (same argument for |k| == 1 and k == 0; for k == 0
    it gives c = (x - x) - 0 = +0, and E = (r*(e - 0) - 0) - hxs is then
    the k == 0 expression r*e - hxs).  Step 3 is evaluated through the
    tables ``_EM1_A/_EM1_T/_EM1_C`` (derivation next to them).
    """
    return _run(x, _expm1_block, _expm1_ref)
