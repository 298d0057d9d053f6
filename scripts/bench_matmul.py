"""Matrix product speed: gradtool's FMA-chain kernel next to PyTorch float64 and the machine's peak.

    python scripts/bench_matmul.py [--repeats 7] [--samples 10] [--min-sample 0.0002]
                                   [--json out.json]

For each shape (the MLP benchmarks' products, forward and backward, with
their transposed operands as strided views of contiguous arrays, as the
backward rules pass them) it times ``gradtool.numerics.matmul`` -- what
the cpu engine's steps call, the compiled kernel of csrc/gt_matmul.h, which
also runs the host backend's matmul launches -- and ``torch.mm`` on the same
float64 operands, each with 1 thread and with all usable cores,
interleaved, both the same way: ``--repeats`` x ``--samples`` samples of one
call each (of as many back-to-back calls as take ``--min-sample`` seconds:
0.2 ms by default, so the small products), each right after one untimed
call that wakes the library's threads; the figure is the median wall time.
``--min-sample 0.02`` times runs of back-to-back calls instead.
GFLOP/s counts 2*M*K*N per product.

The peak is measured, not looked up, and in the same run, next to every
sample: a small C loop (compiled here with the project's flags) of
independent vector multiply-then-add chains of the kernel's own vector
width, which is the most the old serial-k contract (a multiply and an add
instruction per term, never fused) allowed one core; and the same loop
compiled with contraction into FMA, which is the most the FMA chain
(numerics.matmul: one vfmadd per term) and a BLAS can reach.  The FMA loop
runs for as long as a sample, before and after each one, so that on a
shared or throttled machine the kernel and its peak see the same
conditions.  The "%fma" columns are the median over the samples of each
sample's GFLOP/s over the mean of the two peaks next to it (times the
threads for the threaded column: one core's loop, so a second core busy
with something else counts against the library), for gradtool and, on the
same footing, for torch.  The CPU is warmed up (its
clock ramps up over about 0.1 s from idle) before anything is timed, and
glibc keeps freed memory as the training engine has it
(``native.keep_freed_memory``), so each product's output is allocated as
in a training step.  The peak loop touches no memory, so a machine whose
other cores load the caches and memory slows the kernel more than its
peak: on a shared machine "%fma" measures that load too.  A benchmark, not
a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gradtool import native  # noqa: E402
from gradtool import numerics as nx  # noqa: E402

# (label, M, K, N, A transposed, B transposed)
SHAPES = [
    ("784-256-10 fwd 1     X@W1", 128, 784, 256, False, False),
    ("784-256-10 dW1     X^T@G1", 784, 128, 256, True, False),
    ("784-256-10 fwd 2     H@W2", 128, 256, 10, False, False),
    ("784-256-10 dH     G2@W2^T", 128, 10, 256, False, True),
    ("784-256-10 dW2   H^T@G2  ", 256, 128, 10, True, False),
    ("64-128-10 fwd 1      X@W1", 64, 64, 128, False, False),
    ("autoencoder        H1@W2", 200, 64, 32, False, False),
    ("autoencoder     H1^T@G2 ", 64, 200, 32, True, False),
    ("square 256", 256, 256, 256, False, False),
    ("square 512", 512, 512, 512, False, False),
    ("square 1024", 1024, 1024, 1024, False, False),
]

PEAK_C = r"""
#include <string.h>
#include <time.h>
#ifndef REAL
#  define REAL double
#endif
#if defined(__AVX512F__)
#  define VB 64
#elif defined(__AVX__)
#  define VB 32
#else
#  define VB 16
#endif
#define LANES ((int)(VB / sizeof(REAL)))
typedef REAL v __attribute__((vector_size(VB)));
/* 16 independent chains a = a*b + c of REAL lanes (a multiply then an add, or one FMA
 * when contraction is on), `iters` times: enough chains in flight to keep every vector
 * port busy.  Stores the flop count; returns the seconds taken. */
double peak(long long iters, double *flops)
{
    v a[16], b, c;
    memset(&b, 0, sizeof b); memset(&c, 0, sizeof c);
    for (int l = 0; l < LANES; ++l) { b[l] = (REAL)0.9999999; c[l] = (REAL)1e-3; }
    for (int i = 0; i < 16; ++i) { a[i] = c; a[i][0] = (REAL)i; }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long long k = 0; k < iters; ++k)
        for (int i = 0; i < 16; ++i) a[i] = a[i] * b + c;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = 0;
    for (int i = 0; i < 16; ++i) s += a[i][0];
    *flops = (double)iters * 16 * 2 * LANES + 0 * s;
    return (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
}
"""

# the C element type of the peak loop per numpy dtype name: the kernel's own lanes
PEAK_TYPES = {"float64": "double", "float32": "float"}


class Peak:
    """The peak loops, compiled once (``ok`` False without a compiler), on vectors of
    ``dtype`` ("float64": doubles, the f64 kernel's; "float32": floats, numerics32's)."""

    def __init__(self, tmp: Path, dtype: str = "float64"):
        self.libs = {}
        real = PEAK_TYPES[np.dtype(dtype).name]
        src = tmp / f"peak_{real}.c"
        src.write_text(PEAK_C)
        for contract in ("off", "fast"):
            lib_path = tmp / f"peak_{real}_{contract}.so"
            cmd = [native.compiler(), "-O3", f"-ffp-contract={contract}", "-shared", "-fPIC",
                   "-march=native", f"-DREAL={real}", str(src), "-o", str(lib_path)]
            try:
                if subprocess.run(cmd, capture_output=True, timeout=120).returncode != 0:
                    return
                lib = ctypes.CDLL(str(lib_path))
            except (native.NativeUnavailable, OSError, subprocess.SubprocessError):
                return
            lib.peak.restype = ctypes.c_double
            lib.peak.argtypes = [ctypes.c_longlong, ctypes.POINTER(ctypes.c_double)]
            self.libs[contract] = lib
        self.iters_per_s = {}

    @property
    def ok(self) -> bool:
        return len(self.libs) == 2

    def gflops(self, contract: str, seconds: float) -> float:
        """One core's GFLOP/s, the loop run for about ``seconds``."""
        lib = self.libs[contract]
        flops = ctypes.c_double()
        if contract not in self.iters_per_s:           # calibrate once
            self.iters_per_s[contract] = 100_000 / lib.peak(100_000, ctypes.byref(flops))
        iters = max(200, int(self.iters_per_s[contract] * seconds))
        secs = lib.peak(iters, ctypes.byref(flops))
        return flops.value / secs / 1e9


def warm_up(peak, seconds=0.5):
    """Run the FMA loop until the core's clock has ramped up (about 0.1 s from idle)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        peak.gflops("fast", 0.01)


def operands(rng, m, k, n, at, bt, dtype=np.float64):
    """Normal A (m x k) and B (k x n) of ``dtype``; a transposed one is the strided view
    of a contiguous array, as the backward rules pass it."""
    def normal(shape):
        return rng.standard_normal(shape).astype(dtype, copy=False)
    a = normal((k, m)).T if at else normal((m, k))
    b = normal((n, k)).T if bt else normal((k, n))
    return a, b


def sampled(fn, peak, samples, flop, threads, min_sample):
    """([seconds per call], [fraction of the FMA peak]), one of each per sample.

    A sample is one call (or as many as take ``min_sample`` seconds, for small
    products), timed by the wall clock, between two runs of the FMA peak loop as
    long as the sample; its fraction is its GFLOP/s over ``threads`` times the
    mean of those two peaks.  One untimed call comes just before each sample: the
    peak loop runs on this thread alone, long enough for the pool's idle workers to
    go to sleep, and the call wakes them, so the timed call finds them awake, as
    a training step's products (which follow one another) and torch's
    back-to-back runs do."""
    fn()
    t0 = time.perf_counter()
    fn()
    calls = max(1, math.ceil(min_sample / max(time.perf_counter() - t0, 1e-9)))
    window = (time.perf_counter() - t0) * calls
    before = peak.gflops("fast", window) if peak.ok else None
    times, fracs = [], []
    for _ in range(samples):
        fn()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t = (time.perf_counter() - t0) / calls
        times.append(t)
        if peak.ok:
            after = peak.gflops("fast", window)
            fracs.append(flop / t / 1e9 / (threads * (before + after) / 2))
            before = after
    return times, fracs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--samples", type=int, default=10,
                    help="samples per repeat, library and thread count")
    ap.add_argument("--min-sample", type=float, default=2e-4,
                    help="seconds of back-to-back calls a sample lasts at least (one call "
                         "when a call takes longer)")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    if nx.cpu_kernels() is None:
        sys.exit("bench_matmul: the compiled kernel is unavailable (no C compiler?)")
    cores = native.num_threads()
    try:
        import torch
        torch_threads = torch.get_num_threads()
        torch_note = f"torch {torch.__version__} ({torch_threads} threads by default)"
    except ImportError:
        torch, torch_note = None, "torch not installed: its columns are skipped"
    cfg = nx.matmul_config()
    native.keep_freed_memory()            # as the training engine has it
    tmp = tempfile.TemporaryDirectory()
    peak = Peak(Path(tmp.name))
    sep = fused = None
    if peak.ok:
        warm_up(peak)
        sep = statistics.median(peak.gflops("off", 0.02) for _ in range(5))
        fused = statistics.median(peak.gflops("fast", 0.02) for _ in range(5))
    print(f"# {os.cpu_count()} cores, gradtool threads {cores} (GRADTOOL_NUM_THREADS or the "
          f"usable cores), {torch_note}")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "unknown CPU") \
        if os.path.exists("/proc/cpuinfo") else "unknown CPU"
    print(f"# {cpu}")
    print(f"# kernel tile {cfg['rows']} x {cfg['cols']} ({cfg['lanes']} doubles per vector), "
          f"{'vector FMA instructions' if cfg.get('vector_fma') else 'libm fma() per element'}, "
          f"serial below {cfg['serial_below']} multiply-adds")
    if sep:
        print(f"# peak per core at the start (median of 5 x 0.02 s, after a 0.5 s warm-up): "
              f"{sep:.1f} GFLOP/s with separate multiply and add, {fused:.1f} with FMA")
    print(f"# GFLOP/s of the median wall time: gradtool and torch alike, {args.repeats} x "
          f"{args.samples} samples of one call (or >= {1e3 * args.min_sample:g} ms of "
          f"back-to-back calls) right after an untimed one, interleaved; ratio = gradtool time "
          f"/ torch time, both on {cores} threads; %fma = median over the samples of each one's "
          f"GFLOP/s over the FMA peak loop run just before and after it (x {cores} for the "
          f"{cores}-thread columns)")
    head = (f"{'product':28} {'M':>5} {'K':>5} {'N':>5} {'gt 1 thr':>9} {'gt ' + str(cores):>9} "
            f"{'torch 1':>9} {'torch ' + str(cores):>9} {'ratio':>6} {'%fma 1':>7} "
            f"{'%fma ' + str(cores):>7} {'torch %1':>8} {'torch %' + str(cores):>8}")
    print(head)
    rng = np.random.default_rng(0)
    rows = []
    for label, m, k, n, at, bt in SHAPES:
        a, b = operands(rng, m, k, n, at, bt)
        runs = {"gt1": [], "gtN": [], "t1": [], "tN": []}
        frac = {key: [] for key in runs}
        flop = 2.0 * m * k * n
        ta = tb = None
        if torch is not None:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        for _ in range(args.repeats):
            for key, threads in (("gt1", 1), ("gtN", cores)):
                native.set_num_threads(threads)
                times, fracs = sampled(lambda: nx.matmul(a, b), peak, args.samples, flop, threads,
                                       args.min_sample)
                runs[key] += times
                frac[key] += fracs
            if torch is not None:
                for key, threads in (("t1", 1), ("tN", cores)):
                    torch.set_num_threads(threads)
                    times, fracs = sampled(lambda: torch.mm(ta, tb), peak, args.samples, flop,
                                           threads, args.min_sample)
                    runs[key] += times
                    frac[key] += fracs
        native.set_num_threads(None)
        if torch is not None:
            torch.set_num_threads(torch_threads)
        med = {key: statistics.median(v) if v else None for key, v in runs.items()}
        gf = {key: (flop / t / 1e9 if t else None) for key, t in med.items()}
        ratio = med["gtN"] / med["tN"] if med["tN"] else None
        cols = [f"{gf[key]:9.1f}" if gf[key] else f"{'-':>9}" for key in ("gt1", "gtN", "t1", "tN")]
        cols.append(f"{ratio:6.2f}" if ratio else f"{'-':>6}")
        pct = {key: statistics.median(v) if v else None for key, v in frac.items()}
        cols += [f"{100 * pct[key]:6.0f}%" if pct[key] else f"{'-':>7}" for key in ("gt1", "gtN")]
        cols += [f"{100 * pct[key]:7.0f}%" if pct[key] else f"{'-':>8}" for key in ("t1", "tN")]
        print(f"{label:28} {m:5d} {k:5d} {n:5d} {' '.join(cols)}")
        rows.append({"product": label.strip(), "M": m, "K": k, "N": n, "a_transposed": at,
                     "b_transposed": bt, "seconds": med, "gflops": gf, "ratio": ratio,
                     "fraction_of_fma_peak": pct})
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(
            {"cores": os.cpu_count(), "threads": cores, "torch": torch_note, "tile": cfg,
             "peak_gflops_core": {"mul_add": sep, "fma": fused}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
