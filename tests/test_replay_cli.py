"""`gradtool replay-gpu` and `gradtool train --backend host` from the command line."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import gradtool as gt
from conftest import assert_bits_equal
from gradtool.cli import main
from gradtool.device.cuda import cuda_status
from gradtool.tapefile import load, save

ROOT = Path(__file__).resolve().parent.parent
# every sample, the f32 ones (*_f32.msgpack) too: they replay as f32, bit for bit
SAMPLES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "samples").rglob("*.msgpack"))


def run(*args):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(autouse=True)
def in_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_samples_exist():
    assert len(SAMPLES) >= 4, SAMPLES


@pytest.mark.parametrize("sample", SAMPLES)
def test_check_passes_bit_for_bit_on_every_sample(sample):
    code, out, err = run("replay-gpu", sample, "--backend", "host", "--check", "--train", "adam-seed",
                         "--episodes", "3", "--warmup", "1", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["backend"] == "host"
    assert report["dtype"] == ("f32" if sample.endswith("_f32.msgpack") else "f64")
    assert report["check"]["ok"] is True
    assert report["check"]["max_ulps"] == 0.0
    n_params = sum(1 for n in load(sample).tape.nodes if n.op == "param")
    assert len(report["check"]["items"]) == 1 + 2 * n_params      # loss, grads, params after a step
    assert report["launches"]["episode"] == sum(report["launches"][k]
                                                for k in ("forward", "backward", "optimizer"))
    assert report["median"] > 0 and report["p10"] <= report["median"] <= report["p90"]
    assert report["device_bytes"] > 0


def test_text_report_and_auto_backend():
    code, out, err = run("replay-gpu", "samples/logistic.msgpack", "--check", "--episodes", "4")
    assert code == 0, err
    backend = "cuda" if cuda_status()[0] else "host"
    assert f"backend {backend} (auto: " in out
    assert "identical to the bit to the CPU tape" in out
    assert "max ulp difference 0" in out
    for word in ("median", "p10", "p90", "episodes/s", "launches per episode", "device memory"):
        assert word in out


def test_f32_converts_an_f64_tape_and_checks_bit_for_bit():
    """--dtype f32 on an f64 tape: its f32 copy (leaves rounded once) replays with that
    copy's CPU reference bits; an f32 tape replays as f32 without the flag, and
    --dtype f64 does not widen it."""
    code, out, err = run("replay-gpu", "samples/attention.msgpack", "--backend", "host",
                         "--dtype", "f32", "--check", "--train", "adam", "--episodes", "2",
                         "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["dtype"] == "f32" and report["converted"] is True
    assert report["check"]["ok"] and report["check"]["max_ulps"] == 0.0
    code64, out64, _ = run("replay-gpu", "samples/attention.msgpack", "--backend", "host",
                           "--check", "--episodes", "2", "--json")
    assert code64 == 0 and json.loads(out64)["loss_last"] != report["loss_last"]   # float32
    code, out, err = run("replay-gpu", "samples/digits_mlp_f32.msgpack", "--backend", "host",
                         "--check", "--episodes", "2")
    assert code == 0, err
    assert "f32" in out and "identical to the bit to the CPU tape" in out
    code, out, err = run("replay-gpu", "samples/digits_mlp_f32.msgpack", "--backend", "host",
                         "--dtype", "f64", "--episodes", "1")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "f32 tape" in err, err


def test_training_episodes_lower_the_loss():
    code, out, err = run("replay-gpu", "samples/mlp_regression.msgpack", "--backend", "host",
                         "--train", "sgd", "--lr", "0.05", "--episodes", "50", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["train"] == "sgd" and report["lr"] == 0.05
    assert report["loss_last"] < report["loss_first"]


def test_usage_and_input_errors_are_one_line_exit_2(tmp_path):
    code, out, err = run("replay-gpu", str(tmp_path / "missing.msgpack"), "--backend", "host")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "missing.msgpack" in err
    code, out, err = run("replay-gpu", "samples/logistic.msgpack", "--lr", "0.1")
    assert code == 2 and "--lr needs --train" in err
    # a tape the device cannot replay: a broadcast that stays rank 18 after collapsing
    tp = gt.Tape()
    a = tp.param(np.ones((2, 1) * 9))
    b = tp.param(np.ones((1, 2) * 9))
    path = tmp_path / "deep.msgpack"
    save(tp, path, loss=tp.sum(a * b))
    code, out, err = run("replay-gpu", str(path), "--backend", "host")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "deep.msgpack" in err and "node 2" in err and "at most 8" in err


@pytest.mark.skipif(cuda_status()[0], reason="a CUDA device is present")
def test_cuda_without_a_device_is_exit_2():
    code, out, err = run("replay-gpu", "samples/logistic.msgpack", "--backend", "cuda")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "cuda backend is unavailable" in err


def test_check_failure_is_exit_1(monkeypatch):
    """A device that computed a different gradient fails --check with exit 1."""
    from gradtool.device import engine

    real = engine.DeviceReplay.grad

    def off_by_one_ulp(self, node):
        g = real(self, node).copy()
        g.reshape(-1)[0] = np.nextafter(g.reshape(-1)[0], np.inf)
        return g

    monkeypatch.setattr(engine.DeviceReplay, "grad", off_by_one_ulp)
    code, out, err = run("replay-gpu", "samples/logistic.msgpack", "--backend", "host",
                         "--check", "--episodes", "1")
    assert code == 1
    assert "NOT identical" in out and "1 ulp" in out
    assert len(err.strip().splitlines()) == 1 and "--check failed" in err


def test_train_backend_host_saves_the_same_bits_as_cpu(tmp_path):
    saved = {}
    for backend in ("cpu", "host"):
        out = tmp_path / f"{backend}.msgpack"
        code, stdout, err = run("train", "samples/digits_mlp.msgpack", "--data",
                                "samples/digits.npz", "--epochs", "1", "--clip", "2.0",
                                "--save", str(out), "--backend", backend)
        assert code == 0, err
        assert f"backend {backend}" in err
        saved[backend] = out
    assert saved["cpu"].read_bytes() == saved["host"].read_bytes()
    cpu, host = load(saved["cpu"]), load(saved["host"])
    for p in cpu.tape.params():
        assert_bits_equal(host.tape.values[p.id], cpu.tape.values[p.id], f"param {p.id}")
    assert cpu.optimizer["t"] == host.optimizer["t"] == 46


@pytest.mark.parametrize("dtype", ["f64", "f32"])
@pytest.mark.parametrize("bad", ["nan", "-inf"])
def test_check_on_a_nonfinite_loss_follows_the_training_contract(tmp_path, dtype, bad):
    """log of a negative (NaN) or of zero (-inf): the loss is non-finite on both sides, so
    neither engine takes the step; --check compares equal non-finite values as equal."""
    tp = gt.Tape()
    w = tp.param(np.array([1.0, 2.0]), name="w")
    x = tp.const(np.array([-1.0 if bad == "nan" else 0.0, 1.0]), name="x")
    loss = tp.sum(tp.log(w * x))
    path = tmp_path / "bad.msgpack"
    save(tp, path, loss=loss)
    code, out, err = run("replay-gpu", str(path), "--backend", "host", "--dtype", dtype,
                         "--check", "--train", "adam-seed", "--episodes", "2", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["check"]["ok"] is True
    last = float(report["loss_last"])
    assert (np.isnan(last) if bad == "nan" else last == float(bad)), report["loss_last"]
    steps = [item for item in report["check"]["items"] if "after one step" in item["what"]]
    assert len(steps) == 1 and steps[0]["ok"], report["check"]["items"]


def test_relative_error_treats_equal_infinities_as_equal():
    from gradtool.device.engine import relative_error
    inf = float("inf")
    assert relative_error([inf, 1.0], [inf, 1.0]) == 0.0
    assert relative_error([-inf, 2.0], [-inf, 2.0 + 2e-16 * 2]) <= 1e-15
    assert relative_error([inf, 1.0], [-inf, 1.0]) == inf
    assert relative_error([5.0, 1.0], [inf, 1.0]) == inf
    assert relative_error([np.nan], [1.0]) == inf
    assert relative_error([1.5], [1.0]) == 0.5
