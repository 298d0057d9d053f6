"""Data-parallel training: `--shards S` in one process, and the same bits over MPI.

The MPI tests run the real thing: `mpiexec` (MPICH's, from the `mpich` wheel that
`pip install -e '.[mpi]'` brings) with 2 and 4 ranks, oversubscribed on a small
machine, one thread each.  Without mpi4py or mpiexec they skip, and the end of the
pytest report says why (conftest.py).
"""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import assert_bits_equal, require_c_compiler
from gradtool.cli import main
from gradtool.npzio import write_npz
from gradtool.numerics import shard_mean
from gradtool.tapefile import load, save
from gradtool.train import TrainOptions, Trainer
from gradtool.train.distributed import LAUNCHER_RANK_VARS

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
DIGITS = SAMPLES / "digits_mlp.msgpack"
DIGITS_DATA = SAMPLES / "digits.npz"
NOTE = "gradtool: "                      # notes and errors both start so; errors come last


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


# ── the semantics, in one process ──────────────────────────────────────────

def test_one_step_is_the_shard_mean_of_per_shard_gradients_by_hand(tmp_path):
    """--shards 2, one SGD step: w - lr * g with g = (g0 + g1) / 2, g_k from shard k's own
    replay (plus the param's L2, as always)."""
    lr, out = 0.5, tmp_path / "one.msgpack"
    res = Trainer(load(DIGITS), DIGITS_DATA,
                  TrainOptions(shards=2, steps=1, optimizer="sgd", lr=lr, shuffle=False,
                               save=str(out))).run()
    tf = load(DIGITS)
    tape, data = tf.tape, np.load(DIGITS_DATA)
    grads, losses = [], []
    for k in range(2):                       # no shuffle: shard k is rows 32k .. 32k+31
        for v in tape.input_slots():
            tape.set_value(v, data[tape.nodes[v.id].name][k * 32:(k + 1) * 32])
        tape.forward()
        tape.zero_grad()
        tape.backward(tf.loss)
        losses.append(tape.value(tf.loss).copy())
        grads.append([tape.grad(p).copy() for p in tape.params()])
    assert_bits_equal(res.final_loss, shard_mean(losses), "loss")
    saved = load(out)
    for i, (p, q) in enumerate(zip(tape.params(), saved.tape.params())):
        g, w, l2 = shard_mean([grads[0][i], grads[1][i]]), tape.value(p), tape.nodes[p.id].l2
        expected = w - lr * (g + l2 * w if l2 else g)      # SGD, with the param's L2
        assert_bits_equal(saved.tape.value(q), expected, f"param {i}")
    position = saved.optimizer["position"]
    assert (position["batch"], position["shards"]) == (64, 2)


def test_shard_mean_starts_from_the_first_shard():
    # from the first shard, not from 0.0: one shard is itself, signed zero included
    assert_bits_equal(shard_mean([np.array([-0.0, np.inf, 1e-300])]),
                      np.array([-0.0, np.inf, 1e-300]))
    a, b, c = np.array([1e16]), np.array([1.0]), np.array([-1e16])
    assert shard_mean([a, b, c])[0] == ((1e16 + 1.0) + -1e16) / 3     # the order is fixed
    assert shard_mean([a, c, b])[0] != shard_mean([a, b, c])[0]       # and it matters


def test_one_shard_is_plain_training_byte_for_byte(tmp_path):
    plain, one = tmp_path / "plain.msgpack", tmp_path / "one.msgpack"
    assert run("train", DIGITS, "--data", DIGITS_DATA, "--steps", 20, "--save",
               plain).exit_code == 0
    assert run("train", DIGITS, "--data", DIGITS_DATA, "--steps", 20, "--shards", 1,
               "--save", one).exit_code == 0
    assert one.read_bytes() == plain.read_bytes()
    assert "shards" not in load(one).optimizer["position"]


def test_shard_errors_and_resume_rules(tmp_path):
    few = tmp_path / "few.npz"
    write_npz(few, {"x": np.zeros((100, 64)), "y": np.zeros((100, 10))})
    r = run("train", DIGITS, "--data", few, "--shards", 4)
    assert r.exit_code == 2 and "fewer than one batch of 128 (4 shards of 32 rows)" in r.stderr
    # a file saved in the middle of an epoch continues with the same shards only
    part = tmp_path / "part.msgpack"
    assert run("train", DIGITS, "--data", DIGITS_DATA, "--shards", 2, "--steps", 5,
               "--save", part).exit_code == 0
    r = run("train", part, "--data", DIGITS_DATA, "--shards", 4)
    assert r.exit_code == 2 and "continue with --shards 2" in r.stderr.splitlines()[-1]
    r = run("train", part, "--data", DIGITS_DATA, "--epochs", 1)    # its own 2 shards
    assert r.exit_code == 0 and "2 shards of 32 rows" in r.stderr
    # a saved "shards" that is not a count is refused like any bad position field
    tf = load(part)
    tf.optimizer["position"]["shards"] = 0
    save(tf.tape, tmp_path / "bad.msgpack", loss=tf.loss, outputs=tf.outputs, meta=tf.meta,
                 optimizer=tf.optimizer)
    r = run("train", tmp_path / "bad.msgpack", "--data", DIGITS_DATA)
    assert r.exit_code == 2 and "'position.shards' must be an integer >= 1, got 0" in r.stderr


def test_a_nonfinite_shard_stops_the_step_like_a_nonfinite_batch(tmp_path):
    # log(w * x): the 4th example is negative, so the second shard of step 2 is nan
    tp_path = tmp_path / "lin.msgpack"
    from gradtool.tape import Tape
    tp = Tape()
    x = tp.const(np.ones((1, 1)), name="x")
    w = tp.param(np.ones((1, 1)), name="w")
    save(tp, tp_path, loss=tp.log(tp.mean(x @ w)))
    data = tmp_path / "lin.npz"
    write_npz(data, {"x": np.array([[1.0], [2.0], [3.0], [-1.0], [5.0], [6.0]])})
    out = tmp_path / "out.msgpack"
    r = run("train", tp_path, "--data", data, "--shards", 2, "--no-shuffle", "--optimizer",
            "sgd", "--lr", 0.01, "--save", out)
    assert r.exit_code == 1 and "non-finite loss (nan) at step 2" in r.stderr.splitlines()[-1]
    assert load(out).optimizer["position"]["global_step"] == 1


# ── over MPI ───────────────────────────────────────────────────────────────

def _mpi_unavailable():
    """None when mpi4py and an mpiexec are here, else why the MPI tests skip."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install -e '.[mpi]')"
    if _mpiexec() is None:
        return "no mpiexec (the mpich wheel: pip install -e '.[mpi]')"
    return None


def _mpiexec():
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


MPI_SKIP = _mpi_unavailable()
needs_mpi = pytest.mark.skipif(MPI_SKIP is not None, reason=f"MPI tests skipped: {MPI_SKIP}")
GRADTOOL = [sys.executable, "-c", "from gradtool.cli import main; main()"]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"                        # one thread per rank: ranks share the cores
    for var in LAUNCHER_RANK_VARS + ("GRADTOOL_MPI_WORKER",):
        env.pop(var, None)                    # pytest itself may run under a launcher
    return env


def mpirun(ranks, *args, timeout=120):
    """`mpiexec -n ranks gradtool ARGS`; ``ranks`` may be a list of per-rank arg lists
    (MPMD: `-n 1 gradtool A : -n 1 gradtool B`)."""
    cmd = [_mpiexec()]
    if isinstance(ranks, int):
        cmd += ["-n", str(ranks), *GRADTOOL, *map(str, args)]
    else:
        for i, extra in enumerate(ranks):
            cmd += ([":"] if i else []) + ["-n", "1", *GRADTOOL, *map(str, extra)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())


def mpi_popen(ranks, *args):
    return subprocess.Popen([_mpiexec(), "-n", str(ranks), *GRADTOOL, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())


def steps_of(log):
    """The loss log without the wall-clock fields and the saved file's name."""
    wall = ("seconds", "step_seconds", "saved")
    return [{k: v for k, v in json.loads(ln).items() if k not in wall}
            for ln in Path(log).read_text().splitlines()]


def errors_of(stderr):
    """The stderr lines that are not the run's notes."""
    notes = ("training:", "validation:", "adam ", "adam-seed ", "adamw ", "sgd ", "data parallel:")
    return [ln for ln in stderr.splitlines()
            if not (ln.startswith(NOTE) and ln[len(NOTE):].startswith(notes))]


@needs_mpi
def test_any_number_of_ranks_gives_the_same_bytes_and_losses(tmp_path):
    """S = 4 on 1, 2 and 4 ranks: identical checkpoints and loss logs, with validation
    shared out and a mid-run --every checkpoint; and a run stopped on 2 ranks continues
    on 4 to the same bytes as the straight run."""
    common = ["--data", DIGITS_DATA, "--shards", 4, "--epochs", 2, "--every", 7]
    one, one_log = tmp_path / "w1.msgpack", tmp_path / "w1.jsonl"
    r = run("train", DIGITS, *common, "--save", one, "--log", one_log)
    assert r.exit_code == 0, r.stderr
    for w in (2, 4):
        out, log = tmp_path / f"w{w}.msgpack", tmp_path / f"w{w}.jsonl"
        p = mpirun(w, "train", DIGITS, *common, "--save", out, "--log", log)
        assert p.returncode == 0, p.stderr
        assert f"on {w} MPI ranks" in p.stderr
        assert out.read_bytes() == one.read_bytes(), f"{w} ranks"
        assert steps_of(log) == steps_of(one_log), f"{w} ranks"
        # the epoch lines, less their timings
        assert [ln[:ln.rindex("(")] for ln in p.stdout.splitlines()] == \
            [ln[:ln.rindex("(")] for ln in r.stdout.splitlines()]
    # stopped mid-epoch on 2 ranks, finished on 4 (shards and plan from the file)
    part = tmp_path / "part.msgpack"
    p = mpirun(2, "train", DIGITS, *common[:-2], "--steps", 15, "--save", part)
    assert p.returncode == 0, p.stderr
    p = mpirun(4, "train", part, "--data", DIGITS_DATA, "--save", part)
    assert p.returncode == 0, p.stderr
    assert part.read_bytes() == one.read_bytes()


@needs_mpi
@pytest.mark.parametrize("flags", [
    ("--optimizer", "adamw", "--amsgrad", "--clip", "0.5", "--lr-schedule", "cosine",
     "--t-max", "20", "--warmup", "3"),
    ("--optimizer", "sgd", "--momentum", "0.9", "--nesterov", "--weight-decay", "0.001",
     "--lr", "0.05", "--l2", "0.0001")], ids=["adamw", "sgd-nesterov"])
def test_the_sharded_optimizer_gives_the_same_bytes_on_1_2_4_ranks(tmp_path, flags):
    """ZeRO-1: each rank updates and holds the state of its slice only; 1, 2 and 4 ranks
    write byte-identical checkpoints (a resumed run included), and --json reports each
    rank's optimizer-state bytes, which add up to one process's."""
    common = ["--data", DIGITS_DATA, "--shards", 4, "--steps", 12, *flags]
    one = tmp_path / "w1.msgpack"
    r = run("train", DIGITS, *common, "--save", one, "--json")
    assert r.exit_code == 0, r.stderr
    single = json.loads(r.stdout.splitlines()[-1])["optimizer_state_bytes"]
    assert len(single) == 1 and single[0] > 0
    for w in (2, 4):
        out = tmp_path / f"w{w}.msgpack"
        p = mpirun(w, "train", DIGITS, *common, "--save", out, "--json")
        assert p.returncode == 0, p.stderr
        assert out.read_bytes() == one.read_bytes(), f"{w} ranks"
        per_rank = json.loads(p.stdout.splitlines()[-1])["optimizer_state_bytes"]
        assert len(per_rank) == w and sum(per_rank) == single[0]
        assert max(per_rank) <= single[0] // w + 64, per_rank     # about 1/W each
    # 6 steps on 2 ranks, 6 more on 4: the same bytes as 12 on one process
    part = tmp_path / "part.msgpack"
    half = [a if a != 12 else 6 for a in common]
    p = mpirun(2, "train", DIGITS, *half, "--save", part)
    assert p.returncode == 0, p.stderr
    p = mpirun(4, "train", part, "--data", DIGITS_DATA, "--steps", 6, "--save", part)
    assert p.returncode == 0, p.stderr
    assert part.read_bytes() == one.read_bytes()


@needs_mpi
def test_ranks_on_different_backends_give_the_same_bytes(tmp_path):
    require_c_compiler()
    common = ["--data", DIGITS_DATA, "--shards", 2, "--steps", 12]
    one, two = tmp_path / "one.msgpack", tmp_path / "two.msgpack"
    assert run("train", DIGITS, *common, "--save", one).exit_code == 0
    p = mpirun([["train", DIGITS, *common, "--save", two, "--backend", "host"],
                ["train", DIGITS, *common, "--save", two, "--backend", "cpu"]])
    assert p.returncode == 0, p.stderr
    (ranks,) = [ln for ln in p.stderr.splitlines() if "data parallel" in ln]
    assert " host; rank 1 " in ranks and ranks.endswith(" cpu")
    assert two.read_bytes() == one.read_bytes()


@needs_mpi
def test_a_mismatched_tape_or_missing_data_is_refused_in_one_line(tmp_path):
    other = tmp_path / "other.msgpack"
    assert run("train", DIGITS, "--data", DIGITS_DATA, "--epochs", 1, "--save",
               other).exit_code == 0
    common = ["--data", DIGITS_DATA, "--shards", 2]
    p = mpirun([["train", DIGITS, *common], ["train", other, *common]])
    assert p.returncode == 2
    assert errors_of(p.stderr) == p.stderr.splitlines(), p.stderr      # nothing started
    (line,) = p.stderr.splitlines()
    assert line.startswith("gradtool: rank 1: tape ") and "differs from rank 0's" in line
    assert str(other) in line and "sha256" in line and "Traceback" not in p.stderr
    p = mpirun([["train", DIGITS, *common], ["train", DIGITS, "--data", tmp_path / "no.npz",
                                              "--shards", 2]])
    assert p.returncode == 2
    (line,) = p.stderr.splitlines()
    assert line.startswith("gradtool: rank 1: ") and "no.npz" in line
    p = mpirun(2, "train", DIGITS, "--data", DIGITS_DATA, "--shards", 3)
    assert p.returncode == 2
    assert p.stderr.splitlines() == ["gradtool: --shards 3 cannot be shared by 2 ranks: the "
                                     "number of ranks must divide the number of shards"]
    p = mpirun(2, "train", DIGITS, "--data", DIGITS_DATA, "--shards", 0)   # usage: rank 0 says it
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and "--shards" in p.stderr


def _ppid(pid):
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _worker_of(proc, rank):
    """The pid of the process doing rank ``rank``'s work in the job ``proc`` (mpiexec):
    the child of that rank's supervisor (named gradtool-rank, under mpiexec's proxy)."""
    wanted = {f"{var}={rank}".encode() for var in LAUNCHER_RANK_VARS}
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            env = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
            if not env & wanted or Path(f"/proc/{pid}/comm").read_text().strip() == \
                    "gradtool-rank":
                continue
            supervisor = _ppid(pid)
            if Path(f"/proc/{supervisor}/comm").read_text().strip() == "gradtool-rank" and \
                    proc.pid in (_ppid(supervisor), _ppid(_ppid(supervisor))):
                return pid
        except (OSError, ValueError, IndexError):
            continue
    pytest.fail(f"no worker process for rank {rank}")


def _start_long_run(tmp_path, *extra):
    log = tmp_path / "log.jsonl"
    proc = mpi_popen(2, "train", DIGITS, "--data", DIGITS_DATA, "--shards", 2, "--epochs",
                     100000, "--log", log, *extra)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and log.read_text().count('"event": "step"') >= 20:
            return proc
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"the run did not start: {proc.communicate()}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@needs_mpi
def test_a_killed_rank_ends_the_job_in_one_line(tmp_path):
    proc = _start_long_run(tmp_path)
    try:
        pid = _worker_of(proc, 1)
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and took < 30
    assert errors_of(stderr) == [f"gradtool: rank 1: killed by SIGKILL (pid {pid} on "
                                 f"{os.uname().nodename}); the job stops"], stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@needs_mpi
def test_a_hung_rank_ends_the_job_after_the_timeout(tmp_path):
    proc = _start_long_run(tmp_path, "--timeout", 5)
    pid = _worker_of(proc, 1)
    try:
        os.kill(pid, signal.SIGSTOP)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert proc.returncode != 0              # 1, or the signal mpiexec stopped rank 1 with
    (line,) = errors_of(stderr)
    assert line.startswith("gradtool: rank 0: waited 5 s for rank 1 (") and "hung" in line


@needs_mpi
def test_ctrl_c_stops_every_rank_at_one_step_and_saves(tmp_path):
    out = tmp_path / "out.msgpack"
    proc = _start_long_run(tmp_path, "--save", out)
    try:
        proc.send_signal(signal.SIGINT)         # as Ctrl-C: mpiexec forwards it
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    (line,) = errors_of(stderr)
    pos = load(out).optimizer["position"]
    assert line.startswith(f"gradtool: interrupted after step {pos['global_step']} ")
    steps = [r for r in steps_of(tmp_path / "log.jsonl") if r["event"] == "step"]
    assert steps[-1]["global_step"] == pos["global_step"] and pos["shards"] == 2
