"""Engines and compiled code against the tape: the engine helpers shared by the host,
CUDA and fusion tests (:func:`with_params`, :func:`run_cpu`,
:func:`assert_replay_trained_like_cpu`, :func:`assert_engines_end_alike` and friends),
the host backend against the tape in every kernel variant (:func:`host_matches`),
emitted C against the tape through the real C compiler
(:func:`assert_emitted_c_equals_tape`), nvcc's PTX and its FMA contract
(:func:`ptx_entries`, :func:`assert_fma_only_in_inner_products`), and a run under
``GRADTOOL_NO_FMA=1`` (:func:`run_no_fma`).  Tests import these through tests/support.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import assert_bits_equal, require_c_compiler
from gradtool.device import capture
from gradtool.optim import AdamSeed as Adam
from gradtool.train import make_engine

from support_tapes import ROOT, batches, mlp


def with_params(opt, tp, clip=None):
    """``opt`` with every param of ``tp`` registered, and the clip set if given."""
    for p in tp.params():
        opt.add(tp, p)
    if clip is not None:
        opt.set_clip(clip)
    return opt


def run_cpu(tp, x, y, loss, opt, data):
    losses = []
    for xb, yb in data:
        tp.set_value(x, xb)
        tp.set_value(y, yb)
        tp.forward()
        losses.append(float(tp.values[loss.id][0]))
        tp.zero_grad()
        tp.backward(loss)
        opt.step(tp)
    return losses


def replay_losses(rp, x, y, data):
    """One training episode of the replay ``rp`` a batch of ``data`` ((``x``'s value,
    ``y``'s value) pairs): the losses."""
    losses = []
    for xb, yb in data:
        rp.set_input(x, xb)
        rp.set_input(y, yb)
        losses.append(rp.episode(train=True))
    return losses


def assert_replay_trained_like_cpu(rp, tp_dev, opt_dev, tp_cpu, opt_cpu):
    """After training: the replay's last gradients, params, step counters and moments,
    synced back into ``tp_dev`` and ``opt_dev``, equal to the bit those of the CPU run."""
    rp.sync_params_to_tape(tp_dev)
    rp.sync_optimizer(opt_dev)
    for p in tp_cpu.params():
        assert_bits_equal(rp.grad(p.id), tp_cpu.grad(p), f"grad {p.id}")
        assert_bits_equal(tp_dev.values[p.id], tp_cpu.values[p.id], f"param {p.id}")
    assert (opt_dev.t, opt_dev.b1t, opt_dev.b2t) == (opt_cpu.t, opt_cpu.b1t, opt_cpu.b2t)
    for e_dev, e_cpu in zip(opt_dev.entries, opt_cpu.entries, strict=True):
        assert sorted(e_dev.state) == sorted(e_cpu.state)
        for name in e_cpu.state:          # every slot of the optimizer (m, v, vmax, buf)
            assert_bits_equal(e_dev.state[name], e_cpu.state[name], f"{name} {e_cpu.node_id}")


def nonfinite_batch_setup(device_engine):
    """The NaN-batch scenario of the engine tests: two identical MLP tapes, each with
    Adam(0.01) and clip 1.0, one on the CPU engine and one on ``device_engine(tp,
    loss_id, opt)``; 12 batches, the sixth all NaN.  Returns (engines, tapes, data),
    engines = [(engine, x, y, opt)], the CPU's first."""
    engines, tapes = [], []
    for make in (lambda tp, loss_id, opt: make_engine("cpu", tp, loss_id, opt), device_engine):
        tp, x, y, loss = mlp(np.random.default_rng(11))
        opt = with_params(Adam(0.01), tp, clip=1.0)
        engines.append((make(tp, loss.id, opt), x, y, opt))
        tapes.append(tp)
    data = batches(np.random.default_rng(12), 12)
    data[5] = (np.full_like(data[5][0], np.nan), data[5][1])
    return engines, tapes, data


def train_step_all(engines, xb, yb):
    """One train_step of every engine on the batch (xb, yb): their losses."""
    losses = []
    for engine, x, y, _ in engines:
        engine.set_input(x.id, xb)
        engine.set_input(y.id, yb)
        losses.append(engine.train_step())
    return losses


def assert_engines_end_alike(engines, tapes):
    """After finish(): the device tape's params equal to the bit the CPU tape's, and both
    optimizers at step 11 (the NaN batch's step rolled back)."""
    for engine, *_ in engines:
        engine.finish()
    for p in tapes[0].params():
        assert_bits_equal(tapes[1].values[p.id], tapes[0].values[p.id], f"param {p.id}")
    assert engines[1][3].t == engines[0][3].t == 11


def ptx_entries(text: str) -> dict:
    """{kernel name: its PTX body} of an nvcc --ptx output."""
    import re
    parts = re.split(r"\.entry\s+(\w+)\(", text)
    return dict(zip(parts[1::2], parts[2::2]))


def assert_fma_only_in_inner_products(text: str, dtype: str, inner: set) -> None:
    """The FMA contract in PTX: every kernel in ``inner`` (an inner product) multiplies
    and adds with fma.rn.f64 (f32: fma.rn.f32) and no separate multiply of that type;
    every other kernel has no fma of any kind (nothing else is contracted)."""
    import re
    entries = ptx_entries(text)
    assert inner <= set(entries), (inner, sorted(entries))
    ty = "f32" if dtype == "f32" else "f64"
    for name, body in entries.items():
        if name in inner:
            assert re.search(rf"\bfma\.rn\.{ty}\b", body), f"{name}: no fma.rn.{ty}"
            assert not re.search(r"\bfma\.(?!rn\.)", body), f"{name}: an fma not .rn"
        else:
            assert not re.search(r"\bfma\.", body), f"{name}: nvcc fused a multiply-add"


VARIANTS = ["tiled", "per-thread", "per-thread-reversed"]


def backward_grads(tp, loss):
    tp.zero_grad()
    tp.backward(loss)
    return {p.id: np.array(tp.grad(p)) for p in tp.params()}


def host_matches(tp, loss, variant="tiled"):
    """Forward and backward on the host backend give the tape's bits (NaN payloads aside)."""
    require_c_compiler()
    want = backward_grads(tp, loss)
    rp = capture(tp, loss, "host", host_kernels=variant)
    rp.forward()
    rp.backward()
    for i in range(len(tp.nodes)):
        got, ref = np.asarray(rp.value(i), float), np.asarray(tp.values[i], float)
        assert np.array_equal(np.isnan(got), np.isnan(ref)), i
        ok = ~np.isnan(ref)
        assert_bits_equal(got[ok], ref[ok], f"{variant}: node {i} ({tp.nodes[i].op})")
    for pid, g in want.items():
        got = rp.grad(pid)
        assert np.array_equal(np.isnan(got), np.isnan(g)), pid
        assert_bits_equal(got[~np.isnan(g)], g[~np.isnan(g)], f"{variant}: grad {pid}")


def assert_emitted_c_equals_tape(tmp_path: Path, cases, cc: str, *, cflags=()) -> None:
    """Emit each (name, tape, loss) of ``cases`` as C (gradtool.emit.cuda), compile them
    into one harness program with the real C compiler, run it, and compare every loss and
    parameter gradient with the tape's own backward, bit for bit."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import emitc_harness as H
    from gradtool.emit.cuda import emit_cuda, layout

    sources, runs, want = [], [], {}
    for fname, tp, loss in cases:
        sources.append(emit_cuda(tp, loss, name=fname))
        lay = layout(tp, loss)
        runs.append((fname, tp, lay))
        tp.backward(loss)
        want[fname] = (H.to_bits(tp.value(loss)[0]),
                       [H.to_bits(tp.grad(tp.var(i))[0]) for i in lay.params])
    src = tmp_path / "emitted.c"
    src.write_text(H.harness_program(sources, runs))
    exe = tmp_path / "emitted"
    proc = subprocess.run([cc, "-std=c99", "-O2", "-ffp-contract=off", *cflags, "-o",
                           str(exe), str(src), "-lm"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[:2000]
    got = H.parse_output(subprocess.run([str(exe)], capture_output=True, text=True,
                                        check=True).stdout)
    assert set(got) == set(want)
    for fname, (loss_bits, grads) in want.items():
        assert H.same_bits(got[fname]["loss"], loss_bits), fname
        for j, g in enumerate(grads):
            assert H.same_bits(got[fname]["p"][j], g), f"{fname} p[{j}]"


def run_no_fma(script: str, a, b) -> "np.ndarray":
    """Run ``script`` in a fresh interpreter under ``GRADTOOL_NO_FMA=1`` (so every library
    it loads is the libm-fma build) with argv ``a.npy b.npy out.npy``; what it saved."""
    import os
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        np.save(f"{tmp}/a.npy", a)
        np.save(f"{tmp}/b.npy", b)
        env = {**os.environ, "GRADTOOL_NO_FMA": "1", "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-c", script, f"{tmp}/a.npy", f"{tmp}/b.npy",
                        f"{tmp}/c.npy"], env=env, check=True, timeout=600)
        return np.load(f"{tmp}/c.npy")


def run_c_program(tmp_path, source: str, name: str) -> str:
    """Compile the C program ``source`` against gradtool's csrc with the project's flags
    (gradtool.native.SAFE_FLAGS, as an executable), run it, and return its stdout; a
    failed run fails the test with its output."""
    from gradtool import native
    require_c_compiler()
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    exe = tmp_path / name
    flags = [f for f in native.SAFE_FLAGS if f not in ("-shared", "-fPIC")]
    subprocess.run([native.compiler(), *flags, f"-I{native.CSRC}", str(src), "-o", str(exe),
                    "-lm"], check=True, capture_output=True, timeout=300)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stdout + proc.stderr
    return proc.stdout
