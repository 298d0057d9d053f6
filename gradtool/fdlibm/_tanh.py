"""tanh: a compensated t/(t + 2) with t = expm1(2|x|) as a double-double
(C twin ``gt_tanh`` in gradtool/csrc/gt_math.h); not fdlibm's ``s_tanh.c``.

``tanh`` (whose docstring gives the method, the error analysis and the
constants), its early returns ``_tanh_special``, the mask-by-mask reference
path ``_tanh_ref``/``_tanh_core``, the vectorised kernel ``_tanh_block``
and Veltkamp's exact split (``SPLIT``, ``_split``, ``_split_block``).
Steps 1 and 2 are fdlibm expm1's reduction and polynomial, from ``_common``
and ``_expm1``.
"""

from __future__ import annotations

import numpy as np

from ._common import MAGIC, NAN, _ABS, _F64, _U64, _c, _hex, _reduce, _reduce_block
from ._driver import _masked, _patch, _run
from ._expm1 import _K_HALF, _expm1_poly, _expm1_poly_block

_TANH_TINY = _hex("0x1p-55")   # |x| < 2^-55 (hx < 0x3c800000): tanh(x) = x
_TANH_BIG = 22.0               # |x| >= 22 (hx >= 0x40360000): tanh(x) = +-1
SPLIT = _hex("0x1.0000002p+27")  # 2^27 + 1 = 134217729, Veltkamp's splitter  0x41A0000002000000
_K_SPLIT = _c(SPLIT)


def _tanh_special(x: np.ndarray):
    """tanh's cases without expm1: (y, rest); y is final where rest is False."""
    u = x.view(_U64)
    ax = (u & _U64(_ABS)).view(_F64)
    tiny = ax < _TANH_TINY                      # |x| < 2^-55: x
    sat = ax >= _TANH_BIG                       # |x| >= 22, +-inf: +-1
    nan = x != x
    y = np.where(tiny, x, np.where(sat, np.where((u >> _U64(63)) != 0, -1.0, 1.0), NAN))
    return y, ~(tiny | sat | nan)


def _tanh_ref(x: np.ndarray) -> np.ndarray:
    """Literal vectorised transcription of gt_tanh: every branch is a mask."""
    return _masked(x, _tanh_special, _tanh_core)


def _split(v):
    """Veltkamp's split v = hi + lo (exact): hi keeps the top 26 bits of the
    significand, lo the rest, so a product of two halves is exact."""
    g = SPLIT * v
    hi = g - (g - v)
    return hi, v - hi


def _split_block(v, hi, lo) -> None:
    """The kernel's ``_split`` of v into the buffers hi and lo, one ufunc
    call per operation (hi serves as g)."""
    np.multiply(v, _K_SPLIT, out=hi)            # g = SPLIT*v
    np.subtract(hi, v, out=lo)
    np.subtract(hi, lo, out=hi)                 # hi = g - (g - v)
    np.subtract(v, hi, out=lo)                  # lo = v - hi


def _tanh_core(x: np.ndarray) -> np.ndarray:
    """gt_tanh for 2^-55 <= |x| < 22: steps 1-5 of tanh's docstring."""
    a = 2.0 * np.abs(x)
    # 1.-2. expm1's reduction (k >= 0 here) and expm1's e
    k, hi, lo = _reduce(a, 0.5)
    r = hi - lo
    c = (hi - r) - lo
    hxs, e = _expm1_poly(r)
    # 3. expm1(r + c) = mh + ml
    p = r * e
    rh, rl = _split(r)
    hxs_lo = ((0.5 * (rh * rh) - hxs) + rh * rl) + 0.5 * (rl * rl)
    s = hxs - p
    s_lo = (hxs - s) - p
    mh = r + s
    ml = (s - (mh - r)) + ((s_lo + hxs_lo) + (c + r * c))
    # 4. expm1(a) = (2^k - 1) + 2^k*(mh + ml) = th + tl
    p2 = ((k.astype(np.int64) + 0x3FF).view(_U64) << _U64(52)).view(_F64)
    big = p2 - 1.0
    b = p2 * mh
    th = big + b
    tl = (b - (th - big)) + p2 * ml
    # 5. tanh = t/(t + 2), t + 2 = dh + dl, with the exact remainder of q
    dh = th + 2.0
    bv = dh - th
    dl = ((th - (dh - bv)) + (2.0 - bv)) + tl
    q = th / dh
    qh, ql = _split(q)
    ah, al = _split(dh)
    prod = q * dh
    prod_lo = (((qh * ah - prod) + qh * al) + ql * ah) + ql * al
    rem = (((th - prod) - prod_lo) + tl) - q * dl
    z = q + rem / dh
    return np.where(x < 0.0, -z, z)


def _tanh_block(x, out, bufs):
    (a, k, h, lo, r, c, s, w, f, g, m), _, _ = bufs
    np.abs(x, out=a)
    flagged = not (a.min() >= _TANH_TINY and a.max() < _TANH_BIG)
    np.multiply(a, 2.0, out=a)                   # a = 2|x|
    # 1. k = trunc(INVLN2*a + 0.5) (k), hi = a - k*LN2_HI (h), lo = k*LN2_LO,
    #    r = hi - lo, c = (hi - r) - lo
    _reduce_block(a, _K_HALF, k, h, lo, r, c)
    # 2. hxs = r*(0.5*r) (s), e = hxs*((r1 - u)/(6 - r*u)) (w); f is scratch
    _expm1_poly_block(r, f, s, w)
    # 3. p = r*e (w); (rh, rl) = split(r) (g, f)
    np.multiply(r, w, out=w)
    _split_block(r, g, f)
    # hxs_lo = ((0.5*(rh*rh) - hxs) + rh*rl) + 0.5*(rl*rl)   (h)
    np.multiply(g, g, out=h)
    np.multiply(h, 0.5, out=h)
    np.subtract(h, s, out=h)
    np.multiply(g, f, out=g)
    np.add(h, g, out=h)
    np.multiply(f, f, out=f)
    np.multiply(f, 0.5, out=f)
    np.add(h, f, out=h)
    # s = hxs - p (g), s_lo = (hxs - s) - p, low = (s_lo + hxs_lo) + (c + r*c) (s)
    np.subtract(s, w, out=g)
    np.subtract(s, g, out=s)
    np.subtract(s, w, out=s)
    np.add(s, h, out=s)
    np.multiply(r, c, out=h)
    np.add(c, h, out=h)
    np.add(s, h, out=s)
    # mh = r + s (m), ml = (s - (mh - r)) + low (r)
    np.add(r, g, out=m)
    np.subtract(m, r, out=r)
    np.subtract(g, r, out=r)
    np.add(r, s, out=r)
    # 4. 2^k (k): the bits of k + 1.5*2^52 are 0x4338000000000000 + k;
    #    shifted left by 52 only k<<52 remains, plus 0x3ff<<52 = 2^k.
    np.add(k, MAGIC, out=k)
    kb = k.view(_U64)
    np.left_shift(kb, _U64(52), out=kb)
    np.add(kb, _U64(0x3FF << 52), out=kb)
    # big = 2^k - 1 (a), b = 2^k*mh (m), th = big + b (h),
    # tl = (b - (th - big)) + 2^k*ml (a)
    np.subtract(k, 1.0, out=a)
    np.multiply(k, m, out=m)
    np.add(a, m, out=h)
    np.subtract(h, a, out=a)
    np.subtract(m, a, out=a)
    np.multiply(k, r, out=r)
    np.add(a, r, out=a)
    # 5. dh = th + 2 (lo), bv = dh - th (c), dl = ((th - (dh - bv)) + (2 - bv)) + tl (s)
    np.add(h, 2.0, out=lo)
    np.subtract(lo, h, out=c)
    np.subtract(lo, c, out=s)
    np.subtract(h, s, out=s)
    np.subtract(2.0, c, out=c)
    np.add(s, c, out=s)
    np.add(s, a, out=s)
    # q = th/dh (w); (qh, ql) = split(q) (g, f); (ah, al) = split(dh) (c, k)
    np.divide(h, lo, out=w)
    _split_block(w, g, f)
    _split_block(lo, c, k)
    # prod = q*dh (r), prod_lo = (((qh*ah - prod) + qh*al) + ql*ah) + ql*al (m)
    np.multiply(w, lo, out=r)
    np.multiply(g, c, out=m)
    np.subtract(m, r, out=m)
    np.multiply(g, k, out=g)
    np.add(m, g, out=m)
    np.multiply(f, c, out=c)
    np.add(m, c, out=m)
    np.multiply(f, k, out=f)
    np.add(m, f, out=m)
    # rem = (((th - prod) - prod_lo) + tl) - q*dl (h);  z = q + rem/dh
    np.subtract(h, r, out=h)
    np.subtract(h, m, out=h)
    np.add(h, a, out=h)
    np.multiply(w, s, out=s)
    np.subtract(h, s, out=h)
    np.divide(h, lo, out=h)
    np.add(w, h, out=out)
    np.copysign(out, x, out=out)                 # z > 0: the sign of x
    return _patch(x, out, flagged, ~((np.abs(x) >= _TANH_TINY) & (np.abs(x) < _TANH_BIG))
                  if flagged else None, _tanh_special)


def tanh(x) -> np.ndarray:
    """Hyperbolic tangent as t/(t + 2), t = expm1(2|x|) carried as a
    double-double; C twin ``gt_tanh``.  Error: measured max 0.596 ulp of the
    exact value (1.4e8 points against a 64-bit-significand long double
    reference, the worst ones confirmed with 50-digit mpmath; worst near
    |x| = 0.177, where |r| below is largest), so at most one double from
    the correctly rounded result.  fdlibm's ``s_tanh.c`` (-t/(t+2) with
    t = expm1(-2|x|), and 1 - 2/(t+2) for |x| >= 1) reaches 2.16 ulp near
    |x| = 0.23: there one ulp of expm1's error (< 1 ulp of t) becomes about
    1.5 ulp of the quotient, and t + 2 and the division add two roundings.
    Here every rounding after fdlibm's expm1 polynomial is captured exactly
    (Fast2Sum, Knuth's TwoSum, Dekker's two-product with Veltkamp's split;
    no FMA), so what remains is the final rounding (0.5 ulp) plus about 0.1
    ulp from the polynomial term e.  Not bit-identical to fdlibm/StrictMath.

    Method (ix = high word of |x|)::

      ix >= 0x7ff00000:  NaN -> NaN (0x7ff8000000000000), +-inf -> +-1
      |x| >= 22    (ix >= 0x40360000): z = 1   (tanh(22) = 1 - 1.6e-19)
      |x| < 2^-55  (ix < 0x3c800000):  x       (tanh(x) = x*(1 - x^2/3 + ...) rounds to x)
      otherwise, with a = 2*|x| (exact), 2^-54 <= a < 44:
      1. fdlibm expm1's reduction, k >= 0 (no k = 0 or k = 1 special case):
             k  = (int)(INVLN2*a + 0.5)   (C truncation; 0 <= k <= 63)
             dk = (double)k
             hi = a - dk*LN2_HI           (exact)
             lo = dk*LN2_LO
             r  = hi - lo;  c = (hi - r) - lo
      2. fdlibm expm1's polynomial (see expm1, step 2):
             hfx = 0.5*r;  hxs = r*hfx
             r1  = 1 + hxs*(Q1 + hxs*(Q2 + hxs*(Q3 + hxs*(Q4 + hxs*Q5))))
             u   = 3 - r1*hfx
             e   = hxs*((r1 - u)/(6 - r*u))
         so that expm1(r) ~ r + (hxs - r*e).
      3. expm1(r + c) = mh + ml:
             p      = r*e
             (rh, rl) = split(r)
             hxs_lo = ((0.5*(rh*rh) - hxs) + rh*rl) + 0.5*(rl*rl)   (= r*hfx - hxs, exact)
             s      = hxs - p;  s_lo = (hxs - s) - p                (Fast2Sum, exact)
             mh     = r + s
             ml     = (s - (mh - r)) + ((s_lo + hxs_lo) + (c + r*c))
      4. expm1(a) = 2^k*(1 + mh + ml) - 1 = th + tl:
             p2  = 2^k                     (from the bits: (0x3ff + k) << 52)
             big = p2 - 1                  (exact for k <= 53)
             b   = p2*mh                   (exact)
             th  = big + b;  tl = (b - (th - big)) + p2*ml           (Fast2Sum)
      5. z = (th + tl)/((th + tl) + 2):
             dh  = th + 2;  bv = dh - th
             dl  = ((th - (dh - bv)) + (2 - bv)) + tl                 (TwoSum)
             q   = th/dh
             (qh, ql) = split(q);  (ah, al) = split(dh)
             prod    = q*dh
             prod_lo = (((qh*ah - prod) + qh*al) + ql*ah) + ql*al   (= q*dh - prod, exact)
             rem = (((th - prod) - prod_lo) + tl) - q*dl
             z   = q + rem/dh
      result: x >= 0 ? z : -z          (so tanh(-0.0) = -0.0)

      split(v) = (vh, vl): g = SPLIT*v;  vh = g - (g - v);  vl = v - vh   (Veltkamp, exact)

    Every operation is one rounded binary64 operation, innermost
    parenthesis first, left to right; 2*|x|, 0.5*(...), p2*(...) and -z are
    exact.  Why each step is exact or harmless: |hxs| >= |p| (|e| ~ r^2/6)
    and |r| >= |s| make the Fast2Sums valid; big = 2^k - 1 >= 2^(k-1) >=
    |b| for k >= 1, and big = 0 for k = 0; th - prod is exact (Sterbenz:
    prod ~ th); for k >= 54 big rounds to 2^k, an absolute error of 1 in
    t ~ 2^k that moves t/(t+2) by ~2/t^2, far below its ulp.

    Constants (besides those of expm1)::

      LN2_HI, LN2_LO, INVLN2, Q1..Q5   as in expm1
      SPLIT        0x1.0000002p+27         0x41A0000002000000  134217729 = 2^27 + 1

    Vectorised kernel: domain 2^-55 <= |x| < 22, the formulas above for
    every lane; 2^k is built as in exp's kernel (bits of dk + 1.5*2^52
    shifted left by 52, plus 0x3ff<<52); z > 0, so copysign(z, x) is the
    sign restoration.
    """
    return _run(x, _tanh_block, _tanh_ref)
