"""The float32 contract's accuracy (and one speed question), measured.

    python scripts/accuracy_f32.py sum  [--trials 20]
    nice -n 19 python scripts/accuracy_f32.py ulp exp log tanh erf [--state FILE]
    python scripts/accuracy_f32.py time [--reps 5]

``sum``: the lane-tree order (:mod:`gradtool.numerics32`) next to the serial float32 order
(``acc = acc + x[i]`` from +0.0, the f64 contract's order in binary32), for n = 10 ..
10^6 and three kinds of data: uniform [0, 1) (no cancellation: the error relative to the
sum is the error relative to sum|x|), standard normal (cancelling) and log-uniform
magnitudes over 2^-20 .. 2^20 with random signs.  The exact sum is ``math.fsum`` of the
float32 values widened to float64 (correctly rounded in float64: 2^-53 relative, far
below either order's error).  Reported per n and kind, over the trials: the largest
and the median of |sum - exact| / sum|x| in units of u = 2^-24, and the bound
``D(n)`` (gamma_D ~ D u) of the lane tree, next to the serial bound n - 1.

``ulp``: each float32 transcendental (``numerics32.unary``: fdlibm in float64, one
rounding; its C twin ``gt_real32.h``) over ALL 2^32 float32 inputs, in C
(``scripts/ulp_f32.c``), against glibc's long double functions: the largest error in
float32 ulps, an input reaching it, and how many results are not the correctly
rounded float32.  A few minutes of CPU per function; the state file keeps finished
chunks, so an interrupted run continues where it stopped.

``time``: would the lane-tree order be faster in float64 too?  C, one thread,
-O3 -march=native: one contiguous row of n doubles summed serially (the f64 contract)
and in the lane-tree order (``gt_tree_sum64``), best of ``--reps``; and numpy's
serial ``np.add.accumulate`` against the numpy tree.

A measurement, not a test; the numbers go to docs/numerics-f32.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gradtool import native  # noqa: E402
from gradtool import numerics32 as n32  # noqa: E402

U = 2.0 ** -24
FUNCTIONS = ["exp", "expm1", "log", "log1p", "tanh", "erf", "erfc", "sin", "cos", "atan"]
CHUNKS = 256                                 # the 2^32 inputs in 256 runs of 2^24


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ── sum ─────────────────────────────────────────────────────────────────────

def serial32(x: np.ndarray) -> float:
    """acc = +0.0f; acc = acc + x[i], i ascending (np.add.accumulate is sequential)."""
    return float(np.add.accumulate(x)[-1] + np.float32(0.0)) if x.size else 0.0


def data(kind: str, rng, n: int) -> np.ndarray:
    if kind == "uniform":
        return rng.random(n).astype(np.float32)
    if kind == "normal":
        return rng.standard_normal(n).astype(np.float32)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return (sign * 2.0 ** rng.uniform(-20, 20, n)).astype(np.float32)


def cmd_sum(args) -> None:
    rng = np.random.default_rng(20261205)
    print(f"CPU: {cpu_name()} (results do not depend on it)")
    print("errors |sum - exact| / sum|x| in units of u = 2^-24: max (median) over "
          f"{args.trials} trials")
    print(f"{'n':>8} {'data':>10} {'lane tree':>18} {'serial f32':>20} "
          f"{'tree bound D':>12} {'serial bound':>12}")
    for n in (10, 100, 1000, 10_000, 100_000, 1_000_000):
        for kind in ("uniform", "normal", "loguniform"):
            tree, serial = [], []
            for _ in range(args.trials if n < 1_000_000 else max(3, args.trials // 4)):
                x = data(kind, rng, n)
                wide = x.astype(np.float64)
                exact = math.fsum(wide)
                l1 = math.fsum(np.abs(wide))
                tree.append(abs(float(n32.sum(x)) - exact) / l1 / U)
                serial.append(abs(serial32(x) - exact) / l1 / U)
            print(f"{n:>8} {kind:>10} {max(tree):>8.3f} ({statistics.median(tree):6.3f}) "
                  f"{max(serial):>10.3f} ({statistics.median(serial):7.3f}) "
                  f"{n32.sum_depth(n):>12} {n - 1:>12}", flush=True)


# ── ulp ─────────────────────────────────────────────────────────────────────

class Stats(ctypes.Structure):
    _fields_ = [("max_ulp", ctypes.c_double), ("worst", ctypes.c_uint),
                ("not_rounded", ctypes.c_longlong), ("special_bad", ctypes.c_longlong),
                ("count", ctypes.c_longlong)]


def sweep_library():
    src = ROOT / "scripts" / "ulp_f32.c"
    keys = [native.CSRC / "gt_real32.h", native.CSRC / "gt_math.h"]
    lib = ctypes.CDLL(str(native.build_best("ulp_f32", src, native.SAFE_FLAGS, keys)))
    lib.ulp_sweep.argtypes = [ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong,
                              ctypes.POINTER(Stats)]
    lib.ulp_sweep.restype = None
    return lib


def _save(path: Path, state: dict) -> None:
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    os.replace(tmp, path)                    # atomic: a killed run leaves the old state


def cmd_ulp(args) -> None:
    lib = sweep_library()
    path = Path(args.state)
    state = json.loads(path.read_text()) if path.exists() else {}
    step = (1 << 32) // CHUNKS
    for name in args.functions:
        which = FUNCTIONS.index(name)
        done = state.setdefault(name, {})
        started = time.time()
        for chunk in range(CHUNKS):
            if str(chunk) in done:
                continue
            st = Stats()
            lib.ulp_sweep(which, chunk * step, (chunk + 1) * step, ctypes.byref(st))
            done[str(chunk)] = [st.max_ulp, st.worst, st.not_rounded, st.special_bad, st.count]
            _save(path, state)
            if chunk % 16 == 15:
                print(f"{name}: {chunk + 1}/{CHUNKS} chunks, {time.time() - started:.0f} s",
                      flush=True)
        report_ulp(name, done)


def report_ulp(name: str, done: dict) -> None:
    rows = list(done.values())
    count = sum(r[4] for r in rows)
    best = max(rows, key=lambda r: r[0])
    x = np.array([best[1]], dtype=np.uint32).view(np.float32)[0]
    print(f"{name}: {count} inputs{'' if count == 1 << 32 else ' (INCOMPLETE)'}; "
          f"max {best[0]:.10f} ulp at x = {float(x)!r} (0x{best[1]:08x}); "
          f"{sum(r[2] for r in rows)} not correctly rounded; "
          f"{sum(r[3] for r in rows)} special cases differ from (float) of the reference")


# ── time ────────────────────────────────────────────────────────────────────

TIME_C = r"""
#include <time.h>
#include "gt_real32.h"
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
/* seconds per call, best of reps; which 0: serial from 0.0, 1: lane tree */
double time_sum64(int which, const double *x, long long n, int reps, double *result)
{
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        long long inner = n < 100000 ? 1000000 / (n + 1) + 1 : 1;
        double t = now(), s = 0.0;
        for (long long k = 0; k < inner; ++k) {
            __asm__ volatile("" : : "r"(x) : "memory");   /* x may have changed: sum again */
            if (which == 0) {
                double acc = 0.0;
                for (long long i = 0; i < n; ++i) acc = acc + x[i];
                s = acc;
            } else {
                s = gt_tree_sum64(x, n, 1);
            }
            __asm__ volatile("" : : "g"(&s) : "memory");
        }
        t = (now() - t) / inner;
        if (t < best) best = t;
        *result = s;
    }
    return best;
}
"""


def cmd_time(args) -> None:
    src = Path(os.environ.get("TMPDIR", "/tmp")) / "gt_time_sum64.c"
    src.write_text(TIME_C)
    lib = ctypes.CDLL(str(native.build_best("gt_time_sum64", src, native.SAFE_FLAGS,
                                            [native.CSRC / "gt_real32.h"])))
    lib.time_sum64.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int,
                               ctypes.POINTER(ctypes.c_double)]
    lib.time_sum64.restype = ctypes.c_double
    rng = np.random.default_rng(1)
    print(f"CPU: {cpu_name()}; one thread; best of {args.reps}")
    print(f"{'n':>9} {'C serial':>10} {'C tree':>10} {'ratio':>6}   "
          f"{'numpy serial':>12} {'numpy tree':>11} {'ratio':>6}")
    for n in (10, 100, 1000, 10_000, 100_000, 1_000_000):
        x = rng.standard_normal(n)
        out = ctypes.c_double()
        ts = lib.time_sum64(0, x.ctypes.data, n, args.reps, ctypes.byref(out))
        tt = lib.time_sum64(1, x.ctypes.data, n, args.reps, ctypes.byref(out))
        inner = max(1, 200_000 // n)
        ps = pt = 1e30
        for _ in range(args.reps):
            t = time.perf_counter()
            for _ in range(inner):
                np.add.accumulate(x)[-1:] + 0.0
            ps = min(ps, (time.perf_counter() - t) / inner)
            t = time.perf_counter()
            for _ in range(inner):
                n32._lane_tree(x[:, None])
            pt = min(pt, (time.perf_counter() - t) / inner)
        print(f"{n:>9} {ts * 1e6:>8.2f}us {tt * 1e6:>8.2f}us {ts / tt:>6.2f}   "
              f"{ps * 1e6:>10.1f}us {pt * 1e6:>9.1f}us {ps / pt:>6.2f}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("sum", help="the lane-tree and serial float32 sums against exact sums")
    p.add_argument("--trials", type=int, default=20)
    p = sub.add_parser("ulp", help="largest ulp error of the float32 functions, all inputs")
    p.add_argument("functions", nargs="+", choices=FUNCTIONS)
    p.add_argument("--state", default=str(Path(tempfile.gettempdir()) / "gt_accuracy_f32_ulp.json"),
                   help="finished chunks are kept here (default: in the temp folder); "
                        "run again with the same file to continue or to print the report")
    p = sub.add_parser("time", help="the lane-tree order against the serial one in float64")
    p.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    {"sum": cmd_sum, "ulp": cmd_ulp, "time": cmd_time}[args.cmd](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
