"""atan: fdlibm 5.3 ``s_atan.c`` (C twin ``gt_atan`` in gradtool/csrc/gt_math.h), and its
constants.  atan2 (``_atan2``) reuses ``_atan_flat`` and the constants.

Like erf there is no separate block kernel: the lanes are split by fdlibm's branch and
each formula runs on its own lanes, one ufunc call per operation (``_atan_ref`` is
``atan``).
"""

from __future__ import annotations

import numpy as np

from ._common import NAN, _F64, _U64, _hex, _horner
from ._driver import _run_branches

# atan(0.5), atan(1), atan(1.5), atan(inf) = pi/2, each as hi + lo
ATANHI = tuple(map(_hex, (
    "0x1.dac670561bb4fp-2",    # 4.63647609000806093515e-01  0x3FDDAC670561BB4F
    "0x1.921fb54442d18p-1",    # 7.85398163397448278999e-01  0x3FE921FB54442D18
    "0x1.f730bd281f69bp-1",    # 9.82793723247329054082e-01  0x3FEF730BD281F69B
    "0x1.921fb54442d18p+0",    # 1.57079632679489655800e+00  0x3FF921FB54442D18
)))
ATANLO = tuple(map(_hex, (
    "0x1.a2b7f222f65e2p-56",   # 2.26987774529616870924e-17  0x3C7A2B7F222F65E2
    "0x1.1a62633145c07p-55",   # 3.06161699786838301793e-17  0x3C81A62633145C07
    "0x1.007887af0cbbdp-56",   # 1.39033110312309984516e-17  0x3C7007887AF0CBBD
    "0x1.1a62633145c07p-54",   # 6.12323399573676603587e-17  0x3C91A62633145C07
)))
# atan(t) ~ t - t^3*(aT0 + aT1*t^2 + ... + aT10*t^20) on |t| <= 7/16
AT = tuple(map(_hex, (
    "0x1.555555555550dp-2",    # aT0   3.33333333333329318027e-01  0x3FD555555555550D
    "-0x1.999999998ebc4p-3",   # aT1  -1.99999999998764832476e-01  0xBFC999999998EBC4
    "0x1.24924920083ffp-3",    # aT2   1.42857142725034663711e-01  0x3FC24924920083FF
    "-0x1.c71c6fe231671p-4",   # aT3  -1.11111104054623557880e-01  0xBFBC71C6FE231671
    "0x1.745cdc54c206ep-4",    # aT4   9.09088713343650656196e-02  0x3FB745CDC54C206E
    "-0x1.3b0f2af749a6dp-4",   # aT5  -7.69187620504482999495e-02  0xBFB3B0F2AF749A6D
    "0x1.10d66a0d03d51p-4",    # aT6   6.66107313738753120669e-02  0x3FB10D66A0D03D51
    "-0x1.dde2d52defd9ap-5",   # aT7  -5.83357013379057348645e-02  0xBFADDE2D52DEFD9A
    "0x1.97b4b24760debp-5",    # aT8   4.97687799461593236017e-02  0x3FA97B4B24760DEB
    "-0x1.2b4442c6a6c2fp-5",   # aT9  -3.65315727442169155270e-02  0xBFA2B4442C6A6C2F
    "0x1.0ad3ae322da11p-6",    # aT10  1.62858201153657823623e-02  0x3F90AD3AE322DA11
)))
AT_ODD = AT[0::2]              # aT0, aT2, ..., aT10: s1's polynomial in w = t^4
AT_EVEN = AT[1::2]             # aT1, aT3, ..., aT9:  s2's


def _hiword(v):
    return ((v.view(_U64) >> _U64(32)) & _U64(0x7FFFFFFF)).astype(np.int64)


def _atan_poly(t):
    """t*(s1 + s2): z = t*t, w = z*z, s1 = z*(aT0 + w*(aT2 + ... + w*aT10)),
    s2 = w*(aT1 + w*(aT3 + ... + w*aT9))."""
    z = t * t
    w = z * z
    s1 = z * _horner(w, AT_ODD)
    s2 = w * _horner(w, AT_EVEN)
    return t * (s1 + s2)


def _reduced(a, k):
    """Branch k (0..3) of the reduction of a = |x| >= 7/16: atanhi[k] - ((t*(s1 + s2) -
    atanlo[k]) - t) with t = (2a - 1)/(2 + a), (a - 1)/(a + 1), (a - 1.5)/(1 + 1.5a), -1/a."""
    if k == 0:
        t = (2.0 * a - 1.0) / (2.0 + a)
    elif k == 1:
        t = (a - 1.0) / (a + 1.0)
    elif k == 2:
        t = (a - 1.5) / (1.0 + 1.5 * a)
    else:
        t = -1.0 / a
    return ATANHI[k] - ((_atan_poly(t) - ATANLO[k]) - t)


def atan(x) -> np.ndarray:
    """The arctangent, in [-pi/2, pi/2]: fdlibm 5.3 ``s_atan.c``; error < 1 ulp (fdlibm's
    claim; measured max 0.853 ulp on 10^5 points a branch against 50-digit mpmath); C twin
    ``gt_atan``.  Bit for bit fdlibm's (and Java StrictMath's), NaNs aside.

    Method (ix = high word of |x|; every operation one rounded binary64 operation,
    innermost first; atan(-x) = -atan(x) by the sign at the end)::

      ix >= 0x44100000 (|x| >= 2^66):  NaN -> NaN (0x7ff8000000000000);
          else +-(atanhi[3] + atanlo[3])   (= +-pi/2 rounded, inf included)
      ix < 0x3e200000 (|x| < 2^-29):   x
      ix < 0x3fdc0000 (|x| < 7/16):    x - t*(s1 + s2) with t = x
      otherwise a = |x|, by k:
          ix < 0x3fe60000 (a < 11/16):   k = 0, t = (2a - 1)/(2 + a)
          ix < 0x3ff30000 (a < 19/16):   k = 1, t = (a - 1)/(a + 1)
          ix < 0x40038000 (a < 39/16):   k = 2, t = (a - 1.5)/(1 + 1.5a)
          else:                          k = 3, t = -1/a
          +-(atanhi[k] - ((t*(s1 + s2) - atanlo[k]) - t)) by the sign of x
      where z = t*t, w = z*z, s1 = z*(aT0 + w*(aT2 + w*(aT4 + w*(aT6 + w*(aT8 + w*aT10))))),
            s2 = w*(aT1 + w*(aT3 + w*(aT5 + w*(aT7 + w*aT9))))

    Constants: ATANHI, ATANLO, AT above (fdlibm's decimals and their bits).
    """
    return _run_branches(x, _atan_flat)


def _atan_flat(flat: np.ndarray) -> np.ndarray:
    """atan of a 1-d float64 block, branch by branch."""
    out = np.empty(flat.shape, _F64)
    if flat.size == 0:
        return out
    ix = _hiword(flat)
    with np.errstate(all="ignore"):
        i = np.flatnonzero(ix >= 0x44100000)                  # huge, inf, NaN
        if i.size:
            v = flat[i]
            big = ATANHI[3] + ATANLO[3]
            out[i] = np.where(np.isnan(v), NAN, np.where(v > 0.0, big, -ATANHI[3] - ATANLO[3]))
        i = np.flatnonzero(ix < 0x3E200000)                   # tiny: x itself
        out[i] = flat[i]
        i = np.flatnonzero((ix >= 0x3E200000) & (ix < 0x3FDC0000))
        if i.size:
            v = flat[i]
            out[i] = v - _atan_poly(v)
        bounds = (0x3FDC0000, 0x3FE60000, 0x3FF30000, 0x40038000, 0x44100000)
        for k in range(4):
            i = np.flatnonzero((ix >= bounds[k]) & (ix < bounds[k + 1]))
            if i.size:
                v = flat[i]
                z = _reduced(np.abs(v), k)
                out[i] = np.where(v < 0.0, -z, z)
    return out


_atan_ref = atan   # one path: the branch-by-branch evaluation above
