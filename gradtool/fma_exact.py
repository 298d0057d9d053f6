"""IEEE 754 fusedMultiplyAdd, exactly, in separately rounded numpy operations.

:func:`fma` is the spec of every inner product in :mod:`gradtool.numerics` (the matmul
chain ``acc = fma(a[i,k], b[k,j], acc)``) and the numpy reference's way of running it
without a C compiler.  It is an exact operation, not an order: like :mod:`gradtool.fdlibm`
for the transcendental functions, it lives beside the orders and
:mod:`gradtool.numerics` re-exports it (``numerics.fma``).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["fma"]

_SPLITTER = 134217729.0       # 2^27 + 1: Veltkamp's constant for 53-bit doubles
_C_DOMINATES = 60             # ec - ep above this: |a*b| < ulp(c)/2^8, the result is c
_C_NEGLIGIBLE = -120          # ec - ep below this: c only decides a rounding direction
_STICKY = 2.0 ** -200         # ... and stands in, scaled, as copysign(2^-200, c)
_TINY = 2.0 ** -1022          # the smallest normal double


def _two_sum(x, y):
    """Knuth's TwoSum: s = RN(x + y) and the exact error e, x + y == s + e (no overflow)."""
    s = x + y
    yy = s - x
    return s, (x - (s - yy)) + (y - yy)


def _split(x):
    """Veltkamp's split: x == hi + lo, each of at most 26 significant bits (|x| < 2^995)."""
    t = _SPLITTER * x
    hi = t - (t - x)
    return hi, x - hi


def _two_product(x, y):
    """Dekker's TwoProduct: p = RN(x * y) and the exact error, x * y == p + e (when the
    error is representable: here |x|, |y| are in [0.5, 1))."""
    p = x * y
    xh, xl = _split(x)
    yh, yl = _split(y)
    return p, ((xh * yh - p) + xh * yl + xl * yh) + xl * yl


def _add_round_to_odd(x, y):
    """RO(x + y), rounding to odd (Boldo and Melquiond): the exact sum when representable,
    else whichever of its two neighbouring doubles has an odd last significand bit."""
    s, e = _two_sum(x, y)
    even = (s.view(np.int64) & 1) == 0
    move = even & (e != 0)
    if np.any(move):
        s = np.where(move, np.nextafter(s, np.copysign(np.inf, e)), s)
    return s


def _fma_subnormal(a: float, b: float, c: float) -> float:
    """fma(a, b, c) for finite a, b, c whose exact a*b + c is below 2^-1022 in magnitude:
    that value rounded to a multiple of 2^-1074, ties to even, in Python integers."""
    na, da = a.as_integer_ratio()
    nb, db = b.as_integer_ratio()
    nc, dc = c.as_integer_ratio()
    num = (na * nb * dc + nc * da * db) << 1074
    den = da * db * dc
    q, r = divmod(num, den)                   # floor division, r >= 0
    if 2 * r > den or (2 * r == den and q & 1):
        q += 1
    if q == 0:
        return -0.0 if num < 0 else 0.0
    return math.ldexp(q, -1074)


def fma(a, b, c) -> np.ndarray:
    """IEEE 754 fusedMultiplyAdd: ``a*b + c`` rounded once (to nearest, ties to even),
    elementwise with numpy broadcasting; float64.  The spec of every inner product.

    Exact, without an fma instruction, in separately rounded numpy operations:

    * Special operands.  A zero, infinite or NaN ``a`` or ``b``, or a NaN ``c``: ``a*b``
      is exact (+-0, +-inf or NaN), so ``a*b + c`` in two operations is the fma.  An
      infinite ``c`` with finite ``a*b``: ``c``.  A zero ``c`` with finite nonzero
      ``a``, ``b``: ``a*b`` rounded once, underflow and overflow included (an exact
      product never meets c, and a product rounded to zero keeps its sign, as IEEE 754
      says for an fma that rounds to zero).
    * Otherwise scale: ``a = ma 2^ea``, ``b = mb 2^eb`` with ma, mb in [0.5, 1)
      (``frexp``, exact), ep = ea + eb, and c becomes ``cs = c 2^-ep`` (exact).  If c's
      exponent exceeds ep by more than 60, |a*b| is below a 2^-8 of c's last place and
      the result is c.  If it is more than 120 below, c only decides the direction of a
      rounding of ma*mb (a multiple of 2^-106, whose rounding boundaries are multiples
      of 2^-106 too): it is replaced by ``copysign(2^-200, c)``, which decides it alike.
      Every nonzero value below is then within [2^-200, 2^62]: no overflow, no underflow.
    * Boldo and Melquiond's emulation (IEEE Trans. Computers 57(4), 2008, "Emulation of
      FMA and correctly rounded sums: proved algorithms using rounding to odd"):
      ``(uh, ul) = TwoProduct(ma, mb)`` (Dekker, with Veltkamp's split: exact),
      ``(th, tl) = TwoSum(cs, uh)`` (Knuth: exact), ``v = RO(tl + ul)`` (round to odd:
      TwoSum, then one step to the odd neighbour when inexact and even),
      ``z = RN(th + v)``.  z is ma*mb + cs correctly rounded to 53 bits.
    * Scale back: ``ldexp(z, ep)`` is exact for a normal result, and it overflows to
      +-inf exactly when the correctly rounded result does.  A result below 2^-1022
      (subnormal: fewer than 53 bits, rounded once at 2^-1074) is computed instead,
      element by element, in Python integers from the exact rational a*b + c.  An exact
      zero a*b + c of nonzero terms is +0.0 (round to nearest).

    Tests (tests/test_numerics.py) compare it with the machine's fma instruction on
    10^7 random and adversarial triples, bit for bit.  It is about 40 numpy passes, the
    numpy reference's (no C compiler) only cost of the FMA contract.
    """
    a, b, c = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (a, b, c)))
    shape = a.shape
    a, b, c = (np.ravel(x) for x in (a, b, c))
    with np.errstate(all="ignore"):
        plain = a * b + c                     # the special operands' result
        out = plain
        finite_ab = np.isfinite(a) & np.isfinite(b) & (a != 0) & (b != 0)
        general = finite_ab & np.isfinite(c) & (c != 0)
        if np.any(finite_ab & ~general):
            out = np.where(finite_ab & np.isinf(c), c, out)
            out = np.where(finite_ab & (c == 0), a * b, out)
        if np.any(general):
            idx = None if general.all() else np.flatnonzero(general)
            ga, gb, gc = (a, b, c) if idx is None else (a[idx], b[idx], c[idx])
            z, tiny = _fma_general(ga, gb, gc)
            if np.any(tiny):
                for t in np.flatnonzero(tiny):
                    z[t] = _fma_subnormal(float(ga[t]), float(gb[t]), float(gc[t]))
            if idx is None:
                out = z
            else:
                out = np.array(out, copy=True)
                out[idx] = z
    return out.reshape(shape)


def _fma_general(a, b, c):
    """fma for finite nonzero a, b, c (:func:`fma`'s scaled Boldo-Melquiond path) and
    where the caller must redo it: a nonzero result at or below 2^-1022, whose scaling
    back may have rounded a second time."""
    ma, ea = np.frexp(a)
    mb, eb = np.frexp(b)
    _, ec = np.frexp(c)
    ep = ea + eb
    d = ec - ep
    cs = np.ldexp(c, np.clip(-ep, -2000, 2000))
    cs = np.where(d < _C_NEGLIGIBLE, np.copysign(_STICKY, c), cs)
    uh, ul = _two_product(ma, mb)
    th, tl = _two_sum(cs, uh)
    zs = th + _add_round_to_odd(tl, ul)
    z = np.ldexp(zs, ep)
    dominated = d > _C_DOMINATES
    return np.where(dominated, c, z), (np.abs(z) <= _TINY) & (zs != 0) & ~dominated
