"""The shipped sample samples/tiny_gpt: a GPT-style torch.nn model recorded through the
importer, trained by `gradtool train` on cpu, host and two MPI ranks to the same bytes,
its weights handed back to torch.  Skipped cleanly without torch (and the MPI part
without mpi4py/mpiexec)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gradtool as gt                                          # noqa: E402
from conftest import require_c_compiler                        # noqa: E402
from gradtool.interop.torch import load_weights                # noqa: E402
from support import mpiexec_path, run, train_under_mpiexec      # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "tiny_gpt"
TAPE, DATA = SAMPLE / "tiny_gpt.msgpack", SAMPLE / "tokens.npz"
STEPS = ["--steps", 6]

warnings.filterwarnings("ignore", category=FutureWarning)


def _model_module():
    spec = importlib.util.spec_from_file_location("tiny_gpt_model", SAMPLE / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_script_reproduces_the_committed_files_byte_for_byte(tmp_path):
    proc = subprocess.run([sys.executable, str(SAMPLE / "record.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for name in ("tiny_gpt.msgpack", "tokens.npz"):
        assert (tmp_path / name).read_bytes() == (SAMPLE / name).read_bytes(), \
            f"{name}: re-run `python samples/tiny_gpt/record.py` and commit"
    assert TAPE.stat().st_size + DATA.stat().st_size < 1_000_000


def test_the_tape_names_params_and_slots_as_torch_does():
    tf = gt.load(TAPE)
    mod = _model_module()
    model, _ = mod.build()
    names = [tf.tape.nodes[p.id].name for p in tf.tape.params()]
    assert names == [k for k, p in model.named_parameters()]
    assert [tf.tape.nodes[v.id].name for v in tf.tape.input_slots()] == ["idx", "targets"]


def test_cpu_and_host_train_to_the_same_bytes(tmp_path):
    require_c_compiler()
    outs = {}
    for backend in ("cpu", "host"):
        outs[backend] = tmp_path / f"{backend}.msgpack"
        r = run("train", TAPE, "--data", DATA, *STEPS, "--backend", backend,
                "--save", outs[backend])
        assert r.exit_code == 0, r.output
    assert outs["cpu"].read_bytes() == outs["host"].read_bytes()
    assert outs["cpu"].read_bytes() != TAPE.read_bytes()


@pytest.mark.skipif(mpiexec_path() is None,
                    reason="MPI tests skipped: mpi4py or mpiexec missing "
                           "(pip install -e '.[mpi]')")
def test_two_mpi_ranks_train_to_the_same_bytes_as_one_process(tmp_path):
    one, two = tmp_path / "one.msgpack", tmp_path / "two.msgpack"
    r = run("train", TAPE, "--data", DATA, *STEPS, "--shards", 2, "--save", one)
    assert r.exit_code == 0, r.output
    assert train_under_mpiexec(TAPE, ["--data", DATA, *STEPS, "--shards", 2],
                               two) == one.read_bytes()


def test_trained_weights_back_in_torch_give_gradtools_loss(tmp_path):
    out = tmp_path / "trained.msgpack"
    r = run("train", TAPE, "--data", DATA, *STEPS, "--save", out)
    assert r.exit_code == 0, r.output
    tf = gt.load(out)
    tape = tf.tape
    loss = float(tape.values[tape.var(tf.loss).id][0])       # the saved slots' batch
    mod = _model_module()
    model, _ = mod.build()
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    model = model.double()
    load_weights(model, out)
    assert any(not torch.equal(before[k].double(), p) for k, p in model.named_parameters())
    slots = {tape.nodes[v.id].name: torch.from_numpy(tape.values[v.id].copy())
             for v in tape.input_slots()}
    with torch.no_grad():
        ref = model(slots["idx"], slots["targets"]).item()
    assert abs(ref - loss) <= 1e-12 * abs(loss), (ref, loss)
    assert np.isfinite(loss)
