"""The committed samples: each script regenerates its files byte for byte, and each
file is what the other commands and issues rely on."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradtool.tapefile import load

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
SCRIPTS = {
    "make_logistic.py": ["logistic.msgpack"],
    "make_mlp.py": ["mlp_regression.msgpack", "mlp_regression.npz"],
    "make_attention.py": ["attention.msgpack"],
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_script_reproduces_the_committed_files_byte_for_byte(script, tmp_path):
    proc = subprocess.run([sys.executable, str(SAMPLES / script), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in SCRIPTS[script]:
        fresh, committed = (tmp_path / name).read_bytes(), (SAMPLES / name).read_bytes()
        assert fresh == committed, f"{name}: re-run `python samples/{script}` and commit"
        assert len(committed) < 100_000


def test_logistic_is_all_scalars_with_the_documented_leaves():
    tf = load(SAMPLES / "logistic.msgpack")
    tape = tf.tape
    assert all(v.shape == (1,) for v in tape.values)
    assert [tape.nodes[p.id].name for p in tape.params()] == ["w0", "w1", "b"]
    assert [tape.nodes[c.id].name for c in tape.input_slots()] == ["x0", "x1", "y"]
    assert {n.op for n in tape.nodes} == {"param", "const", "mul", "add", "sigmoid", "log",
                                           "neg", "adds"}
    assert tf.loss.id == len(tape.nodes) - 1
    w0, w1, b, x0, x1, y = (float(tape.values[i][0]) for i in range(6))
    p = 1.0 / (1.0 + np.exp(-(w0 * x0 + w1 * x1 + b)))
    expected = -(y * np.log(p) + (1.0 - y) * np.log(1.0 - p))
    assert float(tape.values[tf.loss.id][0]) == pytest.approx(expected, rel=1e-14)


def test_mlp_regression_layout_and_training_data():
    tf = load(SAMPLES / "mlp_regression.msgpack")
    tape = tf.tape
    params = {tape.nodes[p.id].name: (p.shape, tape.nodes[p.id].l2) for p in tape.params()}
    assert params == {"W1": ((4, 16), 1e-4), "b1": ((16,), 0.0), "W2": ((16, 1), 1e-4),
                      "b2": ((1,), 0.0)}
    slots = {tape.nodes[c.id].name: c.shape for c in tape.input_slots()}
    assert slots == {"x": (32, 4), "y": (32, 1)}
    assert set(tf.outputs) == {"pred"} and tf.outputs["pred"].shape == (32, 1)
    assert tape.nodes[tf.loss.id].op == "mean"
    with np.load(SAMPLES / "mlp_regression.npz") as data:
        assert sorted(data.files) == ["x", "y"]
        x, y = data["x"], data["y"]
    assert x.shape == (512, 4) and y.shape == (512, 1) and x.dtype == y.dtype == np.float64
    np.testing.assert_array_equal(tape.values[tape.var("x").id], x[:32])
    np.testing.assert_array_equal(tape.values[tape.var("y").id], y[:32])
    assert 0.1 < float(np.std(y)) < 2.0, "a learnable, non-constant target"


def test_attention_uses_the_block_ops():
    tf = load(SAMPLES / "attention.msgpack")
    ops = {n.op for n in tf.tape.nodes}
    assert {"bmm", "softmax", "transpose", "reshape", "slice", "concat", "matmul", "add"} <= ops
    assert tf.tape.nodes[tf.loss.id].op == "mean"
    att = tf.outputs["attention"]
    np.testing.assert_allclose(np.sum(tf.tape.value(att), axis=2), 1.0, rtol=1e-14)
