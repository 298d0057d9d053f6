"""The autoencoder benchmark sample (samples/autoencoder/): reproducible files, engines agree.

The sample's recording script must regenerate both shipped files byte for
byte; a short run through the CPU engine and the device engine's host
backend must end on identical bits (in memory and through ``gradtool
train --save``); the reconstruction error must go down; ``replay-gpu
--check`` must pass; and scripts/bench_ae.py's own bit-equality check must
hold on a short run.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
from click.testing import CliRunner

from conftest import assert_bits_equal, require_c_compiler
from gradtool.cli import main as cli
from gradtool.tapefile import load
from gradtool.train import Trainer, TrainOptions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_DIR = os.path.join(ROOT, "samples", "autoencoder")
SCRIPT = os.path.join(SAMPLE_DIR, "make_autoencoder.py")
TAPE_PATH = os.path.join(SAMPLE_DIR, "ae.msgpack")
DATA_PATH = os.path.join(SAMPLE_DIR, "ae_data.npz")
EPISODES = 12                      # two epochs of the 6 batches


def _short_run(backend: str):
    """EPISODES steps through the Trainer `gradtool train` uses; (trainer, result)."""
    trainer = Trainer(load(TAPE_PATH), DATA_PATH, TrainOptions(steps=EPISODES, backend=backend))
    result = trainer.run(keep_history=True)
    trainer.engine.finish()
    return trainer, result


def test_script_reproduces_the_files_byte_for_byte(tmp_path):
    subprocess.run([sys.executable, SCRIPT, str(tmp_path)], check=True, capture_output=True,
                   timeout=60)
    for name in ("ae.msgpack", "ae_data.npz"):
        with open(os.path.join(SAMPLE_DIR, name), "rb") as shipped:
            assert (tmp_path / name).read_bytes() == shipped.read(), name


def test_the_shipped_workload():
    tf = load(TAPE_PATH)
    tape = tf.tape
    shapes = [tuple(tape.values[p.id].shape) for p in tape.params()]
    assert shapes == [(6, 64), (1, 64), (64, 32), (1, 32), (32, 64), (1, 64), (64, 6), (1, 6)]
    slots = tape.input_slots()
    assert [tape.nodes[s.id].name for s in slots] == ["x"]
    assert tape.values[slots[0].id].shape == (200, 6)
    assert [tape.nodes[i].op for i in range(len(tape.nodes))].count("relu") == 3
    assert tf.meta["train"] == {"optimizer": "adam", "lr": 0.003, "epochs": 60,
                                "shuffle": False}
    x = np.load(DATA_PATH)["x"]
    assert x.shape == (1200, 6) and x.dtype == np.float64     # 6 batches an epoch, 360 steps
    assert np.isfinite(x).all()


def test_cpu_and_host_engines_end_on_the_same_bits_and_the_mse_falls():
    require_c_compiler()
    cpu, cpu_result = _short_run("cpu")
    host, host_result = _short_run("host")
    assert host.engine.name == "host"
    assert cpu_result.steps == host_result.steps == EPISODES
    cpu_losses = np.array([loss for _, loss in cpu_result.step_losses])
    host_losses = np.array([loss for _, loss in host_result.step_losses])
    assert_bits_equal(host_losses, cpu_losses, "step losses")
    for a, b in zip(cpu.opt.entries, host.opt.entries, strict=True):
        name = cpu.tape.nodes[a.node_id].name
        assert_bits_equal(host.tape.values[b.node_id], cpu.tape.values[a.node_id], name)
        assert_bits_equal(b.m, a.m, f"{name} m")
        assert_bits_equal(b.v, a.v, f"{name} v")
    assert (host.opt.t, host.opt.b1t, host.opt.b2t) == (cpu.opt.t, cpu.opt.b1t, cpu.opt.b2t)
    # each batch reconstructs better in the second epoch than in the first (no shuffle:
    # step k and step k + 6 see the same rows)
    first, second = cpu_losses[:6], cpu_losses[6:]
    assert (second < first).all(), (first, second)
    assert second.mean() < 0.5 * first.mean()
    assert math.isfinite(cpu_result.final_loss)


def test_gradtool_train_host_saves_the_same_bytes_as_cpu(tmp_path):
    require_c_compiler()
    outs = {}
    for backend in ("cpu", "host"):
        outs[backend] = tmp_path / f"{backend}.msgpack"
        result = CliRunner().invoke(cli, ["train", TAPE_PATH, "--data", DATA_PATH,
                                          "--steps", str(EPISODES), "--backend", backend,
                                          "--save", str(outs[backend])])
        assert result.exit_code == 0, result.output
    assert outs["host"].read_bytes() == outs["cpu"].read_bytes()
    saved = load(outs["cpu"])
    assert saved.optimizer["t"] == EPISODES
    assert saved.optimizer["position"]["global_step"] == EPISODES


def test_replay_gpu_check_on_the_host_backend():
    require_c_compiler()
    result = CliRunner().invoke(cli, ["replay-gpu", TAPE_PATH, "--backend", "host", "--check",
                                      "--episodes", "10", "--warmup", "1"])
    assert result.exit_code == 0, result.output


def _bench_module():
    """A fresh copy of scripts/bench_ae.py as a module (each test may change its tables)."""
    spec = importlib.util.spec_from_file_location("bench_ae",
                                                  os.path.join(ROOT, "scripts", "bench_ae.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _run_bench(bench, tmp_path, *args):
    """bench.main on a short run without PyTorch: (exit status, its --json report)."""
    out = tmp_path / "bench.json"
    status = bench.main([*args, "--warmup", "0", "--no-torch", "--json", str(out)])
    return status, json.loads(out.read_text())


def test_bench_script_checks_bit_equality_on_a_short_run(tmp_path):
    require_c_compiler()
    status, report = _run_bench(_bench_module(), tmp_path, "--episodes", "8", "--repeats", "2",
                                "--backends", "cpu,host")
    assert status == 0
    assert report["all_gradtool_bit_equal"] is True
    assert [r["backend"] for r in report["rows"]] == ["cpu", "host"]
    assert [r["bit_equal"] for r in report["rows"]] == [True, True]
    assert report["rows"][0]["mse"] == report["rows"][1]["mse"]


def test_bench_script_exits_1_when_a_backend_ends_on_other_bits(tmp_path, capsys):
    require_c_compiler()
    bench = _bench_module()
    # float32 replay is close to the CPU tape but not equal to it: the check must notice
    bench.GRADTOOL_BACKENDS["host-f32"] = ("host", {"dtype": "f32"})
    status, report = _run_bench(bench, tmp_path, "--episodes", "4", "--repeats", "1",
                                "--backends", "cpu,host-f32")
    assert status == 1
    assert report["all_gradtool_bit_equal"] is False
    assert [r["bit_equal"] for r in report["rows"]] == [True, False]
    assert "host-f32 ended on other parameter bits than cpu" in capsys.readouterr().err
