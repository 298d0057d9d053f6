"""``gtt.optim``: torch.optim subclasses that step by gradtool's optimizer table.

Each step is the table's update to the bit (against ``gradtool.optim`` on a Tape, and
against ``gradtool train`` of the imported tape through a whole run); torch's own
float64 optimizers agree within 1e-12; torch's schedulers and param groups drive them;
saved states round trip and bad ones are refused.  Real torch, the real importer, the
real CLI.  Skipped cleanly without torch.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import gradtool as gt                                            # noqa: E402
import gradtool.interop.torch as gtt                             # noqa: E402
from gradtool.errors import OptimizerError                       # noqa: E402
from gradtool.interop.torch import import_module                 # noqa: E402
from gradtool.optim import make_optimizer                        # noqa: E402
from conftest import assert_bits_equal, require_c_compiler       # noqa: E402
from support import run                                          # noqa: E402
from torch_cases import (assert_same_state_bytes, clipped_step, digits_tensors,  # noqa: E402
                         seeded_loader)

# (gtt class, table name, torch class, torch-keyword options, table hyperparameters)
CASES = [
    ("SGD", "sgd", {}, {}),
    ("SGD", "sgd", {"momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
     {"momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}),
    ("SGD", "sgd", {"momentum": 0.9, "nesterov": True, "maximize": True},
     {"momentum": 0.9, "nesterov": True, "maximize": True}),
    ("Adam", "adam", {}, {}),
    ("Adam", "adam", {"betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1, "amsgrad": True},
     {"beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.1, "amsgrad": True}),
    ("AdamW", "adamw", {"weight_decay": 0.1, "maximize": True},
     {"weight_decay": 0.1, "maximize": True}),
    ("AdamW", "adamw", {"amsgrad": True}, {"amsgrad": True}),
]
IDS = [f"{c[0]}-{'-'.join(c[2]) or 'defaults'}" for c in CASES]


def _grads(steps, shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(s) for s in shapes] for _ in range(steps)]


@pytest.mark.parametrize("cls, kind, kw, hp", CASES, ids=IDS)
def test_each_step_is_the_tables_update_on_a_tape(cls, kind, kw, hp):
    """The same gradients into a torch param and into a Tape param (whose optimizer is
    gradtool.optim's, compiled or numpy): the same bits after every step."""
    shapes = [(5, 3), (3,)]
    rng = np.random.default_rng(1)
    init = [rng.standard_normal(s) for s in shapes]
    grads = _grads(12, shapes)

    params = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in init]
    opt = getattr(gtt.optim, cls)(params, lr=0.05, **kw)

    tp = gt.Tape()
    leaves = [tp.param(w, name=f"p{i}") for i, w in enumerate(init)]
    ref = make_optimizer(kind, 0.05, hp)
    for v in leaves:
        ref.add(tp, v)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = torch.from_numpy(g.copy())
        opt.step()
        for v, g in zip(leaves, step):
            tp.grads[v.id] = np.array(g)
        ref.step(tp)
        for i, (p, v) in enumerate(zip(params, leaves)):
            assert_bits_equal(p.detach().numpy(), tp.values[v.id], f"param {i}")


TORCH_KW = {"SGD": {}, "Adam": {"foreach": False}, "AdamW": {"foreach": False}}


@pytest.mark.parametrize("cls, kind, kw, hp", CASES, ids=IDS)
def test_torch_float64_agrees_within_1e12(cls, kind, kw, hp):
    """torch.optim's own class (foreach=False) on a small regression, 100 steps: the
    parameters within 1e-12 relative (torch's vector kernels contract some updates into
    FMAs, so bits are not expected; docs/training.md says where the orders differ)."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    twin = copy.deepcopy(model)
    x, y = torch.randn(32, 4, dtype=torch.float64), torch.randn(32, 1, dtype=torch.float64)
    ours = getattr(gtt.optim, cls)(model.parameters(), lr=0.01, **kw)
    theirs = getattr(torch.optim, cls)(twin.parameters(), lr=0.01, foreach=False, **kw)
    for _ in range(100):
        for m, o in ((model, ours), (twin, theirs)):
            o.zero_grad()
            F.mse_loss(m(x), y).backward()
            o.step()
    for (k, a), b in zip(model.state_dict().items(), twin.state_dict().values()):
        rel = (a - b).norm() / b.norm()
        assert rel <= 1e-12, (k, float(rel))


def test_param_groups_and_a_scheduler_drive_it():
    """Biases in a group without decay, torch's StepLR writing group['lr']: each group's
    params follow the table's update with that group's values."""
    torch.manual_seed(4)
    lin = nn.Linear(3, 2).double()
    opt = gtt.optim.AdamW([{"params": [lin.weight]},
                           {"params": [lin.bias], "weight_decay": 0.0}],
                          lr=0.1, weight_decay=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    w0, b0 = lin.weight.detach().numpy().copy(), lin.bias.detach().numpy().copy()
    grads = _grads(5, [(2, 3), (2,)], seed=5)
    tape_runs = {}
    for name, init, wd in (("w", w0, 0.5), ("b", b0, 0.0)):
        tp = gt.Tape()
        v = tp.param(init)
        tape_runs[name] = (tp, v, make_optimizer("adamw", 0.1, {"weight_decay": wd}))
        tape_runs[name][2].add(tp, v)
    for t, (gw, gb) in enumerate(grads):
        lin.weight.grad, lin.bias.grad = torch.from_numpy(gw), torch.from_numpy(gb)
        lr = opt.param_groups[0]["lr"]
        assert lr == 0.1 * 0.5 ** (t // 2)
        opt.step()
        sched.step()
        for name, g in (("w", gw), ("b", gb)):
            tp, v, ref = tape_runs[name]
            ref.lr = lr                          # the scheduler's value for this step
            tp.grads[v.id] = np.array(g)
            ref.step(tp)
        assert_bits_equal(lin.weight.detach().numpy(), tape_runs["w"][0].values[0], "weight")
        assert_bits_equal(lin.bias.detach().numpy(), tape_runs["b"][0].values[0], "bias")


def test_a_state_dict_resumes_to_the_same_bits():
    shapes = [(4, 4)]
    grads = _grads(8, shapes, seed=6)
    start = np.random.default_rng(7).standard_normal((4, 4))

    def fresh():
        p = torch.nn.Parameter(torch.from_numpy(start.copy()))
        return p, gtt.optim.Adam([p], lr=0.03, amsgrad=True)

    p, opt = fresh()
    for (g,) in grads:
        p.grad = torch.from_numpy(g.copy())
        opt.step()
    q, first = fresh()
    for (g,) in grads[:3]:
        q.grad = torch.from_numpy(g.copy())
        first.step()
    saved = copy.deepcopy(first.state_dict())
    r = torch.nn.Parameter(q.detach().clone())
    second = gtt.optim.Adam([r], lr=0.03, amsgrad=True)
    second.load_state_dict(saved)
    for (g,) in grads[3:]:
        r.grad = torch.from_numpy(g.copy())
        second.step()
    assert_bits_equal(r.detach().numpy(), p.detach().numpy(), "resumed")


def _stepped_adam():
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    opt = gtt.optim.Adam([p], lr=0.1)
    p.grad = torch.full((3,), 0.5, dtype=torch.float64)
    opt.step()
    return p, opt


@pytest.mark.parametrize("edit, words", [
    (lambda s: s["state"][0].update(extra=torch.zeros(3)), "unknown keys ['extra']"),
    (lambda s: s["state"][0].pop("v"), "missing keys ['v']"),
    (lambda s: s["state"][0].update(m=torch.zeros(4, dtype=torch.float64)), "shape"),
    (lambda s: s["state"][0].update(m=torch.full((3,), float("nan"), dtype=torch.float64)),
     "non-finite"),
    (lambda s: s["state"][0].update(v=torch.full((3,), -1.0, dtype=torch.float64)),
     "negative"),
    (lambda s: s["state"][0].update(step=-2), "not a count"),
    (lambda s: s["param_groups"].append(dict(s["param_groups"][0])), "param groups"),
], ids=["unknown", "missing", "shape", "nan", "negative-v", "step", "groups"])
def test_a_bad_state_is_refused_and_nothing_changes(edit, words):
    p, opt = _stepped_adam()
    before = copy.deepcopy(opt.state_dict())
    bad = copy.deepcopy(before)
    edit(bad)
    with pytest.raises(OptimizerError, match=words.replace("[", r"\[").replace("]", r"\]")):
        opt.load_state_dict(bad)
    after = opt.state_dict()
    assert after["state"][0].keys() == before["state"][0].keys()
    for k, v in before["state"][0].items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(after["state"][0][k], v)


def test_misuse_is_a_gradtool_error():
    p = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    with pytest.raises(OptimizerError, match="foreach"):
        gtt.optim.Adam([p], lr=0.1, foreach=True)
    with pytest.raises(OptimizerError, match="no option 'momentom'"):
        gtt.optim.SGD([p], lr=0.1, momentom=0.9)
    with pytest.raises(OptimizerError, match="beta1"):
        gtt.optim.Adam([p], lr=0.1, betas=(1.5, 0.9))
    with pytest.raises(OptimizerError, match="betas must be a pair"):
        gtt.optim.Adam([p], lr=0.1, betas=0.9)
    h = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    opt = gtt.optim.SGD([h], lr=0.1)
    h.grad = torch.ones(2, dtype=torch.float16)
    with pytest.raises(OptimizerError, match="float64 or float32"):
        opt.step()


def test_step_hooks_the_profiler_and_zero_grad_are_torchs():
    """step runs torch's step hooks (per optimizer and global) and is recorded by a running
    profiler under torch's name, with or without torch's wrapper around it; zero_grad
    sets every .grad to None, or zeroes it in place with set_to_none=False."""
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    opt = gtt.optim.AdamW([p], lr=0.1)
    plain = gtt.optim.AdamW([torch.nn.Parameter(torch.ones(3, dtype=torch.float64))], lr=0.1)
    seen = []
    handles = [opt.register_step_pre_hook(lambda o, a, k: seen.append(("pre", o))),
               opt.register_step_post_hook(lambda o, a, k: seen.append(("post", o))),
               register_optimizer_step_pre_hook(lambda o, a, k: seen.append(("global", o))),
               register_optimizer_step_post_hook(lambda o, a, k: seen.append(("end", o)))]
    try:
        for o in (opt, plain):
            o.param_groups[0]["params"][0].grad = torch.full((3,), 0.5, dtype=torch.float64)
            o.step()
        assert seen == [("global", opt), ("pre", opt), ("post", opt), ("end", opt),
                        ("global", plain), ("end", plain)]
    finally:
        for h in handles:
            h.remove()
    seen.clear()
    plain.step()                                 # no hook left: the update alone
    assert seen == [] and plain.state[plain.param_groups[0]["params"][0]]["step"] == 2
    with torch.profiler.profile() as prof:
        plain.step()
        plain.zero_grad()
    names = {e.name for e in prof.events()}
    assert "Optimizer.step#AdamW.step" in names and "Optimizer.zero_grad#AdamW.zero_grad" in names
    p.grad = torch.full((3,), 0.5, dtype=torch.float64)
    opt.zero_grad(set_to_none=False)
    assert p.grad is not None and not p.grad.any()
    opt.zero_grad()
    assert p.grad is None


# ── a whole run: the wrapper and gtt.optim against gradtool train ────────────

def _model():
    torch.manual_seed(21)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)).double()


def test_wrap_and_gtt_optim_train_to_the_bytes_of_gradtool_train(tmp_path):
    """AdamW with weight decay, the clip, 2 epochs of 4 batches in order: gm's loop with
    gtt.optim and gtt.clip_grad_norm_ ends on the same parameter bytes as `gradtool
    train` of the imported tape with the same options (the CLI's shuffle off)."""
    x, y = digits_tensors(256, np.float64)
    model = _model()
    result = import_module(copy.deepcopy(model), (x[:64],), loss_fn=F.cross_entropy,
                           loss_inputs=(y[:64],))
    result.save(tmp_path / "m.msgpack")
    np.savez(tmp_path / "d.npz", input=x.numpy(), target=y.numpy())
    run("train", str(tmp_path / "m.msgpack"), "--data", str(tmp_path / "d.npz"),
        "--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.05", "--clip", "0.5",
        "--epochs", "2", "--no-shuffle", "--save", str(tmp_path / "t.msgpack"))
    trained = gt.load(tmp_path / "t.msgpack").tape

    gm = gtt.wrap(model, (x[:64], y[:64]), loss_fn=F.cross_entropy)
    opt = gtt.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
    for _ in range(2):
        for lo in range(0, 256, 64):
            clipped_step(model, opt, gm(x[lo:lo + 64], y[lo:lo + 64]), 0.5)
    names = gt.load(tmp_path / "t.msgpack").meta["torch"]["params"]
    for k, p in model.named_parameters():
        assert_bits_equal(p.detach().numpy(), trained.values[names[k]], k)


def _cosine_run(backend):
    """The issue's loop: a DataLoader shuffled by a seeded generator (a last partial batch
    each epoch), torch's cosine scheduler, the clip, gtt.optim.AdamW; 3 epochs."""
    x, y = digits_tensors(600, np.float64)
    loader = seeded_loader(x, y)
    model = _model()
    gm = gtt.wrap(model, next(iter(loader)), backend=backend, loss_fn=F.cross_entropy)
    opt = gtt.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=15)
    losses = []
    for _ in range(3):
        for xb, yb in loader:
            loss = gm(xb, yb)
            clipped_step(model, opt, loss, 1.0)
            sched.step()
            losses.append(loss.item())
    return model, losses


def test_the_issues_loop_is_the_same_bytes_on_cpu_and_host():
    require_c_compiler()
    cpu, cpu_losses = _cosine_run("cpu")
    host, host_losses = _cosine_run("host")
    assert len(cpu_losses) == 15 and cpu_losses == host_losses
    assert cpu_losses[-1] < cpu_losses[0]
    assert_same_state_bytes(cpu, host)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("cls, kw", [("AdamW", {"weight_decay": 0.1}),
                                     ("SGD", {"momentum": 0.9})], ids=["AdamW", "SGD"])
def test_a_group_in_one_call_is_the_params_one_by_one(cls, kw, dtype, monkeypatch):
    """A group whose params all have gradients at one step count steps in one compiled
    call (gt_opt_table_steps_py); a param without a gradient at some steps (its own step
    count then) sends the group one by one.  Both are the table's update per param at
    its own t (Entry.step, the numpy-level API), to the bit, at every step."""
    shapes = [(6, 5), (5,), (3, 2, 2)]
    rng = np.random.default_rng(4)
    init = [rng.standard_normal(s).astype(np.float32 if dtype == torch.float32
                                          else np.float64) for s in shapes]
    grads = [[g.astype(init[0].dtype) for g in step] for step in _grads(9, shapes, seed=5)]
    skip = {(3, 1), (4, 1), (6, 2)}                  # (step, param) without a gradient
    params = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in init]
    opt = getattr(gtt.optim, cls)(params, lr=0.05, **kw)
    entry = opt.entry
    hp = opt._rule(opt.param_groups[0])[0]
    ref_w = [w.copy() for w in init]
    ref_state = [entry.init_state(w, hp) for w in init]
    ref_t = [0, 0, 0]
    calls = []
    real = type(opt)._step_all
    monkeypatch.setattr(type(opt), "_step_all",
                        lambda self, *a: calls.append(real(self, *a)) or calls[-1])
    for k, step in enumerate(grads):
        for i, (p, g) in enumerate(zip(params, step)):
            p.grad = None if (k, i) in skip else torch.from_numpy(g.copy())
        opt.step()
        for i, g in enumerate(step):
            if (k, i) in skip:
                continue
            ref_t[i] += 1
            entry.step(ref_w[i], g, ref_state[i], hp, ref_t[i], 0.05)
        for i, p in enumerate(params):
            assert_bits_equal(p.detach().numpy(), ref_w[i], f"step {k} param {i}")
            assert opt.state[p]["step"] == ref_t[i]
    require_c_compiler()
    # steps 0-4: the params with a gradient all at one count (one call); from step 5
    # param 1 is two steps behind the others
    assert calls[:5] == [True] * 5 and not any(calls[5:])


def test_a_param_the_group_call_cannot_take_is_named():
    p = torch.nn.Parameter(torch.zeros(4, 3, dtype=torch.float64))
    opt = gtt.optim.Adam([p], lr=0.1)
    p.grad = torch.ones(3, 4, dtype=torch.float64).t()      # not contiguous
    with pytest.raises(OptimizerError, match="param 0 of group 0's .grad is not"):
        opt.step()
    assert not opt.state[p] or opt.state[p]["step"] == 0
    assert bool((p.detach() == 0).all())


def test_a_param_given_new_memory_is_stepped_there():
    """The group step keeps numpy views of the params between steps; ``p.data = ...``
    (new memory) and ``load_state_dict`` (new slot tensors) are seen: the steps go on
    to the bits of an optimizer that never kept a view."""
    rng = np.random.default_rng(8)
    w0 = rng.standard_normal((4, 3))
    grads = [rng.standard_normal((4, 3)) for _ in range(6)]
    a, b = (torch.nn.Parameter(torch.from_numpy(w0.copy())) for _ in range(2))
    oa, ob = gtt.optim.AdamW([a], lr=0.1), gtt.optim.AdamW([b], lr=0.1)
    for k, g in enumerate(grads):
        if k == 2:
            a.data = a.data.clone()                 # new memory, same values
        if k == 4:
            oa.load_state_dict(copy.deepcopy(oa.state_dict()))
        for p in (a, b):
            p.grad = torch.from_numpy(g.copy())
        oa.step()
        ob.__dict__.pop("_plans", None)            # b: no view kept from step to step
        ob.step()
        assert_bits_equal(a.detach().numpy(), b.detach().numpy(), f"step {k}")
