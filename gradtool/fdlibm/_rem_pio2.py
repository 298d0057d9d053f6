"""The pi/2 argument reduction of sin and cos: fdlibm 5.3 ``e_rem_pio2.c`` and, for
|x| > 2^19*pi/2, ``k_rem_pio2.c`` (C twins ``gtm_rem_pio2`` and ``gtm_kernel_rem_pio2``
in gradtool/csrc/gt_math.h).

``_rem_pio2(x)`` gives, for finite x with |x| > pi/4 (high word above 0x3fe921fb),
n and y0 + y1 with x = n*pi/2 + y0 + y1, |y0 + y1| <= pi/4 (about), y1 below half an ulp
of y0: the result fdlibm's ``__ieee754_rem_pio2`` gives, bit for bit, for every such x.

Method (ix = high word of |x|, hx that of x)::

  ix < 0x4002d97c (|x| < 3pi/4): n = +-1;  x > 0:  z = x - PIO2_1, and
      ix != 0x3ff921fb:  y0 = z - PIO2_1T;  y1 = (z - y0) - PIO2_1T
      ix == 0x3ff921fb:  z = z - PIO2_2;  y0 = z - PIO2_2T;  y1 = (z - y0) - PIO2_2T
      (x < 0: the same with + for -, n = -1)
  ix <= 0x413921fb (|x| <= 2^19*pi/2, "medium"): t = |x|
      n = (int)(t*INVPIO2 + 0.5);  fn = (double)n
      r = t - fn*PIO2_1;  w = fn*PIO2_1T;  y0 = r - w       (85 bits)
      unless n < 32 and ix != NPIO2_HW[n-1] (no cancellation possible; that table's word
      is the high word of fn*PIO2_1, which is how the code reads it):
        j = biased exponent of x; if j - (biased exponent of y0) > 16:
          u = r;  w = fn*PIO2_2;  r = u - w;  w = fn*PIO2_2T - ((u - r) - w);  y0 = r - w
          if j - (biased exponent of y0) > 49:
            u = r;  w = fn*PIO2_3;  r = u - w;  w = fn*PIO2_3T - ((u - r) - w);  y0 = r - w
      y1 = (r - y0) - w;  x < 0: n, y0, y1 negated
  otherwise (large): z = |x| scaled by 2^-e0, e0 = ilogb(x) - 23, cut into three 24-bit
      pieces tx[0..2] (trailing zero pieces dropped), then __kernel_rem_pio2(tx, e0, nx,
      prec=2) (``_kernel_rem_pio2`` below, one element at a time: such arguments are rare
      in practice), the signs as above.

The constants are fdlibm's (hex = exact, decimal = fdlibm's, then the bits):
PIO2_1 is the first 33 bits of pi/2, PIO2_1T = pi/2 - PIO2_1, PIO2_2 the next 33 bits,
PIO2_2T = pi/2 - (PIO2_1 + PIO2_2), PIO2_3 the next 33 and PIO2_3T the rest; PIO2 is
pi/2 in 24-bit pieces, TWO_OVER_PI 2/pi in 24-bit integers (66 of them, 1584 bits).
"""

from __future__ import annotations

import numpy as np

from ._common import _F64, _U64, _hex

INVPIO2 = _hex("0x1.45f306dc9c883p-1")   # 6.36619772367581382433e-01  0x3FE45F306DC9C883
PIO2_1 = _hex("0x1.921fb54400000p+0")    # 1.57079632673412561417e+00  0x3FF921FB54400000
PIO2_1T = _hex("0x1.0b4611a626331p-34")  # 6.07710050650619224932e-11  0x3DD0B4611A626331
PIO2_2 = _hex("0x1.0b4611a600000p-34")   # 6.07710050630396597660e-11  0x3DD0B4611A600000
PIO2_2T = _hex("0x1.3198a2e037073p-69")  # 2.02226624879595063154e-21  0x3BA3198A2E037073
PIO2_3 = _hex("0x1.3198a2e000000p-69")   # 2.02226624871116645580e-21  0x3BA3198A2E000000
PIO2_3T = _hex("0x1.b839a252049c1p-104")  # 8.47842766036889956997e-32  0x397B839A252049C1
TWO24 = _hex("0x1p24")                   # 1.67772160000000000000e+07  0x4170000000000000
TWON24 = _hex("0x1p-24")                 # 5.96046447753906250000e-08  0x3E70000000000000

# the high words of n*pi/2, n = 1..32: where the medium reduction may cancel
NPIO2_HW = np.array([
    0x3FF921FB, 0x400921FB, 0x4012D97C, 0x401921FB, 0x401F6A7A, 0x4022D97C, 0x4025FDBB,
    0x402921FB, 0x402C463A, 0x402F6A7A, 0x4031475C, 0x4032D97C, 0x40346B9C, 0x4035FDBB,
    0x40378FDB, 0x403921FB, 0x403AB41B, 0x403C463A, 0x403DD85A, 0x403F6A7A, 0x40407E4C,
    0x4041475C, 0x4042106C, 0x4042D97C, 0x4043A28C, 0x40446B9C, 0x404534AC, 0x4045FDBB,
    0x4046C6CB, 0x40478FDB, 0x404858EB, 0x404921FB], dtype=np.int64)

# pi/2 in 24-bit pieces (k_rem_pio2.c's PIo2)
PIO2 = tuple(map(_hex, (
    "0x1.921fb40000000p+0",    # 1.57079625129699707031e+00  0x3FF921FB40000000
    "0x1.4442d00000000p-24",   # 7.54978941586159635335e-08  0x3E74442D00000000
    "0x1.8469880000000p-48",   # 5.39030252995776476554e-15  0x3CF8469880000000
    "0x1.8cc5160000000p-72",   # 3.28200341580791294123e-22  0x3B78CC5160000000
    "0x1.01b8380000000p-96",   # 1.27065575308067607349e-29  0x39F01B8380000000
    "0x1.a252040000000p-120",  # 1.22933308981111328932e-36  0x387A252040000000
    "0x1.3822280000000p-145",  # 2.73370053816464559624e-44  0x36E3822280000000
    "0x1.9f31d00000000p-169",  # 2.16741683877804819444e-51  0x3569F31D00000000
)))

# 2/pi, 24 bits per entry after the binary point (k_rem_pio2.c's ipio2)
TWO_OVER_PI = (
    0xA2F983, 0x6E4E44, 0x1529FC, 0x2757D1, 0xF534DD, 0xC0DB62, 0x95993C, 0x439041, 0xFE5163,
    0xABDEBB, 0xC561B7, 0x246E3A, 0x424DD2, 0xE00649, 0x2EEA09, 0xD1921C, 0xFE1DEB, 0x1CB129,
    0xA73EE8, 0x8235F5, 0x2EBB44, 0x84E99C, 0x7026B4, 0x5F7E41, 0x3991D6, 0x398353, 0x39F49C,
    0x845F8B, 0xBDF928, 0x3B1FF8, 0x97FFDE, 0x05980F, 0xEF2F11, 0x8B5A0A, 0x6D1F6D, 0x367ECF,
    0x27CB09, 0xB74F46, 0x3F669E, 0x5FEA2D, 0x7527BA, 0xC7EBE5, 0xF17B3D, 0x0739F7, 0x8A5292,
    0xEA6BFB, 0x5FB11F, 0x8D5D08, 0x560330, 0x46FC7B, 0x6BABF0, 0xCFBC20, 0x9AF436, 0x1DA9E3,
    0x91615E, 0xE61B08, 0x659985, 0x5F14A0, 0x68408D, 0xFFD880, 0x4D7327, 0x310606, 0x1556CA,
    0x73A8C9, 0x60E27B, 0xC08C6B,
)

_JK = 4    # init_jk[prec] for prec = 2 (64-bit precision, what e_rem_pio2.c asks for)


def _pow2(k: int) -> float:
    """2.0**k for -1022 <= k <= 1023, from its bits (exact); scalbn(z, k) is z * _pow2(k)
    wherever fdlibm calls it here (the results stay normal)."""
    return float(np.array([(k + 1023) << 52], dtype=_U64).view(_F64)[0])


def _floor_nonneg(v: float) -> float:
    """floor(v) for 0 <= v < 2^63 (C's truncating cast: exact)."""
    return float(int(v))


def _kernel_rem_pio2(tx: list, e0: int) -> tuple:
    """fdlibm's __kernel_rem_pio2(tx, y, e0, nx, prec=2), one element, in Python floats
    (each + - * one correctly rounded binary64 operation) and ints: (n & 7, y0, y1).
    The variables are fdlibm's; the comments give its description."""
    nx = len(tx)
    jk = jp = _JK
    jx = nx - 1
    jv = max((e0 - 3) // 24, 0) if e0 >= 3 else 0     # C's (e0-3)/24 truncates: e0 >= 3 here
    q0 = e0 - 24 * (jv + 1)
    # f[0..jx+jk], f[jx+jk] = TWO_OVER_PI[jv+jk]
    f = [0.0] * 20
    j = jv - jx
    for i in range(jx + jk + 1):
        f[i] = 0.0 if j < 0 else float(TWO_OVER_PI[j])
        j += 1
    q = [0.0] * 20
    for i in range(jk + 1):                            # q[0..jk]
        fw = 0.0
        for j in range(jx + 1):
            fw = fw + tx[j] * f[jx + i - j]
        q[i] = fw
    jz = jk
    iq = [0] * 20
    while True:                                        # recompute:
        # distill q[] into iq[] reversingly
        z = q[jz]
        i, j = 0, jz
        while j > 0:
            fw = float(int(TWON24 * z))
            iq[i] = int(z - TWO24 * fw)
            z = q[j - 1] + fw
            i += 1
            j -= 1
        # compute n
        z = z * _pow2(q0)
        z = z - 8.0 * _floor_nonneg(z * 0.125)         # trim off integer >= 8
        n = int(z)
        z = z - float(n)
        ih = 0
        if q0 > 0:                                     # need iq[jz-1] to determine n
            i = iq[jz - 1] >> (24 - q0)
            n += i
            iq[jz - 1] -= i << (24 - q0)
            ih = iq[jz - 1] >> (23 - q0)
        elif q0 == 0:
            ih = iq[jz - 1] >> 23
        elif z >= 0.5:
            ih = 2
        if ih > 0:                                     # q > 0.5
            n += 1
            carry = 0
            for i in range(jz):                        # compute 1 - q
                j = iq[i]
                if carry == 0:
                    if j != 0:
                        carry = 1
                        iq[i] = 0x1000000 - j
                else:
                    iq[i] = 0xFFFFFF - j
            if q0 == 1:                                # rare case: chance is 1 in 12
                iq[jz - 1] &= 0x7FFFFF
            elif q0 == 2:
                iq[jz - 1] &= 0x3FFFFF
            if ih == 2:
                z = 1.0 - z
                if carry != 0:
                    z = z - _pow2(q0)
        # check if recomputation is needed
        if z == 0.0:
            j = 0
            for i in range(jz - 1, jk - 1, -1):
                j |= iq[i]
            if j == 0:                                 # need recomputation
                k = 1
                while iq[jk - k] == 0:                 # k = no. of terms needed
                    k += 1
                for i in range(jz + 1, jz + k + 1):    # add q[jz+1] to q[jz+k]
                    f[jx + i] = float(TWO_OVER_PI[jv + i])
                    fw = 0.0
                    for j in range(jx + 1):
                        fw = fw + tx[j] * f[jx + i - j]
                    q[i] = fw
                jz += k
                continue
        break
    # chop off zero terms
    if z == 0.0:
        jz -= 1
        q0 -= 24
        while iq[jz] == 0:
            jz -= 1
            q0 -= 24
    else:                                              # break z into 24-bit if necessary
        z = z * _pow2(-q0)
        if z >= TWO24:
            fw = float(int(TWON24 * z))
            iq[jz] = int(z - TWO24 * fw)
            jz += 1
            q0 += 24
            iq[jz] = int(fw)
        else:
            iq[jz] = int(z)
    # convert integer "bit" chunk to floating-point value
    fw = _pow2(q0)
    for i in range(jz, -1, -1):
        q[i] = fw * float(iq[i])
        fw = fw * TWON24
    # compute PIO2[0..jp] * q[jz..0]
    fq = [0.0] * 20
    for i in range(jz, -1, -1):
        fw = 0.0
        k = 0
        while k <= jp and k <= jz - i:
            fw = fw + PIO2[k] * q[i + k]
            k += 1
        fq[jz - i] = fw
    # compress fq[] into y[] (prec 2)
    fv = 0.0
    for i in range(jz, -1, -1):
        fv = fv + fq[i]
    y0 = fv if ih == 0 else -fv
    fv = fq[0] - fv
    for i in range(1, jz + 1):
        fv = fv + fq[i]
    y1 = fv if ih == 0 else -fv
    return n & 7, y0, y1


def _rem_pio2_large(x: float) -> tuple:
    """e_rem_pio2.c's large case for one finite x, |x| > 2^19*pi/2: (n, y0, y1)."""
    u = int(np.array([x], dtype=_F64).view(_U64)[0])
    ix = (u >> 32) & 0x7FFFFFFF
    e0 = (ix >> 20) - 1046                     # e0 = ilogb(z) - 23
    zb = ((ix - (e0 << 20)) << 32) | (u & 0xFFFFFFFF)
    z = float(np.array([zb], dtype=_U64).view(_F64)[0])
    tx = []
    for _ in range(2):
        t = float(int(z))
        tx.append(t)
        z = (z - t) * TWO24
    tx.append(z)
    while tx[-1] == 0.0:                       # skip zero terms
        tx.pop()
    n, y0, y1 = _kernel_rem_pio2(tx, e0)
    if u >> 63:
        return -n, -y0, -y1
    return n, y0, y1


def _exponent(v):
    """The biased exponent field of each double (fdlibm's (__HI(v) >> 20) & 0x7ff)."""
    return ((v.view(_U64) >> _U64(52)) & _U64(0x7FF)).astype(np.int64)


def _rem_pio2(x: np.ndarray):
    """(n as int64, y0, y1) for a 1-d float64 array of finite x with |x| > pi/4."""
    u = x.view(_U64)
    ix = ((u >> _U64(32)) & _U64(0x7FFFFFFF)).astype(np.int64)
    neg = (u >> _U64(63)) != 0
    n = np.zeros(x.shape, np.int64)
    y0 = np.empty(x.shape, _F64)
    y1 = np.empty(x.shape, _F64)

    near = ix < 0x4002D97C                     # |x| < 3pi/4: n = +-1
    i = np.flatnonzero(near)
    if i.size:
        v, sg = x[i], np.where(neg[i], -1.0, 1.0)
        at = ix[i] == 0x3FF921FB               # near pi/2: 33+33+53 bits of pi
        z = v - sg * PIO2_1                    # x - PIO2_1 or x + PIO2_1 (sg*c is exact)
        z = np.where(at, z - sg * PIO2_2, z)
        c = np.where(at, PIO2_2T, PIO2_1T) * sg
        a = z - c
        y0[i], y1[i] = a, (z - a) - c
        n[i] = np.where(neg[i], -1, 1)

    medium = ~near & (ix <= 0x413921FB)
    i = np.flatnonzero(medium)
    if i.size:
        t = np.abs(x[i])
        nn = np.trunc(t * INVPIO2 + 0.5)
        r = t - nn * PIO2_1
        w = nn * PIO2_1T                       # 1st round good to 85 bits
        a = r - w
        ni = nn.astype(np.int64)
        # fdlibm's NPIO2_HW[n-1] is the high word of fn*PIO2_1 (exact) for every n < 32
        quick = (ni < 32) & (ix[i] != ((nn * PIO2_1).view(_U64) >> _U64(32)).astype(np.int64))
        j = ix[i] >> 20
        second = ~quick & (j - _exponent(a) > 16)
        u2 = r
        w2 = nn * PIO2_2
        r2 = u2 - w2
        w2 = nn * PIO2_2T - ((u2 - r2) - w2)
        a2 = r2 - w2
        third = second & (j - _exponent(a2) > 49)
        w3 = nn * PIO2_3
        r3 = r2 - w3
        w3 = nn * PIO2_3T - ((r2 - r3) - w3)
        a3 = r3 - w3
        r = np.where(third, r3, np.where(second, r2, r))
        w = np.where(third, w3, np.where(second, w2, w))
        a = np.where(third, a3, np.where(second, a2, a))
        b = (r - a) - w
        sn = neg[i]
        y0[i] = np.where(sn, -a, a)
        y1[i] = np.where(sn, -b, b)
        n[i] = np.where(sn, -ni, ni)

    for k in np.flatnonzero(~near & ~medium):
        n[k], y0[k], y1[k] = _rem_pio2_large(float(x[k]))
    return n, y0, y1
