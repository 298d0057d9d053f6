"""The optimizer table against torch.optim (float64, foreach=False), its renderings
against each other, the lr schedules against torch.optim.lr_scheduler, and old files'
meaning (a state without a version that says adam is adam-seed)."""

import itertools

import numpy as np
import pytest

import gradtool as gt
from conftest import require_c_compiler
from gradtool import numerics, optim
from gradtool.optim import OptimizerError, Schedule, make_optimizer, optimizer_from_state, table

torch = pytest.importorskip("torch")

STEPS = 200


def combos(name):
    """Every option combination of an entry (the structural switches, with nonzero
    values where a switch needs one)."""
    if name == "sgd":
        for momentum, nesterov, wd, maximize, damp in itertools.product(
                (0.0, 0.9), (False, True), (0.0, 0.1), (False, True), (0.0, 0.3)):
            if nesterov and (momentum == 0.0 or damp != 0.0):
                continue
            yield dict(momentum=momentum, nesterov=nesterov, weight_decay=wd,
                       maximize=maximize, dampening=damp)
    elif name in ("adam", "adamw"):
        for amsgrad, wd, maximize, b1 in itertools.product((False, True), (0.0, 0.05),
                                                          (False, True), (0.9, 0.3)):
            yield dict(amsgrad=amsgrad, weight_decay=wd, maximize=maximize, beta1=b1,
                       beta2=0.99)


CASES = [(n, hp) for n in ("sgd", "adam", "adamw") for hp in combos(n)]


def torch_optimizer(name, params, lr, hp):
    hp = dict(hp)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, foreach=False, **hp)
    betas = (hp.pop("beta1"), hp.pop("beta2"))
    cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    return cls(params, lr=lr, betas=betas, foreach=False, **hp)


def model(rng):
    """A small random two-layer model: tanh(x @ W1 + b1) @ W2, squared error."""
    x = rng.standard_normal((8, 5))
    y = rng.standard_normal((8, 2))
    w1, b1, w2 = rng.standard_normal((5, 6)) * 0.5, rng.standard_normal(6) * 0.1, \
        rng.standard_normal((6, 2)) * 0.5
    return x, y, [w1, b1, w2]


def model_tape(x, y, ws, l2=None):
    """:func:`model`'s network on a new Tape, ``ws`` copied in (each with ``l2`` if
    given): the tape, its params and the mean squared error."""
    tp = gt.Tape()
    ps = [tp.param(w.copy()) if l2 is None else tp.param(w.copy(), l2=l2) for w in ws]
    h = tp.tanh(tp.matmul(tp.const(x), ps[0]) + ps[1])
    d = tp.matmul(h, ps[2]) - tp.const(y)
    return tp, ps, tp.mean(d * d)


def train_steps(tp, loss, opt, steps):
    """``steps`` steps of ``opt`` on ``loss``: forward, zero_grad, backward, step."""
    for _ in range(steps):
        tp.forward()
        tp.zero_grad()
        tp.backward(loss)
        opt.step(tp)


def gt_run(name, hp, lr, x, y, ws, sign, compiled=True, schedule=None, steps=STEPS):
    optim._COMPILED[0] = compiled
    try:
        tp, ps, loss = model_tape(x, y, ws)
        loss = loss * sign
        opt = make_optimizer(name, lr, hp, schedule)
        for p in ps:
            opt.add(tp, p)
        train_steps(tp, loss, opt, steps)
        return [tp.value(p).copy() for p in ps], opt
    finally:
        optim._COMPILED[0] = True


def torch_run(name, hp, lr, x, y, ws, sign, scheduler=None, steps=STEPS):
    ps = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in ws]
    xt, yt = torch.tensor(x), torch.tensor(y)
    opt = torch_optimizer(name, ps, lr, hp)
    sched = scheduler(opt) if scheduler else None
    for _ in range(steps):
        opt.zero_grad()
        d = torch.tanh(xt @ ps[0] + ps[1]) @ ps[2] - yt
        loss = (d * d).mean() * sign
        loss.backward()
        opt.step()
        if sched:
            sched.step()
    return [p.detach().numpy() for p in ps]


def assert_close(got, want, rel=1e-12):
    for a, b in zip(got, want, strict=True):
        err = np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)
        assert err <= rel, err


@pytest.mark.parametrize("name,hp", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_against_torch_200_steps(name, hp, rng):
    """Descending the loss (with maximize, ascending its negation) 200 steps: within
    1e-12 relative of torch.optim float64, foreach=False."""
    x, y, ws = model(rng)
    sign = -1.0 if hp["maximize"] else 1.0
    got, _ = gt_run(name, hp, 0.01, x, y, ws, sign)
    want = torch_run(name, hp, 0.01, x, y, ws, sign)
    assert_close(got, want)
    # and it moved: the trajectory is not the starting point
    assert max(np.abs(g - w).max() for g, w in zip(got, ws)) > 1e-3


@pytest.mark.parametrize("name", table.NAMES)
def test_every_variant_compiled_equals_numpy_bits(name, rng):
    """Every switch combination of every entry: the compiled step (gt_optim_table.h)
    and the numpy rendering give the same bits, with clip and L2 on."""
    require_c_compiler()
    assert numerics.cpu_kernels() is not None
    entry = table.get(name)
    x, y, ws = model(rng)
    for hp in (list(combos(name)) if name != "adam-seed" else [{}]):
        finals = []
        for compiled in (True, False):
            optim._COMPILED[0] = compiled
            try:
                tp, ps, loss = model_tape(x, y, ws, l2=0.01)
                opt = make_optimizer(name, 0.05, hp)
                opt.set_clip(0.5)
                for p in ps:
                    opt.add(tp, p)
                train_steps(tp, loss, opt, 7)
                finals.append([tp.value(p).tobytes() for p in ps]
                              + [e.state[s].tobytes() for e in opt.entries for s in opt.slots])
            finally:
                optim._COMPILED[0] = True
        assert finals[0] == finals[1], (name, hp)
        assert entry.variant_index(entry.hparams(hp)) < len(entry.variants())


@pytest.mark.parametrize("name", table.NAMES)
def test_numpy_level_api_equals_the_training_loop(name, rng):
    """entry.step(w, g, state, hp, t, lr), per parameter, gives the loop's bits."""
    hp = {} if name == "adam-seed" else dict(list(combos(name))[-1])
    entry = table.get(name)
    x, y, ws = model(rng)
    want, _ = gt_run(name, hp, 0.01, x, y, ws, 1.0, steps=5)
    # replay the loop's gradients through the per-parameter API
    tp, ps, loss = model_tape(x, y, ws)
    states = [entry.init_state(w, hp) for w in ws]
    for t in range(1, 6):
        tp.forward()
        tp.zero_grad()
        tp.backward(loss)
        for p, st in zip(ps, states):
            entry.step(tp.values[p.id], tp.grads[p.id].copy(), st, hp, t, 0.01)
    for p, w in zip(ps, want):
        assert tp.value(p).tobytes() == w.tobytes()


SCHEDULES = {
    "cosine": (dict(kind="cosine", t_max=50, eta_min=0.001),
               lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=50, eta_min=0.001)),
    "step": (dict(kind="step", step_size=7, gamma=0.5),
             lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5)),
    "exponential": (dict(kind="exponential", gamma=0.97),
                    lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.97)),
    "warmup": (dict(kind="none", warmup=10),
               lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda k: min(k / 10, 1.0))),
    "warmup+cosine": (dict(kind="cosine", warmup=5, t_max=40),
                      lambda o: torch.optim.lr_scheduler.SequentialLR(o, [
                          torch.optim.lr_scheduler.LambdaLR(o, lambda k: k / 5),
                          torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=40)],
                          milestones=[5])),
}


@pytest.mark.parametrize("case", sorted(SCHEDULES))
def test_schedule_values_match_torch(case):
    mine, make = SCHEDULES[case]
    s = Schedule(**mine)
    p = torch.zeros(1, requires_grad=True)
    o = torch.optim.SGD([p], lr=0.1)
    sch = make(o)
    for k in range(120):
        want = o.param_groups[0]["lr"]
        got = s.lr(0.1, k)
        assert abs(got - want) <= 1e-12 * max(abs(want), 1e-300) or got == want, (k, got, want)
        o.step()
        sch.step()


def test_a_schedule_trains_as_torch(rng):
    x, y, ws = model(rng)
    mine, make = SCHEDULES["warmup+cosine"]
    hp = dict(amsgrad=False, weight_decay=0.05, maximize=False, beta1=0.9, beta2=0.99)
    got, _ = gt_run("adamw", hp, 0.01, x, y, ws, 1.0, schedule=Schedule(**mine), steps=60)
    want = torch_run("adamw", hp, 0.01, x, y, ws, 1.0, scheduler=make, steps=60)
    assert_close(got, want)


def test_a_resumed_schedule_continues_to_the_bit(rng):
    """30 steps, save, rebuild from the state, 30 more == 60 steps straight."""
    x, y, ws = model(rng)
    sched = dict(kind="step", warmup=4, step_size=5, gamma=0.8)
    hp = dict(momentum=0.9, nesterov=True)
    straight, _ = gt_run("sgd", hp, 0.05, x, y, ws, 1.0, schedule=Schedule(**sched), steps=60)
    half, opt = gt_run("sgd", hp, 0.05, x, y, ws, 1.0, schedule=Schedule(**sched), steps=30)
    state = opt.state_dict()
    tp, ps, loss = model_tape(x, y, half)
    again = optimizer_from_state(tp, state)
    assert again.schedule.to_dict() == Schedule(**sched).to_dict() and again.t == 30
    train_steps(tp, loss, again, 30)
    for p, w in zip(ps, straight):
        assert tp.value(p).tobytes() == w.tobytes()


def test_a_state_without_version_that_says_adam_is_adam_seed(rng):
    """A file written before the table: its 'adam' continues as the seed's Adam, to the bit;
    the same map marked version 2 is torch's Adam and refuses the seed's constants."""
    x, y, ws = model(rng)
    straight, _ = gt_run("adam-seed", {}, 0.01, x, y, ws, 1.0, steps=6)
    half, opt = gt_run("adam-seed", {}, 0.01, x, y, ws, 1.0, steps=3)
    old = opt.state_dict()
    old = {k: v for k, v in old.items() if k not in ("version", "hparams", "schedule")}
    old["kind"] = "adam"                     # as the seed wrote it
    tp, ps, loss = model_tape(x, y, half)
    again = optimizer_from_state(tp, old)
    assert again.kind == "adam-seed" and isinstance(again, optim.AdamSeed)
    train_steps(tp, loss, again, 3)
    for p, w in zip(ps, straight):
        assert tp.value(p).tobytes() == w.tobytes()
    with pytest.raises(OptimizerError, match="adam constant"):
        optimizer_from_state(tp, dict(old, version=2))


@pytest.mark.parametrize("name,bad,needle", [
    ("sgd", {"momentum": -1.0}, "momentum must be in"),
    ("sgd", {"nesterov": True}, "nesterov needs momentum"),
    ("adam", {"beta1": 1.0}, "beta1 must be in [0.0, 1.0)"),
    ("adamw", {"eps": float("nan")}, "eps must be in"),
    ("adam", {"lr_decay": 0.1}, "has no hyperparameter 'lr_decay'"),
    ("adam-seed", {"beta1": 0.8}, "beta1 must be in exactly 0.9"),
])
def test_hyperparameters_are_checked(name, bad, needle):
    with pytest.raises(OptimizerError) as info:
        make_optimizer(name, 0.1, bad)
    assert needle in str(info.value)


def test_unknown_and_missing_state_keys_are_refused(rng):
    x, y, ws = model(rng)
    _, opt = gt_run("adamw", {}, 0.01, x, y, ws, 1.0, steps=2)
    state = opt.state_dict()
    tp = gt.Tape()
    for w in ws:
        tp.param(w)
    with pytest.raises(OptimizerError, match="'extra' is not a field"):
        optimizer_from_state(tp, dict(state, extra=1))
    missing = {k: v for k, v in state.items() if k != "b2t"}
    with pytest.raises(OptimizerError, match="'b2t' is missing"):
        optimizer_from_state(tp, missing)
    with pytest.raises(OptimizerError, match="vmax"):
        optimizer_from_state(tp, dict(state, params=[dict(state["params"][0], vmax=b"")]
                                      + state["params"][1:]))
    with pytest.raises(OptimizerError, match="'b1t' is"):
        optimizer_from_state(tp, dict(state, hparams=dict(state["hparams"], beta1=0.8)))


def test_cli_adamw_with_a_schedule_resumes_to_the_bit(tmp_path):
    """gradtool train --optimizer adamw --amsgrad --lr-schedule cosine --warmup 3: 10 steps,
    saved, 10 more == 20 straight; the saved state names version 2, its hparams and
    schedule; a hyperparameter the entry lacks is one line, exit 2."""
    from click.testing import CliRunner
    from gradtool.cli import main
    from gradtool.tapefile import load
    from support import DIGITS, DIGITS_DATA

    flags = ["--optimizer", "adamw", "--weight-decay", "0.02", "--amsgrad", "--lr-schedule",
             "cosine", "--t-max", "20", "--warmup", "3"]

    def train(*args):
        r = CliRunner().invoke(main, ["train", *map(str, args), "--data", str(DIGITS_DATA)])
        return r
    a, b, c = tmp_path / "a.msgpack", tmp_path / "b.msgpack", tmp_path / "c.msgpack"
    assert train(DIGITS, *flags, "--steps", 10, "--save", a).exit_code == 0
    assert train(a, "--steps", 10, "--save", b).exit_code == 0
    assert train(DIGITS, *flags, "--steps", 20, "--save", c).exit_code == 0
    sb, sc = load(b), load(c)
    assert sb.optimizer["version"] == 2 and sb.optimizer["kind"] == "adamw"
    assert sb.optimizer["hparams"]["amsgrad"] is True and sb.optimizer["t"] == 20
    assert sb.optimizer["schedule"]["kind"] == "cosine"
    for p in sb.tape.params():
        assert sb.tape.values[p.id].tobytes() == sc.tape.values[p.id].tobytes()
    r = train(a, "--steps", 1, "--momentum", "0.9")
    assert r.exit_code == 2 and "has no hyperparameter 'momentum'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_meta_names_are_read_by_their_version():
    from gradtool.train.options import TrainError, meta_defaults
    assert meta_defaults({"train": {"optimizer": "adam"}}, "f")["optimizer"] == "adam-seed"
    assert meta_defaults({"train": {"optimizer": "adam", "optimizer_version": 2}},
                         "f")["optimizer"] == "adam"
    with pytest.raises(TrainError, match="needs 'optimizer_version': 2"):
        meta_defaults({"train": {"optimizer": "adamw"}}, "f")
