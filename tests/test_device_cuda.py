"""The CUDA backend: what can be checked without a GPU, and the same bits as the CPU tape on one.

Without a GPU (CI): the exact module PyCUDA's ``SourceModule`` would build --
``kernel_source()`` with ``nvcc_options()``, no ``extern "C"`` wrapper,
``--cubin -arch sm_90`` -- is compiled by nvcc where it is on PATH (and by
PyCUDA's own compiler front end where PyCUDA imports), and the launch
geometry of the serial kernels is checked.  The GPU tests skip cleanly
without PyCUDA or a device (reason "no CUDA backend here"); the same kernel
bodies are tested on every commit through the host backend
(tests/test_device_host.py, also with -DGT_PER_THREAD, the GPU's loop
bodies).  scripts/gpu_check.sh runs this file where a GPU is lent.
"""

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal, assert_bits_equal_nan_any
from support import assert_fma_only_in_inner_products, ptx_entries
from gradtool.device import capture
from gradtool.device.cuda import cuda_status, geometry, kernel_source, nvcc_options
from gradtool.device.engine import F32_BOUND, DeviceEngine, relative_error
from gradtool.device.host import kernel_names
from gradtool.device.program import capture_program
from gradtool.expr import operations
from gradtool.ops import kernel_names as ops_kernel_names
from gradtool.optim import Adam, SGD
from gradtool.tapefile import load

OK, WHY = cuda_status()
needs_gpu = pytest.mark.skipif(not OK, reason=f"no CUDA backend here: {WHY}")
NVCC = shutil.which("nvcc")

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "samples").rglob("*.msgpack"))     # the f32 samples too
SERIAL_KERNELS = ("k_sum", "k_clip_norm", "k_guard")    # one thread walks the whole sum
LANE_TREE_KERNELS = ("k_sum", "k_clip_norm", "k_softmax", "k_log_softmax")


# ── without a GPU ─────────────────────────────────────────────────────────

@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("dtype", ["f64", "f32"])
def test_module_source_compiles_as_sourcemodule_would(dtype, tmp_path):
    """nvcc --cubin on exactly what SourceModule(no_extern_c=True) gets: no warning, every
    kernel an unmangled entry, no stack frame (no recursion, no local arrays), and
    fma.rn only in the inner products (k_matmul and conv2d's k_matmul_conv2d*: the FMA
    chain), nowhere else."""
    (tmp_path / "kernel.cu").write_text(kernel_source())
    opts = [*nvcc_options(dtype), "-arch", "sm_90"]
    cubin = subprocess.run([NVCC, "--cubin", *opts, "-Xptxas", "-v", "kernel.cu"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert cubin.returncode == 0, cubin.stderr
    assert (tmp_path / "kernel.cubin").read_bytes()[:4] == b"\x7fELF"
    assert "warning" not in (cubin.stdout + cubin.stderr).lower(), cubin.stderr
    frames = dict(re.findall(r"Function properties for (\w+)\n\s*(\d+) bytes stack frame",
                             cubin.stderr))
    names = kernel_names("f64")
    framed = {f for f, size in frames.items() if size != "0"}
    # float32: the kernels with a lane-tree sum (gt_real.h's GT_ROW_SUM, gt_real32.h's
    # gt_sum32) keep a per-thread stack of 32-lane partials in local memory
    sums = ({n for n in names
             if n.startswith(LANE_TREE_KERNELS) or n.endswith(("_bwd_a", "_bwd_b"))}
            | {"_Z7gt_sum32PKfxx"} if dtype == "f32" else set())
    assert len(frames) >= len(names) and framed <= set(TRIG_KERNELS) | {REM_PIO2} | sums, \
        cubin.stderr
    ptx = subprocess.run([NVCC, "--ptx", *opts, "kernel.cu"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert ptx.returncode == 0, ptx.stderr
    text = (tmp_path / "kernel.ptx").read_text()
    entries = set(re.findall(r"\.entry\s+(\w+)\(", text))
    assert entries == set(names)                  # extern "C": get_function finds them by name
    # the inner products: k_matmul and conv2d's products (k_matmul_conv2d*)
    assert_fma_only_in_inner_products(text, dtype, {n for n in names if n.startswith("k_matmul")})
    assert not re.search(r"\bmul\.rn\.f(32|64)\b", ptx_entries(text)["k_matmul"])
    for name, body in ptx_functions(text).items():
        assert ".local" not in body or name in set(TRIG_KERNELS) | {REM_PIO2} | sums, name
        if name not in entries:                   # device functions: nothing contracted
            assert not re.search(r"\bfma\.", body), name


# sin's and cos's reduction of |x| > 2^19*pi/2 (fdlibm's __kernel_rem_pio2, out of line on
# the GPU) keeps its work arrays in local memory: the one stack frame allowed, in it and in
# the kernels that reach it (every other kernel: no stack frame, no local memory)
REM_PIO2 = "_Z19gtm_kernel_rem_pio2PKdPdii"
TRIG_KERNELS = tuple(k for spec in gt.OPS.values() if spec.elementwise
                     and {"sin", "cos"} & set().union(*map(operations, (spec.fwd, *spec.bwd)))
                     for k in ops_kernel_names(spec))


def ptx_functions(text: str) -> dict:
    """name -> body of every .entry and .func of a PTX module."""
    heads = list(re.finditer(r"\.(?:entry|func)\s+(?:\([^)]*\)\s*)?(\w+)\(", text))
    return {m.group(1): text[m.end():(heads[i + 1].start() if i + 1 < len(heads) else None)]
            for i, m in enumerate(heads)}


def test_pycuda_front_end_compiles_the_module():
    """PyCUDA's own compile(), the one SourceModule calls, where PyCUDA imports.  Compiling
    needs no GPU, but importing pycuda.driver needs the driver library libcuda, so in CI
    (no driver) this skips and test_module_source_compiles_as_sourcemodule_would above,
    which runs nvcc the same way, is the check."""
    try:
        import pycuda.driver  # noqa: F401 - compile() imports it
        from pycuda.compiler import compile as pycuda_compile
    except (ImportError, OSError) as exc:    # not installed, or no libcuda
        pytest.skip(f"PyCUDA does not import here: {type(exc).__name__}: {exc}")
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    for dtype in ("f64", "f32"):
        cubin = pycuda_compile(kernel_source(), options=nvcc_options(dtype), no_extern_c=True,
                               arch="sm_90", cache_dir=False)
        assert cubin[:4] == b"\x7fELF"


def test_serial_kernels_run_on_one_thread():
    """A serial sum must see exactly one thread: its launch bound (meta[0]) is 1, so the
    grid-stride loop runs its body for global thread index 0 only."""
    tp = gt.Tape()
    rng = np.random.default_rng(1)
    w = tp.param(rng.standard_normal((7, 5)))
    x = tp.const(rng.standard_normal((3, 7)), name="x")
    loss = tp.mean(tp.tanh(x @ w)) + tp.sum(w)
    opt = Adam(0.1)
    opt.add(tp, w)
    opt.set_clip(0.5)
    prog = capture_program(tp, loss.id, optimizer=opt)
    serial = [ln for ph in prog.launches.values() for ln in ph if ln.kernel in SERIAL_KERNELS]
    assert {ln.kernel for ln in serial} == set(SERIAL_KERNELS)
    for ln in serial:
        assert ln.work == 1, ln
        assert geometry(ln.work) == ((1, 1), (32, 1, 1))
    for work in (2, 255, 256, 257, 70_000, 10**9):       # every index reached, grid in range
        (blocks, _), (threads, _, _) = geometry(work)
        assert 1 <= blocks <= 2**31 - 1 and threads == 256
        assert blocks * threads >= min(work, (1 << 16) * 256)


# ── on a GPU ──────────────────────────────────────────────────────────────

def grads_match(tp, loss, rp):
    tp.zero_grad()
    tp.forward()
    tp.backward(loss)
    rp.forward()
    rp.backward()
    rp.backward()       # idempotent: it starts by zeroing the gradients the first one left
    assert_bits_equal(np.array([rp.loss()]), tp.values[loss.id], "loss")
    for i in range(len(tp.nodes)):
        assert_bits_equal(rp.value(i), tp.values[i], f"node {i} value")
        cpu = tp.grads[i] if tp.grads[i] is not None else np.zeros(tp.values[i].shape)
        assert_bits_equal(rp.grad(i), cpu, f"node {i} grad")


@needs_gpu
@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_every_sample_bit_exact(sample, graph):
    tf = load(sample)
    rp = capture(tf.tape, tf.loss, "cuda", "f64", graph=graph)
    grads_match(tf.tape, tf.loss, rp)


@needs_gpu
def test_random_graphs_bit_exact():
    from support import random_graph
    for seed in range(25):
        tp, loss = random_graph(np.random.default_rng(seed))
        grads_match(tp, loss, capture(tp, loss, "cuda"))


@needs_gpu
@pytest.mark.parametrize("graph", [True, False])
def test_grid_stride_loops_on_a_tiny_grid(graph, monkeypatch):
    """Every kernel with at most 2 blocks of 32 threads: each thread walks many indices
    through the grid-stride loop (a full-size grid only does that past 2^24 indices)."""
    from gradtool.device import cuda as cuda_backend
    from support import random_graph
    monkeypatch.setattr(cuda_backend, "BLOCK", 32)
    monkeypatch.setattr(cuda_backend, "MAX_GRID", 2)
    assert geometry(10_000) == ((2, 1), (32, 1, 1))
    for seed in range(5):
        tp, loss = random_graph(np.random.default_rng(100 + seed))
        grads_match(tp, loss, capture(tp, loss, "cuda", graph=graph))
    tf = load(ROOT / "samples" / "autoencoder" / "ae.msgpack")     # launches of 12,800 indices
    grads_match(tf.tape, tf.loss, capture(tf.tape, tf.loss, "cuda", graph=graph))


@needs_gpu
@pytest.mark.parametrize("graph,fuse", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_training_episodes_bit_exact(kind, graph, fuse):
    """30 episodes (one CUDA graph each with graph=True; fused kernels with fuse=True)
    against gradtool.optim."""
    from support import (assert_replay_trained_like_cpu, batches, mlp, replay_losses,
                         run_cpu, with_params)
    tapes = [mlp(np.random.default_rng(7), unused=True) for _ in range(2)]
    data = batches(np.random.default_rng(8), 30)
    opts = [with_params(Adam(0.05) if kind == "adam" else SGD(0.2), tp, clip=1.2)
            for tp, *_ in tapes]
    cpu_losses = run_cpu(*tapes[0], opts[0], data)
    tp, x, y, loss = tapes[1]
    rp = capture(tp, loss, "cuda", optimizer=opts[1], graph=graph, fuse=fuse)
    dev_losses = replay_losses(rp, x, y, data)
    assert_bits_equal(np.array(dev_losses), np.array(cpu_losses), "losses")
    assert_replay_trained_like_cpu(rp, tp, opts[1], tapes[0][0], opts[0])
    assert opts[1].t == 30


@needs_gpu
@pytest.mark.parametrize("graph", [True, False])
def test_nonfinite_loss_updates_nothing_inside_the_graph(graph):
    """A NaN batch: the captured guard kernel stops every update on the device, the host
    rolls its counters back, and the run goes on exactly like the CPU engine's."""
    from support import (assert_engines_end_alike, nonfinite_batch_setup,
                                  train_step_all)
    engines, tapes, data = nonfinite_batch_setup(
        lambda tp, loss_id, opt: DeviceEngine(tp, loss_id, opt, backend="cuda", graph=graph))
    losses = np.array([train_step_all(engines, xb, yb) for xb, yb in data])
    assert np.isnan(losses[5]).all()            # NaN payloads differ between x86 and CUDA
    finite = np.delete(losses, 5, axis=0)
    assert np.isfinite(finite).all()
    assert_bits_equal(finite[:, 1], finite[:, 0], "losses")
    assert_engines_end_alike(engines, tapes)


@needs_gpu
def test_graph_and_per_node_launches_agree():
    from support import with_params
    tf = load(ROOT / "samples" / "attention.msgpack")
    results = []
    for graph in (True, False):
        opt = with_params(Adam(0.01), tf.tape)
        rp = capture(tf.tape, tf.loss, "cuda", optimizer=opt, graph=graph)
        losses = [rp.episode(train=True) for _ in range(5)]
        rp.forward()                    # the phases one at a time: three more graphs
        rp.backward()
        rp.step()
        losses.append(rp.loss())
        results.append((losses, [rp.value(p) for p in tf.tape.params()]))
    assert_bits_equal(np.array(results[0][0]), np.array(results[1][0]), "losses")
    for a, b in zip(results[0][1], results[1][1], strict=True):
        assert_bits_equal(a, b, "param")


@needs_gpu
def test_train_backend_cuda_saves_the_same_bytes_as_cpu(tmp_path, monkeypatch):
    from click.testing import CliRunner
    from gradtool.cli import main
    monkeypatch.chdir(ROOT)
    saved = {}
    for backend in ("cpu", "cuda"):
        out = tmp_path / f"{backend}.msgpack"
        result = CliRunner().invoke(main, ["train", "samples/digits_mlp.msgpack", "--data",
                                           "samples/digits.npz", "--epochs", "1", "--clip", "2.0",
                                           "--save", str(out), "--backend", backend])
        assert result.exit_code == 0, result.output
        saved[backend] = out.read_bytes()
    assert saved["cuda"] == saved["cpu"]


@needs_gpu
def test_f32_bit_exact_and_within_bound():
    """Every sample's f32 copy (or the f32 sample itself) on the GPU: its CPU reference's
    bits (numerics32), within the old bound of the f64 tape; a copy that mixes f32 and
    f64 (a draw feeding f64 arithmetic) is refused in one line."""
    from gradtool.device import CaptureError, rounded_tape, tape_dtype
    for sample in SAMPLES:
        tf = load(sample)
        copy = rounded_tape(tf.tape, "f32")
        try:
            tape_dtype(copy)
        except CaptureError:
            with pytest.raises(CaptureError, match="one float dtype per tape"):
                capture(tf.tape, tf.loss, "cuda", "f32")
            continue
        rp = capture(tf.tape, tf.loss, "cuda", "f32")
        rp.forward()
        rp.backward()
        copy.backward(copy.var(tf.loss.id))
        assert_bits_equal_nan_any(rp.value(tf.loss.id), copy.values[tf.loss.id], str(sample))
        for p in copy.params():
            assert_bits_equal_nan_any(rp.grad(p.id), copy.grad(p), f"{sample} grad {p.id}")
        tf.tape.zero_grad()
        tf.tape.backward(tf.loss)
        assert relative_error(rp.loss(), tf.tape.values[tf.loss.id]) <= F32_BOUND
        for p in tf.tape.params():
            assert relative_error(rp.grad(p), tf.tape.grad(p)) <= F32_BOUND, (sample, p.id)


@needs_gpu
def test_device_matches_host_backend_too():
    tp = gt.Tape()
    rng = np.random.default_rng(5)
    x = tp.param(rng.standard_normal((7, 9)))
    w = tp.param(rng.standard_normal((9, 5)))
    loss = tp.mean(tp.softmax(tp.tanh(x @ w), axis=0) * tp.const(rng.standard_normal((7, 5))))
    values = []
    for backend in ("cuda", "host"):
        rp = capture(tp, loss, backend)
        rp.forward()
        rp.backward()
        values.append([rp.grad(x), rp.grad(w)])
    for a, b in zip(*values, strict=True):
        assert_bits_equal(a, b)
