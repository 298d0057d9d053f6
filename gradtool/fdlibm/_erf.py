"""erf: fdlibm 5.3 ``s_erf.c`` (C twin ``gt_erf`` in gradtool/csrc/gt_math.h).

``erf`` (whose docstring gives the method, special cases and constants) and
its constants.  There is no separate block kernel: ``erf`` splits the lanes
by fdlibm's branch (one ``np.flatnonzero`` per branch) and evaluates each
branch's formula on its own lanes only, one ufunc call per operation, so
``_erf_ref`` is ``erf`` itself.  Its two exponentials are ``_exp.exp``
(fdlibm's ``__ieee754_exp``, bit for bit).
"""

from __future__ import annotations

import numpy as np

from ._common import _F64, _U64, _hex, _horner
from ._driver import _by_branch, _run_branches
from ._exp import exp

# erf's constants (hex = exact value, decimal = fdlibm's)
ERX = _hex("0x1.b0ac160000000p-1")    # 8.45062911510467529297e-01  0x3FEB0AC160000000
EFX = _hex("0x1.06eba8214db69p-3")    # 1.28379167095512586316e-01  0x3FC06EBA8214DB69
EFX8 = _hex("0x1.06eba8214db69p+0")   # 1.02703333676410069053e+00  0x3FF06EBA8214DB69
# |x| < 0.84375: erf(x) = x + x*(PP(z)/QQ(z)), z = x*x
PP = tuple(map(_hex, (
    "0x1.06eba8214db68p-3",    # pp0  1.28379167095512558561e-01  0x3FC06EBA8214DB68
    "-0x1.4cd7d691cb913p-2",   # pp1 -3.25042107247001499370e-01  0xBFD4CD7D691CB913
    "-0x1.d2a51dbd7194fp-6",   # pp2 -2.84817495755985104766e-02  0xBF9D2A51DBD7194F
    "-0x1.7a291236668e4p-8",   # pp3 -5.77027029648944159157e-03  0xBF77A291236668E4
    "-0x1.8ead6120016acp-16",  # pp4 -2.37630166566501626084e-05  0xBEF8EAD6120016AC
)))
QQ = tuple(map(_hex, (
    "0x1.97779cddadc09p-2",    # qq1  3.97917223959155352819e-01  0x3FD97779CDDADC09
    "0x1.0a54c5536cebap-4",    # qq2  6.50222499887672944485e-02  0x3FB0A54C5536CEBA
    "0x1.4d022c4d36b0fp-8",    # qq3  5.08130628187576562776e-03  0x3F74D022C4D36B0F
    "0x1.15dc9221c1a10p-13",   # qq4  1.32494738004321644526e-04  0x3F215DC9221C1A10
    "-0x1.09c4342a26120p-18",  # qq5 -3.96022827877536812320e-06  0xBED09C4342A26120
)))
# 0.84375 <= |x| < 1.25: erf(|x|) = ERX + PA(s)/QA(s), s = |x| - 1
PA = tuple(map(_hex, (
    "-0x1.359b8bef77538p-9",   # pa0 -2.36211856075265944077e-03  0xBF6359B8BEF77538
    "0x1.a8d00ad92b34dp-2",    # pa1  4.14856118683748331666e-01  0x3FDA8D00AD92B34D
    "-0x1.7d240fbb8c3f1p-2",   # pa2 -3.72207876035701323847e-01  0xBFD7D240FBB8C3F1
    "0x1.45fca805120e4p-2",    # pa3  3.18346619901161753674e-01  0x3FD45FCA805120E4
    "-0x1.c63983d3e28ecp-4",   # pa4 -1.10894694282396677476e-01  0xBFBC63983D3E28EC
    "0x1.22a36599795ebp-5",    # pa5  3.54783043256182359371e-02  0x3FA22A36599795EB
    "-0x1.1bf380a96073fp-9",   # pa6 -2.16637559486879084300e-03  0xBF61BF380A96073F
)))
QA = tuple(map(_hex, (
    "0x1.b3e6618eee323p-4",    # qa1  1.06420880400844228286e-01  0x3FBB3E6618EEE323
    "0x1.14af092eb6f33p-1",    # qa2  5.40397917702171048937e-01  0x3FE14AF092EB6F33
    "0x1.2635cd99fe9a7p-4",    # qa3  7.18286544141962662868e-02  0x3FB2635CD99FE9A7
    "0x1.02660e763351fp-3",    # qa4  1.26171219808761642112e-01  0x3FC02660E763351F
    "0x1.bedc26b51dd1cp-7",    # qa5  1.36370839120290507362e-02  0x3F8BEDC26B51DD1C
    "0x1.88b545735151dp-7",    # qa6  1.19844998467991074170e-02  0x3F888B545735151D
)))
# 1.25 <= |x| < 1/0.35: R1(s)/S1(s), s = 1/(x*x)
RA = tuple(map(_hex, (
    "-0x1.43412600d6435p-7",   # ra0 -9.86494403484714822705e-03  0xBF843412600D6435
    "-0x1.63416e4ba7360p-1",   # ra1 -6.93858572707181764372e-01  0xBFE63416E4BA7360
    "-0x1.51e0441b0e726p+3",   # ra2 -1.05586262253232909814e+01  0xC0251E0441B0E726
    "-0x1.f300ae4cba38dp+5",   # ra3 -6.23753324503260060396e+01  0xC04F300AE4CBA38D
    "-0x1.44cb184282266p+7",   # ra4 -1.62396669462573470355e+02  0xC0644CB184282266
    "-0x1.7135cebccabb2p+7",   # ra5 -1.84605092906711035994e+02  0xC067135CEBCCABB2
    "-0x1.4526557e4d2f2p+6",   # ra6 -8.12874355063065934246e+01  0xC054526557E4D2F2
    "-0x1.3a0efc69ac25cp+3",   # ra7 -9.81432934416914548592e+00  0xC023A0EFC69AC25C
)))
SA = tuple(map(_hex, (
    "0x1.3a6b9bd707687p+4",    # sa1  1.96512716674392571292e+01  0x4033A6B9BD707687
    "0x1.1350c526ae721p+7",    # sa2  1.37657754143519042600e+02  0x4061350C526AE721
    "0x1.b290dd58a1a71p+8",    # sa3  4.34565877475229228821e+02  0x407B290DD58A1A71
    "0x1.42b1921ec2868p+9",    # sa4  6.45387271733267880336e+02  0x40842B1921EC2868
    "0x1.ad02157700314p+8",    # sa5  4.29008140027567833386e+02  0x407AD02157700314
    "0x1.b28a3ee48ae2cp+6",    # sa6  1.08635005541779435134e+02  0x405B28A3EE48AE2C
    "0x1.a47ef8e484a93p+2",    # sa7  6.57024977031928170135e+00  0x401A47EF8E484A93
    "-0x1.eeff2ee749a62p-5",   # sa8 -6.04244152148580987438e-02  0xBFAEEFF2EE749A62
)))
# 1/0.35 <= |x| < 6: R2(s)/S2(s)
RB = tuple(map(_hex, (
    "-0x1.4341239e86f4ap-7",   # rb0 -9.86494292470009928597e-03  0xBF84341239E86F4A
    "-0x1.993ba70c285dep-1",   # rb1 -7.99283237680523006574e-01  0xBFE993BA70C285DE
    "-0x1.1c209555f995ap+4",   # rb2 -1.77579549177547519889e+01  0xC031C209555F995A
    "-0x1.4145d43c5ed98p+7",   # rb3 -1.60636384855821916062e+02  0xC064145D43C5ED98
    "-0x1.3ec881375f228p+9",   # rb4 -6.37566443368389627722e+02  0xC083EC881375F228
    "-0x1.004616a2e5992p+10",  # rb5 -1.02509513161107724954e+03  0xC09004616A2E5992
    "-0x1.e384e9bdc383fp+8",   # rb6 -4.83519191608651397019e+02  0xC07E384E9BDC383F
)))
SB = tuple(map(_hex, (
    "0x1.e568b261d5190p+4",    # sb1  3.03380607434824582924e+01  0x403E568B261D5190
    "0x1.45cae221b9f0ap+8",    # sb2  3.25792512996573918826e+02  0x40745CAE221B9F0A
    "0x1.802eb189d5118p+10",   # sb3  1.53672958608443695994e+03  0x409802EB189D5118
    "0x1.8ffb7688c246ap+11",   # sb4  3.19985821950859553908e+03  0x40A8FFB7688C246A
    "0x1.3f219cedf3be6p+11",   # sb5  2.55305040643316442583e+03  0x40A3F219CEDF3BE6
    "0x1.da874e79fe763p+8",    # sb6  4.74528541206955367215e+02  0x407DA874E79FE763
    "-0x1.670e242712d62p+4",   # sb7 -2.24409524465858183362e+01  0xC03670E242712D62
)))


# the pieces erf and erfc share (s_erf.c writes them out in both; C twins gtm_erf_*)
def _erf_y(x):
    """|x| < 0.84375: y = r/s with z = x*x, r = pp0 + z*(...), s = 1 + z*(qq1 + ...)."""
    z = x * x
    r = _horner(z, PP)
    s = 1.0 + z * _horner(z, QQ)
    return r / s


def _erf_pq(a):
    """0.84375 <= |x| < 1.25, a = |x|: P/Q with s = a - 1."""
    s = a - 1.0
    return _horner(s, PA) / (1.0 + s * _horner(s, QA))


def _erf_r(a, below):
    """1.25 <= |x|, a = |x|: r = exp(-z*z - 0.5625)*exp((z - a)*(z + a) + R/S), s = 1/(a*a),
    z = a with its low word cleared, R/S = ra/sa's where ``below`` (|x| < 1/0.35, whose
    high-word bound erf and erfc draw one apart), else rb/sb's."""
    s = 1.0 / (a * a)
    rs = np.where(below, _horner(s, RA) / (1.0 + s * _horner(s, SA)),
                  _horner(s, RB) / (1.0 + s * _horner(s, SB)))
    z = (a.view(_U64) & _U64(0xFFFFFFFF00000000)).view(_F64)
    return exp((-z) * z - 0.5625) * exp((z - a) * (z + a) + rs)


def _erf_small(x):
    """2^-28 <= |x| < 0.84375: x + x*(r/s)."""
    return x + x * _erf_y(x)


def _erf_mid(x):
    """0.84375 <= |x| < 1.25: +-(ERX + P/Q), s = |x| - 1."""
    pq = _erf_pq(np.abs(x))
    return np.where(x >= 0.0, ERX + pq, -ERX - pq)


def _erf_tail(x, below):
    """1.25 <= |x| < 6: +-(1 - r/|x|), r = exp(-z*z - 0.5625)*exp((z - a)*(z + a) + R/S)
    with a = |x|, z = a with its low word cleared; ``below``: |x| < 1/0.35."""
    a = np.abs(x)
    q = _erf_r(a, below) / a
    return np.where(x >= 0.0, 1.0 - q, q - 1.0)


def erf(x) -> np.ndarray:
    """The error function 2/sqrt(pi) * integral_0^x exp(-t*t) dt: fdlibm 5.3
    ``s_erf.c``; error < 1 ulp (measured max 0.707 ulp on tests/test_fdlibm_more.py's
    inputs);
    C twin ``gt_erf``.

    Method (ix = high word of |x|; every operation one rounded binary64
    operation, innermost first; erf(-x) = -erf(x) by the formulas' signs)::

      ix >= 0x7ff00000:   NaN -> NaN (0x7ff8000000000000);  +-inf -> +-1
      |x| < 2^-28 (ix < 0x3e300000):
          ix < 0x00800000:  0.125*(8*x + EFX8*x)   (no underflow in EFX*x)
          else:             x + EFX*x
      |x| < 0.84375 (ix < 0x3feb0000):  z = x*x
          r = pp0 + z*(pp1 + z*(pp2 + z*(pp3 + z*pp4)))
          s = 1 + z*(qq1 + z*(qq2 + z*(qq3 + z*(qq4 + z*qq5))))
          x + x*(r/s)                         |r/s - (erf(x) - x)/x| <= 2^-57.90
      |x| < 1.25 (ix < 0x3ff40000):  s = |x| - 1
          P = pa0 + s*(pa1 + ... + s*pa6);  Q = 1 + s*(qa1 + ... + s*qa6)
          x >= 0: ERX + P/Q,  x < 0: -ERX - P/Q   |P/Q - (erf(|x|) - ERX)| <= 2^-59.06
      |x| >= 6 (ix >= 0x40180000):  +-1 (fdlibm's 1 - tiny rounds to 1)
      otherwise, a = |x|, s = 1/(a*a):
          a < 1/0.35 (ix < 0x4006db6e):  R = ra0 + s*(... + s*ra7),
                                          S = 1 + s*(sa1 + ... + s*sa8)
          else:                           R = rb0 + s*(... + s*rb6),
                                          S = 1 + s*(sb1 + ... + s*sb7)
          z = a with the low 32 bits cleared (so z*z is exact)
          r = exp((-z)*z - 0.5625) * exp((z - a)*(z + a) + R/S)
          x >= 0: 1 - r/a,  x < 0: r/a - 1

    Constants: see the module (each with fdlibm's decimal and its bits).
    """
    return _run_branches(x, _erf_flat)


def _erf_flat(flat: np.ndarray) -> np.ndarray:
    """erf of a 1-d float64 block, branch by branch."""
    if flat.size == 0:
        return np.empty(0, _F64)
    ix = (flat.view(_U64) >> _U64(32)) & _U64(0x7FFFFFFF)
    with np.errstate(all="ignore"):
        branches = (
            (ix < 0x00800000, lambda v: 0.125 * (8.0 * v + EFX8 * v)),
            (ix < 0x3E300000, lambda v: v + EFX * v),
            (ix < 0x3FEB0000, _erf_small),
            (ix < 0x3FF40000, _erf_mid),
            (ix < 0x40180000, lambda v: _erf_tail(v, (v.view(_U64) & _U64(0x7FFFFFFF00000000))
                                                  < _U64(0x4006DB6E00000000))),
            (ix < 0x7FF00000, lambda v: np.where(v >= 0.0, 1.0, -1.0)),   # 6 <= |x| < inf
        )
        return _by_branch(flat, branches, 1.0, -1.0)


_erf_ref = erf   # one path: the branch-by-branch evaluation above
