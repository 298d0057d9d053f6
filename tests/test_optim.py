"""Optimizers: exact trajectories against hand computation in plain Python floats.

Each expected value below is computed element by element with Python floats
following the order documented in gradtool/optim.py, so a change of order,
a fused operation or a pow instead of the running bias products shows up as
a bit difference.
"""

import math

import msgpack
import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal, require_c_compiler
from gradtool import numerics, optim
from gradtool.optim import SGD, AdamSeed as Adam, OptimizerError, optimizer_from_state

B1, B2, EPS = 0.9, 0.999, 1e-8


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def step_path(request, monkeypatch):
    """Every test runs twice: through the compiled step (csrc/gt_optim.h) and the numpy
    sequence, which must give the same bits."""
    if request.param == "compiled":
        require_c_compiler()
        assert numerics.cpu_kernels() is not None
    monkeypatch.setattr(optim, "_COMPILED", [request.param == "compiled"])
    return request.param


def linear_tape(ws, ks, l2s=None):
    """Params w_i with loss = sum_i sum(w_i * k_i): the gradient of w_i is exactly k_i."""
    tp = gt.Tape()
    params = [tp.param(w, name=f"w{i}", l2=(l2s or [0.0] * len(ws))[i]) for i, w in enumerate(ws)]
    terms = [tp.sum(p * tp.const(k)) for p, k in zip(params, ks, strict=True)]
    loss = terms[0]
    for t in terms[1:]:
        loss = loss + t
    return tp, params, loss


def run_step(tp, loss, opt):
    tp.zero_grad()
    tp.backward(loss)
    opt.step(tp)


def flat(a):
    return [float(x) for x in np.ravel(a)]


# ── hand computations (plain Python floats) ─────────────────────────────────

def hand_clip(grads, clip):
    if clip <= 0.0:
        return grads
    sumsq = 0.0
    for g in grads:
        for x in g:
            sumsq = sumsq + x * x
    norm = math.sqrt(sumsq)
    if norm > clip:
        scale = clip / norm
        return [[x * scale for x in g] for g in grads]
    return grads


def hand_adam(ws, grads, l2s, lr, steps, clip=0.0):
    """`steps` Adam steps where the gradient of param i at step s is grads[s][i]."""
    ws = [list(w) for w in ws]
    ms = [[0.0] * len(w) for w in ws]
    vs = [[0.0] * len(w) for w in ws]
    b1t = b2t = 1.0
    omb1, omb2 = 1.0 - B1, 1.0 - B2
    for s in range(steps):
        gs = hand_clip(grads[s], clip)
        b1t = b1t * B1
        b2t = b2t * B2
        lr_t = (lr * math.sqrt(1.0 - b2t)) / (1.0 - b1t)
        for i, w in enumerate(ws):
            for j in range(len(w)):
                g = gs[i][j]
                if l2s[i] != 0.0:
                    g = g + l2s[i] * w[j]
                ms[i][j] = B1 * ms[i][j] + omb1 * g
                vs[i][j] = B2 * vs[i][j] + omb2 * (g * g)
                w[j] = w[j] - (lr_t * ms[i][j]) / (math.sqrt(vs[i][j]) + EPS)
    return ws, ms, vs


# ── Adam ───────────────────────────────────────────────────────────────────

def test_two_step_adam_trajectory_is_bit_exact(rng):
    """Two steps on a real MLP-like loss (the gradient changes between steps)."""
    tp = gt.Tape()
    x = tp.const(rng.standard_normal((4, 3)), name="x")
    w = tp.param(rng.standard_normal((3, 2)), name="w", l2=0.01)
    b = tp.param(rng.standard_normal((1, 2)), name="b")
    loss = tp.mean(tp.tanh(x @ w + b) * tp.tanh(x @ w + b))
    opt = Adam(0.05)
    opt.add(tp, w)
    opt.add(tp, b)
    assert [e.l2 for e in opt.entries] == [0.01, 0.0]

    ws = [flat(tp.value(w)), flat(tp.value(b))]
    ms = [[0.0] * 6, [0.0] * 2]
    vs = [[0.0] * 6, [0.0] * 2]
    b1t = b2t = 1.0
    for step in range(2):
        tp.zero_grad()
        tp.forward()
        tp.backward(loss)
        grads = [flat(tp.grad(w)), flat(tp.grad(b))]
        opt.step(tp)
        b1t, b2t = b1t * B1, b2t * B2
        lr_t = (0.05 * math.sqrt(1.0 - b2t)) / (1.0 - b1t)
        for i, l2 in enumerate([0.01, 0.0]):
            for j in range(len(ws[i])):
                g = grads[i][j]
                if l2 != 0.0:
                    g = g + l2 * ws[i][j]
                ms[i][j] = B1 * ms[i][j] + (1.0 - B1) * g
                vs[i][j] = B2 * vs[i][j] + (1.0 - B2) * (g * g)
                ws[i][j] = ws[i][j] - (lr_t * ms[i][j]) / (math.sqrt(vs[i][j]) + EPS)
        assert_bits_equal(tp.value(w).ravel(), ws[0], f"w after step {step + 1}")
        assert_bits_equal(tp.value(b).ravel(), ws[1], f"b after step {step + 1}")
        assert_bits_equal(opt.entries[0].m.ravel(), ms[0], "m")
        assert_bits_equal(opt.entries[0].v.ravel(), vs[0], "v")
    assert opt.t == 2 and opt.b1t == 0.9 * 0.9 and opt.b2t == 0.999 * 0.999


def test_adam_many_steps_with_clip_and_l2_matches_hand(rng):
    w0 = [rng.standard_normal(5), rng.standard_normal((2, 2))]
    k = [rng.standard_normal(5) * 3.0, rng.standard_normal((2, 2))]
    tp, params, loss = linear_tape(w0, k, l2s=[0.1, 0.0])
    opt = Adam(0.01)
    for p in params:
        opt.add(tp, p)
    opt.set_clip(1.5)
    for _ in range(12):
        run_step(tp, loss, opt)
    grads = [[flat(k[0]), flat(k[1])]] * 12
    ws, ms, vs = hand_adam([flat(w) for w in w0], grads, [0.1, 0.0], 0.01, 12, clip=1.5)
    for p, w in zip(params, ws, strict=True):
        assert_bits_equal(tp.value(p).ravel(), w, "w")
    b1t = b2t = 1.0
    for _ in range(12):
        b1t, b2t = b1t * B1, b2t * B2
    assert (opt.t, opt.b1t, opt.b2t) == (12, b1t, b2t)


def test_adam_counter_advances_when_nothing_is_touched():
    tp = gt.Tape()
    w = tp.param(np.ones(2))
    opt = Adam(0.1)
    opt.add(tp, w)
    opt.step(tp)                          # no backward: nothing touched
    assert opt.t == 1 and opt.b1t == B1
    assert_bits_equal(tp.value(w), np.ones(2))
    assert_bits_equal(opt.entries[0].m, np.zeros(2))


# ── SGD, L2, clip ──────────────────────────────────────────────────────────

def test_sgd_with_l2_is_bit_exact(rng):
    w0 = [rng.standard_normal(4), rng.standard_normal(3)]
    k = [rng.standard_normal(4), rng.standard_normal(3)]
    tp, params, loss = linear_tape(w0, k, l2s=[0.3, 0.0])
    opt = SGD(0.07)
    for p in params:
        opt.add(tp, p)
    ws = [flat(w) for w in w0]
    for _ in range(3):
        run_step(tp, loss, opt)
        for i, l2 in enumerate([0.3, 0.0]):
            for j, kj in enumerate(flat(k[i])):
                g = kj + l2 * ws[i][j] if l2 != 0.0 else kj
                ws[i][j] = ws[i][j] - 0.07 * g
    for p, w in zip(params, ws, strict=True):
        assert_bits_equal(tp.value(p).ravel(), w)


def test_l2_override_at_registration(rng):
    w0 = rng.standard_normal(3)
    tp, (p,), loss = linear_tape([w0], [np.zeros(3)], l2s=[0.5])
    opt = SGD(0.1)
    opt.add(tp, p, l2=0.0)                 # explicit 0 beats the tape's 0.5
    run_step(tp, loss, opt)
    assert_bits_equal(tp.value(p), w0)    # zero gradient, no decay


def test_clip_norm_is_serial_in_registration_then_row_major_order():
    # Squares whose sum depends on the order: one large, many tiny ones that
    # vanish when added after it but survive when summed first.
    big = np.array([1.0])
    tiny = np.full((3, 5), 2.0 ** -27)
    tp, params, loss = linear_tape([np.zeros(1), np.zeros((3, 5))], [big, tiny])
    for order in (params, params[::-1]):
        opt = SGD(1.0)
        for p in order:
            opt.add(tp, p)
        opt.set_clip(0.5)
        before = [tp.value(p).copy() for p in params]
        run_step(tp, loss, opt)
        grads = [flat(big), flat(tiny)] if order is params else [flat(tiny), flat(big)]
        scaled = hand_clip(grads, 0.5)
        if order is not params:
            scaled = scaled[::-1]
        for p, b, g in zip(params, before, scaled, strict=True):
            assert_bits_equal(tp.value(p).ravel(),
                              [x - 1.0 * y for x, y in zip(flat(b), g, strict=True)])
    # the two orders give different norms, so the test above can tell them apart
    assert hand_clip([flat(big), flat(tiny)], 0.5) != hand_clip([flat(tiny), flat(big)], 0.5)[::-1]


def test_clip_applies_to_raw_gradient_before_l2(rng):
    w0 = rng.standard_normal(3) * 10.0
    k = np.array([3.0, 4.0, 0.0])                   # norm 5
    tp, (p,), loss = linear_tape([w0], [k], l2s=[0.2])
    opt = SGD(0.1)
    opt.add(tp, p)
    opt.set_clip(1.0)
    run_step(tp, loss, opt)
    scale = 1.0 / 5.0
    expected = [w - 0.1 * (g * scale + 0.2 * w) for w, g in zip(flat(w0), flat(k), strict=True)]
    assert_bits_equal(tp.value(p), expected)


def test_clip_below_threshold_leaves_gradient_alone(rng):
    k = np.array([0.3, 0.4])
    tp, (p,), loss = linear_tape([np.zeros(2)], [k])
    opt = SGD(1.0)
    opt.add(tp, p)
    opt.set_clip(0.5)                    # norm 0.5 is not > 0.5
    run_step(tp, loss, opt)
    assert_bits_equal(tp.value(p), -k)


# ── skipping untouched params ──────────────────────────────────────────────

@pytest.mark.parametrize("kind", [SGD, Adam])
def test_untouched_param_is_skipped_entirely(kind, rng):
    tp = gt.Tape()
    used = tp.param(rng.standard_normal(3), l2=0.5)
    unused = tp.param(rng.standard_normal(3), l2=0.5)
    loss = tp.sum(used * tp.const(np.array([10.0, 20.0, 30.0])))
    opt = kind(0.1)
    opt.add(tp, used)
    opt.add(tp, unused)
    opt.set_clip(1.0)
    unused_before = tp.value(unused).copy()
    used_before = tp.value(used).copy()
    run_step(tp, loss, opt)
    assert not tp.touched(unused)
    assert_bits_equal(tp.value(unused), unused_before)          # not decayed either
    if kind is Adam:
        assert_bits_equal(opt.entries[1].m, np.zeros(3))
        assert_bits_equal(opt.entries[1].v, np.zeros(3))
    # the clip norm covers only the touched param
    ref = Adam(0.1) if kind is Adam else SGD(0.1)
    tp2 = gt.Tape()
    used2 = tp2.param(used_before, l2=0.5)
    loss2 = tp2.sum(used2 * tp2.const(np.array([10.0, 20.0, 30.0])))
    ref.add(tp2, used2)
    ref.set_clip(1.0)
    run_step(tp2, loss2, ref)
    assert_bits_equal(tp.value(used), tp2.value(used2))


def test_param_untouched_in_a_later_step_keeps_its_moments(rng):
    tp = gt.Tape()
    a = tp.param(rng.standard_normal(2))
    b = tp.param(rng.standard_normal(2))
    both = tp.sum(a * b)
    only_a = tp.sum(a * a)
    opt = Adam(0.1)
    opt.add(tp, a)
    opt.add(tp, b)
    run_step(tp, both, opt)
    m_b, v_b, w_b = opt.entries[1].m.copy(), opt.entries[1].v.copy(), tp.value(b).copy()
    run_step(tp, only_a, opt)
    assert_bits_equal(opt.entries[1].m, m_b)
    assert_bits_equal(opt.entries[1].v, v_b)
    assert_bits_equal(tp.value(b), w_b)
    assert opt.t == 2



def _spied_steps(monkeypatch, fast: bool) -> list:
    """Optimizer._step_all (every active param in one compiled call) recording what it
    returned, or, with ``fast`` False, declined: the step then goes param by param."""
    from gradtool.optim.core import Optimizer
    taken = []
    real = getattr(Optimizer._step_all, "__wrapped__", Optimizer._step_all)  # (spied before)

    def step_all(self, *args):
        taken.append(real(self, *args) if fast else False)
        return taken[-1]

    step_all.__wrapped__ = real
    monkeypatch.setattr(Optimizer, "_step_all", step_all)
    return taken


@pytest.mark.parametrize("kind, hparams", [("sgd", {"momentum": 0.9, "nesterov": True}),
                                           ("adam", {"amsgrad": True}), ("adamw", None),
                                           ("adam-seed", None)])
def test_one_compiled_call_for_every_param_gives_the_param_by_param_bits(
        kind, hparams, step_path, rng, monkeypatch):
    """Without clip and L2 the compiled step updates every active param in one call
    (gt_opt_table_steps_py); on 2 threads (the large param splits), with a param left
    untouched in one step, it ends where the param-by-param step and the numpy sequence
    do, its slots and counters too."""
    if step_path != "compiled":
        pytest.skip("compares the compiled paths with the numpy one itself")
    from gradtool import native
    from gradtool.optim import make_optimizer
    ws = [rng.standard_normal((300, 240)), rng.standard_normal(37), rng.standard_normal((3, 5))]
    ks = [rng.standard_normal(w.shape) * 10.0 ** rng.integers(-3, 4, w.shape) for w in ws]
    finals, calls = [], []
    try:
        native.set_num_threads(2)
        for how in ("numpy", "param by param", "one call"):
            optim._COMPILED[0] = how != "numpy"
            taken = _spied_steps(monkeypatch, how == "one call")
            tp = gt.Tape()
            params = [tp.param(w) for w in ws]
            terms = [tp.sum(p * tp.const(k)) for p, k in zip(params, ks, strict=True)]
            losses = [terms[0] + terms[1] + terms[2], terms[0] + terms[1]]
            opt = make_optimizer(kind, 0.01, hparams)
            for p in params:
                opt.add(tp, p)
            for step in range(4):
                run_step(tp, losses[step == 2], opt)
            finals.append([tp.value(p).copy() for p in params]
                          + [a.copy() for e in opt.entries for a in e.state.values()])
            calls.append((taken, opt.t, opt.b1t, opt.b2t))
    finally:
        native.set_num_threads(None)
    assert calls[2][0] == [True] * 4 and calls[1][0] == [False] * 4 and calls[0][0] == []
    assert calls[0][1:] == calls[1][1:] == calls[2][1:]
    for got in finals[1:]:
        for a, b in zip(got, finals[0], strict=True):
            assert_bits_equal(a, b, kind)


def test_params_of_two_dtypes_step_one_by_one_with_the_same_bits(step_path, rng, monkeypatch):
    """An optimizer over an f64 and an f32 param: the one-call step declines (one library
    per dtype) and the param-by-param step gives each the bits an optimizer of its own
    dtype alone gives it (through the one call)."""
    from gradtool.optim import make_optimizer
    w64, w32 = rng.standard_normal((4, 6)), rng.standard_normal(9).astype(np.float32)
    k64, k32 = rng.standard_normal((4, 6)), rng.standard_normal(9).astype(np.float32)
    taken = _spied_steps(monkeypatch, True)

    def run(which):
        tp = gt.Tape()
        p64, p32 = tp.param(w64), tp.param(w32)
        loss = tp.sum(p64 * tp.const(k64)) + tp.cast(tp.sum(p32 * tp.const(k32)), "f64")
        opt = make_optimizer("adam", 0.01)
        for p in which(p64, p32):
            opt.add(tp, p)
        for _ in range(3):
            run_step(tp, loss, opt)
        return tp.value(p64).copy(), tp.value(p32).copy(), opt

    mixed64, mixed32, mixed = run(lambda a, b: (a, b))
    compiled = step_path == "compiled"
    assert taken == [False] * (3 if compiled else 0)
    alone64, _, only64 = run(lambda a, b: (a,))
    _, alone32, only32 = run(lambda a, b: (b,))
    assert taken[3:] == [True] * (6 if compiled else 0)
    assert mixed32.dtype == np.float32 and mixed.entries[1].m.dtype == np.float32
    assert_bits_equal(mixed64, alone64)
    assert_bits_equal(mixed32, alone32)
    for a, b in ((mixed.entries[0], only64.entries[0]), (mixed.entries[1], only32.entries[0])):
        for s in ("m", "v"):
            assert_bits_equal(a.state[s], b.state[s], s)

# ── saved state ────────────────────────────────────────────────────────────

@pytest.mark.parametrize("kind", [SGD, Adam])
def test_state_dict_round_trip_continues_bit_for_bit(kind, rng):
    w0 = [rng.standard_normal((2, 3)), rng.standard_normal(3)]
    k = [rng.standard_normal((2, 3)), rng.standard_normal(3)]

    def fresh():
        tp, params, loss = linear_tape(w0, k, l2s=[0.01, 0.0])
        opt = kind(0.02)
        for p in params:
            opt.add(tp, p)
        opt.set_clip(0.7)
        return tp, params, loss, opt

    tp, params, loss, opt = fresh()
    for _ in range(5):
        run_step(tp, loss, opt)
    straight = [tp.value(p).copy() for p in params]

    tp, params, loss, opt = fresh()
    for _ in range(3):
        run_step(tp, loss, opt)
    state = msgpack.unpackb(msgpack.packb(opt.state_dict()))
    tp2, params2, loss2, _ = fresh()
    for p, p2 in zip(params, params2, strict=True):
        tp2.set_value(p2, tp.value(p))
    opt2 = optimizer_from_state(tp2, state)
    assert opt2.kind == opt.kind and opt2.t == 3 and opt2.clip == 0.7
    for _ in range(2):
        run_step(tp2, loss2, opt2)
    for p2, s in zip(params2, straight, strict=True):
        assert_bits_equal(tp2.value(p2), s)


def test_load_state_dict_rejects_mismatches(rng):
    tp, params, loss = linear_tape([np.zeros(3), np.zeros(2)], [np.ones(3), np.ones(2)])
    opt = Adam(0.1)
    for p in params:
        opt.add(tp, p)
    state = opt.state_dict()
    with pytest.raises(OptimizerError, match="'sgd'"):
        SGD(0.1).load_state_dict(state)
    other = Adam(0.1)
    other.add(tp, params[0])
    with pytest.raises(OptimizerError, match="param nodes"):
        other.load_state_dict(state)
    bad = dict(state, params=[dict(state["params"][0], m=b"\0" * 8), state["params"][1]])
    with pytest.raises(OptimizerError, match="8 bytes, expected 24"):
        opt.load_state_dict(bad)
    assert opt.t == 0                     # nothing changed by a rejected load


def test_registration_errors(rng):
    tp = gt.Tape()
    w = tp.param(np.ones(2))
    c = tp.const(np.ones(2))
    opt = Adam(0.1)
    with pytest.raises(OptimizerError, match="not a param"):
        opt.add(tp, c)
    opt.add(tp, w)
    with pytest.raises(OptimizerError, match="already registered"):
        opt.add(tp, w)
    with pytest.raises(OptimizerError, match="not a node"):
        opt.add(tp, 99)
    with pytest.raises(OptimizerError):
        Adam(-1.0)
    with pytest.raises(OptimizerError):
        opt.set_clip(float("nan"))
    with pytest.raises(OptimizerError):
        opt.add(tp, tp.param(np.ones(1)), l2=-0.1)


# ── an independent implementation ──────────────────────────────────────────

def test_adam_agrees_with_scikit_learn(rng):
    """Both optimizers see the same gradient sequence (loss = sum(w * k), gradient k)."""
    so = pytest.importorskip("sklearn.neural_network._stochastic_optimizers")
    w0 = [rng.standard_normal((4, 1)), rng.standard_normal((1, 1))]
    seq = [[rng.standard_normal((4, 1)), rng.standard_normal((1, 1))] for _ in range(60)]
    ref_params = [w.copy() for w in w0]
    ref = so.AdamOptimizer(ref_params, learning_rate_init=0.01)
    tp, params, loss = linear_tape(w0, [np.zeros((4, 1)), np.zeros((1, 1))])
    ks = [tp.var(i) for i, n in enumerate(tp.nodes) if n.op == "const"]
    opt = Adam(0.01)
    for p in params:
        opt.add(tp, p)
    for step, grads in enumerate(seq, start=1):
        for k, g in zip(ks, grads, strict=True):
            tp.set_value(k, g)
        tp.forward()
        run_step(tp, loss, opt)
        ref.update_params(ref_params, grads)
        # the moments use no power at all: identical at every step
        for e, m, v in zip(opt.entries, ref.ms, ref.vs, strict=True):
            assert_bits_equal(e.m, m, f"m at step {step}")
            assert_bits_equal(e.v, v, f"v at step {step}")
        got = np.concatenate([tp.value(p).ravel() for p in params])
        want = np.concatenate([p.ravel() for p in ref_params])
        if step <= 2:       # b**t is the correctly rounded product for t <= 2: same bits
            assert_bits_equal(got, want, f"w at step {step}")
        # later, pow and the running product differ by an ulp, which 1 - b**t
        # amplifies in lr_t (up to ~1e-14 relative); each update is ~lr, so the
        # params (of order 1) stay within a few ulp of 1.0 of each other
        assert np.abs(got - want).max() <= 4 * np.spacing(1.0), f"w at step {step}"


@pytest.mark.parametrize("kind", ["sgd", "adam-seed"])
def test_large_params_split_over_threads_give_the_same_bits(kind, step_path, rng):
    """A parameter of 75,000 elements is updated by several threads in the compiled step;
    with 1, 2 or 3 threads, with clip and L2, it ends where the numpy sequence does."""
    if step_path != "compiled":
        pytest.skip("compares the compiled step with the numpy one itself")
    from gradtool import native
    ws = [rng.standard_normal((250, 300)), rng.standard_normal(37)]
    ks = [rng.standard_normal((250, 300)) * 10.0 ** rng.integers(-3, 4, (250, 300)),
          rng.standard_normal(37)]
    finals = []
    try:
        for compiled, threads in ((False, 1), (True, 1), (True, 2), (True, 3)):
            optim._COMPILED[0] = compiled
            native.set_num_threads(threads)
            tp, params, loss = linear_tape(ws, ks, l2s=[1e-3, 0.0])
            opt = (Adam if kind == "adam-seed" else SGD)(0.01)
            for p in params:
                opt.add(tp, p)
            opt.set_clip(50.0)
            for _ in range(3):
                run_step(tp, loss, opt)
            finals.append([tp.value(p).copy() for p in params]
                          + ([e.m.copy() for e in opt.entries] if kind == "adam-seed" else []))
    finally:
        native.set_num_threads(None)
    for got in finals[1:]:
        for a, b in zip(got, finals[0], strict=True):
            assert_bits_equal(a, b, f"{kind}")
