"""fdlibm: inputs, bit views, accuracy and parity helpers (test_fdlibm*.py): special
values, random doubles by exponent range, the points where fdlibm's tanh is worst,
ulp errors against mpmath, the C mirror's outputs through the real C compiler
(:func:`c_parity_outputs`) and Java's StrictMath as a second oracle
(:func:`assert_strictmath`).  Tests import these through tests/support.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np

import gradtool as gt
from conftest import bits
from gradtool.fdlibm import _common, _expm1, _log


HEADER = Path(gt.__file__).resolve().parent / "csrc" / "gt_math.h"

CC_FLAGS = {
    "O2": ["-std=c99", "-O2", "-ffp-contract=off"],
    # FMA hardware enabled: -ffp-contract=off must still keep every op separate
    "O3-native": ["-std=c99", "-O3", "-march=native", "-ffp-contract=off"],
}


CANON_NAN = 0x7FF8000000000000
U64 = np.uint64


def bits1(v) -> int:
    return int(np.float64(v).view(U64))


def from_bits(b) -> np.ndarray:
    return np.asarray(b, dtype=U64).view(np.float64)


def assert_special_values(impl, cases) -> None:
    """``impl`` (a numpy function) on each case's input gives its want to the bit, every
    NaN the canonical one: ``cases`` pairs (x, want)."""
    xs = np.array([c[0] for c in cases])
    want = np.array([c[1] for c in cases])
    want_bits = bits(want).copy()
    want_bits[np.isnan(want)] = CANON_NAN
    for x, g, w in zip(xs, bits(impl(xs)), want_bits, strict=True):
        assert g == w, (f"{impl.__name__}({x!r}) = {float(from_bits(g))!r} [{int(g):#018x}], "
                        f"want {float(from_bits(w))!r} [{int(w):#018x}]")


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------
def random_doubles(rng, n, emin, emax, sign=True):
    """Random mantissas with biased exponents uniform in [emin, emax]."""
    e = rng.integers(emin, emax + 1, n).astype(U64)
    m = rng.integers(0, 1 << 52, n, dtype=U64)
    s = (rng.integers(0, 2, n).astype(U64) << U64(63)) if sign else np.zeros(n, U64)
    return from_bits(s | (e << U64(52)) | m)


def around(rng, centres, n_each, spread):
    """Doubles within +-spread ulps (bit patterns) of each centre, both signs."""
    c = bits(np.asarray(centres, dtype=np.float64)).astype(np.int64)
    d = rng.integers(-spread, spread + 1, (c.size, n_each))
    b = (c[:, None] + d).reshape(-1).astype(U64)
    x = from_bits(b)
    return np.concatenate([x, -x])


def hiword(hw):
    return float(from_bits(np.array([hw << 32], U64))[0])


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 5e-324, -5e-324,
                     2.2250738585072014e-308, -2.2250738585072014e-308, 1.7976931348623157e308,
                     -1.7976931348623157e308, _common.O_THRESHOLD, _common.U_THRESHOLD, 22.0,
                     -22.0, 2.0 ** -54, 2.0 ** -55, 2.0 ** -28, 0.5, 2.0])
# a NaN with a payload and a signalling NaN, both signs
SPECIALS = np.concatenate([SPECIALS, from_bits(np.array(
    [0x7FF0000000000001, 0xFFF0000000000001, 0x7FF8DEADBEEF0000, 0xFFFC000000000123], U64))])


# tanh's k = trunc(2|x|/ln2 + 0.5) steps at |x| = (k - 1/2)*ln2/2, 1 <= k <= 63
TANH_K_STEPS = (np.arange(1, 64) - 0.5) * _common.LN2_HI / 2
# inputs where fdlibm's s_tanh.c is more than 2 ulp from the exact value
TANH_FDLIBM_WORST = np.array([0.2292752006275934, -0.2460230746389431, 0.48229395637779127,
                              0.5425668835808728])


def parity_inputs(seed=1234, n_random=64_000) -> np.ndarray:
    """~200k inputs: every exponent, each function's working range, every
    branch threshold of fdlibm and of the numpy kernels, specials."""
    rng = np.random.default_rng(seed)
    thresholds = [0x40862E42, 0x3FD62E42, 0x3FD62E43, 0x3FF0A2B2, 0x3E300000, 0x4043687A,
                  0x3C900000, 0x3C800000, 0x00100000, 0x7FF00000, 0x40360000, 0x3FF00000,
                  0x3FE00000, 0x3FF6A09E, 0x3FE6A09E, 0x4086232B, 0x408633CE]
    parts = [
        random_doubles(rng, n_random, 0, 2047),                 # everything, incl. inf/NaN
        random_doubles(rng, n_random // 2, 0x3C0, 0x409),       # |x| in [2^-63, 1024)
        rng.uniform(-750.0, 720.0, n_random // 2),
        rng.uniform(-45.0, 45.0, n_random // 4),
        rng.uniform(-1.2, 1.2, n_random // 4),
        random_doubles(rng, n_random // 4, 0, 0),               # subnormals
        1.0 + rng.uniform(-3e-6, 3e-6, n_random // 8),          # log near 1
        around(rng, [hiword(h) for h in thresholds], 300, 3000),
        around(rng, [_common.O_THRESHOLD, -_common.U_THRESHOLD, -_expm1._EM1_NEG,
                     _common._hex("0x1.62e42fefa39efp-2"), _log._BAND_F1 + 1, _log._BAND_F2 + 1,
                     1 + 2.0 ** -20, 1 - 2.0 ** -21],
               300, 3000),
        around(rng, TANH_K_STEPS, 60, 3000),                  # where tanh's k changes
        2.0 ** np.arange(-1074, 1024, dtype=np.float64),       # every power of two
        np.arange(-60.0, 61.0),
        SPECIALS,
    ]
    return np.concatenate(parts)


# ---------------------------------------------------------------------------
# (a) accuracy against mpmath
# ---------------------------------------------------------------------------
try:
    import mpmath
except ImportError:  # only the accuracy test needs it
    mpmath = None


def ulp_errors(fname, x, y, x2=None):
    """For each y = f(x) (with ``x2``: y = f(x, x2), atan2's argument order): (err, dist)
    where err = |y - f(x)| in units of the
    last place of the exact f(x) (50 digits; ulp(v) = 2^(e-52) for |v| in
    [2^e, 2^(e+1)), 2^-1074 below 2^-1022), and dist = how many doubles y is
    away from the correctly rounded f(x)."""
    mp = mpmath.mp
    f = getattr(mp, fname)
    errs = np.empty(x.size)
    dists = np.zeros(x.size, dtype=np.int64)
    second = [None] * x.size if x2 is None else x2.tolist()
    with mp.workdps(50):
        for i, (xi, yi, x2i) in enumerate(zip(x.tolist(), y.tolist(), second, strict=True)):
            exact = f(mp.mpf(xi)) if x2i is None else f(mp.mpf(xi), mp.mpf(x2i))
            _, e = mp.frexp(exact)                     # exact = m * 2^e, 0.5 <= |m| < 1
            ulp = mp.ldexp(1, max(int(e) - 53, -1074))
            errs[i] = float(abs(mp.mpf(yi) - exact) / ulp)
            if errs[i] > 0.5:                          # walk towards the exact value
                step = np.inf if exact > yi else -np.inf
                cur = yi
                while True:
                    nxt = float(np.nextafter(cur, step))
                    if abs(mp.mpf(nxt) - exact) >= abs(mp.mpf(cur) - exact):
                        break
                    cur = nxt
                    dists[i] += 1
    return errs, dists


def c_parity_outputs(tmp_path: Path, x: np.ndarray, fnames, flags, x2=None) -> np.ndarray:
    """gt_math.h's C twins of ``fnames`` on ``x`` (with ``x2``: of the pairs (x, x2), for
    the two-argument atan2, called as gt_<f>(x[i], x2[i])), compiled with ``flags`` (one of
    CC_FLAGS) and -Werror: an array [len(fnames), x.size].  Skips without a C compiler."""
    import shutil

    import pytest
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler")
    args = "x[i]" if x2 is None else "x[i], x[n + i]"
    calls = "\n".join(f"        y[{k} * n + i] = gt_{f}({args});" for k, f in enumerate(fnames))
    width = 1 if x2 is None else 2
    (tmp_path / "drv.c").write_text(f"""#include <stdio.h>
#include <stdlib.h>
#include "gt_math.h"
/* usage: drv IN OUT -- IN holds {width} * n little-endian doubles (the arguments, one
   block of n each); OUT receives {", ".join("gt_" + f for f in fnames)} of them, n doubles
   each */
int main(int argc, char **argv)
{{
    FILE *fi, *fo;
    long n, i;
    double *x, *y;
    if (argc != 3) return 2;
    fi = fopen(argv[1], "rb");
    if (!fi || fseek(fi, 0, SEEK_END)) return 3;
    n = ftell(fi) / (8 * {width});
    rewind(fi);
    x = malloc({width} * n * sizeof *x);
    y = malloc({len(fnames)} * n * sizeof *y);
    if (!x || !y || (long)fread(x, 8, {width} * n, fi) != {width} * n) return 4;
    fclose(fi);
    for (i = 0; i < n; i++) {{
{calls}
    }}
    fo = fopen(argv[2], "wb");
    if (!fo || (long)fwrite(y, 8, {len(fnames)} * n, fo) != {len(fnames)} * n) return 5;
    fclose(fo);
    return 0;
}}
""")
    exe = tmp_path / "drv"
    cmd = [cc, *CC_FLAGS[flags], "-Wall", "-Wextra", "-pedantic", "-Werror",
           "-I", str(HEADER.parent), str(tmp_path / "drv.c"), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 and flags != "O2" and "march" in res.stderr:
        pytest.skip("compiler rejects -march=native")
    assert res.returncode == 0, res.stderr
    data = x if x2 is None else np.concatenate([x, x2])
    (tmp_path / "in.bin").write_bytes(data.astype("<f8").tobytes())
    subprocess.run([str(exe), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True)
    return np.frombuffer((tmp_path / "out.bin").read_bytes(),
                         dtype="<f8").reshape(len(fnames), x.size)


def assert_strictmath(tmp_path: Path, x: np.ndarray, fnames, x2=None) -> None:
    """fdlibm itself: Java's StrictMath is specified to return fdlibm's bits, so each of
    ``fnames`` (gradtool.fdlibm functions StrictMath has) must give StrictMath's bits on
    ``x`` (with ``x2``: on the pairs (x, x2), for atan2(y, x)), NaN payloads aside.
    Skips without a JDK."""
    import shutil

    import pytest
    from gradtool import fdlibm
    javac, java = shutil.which("javac"), shutil.which("java")
    if javac is None or java is None:
        pytest.skip("no JDK")
    args = "x" if x2 is None else "x, x2"
    calls = " : ".join(f"f == {k} ? StrictMath.{f}({args})" for k, f in enumerate(fnames[:-1]))
    calls = (calls + " : " if calls else "") + f"StrictMath.{fnames[-1]}({args})"
    width = 1 if x2 is None else 2
    (tmp_path / "StrictRef.java").write_text(f"""
import java.nio.*; import java.nio.file.*;
public class StrictRef {{
  public static void main(String[] a) throws Exception {{
    ByteBuffer in = ByteBuffer.wrap(Files.readAllBytes(Paths.get(a[0])))
                              .order(ByteOrder.LITTLE_ENDIAN);
    int n = in.capacity() / {8 * width};
    ByteBuffer out = ByteBuffer.allocate({8 * len(fnames)} * n).order(ByteOrder.LITTLE_ENDIAN);
    for (int f = 0; f < {len(fnames)}; f++)
      for (int i = 0; i < n; i++) {{
        double x = in.getDouble(8 * i);
        double x2 = {width} == 2 ? in.getDouble(8 * (n + i)) : 0.0;
        out.putDouble({calls});
      }}
    Files.write(Paths.get(a[1]), out.array());
  }}
}}
""")
    subprocess.run([javac, "-d", str(tmp_path), str(tmp_path / "StrictRef.java")], check=True,
                   capture_output=True)
    data = x if x2 is None else np.concatenate([x, x2])
    (tmp_path / "in.bin").write_bytes(data.astype("<f8").tobytes())
    subprocess.run([java, "-cp", str(tmp_path), "StrictRef", str(tmp_path / "in.bin"),
                    str(tmp_path / "out.bin")], check=True, capture_output=True)
    ref = np.frombuffer((tmp_path / "out.bin").read_bytes(),
                        dtype="<f8").reshape(len(fnames), x.size)
    for row, fname in enumerate(fnames):
        y = getattr(fdlibm, fname)(x) if x2 is None else getattr(fdlibm, fname)(x, x2)
        same = (bits(y) == bits(ref[row])) | (np.isnan(y) & np.isnan(ref[row]))
        bad = np.flatnonzero(~same)
        if bad.size:
            at = f"{x[bad[0]]!r}" + ("" if x2 is None else f", {x2[bad[0]]!r}")
            raise AssertionError(f"{fname}({at}): ours {y[bad[0]]!r}, "
                                 f"StrictMath {ref[row][bad[0]]!r} ({bad.size} of {x.size})")
