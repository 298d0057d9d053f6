"""The libm-free transcendentals next to numpy's (platform libm / SIMD) ones.

    python scripts/bench_fdlibm.py [--n 1000000] [--repeats 9] [--json OUT]

Times gradtool.fdlibm's exp, log, tanh (the CPU reference's, compiled C when a
compiler is present) and numpy's np.exp, np.log, np.tanh on the same 10^6
float64 inputs, interleaved; prints the median ns per element and the ratio.
A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from gradtool import fdlibm

CASES = [("exp", fdlibm.exp, np.exp, (-700.0, 700.0)),
         ("log", fdlibm.log, np.log, (1e-300, 1e300)),
         ("tanh", fdlibm.tanh, np.tanh, (-20.0, 20.0))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    for name, ours, theirs, (lo, hi) in CASES:
        x = (np.exp(rng.uniform(np.log(lo), np.log(hi), args.n)) if name == "log"
             else rng.uniform(lo, hi, args.n))
        ours(x), theirs(x)                          # warm-up (and the native build)
        t_ours, t_np = [], []
        for _ in range(args.repeats):
            for fn, out in ((ours, t_ours), (theirs, t_np)):
                t0 = time.perf_counter()
                fn(x)
                out.append(time.perf_counter() - t0)
        a = statistics.median(t_ours) / args.n * 1e9
        b = statistics.median(t_np) / args.n * 1e9
        rows.append({"function": name, "gradtool_ns": a, "numpy_ns": b, "ratio": a / b})
        print(f"{name:5s}  gradtool.fdlibm {a:6.2f} ns/element   numpy {b:6.2f} ns/element   "
              f"ratio {a / b:5.1f}")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
