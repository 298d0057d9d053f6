"""log: fdlibm 5.3 ``e_log.c`` (C twin ``gt_log`` in gradtool/csrc/gt_math.h).

``log`` (whose docstring gives the method, special cases and constants),
its early returns ``_log_special``, the mask-by-mask reference path
``_log_ref``/``_log_core`` and the vectorised kernel ``_log_block``, with
log's own constants (TWO54, LG1..LG7, THIRD).  log shares nothing with the
other functions beyond ``_common`` and ``_driver``.
"""

from __future__ import annotations

import numpy as np

from ._common import (
    INF, LN2_HI, LN2_LO, NAN, _ABS, _F64, _K_52, _K_LN2_HI, _K_LN2_LO, _K_MAGIC, _K_ONE, _K_TWO,
    _MAGIC_BITS, _U64, _c, _hex, _poly_block, _sparse_nonzero,
)
from ._driver import _masked, _patch, _run

# log's constants besides the shared ones (hex = exact value, decimal = fdlibm's)
TWO54 = _hex("0x1p54")                  # 1.80143985094819840000e+16  0x4350000000000000

# log's polynomial (e_log.c)
LG1 = _hex("0x1.5555555555593p-1")  # 6.666666666666735130e-01  0x3FE5555555555593
LG2 = _hex("0x1.999999997fa04p-2")  # 3.999999999940941908e-01  0x3FD999999997FA04
LG3 = _hex("0x1.2492494229359p-2")  # 2.857142874366239149e-01  0x3FD2492494229359
LG4 = _hex("0x1.c71c51d8e78afp-3")  # 2.222219843214978396e-01  0x3FCC71C51D8E78AF
LG5 = _hex("0x1.7466496cb03dep-3")  # 1.818357216161805012e-01  0x3FC7466496CB03DE
LG6 = _hex("0x1.39a09d078c69fp-3")  # 1.531383769920937332e-01  0x3FC39A09D078C69F
LG7 = _hex("0x1.2f112df3e5244p-3")  # 1.479819860511658591e-01  0x3FC2F112DF3E5244
THIRD = _hex("0x1.5555555555555p-2")  # fdlibm's 0.33333333333333333  0x3FD5555555555555

_LOG_MIN = _hex("0x1p-1022")
# fdlibm takes the hfsq formula for mantissa high words 0x6147a..0x6b851;
# in terms of the (exact) f of the kernel that is f >= F1 or f < F2:
_BAND_F1 = 0x6147A * 2.0 ** -20                 # f of high word 0x6147a
_BAND_F2 = (0x6B852 * 2.0 ** -20 - 1.0) / 2.0   # f of high word 0x6b852 (exact)
# integer constants of the kernel's reduction (see _log_block)
_LOG_C = 0x95F64 << 32                          # fdlibm's 0x95f64, in the high word
_LOG_K = (0x3FF << 52) - _LOG_C
_MANT = (1 << 52) - 1
_K_F1, _K_F2 = _c(_BAND_F1), _c(_BAND_F2)
_K_LG_T1 = tuple(map(_c, (LG2, LG4, LG6)))        # t1 = w*(LG2 + w*(LG4 + w*LG6))
_K_LG_T2 = tuple(map(_c, (LG1, LG3, LG5, LG7)))   # t2 = z*(LG1 + w*(...))
_K_C, _K_MANT, _K_K, _K_MB = (_c(v, _U64) for v in (_LOG_C, _MANT, _LOG_K, _MAGIC_BITS - 1023))


def _log_special(x: np.ndarray):
    """fdlibm's early returns of log: (y, rest); y is final where rest is False."""
    u = x.view(_U64)
    zero = (u & _U64(_ABS)) == 0                # -inf
    nan = (((u >> _U64(63)) != 0) & ~zero) | (x != x)  # negative, -inf, NaN: NaN
    inf = x == INF
    y = np.where(zero, -INF, np.where(inf, INF, NAN))
    return y, ~(zero | nan | inf)


def _log_ref(x: np.ndarray) -> np.ndarray:
    """Literal vectorised transcription of gt_log: every branch is a mask."""
    return _masked(x, _log_special, _log_core)


def _log_core(x: np.ndarray) -> np.ndarray:
    """gt_log for positive finite x (subnormals included)."""
    u = x.view(_U64)
    sub = (u >> _U64(32)) < 0x00100000          # subnormal: scale up
    k = np.where(sub, -54, 0).astype(np.int64)
    x = np.where(sub, x * TWO54, x)
    u = x.view(_U64)
    hx = (u >> _U64(32)).astype(np.int64)
    k += (hx >> 20) - 1023
    hx &= 0x000FFFFF
    i = (hx + 0x95F64) & 0x100000
    xn = (((hx | (i ^ 0x3FF00000)).astype(_U64) << _U64(32))
          | (u & _U64(0xFFFFFFFF))).view(_F64)              # x or x/2 normalised
    k += i >> 20
    dk = k.astype(_F64)
    f = xn - 1.0
    # |f| < 2^-20: (0x000fffff & (2 + hx)) < 3
    small = ((2 + hx) & 0x000FFFFF) < 3
    y_f0 = np.where(k == 0, 0.0, dk * LN2_HI + dk * LN2_LO)
    R = (f * f) * (0.5 - THIRD * f)
    y_small = np.where(k == 0, f - R, dk * LN2_HI - ((R - dk * LN2_LO) - f))
    y_small = np.where(f == 0.0, y_f0, y_small)
    # main path
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (LG2 + w * (LG4 + w * LG6))
    t2 = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)))
    R = t2 + t1
    band = ((hx - 0x6147A) | (0x6B851 - hx)) > 0
    hfsq = (0.5 * f) * f
    y_band = np.where(k == 0, f - (hfsq - s * (hfsq + R)),
                      dk * LN2_HI - ((hfsq - (s * (hfsq + R) + dk * LN2_LO)) - f))
    y_main = np.where(k == 0, f - s * (f - R),
                      dk * LN2_HI - ((s * (f - R) - dk * LN2_LO) - f))
    return np.where(small, y_small, np.where(band, y_band, y_main))


def _log_block(x, out, bufs):
    (dk, s, z, w, t1, p, xb, *_), (band, b2, words, *_), _ = bufs
    xb = xb.view(_U64)
    u = x.view(_U64)
    # positive normal finite lanes only: min() catches 0, negatives,
    # subnormals and NaN (it returns NaN); +inf gives f = 0 below, so it can
    # only occur if has_small, where x.max() is checked.
    flagged = not x.min() >= _LOG_MIN
    # fdlibm's normalisation, i = (hx + 0x95f64) & 0x100000, on all 64 bits:
    # v = u + 0x95f64<<32 carries into the exponent field exactly when the
    # mantissa's high word is >= 0x6a09c, so for positive normal x
    #   v >> 52 = k + 1023                          (v < 2^63)
    #   bits(xn) = u - (k<<52) = (v & MANT) + (0x3ff<<52) - 0x95f64<<32
    # (x or x/2 with exponent field 0x3ff or 0x3fe); and dk = (double)k is
    # the double with bits 0x4338000000000000 + k, minus 1.5*2^52 (exact).
    v = dk.view(_U64)
    np.add(u, _K_C, out=v)
    np.bitwise_and(v, _K_MANT, out=xb)
    np.add(xb, _K_K, out=xb)
    f = xb.view(_F64)
    np.subtract(f, _K_ONE, out=f)               # f = xn - 1, exact
    np.right_shift(v, _K_52, out=v)
    np.add(v, _K_MB, out=v)
    np.subtract(dk, _K_MAGIC, out=dk)           # dk = k
    # fdlibm's hfsq band 0x6147a <= hx <= 0x6b851 (hx = mantissa high word):
    # for hx < 0x6a09c, f = mantissa in [0, 0.4142), band iff f >= _BAND_F1;
    # else f = (mantissa - 1)/2 in [-0.2929, 0), band iff f < _BAND_F2.
    np.greater_equal(f, _K_F1, out=band)
    np.less(f, _K_F2, out=b2)
    np.logical_or(band, b2, out=band)
    # s = f/(2 + f), z = s*s, w = z*z
    np.add(f, _K_TWO, out=s)
    np.divide(f, s, out=s)
    np.multiply(s, s, out=z)
    np.multiply(z, z, out=w)
    # fdlibm's |f| < 2^-20 branch (hx in {0xffffe, 0xfffff, 0}, which is
    # -2^-20 <= f < 2^-20) can only occur if some z = s*s is below 2^-41
    # (written so that a NaN would count as "maybe")
    has_small = not z.min() >= 2.0 ** -41
    # t1 = w*(LG2 + w*(LG4 + w*LG6))
    _poly_block(w, _K_LG_T1, t1)
    np.multiply(t1, w, out=t1)
    # t2 = z*(LG1 + w*(LG3 + w*(LG5 + w*LG7)))   (z)
    _poly_block(w, _K_LG_T2, p)
    np.multiply(p, z, out=z)
    np.add(z, t1, out=z)                        # z = R = t2 + t1
    # the hfsq band, on its lanes only:
    # Y = hfsq - (s*(hfsq + R) + dk*LN2_LO),  hfsq = (0.5*f)*f
    i = _sparse_nonzero(band, words)
    if i.size:
        fi = f[i]
        hfsq = fi * 0.5
        hfsq *= fi
        yb = z[i]
        yb += hfsq                              # hfsq + R (IEEE + and * commute)
        yb *= s[i]
        di = dk[i]
        di *= LN2_LO
        yb += di
        np.subtract(hfsq, yb, out=yb)
    # elsewhere Y = s*(f - R) - dk*LN2_LO
    np.multiply(dk, _K_LN2_LO, out=w)           # w = dk*LN2_LO
    np.subtract(f, z, out=z)
    np.multiply(s, z, out=z)
    np.subtract(z, w, out=z)
    if i.size:
        z[i] = yb
    # log = dk*LN2_HI - (Y - f)
    np.subtract(z, f, out=z)
    np.multiply(dk, _K_LN2_HI, out=dk)          # dk = dk*LN2_HI
    np.subtract(dk, z, out=out)
    if has_small:
        flagged = flagged or not x.max() < INF
        # R = (f*f)*(0.5 - THIRD*f);  log = dk*LN2_HI - ((R - dk*LN2_LO) - f);
        # this is also fdlibm's k == 0 result f - R, and its f == 0 results
        # +0.0 and dk*LN2_HI + dk*LN2_LO: 0 - ((R - 0) - f) = f - R and
        # d - ((0 - e) - 0) = d + e, exactly.
        np.greater_equal(f, -(2.0 ** -20), out=band)
        np.less(f, 2.0 ** -20, out=b2)
        np.logical_and(band, b2, out=band)
        i = np.flatnonzero(band)
        fi = f[i]
        R = (fi * fi) * (0.5 - THIRD * fi)
        out[i] = dk[i] - ((R - w[i]) - fi)
    # zero, negative, subnormal, inf, NaN: (bits - 2^-1022 bits) >= ..., unsigned
    return _patch(x, out, flagged, (u - _U64(0x0010000000000000)) >= _U64(0x7FE0000000000000)
                  if flagged else None, _log_special)


def log(x) -> np.ndarray:
    """Natural logarithm: fdlibm 5.3 ``e_log.c``; error < 1 ulp (fdlibm's
    analysis; measured max 0.82); C twin ``gt_log``.

    Method::

      0. hx, lx = high and low word of x (hx signed).  Subnormal x:
         x = x*TWO54, k = -54 (exact).
      1. Argument reduction: x = 2^k * (1 + f), sqrt(2)/2 < 1 + f < sqrt(2):
             k  += (hx >> 20) - 1023;  hx &= 0x000fffff
             i   = (hx + 0x95f64) & 0x100000
             set high word of x to hx | (i ^ 0x3ff00000)   (x or x/2)
             k  += i >> 20;  f = x - 1   (exact)
      2. |f| < 2^-20, i.e. (0x000fffff & (2 + hx)) < 3:
             f == 0:  k == 0 ? +0.0 : dk*LN2_HI + dk*LN2_LO
             R = (f*f)*(0.5 - THIRD*f)
             k == 0 ? f - R : dk*LN2_HI - ((R - dk*LN2_LO) - f)
         (dk = (double)k.)
      3. Otherwise, with s = f/(2 + f) and log(1+f) = 2s + s*R(s*s), R a
         degree-14 Remez fit on [0, 0.1716] with error < 2^-58.45:
             z  = s*s;  w = z*z
             t1 = w*(LG2 + w*(LG4 + w*LG6))
             t2 = z*(LG1 + w*(LG3 + w*(LG5 + w*LG7)))
             R  = t2 + t1
         if 0x6147a <= hx <= 0x6b851 (fdlibm: ((hx-0x6147a)|(0x6b851-hx)) > 0):
             hfsq = (0.5*f)*f
             k == 0 ? f - (hfsq - s*(hfsq + R))
                    : dk*LN2_HI - ((hfsq - (s*(hfsq + R) + dk*LN2_LO)) - f)
         else:
             k == 0 ? f - s*(f - R)
                    : dk*LN2_HI - ((s*(f - R) - dk*LN2_LO) - f)

    Every operation is one rounded binary64 operation, innermost first.

    Special cases::

      log(+-0) = -inf;  log(x < 0) = NaN (also -inf, and NaN of either
      sign);  log(+inf) = +inf;  log(NaN) = NaN (always 0x7ff8000000000000);
      log(1) = +0.0 is the only exact finite case.

    Constants::

      LN2_HI       0x1.62e42fee00000p-1     0x3FE62E42FEE00000  6.93147180369123816490e-01
      LN2_LO       0x1.a39ef35793c76p-33    0x3DEA39EF35793C76  1.90821492927058770002e-10
      TWO54        0x1.0000000000000p+54    0x4350000000000000  1.80143985094819840000e+16
      THIRD        0x1.5555555555555p-2     0x3FD5555555555555  0.33333333333333333 (fdlibm)
      LG1          0x1.5555555555593p-1     0x3FE5555555555593  6.666666666666735130e-01
      LG2          0x1.999999997fa04p-2     0x3FD999999997FA04  3.999999999940941908e-01
      LG3          0x1.2492494229359p-2     0x3FD2492494229359  2.857142874366239149e-01
      LG4          0x1.c71c51d8e78afp-3     0x3FCC71C51D8E78AF  2.222219843214978396e-01
      LG5          0x1.7466496cb03dep-3     0x3FC7466496CB03DE  1.818357216161805012e-01
      LG6          0x1.39a09d078c69fp-3     0x3FC39A09D078C69F  1.531383769920937332e-01
      LG7          0x1.2f112df3e5244p-3     0x3FC2F112DF3E5244  1.479819860511658591e-01

    Vectorised kernel: domain = positive normal finite x outside step 2.
    It uses the k != 0 formulas for every lane: with dk = +0 they are
    0 - ((P - 0) - f) = f - P exactly (IEEE subtraction is symmetric under
    negation, and the result is nonzero), i.e. the k == 0 formulas.  k and
    the bits of x or x/2 come from integer operations on the bits of x (see
    ``_log_block``); dk = (double)k is the double with bits
    0x4338000000000000 + k minus 1.5*2^52, which is exact and +0.0 for
    k == 0.  The hfsq band (~4% of random inputs) is evaluated on its
    gathered lanes only.
    """
    return _run(x, _log_block, _log_ref)
