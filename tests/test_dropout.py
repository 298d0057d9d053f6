"""The counter-based generator, the uniform op, nn.dropout, and dropout in `gradtool train`.

The generator is pinned against a pure-Python integer implementation; the op against the
host backend (every kernel variant, fused too); dropout against its definition; training
with dropout as real `gradtool train` processes, on every engine and over MPI.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal, require_c_compiler
from gradtool import nn
from gradtool import numerics as nx
from gradtool.npzio import write_npz
from gradtool.tapefile import dumps, load, save
from support import VARIANTS, train_under_mpiexec

ROOT = Path(__file__).resolve().parent.parent
M64 = 2 ** 64 - 1


# ── the generator ──────────────────────────────────────────────────────────

def _mix(z: int) -> int:
    """splitmix64's finalizer on Python ints (numerics.py's comment, line by line)."""
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _u(salt: int, step: int, shard: int, i: int) -> float:
    h = _mix(_mix(_mix(_mix(salt) ^ step) ^ shard) ^ i)
    return (h >> 11) * 2.0 ** -53


def test_splitmix64_reference_values():
    # Vigna's splitmix64.c with state 0: its first outputs are mix(0), mix(golden ratio)...
    assert _mix(0) == 0xE220A8397B1DCDAF
    assert int(nx.mix64(np.uint64(0))) == 0xE220A8397B1DCDAF


@pytest.mark.parametrize("salt, step, shard", [
    (0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (7, 123456, 3),
    (2 ** 63 - 1, 2 ** 53 - 1, 2 ** 53 - 1), (2 ** 40 + 5, 2 ** 52 + 1, 17),
    (12345678901234567, 9007199254740990, 0)])
def test_numpy_generator_equals_python_integers(salt, step, shard):
    shape = (7, 11)
    got = nx.uniform(shape, salt, float(step), float(shard))
    want = np.array([_u(salt, step, shard, i) for i in range(77)]).reshape(shape)
    assert_bits_equal(got, want, f"salt {salt} step {step} shard {shard}")
    assert (got >= 0).all() and (got < 1).all()
    assert (got * 2.0 ** 53 == np.floor(got * 2.0 ** 53)).all()      # multiples of 2^-53


def test_bad_counters_give_nan():
    for step, shard in ((0.5, 0), (-1.0, 0), (2.0 ** 53, 0), (0, np.nan), (np.inf, 0)):
        assert np.isnan(nx.uniform((3,), 0, step, shard)).all(), (step, shard)


def test_statistics_and_streams():
    n = 100_000
    u = nx.uniform((n,), 5, 3.0, 1.0)
    sigma = np.sqrt(1.0 / 12.0 / n)
    assert abs(u.mean() - 0.5) < 5 * sigma
    for p in (0.1, 0.3, 0.5, 0.9):
        keep = (u >= p).mean()
        assert abs(keep - (1 - p)) < 5 * np.sqrt(p * (1 - p) / n), p
    # different salt, step or shard: different streams (uncorrelated, not merely shifted)
    others = [nx.uniform((n,), 6, 3.0, 1.0), nx.uniform((n,), 5, 4.0, 1.0),
              nx.uniform((n,), 5, 3.0, 2.0), nx.uniform((n,), 5, 1.0, 3.0)]
    for v in others:
        assert not np.array_equal(u, v)
        assert abs(np.corrcoef(u, v)[0, 1]) < 5 / np.sqrt(n)
        assert (u == v).mean() < 1e-3


# ── the uniform op ─────────────────────────────────────────────────────────

def _uniform_tape(ctr=(7.0, 3.0, 1.0), shape=(4, 33), salt=9):
    tp = gt.Tape()
    r = tp.rng()
    tp.set_value(r, list(ctr))
    tp.forward()
    u = tp.uniform(r, shape=list(shape), salt=salt)
    x = tp.param(np.linspace(-1, 1, int(np.prod(shape))).reshape(shape))
    loss = tp.sum(tp.mul(x, u))
    return tp, r, u, loss


def test_op_values_are_the_generator():
    tp, r, u, _ = _uniform_tape()
    assert_bits_equal(tp.value(u), nx.uniform((4, 33), 9, 7.0, 3.0))
    assert not tp.requires[u.id]


@pytest.mark.parametrize("variant", VARIANTS)
def test_host_backend_every_variant_and_fused_equal_numpy(variant):
    require_c_compiler()
    from gradtool.device import capture
    tp, r, u, loss = _uniform_tape()
    for fuse in (False, True):
        rp = capture(tp, loss, "host", host_kernels=variant, fuse=fuse)
        for ctr in ([7.0, 3.0, 1.0], [2.0 ** 53 - 1, 2.0 ** 40, 0.0], [0.0, 0.0, 1.0]):
            tp.set_value(r, ctr)
            tp.forward()
            rp.set_input(r.id, np.array(ctr))
            rp.forward()
            assert_bits_equal(rp.value(u), tp.value(u), f"{variant} fuse={fuse} {ctr}")
            rp.backward()
            tp.zero_grad()
            tp.backward(loss)
            x = tp.params()[0]
            assert_bits_equal(rp.grad(x), tp.grad(x), f"{variant} fuse={fuse} grad")


def test_bad_counters_are_refused_everywhere():
    tp, r, u, loss = _uniform_tape()
    for bad in ([0.5, 0, 1], [-1.0, 0, 1], [0, 2.0 ** 53, 1], [np.nan, 0, 1]):
        with pytest.raises(gt.TapeError, match="rng slot 'gradtool.rng'"):
            tp.set_value(r, bad)
    with pytest.raises(gt.TapeError, match="must be a float64 const of shape \\[3\\]"):
        gt.Tape().const(np.zeros(4), name=gt.RNG_NAME)
    with pytest.raises(gt.TapeError, match="reserved for a const"):
        gt.Tape().param(np.zeros(3), name=gt.RNG_NAME)
    with pytest.raises(gt.TapeError, match="must be the tape's rng slot"):
        t2 = gt.Tape()
        t2.uniform(t2.const(np.zeros(3), name="c"), shape=[2], salt=0)
    with pytest.raises(gt.TapeError, match="salt: expected an integer in \\[0, 2\\^63\\)"):
        tp.uniform(r, shape=[2], salt=-1)
    t3 = gt.Tape()
    with pytest.raises(gt.ShapeError, match="dims >= 1"):
        t3.uniform(t3.rng(), shape=[0], salt=1)
    require_c_compiler()
    from gradtool.device import capture
    rp = capture(tp, loss, "host")
    with pytest.raises(gt.GradtoolError, match="set_input node 0: the rng slot"):
        rp.set_input(r.id, np.array([1.5, 0, 1]))


def test_file_round_trip_keeps_salt_and_shape():
    tp, r, u, loss = _uniform_tape(shape=(2, 3, 5), salt=2 ** 62 + 3)
    raw = dumps(tp, loss=loss, outputs={"u": u}, values=True)
    doc = msgpack.unpackb(raw)
    node = doc["nodes"][u.id]
    assert node["salt"] == 2 ** 62 + 3 and node["shape"] == [2, 3, 5] and node["op"] == "uniform"
    back = load(raw)
    assert back.tape.nodes[u.id].aux == {"shape": [2, 3, 5], "salt": 2 ** 62 + 3}
    assert_bits_equal(back.tape.value(back.outputs["u"]), tp.value(u))
    assert dumps(back.tape, loss=back.loss, outputs=back.outputs, values=True) == raw


def _mutated(doc, i, **fields):
    nodes = list(doc["nodes"])
    nodes[i] = {k: v for k, v in dict(nodes[i], **fields).items() if v is not None}
    return msgpack.packb(dict(doc, nodes=nodes))


def test_hostile_files_name_node_and_field():
    tp, r, u, loss = _uniform_tape()
    doc = msgpack.unpackb(dumps(tp, loss=loss))
    x = tp.params()[0].id
    cases = [
        (u.id, {"salt": -1}, "salt"), (u.id, {"salt": 1.5}, "salt"),
        (u.id, {"salt": 2 ** 63}, "salt"), (u.id, {"salt": None}, "salt"),
        (r.id, {"shape": [4], "data": np.zeros(4).tobytes()}, "data"),
        (r.id, {"data": np.array([0.5, 0, 1]).tobytes()}, "data"),
        (x, {"name": gt.RNG_NAME}, "name"),                     # a param of that name
    ]
    t2 = gt.Tape()
    w = t2.param(np.ones(3), name="w")
    v = t2.uniform(t2.rng(), shape=[3], salt=1)
    doc2 = msgpack.unpackb(dumps(t2, loss=t2.sum(t2.mul(w, v))))
    docs = {(v.id, "a"): doc2}
    cases.append((v.id, {"a": w.id}, "a"))                      # not the rng slot
    for i, fields, field in cases:
        with pytest.raises(gt.TapeFileError) as err:
            load(_mutated(docs.get((i, field), doc), i, **fields), name="h.msgpack")
        assert err.value.node == i, (fields, str(err.value))
        assert err.value.field is not None and err.value.field.startswith(field), \
            (fields, str(err.value))
        assert "\n" not in str(err.value)


def test_emit_cuda_refuses_in_one_line():
    from gradtool.emit.cuda import emit_cuda
    tp, r, u, loss = _uniform_tape()
    with pytest.raises(gt.GradtoolError) as err:
        emit_cuda(tp, loss)
    assert "\n" not in str(err.value)


# ── nn.dropout ─────────────────────────────────────────────────────────────

def _dropout_tape(p=0.3, shape=(40, 30), seed=0):
    rng = np.random.default_rng(seed)
    tp = gt.Tape()
    x = tp.param(rng.normal(size=shape))
    y = nn.dropout(x, p)
    loss = tp.sum(tp.mul(y, tp.const(rng.normal(size=shape))))
    return tp, x, y, loss


def test_dropout_values_and_the_train_flag():
    tp, x, y, _ = _dropout_tape(0.3)
    xv, yv = tp.value(x), tp.value(y)
    keep = nx.uniform(xv.shape, 0, 0.0, 0.0) >= 0.3
    assert_bits_equal(yv, np.where(keep, xv * (1.0 / (1.0 - 0.3)), 0.0))
    r = tp.rng()
    tp.set_value(r, [0.0, 0.0, 0.0])
    tp.forward()
    assert_bits_equal(tp.value(y), xv)                       # flag 0: x, bit for bit
    special = np.array([[0.0, -0.0, np.inf, -np.inf, 1e-310, -2.5]] * 5)
    t2 = gt.Tape()
    xs = t2.const(special)
    ys = nn.dropout(xs, 0.5)
    t2.set_value(t2.rng(), [4.0, 1.0, 0.0])
    t2.forward()
    assert_bits_equal(t2.value(ys), special)                 # signed zeros, infinities


def test_p_zero_is_x_and_p_one_is_zeros():
    tp = gt.Tape()
    x = tp.param(np.array([[1.0, -np.inf, np.nan, -0.0]]))
    assert nn.dropout(x, 0.0) is x
    z = nn.dropout(x, 1.0)
    assert_bits_equal(tp.value(z), np.zeros((1, 4)))
    tp.set_value(tp.rng(), [0.0, 0.0, 0.0])
    tp.forward()
    assert_bits_equal(tp.value(z), tp.value(x))
    loss = tp.sum(tp.mul(nn.dropout(tp.param(np.ones((2, 2))), 1.0), tp.const(np.ones((2, 2)))))
    tp.set_value(tp.rng(), [0.0, 0.0, 1.0])
    tp.forward()
    tp.backward(loss)
    assert_bits_equal(tp.grad(tp.params()[1]), np.zeros((2, 2)))    # zeros, not NaN


def test_each_dropout_draws_its_own_salt_and_the_mask_follows_the_step():
    tp = gt.Tape()
    x = tp.param(np.ones((50, 50)))
    a, b = nn.dropout(x, 0.5), nn.dropout(x, 0.5)
    salts = [n.aux["salt"] for n in tp.nodes if n.op == "uniform"]
    assert salts == [0, 1]
    assert not np.array_equal(tp.value(a), tp.value(b))
    before = tp.value(a)
    tp.set_value(tp.rng(), [1.0, 0.0, 1.0])
    tp.forward()
    assert not np.array_equal(tp.value(a), before)
    assert [n.aux["salt"] for n in tp.nodes if n.op == "uniform"] == [0, 1]
    c = nn.dropout(x, 0.5, salt=0)                            # an explicit salt repeats a
    assert_bits_equal(tp.value(c), tp.value(a))


@pytest.mark.parametrize("flag", [1.0, 0.0])
def test_gradient_fd_check_with_the_slot_held(flag):
    tp, x, y, loss = _dropout_tape(0.25, shape=(6, 7))
    tp.set_value(tp.rng(), [3.0, 2.0, flag])
    tp.forward()
    report = gt.fd_check(tp, loss, eps=1e-6, rtol=1e-6, atol=1e-8)
    assert report.passed, report
    tp.zero_grad()
    tp.backward(loss)
    g = tp.grad(x)
    keep = nx.uniform((6, 7), 0, 3.0, 2.0) >= 0.25
    weights = [tp.values[i] for i, n in enumerate(tp.nodes)
               if n.op == "const" and n.name is None and tp.values[i].shape == (6, 7)][0]
    want = np.where(keep, weights * (1.0 / 0.75), 0.0) if flag else weights
    assert_bits_equal(g, want)                       # g * (1/(1-p)) kept, +0.0 dropped


def test_dropout_misuse_is_one_line():
    tp = gt.Tape()
    x = tp.param(np.ones((2, 2)))
    for p, needle in ((1.5, "p must lie in [0, 1]"), (-0.1, "p must lie in [0, 1]"),
                      (float("nan"), "p must lie in [0, 1]"), ("0.5", "p must be a number"),
                      (True, "p must be a number"), (None, "p must be a number")):
        with pytest.raises(gt.TapeError) as err:
            nn.dropout(x, p)
        assert needle in str(err.value) and "\n" not in str(err.value)
    ids = tp.const(np.array([[1, 2]]), dtype="i64")
    with pytest.raises(gt.TapeError, match="holds integer data"):
        nn.dropout(ids, 0.5)
    with pytest.raises(gt.TapeError, match="salt must be an integer"):
        nn.dropout(x, 0.5, salt=-3)
    with pytest.raises(gt.TapeError, match="expected a GVar"):
        nn.dropout(np.ones(3), 0.5)


# ── training ───────────────────────────────────────────────────────────────

def _mlp(path: Path, p: float, rows: int = 8):
    """x [rows, 6] -> 16 (tanh, dropout p) -> 3, mse against y; one rng slot."""
    rng = np.random.default_rng(42)
    tp = gt.Tape()
    x = tp.const(np.zeros((rows, 6)), name="x")
    t = tp.const(np.zeros((rows, 3)), name="y")
    w1 = tp.param(rng.normal(size=(6, 16)) * 0.4, name="w1")
    b1 = tp.param(np.zeros(16), name="b1")
    w2 = tp.param(rng.normal(size=(16, 3)) * 0.4, name="w2")
    h = nn.dropout(tp.tanh(nn.linear(x, w1, b1)), p)
    y = nn.linear(h, w2)
    save(tp, path, loss=tp.mse(y, t), outputs={"y": y})


def _data(path: Path, n: int = 64):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(n, 6))
    write_npz(path, {"x": x, "y": np.tanh(x[:, :3] * 0.7), "x_val": x[:16] * 0.5,
                     "y_val": np.tanh(x[:16, :3] * 0.35)})


def _cli(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "gradtool", *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    d = tmp_path_factory.mktemp("dropout_mlp")
    _mlp(d / "drop.msgpack", 0.3)
    _mlp(d / "nodrop.msgpack", 0.0)
    _data(d / "data.npz")
    return d


TRAIN = ("--epochs", 2, "--optimizer", "adam-seed", "--lr", 0.01, "--seed", 3)


def test_training_with_dropout_is_the_same_bytes_on_every_engine(mlp, tmp_path):
    require_c_compiler()
    runs = {}
    for name, extra in (("cpu", ()), ("host", ("--backend", "host")),
                        ("fused", ("--backend", "host", "--fuse"))):
        out = tmp_path / f"{name}.msgpack"
        _cli("train", mlp / "drop.msgpack", "--data", mlp / "data.npz", *TRAIN, *extra,
             "--save", out)
        runs[name] = out.read_bytes()
    assert runs["host"] == runs["cpu"] and runs["fused"] == runs["cpu"]
    # the masks matter: p = 0.3 trains other parameters than the same run without dropout
    plain = tmp_path / "plain.msgpack"
    _cli("train", mlp / "nodrop.msgpack", "--data", mlp / "data.npz", *TRAIN, "--save", plain)
    a, b = load(tmp_path / "cpu.msgpack"), load(plain)
    assert not np.array_equal(a.tape.values[a.tape.var("w1").id],
                              b.tape.values[b.tape.var("w1").id])
    # the file keeps the rng slot as recorded
    assert_bits_equal(a.tape.values[a.tape.rng_id()], np.array([0.0, 0.0, 1.0]))
    assert a.optimizer["position"]["global_step"] == 16


def test_training_with_dropout_resumes_to_the_bit(mlp, tmp_path):
    straight, first, resumed = (tmp_path / n for n in ("s.msgpack", "a.msgpack", "b.msgpack"))
    _cli("train", mlp / "drop.msgpack", "--data", mlp / "data.npz", *TRAIN, "--save", straight)
    _cli("train", mlp / "drop.msgpack", "--data", mlp / "data.npz", *TRAIN, "--steps", 11,
         "--save", first)                          # stops in the middle of epoch 2
    assert load(first).optimizer["position"]["global_step"] == 11
    proc = _cli("train", first, "--data", mlp / "data.npz", "--save", resumed)
    assert "continuing at epoch 2 step 3" in proc.stderr
    assert resumed.read_bytes() == straight.read_bytes()


def test_each_step_and_shard_draws_its_own_mask(mlp):
    """The slot the trainer sets: [global step, shard, 1] per forward; masks differ."""
    from gradtool.train import TrainOptions, Trainer
    tf = load(mlp / "drop.msgpack")
    seen = []
    trainer = Trainer(tf, mlp / "data.npz", TrainOptions(steps=3, shards=2, shuffle=False))
    rng_id = trainer.rng_id
    inner = trainer.engine.set_input

    def spy(node_id, batch):
        if node_id == rng_id:
            seen.append(tuple(np.asarray(batch)))
        inner(node_id, batch)
    trainer.engine.set_input = spy
    trainer.run()
    assert seen == [(0.0, 0.0, 1.0), (0.0, 1.0, 1.0), (1.0, 0.0, 1.0), (1.0, 1.0, 1.0),
                    (2.0, 0.0, 1.0), (2.0, 1.0, 1.0)]
    masks = {s: nx.uniform((8, 16), 0, s[0], s[1]) >= 0.3 for s in seen}
    assert len({m.tobytes() for m in masks.values()}) == 6


def test_validation_loss_is_the_dropout_free_loss(mlp, tmp_path):
    log = tmp_path / "log.jsonl"
    out = tmp_path / "v.msgpack"
    _cli("train", mlp / "drop.msgpack", "--data", mlp / "data.npz", "--epochs", 1,
         "--log", log, "--save", out)
    val = [json.loads(line) for line in log.read_text().splitlines()
           if json.loads(line).get("event") == "epoch"][0]["val_loss"]
    # the trained tape with the flag off, over the 2 validation batches of 8 rows
    tf = load(out)
    tp, data = tf.tape, np.load(mlp / "data.npz")
    tp.set_value(tp.rng(), [0.0, 0.0, 0.0])
    losses = []
    for k in range(2):
        tp.set_value(tp.var("x"), data["x_val"][8 * k:8 * (k + 1)])
        tp.set_value(tp.var("y"), data["y_val"][8 * k:8 * (k + 1)])
        tp.forward()
        losses.append(float(tp.value(tf.loss)[0]))
    assert val == (0.0 + losses[0] + losses[1]) / 2
    # and the same tape with dropout recorded at p = 0 gives the same (eval) loss
    _mlp(tmp_path / "p0.msgpack", 0.0)
    t0 = load(tmp_path / "p0.msgpack")
    for src, dst in zip(tp.params(), t0.tape.params()):
        t0.tape.set_value(dst, tp.value(src))
    t0.tape.set_value(t0.tape.var("x"), data["x_val"][:8])
    t0.tape.set_value(t0.tape.var("y"), data["y_val"][:8])
    t0.tape.forward()
    assert float(t0.tape.value(t0.loss)[0]) == losses[0]


def test_training_under_mpiexec_is_the_same_bytes(mlp, tmp_path):
    args = ("--data", mlp / "data.npz", *TRAIN, "--shards", 2)
    one = tmp_path / "one.msgpack"
    _cli("train", mlp / "drop.msgpack", *args, "--save", one)
    two = train_under_mpiexec(mlp / "drop.msgpack", args, tmp_path / "two.msgpack", ranks=2)
    assert two == one.read_bytes()
    plain = tmp_path / "plain.msgpack"      # 2 shards draw other masks than 1 shard of 16
    _cli("train", mlp / "drop.msgpack", "--data", mlp / "data.npz", *TRAIN, "--save", plain)
    assert plain.read_bytes() != two


def test_the_trainer_refuses_a_bad_rng_slot(mlp, tmp_path):
    raw = msgpack.unpackb((mlp / "drop.msgpack").read_bytes())
    i = next(k for k, n in enumerate(raw["nodes"]) if n.get("name") == gt.RNG_NAME)
    raw["nodes"][i] = dict(raw["nodes"][i], shape=[2], data=np.zeros(2).tobytes())
    bad = tmp_path / "bad.msgpack"
    bad.write_bytes(msgpack.packb(raw))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "gradtool", "train", bad, "--data",
                           mlp / "data.npz"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "rng slot 'gradtool.rng'" in lines[0], proc.stderr


# ── channel dropout and alpha dropout ──────────────────────────────────────

def test_feature_dropout_keeps_or_drops_whole_channels():
    """One draw per (sample, channel), broadcast over the rest: a channel is x * 1/(1-p)
    or +0.0 whole; about p of the 4000 channels drop (5 sigma); the flag 0 gives x."""
    rng = np.random.default_rng(5)
    tp = gt.Tape()
    x = tp.param(rng.standard_normal((400, 10, 3, 2)))
    y = nn.feature_dropout(x, 0.4)
    (u,) = [i for i, n in enumerate(tp.nodes) if n.op == "uniform"]
    assert tp.nodes[u].aux["shape"] == [400, 10, 1, 1]
    keep = nx.uniform((400, 10, 1, 1), 0, 0.0, 0.0) >= 0.4
    xv = tp.value(x)
    assert_bits_equal(tp.value(y), np.where(keep, xv * (1.0 / (1.0 - 0.4)), 0.0))
    dropped = 1.0 - keep.mean()
    assert abs(dropped - 0.4) <= 5 * np.sqrt(0.4 * 0.6 / 4000)
    tp.set_value(tp.rng(), [0.0, 0.0, 0.0])
    tp.forward()
    assert_bits_equal(tp.value(y), xv)
    with pytest.raises(gt.TapeError, match="feature_dropout: expected x"):
        nn.feature_dropout(tp.param(np.ones(4)), 0.5)


def test_alpha_dropout_is_torchs_affine_rule():
    """Kept: x * a + a*alpha*p; dropped: -a*alpha + a*alpha*p (torch's constants); on
    SELU-normalised inputs the mean and variance stay about 0 and 1; the flag 0 gives x;
    the gradient is g * a where kept, +0.0 where dropped."""
    rng = np.random.default_rng(6)
    p = 0.2
    tp = gt.Tape()
    x = tp.param(rng.standard_normal((200, 100)))
    y = nn.alpha_dropout(x, p)
    loss = tp.sum(y)
    tp.backward(loss)
    alpha = nn.ALPHA_SELU
    a = 1.0 / np.sqrt((alpha * alpha * p + 1.0) * (1.0 - p))
    keep = nx.uniform((200, 100), 0, 0.0, 0.0) >= p
    xv = tp.value(x)
    want = np.where(keep, xv * a + (a * alpha) * p, -(a * alpha) + (a * alpha) * p)
    assert_bits_equal(tp.value(y), want)
    assert abs(tp.value(y).mean()) < 0.02 and abs(tp.value(y).std() - 1.0) < 0.02
    assert_bits_equal(tp.grad(x), np.where(keep, a, 0.0))
    tp.set_value(tp.rng(), [0.0, 0.0, 0.0])
    tp.forward()
    assert_bits_equal(tp.value(y), xv)
    z = nn.alpha_dropout(tp.param(rng.standard_normal((6, 4, 5))), 0.3, channels=True)
    (last,) = [n for n in tp.nodes if n.op == "uniform"][-1:]
    assert last.aux["shape"] == [6, 4, 1] and tp.value(z).shape == (6, 4, 5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_channel_and_alpha_dropout_on_the_host_backend_equal_numpy(variant):
    require_c_compiler()
    rng = np.random.default_rng(7)
    tp = gt.Tape()
    x = tp.param(rng.standard_normal((5, 4, 3, 3)))
    y = nn.alpha_dropout(nn.feature_dropout(x, 0.3), 0.1, channels=True)
    loss = tp.sum(tp.mul(y, tp.const(rng.standard_normal((5, 4, 3, 3)))))
    _host_equals_numpy(tp, loss, x, y, variant, [3.0, 1.0, 1.0])


def assert_refused(*cases) -> None:
    """Each (call, needle): the call raises a TapeError whose message matches needle."""
    for call, needle in cases:
        with pytest.raises(gt.TapeError, match=needle):
            call()


# ── bernoulli ──────────────────────────────────────────────────────────────

def test_bernoulli_draws_and_their_mean_with_the_flag_off():
    """1.0 where uniform < p (about p of 10^5, 5 sigma), from a number or a tensor of
    probabilities; the flag 0 gives p itself; no gradient reaches the probabilities."""
    tp = gt.Tape()
    d = nn.bernoulli(0.3, shape=[200, 500], tape=tp)
    u = nx.uniform((200, 500), 0, 0.0, 0.0)
    assert_bits_equal(tp.value(d), (u < 0.3).astype(np.float64))
    assert abs(tp.value(d).mean() - 0.3) <= 5 * np.sqrt(0.3 * 0.7 / 1e5)
    probs = tp.param(np.linspace(0.0, 1.0, 12).reshape(3, 4))
    sig = tp.sigmoid(probs)
    e = nn.bernoulli(sig)
    assert_bits_equal(tp.value(e), (nx.uniform((3, 4), 1, 0.0, 0.0) < tp.value(
        sig)).astype(np.float64))
    loss = tp.sum(tp.mul(e, tp.const(np.ones((3, 4)))))
    tp.backward(loss)
    assert_bits_equal(tp.grad(probs), np.zeros((3, 4)))
    tp.set_value(tp.rng(), [0.0, 0.0, 0.0])
    tp.forward()
    assert_bits_equal(tp.value(d), np.full((200, 500), 0.3))
    assert_bits_equal(tp.value(e), tp.value(sig))               # p itself, bit for bit
    assert_refused((lambda: nn.bernoulli(1.5, shape=[2], tape=tp), "p must be"),
                   (lambda: nn.bernoulli(0.5), "needs shape= and tape="),
                   (lambda: nn.bernoulli(0.5, shape=[2], tape=tp, salt=-1), "salt"))


def _host_equals_numpy(tp, loss, x, y, variant, counters):
    """The host backend (``variant``'s kernels, per node and fused) gives the CPU tape's
    bits for y and x's gradient, with the rng slot at ``counters`` and with the flag 0."""
    from gradtool.device import capture
    r = tp.rng()
    for fuse in (False, True):
        rp = capture(tp, loss, "host", host_kernels=variant, fuse=fuse)
        for ctr in (counters, [0.0, 0.0, 0.0]):
            tp.set_value(r, ctr)
            tp.forward()
            tp.zero_grad()
            tp.backward(loss)
            rp.set_input(r.id, np.array(ctr))
            rp.forward()
            rp.backward()
            assert_bits_equal(rp.value(y), tp.value(y), f"{variant} fuse={fuse} {ctr}")
            assert_bits_equal(rp.grad(x), tp.grad(x), f"{variant} fuse={fuse} grad")


# ── normal ─────────────────────────────────────────────────────────────────

def test_normal_draws_are_box_muller_and_their_mean_with_the_flag_off():
    """z = sqrt(-2 log(1 - u1)) * cos(2pi u2) of one uniform [2, *shape], by the table's
    libm-free functions; 10^5 draws have mean 0 and variance 1 (5 sigma) and a normal
    tail (|z| > 3 about 0.27%); the flag 0 gives +0.0 everywhere."""
    from gradtool import fdlibm
    tp = gt.Tape()
    z = nn.normal([400, 250], tape=tp)
    u = nx.uniform((2, 400, 250), 0, 0.0, 0.0)
    want = np.sqrt(fdlibm.log(1.0 - u[0]) * -2.0) * fdlibm.cos(u[1] * nn.TWO_PI)
    assert_bits_equal(tp.value(z), want)
    zv = tp.value(z)
    assert abs(zv.mean()) <= 5 / np.sqrt(1e5) and abs(zv.var() - 1.0) <= 5 * np.sqrt(2 / 1e5)
    assert abs((np.abs(zv) > 3).mean() - 0.0027) <= 5 * np.sqrt(0.0027 / 1e5)
    tp.set_value(tp.rng(), [0.0, 0.0, 0.0])
    tp.forward()
    assert_bits_equal(tp.value(z), np.zeros((400, 250)))
    assert_refused((lambda: nn.normal([2, 0], tape=tp), "shape must be"),
                   (lambda: nn.normal([2], tape=None), "tape= must be"),
                   (lambda: nn.normal([2], tape=tp, salt=2.5), "salt"))


# ── rand, randint, randperm ────────────────────────────────────────────────

def test_rand_draws_are_the_uniform_op_and_their_mean_with_the_flag_off():
    """rand is the uniform op itself on [0, 1), u * (high - low) + low elsewhere (bits);
    10^5 draws on [-2, 3) have the mean 0.5 and fill every fifth (5 sigma); the flag 0
    gives the mean, low/2 + high/2."""
    tp = gt.Tape()
    a = nn.rand([300, 400], tape=tp)
    b = nn.rand([250, 400], tape=tp, low=-2, high=3.0)
    assert_bits_equal(tp.value(a), nx.uniform((300, 400), 0, 0.0, 0.0))
    assert_bits_equal(tp.value(b), nx.uniform((250, 400), 1, 0.0, 0.0) * 5.0 + -2.0)
    bv = tp.value(b)
    assert bv.min() >= -2.0 and bv.max() < 3.0
    assert abs(bv.mean() - 0.5) <= 5 * np.sqrt(25 / 12 / 1e5)
    counts = np.histogram(bv, bins=5, range=(-2, 3))[0]
    assert np.abs(counts - 2e4).max() <= 5 * np.sqrt(2e4 * 0.8)
    tp.set_value(tp.rng(), [0.0, 0.0, 0.0])
    tp.forward()
    assert_bits_equal(tp.value(a), np.full((300, 400), 0.5))
    assert_bits_equal(tp.value(b), np.full((250, 400), 0.5))
    assert_refused((lambda: nn.rand([2], tape=tp, low=1.0, high=0.0), "low <= high"),
                   (lambda: nn.rand([2], tape=tp, high=float("inf")), "finite number"),
                   (lambda: nn.rand([2], tape=tp, low=-1e308, high=1e308), "finite width"),
                   (lambda: nn.rand([0], tape=tp), "shape must be"),
                   (lambda: nn.rand([2], tape=None), "tape= must be"))


def test_randint_draws_every_value_alike_as_ids_and_the_middle_with_the_flag_off():
    """randint is floor(u * n) + low (bits), integer-valued: take reads it as ids (the
    noise schedule of a diffusion model); 7 values are drawn alike (10^5 draws, 5 sigma);
    u just below 1 gives high - 1, never high; the flag 0 gives the middle value."""
    tp = gt.Tape()
    t = nn.randint(-3, 4, [200, 500], tape=tp)
    u = nx.uniform((200, 500), 0, 0.0, 0.0)
    assert_bits_equal(tp.value(t), np.floor(u * 7.0) + -3.0)
    counts = np.bincount((tp.value(t) + 3).astype(np.int64).ravel(), minlength=7)
    assert len(counts) == 7 and np.abs(counts - 1e5 / 7).max() <= 5 * np.sqrt(1e5 / 7)
    top = 1.0 - 2.0 ** -53                              # the largest u
    for n in (3, 7, 10, 1000, 2 ** 31 - 1, 2 ** 53 - 1):
        assert np.floor(top * float(n)) == n - 1, n
    schedule = tp.param(np.linspace(0.1, 1.0, 10))
    steps = nn.randint(0, 10, [6], tape=tp)
    picked = tp.take(schedule, steps)                 # ids: accepted when recorded
    assert_bits_equal(tp.value(picked), tp.value(schedule)[tp.value(steps).astype(np.int64)])
    tp.backward(tp.sum(picked))
    assert_bits_equal(tp.grad(schedule), np.bincount(
        tp.value(steps).astype(np.int64), minlength=10).astype(np.float64))
    tp.set_value(tp.rng(), [0.0, 0.0, 0.0])
    tp.forward()
    assert_bits_equal(tp.value(t), np.zeros((200, 500)))     # -3 + (7 - 1) // 2
    assert_bits_equal(tp.value(steps), np.full(6, 4.0))      # 0 + (10 - 1) // 2
    assert_refused((lambda: nn.randint(3, 3, [2], tape=tp), "low < high"),
                   (lambda: nn.randint(-2 ** 53, 2 ** 53, [2], tape=tp), "low < high"),
                   (lambda: nn.randint(0, 2.5, [2], tape=tp), "high must be"),
                   (lambda: nn.randint(0, 4, [2], tape=tp, salt="a"), "salt"))


def test_randperm_is_a_permutation_that_sorts_a_draw_and_the_identity_with_the_flag_off():
    tp = gt.Tape()
    perm = nn.randperm(50, tape=tp, salt=9)
    u = nx.uniform((50,), 9, 0.0, 0.0)
    assert_bits_equal(tp.value(perm), np.argsort(u, kind="stable").astype(np.float64))
    seen = set()
    for step in range(4):
        tp.set_value(tp.rng(), [float(step), 0.0, 1.0])
        tp.forward()
        p = tp.value(perm)
        assert sorted(p.tolist()) == list(range(50))
        seen.add(tuple(p))
    assert len(seen) == 4                               # each step draws its own
    rows = tp.param(np.arange(50.0).reshape(50, 1) * 0.5)
    mixed = tp.take(rows, perm)                        # x[perm]: ids
    tp.set_value(tp.rng(), [0.0, 0.0, 0.0])
    tp.forward()
    assert_bits_equal(tp.value(perm), np.arange(50.0))
    assert_bits_equal(tp.value(mixed), tp.value(rows))
    with pytest.raises(gt.TapeError, match="n must be"):
        nn.randperm(0, tape=tp)


def test_the_rounding_ops_give_ids_and_a_bad_one_is_refused():
    """floor, ceil, trunc and round are integer-valued whatever their input, so they may
    feed ids (bucketing); an id they compute outside the table is refused, naming it,
    and a file holding such a take loads."""
    tp = gt.Tape()
    x = tp.param(np.array([0.2, 0.7, 0.99, 0.5]))
    table = tp.param(np.arange(4.0).reshape(4, 1) * 10.0)
    picked = tp.take(table, tp.floor(tp.muls(x, 4.0)))
    assert_bits_equal(tp.value(picked)[:, 0], np.array([0.0, 20.0, 30.0, 20.0]))
    loss = tp.sum(picked)
    loaded = load(dumps(tp, loss=loss)).tape                  # the loader's check accepts it
    assert loaded.integral[picked.id - 1] and loaded.nodes[picked.id].op == "take"
    assert_bits_equal(loaded.values[loss.id], tp.value(loss))
    with pytest.raises(gt.GradtoolError, match="outside"):
        tp.take(table, tp.round(tp.muls(x, 5.0)))                   # round(4.95) = 5


# ── multinomial ────────────────────────────────────────────────────────────

def test_multinomial_draws_by_the_inverse_cdf_and_the_mode_with_the_flag_off():
    """The ids are how many entries of cumsum(w) are <= u * sum(w) (bits against numpy's
    sequential cumsum); 2 x 10^4 draws per row follow the weights (5 sigma), a weight 0
    is never drawn, integer-valued (take reads them); a row with a negative or NaN weight
    or a zero sum gives NaN ids; the flag 0 gives the most likely category."""
    tp = gt.Tape()
    weights = np.array([[0.1, 0.6, 0.0, 0.3], [2.0, 1.0, 1.0, 0.0]])
    w = tp.param(weights)
    d = nn.multinomial(w, 20000, replacement=True, salt=3)
    c = np.cumsum(weights, axis=1)
    t = nx.uniform((2, 20000), 3, 0.0, 0.0) * c[:, 3:4]
    assert_bits_equal(tp.value(d), (c[:, None, :] <= t[:, :, None]).sum(-1).astype(float))
    for row in range(2):
        freq = np.bincount(tp.value(d)[row].astype(np.int64), minlength=4) / 2e4
        p = weights[row] / weights[row].sum()
        assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / 2e4) + 1e-12), row
        assert freq[p == 0].sum() == 0
    picked = tp.take(tp.param(np.arange(4.0)), nn.multinomial(w, 1))   # ids: [2, 1]
    tp.backward(tp.sum(picked))
    assert_bits_equal(tp.grad(w), np.zeros((2, 4)))                      # no gradient
    bad = nn.multinomial(tp.const(np.array([[0.5, -0.1, 0.6], [0.0, 0.0, 0.0],
                                             [1.0, np.nan, 1.0], [1.0, 2.0, 0.5]])), 2,
                         replacement=True)
    assert np.isnan(tp.value(bad)[:3]).all() and not np.isnan(tp.value(bad)[3]).any()
    with pytest.raises(gt.GradtoolError, match="outside"):
        tp.take(tp.param(np.ones(3)), bad)
    tp.reset_to(picked.id + 1)
    tp.set_value(tp.rng(), [0.0, 0.0, 0.0])
    tp.forward()
    assert_bits_equal(tp.value(d), np.repeat([[1.0], [0.0]], 20000, axis=1))
    assert_refused((lambda: nn.multinomial(w, 2), "needs replacement=True"),
                   (lambda: nn.multinomial(w, 0), "num_samples must be"),
                   (lambda: nn.multinomial(w, 1, replacement=1), "True or False"))


# ── every draw on the host backend ─────────────────────────────────────────

def _mixed_draws(tp, x, rng):
    schedule = tp.param(rng.uniform(0.1, 1.0, (9, 1)))
    t = nn.rand([5, 1], tape=tp, low=-1.0, high=2.0)
    a = tp.take(schedule, nn.randint(2, 9, [5], tape=tp))           # [5, 1]
    mixed = tp.take(x, nn.randperm(5, tape=tp))
    return tp.add(tp.mul(tp.mul(x, t), a), tp.muls(mixed, 0.3))


def _policy(tp, x, rng):
    probs = tp.softmax(x, axis=-1)
    actions = nn.multinomial(probs, 1)                              # [5, 1]
    return tp.log(tp.take_along(probs, actions, axis=-1))


DRAW_TAPES = {           # (seed, x's shape, y from (tape, x, rng), the slot's counters)
    "bernoulli": (10, (6, 5), lambda tp, x, rng: tp.add(x, tp.mul(tp.tanh(x), tp.div(
        nn.bernoulli(0.7, shape=[6, 1], tape=tp), tp.const(np.array([0.7]))))),
        [5.0, 1.0, 1.0]),
    "normal": (11, (4, 3), lambda tp, x, rng: tp.add(x, tp.mul(
        tp.exp(tp.muls(x, 0.5)), nn.normal([4, 3], tape=tp))), [9.0, 2.0, 1.0]),
    "rand, randint, randperm": (12, (5, 3), _mixed_draws, [4.0, 1.0, 1.0]),
    "multinomial": (13, (5, 3), _policy, [6.0, 1.0, 1.0]),
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("draws", sorted(DRAW_TAPES))
def test_draws_on_the_host_backend_equal_numpy(draws, variant):
    require_c_compiler()
    seed, shape, build, counters = DRAW_TAPES[draws]
    rng = np.random.default_rng(seed)
    tp = gt.Tape()
    x = tp.param(rng.standard_normal(shape))
    y = build(tp, x, rng)
    _host_equals_numpy(tp, tp.sum(tp.mul(y, y)), x, y, variant, counters)
