"""`gradtool train`: the loop, resume to the bit, Ctrl-C, non-finite losses, data errors."""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import assert_bits_equal
from gradtool.cli import main
from gradtool.npzio import write_npz
from gradtool.optim import Adam, SGD
from gradtool.tape import Tape
from gradtool.tapefile import load, save
from gradtool.train import CpuEngine, Reporter, TrainError, TrainOptions, Trainer, make_engine
from gradtool.train.data import count_correct, epoch_order, parse_accuracy, input_slots
from support import DIGITS, DIGITS_DATA, stderr_through_a_terminal


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_line_error(result, status, *needles):
    assert result.exit_code == status, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert lines and lines[-1].startswith("gradtool: "), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[-1], (needle, lines[-1])
    return lines[-1]


def params_of(path):
    tf = load(path)
    return [tf.tape.value(p).copy() for p in tf.tape.params()]


def linear_problem(tmp_path, xs, *, batch=1, w0=1.0, loss="log", name="lin"):
    """A one-weight tape: loss = log(w * x) (or sqrt), one example per row of xs."""
    tp = Tape()
    x = tp.const(np.ones((batch, 1)), name="x")
    w = tp.param(np.full((1, 1), w0), name="w")
    z = tp.mean(x @ w)
    out = tp.log(z) if loss == "log" else tp.sqrt(z)
    path = tmp_path / f"{name}.msgpack"
    save(tp, path, loss=out)
    data = tmp_path / f"{name}.npz"
    write_npz(data, {"x": np.asarray(xs, dtype=np.float64).reshape(-1, 1)})
    return path, data


# ── the main demo ──────────────────────────────────────────────────────────

def test_digits_demo_reaches_95_percent_with_the_tape_defaults(tmp_path):
    result = run("train", DIGITS, "--data", DIGITS_DATA, "--json")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    summary = json.loads(lines[-1])
    epoch_lines = [ln for ln in lines if ln.startswith("epoch ")]
    assert len(epoch_lines) == summary["epochs"] == 20
    assert "val_loss" in epoch_lines[0] and "val_acc" in epoch_lines[0]
    assert summary["val_accuracy"] >= 0.95
    assert summary["steps"] == 20 * (1477 // 32)
    assert set(summary) >= {"steps", "epochs", "final_loss", "val_loss", "val_accuracy",
                            "seconds"}
    assert "last partial batch of 5 is dropped" in result.stderr
    assert "\r" not in result.stderr              # no progress bar when stderr is not a tty


# ── resume to the bit ──────────────────────────────────────────────────────

def test_two_epochs_save_one_more_equals_three_straight(tmp_path):
    straight, first, resumed = (tmp_path / n for n in ("s.msgpack", "a.msgpack", "b.msgpack"))
    assert run("train", DIGITS, "--data", DIGITS_DATA, "--epochs", 3, "--save",
               straight).exit_code == 0
    assert run("train", DIGITS, "--data", DIGITS_DATA, "--epochs", 2, "--save",
               first).exit_code == 0
    r = run("train", first, "--data", DIGITS_DATA, "--epochs", 1, "--save", resumed)
    assert r.exit_code == 0, r.stderr
    assert "continuing at epoch 3 step 0" in r.stderr
    assert r.stdout.splitlines()[0].startswith("epoch 3/3")
    assert resumed.read_bytes() == straight.read_bytes()
    state = load(straight).optimizer
    assert state["t"] == 3 * 46 and state["position"]["epoch"] == 3


def test_stopping_mid_epoch_and_resuming_finishes_the_plan_bit_for_bit(tmp_path):
    straight, part = tmp_path / "s.msgpack", tmp_path / "p.msgpack"
    common = ["--data", DIGITS_DATA, "--optimizer", "sgd", "--lr", 0.05, "--clip", 1.0,
              "--seed", 7]
    assert run("train", DIGITS, *common, "--epochs", 2, "--save", straight).exit_code == 0
    r = run("train", DIGITS, *common, "--epochs", 2, "--steps", 50, "--save", part)
    assert r.exit_code == 0 and "stopped after 50 steps" in r.stderr
    pos = load(part).optimizer["position"]
    assert (pos["epoch"], pos["step"], pos["global_step"]) == (1, 4, 50)
    # no --epochs: an unfinished run finishes its plan; lr, clip, seed come from the file
    r = run("train", part, "--data", DIGITS_DATA, "--save", part)
    assert r.exit_code == 0, r.stderr
    assert part.read_bytes() == straight.read_bytes()


def test_every_checkpoint_equals_a_run_stopped_there(tmp_path):
    stopped, ckpt = tmp_path / "stopped.msgpack", tmp_path / "ckpt.msgpack"
    assert run("train", DIGITS, "--data", DIGITS_DATA, "--steps", 23, "--save",
               stopped).exit_code == 0
    tf = load(DIGITS)
    copies = {}

    class Snapshot(Reporter):       # sees the file between steps
        def step(self, record):
            if record["global_step"] in (24, 47):
                copies[record["global_step"]] = ckpt.read_bytes()

    Trainer(tf, DIGITS_DATA, TrainOptions(steps=50, every=23, save=str(ckpt)),
            [Snapshot()]).run()
    assert copies[24] == stopped.read_bytes()
    # step 46 closes epoch 1: that checkpoint is written after the epoch closes
    pos = load(copies[47]).optimizer["position"]
    assert (pos["epoch"], pos["step"], pos["global_step"]) == (1, 0, 46)
    assert load(ckpt).optimizer["position"]["global_step"] == 50      # the final save


def test_saved_state_and_l2_override(tmp_path):
    out = tmp_path / "o.msgpack"
    r = run("train", DIGITS, "--data", DIGITS_DATA, "--steps", 3, "--l2", 0.25, "--lr", 0.002,
            "--clip", 2.5, "--save", out)
    assert r.exit_code == 0, r.stderr
    state = load(out).optimizer
    assert state["kind"] == "adam-seed" and state["lr"] == 0.002 and state["clip"] == 2.5
    assert [p["l2"] for p in state["params"]] == [0.25] * 4
    assert state["position"]["seed"] == 0 and state["position"]["shuffle"] is True
    # the saved file keeps the tape's own example inputs, not the last minibatch
    orig, saved = load(DIGITS), load(out)
    for v in orig.tape.input_slots():
        assert_bits_equal(saved.tape.values[v.id], orig.tape.values[v.id])
    assert saved.meta == orig.meta and set(saved.outputs) == {"logits", "probs"}


def test_resuming_with_another_optimizer_is_refused(tmp_path):
    out = tmp_path / "o.msgpack"
    assert run("train", DIGITS, "--data", DIGITS_DATA, "--steps", 2, "--save", out).exit_code == 0
    assert_one_line_error(run("train", out, "--data", DIGITS_DATA, "--optimizer", "sgd"), 2,
                          "'adam-seed'", "'sgd'")


# ── Ctrl-C in a real process ───────────────────────────────────────────────

@pytest.mark.parametrize("signame,said", [("SIGINT", "interrupted"),
                                            ("SIGTERM", "terminated by SIGTERM"),
                                            ("SIGHUP", "terminated by SIGHUP")])
def test_a_signal_stops_at_a_step_boundary_saves_and_resumes_bit_for_bit(tmp_path, signame,
                                                                         said):
    """Ctrl-C, kill and a closed terminal all stop the run at a step boundary and save it
    (--every 1: a save is under way at almost any moment), leaving no temporary file."""
    sig = getattr(signal, signame)
    out, log = tmp_path / "out.msgpack", tmp_path / "log.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from gradtool.cli import main; main()", "train", str(DIGITS),
         "--data", str(DIGITS_DATA), "--epochs", "100000", "--save", str(out), "--every", "1",
         "--log", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if log.exists() and log.read_text().count('"event": "step"') >= 60:
                break
            time.sleep(0.05)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, stderr
    lines = stderr.splitlines()
    assert lines[-1].startswith(f"gradtool: {said} after step ") and "saved" in lines[-1]
    assert "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "out.msgpack"]
    pos = load(out).optimizer["position"]
    steps = [json.loads(ln) for ln in log.read_text().splitlines()
             if json.loads(ln)["event"] == "step"]
    assert steps[-1]["global_step"] == pos["global_step"] >= 60
    # finish the interrupted epoch and compare with a straight run of that many epochs
    resumed, straight = tmp_path / "r.msgpack", tmp_path / "s.msgpack"
    assert run("train", out, "--data", DIGITS_DATA, "--epochs", 1, "--save",
               resumed).exit_code == 0
    assert run("train", DIGITS, "--data", DIGITS_DATA, "--epochs", pos["epoch"] + 1,
               "--save", straight).exit_code == 0
    assert resumed.read_bytes() == straight.read_bytes()


# ── non-finite losses ──────────────────────────────────────────────────────

def test_nonfinite_loss_stops_with_exit_1_and_keeps_the_last_finite_params(tmp_path):
    path, data = linear_problem(tmp_path, [1.0, 2.0, 3.0, -1.0, 5.0, 6.0])
    before, out = tmp_path / "before.msgpack", tmp_path / "out.msgpack"
    common = ["--data", data, "--no-shuffle", "--optimizer", "sgd", "--lr", 0.01]
    assert run("train", path, *common, "--epochs", 5, "--steps", 3, "--save",
               before).exit_code == 0
    r = run("train", path, *common, "--epochs", 5, "--save", out)
    assert_one_line_error(r, 1, "non-finite loss (nan) at step 4", "(epoch 1, step 4)",
                          "from before that step")
    assert out.read_bytes() == before.read_bytes()
    assert np.isfinite(params_of(out)[0]).all()


def test_params_broken_by_an_earlier_step_are_not_saved(tmp_path):
    # sqrt(w*x) at w*x = 0: the loss is 0 but the gradient is 0 * inf = nan, so the
    # update breaks w and only the NEXT loss is non-finite
    path, data = linear_problem(tmp_path, [0.0, 1.0, 1.0], loss="sqrt")
    out = tmp_path / "out.msgpack"
    out.write_bytes(b"previous checkpoint")
    r = run("train", path, "--data", data, "--no-shuffle", "--optimizer", "sgd",
            "--save", out)
    assert_one_line_error(r, 1, "at step 2", "not saved")
    assert out.read_bytes() == b"previous checkpoint"


# ── data handling ──────────────────────────────────────────────────────────

def test_data_errors_name_the_slot_and_both_shapes(tmp_path):
    write_npz(tmp_path / "short.npz", {"x": np.zeros((100, 63)), "y": np.zeros((100, 10))})
    assert_one_line_error(run("train", DIGITS, "--data", tmp_path / "short.npz"), 2,
                          "'x'", "[100,63]", "[32,64]", "[N,64]")
    write_npz(tmp_path / "missing.npz", {"x": np.zeros((100, 64))})
    assert_one_line_error(run("train", DIGITS, "--data", tmp_path / "missing.npz"), 2,
                          "no array 'y'", "[32,10]")
    write_npz(tmp_path / "counts.npz", {"x": np.zeros((100, 64)), "y": np.zeros((99, 10))})
    assert_one_line_error(run("train", DIGITS, "--data", tmp_path / "counts.npz"), 2,
                          "different example counts", "x 100", "y 99")
    write_npz(tmp_path / "few.npz", {"x": np.zeros((10, 64)), "y": np.zeros((10, 10))})
    assert_one_line_error(run("train", DIGITS, "--data", tmp_path / "few.npz"), 2,
                          "10 examples", "batch of 32")
    write_npz(tmp_path / "halfval.npz", {"x": np.zeros((40, 64)), "y": np.zeros((40, 10)),
                                         "x_val": np.zeros((40, 64))})
    assert_one_line_error(run("train", DIGITS, "--data", tmp_path / "halfval.npz"), 2,
                          "y_val")
    assert_one_line_error(run("train", DIGITS, "--data", tmp_path / "nothere.npz"), 2,
                          "nothere.npz")


def test_option_and_meta_errors(tmp_path):
    assert_one_line_error(run("train", DIGITS, "--data", DIGITS_DATA, "--every", 5), 2,
                          "--every needs --save")
    assert_one_line_error(run("train", DIGITS, "--data", DIGITS_DATA, "--save",
                              tmp_path / "no" / "dir.msgpack"), 2, "no such directory")
    assert_one_line_error(run("train", DIGITS, "--data", DIGITS_DATA, "--val-split", 0.2,
                              "--val", DIGITS_DATA), 2, "not both")
    assert_one_line_error(run("train", DIGITS, "--data", DIGITS_DATA, "--val-split", 1.5), 2,
                          "--val-split must be a fraction")
    assert_one_line_error(run("train", DIGITS, "--data", DIGITS_DATA, "--accuracy", "nope:y"),
                          2, "no output 'nope'", "logits")
    tf = load(DIGITS)
    bad = tmp_path / "bad.msgpack"
    save(tf.tape, bad, loss=tf.loss, outputs=tf.outputs, meta={"train": {"lrr": 0.1}})
    assert_one_line_error(run("train", bad, "--data", DIGITS_DATA), 2, "unknown key 'lrr'")
    save(tf.tape, bad, loss=tf.loss, meta={"train": {"epochs": 0}})
    assert_one_line_error(run("train", bad, "--data", DIGITS_DATA), 2, "'epochs'")


def test_backends_other_than_cpu_need_the_device_engine(monkeypatch):
    monkeypatch.setitem(sys.modules, "gradtool.device.engine", None)   # as if not installed
    assert_one_line_error(run("train", DIGITS, "--data", DIGITS_DATA, "--backend", "host"), 2,
                          "device engine", "--backend cpu")
    with pytest.raises(TrainError, match="unknown backend"):
        make_engine("tpu", None, 0, None)


def test_shuffle_order_is_pcg64_of_seed_and_epoch(tmp_path):
    xs = np.arange(1.0, 11.0)
    path, data = linear_problem(tmp_path, xs)
    log = tmp_path / "log.jsonl"
    # lr 0: the step losses log(w * x) reveal which example each step saw
    r = run("train", path, "--data", data, "--lr", 0, "--optimizer", "sgd", "--seed", 5,
            "--epochs", 2, "--log", log)
    assert r.exit_code == 0, r.stderr
    records = [json.loads(ln) for ln in log.read_text().splitlines()]
    seen = [round(float(np.exp(r["loss"]))) for r in records if r["event"] == "step"]
    want = [xs[i] for e in range(2)
            for i in np.random.Generator(np.random.PCG64([5, e])).permutation(10)]
    assert seen == want
    assert [r["event"] for r in records].count("epoch") == 2 and records[-1]["event"] == "end"
    assert list(epoch_order(5, 1, 10, False)) == list(range(10))


def test_val_split_holds_out_the_last_examples(tmp_path):
    path, data = linear_problem(tmp_path, np.arange(1.0, 11.0), batch=2)
    r = run("train", path, "--data", data, "--val-split", 0.35, "--lr", 0, "--json")
    assert r.exit_code == 0, r.stderr
    assert "training: 7 examples" in r.stderr and "dropped" in r.stderr
    assert "validation: 3 examples in 1 batches (1 left out)" in r.stderr
    summary = json.loads(r.stdout.splitlines()[-1])
    assert summary["val_loss"] == float(np.log((8.0 + 9.0) / 2))   # the batch [8, 9]


def test_accuracy_one_hot_and_labels():
    tp = Tape()
    tp.const(np.zeros((3, 4)), name="onehot")
    tp.const(np.zeros((3, 1)), name="labels")
    out = tp.param(np.zeros((3, 4)))
    slots = input_slots(tp)
    logits = np.array([[0, 5, 1, 0], [3, 0, 0, 0], [0, 0, 0, 9.0]])
    spec = parse_accuracy("o:onehot", {"o": out}, slots, tp)
    assert count_correct(spec, logits, np.eye(4)[[1, 0, 2]]) == 2
    spec = parse_accuracy("o:labels", {"o": out}, slots, tp)
    assert count_correct(spec, logits, np.array([[1.0], [1.0], [3.0]])) == 2


def test_val_file_and_training_accuracy_without_validation(tmp_path):
    train_only, val_only = tmp_path / "train.npz", tmp_path / "val.npz"
    with np.load(DIGITS_DATA) as z:
        write_npz(train_only, {"x": z["x"], "y": z["y"]})
        write_npz(val_only, {"x": z["x_val"], "y": z["y_val"]})
    builtin = run("train", DIGITS, "--data", DIGITS_DATA, "--epochs", 1, "--json")
    separate = run("train", DIGITS, "--data", train_only, "--val", val_only, "--epochs", 1,
                   "--json")
    assert builtin.exit_code == 0 and separate.exit_code == 0, separate.stderr
    a, b = (json.loads(r.stdout.splitlines()[-1]) for r in (builtin, separate))
    assert (a["val_loss"], a["val_accuracy"]) == (b["val_loss"], b["val_accuracy"])
    r = run("train", DIGITS, "--data", train_only, "--epochs", 1, "--json")
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout.splitlines()[-1])
    assert 0.0 < summary["train_accuracy"] <= 1.0 and summary["val_loss"] is None
    assert "train_acc" in r.stdout.splitlines()[0] and "val_" not in r.stdout.splitlines()[0]


# ── the engine ─────────────────────────────────────────────────────────────

def test_cpu_engine_steps_do_not_grow_memory():
    tf = load(DIGITS)
    opt = Adam(0.001)
    for p in tf.tape.params():
        opt.add(tf.tape, p)
    engine = make_engine("cpu", tf.tape, tf.loss.id, opt)
    assert isinstance(engine, CpuEngine)
    with np.load(DIGITS_DATA) as z:
        x, y = z["x"].astype(float), z["y"].astype(float)
    n = len(tf.tape)

    def steps(k):
        for i in range(k):
            rows = slice((i % 40) * 32, (i % 40) * 32 + 32)
            engine.set_input(tf.tape.var("x").id, x[rows])
            engine.set_input(tf.tape.var("y").id, y[rows])
            engine.train_step()

    tracemalloc.start()
    try:
        steps(20)
        before = tracemalloc.get_traced_memory()[0]
        steps(200)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(tf.tape) == n
    assert after - before < 64 * 1024, (before, after)


def test_cpu_engine_step_equals_forward_backward_step_by_hand(rng):
    def build():
        tp = Tape()
        x = tp.const(rng.standard_normal((4, 3)), name="x")
        w = tp.param(np.linspace(-1, 1, 6).reshape(3, 2), name="w", l2=0.1)
        return tp, x, w, tp.mean(tp.tanh(x @ w) * tp.tanh(x @ w))

    batch = rng.standard_normal((4, 3))
    (ta, xa, wa, la), (tb, xb, wb, lb) = build(), build()
    oa, ob = SGD(0.1), SGD(0.1)
    oa.add(ta, wa)
    ob.add(tb, wb)
    engine = CpuEngine(ta, la.id, oa)
    engine.set_input(xa.id, batch)
    loss = engine.train_step()
    tb.set_value(xb, batch)
    tb.forward()
    tb.backward(lb)
    ob.step(tb)
    assert loss == float(tb.value(lb)[0])
    assert_bits_equal(ta.value(wa), tb.value(wb))
    with pytest.raises(Exception, match="shape"):
        engine.set_input(xa.id, np.zeros((5, 3)))


# ── --plot ─────────────────────────────────────────────────────────────────

def test_plot_writes_an_image_or_says_what_is_missing(tmp_path, monkeypatch):
    png = tmp_path / "loss.png"
    if importlib.util.find_spec("matplotlib") is not None:
        r = run("train", DIGITS, "--data", DIGITS_DATA, "--epochs", 2, "--plot", png)
        assert r.exit_code == 0, r.stderr
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # as if not installed
    assert_one_line_error(run("train", DIGITS, "--data", DIGITS_DATA, "--plot", png), 2,
                          "matplotlib", "gradtool[plot]")


def test_progress_line_only_on_a_terminal(tmp_path):
    status, text = stderr_through_a_terminal(
        [sys.executable, "-c", "from gradtool.cli import main; main()", "train", str(DIGITS),
         "--data", str(DIGITS_DATA), "--epochs", "2"], timeout=60)
    assert status == 0
    assert "\repoch" in text.replace("\x1b[K", "") and "ex/s" in text


# ── a loss of any one-element shape ─────────────────────────────────────────

@pytest.mark.parametrize("shape", [(1, 1), (1, 1, 1)])
def test_a_one_element_loss_of_any_shape_trains_to_the_same_bits_on_every_backend(
        tmp_path, shape):
    tf = load(DIGITS)
    loss = tf.tape.reshape(tf.loss, shape)
    tape_path = tmp_path / "reshaped.msgpack"
    save(tf.tape, tape_path, loss=loss, outputs=tf.outputs, meta=tf.meta)
    saved = {}
    for backend in ("cpu", "host"):
        out = tmp_path / f"{backend}.msgpack"
        result = run("train", tape_path, "--data", DIGITS_DATA, "--steps", 6, "--backend",
                     backend, "--save", out)
        assert result.exit_code == 0, result.output
        saved[backend] = out.read_bytes()
    assert saved["cpu"] == saved["host"]
    trained = load(tmp_path / "cpu.msgpack")
    assert list(trained.tape.values[trained.loss.id].shape) == list(shape)
    assert not all(np.array_equal(a, b) for a, b in zip(params_of(tmp_path / "cpu.msgpack"),
                                                        params_of(tape_path), strict=True))


# ── the log's fields and the progress lines off a terminal ─────────────────

def test_log_steps_carry_elapsed_seconds_and_their_own_duration(tmp_path):
    log = tmp_path / "log.jsonl"
    r = run("train", DIGITS, "--data", DIGITS_DATA, "--steps", 6, "--log", log, "--json")
    assert r.exit_code == 0, r.stderr
    records = [json.loads(ln) for ln in log.read_text().splitlines()]
    steps = [rec for rec in records if rec["event"] == "step"]
    assert len(steps) == 6
    for rec in steps:                   # every field docs/training.md lists, and no other
        assert set(rec) == {"event", "epoch", "step", "steps_per_epoch", "global_step",
                            "loss", "batch", "seconds", "step_seconds"}
        assert rec["step_seconds"] > 0
    # seconds is the time since the run started: it grows, and a step's own duration
    # fits in the time since the previous record
    for before, after in zip(steps, steps[1:]):
        assert after["seconds"] > before["seconds"]
        assert after["step_seconds"] <= after["seconds"] - before["seconds"] + 1e-9
    assert steps[0]["step_seconds"] <= steps[0]["seconds"]
    assert "seconds" in json.loads(r.stdout.splitlines()[-1])     # the --json summary keeps it
    assert records[-1]["event"] == "end" and "seconds" in records[-1]


def _train_stderr(env_value, *args):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    env.pop("GRADTOOL_PROGRESS_SECONDS", None)
    if env_value is not None:
        env["GRADTOOL_PROGRESS_SECONDS"] = env_value
    return subprocess.run([sys.executable, "-m", "gradtool", "train", str(DIGITS), "--data",
                           str(DIGITS_DATA), *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_plain_progress_lines_when_stderr_is_not_a_terminal():
    """A pipe (CI, nohup): a plain line per interval, no carriage return; the interval is
    GRADTOOL_PROGRESS_SECONDS (0: every step, negative: none)."""
    every = _train_stderr("0", "--steps", "5")
    assert every.returncode == 0, every.stderr
    assert "\r" not in every.stderr and "\x1b" not in every.stderr
    progress = [ln for ln in every.stderr.splitlines() if " ex/s" in ln]
    assert len(progress) == 5
    for i, line in enumerate(progress, 1):
        assert re.fullmatch(rf"gradtool: epoch 1 step {i}/46 loss [0-9.e+-]+ [0-9,]+ ex/s "
                            rf"\([0-9]+\.[0-9] s\)", line), line
    quiet = _train_stderr("-1", "--steps", "5")
    assert quiet.returncode == 0 and " ex/s" not in quiet.stderr
    bad = _train_stderr("soon", "--steps", "5")
    assert bad.returncode == 2 and bad.stderr.splitlines() == [
        "gradtool: GRADTOOL_PROGRESS_SECONDS must be a number of seconds (0: every step, "
        "negative: no progress lines), got 'soon'"]
