"""float32 in the compiled engines: the CPU reference's compiled f32 kernels, the host
backend's f32 build, against numerics32 (the float32 contract's numpy spec), bit for bit.

* the compiled f32 matrix product (csrc/gt_matmul.h's tiles instantiated for float,
  through csrc/gt_cpu.c -DGT_CPU_F32) in every build (AVX-512/native, generic, AVX2+FMA,
  portable, the libm-fmaf build GRADTOOL_NO_FMA gives), every operand layout and 1, 2, 3
  and 7 threads == numerics32.matmul_numpy; FMA instructions in the products only;
* the kernels' lane-tree sum (gt_real.h's GT_ROW_SUM over computed terms, GT_MEM_SUM over
  memory) == numerics32.sum for lengths 0 .. past two levels of the block tree;
* every op of the table, forward and backward, on an f32 tape: the host backend's three
  kernel variants (tiled, per-thread, per-thread reversed) == the CPU reference.
"""

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal_nan_any, require_c_compiler
from gradtool import native
from gradtool import numerics as nx
from gradtool import numerics32 as n32
from support import cpu_libraries, functions_with_fused_multiply_adds, layouts
from support import product as product32

ROOT = Path(__file__).resolve().parent.parent
THREADS = (1, 2, 3, 7)


def operand32(rng, shape):
    """float32 values over 12 decades with float32's special values sprinkled in
    (subnormals, the largest finite, signed zeros, infinities, NaN)."""
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 7, shape)).astype(np.float32)
    specials = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 1e-45, -3e-39, 3.4e38, -3.4e38],
                        dtype=np.float32)
    if x.size:
        hit = rng.random(shape) < 0.02
        x[hit] = rng.choice(specials, int(hit.sum()))
    return x


@pytest.fixture(scope="module")
def libraries32():
    return cpu_libraries("f32")


def reference32(a, b, c0=None):
    s = n32.matmul_numpy(a, b) if a.ndim == 2 else n32.bmm_numpy(a, b)
    if c0 is None:
        return s
    with np.errstate(all="ignore"):
        return c0 + s                      # the accumulate: one binary32 add


def test_f32_products_every_build_layout_and_thread_count(libraries32, rng,
                                                           threads_restored):
    shapes = [(1, 1, 1), (1, 300, 1), (300, 1, 300), (5, 33, 31), (131, 257, 61),
              (3, 0, 5), (128, 784, 37), (64, 40, 497), (17, 64, 100), (200, 200, 200)]
    before = {name: nx.matmul_config(lib)["threaded_runs"] for name, lib in libraries32.items()}
    for m, k, n in shapes:
        a, b, c0 = operand32(rng, (m, k)), operand32(rng, (k, n)), operand32(rng, (m, n))
        want, want_acc = reference32(a, b), reference32(a, b, c0)
        assert want.dtype == np.float32
        for t in THREADS:
            native.set_num_threads(t)
            for name, lib in libraries32.items():
                for case, (x, y) in layouts(a, b).items():
                    what = f"f32 {name} build, {t} threads, {case}, M K N = {m} {k} {n}"
                    got = product32(lib, x, y)
                    assert got.dtype == np.float32
                    assert_bits_equal_nan_any(got, want, what)
                assert_bits_equal_nan_any(product32(lib, a, b, c0), want_acc, what + ", +=")
    for name, lib in libraries32.items():      # the threaded code really ran
        assert nx.matmul_config(lib)["threaded_runs"] > before[name], name
        assert nx.matmul_config(lib)["lanes"] in (1, 4, 8, 16), name


def test_f32_batched_products_and_the_numerics32_entry_points(libraries32, rng,
                                                                threads_restored):
    for bt, m, k, n in [(1, 9, 17, 33), (3, 64, 40, 70), (5, 7, 1, 3), (8, 33, 64, 32)]:
        a, b = operand32(rng, (bt, m, k)), operand32(rng, (bt, k, n))
        want = reference32(a, b)
        for t in (1, 3):
            native.set_num_threads(t)
            for name, lib in libraries32.items():
                for case, (x, y) in layouts(a, b).items():
                    assert_bits_equal_nan_any(product32(lib, x, y), want,
                                              f"f32 {name}, {t} threads, bmm {case}")
    # numerics32.matmul/bmm (what the CPU reference's f32 nodes call) run the kernel
    assert nx.cpu_kernels32() is not None
    a, b = operand32(rng, (70, 90)), operand32(rng, (90, 40))
    got = n32.matmul(a, b)
    assert got.dtype == np.float32
    assert_bits_equal_nan_any(got, n32.matmul_numpy(a, b), "numerics32.matmul")
    assert_bits_equal_nan_any(n32.matmul(b.T, a.T), n32.matmul_numpy(b.T, a.T), "transposed")
    # a batch of one on either side is read for every batch (stride 0), as numpy stretches it
    one, many = operand32(rng, (1, 20, 30)), operand32(rng, (4, 30, 50))
    assert_bits_equal_nan_any(n32.bmm(one, many), n32.bmm_numpy(one, many), "stretched a")
    one_b = operand32(rng, (1, 50, 6))
    assert_bits_equal_nan_any(n32.bmm(many, one_b), n32.bmm_numpy(many, one_b), "stretched b")


def test_f32_fused_multiply_adds_only_in_the_products(libraries32):
    """The float32 library's disassembly: FMA instructions (fmaf calls in the no-fma build)
    in the matmul micro-kernels only."""
    import shutil
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump is not installed")
    for name, lib in libraries32.items():
        found = functions_with_fused_multiply_adds(objdump, Path(lib._name))
        assert found, f"{name}: no fused multiply-add in the f32 library"
        stray = {f: v[:2] for f, v in found.items()
                 if not f.startswith(("gt_mm_k", "gt_mm_naive", "gt_conv_k", "gt_mm_naive_conv"))}
        assert not stray, f"{name}: fused multiply-adds outside the products: {stray}"
        if name == "no-fma":
            assert nx.matmul_config(lib)["vector_fma"] == 0
            assert all("fmaf@plt" in line for v in found.values() for line in v), name


def test_no_fma_environment_builds_the_libm_fmaf_path(rng):
    """GRADTOOL_NO_FMA=1: the float32 library calls libm's fmaf; same bits."""
    require_c_compiler()
    script = textwrap.dedent("""
        import sys, numpy as np
        from gradtool import native, numerics as nx, numerics32 as n32
        assert native.fma_policy_flags() == native.NO_FMA_FLAGS
        assert nx.matmul_config(nx.cpu_kernels32())["vector_fma"] == 0
        a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
        np.save(sys.argv[3], n32.matmul(a, b))
    """)
    a, b = operand32(rng, (37, 61)), operand32(rng, (61, 33))
    assert_bits_equal_nan_any(run_no_fma(script, a, b), n32.matmul_numpy(a, b), "no-fma")


# ── the kernels' lane-tree sum ───────────────────────────────────────────────

SUM_HARNESS = r"""
#include "gt_real.h"
/* GT_ROW_SUM over computed terms (term l = x[l*stride] * 1.0f, a product that rounds
 * nothing) and GT_MEM_SUM over memory, as the f32 kernels call them */
GT_EXPORT float row_sum(const float *x, long long n, long long stride)
{
    gt_real s;
    GT_ROW_SUM(s, n, l, v, { const gt_real one = R1; v = R_MUL(x[l * stride], one); })
    return s;
}
GT_EXPORT float mem_sum(const float *x, long long n, long long stride)
{
    return GT_MEM_SUM(x, n, stride);
}
/* the terms are visited once each, l ascending (the clip norm's cursor relies on it) */
GT_EXPORT long long row_sum_order(long long n)
{
    long long next = 0, bad = 0;
    gt_real s;
    GT_ROW_SUM(s, n, l, v, { bad += l != next; next = l + 1; v = R0; })
    (void)s;
    return bad + (next != n);
}
"""

SUM_LENGTHS = (0, 1, 2, 3, 31, 32, 33, 63, 255, 256, 257, 511, 512, 513, 767, 768, 1023,
               1024, 1025, 256 * 5 + 7, 256 * 9, 256 * 17 + 255, 70001)


@pytest.fixture(scope="module")
def sum_lib(tmp_path_factory):
    import ctypes
    require_c_compiler()
    src = tmp_path_factory.mktemp("sum") / "sum_harness.c"
    src.write_text(SUM_HARNESS)
    path = native.build("gt_f32_sum_harness", src,
                        ["-x", "c", *native.SAFE_FLAGS, "-DGT_REAL_F32"],
                        [native.CSRC / h for h in ("gt_real.h", "gt_real32.h", "gt_math.h",
                                                   "gt_ops.h", "host_prelude.h")])
    lib = ctypes.CDLL(str(path))
    for fn in (lib.row_sum, lib.mem_sum):
        fn.restype = ctypes.c_float
        fn.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong]
    lib.row_sum_order.restype = ctypes.c_longlong
    lib.row_sum_order.argtypes = [ctypes.c_longlong]
    return lib


@pytest.mark.parametrize("n", SUM_LENGTHS)
def test_kernel_lane_tree_sum_equals_numerics32(sum_lib, n, rng):
    import ctypes
    m = n * 3
    cases = {
        "wide": (rng.standard_normal(m) * 10.0 ** rng.integers(-6, 7, m)).astype(np.float32),
        "cancelling": (np.resize([1.0, -1.0], m) * 10.0 ** rng.integers(0, 8, m)
                       + rng.standard_normal(m) * 1e-3).astype(np.float32),
        "special": operand32(rng, (m,)),
    }
    for stride in (1, 3):
        for scale, x in cases.items():
            x = np.resize(x, n * stride).astype(np.float32)
            view = x[::stride]
            want = n32.sum(view)
            ptr = x.ctypes.data_as(ctypes.c_void_p)
            for name, fn in (("GT_ROW_SUM", sum_lib.row_sum), ("GT_MEM_SUM", sum_lib.mem_sum)):
                got = np.float32(fn(ptr, n, stride))
                assert_bits_equal_nan_any(got, want, f"{name} n={n} stride={stride} {scale}")
    assert sum_lib.row_sum_order(n) == 0
    # an all -0.0 row sums to +0.0 (every partial starts at +0.0), as numerics32 says
    z = np.full(max(n, 1), -0.0, np.float32)
    got = np.float32(sum_lib.mem_sum(z.ctypes.data_as(ctypes.c_void_p), n, 1))
    assert got == 0.0 and not np.signbit(got) and not np.signbit(n32.sum(z[:n]))


# ── every op on an f32 tape: the host backend == the CPU reference ──────────

from support import OPTIONAL_CASES, TABLE_OPS, op_tape, run_no_fma  # noqa: E402

VARIANTS = ("tiled", "per-thread", "per-thread-reversed")


def _rng(name):
    return np.random.default_rng(sum(map(ord, name)) + 32)


# ops whose output is f64 whatever their inputs' float type (read from integer data):
# an f32 tape casts them (a mixed tape, which runs on the cpu backend)
F64_RESULT = ("to_f64", "uniform")


def f32_op_tape(name, rng, attrs=None):
    """op_tape's one-op tape as an f32 tape (rounded_tape: leaves rounded once, every node
    recomputed by the CPU reference in float32), backward run."""
    from gradtool.device import rounded_tape
    if name in F64_RESULT:
        pytest.skip(f"{name} gives f64 values from integer data")
    tp, out, loss = op_tape(name, rng, attrs=attrs)
    tp32 = rounded_tape(tp, "f32")
    assert tp32.values[out.id].dtype == np.float32, name
    tp32.backward(tp32.var(loss.id))
    return tp32, out.id, loss.id


def assert_host_equals_reference(tp, out, loss, variant, what):
    from gradtool.device import capture
    replay = capture(tp, loss, "host", host_kernels=variant)
    assert replay.dtype == "f32"
    replay.forward()
    replay.backward()
    got = replay.value(out)
    assert got.dtype == np.float32
    assert_bits_equal_nan_any(got, tp.values[out], f"{what} forward ({variant})")
    for p in tp.params():
        g = replay.grad(p.id)
        assert g.dtype == np.float32
        assert_bits_equal_nan_any(g, tp.grad(p), f"{what} grad of {p.id} ({variant})")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", TABLE_OPS)
def test_f32_every_op_host_equals_reference(name, variant):
    require_c_compiler()
    tp, out, loss = f32_op_tape(name, _rng(name))
    assert_host_equals_reference(tp, out, loss, variant, name)


OPTIONAL = [(name, k) for name, cases in OPTIONAL_CASES.items() for k in range(len(cases))]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name, k", OPTIONAL)
def test_f32_optional_attributes_host_equals_reference(name, k, variant):
    require_c_compiler()
    attrs = OPTIONAL_CASES[name][k]
    tp, out, loss = f32_op_tape(name, _rng(name), attrs=attrs)
    assert_host_equals_reference(tp, out, loss, variant, f"{name} {attrs}")


# ── training an f32 tape: cpu, host and --fuse, and under MPI, the same bytes ──

from support import batches, mlp, train_under_mpiexec, with_params  # noqa: E402

DIGITS = ROOT / "samples" / "digits_mlp.msgpack"
DIGITS_DATA = ROOT / "samples" / "digits.npz"


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled step", "numpy step"])
@pytest.mark.parametrize("kind, clip", [("adam", 1.0), ("sgd", 0.5), ("adam", None)])
def test_f32_engines_train_to_the_same_bits(kind, clip, compiled, monkeypatch):
    """An f32 MLP trained 8 steps on the CPU engine, the host backend per node and fused:
    the same losses, params and Adam moments, all float32 (the optimizer's state in the
    param's dtype, its clip norm numerics32's lane-tree sum on both sides)."""
    require_c_compiler()
    from gradtool import optim
    from gradtool.device import rounded_tape
    from gradtool.train import make_engine
    monkeypatch.setattr(optim, "_COMPILED", [compiled])
    runs = []
    for backend, options in (("cpu", {}), ("host", {}), ("host", {"fuse": True})):
        tp, x, y, loss = mlp(np.random.default_rng(11))
        tp = rounded_tape(tp, "f32")
        opt = with_params(optim.make_optimizer(kind, 0.01), tp, clip=clip)
        engine = make_engine(backend, tp, loss.id, opt, **options)
        losses = []
        for xb, yb in batches(np.random.default_rng(3), 8):
            engine.set_input(x.id, xb.astype(np.float32))
            engine.set_input(y.id, yb.astype(np.float32))
            losses.append(engine.train_step())
        engine.finish()
        state = [tp.values[p.id] for p in tp.params()]
        state += [a for e in opt.entries if e.m is not None for a in (e.m, e.v)]
        assert all(a.dtype == np.float32 for a in state), backend
        runs.append((losses, [a.copy() for a in state]))
    for losses, state in runs[1:]:
        assert losses == runs[0][0]
        for a, b in zip(state, runs[0][1], strict=True):
            assert a.tobytes() == b.tobytes()


@pytest.fixture(scope="module")
def digits32(tmp_path_factory):
    """The digits MLP sample as an f32 tape file (rounded_tape), saved and loaded back."""
    from gradtool.device import rounded_tape
    from gradtool.tapefile import load, save
    tf = load(DIGITS)
    path = tmp_path_factory.mktemp("f32") / "digits32.msgpack"
    save(rounded_tape(tf.tape, "f32"), path, loss=tf.loss.id,
         outputs={k: v.id for k, v in tf.outputs.items()}, meta=tf.meta)
    assert load(path).tape.values[tf.loss.id].dtype == np.float32
    return path


def test_f32_train_command_same_bytes_on_cpu_host_and_fused(digits32, tmp_path):
    require_c_compiler()
    from support import run
    saved = {}
    for backend, extra in (("cpu", ()), ("host", ()), ("host", ("--fuse",))):
        out = tmp_path / f"{backend}{len(extra)}.msgpack"
        res = run("train", digits32, "--data", DIGITS_DATA, "--steps", 12, "--clip", 1.0,
                  "--backend", backend, *extra, "--save", out)
        assert res.exit_code == 0, res.stderr
        saved[backend, extra] = out.read_bytes()
    assert len(set(saved.values())) == 1, "f32 training differs between engines"


def test_f32_train_under_mpiexec_same_bytes_for_1_2_and_4_ranks(digits32, tmp_path):
    require_c_compiler()
    from support import run
    args = ["--data", DIGITS_DATA, "--steps", 6, "--shards", 4, "--backend", "host"]
    one = tmp_path / "one.msgpack"
    res = run("train", digits32, *args, "--save", one)
    assert res.exit_code == 0, res.stderr
    for ranks in (2, 4):
        got = train_under_mpiexec(digits32, args, tmp_path / f"r{ranks}.msgpack", ranks)
        assert got == one.read_bytes(), f"{ranks} ranks"


# ── emit-cuda of an f32 tape: float code with the CPU reference's bits ────────

from gradtool.ops import OPS as _OPS  # noqa: E402
from support import assert_emitted_c_equals_tape  # noqa: E402

SCALAR_OPS32 = [n for n in TABLE_OPS if _OPS[n].rules is not None and n not in F64_RESULT]


def f32_scalar_cases():
    from gradtool.device import rounded_tape
    cases = []
    for name in SCALAR_OPS32:
        for k in range(4):
            tp, _, loss = op_tape(name, np.random.default_rng(k), scalar=True)
            tp32 = rounded_tape(tp, "f32")
            assert tp32.values[loss.id].dtype == np.float32
            cases.append((f"op32_{name}_{k}", tp32, tp32.var(loss.id)))
    return cases


def test_emitted_float_code_equals_the_f32_tape_for_every_scalar_op(tmp_path):
    """Every op with a scalar form, on one-element f32 tapes: the emitted C (float code:
    binary32 operations, gt_real32.h's transcendentals, constants rounded once) returns the
    CPU reference's loss and gradients, bit for bit (the emit oracle's harness)."""
    import shutil
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    cases = f32_scalar_cases()
    from gradtool.emit.cuda import emit_cuda
    src = emit_cuda(cases[0][1], cases[0][2], name="probe")
    assert "GT_DEVICE float probe(const float *p, const float *x, float *g)" in src
    assert_emitted_c_equals_tape(tmp_path, cases, cc)
    fresh = f32_scalar_cases()[:40]            # (the oracle runs each tape's backward)
    assert_emitted_c_equals_tape(tmp_path, fresh, cc, cflags=("-O3", "-march=native"))


def test_backward_hex_of_an_f32_tape_is_what_the_emitted_code_returns(tmp_path):
    """The oracle's reference: `gradtool backward --hex` prints the f32 tape's float32
    values as hex floats; the emitted function's loss and gradients are those numbers."""
    import json
    import shutil
    import subprocess
    from gradtool.emit.cuda import emit_cuda, layout
    from gradtool.tapefile import save
    from support import run
    sys.path.insert(0, str(ROOT / "scripts"))
    import emitc_harness as H
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    name, tp, loss = next(c for c in f32_scalar_cases() if c[0] == "op32_tanh_1")
    path = tmp_path / "t.msgpack"
    save(tp, path, loss=loss)
    res = run("backward", path, "--json", "--hex")
    assert res.exit_code == 0, res.stderr
    ref = json.loads(res.stdout)
    lay = layout(tp, loss)
    src = tmp_path / "t.c"
    src.write_text(H.harness_program([emit_cuda(tp, loss, name="f")], [("f", tp, lay)]))
    subprocess.run([cc, "-std=c99", "-O2", "-ffp-contract=off", "-o", str(tmp_path / "t"),
                    str(src), "-lm"], check=True)
    got = H.parse_output(subprocess.run([str(tmp_path / "t")], capture_output=True, text=True,
                                        check=True).stdout)["f"]
    assert float.fromhex(ref["loss"]) == H.from_bits(got["loss"])
    assert [p["id"] for p in ref["params"]] == list(lay.params)
    for j, p in enumerate(ref["params"]):
        assert float.fromhex(p["grad"][0]) == H.from_bits(got["p"][j]), p
        assert float.fromhex(p["grad"][0]) == float(np.float32(float.fromhex(p["grad"][0])))


def test_nvcc_compiles_the_float_code_without_contraction_or_ftz(tmp_path):
    """nvcc -c -arch=sm_90 on every scalar op's emitted float code (with the batch
    kernel): no fused multiply-add (a scalar tape has no product), no add/sub/mul.f32
    that ptxas may contract (every one .rn), and no flush to zero (.ftz) anywhere."""
    import re
    from gradtool.emit.cuda import emit_cuda
    from support import NVCC, nvcc_functions
    if NVCC is None:
        pytest.skip("nvcc not installed")
    cases = f32_scalar_cases()[::4]
    funcs = nvcc_functions(tmp_path, [emit_cuda(tp, loss, name=f, kernel=True)
                                      for f, tp, loss in cases])
    assert sum(n.endswith("_batch") for n in funcs) == len(cases)
    seen_f32 = False
    for name, body in funcs.items():
        assert not re.search(r"\bfma\.", body), f"{name}: nvcc fused a multiply-add"
        assert not re.search(r"(?<![\w.])(?:add|sub|mul)\.f32\b", body), f"{name}: contractable"
        assert ".ftz" not in body, f"{name}: flush to zero"
        seen_f32 = seen_f32 or bool(re.search(r"\b(?:add|mul)\.rn\.f32\b", body))
    assert seen_f32, "no binary32 arithmetic in the PTX"


def test_f32_tape_with_dropout_runs_on_the_host_and_trains_like_cpu(tmp_path):
    """An f64 model with dropout converted to f32 (convert.to_dtype: the rng slot and the
    draws stay f64, cast to f32 where read): the draws' casts run on the device (k_uniform
    rounds each draw to float once, the casts copy it), so the replay is the CPU
    reference's bits; `gradtool train` (which advances the rng slot every step) saves the
    same bytes on cpu, host and --fuse."""
    require_c_compiler()
    from gradtool import nn
    from gradtool.convert import to_dtype
    from gradtool.device import capture
    from gradtool.tapefile import save
    from support import run
    rng = np.random.default_rng(0)
    tp = gt.Tape()
    x = tp.const(rng.standard_normal((8, 5)), name="x")
    y = tp.const(rng.standard_normal((8, 6)), name="y")
    w = tp.param(rng.standard_normal((5, 6)), name="w")
    h = nn.dropout(tp.tanh(x @ w), 0.3)
    loss = tp.mean((h - y) * (h - y))
    t32, ids = to_dtype(tp, "f32")
    assert any(n.op == "cast" for n in t32.nodes) and any(n.op == "uniform" for n in t32.nodes)
    lv = t32.var(ids[loss.id])
    t32.backward(lv)
    for variant in VARIANTS:
        rp = capture(t32, lv, "host", host_kernels=variant)
        rp.forward()
        rp.backward()
        assert_bits_equal_nan_any(rp.value(lv.id), t32.values[lv.id], f"loss ({variant})")
        for p in t32.params():
            assert_bits_equal_nan_any(rp.grad(p.id), t32.grad(p), f"grad ({variant})")
    path, data = tmp_path / "drop32.msgpack", tmp_path / "d.npz"
    save(t32, path, loss=lv)
    np.savez(data, x=rng.standard_normal((32, 5)).astype(np.float32),
             y=rng.standard_normal((32, 6)).astype(np.float32))
    saved = set()
    for backend, extra in (("cpu", ()), ("host", ()), ("host", ("--fuse",))):
        out = tmp_path / f"{backend}{len(extra)}.msgpack"
        res = run("train", path, "--data", data, "--steps", 6, "--backend", backend, *extra,
                  "--save", out)
        assert res.exit_code == 0, res.stderr
        saved.add(out.read_bytes())
    assert len(saved) == 1


@pytest.mark.parametrize("threads", [1, 3])
def test_f32_convolutions_and_pooling_compiled_equal_numpy(threads, rng, threads_restored):
    """numerics.conv2d / conv2d_backward / max_pool2d(_backward) of float32 arrays run
    gt_conv.h on float (gt_cpu_f32): the same bits as their numpy twins (im2col and
    numerics32's fmaf chains; the serial col2im and window sums in binary32)."""
    require_c_compiler()
    import gradtool.ops  # noqa: F401  (installs numerics32 as numerics' float32 twin)
    native.set_num_threads(threads)
    for n, c, h, w, oc, k, s, p, d, g in [(2, 3, 9, 8, 4, 3, 1, 1, 1, 1),
                                          (3, 4, 11, 7, 6, 3, 2, 0, 1, 2),
                                          (1, 2, 6, 6, 2, 2, 1, 2, 2, 1),
                                          (4, 8, 16, 16, 16, 3, 1, 1, 1, 1)]:
        geo = ((s, s), (p, p), (d, d), g)
        x = operand32(rng, (n, c, h, w))
        wt = (rng.standard_normal((oc, c // g, k, k))).astype(np.float32)
        out = nx.conv2d(x, wt, *geo)
        assert out.dtype == np.float32
        assert_bits_equal_nan_any(out, nx.conv2d_numpy(x, wt, *geo), f"conv2d {x.shape}")
        gr = operand32(rng, out.shape)
        got = nx.conv2d_backward(gr, x, wt, *geo, True, True)
        want = nx.conv2d_backward_numpy(gr, x, wt, *geo, True, True)
        for a, b, what in zip(got, want, ("dx", "dw")):
            assert a.dtype == np.float32
            assert_bits_equal_nan_any(a, b, f"conv2d {what} {x.shape}")
        pool = ((2, 2), (2, 2), (0, 0), (1, 1), False)
        m = nx.max_pool2d(x, *pool)
        assert_bits_equal_nan_any(m, nx._max_pool_index(x, *pool)[0], "max_pool2d")
        gm = operand32(rng, m.shape)
        got = nx.max_pool2d_backward(gm, x, *pool)
        assert got.dtype == np.float32
        oh, ow, hp, wp = nx._pool_geometry(x, *pool)
        want = np.zeros((n, c, hp, wp), np.float32)     # the numpy rule, written out
        idx = nx._max_pool_index(x, *pool)[1]
        for i in range(2):
            for j in range(2):
                view = nx._window_view(want, i, j, oh, ow, (2, 2), (1, 1))
                np.add(view, np.where(idx == i * 2 + j, gm, np.float32(0.0)), out=view)
        assert_bits_equal_nan_any(got, want[:, :, :h, :w], "max_pool2d backward")
