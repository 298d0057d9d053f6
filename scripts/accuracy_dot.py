"""Inner-product accuracy: the FMA chain (numerics version 2) next to the old contract (1).

    python scripts/accuracy_dot.py [--trials 200] [--n 784]

For dot products of length n it computes, per trial, the exact value (Python
fractions), the FMA chain ``acc = fma(x[k], y[k], acc)`` from +0.0 (the contract
every gradtool inner product now follows; numerics.fma, the exact numpy
emulation, so no hardware is involved) and the old contract ``acc = acc +
x[k]*y[k]`` (product rounded, then the sum), and reports each one's error in
units of the exact result's last place (ulps) and relative to the condition
bound sum|x*y| (the error a dot product can be blamed for).  Inputs:

* random   x, y standard normal (condition number sum|x*y| / |x.y| ~ sqrt(n));
* ill-conditioned   Ogita, Rump and Oishi's GenDot (SIAM J. Sci. Comput. 26(6),
  2005, "Accurate sum and dot product", section 6): vectors whose dot product has
  a condition number near 10^8, 10^16, 10^24 -- beyond 10^16 no
  double-precision recurrence keeps a correct digit, and the table shows it.

A measurement, not a test; the numbers go to docs/cpu-kernels.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gradtool import numerics as nx  # noqa: E402


def exact_dot(x, y) -> Fraction:
    return sum((Fraction(a) * Fraction(b) for a, b in zip(x.tolist(), y.tolist())), Fraction(0))


def gen_dot(rng, n: int, cond: float):
    """Ogita-Rump-Oishi GenDot: x, y of length n with cond(x.y) about ``cond``."""
    b = np.log2(cond)
    n2 = n // 2
    x, y = np.empty(n), np.empty(n)
    e = np.round(rng.random(n2) * b / 2)
    e[0], e[-1] = np.round(b / 2) + 1, 0
    x[:n2] = (2 * rng.random(n2) - 1) * 2.0 ** e
    y[:n2] = (2 * rng.random(n2) - 1) * 2.0 ** e
    partial = exact_dot(x[:n2], y[:n2])
    for i, ei in zip(range(n2, n), np.round(np.linspace(b / 2, 0, n - n2))):
        x[i] = (2 * rng.random() - 1) * 2.0 ** ei
        y[i] = float(((2 * rng.random() - 1) * Fraction(2.0 ** ei) - partial) / Fraction(x[i]))
        partial += Fraction(x[i]) * Fraction(y[i])
    order = rng.permutation(n)
    return x[order], y[order]


def chains(xs, ys):
    """(FMA chain, old contract) for every row pair, vectorised over the rows."""
    fma_acc = np.zeros(xs.shape[0])
    old_acc = np.zeros(xs.shape[0])
    for k in range(xs.shape[1]):
        fma_acc = nx.fma(xs[:, k], ys[:, k], fma_acc)
        old_acc = old_acc + xs[:, k] * ys[:, k]
    return fma_acc, old_acc


def ulps(got: float, exact: Fraction) -> float:
    """|got - exact| in units of the last place of the exact value rounded to a double."""
    ref = float(exact)
    ulp = np.spacing(abs(ref)) if ref != 0 else np.spacing(0.0)
    return float(abs(Fraction(got) - exact) / Fraction(ulp))


def report(name, xs, ys):
    fma_acc, old_acc = chains(xs, ys)
    rows = {"fma": [], "old": []}
    rel = {"fma": [], "old": []}
    conds = []
    for t in range(xs.shape[0]):
        exact = exact_dot(xs[t], ys[t])
        scale = exact_dot(np.abs(xs[t]), np.abs(ys[t]))
        conds.append(float(scale / abs(exact)) if exact else float("inf"))
        for key, got in (("fma", fma_acc[t]), ("old", old_acc[t])):
            rows[key].append(ulps(float(got), exact))
            rel[key].append(float(abs(Fraction(float(got)) - exact) / scale))
    better = sum(f < o for f, o in zip(rows["fma"], rows["old"]))
    worse = sum(f > o for f, o in zip(rows["fma"], rows["old"]))
    print(f"{name:22} cond~{statistics.median(conds):8.1e}  "
          f"ulps median fma {statistics.median(rows['fma']):9.3g} old "
          f"{statistics.median(rows['old']):9.3g}  max fma {max(rows['fma']):9.3g} old "
          f"{max(rows['old']):9.3g}  err/sum|xy| max fma {max(rel['fma']):8.2e} old "
          f"{max(rel['old']):8.2e}  fma closer {better}, farther {worse}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--n", type=int, default=784)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    n, t = args.n, args.trials
    print(f"# n = {n}, {t} trials per row; errors against the exact dot product (fractions)")
    report("random normal", rng.standard_normal((t, n)), rng.standard_normal((t, n)))
    for cond in (1e8, 1e16, 1e24):
        pairs = [gen_dot(rng, min(n, 100), cond) for _ in range(t)]
        report(f"GenDot n={min(n, 100)} c={cond:.0e}", np.array([p[0] for p in pairs]),
               np.array([p[1] for p in pairs]))


if __name__ == "__main__":
    main()
