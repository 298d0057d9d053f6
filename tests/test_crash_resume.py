"""Crash test: `gradtool train --save X --every N` killed with SIGKILL at random moments
(seeded), restarted from whatever X holds each time, must end on the very file an
uninterrupted run writes, byte for byte.

SIGKILL gives the process no chance to clean up, so this checks what the design
promises by construction: a checkpoint is written atomically (never a torn file),
holds everything a run needs to continue to the bit (parameters, moments, step
counter, epoch order), and a temporary file a killed write left behind does not
accumulate (the next write of the same file removes it).
"""

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from gradtool.tapefile import load
from support import SAMPLES

TAPE = SAMPLES / "digits_mlp.msgpack"
DATA = SAMPLES / "digits.npz"
EPOCHS, EVERY = 12, 3         # 552 steps, a checkpoint every 3 (about 2 s in all here)
STEPS = EPOCHS * 46
KILLS = 6
SEED = 7


def train(*args) -> list:
    return [sys.executable, "-m", "gradtool", "train", *map(str, args), "--data", str(DATA)]


def resume_or_start(ckpt: Path) -> list:
    """The first run starts from the tape; every later one continues the checkpoint."""
    if ckpt.exists():
        return train(ckpt, "--save", ckpt, "--every", EVERY)
    return train(TAPE, "--epochs", EPOCHS, "--save", ckpt, "--every", EVERY)


def finished(ckpt: Path) -> bool:
    return ckpt.exists() and load(ckpt).optimizer["position"]["global_step"] == STEPS


def _timed(command: list) -> float:
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return time.monotonic() - start


def test_sigkill_at_random_moments_then_resume_ends_on_the_straight_runs_bytes(tmp_path):
    straight = tmp_path / "straight.msgpack"
    whole = _timed(train(TAPE, "--epochs", EPOCHS, "--save", straight, "--every", EVERY))
    # a process's start (imports, loading, the engine) is about half of that here: the
    # kills land in the training part, at fractions of it, on any machine
    startup = _timed(train(TAPE, "--steps", 1, "--save", tmp_path / "one.msgpack"))
    training = max(whole - startup, 0.05 * whole)

    ckpt = tmp_path / "run.msgpack"
    rng = np.random.default_rng(SEED)
    kills = []

    def mid_run_steps():
        return {step for status, step in kills if status == -signal.SIGKILL and 0 < step < STEPS}

    # at least KILLS kills, and more (up to 4x) until two of them landed at different places
    # mid-run: a machine whose load changes under the test can make a few kill times too short,
    # or too long: a run that finished before its kill is checked and the plan starts again
    while (len(kills) < KILLS or len(mid_run_steps()) < 2) and len(kills) < 4 * KILLS:
        if finished(ckpt):
            assert ckpt.read_bytes() == straight.read_bytes()
            ckpt.unlink()
        proc = subprocess.Popen(resume_or_start(ckpt), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        done_steps = load(ckpt).optimizer["position"]["global_step"] if ckpt.exists() else 0
        left = training * (STEPS - done_steps) / STEPS          # this run's training part
        time.sleep(startup + left * float(rng.uniform(0.05, 0.6)))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        if ckpt.exists():
            position = load(ckpt).optimizer["position"]     # never torn: it loads
            assert position["target_epoch"] == EPOCHS and position["global_step"] <= STEPS
            kills.append((proc.returncode, position["global_step"]))
    # kills landed mid-run, at different places
    assert len(mid_run_steps()) >= 2, kills

    for _ in range(3):                      # finish the plan
        if finished(ckpt):
            break
        result = subprocess.run(resume_or_start(ckpt), capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr
    assert ckpt.read_bytes() == straight.read_bytes()
    strays = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert not strays, strays               # the finishing run's writes removed them
