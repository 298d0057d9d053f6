"""The compiled FMA-chain matmul (csrc/gt_matmul.h) against the numpy spec, bit for bit.

One kernel serves the CPU reference (numerics.matmul/bmm) and the host backend's
matmul launches; these tests drive it directly, in every build (AVX-512, AVX2,
16-byte vectors, the plain-C portable tile, the libm-fma() build GRADTOOL_NO_FMA
gives), every operand layout, thread counts 1, 2, 3 and 7, accumulating or not, on
special values; then the floating-point mode policy, where FMA instructions may be
(the micro-kernels only), fork() and concurrent callers.  The reference is
numerics.matmul_numpy, the k loop in numpy (each output element c = +0.0;
c = fma(a, b, c) for k ascending, numerics.fma: the exact emulation), itself checked
against Python loops and the machine's fma in test_numerics.py.
"""

import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_bits_equal_nan_any, require_c_compiler
from support import (GRADTOOL, cpu_flags, cpu_libraries, functions_with_fused_multiply_adds,
                     layouts, product, run_no_fma)
from support_backends import run_c_program
from gradtool import native
from gradtool import numerics as nx
from gradtool.errors import GradtoolError

ROOT = Path(__file__).resolve().parent.parent
THREADS = (1, 2, 3, 7)
DIMS = (1, 2, 3, 4, 5, 7, 8, 11, 13, 16, 17, 31, 32, 33, 37, 61, 64, 97, 128, 131, 257, 300)


@pytest.fixture(scope="module")
def libraries():
    return cpu_libraries()


def operand(rng, shape):
    """Normal values over 16 decades, so that sums round, with special values sprinkled in."""
    x = rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 9, shape)
    specials = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 5e-324, -1e-310, 1e308, -1e308])
    if x.size:
        hit = rng.random(shape) < 0.02
        x[hit] = rng.choice(specials, int(hit.sum()))
    return x


def reference(a, b, c0=None):
    with np.errstate(all="ignore"):
        s = nx.matmul_numpy(a, b) if a.ndim == 2 else nx.bmm_numpy(a, b)
        return s if c0 is None else c0 + s


def sampled_shapes(rng, count):
    """Edge and prime shapes always, then random triples from DIMS (capped in work)."""
    shapes = [(1, 1, 1), (1, 300, 1), (300, 1, 300), (4, 32, 32), (5, 33, 31), (131, 257, 61),
              (300, 300, 300), (3, 0, 5), (128, 784, 37), (64, 40, 497)]
    while len(shapes) < count:
        m, k, n = (int(rng.choice(DIMS)) for _ in range(3))
        if m * k * n <= 2_000_000:
            shapes.append((m, k, n))
    return shapes


def test_every_build_layout_and_thread_count_matches_the_naive_order(libraries, rng,
                                                                       threads_restored):
    before = {name: nx.matmul_config(lib)["threaded_runs"] for name, lib in libraries.items()}
    for m, k, n in sampled_shapes(rng, 36):
        a, b = operand(rng, (m, k)), operand(rng, (k, n))
        c0 = operand(rng, (m, n))
        want, want_acc = reference(a, b), reference(a, b, c0)
        for t in THREADS:
            native.set_num_threads(t)
            for name, lib in libraries.items():
                for case, (x, y) in layouts(a, b).items():
                    what = f"{name} build, {t} threads, {case}, M K N = {m} {k} {n}"
                    assert_bits_equal_nan_any(product(lib, x, y), want, what)
                assert_bits_equal_nan_any(product(lib, a, b, c0), want_acc, what + ", +=")
    for name, lib in libraries.items():      # the threaded code really ran, in every build
        assert nx.matmul_config(lib)["threaded_runs"] > before[name], name


def test_batched_products_with_strided_operands(libraries, rng, threads_restored):
    for bt, m, k, n in [(1, 9, 17, 33), (3, 64, 40, 70), (5, 7, 1, 3), (8, 33, 64, 32),
                        (2, 130, 5, 129), (4, 96, 80, 100), (16, 40, 50, 40)]:
        a, b = operand(rng, (bt, m, k)), operand(rng, (bt, k, n))
        c0 = operand(rng, (bt, m, n))
        want, want_acc = reference(a, b), reference(a, b, c0)
        for t in THREADS:
            native.set_num_threads(t)
            for name, lib in libraries.items():
                for case, (x, y) in layouts(a, b).items():
                    what = f"{name}, {t} threads, bmm {case} {bt}x{m}x{k}x{n}"
                    assert_bits_equal_nan_any(product(lib, x, y), want, what)
                assert_bits_equal_nan_any(product(lib, a, b, c0), want_acc, f"{name} bmm +=")
    # a broadcast (stride 0) batch operand is just another stride
    a = operand(rng, (1, 20, 30))
    b = operand(rng, (4, 30, 50))
    a4 = np.broadcast_to(a, (4, 20, 30))
    assert_bits_equal_nan_any(nx.bmm(a4, b), reference(np.ascontiguousarray(a4), b), "stride 0")


def test_special_values_signed_zeros_subnormals_and_k0(libraries, threads_restored):
    """Every IEEE case the serial order defines: inf*0 = NaN, inf - inf, overflow,
    gradual underflow, -0.0 + -0.0 = -0.0 but 0.0 start + -0.0 = +0.0, K = 0."""
    a = np.array([[np.inf, 0.0, 1.0], [-0.0, -0.0, -0.0], [1e308, 1e308, -1e308],
                  [5e-324, 2.5e-308, -1e-310], [np.nan, 1.0, 2.0], [1.0, -np.inf, np.inf]])
    b = np.array([[0.0, 1.0, -0.0, 1e-300], [1.0, 2.0, -0.0, 0.5],
                  [np.inf, 1.0, -0.0, 1e-10]])
    for t in THREADS:
        native.set_num_threads(t)
        for name, lib in libraries.items():
            for case, (x, y) in layouts(a, b).items():
                assert_bits_equal_nan_any(product(lib, x, y), reference(a, b), f"{name} {case}")
            # three -0.0 products: 0.0 + -0.0 + ... is +0.0, never -0.0
            got = product(lib, a, b)
            assert not np.signbit(got[1, 1]) and got[1, 1] == 0.0
            # K = 0: every element is the 0.0 start; accumulating adds +0.0 (-0.0 -> +0.0)
            empty = product(lib, np.zeros((4, 0)), np.zeros((0, 5)))
            assert_bits_equal_nan_any(empty, np.zeros((4, 5)), f"{name} K=0")
            c0 = np.full((4, 5), -0.0)
            acc = product(lib, np.zeros((4, 0)), np.zeros((0, 5)), c0)
            assert not np.signbit(acc).any(), f"{name} K=0 +="


def test_numerics_entry_points_use_the_kernel_and_agree_with_numpy(rng):
    require_c_compiler()
    assert nx._native_kernels() is not None
    a, b = rng.standard_normal((70, 90)), rng.standard_normal((90, 40))
    assert_bits_equal_nan_any(nx.matmul(a, b), nx.matmul_numpy(a, b), "matmul")
    assert_bits_equal_nan_any(nx.matmul(b.T, a.T), nx.matmul_numpy(b.T, a.T), "transposed")
    # other dtypes, misaligned and non-element strides are copied first, not misread
    raw = np.zeros(70 * 90 * 8 + 1, dtype=np.uint8)[1:].view(np.float64).reshape(70, 90)
    raw[...] = a
    assert not raw.flags.aligned
    assert_bits_equal_nan_any(nx.matmul(raw, b), nx.matmul_numpy(a, b), "misaligned")
    assert_bits_equal_nan_any(nx.matmul(a.astype(np.float32), b),
                              nx.matmul_numpy(a.astype(np.float32).astype(np.float64), b),
                              "float32 operand")


def test_the_python_entry_takes_float64_views_and_refuses_the_rest(rng):
    """gt_mm_py (the arrays passed as themselves, read through the buffer protocol)
    computes what gt_mm does for every native float64 view, negative and zero strides
    included, and hands anything else back untouched (1): the general path then
    converts it."""
    require_c_compiler()
    if not native.python_flags():
        pytest.skip("this interpreter has no Python.h: the ctypes entry only")
    lib = nx.cpu_kernels()
    assert lib.py_mm is not None
    plain = nx.cpu_library(python=False)
    a, b = rng.standard_normal((3, 40, 50)), rng.standard_normal((3, 50, 30))
    views = [(a, b), (a[:, ::-1], b[:, :, ::-2]), (a[:, :, ::-1], b[::-1]),
             (np.broadcast_to(a[:1], a.shape), b), (np.swapaxes(a.copy(), 1, 2), b[:, ::-1])]
    for x, y in views:
        x, y = x[:, :, :y.shape[1]], y[:, :x.shape[2]]
        got = np.empty((x.shape[0], x.shape[1], y.shape[2]))
        assert lib.py_mm(got, x, y, 0) == 0
        want = np.empty_like(got)
        nx._native_product(plain, want, x, y, x.shape[0])
        assert_bits_equal_nan_any(got, want, f"strides {x.strides} {y.strides}")
        c0 = rng.standard_normal(got.shape)
        acc, acc_want = c0.copy(), c0.copy()
        assert lib.py_mm(acc, x, y, 1) == 0
        nx._native_product(plain, acc_want, x, y, x.shape[0], accumulate=True)
        assert_bits_equal_nan_any(acc, acc_want, "accumulating")
    two_d = np.empty((40, 30))                      # matmul's output: [M, N] for one item
    assert lib.py_mm(two_d, a[:1], b[:1], 0) == 0
    assert_bits_equal_nan_any(two_d, nx.matmul_numpy(a[0], b[0]), "2-d output")
    misaligned = np.zeros(3 * 40 * 50 * 8 + 1, np.uint8)[1:].view(np.float64).reshape(a.shape)
    refused = [(a.astype(np.float32), b), (a, b.astype(">f8")), (misaligned, b),
               (a[0], b[0]), (a, b[:2]), (a, b[:, :49])]
    for x, y in refused:
        out = np.full((3, 40, 30), 7.0)
        assert lib.py_mm(out, x, y, 0) == 1
        assert (out == 7.0).all()
    for bad_out in (np.empty((3, 30, 40)).transpose(0, 2, 1), np.empty((3, 40, 31)),
                    np.empty((3, 40, 30), np.float32), np.empty((40, 30)), [[0.0]]):
        assert lib.py_mm(bad_out, a, b, 0) == 1
    readonly = np.zeros((3, 40, 30))
    readonly.flags.writeable = False
    assert lib.py_mm(readonly, a, b, 0) == 1 and not readonly.any()
    # and matmul itself, through the entry, on an operand it refuses: converted first
    assert_bits_equal_nan_any(nx.matmul(a[0].astype(">f8"), b[0]),
                              nx.matmul_numpy(a[0], b[0]), "big-endian operand")


def test_the_python_entry_can_be_left_out(tmp_path):
    """GRADTOOL_PYTHON_ENTRY=0 builds the library without it (its own cache entry): the
    products go through ctypes, with the same bits."""
    require_c_compiler()
    script = ("import numpy as np\n"
              "from gradtool import numerics as nx\n"
              "lib = nx.cpu_kernels()\n"
              "assert lib.py_mm is None and lib.py_opt_step is None\n"
              "rng = np.random.default_rng(5)\n"
              "a, b = rng.standard_normal((70, 90)), rng.standard_normal((90, 40))\n"
              "got = nx.matmul(a, b.T.copy().T)\n"
              "assert got.tobytes() == nx.matmul_numpy(a, b).tobytes()\n"
              "print('ok')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), native.PYTHON_ENTRY_ENV: "0"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
    assert native.python_flags() == () or nx.cpu_kernels().py_mm is not None


def test_the_other_python_entries_match_their_ctypes_entries(rng):
    """The optimizer step, the select against +0.0 and the row sums, through their
    Python entries (the arrays themselves) and through ctypes: the same bits; an
    array the entry does not take as it is comes back untouched (1)."""
    require_c_compiler()
    lib = nx.cpu_kernels()
    if lib.py_opt_step is None:
        pytest.skip("this interpreter has no Python.h: the ctypes entries only")
    n = 5000
    w0, g, m0, v0 = (rng.standard_normal(n) for _ in range(4))
    v0 = np.abs(v0)
    for adam, clipped in ((1, 0), (1, 1), (0, 0), (0, 1)):
        args = (clipped, 0.5, 1e-3, 1e-2, 0.9, 0.999, 0.1, 0.001, 1e-8)
        w, m, v = w0.copy(), m0.copy(), v0.copy()
        assert lib.py_opt_step(adam, w, g, m if adam else None, v if adam else None, *args) == 0
        w2, m2, v2 = w0.copy(), m0.copy(), v0.copy()
        lib.gt_opt_step(adam, n, w2.ctypes.data, g.ctypes.data, m2.ctypes.data if adam else None,
                        v2.ctypes.data if adam else None, *args)
        for got, want in ((w, w2), (m, m2), (v, v2)):
            assert_bits_equal_nan_any(got, want, f"opt step adam={adam} clipped={clipped}")
    args = (0, 1.0, 0.0, 1e-2, 0.9, 0.999, 0.1, 0.001, 1e-8)
    for bad in ((w0.copy(), g[:-1], m0.copy(), v0.copy()), (w0.copy(), g, m0[::2].copy(), v0),
                (w0.copy(), g.astype(np.float32), m0.copy(), v0.copy()),
                (w0.reshape(50, 100).T.copy().T, g.reshape(50, 100), m0.copy(), v0.copy())):
        before = [x.copy() for x in bad]
        assert lib.py_opt_step(1, *bad, *args) == 1
        for x, y in zip(bad, before):
            assert_bits_equal_nan_any(x, y, "a refused step writes nothing")
    readonly = w0.copy()
    readonly.flags.writeable = False
    assert lib.py_opt_step(0, readonly, g, None, None, *args) == 1

    cond, keep = rng.random((30, 40)) < 0.5, rng.standard_normal((30, 40))
    keep[0, :4] = [-0.0, np.inf, -np.nan, 5e-324]
    for invert in (0, 1):
        out, want = np.empty_like(keep), np.empty_like(keep)
        assert lib.py_select_zero(cond, keep, out, invert) == 0
        lib.gt_select_zero(keep.size, cond.ctypes.data, keep.ctypes.data, want.ctypes.data,
                           invert)
        assert out.tobytes() == want.tobytes()
    out = np.full_like(keep, 7.0)
    for c, k in ((cond.astype(np.int8), keep), (cond, keep[:, :-1]), (cond[:, ::2], keep[:, :20])):
        assert lib.py_select_zero(c, k, out, 0) == 1 and (out == 7.0).all()

    src = rng.standard_normal((6, 7, 5))
    for outer, k, inner, rows in ((6, 35, 1, 1), (6, 7, 5, 0), (1, 210, 1, 1)):
        total, want = np.empty(k), np.empty(k)
        assert lib.py_sum(outer, k, inner, src, total, rows) == 0
        if rows:
            lib.gt_sum_rows(outer, k, src.ctypes.data, want.ctypes.data)
        else:
            lib.gt_sum_outer_inner(outer, k, inner, src.ctypes.data, want.ctypes.data)
        assert_bits_equal_nan_any(total, want, f"sums {outer} {k} {inner}")
    total = np.full(7, 7.0)
    for bad_src, bad_k in ((src[:, :, ::-1], 7), (src, 8), (src.astype(np.float32), 7)):
        assert lib.py_sum(6, bad_k, 5, bad_src, total if bad_k == 7 else np.empty(8), 0) == 1
    assert (total == 7.0).all()


def test_the_python_entry_releases_the_gil_for_the_product(rng, threads_restored):
    """Another Python thread runs while a product computes (as it did through ctypes).
    A thread that held the GIL through a product would not let the counting thread run
    at all during it, whatever the switch interval (measured: 0 counts in every call,
    through ctypes.PyDLL's gt_mm), so each call must see the count move.  Each product
    takes about 50 ms on one thread, far longer than the operating system takes to give
    the counting thread a core on a loaded machine (600^3 products of 5 ms saw 0 counts
    in 3 of 5 calls with both cores busy: a test of the load, not of the GIL)."""
    require_c_compiler()
    if nx.cpu_kernels().py_mm is None:
        pytest.skip("the ctypes entry only")
    native.set_num_threads(1)
    a, b = rng.standard_normal((1200, 1200)), rng.standard_normal((1200, 1200))
    count, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.05)
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        during = []
        for _ in range(3):
            before = count[0]
            nx.matmul(a, b)                # about 50 ms on one thread
            during.append(count[0] - before)
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(interval)
    assert min(during) > 0, during


def test_fused_multiply_adds_only_in_the_inner_products(libraries):
    """-ffp-contract=off keeps every elementwise a*b and s + p separate: the disassembly
    shows FMA instructions (or fma() calls) in the matmul micro-kernels (gt_mm_k*, the
    out-of-memory element loop gt_mm_naive, or k_matmul's per-thread body) and nowhere
    else; the native build on a CPU with FMA
    uses the instruction, the GRADTOOL_NO_FMA build calls libm's fma() instead."""
    from gradtool.device.host import library_path, load_library
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump is not installed")
    paths = {name: Path(lib._name) for name, lib in libraries.items()}
    for variant in ("tiled", "per-thread"):
        load_library("f64", variant)
        paths[variant] = library_path("f64", native.native_arch_wanted(), variant)
    for name, path in paths.items():
        found = functions_with_fused_multiply_adds(objdump, path)
        assert found, f"{name}: no fused multiply-add at all in {path}"
        allowed = ("k_matmul",) if name == "per-thread" else ("gt_mm_k", "gt_mm_naive")
        stray = {f: v[:2] for f, v in found.items() if not f.startswith(allowed)}
        assert not stray, f"{name}: fused multiply-adds outside the inner products: {stray}"
        kinds = {"call" if "fma@plt" in line or "fmaf@plt" in line else "instruction"
                 for lines in found.values() for line in lines}
        if name == "no-fma":
            assert kinds == {"call"}, f"{name}: {kinds}"
            assert nx.matmul_config(libraries[name])["vector_fma"] == 0
        if name == "native" and " fma " in cpu_flags() + " ":
            assert "instruction" in kinds
            assert nx.matmul_config(libraries[name])["vector_fma"] == 1


def test_no_fma_environment_variable_builds_the_libm_path(rng):
    """GRADTOOL_NO_FMA=1: every library (the CPU reference's, the host backend's) is built
    with the libm-fma() flags; same bits as the numpy spec and the default build."""
    require_c_compiler()
    script = textwrap.dedent("""
        import sys, numpy as np
        import gradtool as gt
        from gradtool import native, numerics as nx
        from gradtool.device import capture
        from gradtool.device.host import load_library
        assert native.fma_policy_flags() == native.NO_FMA_FLAGS
        assert nx.matmul_config()["vector_fma"] == 0
        assert nx.matmul_config(load_library("f64", "tiled"))["vector_fma"] == 0
        a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
        tp = gt.Tape()
        w = tp.param(b, name="w")
        loss = tp.sum(tp.const(a, name="x") @ w)
        tp.backward(loss)
        rp = capture(tp, loss, backend="host")
        rp.forward(); rp.backward()
        assert (rp.grad(w).view(np.uint64) == tp.grad(w).view(np.uint64)).all()
        np.save(sys.argv[3], nx.matmul(a, b))
    """)
    a, b = rng.standard_normal((37, 61)), rng.standard_normal((61, 33))
    assert_bits_equal_nan_any(run_no_fma(script, a, b), nx.matmul_numpy(a, b), "no-fma")


MXCSR_PROBE = r"""
#include <xmmintrin.h>
unsigned probe_get(void) { return _mm_getcsr(); }
void probe_set(unsigned v) { _mm_setcsr(v); }
"""

FTZ_SCRIPT = r"""
import ctypes, sys
import numpy as np
from gradtool import native
from gradtool import numerics as nx
from gradtool.device import capture
import gradtool as gt

probe = ctypes.CDLL(sys.argv[1])
probe.probe_get.restype = ctypes.c_uint
probe.probe_set.argtypes = [ctypes.c_uint]
FTZ_DAZ = 0x8040
clean = probe.probe_get()
native.set_num_threads(2)
rng = np.random.default_rng(7)
# subnormal inputs (DAZ reads them as 0) and products that underflow (FTZ flushes them)
a = rng.standard_normal((320, 120)) * 1e-300         # 320x120 @ 120x192: threaded
a[::3] *= 1e-10
b = rng.standard_normal((120, 192)) * 1e-12
want = nx.matmul_numpy(a, b)                     # computed in the default mode

tp = gt.Tape()
w = tp.param(b, name="w")
loss = tp.sum(tp.const(a, name="x") @ w)
tp.backward(loss)
rp = capture(tp, loss, backend="host")

probe.probe_set(clean | FTZ_DAZ)
assert np.multiply(1e-300, 1e-10) == 0.0, "FTZ did not take effect here"
same = nx.matmul_numpy(a, b).view(np.uint64) == want.view(np.uint64)   # (== would apply DAZ)
assert not same.all(), "FTZ/DAZ would change this product"
first = nx.matmul(a, b)                          # threaded: the caller and a worker
third = nx.matmul(a.T.copy().T, b)               # A^T packed
assert probe.probe_get() & FTZ_DAZ == FTZ_DAZ, "the caller's mode was not restored"
rp.forward(); rp.backward()                      # the host interpreter
dev_value, dev_grad = rp.value(loss), rp.grad(w)
assert probe.probe_get() & FTZ_DAZ == FTZ_DAZ, "the caller's mode was not restored"
probe.probe_set(clean)
second = nx.matmul(a, b)
assert nx.matmul_config()["threaded_runs"] >= 3, nx.matmul_config()
for got in (first, second, third):
    assert (got.view(np.uint64) == want.view(np.uint64)).all()
assert (dev_value.view(np.uint64) == tp.value(loss).view(np.uint64)).all()
assert (dev_grad.view(np.uint64) == tp.grad(w).view(np.uint64)).all()
print("ok")
"""


def test_flush_to_zero_in_the_caller_cannot_change_a_product(tmp_path):
    """A caller's FTZ/DAZ (a library built with -ffast-math sets it on load) would flush
    subnormals; the kernel and the host interpreter run under the IEEE default instead,
    in the caller and in worker threads that were started under FTZ, and restore the
    caller's mode afterwards."""
    require_c_compiler()
    if not any(m in os.uname().machine for m in ("x86_64", "amd64", "i686")):
        pytest.skip("the FTZ/DAZ bits tested here are x86's MXCSR")
    src = tmp_path / "probe.c"
    src.write_text(MXCSR_PROBE)
    probe = native.build("mxcsr_probe", src, native.SAFE_FLAGS)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", FTZ_SCRIPT, str(probe)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_fork_after_threads_and_concurrent_callers(rng, threads_restored):
    """The pool is rebuilt in a forked child; two Python threads calling at once (ctypes
    drops the GIL) each get their own correct product."""
    require_c_compiler()
    if not hasattr(os, "fork"):
        pytest.skip("no fork() here")
    native.set_num_threads(2)
    a, b = rng.standard_normal((100, 90)), rng.standard_normal((90, 110))
    want = nx.matmul_numpy(a, b)
    assert_bits_equal_nan_any(nx.matmul(a, b), want, "parent")
    pid = os.fork()
    if pid == 0:                                   # the child: must not hang or differ
        ok = np.array_equal(nx.matmul(a, b).view(np.uint64), want.view(np.uint64))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status

    results, pairs = {}, [(rng.standard_normal((60 + i, 70)), rng.standard_normal((70, 80)))
                          for i in range(4)]

    def work(i):
        x, y = pairs[i]
        results[i] = [nx.matmul(x, y) for _ in range(20)]

    workers = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for i, (x, y) in enumerate(pairs):
        for got in results[i]:
            assert_bits_equal_nan_any(got, nx.matmul_numpy(x, y), f"thread {i}")


def test_thread_count_setting_and_its_errors(threads_restored, monkeypatch):
    monkeypatch.setenv(native.THREADS_ENV, "3")
    assert native.num_threads() == 3
    monkeypatch.delenv(native.THREADS_ENV)
    assert native.num_threads() == min(native.usable_cores(), native.MAX_THREADS)
    for bad in ("0", "-1", "two", "1.5", str(native.MAX_THREADS + 1)):
        monkeypatch.setenv(native.THREADS_ENV, bad)
        with pytest.raises(GradtoolError, match=native.THREADS_ENV):
            native.num_threads()
    monkeypatch.delenv(native.THREADS_ENV)
    native.set_num_threads(5)
    assert native.num_threads() == 5
    if nx._native_kernels() is not None:
        assert nx.matmul_config()["threads"] == 5
    for bad in (0, True, 2.0, native.MAX_THREADS + 1):
        with pytest.raises(GradtoolError):
            native.set_num_threads(bad)


def test_bad_thread_count_is_one_line_from_the_cli(tmp_path):
    require_c_compiler()
    env = {**os.environ, "PYTHONPATH": str(ROOT), native.THREADS_ENV: "lots"}
    proc = subprocess.run([*GRADTOOL, "backward", str(ROOT / "samples" / "mlp_regression.msgpack")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "GRADTOOL_NUM_THREADS" in proc.stderr, proc.stderr


@pytest.mark.parametrize("backend", ["cpu", "host"])
def test_training_saves_the_same_bytes_with_1_and_2_threads(backend, tmp_path):
    """The whole path users run, in fresh processes: `gradtool train --save` under
    GRADTOOL_NUM_THREADS=1 and =2 writes identical files.  The MLP 64-256-10 at batch
    128 is large enough for threaded products (128x64 @ 64x256 and its backward), a
    threaded optimizer step and, on the host, split launches."""
    require_c_compiler()
    import gradtool as gt
    rng = np.random.default_rng(3)
    tp = gt.Tape()
    x = tp.const(rng.standard_normal((128, 64)), name="x")
    y = tp.const(np.eye(10)[rng.integers(0, 10, 128)], name="y")
    w1 = tp.param(rng.standard_normal((64, 256)) * 0.2, name="w1")
    b1 = tp.param(np.zeros((1, 256)), name="b1")
    w2 = tp.param(rng.standard_normal((256, 10)) * 0.1, name="w2")
    loss = tp.mse(tp.tanh(x @ w1 + b1) @ w2, y)
    tape = tmp_path / "mlp.msgpack"
    gt.save(tp, str(tape), loss=loss)
    data = tmp_path / "data.npz"
    np.savez(data, x=rng.standard_normal((512, 64)), y=np.eye(10)[rng.integers(0, 10, 512)])
    outs = []
    for threads in ("1", "2"):
        out = tmp_path / f"{backend}_{threads}.msgpack"
        env = {**os.environ, "PYTHONPATH": str(ROOT), native.THREADS_ENV: threads}
        proc = subprocess.run([*GRADTOOL, "train", str(tape), "--data", str(data), "--epochs", "3",
                               "--clip", "1.0", "--backend", backend, "--save", str(out)],
                              capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


def test_kernel_sources_build_warning_free(tmp_path):
    """The header compiles cleanly with -Wall -Wextra in each tile configuration."""
    require_c_compiler()
    for flags in ([], ["-DGT_MM_PORTABLE"], ["-march=native"], list(native.python_flags())):
        proc = subprocess.run([native.compiler(), "-O2", "-Wall", "-Wextra", "-Werror",
                               "-ffp-contract=off", "-pthread", "-fPIC", "-shared", *flags,
                               str(native.CSRC / "gt_cpu.c"), "-o", str(tmp_path / "m.so")],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 and flags == ["-march=native"] and "march" in proc.stderr:
            continue
        assert proc.returncode == 0, textwrap.shorten(proc.stderr, 1000)


def test_host_backend_threads_split_large_launches_without_changing_a_bit(rng,
                                                                         threads_restored):
    """The host interpreter splits large GT_LOOP launches (tanh, exp, sigmoid, relu, the
    fill, their backward, Adam) and matmul chunks over 1, 2, 3 and 7 threads; three
    training steps end on the CPU engine's bits every time."""
    require_c_compiler()
    import gradtool as gt
    from gradtool.device.host import load_library
    from gradtool.optim import Adam
    from gradtool.train import make_engine

    x0 = rng.standard_normal((160, 200))
    w0 = rng.standard_normal((200, 180)) * 0.1
    v0 = rng.standard_normal((180, 200)) * 0.1

    def build():
        tp = gt.Tape()
        x = tp.const(x0, name="x")
        w, v = tp.param(w0, name="w", l2=1e-3), tp.param(v0, name="v")
        h = tp.tanh(x @ w) * tp.sigmoid(x @ w) + tp.exp(tp.neg(tp.relu(x @ w)))
        loss = tp.mean(tp.sqrt(tp.exp(tp.muls(h @ v, 0.01))))
        opt = Adam(1e-2)
        opt.add(tp, w)
        opt.add(tp, v)
        opt.set_clip(0.5)
        return tp, loss, opt, (w, v)

    def train(backend):
        tp, loss, opt, params = build()
        engine = make_engine(backend, tp, loss.id, opt)
        losses = [engine.train_step() for _ in range(3)]
        engine.finish()
        return losses, [tp.value(p).copy() for p in params]

    want_losses, want = train("cpu")
    lib = load_library("f64")
    before = nx.matmul_config(lib)["threaded_runs"]
    for t in THREADS:
        native.set_num_threads(t)
        losses, got = train("host")
        assert losses == want_losses, t
        for a, b in zip(got, want):
            assert_bits_equal_nan_any(a, b, f"host backend, {t} threads")
    assert nx.matmul_config(lib)["threaded_runs"] > before


POOL_STRESS = r"""
#include <stdio.h>
#include "gt_matmul.h"
/* Jobs of 2 and of 8+ chunks back to back, thousands of times, on 2 and 3
 * threads: a worker that is late for one job must never claim a chunk of the
 * next (that hung the pool once), and every product must match the serial one. */
int main(void)
{
    static double A[200 * 200], B[200 * 200], C[200 * 200], R[2][200 * 200];
    const int shape[2][3] = {{40, 40, 45}, {200, 64, 200}};
    for (int i = 0; i < 200 * 200; ++i) { A[i] = (i % 17) * 0.25 - 2; B[i] = (i % 13) * 0.5 - 3; }
    gt_mm_set_threads_impl(1);
    for (int s = 0; s < 2; ++s)
        gt_mm_run(R[s], A, 0, shape[s][1], 1, B, 0, shape[s][2], 1, 1, shape[s][0], shape[s][1],
                  shape[s][2], 0);
    for (int t = 2; t <= 3; ++t) {
        gt_mm_set_threads_impl(t);
        for (int rep = 0; rep < 3000; ++rep) {
            const int s = rep & 1, m = shape[s][0], k = shape[s][1], n = shape[s][2];
            gt_mm_run(C, A, 0, k, 1, B, 0, n, 1, 1, m, k, n, 0);
            for (int i = 0; i < m * n; ++i)
                if (C[i] != R[s][i]) { printf("mismatch: %d threads, run %d\n", t, rep); return 1; }
        }
    }
    printf("ok %lld\n", (long long)atomic_load(&gt_pool.threaded));
    return 0;
}
"""


def test_thread_pool_survives_alternating_jobs(tmp_path):
    """The pool's claim protocol under pressure, in C with the project's flags."""
    run_c_program(tmp_path, POOL_STRESS, "stress")
