"""sin: fdlibm 5.3 ``s_sin.c`` with ``k_sin.c`` and ``k_cos.c`` (C twins ``gt_sin``,
``gtm_kernel_sin``, ``gtm_kernel_cos`` in gradtool/csrc/gt_math.h); the reduction is
``_rem_pio2``.  cos (``_cos``) reuses the two kernels.

Like erf there is no separate block kernel: the lanes are split by branch and each
formula runs on its own lanes, one ufunc call per operation (``_sin_ref`` is ``sin``).
"""

from __future__ import annotations

import numpy as np

from ._common import NAN, _F64, _U64, _hex, _horner
from ._driver import _run_branches
from ._rem_pio2 import _rem_pio2

# k_sin.c: sin(x) ~ x + S1*x^3 + ... + S6*x^13 on [-pi/4, pi/4]
S1 = _hex("-0x1.5555555555549p-3")   # -1.66666666666666324348e-01  0xBFC5555555555549
S_TAIL = tuple(map(_hex, (
    "0x1.111111110f8a6p-7",          # S2  8.33333333332248946124e-03  0x3F8111111110F8A6
    "-0x1.a01a019c161d5p-13",        # S3 -1.98412698298579493134e-04  0xBF2A01A019C161D5
    "0x1.71de357b1fe7dp-19",         # S4  2.75573137070700676789e-06  0x3EC71DE357B1FE7D
    "-0x1.ae5e68a2b9cebp-26",        # S5 -2.50507602534068634195e-08  0xBE5AE5E68A2B9CEB
    "0x1.5d93a5acfd57cp-33",         # S6  1.58969099521155010221e-10  0x3DE5D93A5ACFD57C
)))
# k_cos.c: cos(x) ~ 1 - x*x/2 + C1*x^4 + ... + C6*x^14
C_COEF = tuple(map(_hex, (
    "0x1.555555555554cp-5",          # C1  4.16666666666666019037e-02  0x3FA555555555554C
    "-0x1.6c16c16c15177p-10",        # C2 -1.38888888888741095749e-03  0xBF56C16C16C15177
    "0x1.a01a019cb1590p-16",         # C3  2.48015872894767294178e-05  0x3EFA01A019CB1590
    "-0x1.27e4f809c52adp-22",        # C4 -2.75573143513906633035e-07  0xBE927E4F809C52AD
    "0x1.1ee9ebdb4b1c4p-29",         # C5  2.08757232129817482790e-09  0x3E21EE9EBDB4B1C4
    "-0x1.8fae9be8838d4p-37",        # C6 -1.13596475577881948265e-11  0xBDA8FAE9BE8838D4
)))
QX_BIG = 0.28125                     # k_cos.c's qx for |x| > 0.78125


def _hiword(v):
    return ((v.view(_U64) >> _U64(32)) & _U64(0x7FFFFFFF)).astype(np.int64)


def _kernel_sin(x, y, iy: bool):
    """__kernel_sin(x, y, iy) on |x| <~ pi/4, y the tail of x (iy: y is not 0)::

      |x| < 2^-27 (ix < 0x3e400000):  x
      z = x*x;  v = z*x;  r = S2 + z*(S3 + z*(S4 + z*(S5 + z*S6)))
      iy == 0:  x + v*(S1 + z*r)
      else:     x - ((z*(0.5*y - v*r) - y) - v*S1)
    """
    z = x * x
    v = z * x
    r = _horner(z, S_TAIL)
    s = x - ((z * (0.5 * y - v * r) - y) - v * S1) if iy else x + v * (S1 + z * r)
    return np.where(_hiword(x) < 0x3E400000, x, s)


def _kernel_cos(x, y):
    """__kernel_cos(x, y) on |x| <~ pi/4, y the tail of x::

      |x| < 2^-27:  1
      z = x*x;  r = z*(C1 + z*(C2 + z*(C3 + z*(C4 + z*(C5 + z*C6)))))
      |x| < 0.3 (ix < 0x3fd33333):  1 - (0.5*z - (z*r - x*y))
      else:  qx = 0.28125 if ix > 0x3fe90000 (|x| > 0.78125), else |x|/4 with its low
             word cleared (high word ix - 0x00200000);
             (1 - qx) - ((0.5*z - qx) - (z*r - x*y))   (1 - qx and 0.5*z - qx exact)
    """
    ix = _hiword(x)
    z = x * x
    r = z * _horner(z, C_COEF)
    zr = z * r - x * y
    small = 1.0 - (0.5 * z - zr)
    qx = np.where(ix > 0x3FE90000, QX_BIG,
                  (np.maximum(ix - 0x00200000, 0).astype(_U64) << _U64(32)).view(_F64))
    big = (1.0 - qx) - ((0.5 * z - qx) - zr)
    return np.where(ix < 0x3E400000, 1.0, np.where(ix < 0x3FD33333, small, big))


def _trig(x, is_cos: bool) -> np.ndarray:
    return _run_branches(x, _cos_flat if is_cos else _sin_flat)


def _sin_flat(flat):
    return _trig_flat(flat, False)


def _cos_flat(flat):
    return _trig_flat(flat, True)


def _trig_flat(flat: np.ndarray, is_cos: bool) -> np.ndarray:
    """sin or cos of a 1-d float64 block, branch by branch."""
    out = np.empty(flat.shape, _F64)
    if flat.size == 0:
        return out
    ix = _hiword(flat)
    with np.errstate(all="ignore"):
        i = np.flatnonzero(ix <= 0x3FE921FB)              # |x| <~ pi/4: no reduction
        if i.size:
            v = flat[i]
            out[i] = _kernel_cos(v, 0.0) if is_cos else _kernel_sin(v, 0.0, False)
        i = np.flatnonzero(ix >= 0x7FF00000)              # inf, NaN: NaN
        out[i] = NAN
        i = np.flatnonzero((ix > 0x3FE921FB) & (ix < 0x7FF00000))
        if i.size:
            n, y0, y1 = _rem_pio2(flat[i])
            s, c = _kernel_sin(y0, y1, True), _kernel_cos(y0, y1)
            q = (n + 1) & 3 if is_cos else n & 3           # cos(x) = sin(x + pi/2)
            out[i] = np.select([q == 0, q == 1, q == 2], [s, c, -s], -c)
    return out


def sin(x) -> np.ndarray:
    """Sine: fdlibm 5.3 ``s_sin.c``; error < 1 ulp (fdlibm: "nearly rounded"; measured
    max 0.726 ulp on tests/test_fdlibm_more.py's inputs); C twin ``gt_sin``.  Bit for bit fdlibm's (and Java
    StrictMath's) for every input, NaNs aside.

    Method (ix = high word of |x|)::

      ix <= 0x3fe921fb (|x| <~ pi/4):  __kernel_sin(x, 0, 0)   (x itself below 2^-27)
      ix >= 0x7ff00000 (inf, NaN):      NaN (0x7ff8000000000000)
      otherwise n, y0, y1 = rem_pio2(x) (``_rem_pio2``: x = n*pi/2 + y0 + y1), then by n & 3:
          0: __kernel_sin(y0, y1, 1)   1: __kernel_cos(y0, y1)
          2: -__kernel_sin(y0, y1, 1)  3: -__kernel_cos(y0, y1)

    The kernels' operation order is in ``_kernel_sin`` and ``_kernel_cos``.
    """
    return _trig(x, False)


_sin_ref = sin   # one path: the branch-by-branch evaluation above
