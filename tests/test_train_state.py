"""Training state (issue 21): batch norm's running statistics imported from torch as
state slots, carried by `gradtool train` from step to step on every engine, saved in the
checkpoint, resumed exactly, written back into the module's buffers; and the loader's
one-line refusals of a malformed ``state`` map.

The real things throughout: torch.export through the importer, msgpack files on disk,
the command line, MPICH's mpiexec where it is installed."""

import msgpack
import numpy as np
import pytest

from conftest import require_c_compiler
from gradtool.numerics import shard_accumulate, shard_divide
from gradtool.tapefile import load
from support import assert_one_line_error, run, train_under_mpiexec

torch = pytest.importorskip("torch")

from gradtool.interop.torch import import_module, load_weights  # noqa: E402

BATCH, N, STATE = 8, 48, ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked")


class SmallCnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4, momentum=0.2)
        self.fc = torch.nn.Linear(4 * 3 * 3, 3)

    def forward(self, x, y):
        h = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return torch.nn.functional.cross_entropy(self.fc(h.flatten(1)), y)


def _model():
    torch.manual_seed(3)
    return SmallCnn().double().train()


def _data(path):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(N, 1, 6, 6)) * 2.0 + 0.5
    y = rng.integers(0, 3, size=N)
    np.savez(path, x=x, y=y)
    return x, y


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("state")
    x, y = _data(d / "d.npz")
    result = import_module(_model(), (torch.tensor(x[:BATCH]), torch.tensor(y[:BATCH])), dtype="f64")
    result.save(d / "cnn.msgpack")
    return d, x, y


def _state(path) -> dict:
    tf = load(path)
    slots = {n.name: i for i, n in enumerate(tf.tape.nodes) if n.op == "const" and n.name}
    return {k: tf.tape.values[slots[k]] for k in tf.state}


def test_the_importer_records_mutated_buffers_as_state(files):
    d, _, _ = files
    tf = load(d / "cnn.msgpack")
    assert tf.state == {k: k for k in STATE}
    assert tf.dumps() == (d / "cnn.msgpack").read_bytes()           # the map round-trips
    named = {n.name for n in tf.tape.nodes if n.op == "const" and n.name}
    assert named == {"x", "y", *STATE}
    r = run("inspect", "--json", d / "cnn.msgpack")
    import json
    s = json.loads(r.stdout)
    assert [c["name"] for c in s["inputs"]] == ["x", "y"]           # state is no input slot
    assert [c["name"] for c in s["state"]] == list(STATE)
    # eval mode records the running statistics as consts, as before: no state
    model = _model().eval()
    x = torch.zeros(BATCH, 1, 6, 6, dtype=torch.float64)
    y = torch.zeros(BATCH, dtype=torch.int64)
    assert import_module(model, (x, y), dtype="f64").state == {}


SPEC = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3, bias=False)
        self.bn = torch.nn.BatchNorm2d(2)

    def forward(self, x):
        return self.bn(self.conv(x)).square().mean()

def build():
    torch.manual_seed(0)
    return Net().train(), (torch.randn(4, 1, 5, 5),)
"""


def test_import_torch_on_the_command_line_writes_the_state(tmp_path):
    spec = tmp_path / "model.py"
    spec.write_text(SPEC)
    out = tmp_path / "m.msgpack"
    r = run("import-torch", f"{spec}:build", "-o", out, "--dtype", "f64")
    assert r.exit_code == 0, r.output
    assert r.stdout.rstrip().endswith(", state " + ", ".join(sorted(STATE)))
    tf = load(out)
    assert tf.state == {k: k for k in STATE}
    got = _state(out)
    assert got["bn.running_mean"].tolist() == [0.0, 0.0]          # the buffers' values
    assert got["bn.running_var"].tolist() == [1.0, 1.0]
    assert got["bn.num_batches_tracked"].tolist() == [0.0]


def test_running_statistics_and_loss_match_torch_after_k_steps(files, tmp_path):
    """k steps of `gradtool train` against k steps of torch float64 on the same batches
    (file order), the same optimizer (SGD: torch.optim.SGD is the same arithmetic;
    gradtool's Adam places eps as scikit-learn does, docs/training.md, which torch's does
    not): running statistics, num_batches_tracked, the parameters and the last loss; then
    load_weights puts the state into a module."""
    d, x, y = files
    k, lr = 9, 0.05
    out = tmp_path / "k.msgpack"
    r = run("train", d / "cnn.msgpack", "--data", d / "d.npz", "--optimizer", "sgd",
            "--lr", lr, "--no-shuffle", "--epochs", 2, "--steps", k, "--json", "--save", out)
    assert r.exit_code == 0, r.stderr
    import json
    final_loss = json.loads(r.stdout.splitlines()[-1])["final_loss"]

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    steps_per_epoch = N // BATCH
    for step in range(k):
        rows = slice((step % steps_per_epoch) * BATCH, (step % steps_per_epoch + 1) * BATCH)
        opt.zero_grad()
        loss = model(torch.tensor(x[rows]), torch.tensor(y[rows]))
        loss.backward()
        opt.step()
    want = float(loss.detach())
    assert abs(final_loss - want) <= 1e-12 * abs(want), (final_loss, want)

    got = _state(out)
    buffers = dict(model.named_buffers())
    for name in ("bn.running_mean", "bn.running_var"):
        ref = buffers[name].numpy()
        assert np.abs(got[name] - ref).max() <= 1e-12 * np.abs(ref).max(), name
    assert got["bn.num_batches_tracked"].tolist() == [float(k)]
    tf = load(out)
    params = {tf.tape.nodes[p.id].name: tf.tape.values[p.id] for p in tf.tape.params()}
    for name, p in model.named_parameters():
        ref = p.detach().numpy()
        assert np.abs(params[name] - ref).max() <= 1e-12 * np.abs(ref).max(), name

    fresh = _model()
    copied = load_weights(fresh, out)
    assert set(STATE) <= set(copied)
    for name, b in fresh.named_buffers():
        if name == "bn.num_batches_tracked":
            assert b.dtype == torch.int64 and int(b) == k
        else:
            assert np.array_equal(b.numpy(), got[name]), name     # the checkpoint's bits


def test_every_engine_and_two_mpi_ranks_save_the_same_bytes(files, tmp_path):
    require_c_compiler()
    d, _, _ = files
    common = ["--data", d / "d.npz", "--epochs", 2, "--lr", 0.01]
    saved = {}
    for name, extra in (("cpu", []), ("host", ["--backend", "host"]),
                        ("fused", ["--backend", "host", "--fuse"]),
                        ("cpu2", ["--shards", 2]),
                        ("host2", ["--backend", "host", "--shards", 2])):
        path = tmp_path / f"{name}.msgpack"
        r = run("train", d / "cnn.msgpack", *common, *extra, "--save", path)
        assert r.exit_code == 0, r.stderr
        saved[name] = path.read_bytes()
    assert saved["cpu"] == saved["host"] == saved["fused"]
    assert saved["cpu2"] == saved["host2"]
    assert saved["cpu"] != saved["cpu2"]
    start = _state(d / "cnn.msgpack")
    for name in ("cpu", "cpu2"):
        end = _state(tmp_path / f"{name}.msgpack")
        assert end["bn.num_batches_tracked"].tolist() == [12.0 if name == "cpu" else 6.0]
        assert not np.array_equal(end["bn.running_mean"], start["bn.running_mean"])
    assert train_under_mpiexec(d / "cnn.msgpack", [*common, "--shards", 2],
                               tmp_path / "mpi.msgpack") == saved["cpu2"]


def test_with_shards_the_state_is_the_shard_mean_of_the_outputs(files, tmp_path):
    """One step of --shards 2: each state slot holds numerics.shard_mean of the two
    shards' outputs (shard 0 first), replayed here by hand from the imported tape."""
    d, x, y = files
    out = tmp_path / "one.msgpack"
    r = run("train", d / "cnn.msgpack", "--data", d / "d.npz", "--no-shuffle", "--shards", 2,
            "--steps", 1, "--save", out)
    assert r.exit_code == 0, r.stderr
    tf = load(d / "cnn.msgpack")
    tp = tf.tape
    slots = {n.name: i for i, n in enumerate(tp.nodes) if n.op == "const" and n.name}
    outputs = []
    for k in range(2):
        tp.values[slots["x"]][...] = x[k * BATCH:(k + 1) * BATCH]
        tp.values[slots["y"]][...] = y[k * BATCH:(k + 1) * BATCH]
        tp.forward()
        outputs.append({s: np.array(tp.values[tf.outputs[o].id]) for s, o in tf.state.items()})
    got = _state(out)
    for s in tf.state:
        acc = outputs[0][s].copy()
        shard_accumulate(acc, outputs[1][s])
        shard_divide(acc, 2)
        assert np.array_equal(got[s], acc), s
        assert not np.array_equal(got[s], outputs[0][s]) or s == "bn.num_batches_tracked"


@pytest.mark.parametrize("extra", [[], ["--shards", 2]], ids=["one", "shards2"])
def test_resuming_mid_run_gives_the_uninterrupted_bytes(files, tmp_path, extra):
    d, _, _ = files
    common = ["--data", d / "d.npz", "--lr", 0.02, *extra]
    straight, first, second = (tmp_path / f"{n}.msgpack" for n in ("s", "a", "b"))
    assert run("train", d / "cnn.msgpack", *common, "--epochs", 3, "--save",
               straight).exit_code == 0
    r = run("train", d / "cnn.msgpack", *common, "--epochs", 3, "--steps", 4, "--save", first)
    assert r.exit_code == 0, r.stderr
    assert load(first).optimizer["position"]["step"] == 4 % (N // BATCH // (2 if extra else 1))
    r = run("train", first, *common, "--save", second)          # finishes the plan
    assert r.exit_code == 0, r.stderr
    assert second.read_bytes() == straight.read_bytes()


def test_validation_runs_the_recorded_graph_and_leaves_the_state(files, tmp_path):
    """A validation pass is forward only: the state after an epoch with validation is the
    state after the same epoch without it."""
    d, x, y = files
    np.savez(tmp_path / "v.npz", x=x[:16], y=y[:16])
    a, b = tmp_path / "a.msgpack", tmp_path / "b.msgpack"
    assert run("train", d / "cnn.msgpack", "--data", d / "d.npz", "--save", a).exit_code == 0
    r = run("train", d / "cnn.msgpack", "--data", d / "d.npz", "--val", tmp_path / "v.npz",
            "--save", b)
    assert r.exit_code == 0, r.stderr
    for k, v in _state(a).items():
        assert np.array_equal(v, _state(b)[k]), k


# ── malformed state maps: one line, exit 2 ─────────────────────────────────

def _with_state(files, tmp_path, edit):
    d, _, _ = files
    doc = msgpack.unpackb((d / "cnn.msgpack").read_bytes())
    edit(doc)
    path = tmp_path / "bad.msgpack"
    path.write_bytes(msgpack.packb(doc, use_bin_type=True))
    return path


def _param_name(doc):
    return next(n["name"] for n in doc["nodes"] if n["op"] == "param")


CASES = {
    "unknown output": (lambda doc: doc["state"].update({"bn.running_mean": "nope"}),
                       "field 'state.bn.running_mean': is updated by output 'nope', which "
                       "the file does not have"),
    "shape mismatch": (lambda doc: doc["state"].update({"bn.running_mean":
                                                        "bn.num_batches_tracked"}),
                       "field 'state.bn.running_mean': node 6 has shape [4], but output "
                       "'bn.num_batches_tracked'"),
    "a param": (lambda doc: doc["state"].update({_param_name(doc): "bn.running_mean"}),
                "a state is a const (params are the optimizer's)"),
    "no such leaf": (lambda doc: doc["state"].update({"ghost": "bn.running_mean"}),
                     "field 'state.ghost': names no leaf"),
    "integer ids": (lambda doc: doc["state"].update({"y": "bn.running_mean"}),
                    "field 'state.y': names node", "holds integer ids"),
    "not a string": (lambda doc: doc["state"].update({"bn.running_var": 5}),
                     "field 'state.bn.running_var': expected a string, got an integer"),
    "not a map": (lambda doc: doc.update(state=["bn.running_var"]),
                  "field 'state': expected"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_malformed_state_map_is_one_line_exit_2(files, tmp_path, case):
    edit, *needles = CASES[case]
    path = _with_state(files, tmp_path, edit)
    d, _, _ = files
    for args in (("inspect", path), ("train", path, "--data", d / "d.npz")):
        assert_one_line_error(run(*args), 2, str(path), *needles)


def test_the_library_refuses_to_write_a_malformed_state_map(files):
    from gradtool.errors import TapeError
    from gradtool.tapefile import dumps
    d, _, _ = files
    tf = load(d / "cnn.msgpack")
    with pytest.raises(TapeError, match="is updated by output 'ghost'"):
        dumps(tf.tape, loss=tf.loss, outputs=tf.outputs, state={"bn.running_var": "ghost"})
    with pytest.raises(TapeError, match="state outputs must be non-empty strings"):
        dumps(tf.tape, loss=tf.loss, outputs=tf.outputs, state={"bn.running_var": 3})


def test_a_hand_recorded_tape_with_state_trains_the_same_in_python(tmp_path):
    """gt.Tape + nn.batch_norm2d_train + save(state=...): two steps through the library's
    Trainer, each state slot replaced by its output of the step's forward (recomputed by
    hand from the parameters before each update), and the state slots need no data."""
    import gradtool as gt
    from gradtool import nn
    from gradtool.optim import SGD
    from gradtool.tapefile import save
    from gradtool.train import TrainOptions, Trainer
    rng = np.random.default_rng(5)
    tp = gt.Tape()
    x = tp.const(rng.normal(size=(4, 2, 3, 3)), name="x")
    w, b = tp.param(rng.normal(size=2), name="w"), tp.param(rng.normal(size=2), name="b")
    rm = tp.const(np.zeros(2), name="rm")
    rv = tp.const(np.ones(2), name="rv")
    y, new_mean, new_var = nn.batch_norm2d_train(x, w, b, rm, rv, momentum=0.25)
    loss = tp.mean(tp.mul(y, tp.const(rng.normal(size=(4, 2, 3, 3)))))
    path = tmp_path / "bn.msgpack"
    save(tp, path, loss=loss, outputs={"mean": new_mean, "var": new_var},
         state={"rm": "mean", "rv": "var"}, meta={"train": {"optimizer": "sgd", "lr": 0.5}})
    data = rng.normal(size=(8, 2, 3, 3))
    np.savez(tmp_path / "d.npz", x=data)
    out = tmp_path / "out.msgpack"
    Trainer(load(path), str(tmp_path / "d.npz"),
            TrainOptions(shuffle=False, save=str(out))).run()

    ref = load(path)                 # the same two steps by hand, on the library's tape
    tape, (ix, irm, irv) = ref.tape, (0, 3, 4)
    assert [tape.nodes[i].name for i in (ix, irm, irv)] == ["x", "rm", "rv"]
    opt = SGD(0.5)
    for p in tape.params():
        opt.add(tape, p)
    for step in range(2):
        tape.values[ix][...] = data[step * 4:(step + 1) * 4]
        tape.forward()
        m, v = (np.array(tape.values[ref.outputs[k].id]) for k in ("mean", "var"))
        tape.zero_grad()
        tape.backward(ref.loss)
        opt.step(tape)
        tape.values[irm][...], tape.values[irv][...] = m, v
    got = _state(out)
    assert np.array_equal(got["rm"], tape.values[irm]) and np.array_equal(got["rv"],
                                                                           tape.values[irv])
    assert not np.array_equal(got["rm"], np.zeros(2))
