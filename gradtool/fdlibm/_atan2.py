"""atan2: fdlibm 5.3 ``e_atan2.c`` (C twin ``gt_atan2`` in gradtool/csrc/gt_math.h), on
``_atan``'s atan.  Two arguments, broadcast like numpy; as the one-argument functions,
the lanes are split by fdlibm's case and each formula runs on its own lanes.
"""

from __future__ import annotations

import numpy as np

from ._atan import _atan_flat, _hiword
from ._common import NAN, _F64, _U64, _hex
from ._driver import _BLOCK

PI_O_4 = _hex("0x1.921fb54442d18p-1")    # 7.8539816339744827900E-01  0x3FE921FB54442D18
PI_O_2 = _hex("0x1.921fb54442d18p+0")    # 1.5707963267948965580E+00  0x3FF921FB54442D18
PI = _hex("0x1.921fb54442d18p+1")        # 3.1415926535897931160E+00  0x400921FB54442D18
PI_LO = _hex("0x1.1a62633145c07p-53")    # 1.2246467991473531772E-16  0x3CA1A62633145C07
THREE_PI_O_4 = 3.0 * PI_O_4              # fdlibm's 3.0*pi_o_4, rounded once
HUGE_Z = PI_O_2 + 0.5 * PI_LO            # fdlibm's z for |y/x| > 2^60


def atan2(y, x) -> np.ndarray:
    """The angle of the point (x, y), in [-pi, pi]: fdlibm 5.3 ``e_atan2.c``; C twin
    ``gt_atan2``.  Bit for bit fdlibm's (and Java StrictMath's), NaNs aside.  ``y`` and
    ``x`` broadcast like numpy.  Not within 1 ulp everywhere (fdlibm claims no bound): y/x
    is rounded before atan (< 1 ulp) sees it, and pi - (z - pi_lo) rounds twice; measured
    max 1.448 ulp, at most one double from the correctly rounded result (10^5 pairs a
    quadrant against 50-digit mpmath).

    Method (fdlibm's "+ tiny" on the exact-angle cases only sets the inexact flag: the
    sums round to the constant, which is what is returned)::

      x or y NaN:      NaN (0x7ff8000000000000)
      x == 1.0:        atan(y)
      m = 2*sign bit of x + sign bit of y
      y == +-0:        m = 0, 1: y;  m = 2: pi;  m = 3: -pi
      x == +-0:        -pi/2 if y < 0 else pi/2
      x == +-inf:      y infinite: m = 0..3: pi/4, -pi/4, 3*pi/4, -3*pi/4 (3.0*pi_o_4 rounded)
                       else:       m = 0..3: +0, -0, pi, -pi
      y == +-inf:      -pi/2 if y < 0 else pi/2
      k = (iy - ix) >> 20 (iy, ix: the high words of |y|, |x|; the exponent difference)
      z = pi_o_2 + 0.5*pi_lo   if k > 60            (|y/x| > 2^60)
          0                    if x < 0 and k < -60 (|y/x| < 2^-60)
          atan(|y/x|)          otherwise
      m = 0: z;  m = 1: -z;  m = 2: pi - (z - pi_lo);  m = 3: (z - pi_lo) - pi

    Constants: PI_O_4, PI_O_2, PI, PI_LO above (fdlibm's decimals and their bits).
    """
    y, x = np.broadcast_arrays(np.asarray(y, dtype=_F64), np.asarray(x, dtype=_F64))
    shape = y.shape
    yf = np.ascontiguousarray(y).reshape(-1)
    xf = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(yf.shape, _F64)
    for start in range(0, yf.size, _BLOCK):
        out[start:start + _BLOCK] = _atan2_flat(yf[start:start + _BLOCK],
                                                xf[start:start + _BLOCK])
    return out.reshape(shape)


def _atan2_flat(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """atan2 of two 1-d float64 blocks of one size, case by case."""
    out = np.empty(y.shape, _F64)
    if y.size == 0:
        return out
    iy, ix = _hiword(y), _hiword(x)
    sy = (y.view(_U64) >> _U64(63)).astype(np.int64)
    sx = (x.view(_U64) >> _U64(63)).astype(np.int64)
    m = sy | (sx << 1)
    with np.errstate(all="ignore"):
        nan = np.isnan(x) | np.isnan(y)
        one = (x.view(_U64) == _U64(0x3FF0000000000000)) & ~nan
        y0 = (y == 0.0) & ~nan & ~one
        x0 = (x == 0.0) & ~nan & ~one & ~y0
        xinf = np.isinf(x) & ~nan & ~one & ~y0 & ~x0
        yinf = np.isinf(y) & ~nan & ~one & ~y0 & ~x0 & ~xinf
        rest = ~(nan | one | y0 | x0 | xinf | yinf)

        out[nan] = NAN
        i = np.flatnonzero(one)
        if i.size:
            out[i] = _atan_flat(y[i])
        i = np.flatnonzero(y0)
        if i.size:
            out[i] = np.choose(m[i], [y[i], y[i], PI, -PI])
        i = np.flatnonzero(x0 | yinf)
        out[i] = np.where(sy[i] == 1, -PI_O_2, PI_O_2)
        i = np.flatnonzero(xinf)
        if i.size:
            both = np.choose(m[i], [PI_O_4, -PI_O_4, THREE_PI_O_4, -THREE_PI_O_4])
            finite = np.choose(m[i], [0.0, -0.0, PI, -PI])
            out[i] = np.where(np.isinf(y[i]), both, finite)
        i = np.flatnonzero(rest)
        if i.size:
            yv, xv, mi = y[i], x[i], m[i]
            k = (iy[i] - ix[i]) >> 20
            z = np.empty(i.shape, _F64)
            big = k > 60
            zero = ~big & (sx[i] == 1) & (k < -60)
            z[big] = HUGE_Z
            z[zero] = 0.0
            j = np.flatnonzero(~big & ~zero)
            if j.size:
                z[j] = _atan_flat(np.abs(yv[j] / xv[j]))
            out[i] = np.choose(mi, [z, -z, PI - (z - PI_LO), (z - PI_LO) - PI])
    return out


_atan2_ref = atan2   # one path: the case-by-case evaluation above
