"""Constants and arithmetic building blocks shared by the fdlibm kernels.

* the constants that more than one function uses: fdlibm's ln2 split and
  1/ln2, exp's overflow/underflow thresholds (expm1 tests O_THRESHOLD too),
  the canonical NaN, inf, the magic 1.5*2^52 and the sign/abs bit masks;
* exact bit manipulation: ``_hiword_bound`` (fdlibm's high-word tests as
  doubles), ``_add_exponent`` and ``_add_exponent_block`` (y * 2^k through
  the exponent field), ``_half_with_sign_of`` (fdlibm's halF[sign]);
* the kernels' operands and helpers: ``_c`` (read-only 0-d operands) and the
  ``_K_*`` ones used by several kernels, ``_poly_block`` (Horner, one ufunc
  call per operation), ``_sparse_nonzero`` (flatnonzero of a sparse mask);
* fdlibm's general ln2 argument reduction, shared by exp, expm1 and tanh:
  ``_reduce`` for the reference paths and ``_reduce_block`` for the kernels
  (C twin ``gtm_reduce`` in gradtool/csrc/gt_math.h).

The rules every operation follows are in the package docstring
(gradtool/fdlibm/__init__.py).
"""

from __future__ import annotations

import numpy as np

_hex = float.fromhex
_U64 = np.uint64
_F64 = np.float64

# ---------------------------------------------------------------------------
# constants shared by several functions (hex = exact value, decimal = fdlibm's)
# ---------------------------------------------------------------------------
LN2_HI = _hex("0x1.62e42fee00000p-1")   # 6.93147180369123816490e-01  0x3FE62E42FEE00000
LN2_LO = _hex("0x1.a39ef35793c76p-33")  # 1.90821492927058770002e-10  0x3DEA39EF35793C76
INVLN2 = _hex("0x1.71547652b82fep+0")   # 1.44269504088896338700e+00  0x3FF71547652B82FE
O_THRESHOLD = _hex("0x1.62e42fefa39efp+9")  # 7.09782712893383973096e+02  0x40862E42FEFA39EF
U_THRESHOLD = _hex("-0x1.74910d52d3051p+9")  # -7.45133219101941108420e+02 0xC0874910D52D3051

NAN = _hex("nan")  # bits 0x7ff8000000000000 (checked by the tests)
INF = _hex("inf")

# 1.5*2^52: for an integer-valued |t| < 2^51, the bits of t + MAGIC are
# 0x4338000000000000 + t (two's complement): exact, no rounding happens.
MAGIC = _hex("0x1.8p52")
_MAGIC_BITS = 0x4338000000000000
_SIGN = 0x8000000000000000
_ABS = 0x7FFFFFFFFFFFFFFF


def _hiword_bound(hw: int) -> float:
    """The double whose high word is ``hw`` and low word 0: fdlibm's test
    ``(high word of |x|) >= hw`` is ``|x| >= _hiword_bound(hw)`` for non-NaN x."""
    return np.array([hw << 32], dtype=_U64).view(_F64)[0].item()


def _add_exponent(y: np.ndarray, k: np.ndarray) -> np.ndarray:
    """y * 2^k by adding k (an integer-valued float64 array) to the exponent
    field, fdlibm's ``__HI(y) += k<<20``.  Exact; callers guarantee that the
    result stays normal (lanes where it would not are discarded)."""
    kb = k.astype(np.int64).view(_U64) << _U64(52)
    return (y.view(_U64) + kb).view(_F64)


def _c(v, dtype=_F64):
    """A read-only 0-d array for a kernel's scalar operand: numpy's call
    overhead is ~0.2 us lower than with a Python or numpy scalar (no scalar
    conversion); with ~40 calls per block that is 2-4% of a kernel."""
    a = np.array(v, dtype=dtype)
    a.flags.writeable = False
    return a


_K_ONE, _K_TWO, _K_MAGIC = _c(1.0), _c(2.0), _c(MAGIC)
_K_INVLN2, _K_LN2_HI, _K_LN2_LO = _c(INVLN2), _c(LN2_HI), _c(LN2_LO)
_K_52 = _c(52, _U64)


def _sparse_nonzero(mask, words):
    """np.flatnonzero(mask) for a sparse mask, such as log's hfsq band (~4%
    of random lanes).  Below 10% density numpy's nonzero takes a branchy
    path, one mispredicted branch per hit (~0.65 ns per lane of a 4% mask
    here); this scans the mask as 8-lane words instead (~28% of them
    nonzero) and then the bytes of those words (~14%), both dense enough for
    numpy's branch-free loop (~0.45 ns per lane in all).  ``words``: a bool
    buffer of at least mask.size // 8 elements."""
    if mask.size % 8:
        return np.flatnonzero(mask)
    w = mask.view(_U64)
    nz = words[:w.size]
    np.not_equal(w, 0, out=nz)
    iw = np.flatnonzero(nz)                     # words holding a hit
    j = np.flatnonzero(w[iw].view(np.bool_))    # hits within those words
    i = iw[j >> 3]
    i <<= 3
    i += j & 7
    return i


_K_SIGN, _K_HALF_BITS = _c(_SIGN, _U64), _c(0x3FE0000000000000, _U64)


def _half_with_sign_of(x, out):
    """out = copysign(0.5, x) (fdlibm's halF[sign]) from the bits: cheaper
    than np.copysign, which is not vectorised in every numpy build."""
    ob = out.view(_U64)
    np.bitwise_and(x.view(_U64), _K_SIGN, out=ob)
    np.bitwise_or(ob, _K_HALF_BITS, out=ob)


def _horner(z, coefs):
    """c0 + z*(c1 + z*(... + z*cn)) for coefs = (c0, ..., cn), n >= 1, on arrays or
    scalars: innermost first, one rounding per operation, as fdlibm's nested expressions
    (erf, sin, cos, log1p; C twin ``gtm_horner``)."""
    acc = z * coefs[-1]
    for c in coefs[-2:0:-1]:
        acc = z * (c + acc)
    return coefs[0] + acc


def _poly_block(z, coefs, out) -> None:
    """out = c0 + z*(c1 + z*(... + z*cn)) for coefs = (c0, ..., cn), n >= 1:
    Horner, innermost first, one ufunc call per operation (z*cn, + c(n-1),
    *z, ..., *z, + c0), as the C's one expression evaluates it."""
    np.multiply(z, coefs[-1], out=out)
    for i in range(len(coefs) - 2, 0, -1):
        np.add(out, coefs[i], out=out)
        np.multiply(out, z, out=out)
    np.add(out, coefs[0], out=out)


# ---------------------------------------------------------------------------
# the ln2 argument reduction, shared by exp, expm1 and tanh (fdlibm writes it
# out in e_exp.c and s_expm1.c alike)
# ---------------------------------------------------------------------------
def _reduce(x, half):
    """fdlibm's general reduction x = t*ln2 + (hi - lo), for the reference
    path (C twin ``gtm_reduce``); ``half`` is halF[sign] = +-0.5 by the sign
    of x (scalar or array):
        t  = (double)(int)(INVLN2*x + half)   (np.trunc is C's cast)
        hi = x - t*LN2_HI                     (exact: LN2_HI ends in 21 zero bits)
        lo = t*LN2_LO
    Returns (t, hi, lo)."""
    t = np.trunc(INVLN2 * x + half)
    return t, x - t * LN2_HI, t * LN2_LO


def _reduce_block(x, half, t, hi, lo, r, c=None):
    """The kernels' ``_reduce``, one ufunc call per operation, into the
    buffers t, hi, lo and r = hi - lo; with ``c``, also expm1's correction
    c = (hi - r) - lo.  ``half`` may be the ``hi`` buffer itself (read
    before hi is written)."""
    np.multiply(x, _K_INVLN2, out=t)
    np.add(t, half, out=t)
    np.trunc(t, out=t)
    np.multiply(t, _K_LN2_HI, out=hi)
    np.subtract(x, hi, out=hi)                  # hi = x - t*LN2_HI (exact)
    np.multiply(t, _K_LN2_LO, out=lo)           # lo = t*LN2_LO
    np.subtract(hi, lo, out=r)                  # r = hi - lo
    if c is not None:
        np.subtract(hi, r, out=c)
        np.subtract(c, lo, out=c)               # c = (hi - r) - lo


def _add_exponent_block(y, tm) -> None:
    """y *= 2^k in place (exponent field), for a kernel's t = (double)k held
    as tm = t + 1.5*2^52: the bits of tm are 0x4338000000000000 + k; shifted
    left by 52 the constant vanishes (mod 2^64) and k<<52 remains.  tm is
    overwritten."""
    tb = tm.view(_U64)
    np.left_shift(tb, _K_52, out=tb)
    yb = y.view(_U64)
    np.add(yb, tb, out=yb)
