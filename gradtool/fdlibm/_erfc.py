"""erfc: fdlibm 5.3 ``s_erf.c``'s own erfc (C twin ``gt_erfc`` in gradtool/csrc/gt_math.h).

Not ``1 - erf(x)``: for large x that difference cancels to nothing, while fdlibm's erfc
keeps its relative accuracy down to the underflow threshold (x ~ 26.5).  It shares its
polynomials and constants with ``erf`` (``_erf._erf_y``, ``_erf_pq``, ``_erf_r``); like
erf it has no separate block kernel (``_erfc_ref`` is ``erfc``).
"""

from __future__ import annotations

import numpy as np

from ._common import _F64, _U64
from ._driver import _by_branch, _run_branches
from ._erf import ERX, _erf_pq, _erf_r, _erf_y


def erfc(x) -> np.ndarray:
    """The complementary error function 1 - erf(x): fdlibm 5.3 ``s_erf.c``'s erfc; C twin
    ``gt_erfc``.  Not within 1 ulp everywhere, and fdlibm does not claim it: within 1
    ulp where the result is 1 - (small) or 2 - (small) (x < 1/4, every x < 0; measured
    max 0.85 ulp), elsewhere the rounded pieces (P/Q against 1 - ERX, two exps, a
    division) add up to a measured max of 2.89 ulp, 3 doubles from the correctly rounded
    result (10^5 points a branch against 50-digit mpmath; subnormal results in ulps of
    2^-1074).

    Method (hx = high word of x, ix = high word of |x|; every operation one rounded
    binary64 operation, innermost first; r/s, P/Q and R/S are erf's, see ``erf``)::

      ix >= 0x7ff00000:   NaN -> NaN (0x7ff8000000000000);  +inf -> 0,  -inf -> 2
      |x| < 2^-56 (ix < 0x3c700000):  1 - x
      |x| < 0.84375 (ix < 0x3feb0000):  y = r/s (z = x*x)
          x < 1/4 (hx < 0x3fd00000, signed: every negative x):  1 - (x + x*y)
          else:  r = x*y;  r = r + (x - 0.5);  0.5 - r
      |x| < 1.25 (ix < 0x3ff40000):  s = |x| - 1, P/Q as erf's
          x >= 0:  (1 - ERX) - P/Q   (1 - ERX exact)
          x < 0:   1 + (ERX + P/Q)
      |x| < 28 (ix < 0x403c0000):  a = |x|, s = 1/(a*a)
          a < 1/0.35 (ix < 0x4006db6d, one below erf's bound): R = ra0 + ..., S = 1 + s*(sa1 + ...)
          else:  x <= -6 (hx < 0, ix >= 0x40180000): 2 (fdlibm's 2 - tiny rounds to 2)
                 R = rb0 + ..., S = 1 + s*(sb1 + ...)
          z = a with the low 32 bits cleared (z*z exact)
          r = exp((-z)*z - 0.5625) * exp((z - a)*(z + a) + R/S)
          x > 0: r/a,  x < 0: 2 - r/a
      |x| >= 28:  x > 0: +0 (fdlibm's tiny*tiny underflows to +0);  x < 0: 2

    fdlibm's bounds: |r/s - (erf(x) - x)/x| <= 2^-57.90, |P/Q - (erf(|x|) - ERX)| <=
    2^-59.06, |R1/S1 - f| < 2^-62.57, |R2/S2 - f| < 2^-61.52 with
    f(1/x^2) = log(erfc(x)*x) + x*x + 0.5625.  Where erfc(x) is subnormal (x > 26.54) the
    first exp's result is too, and the product rounds twice (each within half an ulp of
    2^-1074).  Constants: ERX and the polynomials of ``_erf``; 0.5625 = 0x3FE2000000000000.
    """
    return _run_branches(x, _erfc_flat)


def _erfc_flat(flat: np.ndarray) -> np.ndarray:
    """erfc of a 1-d float64 block, branch by branch."""
    if flat.size == 0:
        return np.empty(0, _F64)
    hx = _hiword_signed(flat)
    ix = hx & 0x7FFFFFFF
    neg = hx < 0
    with np.errstate(all="ignore"):
        def tiny(v):                                           # |x| < 2^-56
            return 1.0 - v

        def small(v):                                          # |x| < 0.84375
            y = _erf_y(v)
            quarter = _hiword_signed(v) < 0x3FD00000
            r = v * y
            r = r + (v - 0.5)
            return np.where(quarter, 1.0 - (v + v * y), 0.5 - r)

        def mid(v):                                            # 0.84375 <= |x| < 1.25
            pq = _erf_pq(np.abs(v))
            return np.where(v >= 0.0, (1.0 - ERX) - pq, 1.0 + (ERX + pq))

        def tail(v):                                           # 1.25 <= |x| < 28, not x <= -6
            a = np.abs(v)
            q = _erf_r(a, (_hiword_signed(a) < 0x4006DB6D)) / a
            return np.where(v > 0.0, q, 2.0 - q)

        branches = (
            (ix < 0x3C700000, tiny),
            (ix < 0x3FEB0000, small),
            (ix < 0x3FF40000, mid),
            (neg & (ix >= 0x40180000) & (ix < 0x7FF00000), lambda v: np.full(v.shape, 2.0)),
            (ix < 0x403C0000, tail),
            (ix < 0x7FF00000, lambda v: np.where(v > 0.0, 0.0, 2.0)),    # 28 <= |x| < inf
        )
        return _by_branch(flat, branches, 0.0, 2.0)


def _hiword_signed(v):
    """fdlibm's hx: the high word of v as a signed 32-bit integer (in int64)."""
    h = (v.view(_U64) >> _U64(32)).astype(np.int64)
    return np.where(h >= 0x80000000, h - 0x100000000, h)


_erfc_ref = erfc   # one path: the branch-by-branch evaluation above
