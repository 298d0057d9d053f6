"""The digits CNN sample (samples/digits_cnn/): a reproducible tape, it learns, and every
engine (cpu, host, shards in one process, two MPI ranks) saves the same bytes."""

import sys
from pathlib import Path

import pytest

from conftest import require_c_compiler
from gradtool.tapefile import dumps, load
from gradtool.train import TrainOptions, Trainer
from support import DIGITS_DATA, SAMPLES, run, train_under_mpiexec

CNN = SAMPLES / "digits_cnn" / "digits_cnn.msgpack"


def test_the_script_records_the_committed_tape():
    sys.path.insert(0, str(SAMPLES / "digits_cnn"))
    try:
        import make_digits_cnn as make
    finally:
        sys.path.pop(0)
    import numpy as np
    with np.load(DIGITS_DATA) as data:
        arrays = {k: data[k] for k in ("x", "y")}
    tp, loss, outputs, meta = make.record_cnn(arrays)
    assert dumps(tp, loss=loss, outputs=outputs, meta=meta) == CNN.read_bytes()
    ops = {n.op for n in tp.nodes}
    assert {"conv2d", "max_pool2d"} <= ops


def test_it_trains_to_97_percent_validation_accuracy():
    res = Trainer(load(CNN), str(DIGITS_DATA), TrainOptions()).run()
    assert res.accuracy_on == "val" and res.epochs == 15
    assert res.accuracy >= 0.97, res.summary()


def test_cpu_host_shards_and_mpi_ranks_save_the_same_bytes(tmp_path):
    require_c_compiler()
    common = ["--data", DIGITS_DATA, "--epochs", 2]
    saved = {}
    for name, extra in (("cpu", []), ("host", ["--backend", "host"]),
                        ("cpu2", ["--shards", 2]), ("host2", ["--backend", "host", "--shards", 2])):
        path = tmp_path / f"{name}.msgpack"
        r = run("train", CNN, *common, *extra, "--save", path)
        assert r.exit_code == 0, r.stderr
        saved[name] = path.read_bytes()
    assert saved["cpu"] == saved["host"]
    assert saved["cpu2"] == saved["host2"]
    assert saved["cpu"] != saved["cpu2"]           # two shards: a step of 64 rows
    assert train_under_mpiexec(CNN, [*common, "--shards", 2],
                               tmp_path / "mpi.msgpack") == saved["cpu2"]


def test_trained_weights_in_a_torch_module_give_the_same_loss(tmp_path):
    """The checkpoint's parameters loaded into the equivalent torch.nn CNN: its loss on
    the tape's batch equals gradtool's within 1e-12 relative (no importer: by hand)."""
    import numpy as np
    torch = pytest.importorskip("torch")

    out = tmp_path / "cnn.msgpack"
    assert run("train", CNN, "--data", DIGITS_DATA, "--epochs", 1, "--save", out).exit_code == 0
    tf = load(out)
    tp = tf.tape
    tp.forward()
    params = {n.name: tp.values[i] for i, n in enumerate(tp.nodes) if n.op == "param"}
    x, y = (tp.values[i] for i, n in enumerate(tp.nodes) if n.op == "const" and n.name)

    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64, 10)).double()
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor(params["K1"]))
        net[0].bias.copy_(torch.tensor(params["c1"]))
        net[3].weight.copy_(torch.tensor(params["K2"]))
        net[3].bias.copy_(torch.tensor(params["c2"]))
        net[7].weight.copy_(torch.tensor(params["W"].T))
        net[7].bias.copy_(torch.tensor(params["b"][0]))
        logits = net(torch.tensor(x * 0.0625).reshape(32, 1, 8, 8))
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(np.argmax(y, axis=1)))
    want = float(tp.values[tf.loss.id][0])
    assert abs(float(loss) - want) <= 1e-12 * abs(want), (float(loss), want)


# ── the torch.nn version, recorded through the importer ───────────────────────────

CNN_TORCH = SAMPLES / "digits_cnn" / "digits_cnn_torch.msgpack"
CNN_BN_TORCH = SAMPLES / "digits_cnn" / "digits_cnn_bn_torch.msgpack"


def test_the_imported_cnn_trains_alike_on_cpu_and_host(tmp_path):
    require_c_compiler()
    saved = []
    for backend in ("cpu", "host"):
        path = tmp_path / f"{backend}.msgpack"
        r = run("train", CNN_TORCH, "--data", DIGITS_DATA, "--epochs", 1, "--backend",
                backend, "--save", path)
        assert r.exit_code == 0, r.stderr
        saved.append(path.read_bytes())
    assert saved[0] == saved[1]
    assert {"conv2d", "max_pool2d"} <= {n.op for n in load(CNN_TORCH).tape.nodes}


def _importer_with_conv():
    pytest.importorskip("torch")
    try:
        from gradtool.interop import aten
    except ImportError:
        pytest.skip("the importer (i20-importer) is not merged here")
    if "aten.convolution.default" not in aten.ATEN:
        pytest.skip("the importer's table has no convolution entry")


def _make_torch():
    sys.path.insert(0, str(SAMPLES / "digits_cnn"))
    try:
        import make_digits_cnn_torch as make
    finally:
        sys.path.pop(0)
    return make


@pytest.mark.parametrize("batch_norm", [False, True], ids=["plain", "bn"])
def test_the_importer_records_the_committed_torch_tape(batch_norm):
    _importer_with_conv()
    import numpy as np
    make = _make_torch()
    with np.load(DIGITS_DATA) as data:
        arrays = {k: data[k] for k in ("x", "y")}
    _, result = make.record(arrays, batch_norm)
    committed = CNN_BN_TORCH if batch_norm else CNN_TORCH
    path = Path(str(committed) + ".new")
    try:
        result.save(path, meta=make.META[batch_norm])
        assert path.read_bytes() == committed.read_bytes()
    finally:
        path.unlink(missing_ok=True)


def test_trained_weights_written_back_reproduce_the_loss_in_torch(tmp_path):
    _importer_with_conv()
    import numpy as np
    import torch

    from gradtool.interop.torch import load_weights
    make = _make_torch()
    out = tmp_path / "t.msgpack"
    assert run("train", CNN_TORCH, "--data", DIGITS_DATA, "--epochs", 2, "--save",
               out).exit_code == 0
    tf = load(out)
    tf.tape.forward()
    want = float(tf.tape.values[tf.loss.id][0])
    model = make.build()
    load_weights(model, str(out))
    with np.load(DIGITS_DATA) as data:
        x, y = (torch.tensor(data[k][:32].astype(np.float64)) for k in ("x", "y"))
    with torch.no_grad():
        got = float(model(x, y)[0])
    assert abs(got - want) <= 1e-12 * abs(want), (got, want)


def test_conv_pool_and_batch_norm_import_against_torch():
    """Every new mapping, in both batch-norm modes: loss, gradients and the running
    statistics' update (named outputs under the buffers' names) against torch float64."""
    _importer_with_conv()
    import numpy as np
    import torch

    from gradtool.interop.torch import import_module

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(1, 4, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(4)
            self.c2 = torch.nn.Conv2d(4, 4, 3, groups=2)
            self.c3 = torch.nn.Conv1d(4, 2, 1)
            self.w = torch.nn.Parameter(torch.randn(2, 3))

        def forward(self, x):
            h = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
            h = torch.nn.functional.avg_pool2d(self.c2(h), 2, ceil_mode=True)
            h = self.c3(h.flatten(2)).flatten(1)
            return ((h @ self.w) ** 2).sum()

    x = torch.randn(2, 1, 9, 9, dtype=torch.float64)
    for mode in ("train", "eval"):
        torch.manual_seed(0)
        model = Net().double()
        getattr(model, mode)()
        result = import_module(model, (x,), dtype="f64")
        tp = result.tape
        tp.backward(result.loss)
        want = model(x)
        want.backward()
        want = float(want.detach())
        assert abs(float(tp.value(result.loss)[0]) - want) <= 1e-12 * abs(want)
        grads = {n.name: tp.grad(tp.var(i)) for i, n in enumerate(tp.nodes) if n.op == "param"}
        # relative to the largest gradient: a bias under batch norm has a gradient of
        # zero up to rounding in both
        scale = max(float(p.grad.abs().max()) for p in model.parameters())
        for name, p in model.named_parameters():
            assert np.abs(grads[name] - p.grad.numpy()).max() <= 1e-11 * scale, (mode, name)
        if mode == "train":
            buffers = dict(model.named_buffers())
            for name in ("bn.running_mean", "bn.running_var"):
                got = tp.value(result.outputs[name])
                assert np.abs(got - buffers[name].numpy()).max() <= 1e-12 * float(
                    buffers[name].abs().max()), name


# ── the batch-norm variant: running statistics as training state ──────────────

def _state(tf) -> dict:
    slots = {n.name: i for i, n in enumerate(tf.tape.nodes) if n.op == "const" and n.name}
    return {k: tf.tape.values[slots[k]] for k in tf.state}


def test_the_batch_norm_cnn_trains_to_97_percent_and_carries_its_running_statistics(
        tmp_path):
    out = tmp_path / "bn.msgpack"
    res = Trainer(load(CNN_BN_TORCH), str(DIGITS_DATA), TrainOptions(save=str(out))).run()
    assert res.accuracy_on == "val" and res.epochs == 15
    assert res.accuracy >= 0.97, res.summary()
    before, after = _state(load(CNN_BN_TORCH)), _state(load(out))
    assert sorted(after) == sorted(f"features.{i}.{b}" for i in (1, 5) for b in (
        "running_mean", "running_var", "num_batches_tracked"))
    assert after["features.1.num_batches_tracked"].tolist() == [float(res.steps)]
    for name in after:
        assert not (after[name] == before[name]).all(), name


def test_the_batch_norm_cnn_saves_the_same_bytes_on_every_engine_and_two_ranks(tmp_path):
    require_c_compiler()
    common = ["--data", DIGITS_DATA, "--epochs", 1]
    saved = {}
    for name, extra in (("cpu", []), ("host", ["--backend", "host"]),
                        ("cpu2", ["--shards", 2]), ("host2", ["--backend", "host", "--shards", 2])):
        path = tmp_path / f"{name}.msgpack"
        r = run("train", CNN_BN_TORCH, *common, *extra, "--save", path)
        assert r.exit_code == 0, r.stderr
        saved[name] = path.read_bytes()
    assert saved["cpu"] == saved["host"]
    assert saved["cpu2"] == saved["host2"] != saved["cpu"]
    assert train_under_mpiexec(CNN_BN_TORCH, [*common, "--shards", 2],
                               tmp_path / "mpi.msgpack") == saved["cpu2"]


def test_the_batch_norm_cnn_written_back_gives_torch_the_same_loss_and_buffers(tmp_path):
    """load_weights puts the trained parameters and the state into the module: its
    buffers are the checkpoint's bits, and a train-mode forward on the tape's batch
    gives gradtool's loss within 1e-12 relative."""
    _importer_with_conv()
    import numpy as np
    import torch

    from gradtool.interop.torch import load_weights
    make = _make_torch()
    out = tmp_path / "bn.msgpack"
    assert run("train", CNN_BN_TORCH, "--data", DIGITS_DATA, "--epochs", 1, "--save",
               out).exit_code == 0
    tf = load(out)
    tf.tape.forward()
    want = float(tf.tape.values[tf.loss.id][0])
    model = make.build(batch_norm=True)
    load_weights(model, str(out))
    state = _state(tf)
    for name, b in model.named_buffers():
        if name.endswith("num_batches_tracked"):
            assert b.dtype == torch.int64 and [float(b)] == state[name].tolist()
        else:
            assert np.array_equal(b.numpy(), state[name]), name
    with np.load(DIGITS_DATA) as data:
        x, y = (torch.tensor(data[k][:32].astype(np.float64)) for k in ("x", "y"))
    with torch.no_grad():
        got = float(model(x, y)[0])
    assert abs(got - want) <= 1e-12 * abs(want), (got, want)
