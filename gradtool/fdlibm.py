"""exp, expm1, log and tanh without libm: Sun's fdlibm 5.3 (and a compensated
tanh on top of its expm1) in numpy.

Why this module exists
----------------------
``np.exp`` and friends call the platform's vector libm, whose last bit differs
between numpy builds, CPUs (SIMD width) and operating systems.  gradtool
promises the same bits everywhere, so its transcendentals are computed from
IEEE-754 basic operations only, in an order written down here and mirrored
operation for operation by the C/CUDA header ``gradtool/csrc/gt_math.h``.

exp, expm1 and log are fdlibm 5.3's ``e_exp.c``, ``s_expm1.c`` and
``e_log.c`` (Copyright (C) 1993-2004 Sun Microsystems, Inc.  Permission to
use, copy, modify, and distribute this software is freely granted, provided
that this notice is preserved.).  For every non-NaN input their results are
bit-identical to fdlibm, hence to Java's ``StrictMath``, which is specified to
return fdlibm's results.  tanh is not fdlibm's ``s_tanh.c`` (up to 2.16 ulp
off): it is t/(t + 2) with t = expm1(2|x|) as a double-double, built from
fdlibm expm1's reduction and polynomial and compensated arithmetic (see
``tanh``).

Rules
-----
* Only correctly rounded binary64 ``+ - * /`` (one ufunc call each; numpy's
  elementwise ufuncs never fuse a multiply-add), comparisons, ``np.trunc``
  (exact), and exact bit manipulation through ``.view(np.uint64)``: adding k
  to the exponent field multiplies by 2^k.  Never ``np.exp``/``np.log``/...,
  never ``math.*``.  Rounding to an integer is fdlibm's
  ``(int)(invln2*x + (x<0 ? -0.5 : 0.5))``: C's cast truncates, which is
  ``np.trunc`` of the same double here.
* Every NaN result is the canonical quiet NaN ``0x7ff8000000000000`` (fdlibm
  returns ``x+x`` or ``(x-x)/0``, whose payload and sign are processor
  specific); this is the only deliberate difference from fdlibm's exp,
  expm1 and log.
* All four functions take any array-like, compute in float64 and return a
  new float64 ndarray of the same shape (0-d for a scalar).

Accuracy (fdlibm's error analysis, checked against 50-digit mpmath in
tests/test_fdlibm.py and on 10^6 further points): exp, expm1 and log are
within 1 ulp of the exact result (measured max 0.87 ulp), so at most one
double away from the correctly rounded result.  tanh: measured max 0.596
ulp of the exact value (1.4e8 points), also at most one double away.

How the vectorisation keeps the bits
------------------------------------
Each function exists twice in numpy, both tested against the C:

* ``_<name>_ref`` is the literal transcription of the C function: every
  fdlibm branch is a boolean mask (``_<name>_special`` holds the early
  returns, ``_<name>_core`` the rest; ``_masked`` runs the one, then the
  other).  It is slow (~100 ns per element) and only sees the rare lanes.
* the kernel ``_<name>_block`` evaluates the main branch over blocks of
  65536 elements in preallocated buffers, one ufunc call per operation.
  Where fdlibm has a separate formula for a sub-case that provably yields the
  very same double as the general formula (exp's k == 0 and |k| == 1 cases,
  for instance), the kernel uses the general one; each such argument is
  written next to the code.  Lanes outside the kernel's domain are detected
  with a few reductions/compares; early-return cases (NaN, inf, overflow,
  tiny arguments) are settled on the spot and the few remaining lanes are
  recomputed by ``_<name>_ref``.

The steps that exp, expm1 and tanh share, fdlibm's general ln2 argument
reduction and expm1's polynomial, are written once for each path
(``_reduce``, ``_expm1_poly``; the kernels' ``_reduce_block``,
``_expm1_poly_block``), as in the C (``gtm_reduce``, ``gtm_expm1_poly``).

Nothing depends on the numpy build, the CPU's SIMD width or the libm: each
ufunc computes each element with one correctly rounded IEEE operation.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["exp", "expm1", "log", "tanh"]

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
TWOM1000 = _hex("0x1p-1000")            # 9.33263618503218878990e-302 0x0170000000000000
TWO54 = _hex("0x1p54")                  # 1.80143985094819840000e+16  0x4350000000000000

# exp's polynomial (e_exp.c)
P1 = _hex("0x1.555555555553ep-3")   # 1.66666666666666019037e-01  0x3FC555555555553E
P2 = _hex("-0x1.6c16c16bebd93p-9")  # -2.77777777770155933842e-03 0xBF66C16C16BEBD93
P3 = _hex("0x1.1566aaf25de2cp-14")  # 6.61375632143793436117e-05  0x3F11566AAF25DE2C
P4 = _hex("-0x1.bbd41c5d26bf1p-20")  # -1.65339022054652515390e-06 0xBEBBBD41C5D26BF1
P5 = _hex("0x1.6376972bea4d0p-25")  # 4.13813679705723846039e-08  0x3E66376972BEA4D0

# expm1's polynomial (s_expm1.c), coefficients pre-scaled by 2^i
Q1 = _hex("-0x1.11111111110f4p-5")  # -3.33333333333331316428e-02 0xBFA11111111110F4
Q2 = _hex("0x1.a01a019fe5585p-10")  # 1.58730158725481460165e-03  0x3F5A01A019FE5585
Q3 = _hex("-0x1.4ce199eaadbb7p-14")  # -7.93650757867487942473e-05 0xBF14CE199EAADBB7
Q4 = _hex("0x1.0cfca86e65239p-18")  # 4.00821782732936239552e-06  0x3ED0CFCA86E65239
Q5 = _hex("-0x1.afdb76e09c32dp-23")  # -2.01099218183624371326e-07 0xBE8AFDB76E09C32D

# log's polynomial (e_log.c)
LG1 = _hex("0x1.5555555555593p-1")  # 6.666666666666735130e-01  0x3FE5555555555593
LG2 = _hex("0x1.999999997fa04p-2")  # 3.999999999940941908e-01  0x3FD999999997FA04
LG3 = _hex("0x1.2492494229359p-2")  # 2.857142874366239149e-01  0x3FD2492494229359
LG4 = _hex("0x1.c71c51d8e78afp-3")  # 2.222219843214978396e-01  0x3FCC71C51D8E78AF
LG5 = _hex("0x1.7466496cb03dep-3")  # 1.818357216161805012e-01  0x3FC7466496CB03DE
LG6 = _hex("0x1.39a09d078c69fp-3")  # 1.531383769920937332e-01  0x3FC39A09D078C69F
LG7 = _hex("0x1.2f112df3e5244p-3")  # 1.479819860511658591e-01  0x3FC2F112DF3E5244
THIRD = _hex("0x1.5555555555555p-2")  # fdlibm's 0.33333333333333333  0x3FD5555555555555

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


# ---------------------------------------------------------------------------
# blocked driver
# ---------------------------------------------------------------------------
# numpy evaluates one operation over a whole array at a time, so every
# operation of a kernel is one pass over a block held in the caches.  Each
# block also costs ~25 us of fixed call overhead (~45 ufunc calls), hence
# large blocks; measured here, 2^16 elements is the fastest: from ~72k on,
# the ~9 live rows of a block no longer fit in the caches and passes slow
# down abruptly.
_BLOCK = 1 << 16


def _aligned_empty(shape, dtype) -> np.ndarray:
    """np.empty(shape, dtype) starting on a 64-byte boundary.  numpy's
    allocator only guarantees 16 bytes; scratch rows at 16 mod 32 bytes made
    every kernel ~8% slower (measured: log 7.9 instead of 7.3 ns per
    element, tanh 21.4 instead of 19.8), SIMD loads then straddling cache
    lines, so timings changed with whatever the allocator handed out."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class _Scratch:
    """Block buffers: 11 float64 rows (kernels view some as uint64/int64),
    4 bool rows, and the memory of float rows 7-10 as one (n, 4) array
    (for expm1's table rows; a kernel uses either those rows or this).
    ``views(n)`` gives the first n elements (rows) of each."""

    def __init__(self, n: int):
        self.n = n
        m = -(-n // 64) * 64                    # every row starts on a cache line
        f = _aligned_empty((11, m), _F64)
        self.full = ([a[:n] for a in f], [a[:n] for a in _aligned_empty((4, m), np.bool_)],
                     f[7:].reshape(-1)[:4 * n].reshape(n, 4))

    def views(self, n: int):
        if n == self.n:
            return self.full
        rows, bools, quad = self.full
        return ([a[:n] for a in rows], [a[:n] for a in bools],
                quad.reshape(-1)[:4 * n].reshape(n, 4))


# The scratch (~6 MB for a full block) is kept per thread between calls:
# allocating it afresh costs page faults, up to ~4 ns per element of a 10^6
# call depending on the allocator's state (measured: log took 8 to 11 ns per
# element with fresh scratch, a steady ~7.5 with reused scratch).
_tls = threading.local()


def _take_scratch(n: int) -> _Scratch:
    """This thread's scratch if it is large enough, else a new one; while a
    call uses it the slot is empty, so a nested call cannot share it."""
    s = getattr(_tls, "scratch", None)
    _tls.scratch = None
    return s if s is not None and s.n >= n else _Scratch(n)


def _return_scratch(s: _Scratch) -> None:
    kept = getattr(_tls, "scratch", None)
    if kept is None or kept.n < s.n:
        _tls.scratch = s


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


def _run(x, kernel, ref) -> np.ndarray:
    """Apply ``kernel`` block by block; lanes it reports are redone by ``ref``
    in one call at the end (the reference path is slow per call, not per lane)."""
    x = np.asarray(x, dtype=_F64)
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.shape, _F64)
    n = flat.size
    if n:
        scratch = _take_scratch(min(n, _BLOCK))
        redo = []
        try:
            with np.errstate(all="ignore"):  # kernels compute garbage in flagged lanes
                for start in range(0, n, _BLOCK):
                    stop = min(start + _BLOCK, n)
                    idx = kernel(flat[start:stop], out[start:stop], scratch.views(stop - start))
                    if idx is not None and idx.size:
                        redo.append(idx + start)
        finally:
            _return_scratch(scratch)
        if redo:
            idx = np.concatenate(redo)
            out[idx] = ref(flat[idx])
    return out.reshape(x.shape)


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


def _poly_block(z, coefs, out) -> None:
    """out = c0 + z*(c1 + z*(... + z*cn)) for coefs = (c0, ..., cn), n >= 1:
    Horner, innermost first, one ufunc call per operation (z*cn, + c(n-1),
    *z, ..., *z, + c0), as the C's one expression evaluates it."""
    np.multiply(z, coefs[-1], out=out)
    for i in range(len(coefs) - 2, 0, -1):
        np.add(out, coefs[i], out=out)
        np.multiply(out, z, out=out)
    np.add(out, coefs[0], out=out)


def _patch(x, out, flagged, bad, special):
    """Settle the kernel's flagged lanes: early-return cases (specials, tiny,
    huge) are written here; lanes that need fdlibm's full computation are
    returned (block-relative indices) for the driver to redo with the ref."""
    if not flagged:
        return None
    i = np.flatnonzero(bad)
    if i.size == 0:
        return None
    y, rest = special(x[i])
    out[i] = y
    return i[rest]


def _masked(x, special, core) -> np.ndarray:
    """The shape of every ``_<name>_ref``: fdlibm's early returns first
    (``special(x)`` gives (y, rest), y final where rest is False), then
    ``core`` on the remaining lanes only, so it never sees a special value."""
    x = np.array(x, dtype=_F64).reshape(-1)
    with np.errstate(all="ignore"):
        y, rest = special(x)
        if rest.any():
            y[rest] = core(x[rest])
    return y


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


# ===========================================================================
# exp
# ===========================================================================
_EXP_BIG = _hiword_bound(0x40862E42)   # |x| >= this: overflow/underflow tests
_EXP_HALF_LN2 = 0x3FD62E42             # hx > this: |x| > 0.5*ln2, reduce
_EXP_3HALF_LN2 = 0x3FF0A2B2            # hx < this: |x| < 1.5*ln2, k = +-1
_EXP_TINY = 0x3E300000                 # hx < this: |x| < 2^-28

# The kernels of exp and expm1 skip the band W of |x| where fdlibm forces
# k = 0 (high word <= 0x3fd62e42) although trunc(invln2*|x| + 0.5) is
# already 1: from round(0.5*ln2) = 0x3FD62E42FEFA39EF, the first double with
# trunc(invln2*x + 0.5) = 1 (found by bisection; tested), to the end of high
# word 0x3fd62e42.  About 1.7e7 doubles, 1e-9 wide.
_W_LO = 0x3FD62E42FEFA39EF
_W_LEN = (0x3FD62E43 << 32) - _W_LO

# exp's kernel domain: |x| < 704 (|k| <= 1016, so 2^k*y stays normal), minus
# the band W, minus [2^-54, 2^-28): below 2^-28 fdlibm returns 1 + x, and
# below 2^-54 the kernel's formula provably returns 1.0 = round(1 + x) too
# (t = +-0, r = x, |(lo - q) - hi| <= 2^-54, and 1 - v rounds to 1.0 for
# |v| <= 2^-54, ties going to the even 1.0).
_EXP_TB_LO = _hex("0x1p-54")
_EXP_TB_HI = _hex("0x1p-28")
_EXP_KHI = 704.0
# the same bands as doubles: for |x| >= 0 (not NaN), bits(|x|) >= B is
# |x| >= the double with bits B, so float compares test them exactly
_W_LO_F, _W_HI_F = np.array([_W_LO, _W_LO + _W_LEN], dtype=_U64).view(_F64).tolist()
_K_W_LO, _K_W_HI = _c(_W_LO_F), _c(_W_HI_F)
_K_P = tuple(map(_c, (P1, P2, P3, P4, P5)))


def _exp_special(x: np.ndarray):
    """fdlibm's early returns of exp: (y, rest); y is final where rest is False."""
    hx = (x.view(_U64) >> _U64(32)) & _U64(0x7FFFFFFF)
    tiny = hx < _EXP_TINY                       # |x| < 2^-28: 1 + x
    over = x > O_THRESHOLD                      # includes +inf
    under = x < U_THRESHOLD                     # includes -inf
    nan = x != x
    y = np.where(tiny, 1.0 + x, np.where(over, INF, np.where(under, 0.0, NAN)))
    return y, ~(tiny | over | under | nan)


def _exp_ref(x: np.ndarray) -> np.ndarray:
    """Literal vectorised transcription of gt_exp: every branch is a mask."""
    return _masked(x, _exp_special, _exp_core)


def _exp_reduction(x: np.ndarray):
    """Step 1 of exp and of expm1 (e_exp.c and s_expm1.c branch alike):
    (red, k, hi, lo), red False where hx <= 0x3fd62e42 (k = 0, r = x; hi
    and lo are +0 there and unused)."""
    u = x.view(_U64)
    xsb = (u >> _U64(63)) != 0
    hx = (u >> _U64(32)) & _U64(0x7FFFFFFF)
    red = hx > _EXP_HALF_LN2                    # |x| > 0.5 ln2: reduce
    mid = red & (hx < _EXP_3HALF_LN2)           # and |x| < 1.5 ln2: k = +-1
    big = red & ~mid
    k = np.zeros_like(x)
    hi = np.zeros_like(x)
    lo = np.zeros_like(x)
    # |k| == 1: e_exp.c writes hi = x - (xsb ? -LN2_HI : LN2_HI), s_expm1.c
    # xsb ? x + LN2_HI : x - LN2_HI; the same double, as IEEE defines a - b
    # as a + (-b)
    hi[mid] = x[mid] - np.where(xsb[mid], -LN2_HI, LN2_HI)
    lo[mid] = np.where(xsb[mid], -LN2_LO, LN2_LO)
    k[mid] = np.where(xsb[mid], -1.0, 1.0)
    k[big], hi[big], lo[big] = _reduce(x[big], np.where(xsb[big], -0.5, 0.5))
    return red, k, hi, lo


def _exp_core(x: np.ndarray) -> np.ndarray:
    """gt_exp from the argument reduction on (finite, not tiny, no overflow)."""
    red, k, hi, lo = _exp_reduction(x)
    r = np.where(red, hi - lo, x)
    t = r * r
    c = r - t * (P1 + t * (P2 + t * (P3 + t * (P4 + t * P5))))
    y0 = 1.0 - ((r * c) / (c - 2.0) - r)                  # k == 0
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)           # k != 0
    normal = k >= -1021
    y = _add_exponent(y, np.where(normal, k, k + 1000.0))
    y = np.where(normal, y, y * TWOM1000)
    return np.where(red, y, y0)


def _exp_block(x, out, bufs):
    (v, h, lo, r, z, p, *_), (bm, bm2, bm3, *_), _ = bufs
    # which lanes may use the kernel: |x| < 704 (max() is NaN if a NaN is
    # there), and none in the band W or in [2^-54, 2^-28); the latter needs
    # a lane below 2^-28, which min() rules out for most blocks
    np.abs(x, out=z)
    flagged = not z.max() < _EXP_KHI
    np.greater_equal(z, _K_W_LO, out=bm)
    np.less(z, _K_W_HI, out=bm2)
    np.logical_and(bm, bm2, out=bm)
    if not z.min() >= _EXP_TB_HI:
        np.greater_equal(z, _EXP_TB_LO, out=bm2)
        np.less(z, _EXP_TB_HI, out=bm3)
        np.logical_and(bm2, bm3, out=bm2)
        np.logical_or(bm, bm2, out=bm)
    flagged = flagged or bm.any()
    # t = (double)(int)(INVLN2*x + halF[sign]) (v), hi = x - t*LN2_HI (h),
    # lo = t*LN2_LO, r = hi - lo
    _half_with_sign_of(x, h)
    _reduce_block(x, h, v, h, lo, r)
    # c = r - t*(P1 + t*(P2 + t*(P3 + t*(P4 + t*P5)))), t = r*r
    np.multiply(r, r, out=z)
    _poly_block(z, _K_P, p)
    np.multiply(p, z, out=p)
    np.subtract(r, p, out=p)                     # p = c
    # y = 1 - ((lo - (r*c)/(2 - c)) - hi)
    np.multiply(r, p, out=z)
    np.subtract(_K_TWO, p, out=p)
    np.divide(z, p, out=z)
    np.subtract(lo, z, out=z)
    np.subtract(z, h, out=z)
    np.subtract(_K_ONE, z, out=out)
    # y * 2^k (exponent field)
    np.add(v, _K_MAGIC, out=v)
    _add_exponent_block(out, v)
    return _patch(x, out, flagged, ~(np.abs(x) < _EXP_KHI) | bm if flagged else None,
                  _exp_special)


def exp(x) -> np.ndarray:
    """e**x: fdlibm 5.3 ``e_exp.c``; error < 1 ulp (fdlibm's analysis;
    measured max 0.87); C twin ``gt_exp``.

    Method::

      1. Argument reduction: x = k*ln2 + r, |r| <= 0.5*ln2, r = hi - lo.
         hx = high word of |x| (bits 63..32 without the sign).
         0x3fd62e42 < hx < 0x3ff0a2b2 (0.5ln2 < |x| < 1.5ln2):
             hi = x - (+-LN2_HI), lo = +-LN2_LO, k = +-1   (sign of x)
         hx >= 0x3ff0a2b2:
             k  = (int)(INVLN2*x + (x < 0 ? -0.5 : 0.5))   (C truncation)
             t  = (double)k
             hi = x - t*LN2_HI      (exact: LN2_HI ends in 21 zero bits)
             lo = t*LN2_LO
         in both cases r = hi - lo;   hx <= 0x3fd62e42: k = 0, r = x.
      2. exp(r) from a degree-5 Remez fit of R(r*r) = r*(e^r+1)/(e^r-1)
         (error < 2^-59):
             t = r*r
             c = r - t*(P1 + t*(P2 + t*(P3 + t*(P4 + t*P5))))
             k == 0:  return 1 - ((r*c)/(c - 2) - r)
             k != 0:  y = 1 - ((lo - (r*c)/(2 - c)) - hi)
      3. k >= -1021: add k to y's exponent field (exact);
         k <  -1021: add k + 1000, multiply by 2^-1000 (one rounding into
         the subnormal range).

    Every operation above is one rounded binary64 operation, evaluated
    innermost parenthesis first, left to right; nothing is fused.

    Special cases (tested first)::

      hx >= 0x40862e42 (|x| >= 709.78):
          NaN -> NaN (0x7ff8000000000000);  +inf -> +inf;  -inf -> +0.0;
          x > O_THRESHOLD -> +inf;  x < U_THRESHOLD -> +0.0
      hx < 0x3e300000 (|x| < 2^-28): 1 + x
      exp(+-0) = 1 is the only exact finite case.

    Constants (hex bits are exact; decimals are fdlibm's)::

      O_THRESHOLD  0x1.62e42fefa39efp+9     0x40862E42FEFA39EF  7.09782712893383973096e+02
      U_THRESHOLD  -0x1.74910d52d3051p+9    0xC0874910D52D3051  -7.45133219101941108420e+02
      LN2_HI       0x1.62e42fee00000p-1     0x3FE62E42FEE00000  6.93147180369123816490e-01
      LN2_LO       0x1.a39ef35793c76p-33    0x3DEA39EF35793C76  1.90821492927058770002e-10
      INVLN2       0x1.71547652b82fep+0     0x3FF71547652B82FE  1.44269504088896338700e+00
      TWOM1000     0x1.0000000000000p-1000  0x0170000000000000  9.33263618503218878990e-302
      P1           0x1.555555555553ep-3     0x3FC555555555553E  1.66666666666666019037e-01
      P2           -0x1.6c16c16bebd93p-9    0xBF66C16C16BEBD93  -2.77777777770155933842e-03
      P3           0x1.1566aaf25de2cp-14    0x3F11566AAF25DE2C  6.61375632143793436117e-05
      P4           -0x1.bbd41c5d26bf1p-20   0xBEBBBD41C5D26BF1  -1.65339022054652515390e-06
      P5           0x1.6376972bea4d0p-25    0x3E66376972BEA4D0  4.13813679705723846039e-08

    Vectorised kernel, bit-identical to the above on its domain
    ``|x| < 704`` minus the bands ``[2^-54, 2^-28)`` and W (see ``_W_LO``,
    ``_EXP_TB_LO``); it uses the |x| >= 1.5ln2 formulas for every lane:
      * |k| == 1 lanes: the general reduction also yields k = +-1 there, and
        t*LN2_HI = +-LN2_HI, t*LN2_LO = +-LN2_LO exactly: same hi, lo;
      * k == 0 lanes: t = +-0, so hi = x, lo = +-0, r = x, and
        1 - ((lo - q) - hi) with q = (r*c)/(2-c) equals 1 - (q' - r) with
        q' = (r*c)/(c-2) = -q, because IEEE subtraction and division are
        symmetric under negation;
      * 2^k: adding k<<52 to the bits of y, computed as shown in the code.
    """
    return _run(x, _exp_block, _exp_ref)


# ===========================================================================
# expm1
# ===========================================================================
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


# ===========================================================================
# log
# ===========================================================================
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


# ===========================================================================
# tanh
# ===========================================================================
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
