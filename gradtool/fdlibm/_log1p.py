"""log1p: fdlibm 5.3 ``s_log1p.c`` (C twin ``gt_log1p`` in gradtool/csrc/gt_math.h).

``log1p`` (whose docstring gives the method and special cases); its polynomial is
e_log.c's (LG1..LG7 of ``_log``, fdlibm's Lp1..Lp7: the same bits).  One path, as erf:
every lane's formula is evaluated over the array, one ufunc call per operation, and
selected by the lane's branch (``_log1p_ref`` is ``log1p``).
"""

from __future__ import annotations

import numpy as np

from ._common import INF, LN2_HI, LN2_LO, NAN, _F64, _U64, _hex, _horner
from ._driver import _run_branches
from ._log import LG1, LG2, LG3, LG4, LG5, LG6, LG7

TWO_THIRDS = _hex("0x1.5555555555555p-1")   # fdlibm's 0.66666666666666666  0x3FE5555555555555
_LP = (LG1, LG2, LG3, LG4, LG5, LG6, LG7)


def _with_hiword(u, hw):
    """u's bits with the high word replaced by hw (both uint64 arrays)."""
    return ((hw << _U64(32)) | (u & _U64(0xFFFFFFFF))).view(_F64)


def log1p(x) -> np.ndarray:
    """log(1 + x): fdlibm 5.3 ``s_log1p.c``; error < 1 ulp (fdlibm's analysis; measured max 0.719
    ulp on tests/test_fdlibm_more.py's inputs); C twin ``gt_log1p``.  Bit for bit fdlibm's (and Java
    StrictMath's), NaNs aside.

    Method (hx = signed high word of x, ax = that of |x|; dk = (double)k)::

      hx < 0x3fda827a (x < 0.41422):
          ax >= 0x3ff00000 (x <= -1):  x == -1: -inf;  else NaN
          ax < 0x3e200000 (|x| < 2^-29):  ax < 0x3c900000: x;  else x - (x*x)*0.5
          -0.2929 <= x (hx > 0 or hx <= (int)0xbfd2bec3):  k = 0, f = x (no reduction)
      hx >= 0x7ff00000:  +inf -> +inf, NaN -> NaN (0x7ff8000000000000)
      otherwise (k != 0), the reduction 1 + x = 2^k * (1 + f), sqrt(2)/2 < 1 + f < sqrt(2):
          hx < 0x43400000:  u = 1 + x;  k = exponent of u;
                            c = k > 0 ? 1 - (u - x) : x - (u - 1);  c = c/u
          else:             u = x;  k = exponent of x;  c = 0
          hu = u's high mantissa bits (hu & 0x000fffff)
          hu < 0x6a09e:  u's high word = hu | 0x3ff00000
          else:          k += 1;  u's high word = hu | 0x3fe00000;  hu = (0x00100000 - hu) >> 2
          f = u - 1
      hfsq = (0.5*f)*f
      hu == 0 (|f| < 2^-20):
          f == 0:  k == 0 ? +0.0 : dk*LN2_HI + (c + dk*LN2_LO)
          R = hfsq*(1 - TWO_THIRDS*f)
          k == 0 ? f - R : dk*LN2_HI - ((R - (dk*LN2_LO + c)) - f)
      s = f/(2 + f);  z = s*s;  R = z*(LP1 + z*(LP2 + ... + z*LP7))
      k == 0 ? f - (hfsq - s*(hfsq + R))
             : dk*LN2_HI - ((hfsq - (s*(hfsq + R) + (dk*LN2_LO + c))) - f)

    (fdlibm's k == 0 test after the reduction drops c, 1 + x in [1, 2): kept as is.)
    """
    return _run_branches(x, _log1p_flat)


def _log1p_flat(flat: np.ndarray) -> np.ndarray:
    """log1p of a 1-d float64 block, every formula over the block, selected per lane."""
    with np.errstate(all="ignore"):
        u64 = flat.view(_U64)
        hx = (u64 >> _U64(32)).astype(np.int64)
        hx = np.where(hx >= 0x80000000, hx - (1 << 32), hx)          # signed high word
        ax = hx & 0x7FFFFFFF
        low = hx < 0x3FDA827A
        minus = low & (ax >= 0x3FF00000)                              # x <= -1
        tiny = low & ~minus & (ax < 0x3E200000)
        k0 = low & ~minus & ~tiny & ((hx > 0) | (hx <= 0xBFD2BEC3 - (1 << 32)))
        special = flat != flat
        red = (~low & (hx < 0x7FF00000)) | (low & ~minus & ~tiny & ~k0)   # k != 0
        big = hx >= 0x43400000
        u = np.where(big, flat, 1.0 + flat)
        uu = u.view(_U64)
        hu = ((uu >> _U64(32)) & _U64(0x7FFFFFFF)).astype(np.int64)
        k = (hu >> 20) - 1023
        c = np.where(k > 0, 1.0 - (u - flat), flat - (u - 1.0)) / u
        c = np.where(big, 0.0, c)
        hu &= 0x000FFFFF
        up = hu >= 0x6A09E
        k = np.where(up, k + 1, k)
        un = _with_hiword(uu, np.where(up, hu | 0x3FE00000, hu | 0x3FF00000).astype(_U64))
        hu = np.where(up, (0x00100000 - hu) >> 2, hu)
        f = np.where(red, un - 1.0, flat)
        k = np.where(red, k, 0)
        hu = np.where(red, hu, 1)
        c = np.where(red, c, 0.0)
        dk = k.astype(_F64)
        hfsq = (0.5 * f) * f
        # |f| < 2^-20
        rs = hfsq * (1.0 - TWO_THIRDS * f)
        y_small = np.where(k == 0, f - rs, dk * LN2_HI - ((rs - (dk * LN2_LO + c)) - f))
        y_zero = np.where(k == 0, 0.0, dk * LN2_HI + (c + dk * LN2_LO))
        y_small = np.where(f == 0.0, y_zero, y_small)
        s = f / (2.0 + f)
        z = s * s
        r = z * _horner(z, _LP)
        sr = s * (hfsq + r)
        y = np.where(k == 0, f - (hfsq - sr),
                     dk * LN2_HI - ((hfsq - (sr + (dk * LN2_LO + c))) - f))
        y = np.where(hu == 0, y_small, y)
        y = np.where(tiny, np.where(ax < 0x3C900000, flat, flat - (flat * flat) * 0.5), y)
        y = np.where(minus, np.where(flat == -1.0, -INF, NAN), y)
        y = np.where(~low & (hx >= 0x7FF00000), np.where(flat == INF, INF, NAN), y)
        y = np.where(special, NAN, y)
    return np.ascontiguousarray(y, dtype=_F64)


_log1p_ref = log1p   # one path
