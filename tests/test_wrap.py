"""``gradtool.interop.torch.wrap`` and ``clip_grad_norm_``: a user's own PyTorch loop with
gradtool's forward and gradients (docs/torch.md, "Your own loop").

Real torch modules, the real importer, the real Tape and the real host C backend: the
wrapped module's gradients are `gradtool backward`'s of the import-torch tape to the bit,
torch float64 autograd's within 1e-11, and the cpu and host backends train to the same
bytes.  Skipped cleanly without torch.
"""

from __future__ import annotations

import copy
import json
import math
import pickle
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import gradtool.interop.torch as gtt                            # noqa: E402
from gradtool.errors import GradtoolError                       # noqa: E402
from gradtool.interop.wrap import WrapError                     # noqa: E402
from gradtool.optim import SGD                                  # noqa: E402
from conftest import assert_bits_equal, require_c_compiler      # noqa: E402
from support import run                                         # noqa: E402
from torch_cases import (assert_same_state_bytes, clipped_step, digits_tensors,  # noqa: E402
                         seeded_loader)


class Net(nn.Module):
    """Logits out: the loss is the wrapper's loss_fn."""

    def __init__(self, n_in=6, hidden=12, classes=4, bn=False, p=0.0):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.bn = nn.BatchNorm1d(hidden) if bn else nn.Identity()
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(self.drop(torch.tanh(self.bn(self.fc1(x)))))


class WithLoss(nn.Module):
    """Returns (loss, logits)."""

    def __init__(self):
        super().__init__()
        self.net = Net()

    def forward(self, x, y):
        logits = self.net(x)
        return F.cross_entropy(logits, y), logits


def batch(n=8, seed=0, n_in=6, classes=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, n_in, generator=g), torch.randint(0, classes, (n,), generator=g)


def grads_of(model) -> dict:
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()
            if p.grad is not None}


def torch_grads(model, x, y) -> tuple:
    """torch float64 autograd of the same loss."""
    m = copy.deepcopy(model)
    loss = F.cross_entropy(m(x.double()), y)
    loss.backward()
    return loss.item(), grads_of(m)


# ── gradients ──────────────────────────────────────────────────────────────

def test_gradients_are_gradtool_backward_of_the_imported_tape_bit_for_bit(tmp_path):
    torch.manual_seed(3)
    model = Net().double()
    x, y = batch()
    gm = gtt.wrap(model, (x, y), loss_fn=F.cross_entropy)
    loss = gm(x, y)
    loss.backward()
    ours = grads_of(model)

    result = gtt.import_module(model, (x,), F.cross_entropy, (y,))
    path = tmp_path / "net.msgpack"
    result.save(path)
    out = run("backward", path, "--json")
    assert out.exit_code == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["loss"] == loss.item()
    names = set()
    for p in report["params"]:
        names.add(p["name"])
        want = np.array(p["grad"], dtype=np.float64).reshape(p["shape"])
        assert_bits_equal(ours[p["name"]].numpy().reshape(want.shape), want, p["name"])
    assert names == set(ours) == {k for k, _ in model.named_parameters()}


def test_gradients_match_torch_float64_autograd():
    torch.manual_seed(4)
    model = Net().double()
    x, y = batch(seed=1)
    gm = gtt.wrap(model, (x, y), loss_fn=F.cross_entropy)
    loss = gm(x, y)
    loss.backward()
    want_loss, want = torch_grads(model, x, y)
    assert abs(loss.item() - want_loss) <= 1e-12 * abs(want_loss)
    for k, g in grads_of(model).items():
        rel = (g - want[k]).norm() / want[k].norm()
        assert rel <= 1e-11, (k, float(rel))


def test_grad_accumulates_and_scales_as_torch():
    """Two calls, two backwards: .grad is the sum, as torch accumulates; a backward of
    2 * loss doubles each gradient (the chain rule's one multiply)."""
    torch.manual_seed(5)
    model = Net().double()
    (x1, y1), (x2, y2) = batch(seed=2), batch(seed=3)
    gm = gtt.wrap(model, (x1, y1), loss_fn=F.cross_entropy)
    gm(x1, y1).backward()
    g1 = grads_of(model)
    model.zero_grad(set_to_none=True)
    gm(x2, y2).backward()
    g2 = grads_of(model)
    model.zero_grad(set_to_none=True)
    gm(x1, y1).backward()
    gm(x2, y2).backward()
    for k, g in grads_of(model).items():
        assert_bits_equal(g.numpy(), (g1[k] + g2[k]).numpy(), k)
    model.zero_grad(set_to_none=True)
    (gm(x1, y1) * 2.0).backward()
    for k, g in grads_of(model).items():
        assert_bits_equal(g.numpy(), (g1[k] * 2.0).numpy(), k)


def test_params_are_read_every_call_without_a_copy_on_cpu():
    torch.manual_seed(6)
    model = Net().double()
    x, y = batch(seed=4)
    gm = gtt.wrap(model, (x, y), loss_fn=F.cross_entropy)
    before = gm(x, y).item()
    graph = next(iter(gm.graphs.values()))
    tape = graph.tape
    for name, i in graph.params:       # the leaf is the parameter's own memory
        assert np.shares_memory(tape.values[i], dict(model.named_parameters())[name]
                                .detach().numpy())
    with torch.no_grad():
        model.fc2.weight.mul_(1.5)        # in place, as an optimizer's step
    after = gm(x, y).item()
    assert after != before
    assert abs(after - F.cross_entropy(model(x.double()), y).item()) <= 1e-12
    fresh = gtt.wrap(model, (x, y), loss_fn=F.cross_entropy)
    assert fresh(x, y).item() == after
    assert len(gm.graphs) == 1


def test_a_frozen_parameter_changed_records_again():
    torch.manual_seed(7)
    model = Net().double()
    model.fc1.weight.requires_grad_(False)
    x, y = batch(seed=5)
    gm = gtt.wrap(model, (x, y), loss_fn=F.cross_entropy)
    first = gm(x, y).item()
    with torch.no_grad():
        model.fc1.weight.mul_(0.5)        # a constant of the recorded tape
    second = gm(x, y).item()
    assert second != first
    assert abs(second - F.cross_entropy(model(x.double()), y).item()) <= 1e-12


# ── shapes ─────────────────────────────────────────────────────────────────

def test_a_last_partial_batch_records_a_second_graph():
    torch.manual_seed(8)
    model = Net().double()
    x, y = batch(n=10, seed=6)
    gm = gtt.wrap(model, (x[:8], y[:8]), loss_fn=F.cross_entropy)
    gm(x[:8], y[:8])
    loss = gm(x[8:], y[8:])              # 2 rows: recorded again, cached
    loss.backward()
    assert len(gm.graphs) == 2
    want_loss, want = torch_grads(model, x[8:], y[8:])
    assert abs(loss.item() - want_loss) <= 1e-12 * abs(want_loss)
    for k, g in grads_of(model).items():
        assert float((g - want[k]).norm() / want[k].norm()) <= 1e-11, k
    gm(x[:8], y[:8])                    # the first shape again: no new graph
    assert len(gm.graphs) == 2


def test_past_max_shapes_it_warns_once():
    torch.manual_seed(9)
    model = Net().double()
    x, y = batch(n=5, seed=7)
    gm = gtt.wrap(model, (x, y), loss_fn=F.cross_entropy, max_shapes=2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for n in (4, 3, 2):
            gm(x[:n], y[:n])
    mine = [w for w in seen if "max_shapes=2" in str(w.message)]
    assert len(mine) == 1 and "3 graphs recorded" in str(mine[0].message)


# ── outputs ────────────────────────────────────────────────────────────────

def test_a_model_returning_loss_and_logits_returns_both():
    torch.manual_seed(10)
    model = WithLoss().double()
    x, y = batch(seed=8)
    gm = gtt.wrap(model, (x, y))
    loss, logits = gm(x, y)
    assert loss.requires_grad and not logits.requires_grad
    with torch.no_grad():
        want = model.net(x.double())
    assert logits.shape == want.shape and logits.dtype == torch.float64
    assert float((logits - want).abs().max()) <= 1e-13
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_loss_fn_with_outputs_returns_loss_and_logits():
    torch.manual_seed(11)
    model = Net().double()
    x, y = batch(seed=9)
    gm = gtt.wrap(model, (x, y), loss_fn=nn.CrossEntropyLoss(), outputs=True)
    loss, logits = gm(x, y)
    with torch.no_grad():
        want = model(x.double())
    assert float((logits - want).abs().max()) <= 1e-13
    assert abs(loss.item() - F.cross_entropy(want, y).item()) <= 1e-12
    assert (logits.argmax(1) == want.argmax(1)).all()


def test_misuse_raises_gradtool_errors():
    torch.manual_seed(12)
    model = Net().double()
    x, y = batch(seed=10)
    with pytest.raises(WrapError, match="unknown backend 'gpu'"):
        gtt.wrap(model, (x, y), backend="gpu", loss_fn=F.cross_entropy)
    with pytest.raises(WrapError, match="outputs=True needs loss_fn"):
        gtt.wrap(model, (x,), outputs=True)
    gm = gtt.wrap(model, (x, y), loss_fn=F.cross_entropy)
    with pytest.raises(WrapError, match="takes 2 inputs"):
        gm(x)
    bad = y.clone()
    bad[3] = 9
    with pytest.raises(WrapError, match=r"input 'target': example 3 of the batch: node \d+ "
                                        r"\(take_along\): .* id 9 .* outside \[0, 4\)"):
        gm(x, bad)
    with pytest.raises(GradtoolError, match="loss_fn="):
        gtt.wrap(model, (x,))           # logits are not a loss


# ── training-mode state ────────────────────────────────────────────────────

def test_batchnorm_running_stats_flow_back_into_the_buffers():
    torch.manual_seed(13)
    model = Net(bn=True).double()
    ref = copy.deepcopy(model)
    gm = gtt.wrap(model, batch(seed=11), loss_fn=F.cross_entropy)
    for seed in (11, 12, 13):
        x, y = batch(seed=seed)
        loss = gm(x, y)
        want = F.cross_entropy(ref(x.double()), y)          # torch updates ref's stats
        assert abs(loss.item() - want.item()) <= 1e-12 * abs(want.item())
    assert int(model.bn.num_batches_tracked) == 3 == int(ref.bn.num_batches_tracked)
    for k in ("running_mean", "running_var"):
        got, want = getattr(model.bn, k), getattr(ref.bn, k)
        assert float((got - want).abs().max()) <= 1e-13 * float(want.abs().max()), k
    # eval mode: the running statistics are read (a graph of its own)
    gm.eval()
    ref.eval()
    x, y = batch(seed=14)
    with torch.no_grad():
        got = gm(x, y).item()
        want = F.cross_entropy(ref(x.double()), y).item()
    assert abs(got - want) <= 1e-12 * abs(want)


def test_train_and_eval_switch_dropout_and_the_step_seeds_the_draws():
    torch.manual_seed(14)
    model = Net(p=0.5).double()
    x, y = batch(seed=15)
    gm = gtt.wrap(model, (x, y), loss_fn=F.cross_entropy)
    a, b = gm(x, y).item(), gm(x, y).item()           # steps 0 and 1: other masks
    assert a != b and gm.step == 2
    gm.eval()
    e1, e2 = gm(x, y).item(), gm(x, y).item()
    model_eval = copy.deepcopy(model).eval()
    want = F.cross_entropy(model_eval(x.double()), y).item()
    assert e1 == e2 and abs(e1 - want) <= 1e-12 * abs(want)
    assert gm.step == 2                                # eval calls do not count
    gm.train()
    gm.step = 0
    assert gm(x, y).item() == a                        # step 0's mask again


def test_state_dict_round_trips_the_step_counter():
    torch.manual_seed(15)
    model = Net(p=0.3).double()
    x, y = batch(seed=16)
    gm = gtt.wrap(model, (x, y), loss_fn=F.cross_entropy)
    for _ in range(3):
        gm(x, y)
    state = copy.deepcopy(gm.state_dict())
    assert state["_extra_state"] == {"gradtool.step": 3}
    nxt = gm(x, y).item()
    other = gtt.wrap(Net(p=0.3).double(), (x, y), loss_fn=F.cross_entropy)
    other.load_state_dict(state)
    assert other.step == 3
    assert other(x, y).item() == nxt
    with pytest.raises(WrapError, match="gradtool.step"):
        other.load_state_dict({**state, "_extra_state": {"gradtool.step": -1}})


# ── dtype ──────────────────────────────────────────────────────────────────

def test_a_float32_module_computes_in_float32(tmp_path):
    """A float32 module (as torch.nn builds it) runs as an f32 tape: its loss, outputs and
    gradients are float32, equal to `gradtool backward` of the import at f32 bit for bit,
    and within issue 40's float32 bound of torch float64 autograd."""
    torch.manual_seed(16)
    model = Net()                                      # float32
    x, y = batch(seed=17)
    gm = gtt.wrap(model, (x, y), loss_fn=F.cross_entropy, outputs=True)
    loss, logits = gm(x, y)
    assert loss.dtype == torch.float32 and logits.dtype == torch.float32
    loss.backward()
    ours = grads_of(model)

    result = gtt.import_module(model, (x,), F.cross_entropy, (y,), dtype="f32")
    path = tmp_path / "net32.msgpack"
    result.save(path)
    out = run("backward", path, "--hex", "--json")
    assert out.exit_code == 0, out.stderr
    report = json.loads(out.stdout)
    assert np.float32(float.fromhex(report["loss"])) == loss.item()
    for p in report["params"]:
        want = np.array([float.fromhex(v) for v in p["grad"]],
                        dtype=np.float32).reshape(p["shape"])
        g = ours[p["name"]]
        assert g.dtype == torch.float32
        assert_bits_equal(g.numpy().reshape(want.shape), want, p["name"])

    m64 = copy.deepcopy(model).double()
    _, torch_want = torch_grads(m64, x, y)
    for k, g in ours.items():                          # issue 40's float32 bound
        assert float((g.double() - torch_want[k]).norm() / torch_want[k].norm()) <= 1e-5


# ── clipping ───────────────────────────────────────────────────────────────

def test_clip_grad_norm_is_the_train_clip_bit_for_bit():
    torch.manual_seed(17)
    params = [nn.Parameter(torch.randn(5, 3, dtype=torch.float64)),
              nn.Parameter(torch.randn(4, dtype=torch.float64)),
              nn.Parameter(torch.randn(2, dtype=torch.float64))]     # no .grad: skipped
    for p in params[:2]:
        p.grad = torch.randn(p.shape, dtype=torch.float64) * 3.0
    raw = [p.grad.clone() for p in params[:2]]
    sumsq = 0.0                                        # the documented serial order
    for g in raw:
        for v in g.reshape(-1).tolist():
            sumsq = sumsq + v * v
    norm = math.sqrt(sumsq)
    got = gtt.clip_grad_norm_(params, 1.0)
    assert got.item() == norm and got.dtype == torch.float64
    assert params[2].grad is None
    for p, g in zip(params, raw):
        assert_bits_equal(p.grad.numpy(), g.numpy() * (1.0 / norm), "clipped")
    # the same gradients through gradtool's optimizer clip: the same scaled update
    from gradtool.tape import Tape
    tp = Tape()
    leaves = [tp.param(g.numpy() * 0.0) for g in raw]
    for leaf, g in zip(leaves, raw):
        tp.grads[leaf.id] = g.numpy().copy()
    opt = SGD(1.0)
    for leaf in leaves:
        opt.add(tp, leaf)
    opt.set_clip(1.0)
    opt.step(tp)
    for leaf, p in zip(leaves, params):
        assert_bits_equal(tp.values[leaf.id], -p.grad.numpy(), "train's clip")
    # under the bound nothing changes; torch's own agrees on the norm to rounding
    before = [p.grad.clone() for p in params[:2]]
    again = gtt.clip_grad_norm_(params, 10.0)
    assert again.item() <= 1.0 + 1e-15
    for p, g in zip(params, before):
        assert_bits_equal(p.grad.numpy(), g.numpy(), "unclipped")
    theirs = torch.nn.utils.clip_grad_norm_(params[:2], 10.0)
    assert abs(theirs.item() - again.item()) <= 1e-15


# ── backends ───────────────────────────────────────────────────────────────

def _sgd_run(backend, steps=4):
    torch.manual_seed(18)
    model = Net(bn=True, p=0.2).double()
    x, y = batch(n=16, seed=19)
    gm = gtt.wrap(model, (x[:6], y[:6]), backend=backend, loss_fn=F.cross_entropy)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        for lo, hi in ((0, 6), (6, 12), (12, 16)):    # a last partial batch each epoch
            loss = gm(x[lo:hi], y[lo:hi])
            clipped_step(model, opt, loss, 0.5)
            losses.append(loss.item())
    return model, losses


def test_cpu_and_host_train_to_identical_bytes():
    require_c_compiler()
    cpu, cpu_losses = _sgd_run("cpu")
    host, host_losses = _sgd_run("host")
    assert cpu_losses == host_losses
    assert_same_state_bytes(cpu, host)


def _digits_run(backend):
    """The issue's loop on the repository's digits: a DataLoader shuffled by a seeded
    generator (a last partial batch each epoch), torch's cosine schedule, the clip, SGD
    with momentum; eval-mode accuracy at the end."""
    x, y = digits_tensors(600, np.float32)
    loader = seeded_loader(x, y)
    torch.manual_seed(20)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.1),
                          nn.Linear(32, 10)).double()
    gm = gtt.wrap(model, next(iter(loader)), backend=backend, loss_fn=F.cross_entropy,
                  outputs=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    losses = []
    for _ in range(2):
        gm.train()
        for xb, yb in loader:
            loss, _ = gm(xb, yb)
            clipped_step(model, opt, loss, 1.0)
            losses.append(loss.item())
        sched.step()
    gm.eval()
    with torch.no_grad():
        _, logits = gm(x, y)
    return model, losses, float((logits.argmax(1) == y).double().mean())


def test_a_dataloader_loop_on_digits_is_the_same_bytes_on_cpu_and_host():
    require_c_compiler()
    cpu, cpu_losses, cpu_acc = _digits_run("cpu")
    host, host_losses, host_acc = _digits_run("host")
    assert len(cpu_losses) == 10 and cpu_losses == host_losses
    assert cpu_losses[-1] < cpu_losses[0] and cpu_acc == host_acc and cpu_acc > 0.5
    assert_same_state_bytes(cpu, host)


def test_host_params_copied_in_one_call_and_a_reshaped_param_is_named():
    """The host backend's arena views take every param by one copy, and see a change made
    on the torch side; a param whose shape no longer matches the recorded graph is named
    (the per-param path's error), not copied."""
    require_c_compiler()
    torch.manual_seed(7)
    model = Net()                                        # float32: an f32 arena
    x, y = batch(seed=2)
    gm = gtt.wrap(model, (x, y), backend="host", loss_fn=F.cross_entropy)
    cpu = gtt.wrap(copy.deepcopy(model), (x, y), backend="cpu", loss_fn=F.cross_entropy)
    assert next(iter(gm.graphs.values())).views is not None
    assert gm(x, y).item() == cpu(x, y).item()
    with torch.no_grad():
        model.fc1.weight.mul_(0.5)
        cpu.model.fc1.weight.mul_(0.5)
    assert gm(x, y).item() == cpu(x, y).item()
    model.fc2.weight.data = model.fc2.weight.data.reshape(-1)[:20].reshape(2, 10).clone()
    with pytest.raises(WrapError, match=r"parameter 'fc2\.weight' has shape \[2, 10\]"):
        gm(x, y)


def test_host_params_live_in_the_arena_and_a_change_on_the_torch_side_is_seen():
    """On host the first graph's arena becomes the params' memory (no copy in a call); a
    param given other memory on the torch side is copied again, and a second graph (a
    partial batch) reads the params from there: every loss and gradient is the cpu
    backend's."""
    require_c_compiler()
    torch.manual_seed(8)
    model = Net()
    x, y = batch(seed=3)
    gm = gtt.wrap(model, (x, y), backend="host", loss_fn=F.cross_entropy)
    cpu_model = copy.deepcopy(model)
    cpu = gtt.wrap(cpu_model, (x, y), backend="cpu", loss_fn=F.cross_entropy)
    graph = next(iter(gm.graphs.values()))
    arena = graph.replay.dev.host_arena
    for p in model.parameters():
        assert np.shares_memory(p.detach().numpy(), arena)

    def same(xb, yb):
        for m in (model, cpu_model):
            m.zero_grad()
        a, b = gm(xb, yb), cpu(xb, yb)
        a.backward()
        b.backward()
        assert a.item() == b.item()
        for (k, p), q in zip(model.named_parameters(), cpu_model.parameters()):
            assert_bits_equal(p.grad.numpy(), q.grad.numpy(), k)

    same(x, y)
    with torch.no_grad():                        # in place: the arena itself changes
        for m in (model, cpu_model):
            m.fc1.weight.mul_(0.5)
    same(x, y)
    for m in (model, cpu_model):                 # other memory: copied into the arena
        m.fc2.weight.data = m.fc2.weight.data * 1.5
    same(x, y)
    same(x[:5], y[:5])                           # a second graph: a copy of the params
    assert len(gm.graphs) == 2
    # the wrapper gone, each param has memory of its own again, with the same values
    values = [p.detach().clone() for p in model.parameters()]
    gm = graph = same = None                      # (the closure holds the name, not it)
    import gc
    gc.collect()
    for p, v in zip(model.parameters(), values):
        assert not np.shares_memory(p.detach().numpy(), arena)
        assert_bits_equal(p.detach().numpy(), v.numpy(), "param after the wrapper")


@pytest.mark.parametrize("backend", ["cpu", "host"])
def test_a_deep_copy_or_a_pickle_is_a_wrapper_of_a_copy_of_the_module(backend):
    """copy.deepcopy(gm) wraps a deep copy of the module the same way (an EMA or a
    checkpoint copy): the same losses and gradients at the same step, then each trains
    on its own parameters."""
    if backend == "host":
        require_c_compiler()
    torch.manual_seed(10)
    model = Net(p=0.2)
    x, y = batch(seed=7)
    gm = gtt.wrap(model, (x, y), backend=backend, loss_fn=F.cross_entropy)
    gm(x, y).backward()
    twin = copy.deepcopy(gm)
    assert twin.model is not model and twin.step == gm.step and twin.training
    for p, q in zip(model.parameters(), twin.model.parameters()):
        assert p.data_ptr() != q.data_ptr()
        assert_bits_equal(p.detach().numpy(), q.detach().numpy(), "copied param")
        p.grad = q.grad = None
    a, b = gm(x, y), twin(x, y)
    a.backward()
    b.backward()
    assert a.item() == b.item()
    for p, q in zip(model.parameters(), twin.model.parameters()):
        assert_bits_equal(p.grad.numpy(), q.grad.numpy(), "copied gradient")
    with torch.no_grad():
        model.fc1.weight.mul_(0.5)                   # the copy's parameters are its own
    assert gm(x, y).item() != twin(x, y).item()
    gm.eval()
    back = pickle.loads(pickle.dumps(gm))            # torch.save(gm): wrapped again
    assert not back.training and back.step == gm.step and back.backend == backend
    assert back(x, y).item() == gm(x, y).item()


def test_the_module_is_walked_again_when_its_members_change():
    """The wrapper keeps the module's parameter and buffer dicts while nothing is
    registered or deleted; a param assigned anew, a submodule replaced, or a param
    removed is seen at the next call (the loss is torch's)."""
    torch.manual_seed(9)
    model = Net().double()
    x, y = batch(seed=6)
    gm = gtt.wrap(model, (x, y), loss_fn=F.cross_entropy)

    def check():
        assert abs(gm(x, y).item() - F.cross_entropy(model(x.double()), y).item()) <= 1e-12

    check()
    model.fc2.weight = nn.Parameter(torch.randn(4, 12, dtype=torch.float64))
    check()
    model.fc1 = nn.Linear(6, 12).double()
    check()
    del model.fc2.bias                           # gone (not set to None): torch's forward
    model.fc2.bias = None                        # then reads None, as the new graph does
    check()
    assert len(gm.graphs) == 2


def test_the_host_arena_takes_float32_and_float64_writes_to_the_same_bits():
    """HostBackend.write copies data of the arena's dtype as it is and converts float64
    with k_from_f64: the same float32 bits either way (subnormals, -0.0, the extremes)."""
    require_c_compiler()
    import gradtool as gt
    from gradtool.device.engine import capture
    tp = gt.Tape()
    a = tp.param(np.zeros(64, dtype=np.float32))
    loss = tp.sum(a * a)
    vals = np.concatenate([np.array([0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 3.4028235e38,
                                     -3.4028235e38, 1.0, -2.5], np.float32),
                           np.random.default_rng(0).standard_normal(55).astype(np.float32)])
    r = capture(tp, loss.id, "host", dtype="f32")
    off = r.program.val_off[a.id]
    r.dev.write(off, vals)
    first = r.dev.host_arena[off:off + 64].copy()
    r.dev.write(off, np.zeros(64, np.float32))
    r.dev.write(off, vals.astype(np.float64))
    assert_bits_equal(r.dev.host_arena[off:off + 64], first, "f64 write")
    assert_bits_equal(first, vals, "f32 write")
