"""The one shared test-support module: tests import helpers from here, never from
each other.

* Paths: the repository, the samples.
* Per-op inputs from the op table (:func:`op_case`, :func:`op_tape`): each op's
  kind says what shapes and attributes to build, its ``domain`` where its rule is
  smooth, so a new elementwise op is covered by every table-driven test without
  touching this file; a new *kind* of op needs one builder in :func:`op_case`.
* Graph builders: :func:`random_graph` (every op), :func:`random_unary`,
  :func:`mlp`, :func:`mlp_tape`, :func:`all_ops_tape`, an independent writer
  (:func:`write_independent_mlp`) and numpy backprop to check it.
* Engine helpers: :func:`with_params`, :func:`run_cpu`,
  :func:`assert_replay_trained_like_cpu`, :func:`assert_engines_end_alike` and
  friends, shared by the host, CUDA and fusion tests.
* Files, valid and hostile: the corpus of ``test_hostile_files`` (hand-written
  invalid mutations of every node field and top-level key, header bombs,
  truncations: :func:`all_invalid_cases`, :func:`assert_clean_reject`), the
  structure-aware :class:`Mutator` of the fuzz test, :func:`run_limited` (a
  command under memory and CPU limits), the CLI helpers (:func:`run`,
  :func:`assert_one_line_error`, :func:`stderr_through_a_terminal`).

Run as a script (``python tests/support.py cli-batch JOBS.json``) it is the fuzz
test's limited worker.
"""

from __future__ import annotations

import copy
import math
import os
import resource
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
from click.testing import CliRunner

import gradtool as gt
from conftest import assert_bits_equal
from gradtool.cli import main
from gradtool.ops import OPS
from gradtool.optim import AdamSeed as Adam
from gradtool.tape import Tape
from gradtool.tapefile import dumps
from gradtool.train import make_engine

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
SAMPLE_TAPES = sorted(SAMPLES.rglob("*.msgpack"))
DIGITS = SAMPLES / "digits_mlp.msgpack"
DIGITS_DATA = SAMPLES / "digits.npz"

# every op with an f64-only form (cast always involves an f32 value: tests/test_f32.py)
TABLE_OPS = [name for name, spec in OPS.items() if spec.kind not in ("leaf", "cast")]


def draw(spec, rng: np.random.Generator, shape) -> np.ndarray:
    """Inputs in the op's smooth domain, away from kinks (relu at 0) and steep regions."""
    if spec.domain == "positive":
        return rng.uniform(0.5, 2.0, shape)
    x = rng.uniform(0.2, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    return x


def op_case(name: str, rng: np.random.Generator, *, scalar: bool = False):
    """(inputs, s, attrs): arrays for the op's inputs, its scalar operand, its attributes.

    ``scalar=True`` gives one-element inputs (the emitter's scope).
    """
    spec = OPS[name]
    s = float(rng.uniform(0.5, 1.5)) if spec.scalar_operand else 0.0
    if scalar:
        return [draw(spec, rng, (1,)) for _ in range(spec.arity)], s, {}
    kind = spec.kind
    if kind == "unary":
        return [draw(spec, rng, (3, 4))], s, {}
    if kind == "binary":               # a broadcast on each side
        return [draw(spec, rng, (3, 1, 4)), draw(spec, rng, (2, 1))], s, {}
    if kind in ("reduce", "max"):
        return [draw(spec, rng, (3, 4))], s, {"axis": 1, "keepdims": True}
    if kind == "matmul":
        return [draw(spec, rng, (3, 5)), draw(spec, rng, (5, 2))], s, {}
    if kind == "bmm":
        return [draw(spec, rng, (2, 3, 4)), draw(spec, rng, (2, 4, 3))], s, {}
    if kind == "transpose":
        return [draw(spec, rng, (2, 3, 4))], s, {}
    if kind == "permute":
        return [draw(spec, rng, (2, 3, 4, 5))], s, {"dims": [2, 0, 3, 1]}
    if kind == "reshape":
        return [draw(spec, rng, (3, 4))], s, {"shape": [2, 6]}
    if kind == "softmax":
        return [draw(spec, rng, (3, 4))], s, {"axis": 0}
    if kind == "slice":
        return [draw(spec, rng, (4, 5))], s, {"starts": [1, 0], "stops": [3, 4]}
    if kind == "concat":
        return [draw(spec, rng, (2, 3)), draw(spec, rng, (2, 2))], s, {"axis": 1}
    if kind == "take":                 # repeated ids: rows whose gradient sums positions
        return [draw(spec, rng, (5, 3)), np.array([[0, 3, 3, 1], [4, 0, 3, 3]])], s, {}
    if kind == "take_along":
        return [draw(spec, rng, (3, 4)), np.array([[1, 1], [3, 0], [0, 2]])], s, {"axis": 1}
    if kind == "scatter":              # repeated ids, and rows 2 and 5 nobody writes
        return [draw(spec, rng, (2, 4, 3)), np.array([[0, 3, 3, 1], [4, 0, 3, 3]])], s, {
            "rows": 6}
    if kind == "uniform":              # the rng slot's (step, shard, train flag)
        return [np.array([7.0, 3.0, 1.0])], s, {"shape": [3, 5], "salt": 11}
    if kind == "conv2d":               # groups, stride, padding and dilation all at work
        return [draw(spec, rng, (2, 4, 6, 5)), draw(spec, rng, (4, 2, 3, 2))], s, {
            "stride": [2, 1], "padding": [1, 1], "dilation": [1, 2], "groups": 2}
    if kind == "max_pool2d":           # overlapping windows, padding, a partial last window
        return [draw(spec, rng, (2, 3, 5, 6))], s, {
            "kernel": [3, 2], "stride": [2, 1], "padding": [1, 1], "dilation": [1, 2],
            "ceil_mode": True}
    if kind == "avg_pool2d":
        return [draw(spec, rng, (2, 3, 5, 6))], s, {
            "kernel": [3, 3], "stride": [2, 2], "padding": [1, 1], "ceil_mode": True,
            "count_include_pad": False}
    raise NotImplementedError(f"tests/support.py: no inputs for op kind {kind!r} (op {name})")


# ops whose optional attributes change the kernels' work: the table tests also run each
# of these attribute sets (on op_case's inputs) besides op_case's own
OPTIONAL_CASES = {
    "slice": [{"starts": [1, 0], "stops": [4, 5], "steps": [2, 3]},
              {"starts": [0, 1], "stops": [4, 4], "steps": [3, 1]}],
    "sum": [{}, {"axis": 0}], "mean": [{}, {"axis": 0}], "max": [{}, {"axis": 0}],
}


def op_tape(name: str, rng: np.random.Generator, *, scalar: bool = False, attrs=None):
    """A tape whose params feed ONE node of op ``name`` (ids inputs are i64 consts); the loss
    weighs its output with a random const so every output element gets its own gradient.
    ``attrs`` replaces op_case's attributes (OPTIONAL_CASES).  -> (tape, out, loss)."""
    inputs, s, case_attrs = op_case(name, rng, scalar=scalar)
    attrs = case_attrs if attrs is None else attrs
    tp = gt.Tape()
    leaves = [tp.const(x, name=f"in{k}", dtype="i64") if "ab"[k] in OPS[name].id_inputs
              else tp.const(x, name=gt.RNG_NAME) if OPS[name].rng_input and k == 0
              else tp.param(x, name=f"in{k}") for k, x in enumerate(inputs)]
    out = tp.record(name, *leaves, s=s, attrs=attrs)
    if scalar:
        w = tp.const(rng.uniform(0.5, 1.5, (1,)), name="w")
        return tp, out, tp.mul(out, w)
    w = tp.const(rng.uniform(0.5, 1.5, tp.value(out).shape))
    return tp, out, tp.sum(tp.mul(out, w))


def run(*args, input=None):
    """The gradtool command line, in process: ``run("inspect", path)``."""
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def assert_one_line_error(result, status, *needles):
    """Exit ``status`` with ONE stderr line ``gradtool: ...`` holding every needle."""
    assert result.exit_code == status, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradtool: "), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ── graph builders ────────────────────────────────────────────────────────

UNARY = ["neg", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs"]


def perturb_leaves(tp, rp, rng):
    """New leaf values (same signs, so log/sqrt inputs stay positive; new ids in range) on
    both sides."""
    for i, node in enumerate(tp.nodes):
        if node.a < 0 and tp.holds_ids(i):
            bounds = [b for _, b in tp.id_bounds(i)]     # none: ids read through other ops
            new = (rng.integers(0, min(bounds), tp.values[i].shape) if bounds
                   else tp.values[i].copy())
            tp.set_value(tp.var(i), new)
            rp.set_input(i, new)
        elif node.a < 0:
            new = tp.values[i] * rng.uniform(0.5, 1.5, tp.values[i].shape)
            tp.set_value(tp.var(i), new)
            rp.set_input(i, new)


def weighted_loss(tp, y, rng):
    """mean(y * k) with a random const k: every element of y gets its own gradient."""
    return tp.mean(y * tp.const(rng.uniform(-1.0, 1.0, y.shape)))


# the elementwise math ops of issue 20 (random_unary draws them too)
MATH_UNARY = ["erf", "erfc", "atan", "sin", "cos", "expm1", "log1p", "rsqrt", "pows", "clamp"]
ROUNDING = ["floor", "ceil", "trunc", "round"]


def random_unary(tp, rng, x):
    """A random unary op of x (inputs kept in the domain of log and sqrt)."""
    op = rng.choice(UNARY + ["adds", "muls"] + MATH_UNARY + ROUNDING + ["fmods", "mods"])
    if op in ("fmods", "mods"):         # jumps where 2.5 x crosses a multiple of s
        s = float(rng.uniform(0.5, 2.0) * rng.choice([-1.0, 1.0]))
        return tp.add(x, getattr(tp, op)(tp.muls(x, 2.5), s))
    if op in ROUNDING:                  # integers and ties at 2.5 x: -2.5 ... 2.5
        return tp.add(x, getattr(tp, op)(tp.muls(x, 2.5)))
    if op in ("log", "sqrt", "log1p", "rsqrt"):
        return getattr(tp, op)(tp.adds(tp.sigmoid(x), 0.25))
    if op in ("exp", "expm1"):
        return getattr(tp, op)(tp.tanh(x))
    if op in ("adds", "muls"):
        return getattr(tp, op)(x, float(rng.uniform(-2.0, 2.0)))
    if op == "pows":
        s = [2.0, 3.0, 0.5, -0.5, -1.0, 1.7, -2.3][int(rng.integers(7))]
        return tp.pows(tp.adds(tp.sigmoid(x), 0.25), s)
    if op == "clamp":
        lo = float(rng.uniform(-1.0, 0.0))
        return tp.clamp(x, lo, lo + float(rng.uniform(0.0, 1.5)))
    return getattr(tp, op)(x)


def random_graph(rng, n_ops=14):
    """A random tape over every op; returns (tape, loss)."""
    tp = gt.Tape()
    pool = []

    def leaf(shape, const=None):
        const = rng.random() < 0.25 if const is None else const
        data = rng.uniform(-1.0, 1.0, shape)
        v = tp.const(data) if const else tp.param(data)
        pool.append(v)
        return v

    def pick(pred=lambda s: True):
        cands = [v for v in pool if pred(v.shape)]
        return cands[rng.integers(len(cands))] if cands else None

    for shape in [(2, 3), (3,), (2, 1), (1, 3), (2, 3, 4)]:
        leaf(shape)
    def ids(bound, shape):
        return tp.const(rng.integers(0, bound, shape), dtype="i64")

    def computed(pos):                  # the same ids, computed on the tape
        return tp.where(tp.ge(pos, 0), pos, 0) if rng.random() < 0.5 else tp.to_f64(pos)

    for _ in range(n_ops):
        kind = rng.choice(["unary", "binary", "matmul", "bmm", "transpose", "reshape",
                           "softmax", "slice", "concat", "reduce", "take", "take_along",
                           "mask", "conv", "scatter", "dropout"])
        x = pick()
        if kind == "unary":
            y = random_unary(tp, rng, x)
        elif kind == "binary":
            shape = list(x.shape)
            other_shape = [1 if rng.random() < 0.4 else d for d in shape]
            if rng.random() < 0.3 and len(other_shape) > 1:
                other_shape = other_shape[1:]
            other = pick(lambda s: tuple(s) == tuple(other_shape)) or leaf(tuple(other_shape))
            a, b = (x, other) if rng.random() < 0.5 else (other, x)
            op = rng.choice(["add", "sub", "mul", "div", "maximum", "minimum", "pow", "atan2"])
            if op == "div":
                b = tp.adds(tp.sigmoid(b), 0.5)
            if op == "pow":                 # a positive base, an exponent in (-2, 2)
                a, b = tp.adds(tp.sigmoid(a), 0.25), tp.muls(tp.tanh(b), 2.0)
            y = getattr(tp, op)(a, b)
        elif kind == "matmul":
            x = pick(lambda s: len(s) == 2) or leaf((2, 3))
            y = x @ leaf((x.shape[1], int(rng.integers(1, 5))), const=False)
        elif kind == "bmm":               # sometimes a batch of 1 stretched on either side
            x = pick(lambda s: len(s) == 3) or leaf((2, 3, 4))
            batch = [x.shape[0], 1, 3][int(rng.integers(3))] if x.shape[0] == 1 else \
                [x.shape[0], 1][int(rng.integers(2))]
            y = tp.bmm(x, leaf((batch, x.shape[2], int(rng.integers(1, 4))), const=False))
            if rng.random() < 0.5:
                y = tp.bmm(leaf((1, 2, y.shape[1]), const=False), y)
        elif kind == "transpose":
            x = pick(lambda s: len(s) >= 2) or leaf((2, 3))
            y = tp.transpose(x) if rng.random() < 0.5 else \
                tp.permute(x, [int(d) for d in rng.permutation(len(x.shape))])
        elif kind == "reshape":
            y = tp.reshape(x, [int(np.prod(x.shape))])
        elif kind == "softmax":
            op = rng.choice(["softmax", "log_softmax"])
            y = getattr(tp, op)(x, axis=int(rng.integers(len(x.shape))))
        elif kind == "slice":
            starts = [int(rng.integers(d)) for d in x.shape]
            stops = [int(rng.integers(lo + 1, d + 1))
                     for lo, d in zip(starts, x.shape, strict=True)]
            steps = [int(rng.integers(1, 3)) for _ in x.shape] if rng.random() < 0.5 else None
            y = tp.slice(x, starts, stops, steps)
        elif kind == "concat":
            axis = int(rng.integers(len(x.shape)))
            y = tp.concat(x, pick(lambda s: tuple(s) == tuple(x.shape)), axis=axis)
        elif kind == "take":
            table = pick(lambda s: len(s) <= 2) or leaf((4, 3))
            pos = ids(table.shape[0], tuple(rng.integers(1, 4, rng.integers(1, 3))))
            y = tp.take(table, computed(pos) if rng.random() < 0.4 else pos)
        elif kind == "take_along":
            axis = int(rng.integers(len(x.shape)))
            shape = list(x.shape)
            shape[axis] = int(rng.integers(1, 4))
            pos = ids(x.shape[axis], tuple(shape))
            y = tp.take_along(x, computed(pos) if rng.random() < 0.4 else pos, axis=axis)
        elif kind == "scatter":           # src's leading 1 or 2 dims are the ids'
            src = pick(lambda s: len(s) <= 3) or leaf((4, 3))
            k = int(rng.integers(1, min(2, len(src.shape)) + 1))
            rows = int(rng.integers(1, 5))
            pos = ids(rows, tuple(src.shape[:k]))
            y = tp.scatter(src, computed(pos) if rng.random() < 0.4 else pos, rows=rows)
        elif kind == "dropout":           # uniform over the rng slot, ge, where
            y = gt.nn.dropout(x, float(rng.choice([0.25, 0.5])))
        elif kind == "conv":              # conv2d, then sometimes a pool
            x = pick(lambda s: len(s) == 4) or leaf((2, 2, 5, 4))
            groups = int(rng.choice([1, x.shape[1]]))
            w = leaf((2 * groups, x.shape[1] // groups, 2, min(int(rng.integers(1, 3)), x.shape[3])),
                     const=False)
            y = tp.conv2d(x, w, stride=[1, int(rng.integers(1, 3))], padding=[1, 0],
                          groups=groups)
            if rng.random() < 0.6:
                op = rng.choice(["max_pool2d", "avg_pool2d"])
                extra = {"dilation": [1, 1]} if op == "max_pool2d" else {}
                y = tp.record(op, y, attrs={"kernel": [2, min(2, y.shape[3])], "stride": [1, 2],
                                            "padding": [1, 0], "ceil_mode": True, **extra})
        elif kind == "mask":              # comparisons and where (keep + keep_not)
            other = pick(lambda s: tuple(s) == tuple(x.shape)) or leaf(tuple(x.shape))
            m = getattr(tp, rng.choice(["eq", "ne", "lt", "le", "gt", "ge"]))(x, other)
            y = tp.where(m, x, other) if rng.random() < 0.7 else tp.mul(m, x)
            if rng.random() < 0.25:       # a straight-through estimator: detach
                y = tp.add(x, tp.detach(tp.sub(y, x)))
        else:
            op = rng.choice(["sum", "mean", "max"])
            axis = None if rng.random() < 0.3 else int(rng.integers(len(x.shape)))
            if axis is not None and len(x.shape) >= 2 and rng.random() < 0.4:   # several axes
                axis = tuple(int(d) for d in rng.choice(len(x.shape), 2, replace=False))
            y = getattr(tp, op)(x, axis=axis, keepdims=bool(rng.random() < 0.5))
        pool.append(y)
    picks = [pool[int(i)] for i in rng.choice(len(pool), size=3, replace=False)]
    loss = weighted_loss(tp, picks[0], rng)
    for v in picks[1:]:
        loss = loss + weighted_loss(tp, v, rng)
    return tp, loss


def mlp(rng, n_in=6, n_hid=8, n_out=3, batch=5, l2=(1e-3, 0.0), unused=False):
    tp = gt.Tape()
    x = tp.const(rng.standard_normal((batch, n_in)), name="x")
    y = tp.const(np.eye(n_out)[rng.integers(0, n_out, batch)], name="y")
    w1 = tp.param(rng.standard_normal((n_in, n_hid)) * 0.5, name="w1", l2=l2[0])
    b1 = tp.param(np.zeros((1, n_hid)), name="b1", l2=l2[1])
    w2 = tp.param(rng.standard_normal((n_hid, n_out)) * 0.5, name="w2", l2=l2[0])
    b2 = tp.param(np.zeros((1, n_out)), name="b2")
    if unused:
        tp.param(np.ones((2, 2)), name="unused")
    p = tp.softmax(tp.tanh(x @ w1 + b1) @ w2 + b2, axis=1)
    loss = tp.neg(tp.mean(tp.log((y * p) @ tp.const(np.ones((n_out, 1))))))
    return tp, x, y, loss


def batches(rng, n, batch=5, n_in=6, n_out=3):
    return [(rng.standard_normal((batch, n_in)) * 2.0, np.eye(n_out)[rng.integers(0, n_out, batch)])
            for _ in range(n)]


def with_params(opt, tp, clip=None):
    """``opt`` with every param of ``tp`` registered, and the clip set if given."""
    for p in tp.params():
        opt.add(tp, p)
    if clip is not None:
        opt.set_clip(clip)
    return opt


def run_cpu(tp, x, y, loss, opt, data):
    losses = []
    for xb, yb in data:
        tp.set_value(x, xb)
        tp.set_value(y, yb)
        tp.forward()
        losses.append(float(tp.values[loss.id][0]))
        tp.zero_grad()
        tp.backward(loss)
        opt.step(tp)
    return losses


def assert_replay_trained_like_cpu(rp, tp_dev, opt_dev, tp_cpu, opt_cpu):
    """After training: the replay's last gradients, params, step counters and moments,
    synced back into ``tp_dev`` and ``opt_dev``, equal to the bit those of the CPU run."""
    rp.sync_params_to_tape(tp_dev)
    rp.sync_optimizer(opt_dev)
    for p in tp_cpu.params():
        assert_bits_equal(rp.grad(p.id), tp_cpu.grad(p), f"grad {p.id}")
        assert_bits_equal(tp_dev.values[p.id], tp_cpu.values[p.id], f"param {p.id}")
    assert (opt_dev.t, opt_dev.b1t, opt_dev.b2t) == (opt_cpu.t, opt_cpu.b1t, opt_cpu.b2t)
    for e_dev, e_cpu in zip(opt_dev.entries, opt_cpu.entries, strict=True):
        assert sorted(e_dev.state) == sorted(e_cpu.state)
        for name in e_cpu.state:          # every slot of the optimizer (m, v, vmax, buf)
            assert_bits_equal(e_dev.state[name], e_cpu.state[name], f"{name} {e_cpu.node_id}")


def nonfinite_batch_setup(device_engine):
    """The NaN-batch scenario of the engine tests: two identical MLP tapes, each with
    Adam(0.01) and clip 1.0, one on the CPU engine and one on ``device_engine(tp,
    loss_id, opt)``; 12 batches, the sixth all NaN.  Returns (engines, tapes, data),
    engines = [(engine, x, y, opt)], the CPU's first."""
    engines, tapes = [], []
    for make in (lambda tp, loss_id, opt: make_engine("cpu", tp, loss_id, opt), device_engine):
        tp, x, y, loss = mlp(np.random.default_rng(11))
        opt = with_params(Adam(0.01), tp, clip=1.0)
        engines.append((make(tp, loss.id, opt), x, y, opt))
        tapes.append(tp)
    data = batches(np.random.default_rng(12), 12)
    data[5] = (np.full_like(data[5][0], np.nan), data[5][1])
    return engines, tapes, data


def train_step_all(engines, xb, yb):
    """One train_step of every engine on the batch (xb, yb): their losses."""
    losses = []
    for engine, x, y, _ in engines:
        engine.set_input(x.id, xb)
        engine.set_input(y.id, yb)
        losses.append(engine.train_step())
    return losses


def assert_engines_end_alike(engines, tapes):
    """After finish(): the device tape's params equal to the bit the CPU tape's, and both
    optimizers at step 11 (the NaN batch's step rolled back)."""
    for engine, *_ in engines:
        engine.finish()
    for p in tapes[0].params():
        assert_bits_equal(tapes[1].values[p.id], tapes[0].values[p.id], f"param {p.id}")
    assert engines[1][3].t == engines[0][3].t == 11


def mlp_tape(rng):
    tp = Tape()
    w1 = tp.param(rng.standard_normal((3, 5)), name="W1", l2=1e-4)
    b1 = tp.param(rng.standard_normal(5), name="b1")
    w2 = tp.param(rng.standard_normal((5, 2)), name="W2", l2=1e-4)
    b2 = tp.param(rng.standard_normal(2))
    x = tp.const(rng.standard_normal((8, 3)), name="x")
    y = tp.const(rng.standard_normal((8, 2)), name="y")
    pred = tp.tanh(x @ w1 + b1) @ w2 + b2
    return tp, tp.mse(pred, y), {"pred": pred}


def write_independent_mlp(path, rng):
    """An MLP tape written WITHOUT gradtool: the spec is the only shared knowledge.

    Leaves omit a/b/s (they default), ints are used where floats are allowed,
    and an unknown key is present (readers ignore it).
    """
    x, y = rng.standard_normal((8, 3)), rng.standard_normal((8, 2))
    w1, b1 = rng.standard_normal((3, 5)), rng.standard_normal(5)
    w2, b2 = rng.standard_normal((5, 2)), rng.standard_normal(2)

    def leaf(op, arr, **extra):
        return {"op": op, "shape": list(arr.shape), "data": arr.astype("<f8").tobytes(), **extra}

    def op(name, a, shape, b=-1, **extra):
        return {"op": name, "a": a, "b": b, "s": 0.0, "shape": shape, **extra}

    nodes = [
        leaf("const", x, name="x"),                 # 0
        leaf("const", y, name="y"),                 # 1
        leaf("param", w1, name="W1", l2=0),         # 2  (an int l2 is a number)
        leaf("param", b1, name="b1"),               # 3
        leaf("param", w2, name="W2"),               # 4
        leaf("param", b2, comment="no name"),       # 5  (unknown key: ignored)
        op("matmul", 0, [8, 5], b=2),               # 6
        op("add", 6, [8, 5], b=3),                  # 7  broadcast [5]
        op("tanh", 7, [8, 5]),                      # 8
        op("matmul", 8, [8, 2], b=4),               # 9
        op("add", 9, [8, 2], b=5),                  # 10
        op("sub", 10, [8, 2], b=1),                 # 11
        op("mul", 11, [8, 2], b=11),                # 12
        op("mean", 12, [1]),                        # 13
    ]
    doc = {"format": "gradtool-tape", "version": 1, "nodes": nodes, "outputs": {"pred": 10},
           "meta": {"producer": "independent test writer"}, "x-extension": [1, 2, 3]}
    Path(path).write_bytes(msgpack.packb(doc, use_bin_type=True))
    return x, y, w1, b1, w2, b2


def numpy_mlp_backprop(x, y, w1, b1, w2, b2):
    """Hand-written reverse mode for mean((tanh(x@w1+b1)@w2+b2 - y)^2)."""
    h = np.tanh(x @ w1 + b1)
    pred = h @ w2 + b2
    loss = np.mean((pred - y) ** 2)
    dpred = 2.0 * (pred - y) / pred.size
    dw2, db2 = h.T @ dpred, dpred.sum(axis=0)
    dz = (dpred @ w2.T) * (1.0 - h * h)
    dw1, db1 = x.T @ dz, dz.sum(axis=0)
    return loss, {2: dw1, 3: db1, 4: dw2, 5: db2}


# ── tape files, valid and hostile ─────────────────────────────────────────

def all_ops_tape():
    """One tape that uses every op in the table (and both kinds of leaf, named and not)."""
    rng = np.random.default_rng(3)
    tp = Tape()
    a = tp.param(rng.random((2, 3)) + 0.5, name="a", l2=0.01)
    b = tp.param(rng.random((3,)) + 0.5, name="b")
    c = tp.const(rng.random((2, 3)), name="c")
    k = tp.const(rng.random((3, 2)))
    t = tp.neg(tp.div(tp.mul(tp.sub(tp.add(a, b), c), a), b))
    t = tp.muls(tp.adds(t, 0.25), -1.5)
    r = tp.relu(t)
    th = tp.tanh(tp.sigmoid(t))
    sq = tp.sqrt(tp.adds(tp.log(tp.exp(th)), 1.0))
    m = tp.matmul(sq, k)                                         # [2,2]
    bm = tp.bmm(tp.reshape(m, [1, 2, 2]), tp.reshape(tp.transpose(m), [1, 2, 2]))
    sm = tp.softmax(bm, axis=2)
    sl = tp.slice(sm, [0, 0, 0], [1, 2, 1])
    cc = tp.concat(sl, sl, axis=2)
    loss = tp.add(tp.sum(cc), tp.mean(r))
    # the ops of real models: axis reductions, |x|, maximum, log_softmax, gathers by ids,
    # a broadcast batch
    ids = tp.const(np.array([[1, 0], [1, 1]]), name="ids", dtype="i64")
    emb = tp.take(tp.maximum(tp.abs(t), r), ids)                  # [2,2,3]
    lsm = tp.log_softmax(tp.max(emb, axis=1, keepdims=True), axis=2)     # [2,1,3]
    picked = tp.take_along(lsm, tp.const(np.array([[[1]], [[2]]]), dtype="i64"), axis=2)
    bb = tp.bmm(bm, tp.reshape(tp.sum(emb, axis=0), [1, 2, 3]))  # [1,2,2] @ [1,2,3]
    bc = tp.bmm(tp.const(rng.random((3, 1, 2))), bb)             # [3,1,2] @ [1,2,3]
    extra = tp.add(tp.mean(picked, axis=0), tp.mean(bc, axis=-1, keepdims=True))
    loss = tp.add(loss, tp.sum(extra))
    # layout: a general permute and a stepped slice
    st = tp.slice(tp.permute(emb, [2, 0, 1]), [0, 0, 0], [3, 2, 2], [2, 1, 2])   # [2,2,1]
    loss = tp.add(loss, tp.sum(st))
    # masks and integer data: cross entropy with ignore_index from an i64 input slot
    # (comparisons, where = keep + keep_not, ids computed on the tape), to_f64
    tgt = tp.const(np.array([2, -100]), name="target", dtype="i64")
    valid = tp.ne(tgt, -100)
    cls = tp.reshape(tp.where(valid, tgt, 0), [2, 1])
    nll = tp.neg(tp.take_along(tp.log_softmax(t, axis=1), cls, axis=1))          # [2,1]
    ce = tp.div(tp.sum(tp.where(tp.reshape(valid, [2, 1]), nll, 0.0)), tp.sum(valid))
    masks = tp.add(tp.logical_or(tp.lt(t, r), tp.le(t, 0.0)),
                   tp.logical_and(tp.gt(t, c), tp.ge(c, 0.5)))
    picks = tp.mul(tp.eq(tgt, tp.const(np.array([2, 1]), dtype="i64")), tp.to_f64(tgt))
    loss = tp.add(loss, tp.add(ce, tp.add(tp.sum(tp.mul(masks, t)), tp.sum(picks))))
    # the elementwise math of imported models (issue 20)
    u = tp.add(tp.erf(t), tp.mul(tp.sin(t), tp.cos(t)))
    u = tp.add(tp.add(u, tp.expm1(th)), tp.log1p(sq))
    u = tp.add(tp.add(u, tp.rsqrt(sq)), tp.pows(sq, 1.7))
    u = tp.add(u, tp.pow(sq, tp.adds(th, 0.5)))                   # a tensor exponent
    u = tp.add(tp.minimum(u, r), tp.clamp(t, -0.5, 0.5))
    u = tp.add(u, tp.detach(tp.mul(u, t)))                       # a stop-gradient
    v = tp.muls(t, 2.5)                                          # rounding: no gradient
    u = tp.add(u, tp.add(tp.add(tp.floor(v), tp.ceil(v)), tp.add(tp.trunc(v), tp.round(v))))
    u = tp.add(u, tp.mul(tp.fmods(v, 0.75), tp.mods(v, -0.75)))        # fmod, remainder
    u = tp.add(u, tp.add(tp.erfc(t), tp.atan2(tp.atan(t), c)))        # erfc, atan, atan2
    loss = tp.add(loss, tp.sum(u))
    # the convolutional ops, on emb as one two-channel 2x3 image
    img = tp.reshape(emb, [1, 2, 2, 3])
    conv = tp.conv2d(img, tp.const(rng.random((2, 1, 2, 2)) - 0.5), stride=[1, 1],
                     padding=[1, 0], dilation=[1, 1], groups=2)             # [1,2,3,2]
    mp = tp.max_pool2d(conv, kernel=[2, 2], stride=[1, 1], padding=[1, 1], ceil_mode=True)
    ap = tp.avg_pool2d(conv, kernel=[2, 2], stride=[2, 2], ceil_mode=True,
                       count_include_pad=False)
    loss = tp.add(loss, tp.add(tp.mean(mp), tp.mean(ap)))
    # take's adjoint: emb's rows summed back by the same ids (row 2 written by none)
    sc = tp.scatter(emb, ids, rows=3)                                # [3,3]
    loss = tp.add(loss, tp.sum(tp.mul(sc, sc)))
    # counter-based numbers: dropout reads the rng slot (uniform, ge, where)
    loss = tp.add(loss, tp.sum(tp.mul(gt.nn.dropout(emb, 0.5), emb)))
    # cast: a float32 detour (emb rounded to f32, squared in binary32, widened back)
    e32 = tp.cast(emb, "f32")
    loss = tp.add(loss, tp.cast(tp.sum(tp.mul(e32, e32)), "f64"))
    return tp, loss, {"bmm": bm, "softmax": sm, "take": emb, "ce": ce}


COMMANDS = (["inspect"], ["backward", "--json"], ["fd-check"])


def base_files() -> dict:
    tp, loss, outputs = all_ops_tape()
    files = {"allops": dumps(tp, loss=loss, outputs=outputs, values=True)}
    for name in ("logistic", "mlp_regression", "attention"):
        files[name] = (SAMPLES / f"{name}.msgpack").read_bytes()
    return files


def pack(doc) -> bytes:
    return msgpack.packb(doc, use_bin_type=True)


def leaf_bytes(shape) -> dict:
    return {"op": "const", "a": -1, "b": -1, "s": 0.0, "shape": list(shape),
            "data": np.zeros(shape).astype("<f8").tobytes()}


def tape_doc(nodes, **top) -> dict:
    return {"format": "gradtool-tape", "version": 1, "nodes": nodes, **top}


# ── node-level mutations ───────────────────────────────────────────────────

def node_mutations(node: dict, i: int, doc: dict):
    """(label, new node or a function of the doc) pairs; every one invalid at node i."""
    op = node["op"]
    leaf = op in ("param", "const")
    shape = node["shape"]
    yield "op unknown", {**node, "op": "frobnicate"}
    yield "op int", {**node, "op": 3}
    yield "op missing", {k: v for k, v in node.items() if k != "op"}
    yield "shape missing", {k: v for k, v in node.items() if k != "shape"}
    yield "shape str", {**node, "shape": "[1]"}
    yield "shape empty", {**node, "shape": []}
    yield "shape zero", {**node, "shape": [0] + shape[1:]}
    yield "shape negative", {**node, "shape": [-3] + shape[1:]}
    yield "shape float", {**node, "shape": [float(d) for d in shape]}
    yield "shape extra dim", {**node, "shape": shape + [2]}
    yield "shape doubled", {**node, "shape": [shape[0] * 2] + shape[1:]}
    yield "shape huge", {**node, "shape": [2 ** 40, 2 ** 40]}
    yield "shape 64-bit", {**node, "shape": [2 ** 64 - 1]}
    yield "shape rank 40", {**node, "shape": [1] * 40}
    yield "node int", 5
    yield "node array", [node["op"], shape]
    yield "a self", {**node, "a": i}
    yield "a forward", {**node, "a": i + 1}
    yield "a -2", {**node, "a": -2}
    yield "a float", {**node, "a": float(node.get("a", -1))}
    yield "a str", {**node, "a": "0"}
    yield "b bool", {**node, "b": True}
    yield "b forward", {**node, "b": i + 7}
    yield "s str", {**node, "s": "1.5"}
    yield "unknown op of another arity", {**node, "op": "concat" if OPS_ARITY[op] != 2 else "neg"}
    if leaf:
        data = node["data"]
        yield "a on leaf", {**node, "a": 0}
        yield "data truncated", {**node, "data": data[:-1]}
        yield "data one short", {**node, "data": data[:-8]}
        yield "data extra", {**node, "data": data + bytes(8)}
        yield "data empty", {**node, "data": b""}
        yield "data str", {**node, "data": "abc"}
        yield "data list", {**node, "data": [1.0] * (len(data) // 8)}
        yield "data missing", {k: v for k, v in node.items() if k != "data"}
        yield "value on leaf", {**node, "value": data}
        yield "axis on leaf", {**node, "axis": 0}
        yield "s on leaf", {**node, "s": 2.0}
        yield "dtype unknown", {**node, "dtype": "f16"}
        yield "dtype f32 of f64 data", {**node, "dtype": "f32"}
        yield "dtype int", {**node, "dtype": 8}
        yield "name empty", {**node, "name": ""}
        yield "name int", {**node, "name": 7}
        yield "name bin", {**node, "name": b"w"}
        if op == "param":
            yield "l2 negative", {**node, "l2": -1e-4}
            yield "l2 nan", {**node, "l2": float("nan")}
            yield "l2 inf", {**node, "l2": float("inf")}
            yield "l2 str", {**node, "l2": "1e-4"}
            yield "dtype on param", {**node, "dtype": "i64"}
        else:
            yield "l2 on const", {**node, "l2": 0.0}
        earlier = [n.get("name") for n in doc["nodes"][:i] if isinstance(n, dict)]
        earlier = [n for n in earlier if n]
        if earlier:
            yield "duplicate name", {**node, "name": earlier[0]}
    else:
        yield "data on op", {**node, "data": bytes(8)}
        yield "name on op", {**node, "name": "z"}
        yield "l2 on op", {**node, "l2": 0.0}
        if node.get("op") == "cast":          # its target: the other float dtype only
            yield "cast to i64", {**node, "dtype": "i64"}
            yield "cast to its input's dtype", {**node, "dtype": "f32" if node.get(
                "dtype") == "f64" else "f64"}
        else:
            yield "dtype on op", {**node, "dtype": "f64"}
        yield "a missing", {k: v for k, v in node.items() if k != "a"}
        if "value" in node:
            yield "value truncated", {**node, "value": node["value"][:-3]}
            yield "value str", {**node, "value": "x"}
        if OPS[op].scalar_operand:
            yield "s missing type", {**node, "s": None}
        else:
            yield "s nonzero", {**node, "s": 1.5}
        if OPS_ARITY[op] == 1:
            yield "b on unary", {**node, "b": 0}
        else:
            yield "b missing", {k: v for k, v in node.items() if k != "b"}
        attrs = {at.name: at for at in OPS[op].attrs}
        if "axis" in attrs:
            yield "axis too big", {**node, "axis": 99}
            yield "axis negative", {**node, "axis": -1}
            yield "axis float", {**node, "axis": 1.0}
            if attrs["axis"].file_required:
                yield "axis missing", {k: v for k, v in node.items() if k != "axis"}
        else:
            yield "axis stray", {**node, "axis": 0}
        if "keepdims" in attrs:
            yield "keepdims int", {**node, "keepdims": 1}
            yield "keepdims str", {**node, "keepdims": "yes"}
        else:
            yield "keepdims stray", {**node, "keepdims": False}
        ids = [k for k, n in enumerate(doc["nodes"][:i])
               if isinstance(n, dict) and n.get("dtype") == "i64"]
        if OPS[op].id_inputs:
            yield "ids from a float node", {**node, "b": node["a"]}
            yield "table from the ids", {**node, "a": node["b"]}
        elif ids:
            yield "ids read as floats", {**node, "a": ids[0]}
        if op == "slice":
            yield "starts short", {**node, "starts": node["starts"][:-1]}
            yield "stops past end", {**node, "stops": [d + 100 for d in node["stops"]]}
            yield "empty slice", {**node, "stops": list(node["starts"])}
            yield "starts missing", {k: v for k, v in node.items() if k != "starts"}
            if "steps" in node:
                yield "step zero", {**node, "steps": [0] * len(node["steps"])}
                yield "steps short", {**node, "steps": node["steps"][:-1]}
        else:
            yield "starts stray", {**node, "starts": [0]}
        if op == "permute":
            yield "dims repeated", {**node, "dims": [0] * len(node["dims"])}
            yield "dims short", {**node, "dims": node["dims"][:-1]}
            yield "dims missing", {k: v for k, v in node.items() if k != "dims"}
        else:
            yield "dims stray", {**node, "dims": [0]}


OPS_ARITY = {name: spec.arity for name, spec in OPS.items()}


def nodes_to_mutate(name: str, doc: dict) -> list:
    """Every node of the all-ops tape; the first node of each op in the samples."""
    if name == "allops":
        return list(range(len(doc["nodes"])))
    first = {}
    for i, n in enumerate(doc["nodes"]):
        first.setdefault((n["op"], "name" in n), i)
    return sorted(first.values())


def node_cases(bases: dict):
    for name, raw in bases.items():
        doc = msgpack.unpackb(raw)
        for i in nodes_to_mutate(name, doc):
            for label, new in node_mutations(doc["nodes"][i], i, doc):
                mutated = copy.copy(doc)
                mutated["nodes"] = list(doc["nodes"])
                mutated["nodes"][i] = new
                yield f"{name} node {i} {label}", pack(mutated), i


# ── document-level mutations ───────────────────────────────────────────────

def top_cases(bases: dict):
    raw = bases["mlp_regression"]
    doc = msgpack.unpackb(raw)
    n = len(doc["nodes"])
    pred = doc["outputs"]["pred"]

    def edit(**changes):
        out = {**doc, **changes}
        return pack({k: v for k, v in out.items() if v is not DROP})

    yield "format wrong", edit(format="gradtool-tap"), None
    yield "format bin", edit(format=b"gradtool-tape"), None
    yield "format missing", edit(format=DROP), None
    yield "version 2", edit(version=2), None
    yield "version 0", edit(version=0), None
    yield "version str", edit(version="1"), None
    yield "version float", edit(version=1.0), None
    yield "version bool", edit(version=True), None
    yield "version missing", edit(version=DROP), None
    yield "nodes missing", edit(nodes=DROP), None
    yield "nodes empty", edit(nodes=[]), None
    yield "nodes map", edit(nodes={}), None
    yield "nodes str", edit(nodes="nodes"), None
    yield "loss out of range", edit(loss=n), None
    yield "loss huge", edit(loss=2 ** 64 - 1), None
    yield "loss negative", edit(loss=-1), None
    yield "loss str", edit(loss="13"), None
    yield "loss float", edit(loss=float(n - 1)), None
    yield "loss not scalar", edit(loss=pred), pred
    yield "outputs array", edit(outputs=[pred]), None
    yield "outputs out of range", edit(outputs={"pred": n + 5}), None
    yield "outputs negative", edit(outputs={"pred": -1}), None
    yield "outputs str", edit(outputs={"pred": "10"}), None
    yield "meta int", edit(meta=5), None
    yield "meta array", edit(meta=[1]), None
    yield "optimizer str", edit(optimizer="adam"), None
    yield "state array", edit(state=["x"]), None
    yield "state value int", edit(state={"x": 10}), None
    yield "state value empty", edit(state={"x": ""}), None
    yield "state no leaf", edit(state={"ghost": "pred"}), None
    yield "state a param", edit(state={"W1": "pred"}), None
    yield "state unknown output", edit(state={"y": "logits"}), None
    yield "state shape mismatch", edit(state={"x": "pred"}), None
    deep = {}
    for _ in range(100):
        deep = {"d": deep}
    yield "meta deep nesting", edit(meta=deep), None
    for top in ([], 5, "gradtool-tape", None, b"bin", True, 1.5, [doc]):
        yield f"top level {type(top).__name__}", pack(top), None
    yield "empty file", b"", None
    yield "text", b"hello, world\n", None
    yield "json text", b'{"format": "gradtool-tape", "version": 1, "nodes": []}', None
    yield "gzip magic", b"\x1f\x8b\x08\x00" + bytes(20), None
    yield "extra data", raw + b"\x00", None
    yield "two documents", raw + raw, None
    yield "invalid type byte", b"\xc1", None
    yield "bad utf-8 key", b"\x81\xa2\xff\xfe\x01", None
    yield "int map key", b"\x81\x01\x02", None
    yield "bin map key", pack({b"format": "gradtool-tape"}), None
    yield "ext type", pack({**doc, "meta": {"t": msgpack.ExtType(5, b"xx")}}), None
    yield "timestamp", pack({**doc, "meta": {"t": msgpack.Timestamp(1, 0)}}), None
    yield "array header bomb", b"\x81\xa5nodes\xdd\xff\xff\xff\xff", None
    yield "map header bomb", b"\xdf\xff\xff\xff\xff", None
    yield "bin header bomb", b"\x81\xa4data\xc6\xff\xff\xff\xff\x00", None
    yield "str header bomb", b"\x81\xdb\xff\xff\xff\xff", None
    yield "nested array headers", b"\xdd\x00\x10\x00\x00" * 900, None
    yield "deep msgpack nesting", b"\x91" * 5000 + b"\x00", None


DROP = object()


def bomb_cases():
    # A leaf claiming 2^62 elements with 8 bytes of data: rejected before np.frombuffer.
    yield "leaf claims 2^62 elements", pack(tape_doc([
        {**leaf_bytes([1]), "shape": [2 ** 31, 2 ** 31]}])), 0
    # [1000,1] + [1,1000] -> 10^6, reshaped, + [1,20000] -> 2*10^10 elements (160 GB).
    yield "broadcast bomb", pack(tape_doc([
        leaf_bytes([1000, 1]), leaf_bytes([1, 1000]),
        {"op": "add", "a": 0, "b": 1, "s": 0.0, "shape": [1000, 1000]},
        {"op": "reshape", "a": 2, "b": -1, "s": 0.0, "shape": [1000000, 1]},
        leaf_bytes([1, 20000]),
        {"op": "add", "a": 3, "b": 4, "s": 0.0, "shape": [1000000, 20000]},
        {"op": "sum", "a": 5, "b": -1, "s": 0.0, "shape": [1]}])), 5
    # [4096,4096] built by broadcast (within the element budget), then squared by
    # matmul: 6.9*10^10 multiply-adds, i.e. a hang, from a 65 KB file.
    yield "matmul work bomb", pack(tape_doc([
        leaf_bytes([4096, 1]), leaf_bytes([1, 4096]),
        {"op": "add", "a": 0, "b": 1, "s": 0.0, "shape": [4096, 4096]},
        {"op": "matmul", "a": 2, "b": 2, "s": 0.0, "shape": [4096, 4096]},
        {"op": "sum", "a": 3, "b": -1, "s": 0.0, "shape": [1]}])), 3
    # bmm the same way.
    yield "bmm work bomb", pack(tape_doc([
        leaf_bytes([1, 4096, 1]), leaf_bytes([1, 1, 4096]),
        {"op": "add", "a": 0, "b": 1, "s": 0.0, "shape": [1, 4096, 4096]},
        {"op": "bmm", "a": 2, "b": 2, "s": 0.0, "shape": [1, 4096, 4096]},
        {"op": "sum", "a": 3, "b": -1, "s": 0.0, "shape": [1]}])), 3


def truncation_cases(bases: dict):
    for name, raw in bases.items():
        for cut in sorted(set(np.linspace(0, len(raw) - 1, 50).astype(int).tolist())):
            yield f"{name} truncated at {cut}", raw[:cut], None


def all_invalid_cases():
    bases = base_files()
    cases = list(node_cases(bases)) + list(top_cases(bases)) + list(bomb_cases()) \
        + list(truncation_cases(bases))
    # A bin map key inside the node list.
    doc = msgpack.unpackb(bases["logistic"])
    bad_node = {**doc["nodes"][0]}
    bad_node[b"x"] = bad_node.pop("op")
    cases.append(("bin key in a node", pack({**doc, "nodes": [bad_node] + doc["nodes"][1:]}),
                  None))
    return cases


def assert_clean_reject(result, label, fname, node):
    context = f"{label}: exit {result.exit_code}, stdout {result.stdout[:200]!r}, " \
              f"stderr {result.stderr[:300]!r}, exception {result.exception!r}"
    assert result.exit_code == 2, context
    assert result.exception is None or isinstance(result.exception, SystemExit), context
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), context
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, context
    assert result.stdout == "", context
    assert lines[0].startswith(f"gradtool: {fname}: "), context
    if node is not None:
        assert f": node {node}: " in lines[0], context


# ── structure-aware mutations, for the fuzz test ───────────────────────────

OP_NAMES = sorted(OPS)
NODE_KEYS = ("op", "a", "b", "s", "shape", "data", "name", "l2", "dtype", "axis", "keepdims",
             "starts", "stops", "value")
TOP_KEYS = ("format", "version", "nodes", "loss", "outputs", "state", "meta", "optimizer")


class Mutator:
    """Seeded mutations of a decoded tape file.  :meth:`mutate` returns a mutated deep
    copy; each of its 1-3 edits is chosen among targeted edits (the node fields, ids,
    shapes, attributes, data lengths, the format tag and version, loss and outputs,
    the node list's length and order) and generic ones at a random place in the
    structure (delete, retype, rename a key, nest, resize)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def pick(self, items):
        return items[int(self.rng.integers(len(items)))]

    def mutate(self, doc: dict) -> dict:
        doc = copy.deepcopy(doc)
        edits = (self.node_field, self.node_field, self.node_field, self.node_id,
                 self.node_shape, self.node_data, self.node_list, self.top, self.anywhere,
                 self.anywhere)
        if isinstance(doc.get("optimizer"), dict):        # a checkpoint: its state, mostly
            edits = (self.state,) * 10 + edits
        for _ in range(int(self.rng.integers(1, 4))):
            self.pick(edits)(doc)
        return doc

    def state(self, doc):
        """An edit inside a checkpoint's optimizer state or training position."""
        state = doc.get("optimizer")
        if not isinstance(state, dict):          # an earlier edit replaced it
            return self.anywhere(doc)
        inside = state.get("position") if isinstance(state.get("position"), dict) \
            and self.rng.integers(2) else state
        if not isinstance(inside, dict) or not inside:
            return self.anywhere(doc)
        key = self.pick(list(inside))             # insertion order: deterministic
        how = self.pick(("value", "near", "retype", "drop", "anywhere"))
        value = inside[key]
        if how == "value":
            inside[key] = self.value()
        elif how == "near" and isinstance(value, (int, float)) and not isinstance(value, bool):
            inside[key] = self.pick((value + 1, value - 1, value * 1.5, -value, value / 0.9,
                                     float("nan")))
        elif how == "retype":
            inside[key] = self.retype(value)
        elif how == "drop":
            del inside[key]
        else:
            self.anywhere(inside)

    # values
    def value(self, depth: int = 0):
        kind = self.pick(("int", "int", "float", "str", "bytes", "bool", "nil", "list",
                          "map", "deep"))
        if kind == "int":
            return int(self.pick((-2, -1, 0, 1, 2, 3, 7, 31, 33, 2 ** 31, 2 ** 40, 2 ** 63 - 1,
                                  -2 ** 63, 2 ** 64 - 1)))
        if kind == "float":
            return float(self.pick((0.0, -0.0, 1.0, 1.5, -3.25, 1e300, 5e-324, math.inf,
                                    -math.inf, math.nan)))
        if kind == "str":
            return self.pick(("", "x", "W1", "tanh", "\x00", "a\x00b", "é" * 3, "x" * 70000,
                              "gradtool-tape"))
        if kind == "bytes":
            return bytes(int(self.pick((0, 1, 7, 8, 16, 64))))
        if kind == "bool":
            return bool(self.rng.integers(2))
        if kind == "nil" or depth > 2:
            return None
        if kind == "list":
            return [self.value(depth + 1) for _ in range(int(self.rng.integers(0, 4)))]
        if kind == "map":
            return {self.pick(NODE_KEYS + ("zz",)): self.value(depth + 1)
                    for _ in range(int(self.rng.integers(0, 3)))}
        deep = 0
        for _ in range(int(self.pick((5, 31, 40)))):
            deep = [deep]
        return deep

    def retype(self, value):
        """The same content in another msgpack type (int 3 -> 3.0 -> "3" -> b"3" ...)."""
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return self.pick((float(value), str(value), [value], value != 0))
        if isinstance(value, float):
            return self.pick((int(value) if math.isfinite(value) else 0, str(value)))
        if isinstance(value, str):
            return self.pick((value.encode(), [value], len(value)))
        if isinstance(value, bytes):
            return self.pick((list(value[:8]), value.decode("latin-1"), len(value)))
        if isinstance(value, list):
            return self.pick(({str(k): v for k, v in enumerate(value)}, tuple(value) and
                              value[0], len(value)))
        if isinstance(value, dict):
            return list(value.values())
        return self.value()

    # targeted edits
    def _node(self, doc):
        nodes = doc.get("nodes")
        if isinstance(nodes, list) and nodes:
            k = int(self.rng.integers(len(nodes)))
            if isinstance(nodes[k], dict):
                return nodes, k
        return None, None

    def node_field(self, doc):
        nodes, k = self._node(doc)
        if nodes is None:
            return self.anywhere(doc)
        node, key = nodes[k], self.pick(NODE_KEYS)
        how = self.pick(("drop", "value", "retype", "op", "near"))
        if how == "drop":
            node.pop(key, None)
        elif how == "op":
            node["op"] = self.pick(OP_NAMES + ["tanhh", "", "Add", "param "])
        elif how == "retype" and key in node:
            node[key] = self.retype(node[key])
        elif how == "near" and isinstance(node.get(key), (int, float)) \
                and not isinstance(node.get(key), bool):
            node[key] = node[key] + self.pick((-1, 1, -2, 2))
        else:
            node[key] = self.value()

    def node_id(self, doc):
        nodes, k = self._node(doc)
        if nodes is None:
            return self.anywhere(doc)
        key = self.pick(("a", "b", "a", "axis"))
        nodes[k][key] = int(self.pick((-3, -1, 0, k - 1, k, k + 1, len(nodes), 2 ** 62)))

    def node_shape(self, doc):
        nodes, k = self._node(doc)
        if nodes is None:
            return self.anywhere(doc)
        node = nodes[k]
        key = self.pick(("shape", "shape", "starts", "stops"))
        dims = list(node.get(key, [1])) if isinstance(node.get(key), list) else [1]
        how = self.pick(("add", "drop", "set", "many", "swap"))
        if how == "add":
            dims.insert(int(self.rng.integers(len(dims) + 1)), int(self.pick((1, 2, 3))))
        elif how == "drop" and dims:
            dims.pop(int(self.rng.integers(len(dims))))
        elif how == "set" and dims:
            dims[int(self.rng.integers(len(dims)))] = int(self.pick((0, -1, 2, 3, 2 ** 31,
                                                                     2 ** 40, 64)))
        elif how == "many":
            dims = [1] * int(self.pick((32, 33, 40)))
        else:
            dims = dims[::-1]
        node[key] = dims

    def node_data(self, doc):
        nodes, k = self._node(doc)
        if nodes is None:
            return self.anywhere(doc)
        node = nodes[k]
        key = "data" if "data" in node else "value"
        data = node.get(key, b"")
        data = data if isinstance(data, bytes) else b""
        node[key] = self.pick((data[:-1], data[:-8], data + bytes(8), data + b"\x01",
                               bytes(len(data)), b"", data[: len(data) // 2]))

    def node_list(self, doc):
        nodes = doc.get("nodes")
        if not isinstance(nodes, list) or not nodes:
            return self.anywhere(doc)
        k = int(self.rng.integers(len(nodes)))
        how = self.pick(("dup", "drop", "swap", "truncate", "reverse", "append"))
        if how == "dup":
            nodes.insert(k, copy.deepcopy(nodes[k]))
        elif how == "drop":
            nodes.pop(k)
        elif how == "swap":
            j = int(self.rng.integers(len(nodes)))
            nodes[k], nodes[j] = nodes[j], nodes[k]
        elif how == "truncate":
            del nodes[k:]
        elif how == "reverse":
            nodes.reverse()
        else:
            nodes.append(copy.deepcopy(nodes[k]))

    def top(self, doc):
        key = self.pick(TOP_KEYS)
        how = self.pick(("drop", "value", "retype", "version", "loss", "outputs"))
        if how == "drop":
            doc.pop(key, None)
        elif how == "version":
            doc["version"] = self.pick((0, 2, -1, "1", 1.0, True, 2 ** 64 - 1))
        elif how == "loss":
            n = len(doc["nodes"]) if isinstance(doc.get("nodes"), list) else 3
            doc["loss"] = int(self.pick((-1, 0, n - 2, n, 2 ** 62)))
        elif how == "outputs":
            doc["outputs"] = {self.pick(("pred", "", "x\x00")): int(self.pick((0, -1, 999)))}
        elif how == "retype" and key in doc:
            doc[key] = self.retype(doc[key])
        else:
            doc[key] = self.value()

    # generic edits anywhere
    def _places(self, doc):
        """(container, key) pairs of every value in the document but inside bin data."""
        places, stack = [], [doc]
        while stack:
            obj = stack.pop()
            items = obj.items() if isinstance(obj, dict) else enumerate(obj)
            for key, value in items:
                places.append((obj, key))
                if isinstance(value, (dict, list)):
                    stack.append(value)
        return places

    def anywhere(self, doc):
        places = self._places(doc)
        if not places:
            return
        obj, key = self.pick(places)
        how = self.pick(("drop", "value", "retype", "nest", "rename", "binkey"))
        if how == "drop":
            del obj[key]
        elif how == "value":
            obj[key] = self.value()
        elif how == "retype":
            obj[key] = self.retype(obj[key])
        elif how == "nest":
            obj[key] = self.pick(([obj[key]], {"x": obj[key]}))
        elif isinstance(obj, dict) and how == "rename":
            obj[self.pick(NODE_KEYS + TOP_KEYS + ("zz", "Op", "shape "))] = obj.pop(key)
        elif isinstance(obj, dict):
            obj[str(key).encode()] = obj.pop(key)
        else:
            obj.insert(key, self.value())


def pack_any(doc) -> bytes:
    """msgpack bytes of a mutated document (bin keys and all)."""
    return msgpack.packb(doc, use_bin_type=True, strict_types=False)


# ── running under limits ───────────────────────────────────────────────────

def limit_resources(memory_bytes: int, cpu_seconds: int):
    """A preexec_fn: cap the child's address space and CPU time."""
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    return apply


def run_limited(args, *, memory_bytes: int = 1 << 30, cpu_seconds: int = 60, timeout=120,
                **kwargs):
    """``subprocess.run`` with the memory and CPU caps and a wall-clock timeout."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env,
                          preexec_fn=limit_resources(memory_bytes, cpu_seconds), **kwargs)


GRADTOOL = [sys.executable, "-c", "from gradtool.cli import main; main()"]


def stderr_through_a_terminal(args, timeout=120) -> tuple:
    """Run ``args`` with stderr on a pseudo-terminal; (exit status, what it wrote there)."""
    import pty
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=timeout)
    proc.stdout.close()
    os.close(master)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


# ── a batch of CLI runs in one limited worker process ─────────────────────

def cli_batch(jobs_path: str) -> None:
    """Worker: for each ``[args...]`` in the JSON list at ``jobs_path``, run the gradtool
    command in this process (click's CliRunner) and print one JSON line: the exit
    status, stderr's lines, whether a traceback or an internal error showed, and the
    exception if one escaped."""
    import json

    from click.testing import CliRunner

    from gradtool.cli import main
    runner = CliRunner()
    with open(jobs_path) as f:
        jobs = json.load(f)
    for args in jobs:
        result = runner.invoke(main, args)
        escaped = result.exception
        if isinstance(escaped, SystemExit):
            escaped = None
        print(json.dumps({"args": args, "status": result.exit_code,
                          "stderr": result.stderr.splitlines(),
                          "traceback": "Traceback" in result.stderr + result.stdout,
                          "escaped": None if escaped is None else repr(escaped)}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["cli-batch"]:
        cli_batch(sys.argv[2])


def ptx_entries(text: str) -> dict:
    """{kernel name: its PTX body} of an nvcc --ptx output."""
    import re
    parts = re.split(r"\.entry\s+(\w+)\(", text)
    return dict(zip(parts[1::2], parts[2::2]))


def assert_fma_only_in_inner_products(text: str, dtype: str, inner: set) -> None:
    """The FMA contract in PTX: every kernel in ``inner`` (an inner product) multiplies
    and adds with fma.rn.f64 (f32: fma.rn.f32) and no separate multiply of that type;
    every other kernel has no fma of any kind (nothing else is contracted)."""
    import re
    entries = ptx_entries(text)
    assert inner <= set(entries), (inner, sorted(entries))
    ty = "f32" if dtype == "f32" else "f64"
    for name, body in entries.items():
        if name in inner:
            assert re.search(rf"\bfma\.rn\.{ty}\b", body), f"{name}: no fma.rn.{ty}"
            assert not re.search(r"\bfma\.(?!rn\.)", body), f"{name}: an fma not .rn"
        else:
            assert not re.search(r"\bfma\.", body), f"{name}: nvcc fused a multiply-add"


# ── fdlibm: inputs, bit views, accuracy and parity helpers (test_fdlibm*.py) ──────────
from conftest import bits, require_c_compiler  # noqa: E402
from gradtool.fdlibm import _common, _expm1, _log  # noqa: E402

HEADER = Path(gt.__file__).resolve().parent / "csrc" / "gt_math.h"

CC_FLAGS = {
    "O2": ["-std=c99", "-O2", "-ffp-contract=off"],
    # FMA hardware enabled: -ffp-contract=off must still keep every op separate
    "O3-native": ["-std=c99", "-O3", "-march=native", "-ffp-contract=off"],
}


CANON_NAN = 0x7FF8000000000000
U64 = np.uint64


def bits1(v) -> int:
    return int(np.float64(v).view(U64))


def from_bits(b) -> np.ndarray:
    return np.asarray(b, dtype=U64).view(np.float64)


def assert_special_values(impl, cases) -> None:
    """``impl`` (a numpy function) on each case's input gives its want to the bit, every
    NaN the canonical one: ``cases`` pairs (x, want)."""
    xs = np.array([c[0] for c in cases])
    want = np.array([c[1] for c in cases])
    want_bits = bits(want).copy()
    want_bits[np.isnan(want)] = CANON_NAN
    for x, g, w in zip(xs, bits(impl(xs)), want_bits, strict=True):
        assert g == w, (f"{impl.__name__}({x!r}) = {float(from_bits(g))!r} [{int(g):#018x}], "
                        f"want {float(from_bits(w))!r} [{int(w):#018x}]")


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------
def random_doubles(rng, n, emin, emax, sign=True):
    """Random mantissas with biased exponents uniform in [emin, emax]."""
    e = rng.integers(emin, emax + 1, n).astype(U64)
    m = rng.integers(0, 1 << 52, n, dtype=U64)
    s = (rng.integers(0, 2, n).astype(U64) << U64(63)) if sign else np.zeros(n, U64)
    return from_bits(s | (e << U64(52)) | m)


def around(rng, centres, n_each, spread):
    """Doubles within +-spread ulps (bit patterns) of each centre, both signs."""
    c = bits(np.asarray(centres, dtype=np.float64)).astype(np.int64)
    d = rng.integers(-spread, spread + 1, (c.size, n_each))
    b = (c[:, None] + d).reshape(-1).astype(U64)
    x = from_bits(b)
    return np.concatenate([x, -x])


def hiword(hw):
    return float(from_bits(np.array([hw << 32], U64))[0])


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 5e-324, -5e-324,
                     2.2250738585072014e-308, -2.2250738585072014e-308, 1.7976931348623157e308,
                     -1.7976931348623157e308, _common.O_THRESHOLD, _common.U_THRESHOLD, 22.0,
                     -22.0, 2.0 ** -54, 2.0 ** -55, 2.0 ** -28, 0.5, 2.0])
# a NaN with a payload and a signalling NaN, both signs
SPECIALS = np.concatenate([SPECIALS, from_bits(np.array(
    [0x7FF0000000000001, 0xFFF0000000000001, 0x7FF8DEADBEEF0000, 0xFFFC000000000123], U64))])


# tanh's k = trunc(2|x|/ln2 + 0.5) steps at |x| = (k - 1/2)*ln2/2, 1 <= k <= 63
TANH_K_STEPS = (np.arange(1, 64) - 0.5) * _common.LN2_HI / 2
# inputs where fdlibm's s_tanh.c is more than 2 ulp from the exact value
TANH_FDLIBM_WORST = np.array([0.2292752006275934, -0.2460230746389431, 0.48229395637779127,
                              0.5425668835808728])


def parity_inputs(seed=1234, n_random=64_000) -> np.ndarray:
    """~200k inputs: every exponent, each function's working range, every
    branch threshold of fdlibm and of the numpy kernels, specials."""
    rng = np.random.default_rng(seed)
    thresholds = [0x40862E42, 0x3FD62E42, 0x3FD62E43, 0x3FF0A2B2, 0x3E300000, 0x4043687A,
                  0x3C900000, 0x3C800000, 0x00100000, 0x7FF00000, 0x40360000, 0x3FF00000,
                  0x3FE00000, 0x3FF6A09E, 0x3FE6A09E, 0x4086232B, 0x408633CE]
    parts = [
        random_doubles(rng, n_random, 0, 2047),                 # everything, incl. inf/NaN
        random_doubles(rng, n_random // 2, 0x3C0, 0x409),       # |x| in [2^-63, 1024)
        rng.uniform(-750.0, 720.0, n_random // 2),
        rng.uniform(-45.0, 45.0, n_random // 4),
        rng.uniform(-1.2, 1.2, n_random // 4),
        random_doubles(rng, n_random // 4, 0, 0),               # subnormals
        1.0 + rng.uniform(-3e-6, 3e-6, n_random // 8),          # log near 1
        around(rng, [hiword(h) for h in thresholds], 300, 3000),
        around(rng, [_common.O_THRESHOLD, -_common.U_THRESHOLD, -_expm1._EM1_NEG,
                     _common._hex("0x1.62e42fefa39efp-2"), _log._BAND_F1 + 1, _log._BAND_F2 + 1,
                     1 + 2.0 ** -20, 1 - 2.0 ** -21],
               300, 3000),
        around(rng, TANH_K_STEPS, 60, 3000),                  # where tanh's k changes
        2.0 ** np.arange(-1074, 1024, dtype=np.float64),       # every power of two
        np.arange(-60.0, 61.0),
        SPECIALS,
    ]
    return np.concatenate(parts)


# ---------------------------------------------------------------------------
# (a) accuracy against mpmath
# ---------------------------------------------------------------------------
try:
    import mpmath
except ImportError:  # only the accuracy test needs it
    mpmath = None


def ulp_errors(fname, x, y, x2=None):
    """For each y = f(x) (with ``x2``: y = f(x, x2), atan2's argument order): (err, dist)
    where err = |y - f(x)| in units of the
    last place of the exact f(x) (50 digits; ulp(v) = 2^(e-52) for |v| in
    [2^e, 2^(e+1)), 2^-1074 below 2^-1022), and dist = how many doubles y is
    away from the correctly rounded f(x)."""
    mp = mpmath.mp
    f = getattr(mp, fname)
    errs = np.empty(x.size)
    dists = np.zeros(x.size, dtype=np.int64)
    second = [None] * x.size if x2 is None else x2.tolist()
    with mp.workdps(50):
        for i, (xi, yi, x2i) in enumerate(zip(x.tolist(), y.tolist(), second, strict=True)):
            exact = f(mp.mpf(xi)) if x2i is None else f(mp.mpf(xi), mp.mpf(x2i))
            _, e = mp.frexp(exact)                     # exact = m * 2^e, 0.5 <= |m| < 1
            ulp = mp.ldexp(1, max(int(e) - 53, -1074))
            errs[i] = float(abs(mp.mpf(yi) - exact) / ulp)
            if errs[i] > 0.5:                          # walk towards the exact value
                step = np.inf if exact > yi else -np.inf
                cur = yi
                while True:
                    nxt = float(np.nextafter(cur, step))
                    if abs(mp.mpf(nxt) - exact) >= abs(mp.mpf(cur) - exact):
                        break
                    cur = nxt
                    dists[i] += 1
    return errs, dists


def c_parity_outputs(tmp_path: Path, x: np.ndarray, fnames, flags, x2=None) -> np.ndarray:
    """gt_math.h's C twins of ``fnames`` on ``x`` (with ``x2``: of the pairs (x, x2), for
    the two-argument atan2, called as gt_<f>(x[i], x2[i])), compiled with ``flags`` (one of
    CC_FLAGS) and -Werror: an array [len(fnames), x.size].  Skips without a C compiler."""
    import shutil

    import pytest
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler")
    args = "x[i]" if x2 is None else "x[i], x[n + i]"
    calls = "\n".join(f"        y[{k} * n + i] = gt_{f}({args});" for k, f in enumerate(fnames))
    width = 1 if x2 is None else 2
    (tmp_path / "drv.c").write_text(f"""#include <stdio.h>
#include <stdlib.h>
#include "gt_math.h"
/* usage: drv IN OUT -- IN holds {width} * n little-endian doubles (the arguments, one
   block of n each); OUT receives {", ".join("gt_" + f for f in fnames)} of them, n doubles
   each */
int main(int argc, char **argv)
{{
    FILE *fi, *fo;
    long n, i;
    double *x, *y;
    if (argc != 3) return 2;
    fi = fopen(argv[1], "rb");
    if (!fi || fseek(fi, 0, SEEK_END)) return 3;
    n = ftell(fi) / (8 * {width});
    rewind(fi);
    x = malloc({width} * n * sizeof *x);
    y = malloc({len(fnames)} * n * sizeof *y);
    if (!x || !y || (long)fread(x, 8, {width} * n, fi) != {width} * n) return 4;
    fclose(fi);
    for (i = 0; i < n; i++) {{
{calls}
    }}
    fo = fopen(argv[2], "wb");
    if (!fo || (long)fwrite(y, 8, {len(fnames)} * n, fo) != {len(fnames)} * n) return 5;
    fclose(fo);
    return 0;
}}
""")
    exe = tmp_path / "drv"
    cmd = [cc, *CC_FLAGS[flags], "-Wall", "-Wextra", "-pedantic", "-Werror",
           "-I", str(HEADER.parent), str(tmp_path / "drv.c"), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 and flags != "O2" and "march" in res.stderr:
        pytest.skip("compiler rejects -march=native")
    assert res.returncode == 0, res.stderr
    data = x if x2 is None else np.concatenate([x, x2])
    (tmp_path / "in.bin").write_bytes(data.astype("<f8").tobytes())
    subprocess.run([str(exe), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True)
    return np.frombuffer((tmp_path / "out.bin").read_bytes(),
                         dtype="<f8").reshape(len(fnames), x.size)


def assert_strictmath(tmp_path: Path, x: np.ndarray, fnames, x2=None) -> None:
    """fdlibm itself: Java's StrictMath is specified to return fdlibm's bits, so each of
    ``fnames`` (gradtool.fdlibm functions StrictMath has) must give StrictMath's bits on
    ``x`` (with ``x2``: on the pairs (x, x2), for atan2(y, x)), NaN payloads aside.
    Skips without a JDK."""
    import shutil

    import pytest
    from gradtool import fdlibm
    javac, java = shutil.which("javac"), shutil.which("java")
    if javac is None or java is None:
        pytest.skip("no JDK")
    args = "x" if x2 is None else "x, x2"
    calls = " : ".join(f"f == {k} ? StrictMath.{f}({args})" for k, f in enumerate(fnames[:-1]))
    calls = (calls + " : " if calls else "") + f"StrictMath.{fnames[-1]}({args})"
    width = 1 if x2 is None else 2
    (tmp_path / "StrictRef.java").write_text(f"""
import java.nio.*; import java.nio.file.*;
public class StrictRef {{
  public static void main(String[] a) throws Exception {{
    ByteBuffer in = ByteBuffer.wrap(Files.readAllBytes(Paths.get(a[0])))
                              .order(ByteOrder.LITTLE_ENDIAN);
    int n = in.capacity() / {8 * width};
    ByteBuffer out = ByteBuffer.allocate({8 * len(fnames)} * n).order(ByteOrder.LITTLE_ENDIAN);
    for (int f = 0; f < {len(fnames)}; f++)
      for (int i = 0; i < n; i++) {{
        double x = in.getDouble(8 * i);
        double x2 = {width} == 2 ? in.getDouble(8 * (n + i)) : 0.0;
        out.putDouble({calls});
      }}
    Files.write(Paths.get(a[1]), out.array());
  }}
}}
""")
    subprocess.run([javac, "-d", str(tmp_path), str(tmp_path / "StrictRef.java")], check=True,
                   capture_output=True)
    data = x if x2 is None else np.concatenate([x, x2])
    (tmp_path / "in.bin").write_bytes(data.astype("<f8").tobytes())
    subprocess.run([java, "-cp", str(tmp_path), "StrictRef", str(tmp_path / "in.bin"),
                    str(tmp_path / "out.bin")], check=True, capture_output=True)
    ref = np.frombuffer((tmp_path / "out.bin").read_bytes(),
                        dtype="<f8").reshape(len(fnames), x.size)
    for row, fname in enumerate(fnames):
        y = getattr(fdlibm, fname)(x) if x2 is None else getattr(fdlibm, fname)(x, x2)
        same = (bits(y) == bits(ref[row])) | (np.isnan(y) & np.isnan(ref[row]))
        bad = np.flatnonzero(~same)
        if bad.size:
            at = f"{x[bad[0]]!r}" + ("" if x2 is None else f", {x2[bad[0]]!r}")
            raise AssertionError(f"{fname}({at}): ours {y[bad[0]]!r}, "
                                 f"StrictMath {ref[row][bad[0]]!r} ({bad.size} of {x.size})")


# ── the host backend against the tape, every kernel variant (test_ops_*.py) ────────────
from gradtool.device import capture  # noqa: E402

VARIANTS = ["tiled", "per-thread", "per-thread-reversed"]


def backward_grads(tp, loss):
    tp.zero_grad()
    tp.backward(loss)
    return {p.id: np.array(tp.grad(p)) for p in tp.params()}


def host_matches(tp, loss, variant="tiled"):
    """Forward and backward on the host backend give the tape's bits (NaN payloads aside)."""
    require_c_compiler()
    want = backward_grads(tp, loss)
    rp = capture(tp, loss, "host", host_kernels=variant)
    rp.forward()
    rp.backward()
    for i in range(len(tp.nodes)):
        got, ref = np.asarray(rp.value(i), float), np.asarray(tp.values[i], float)
        assert np.array_equal(np.isnan(got), np.isnan(ref)), i
        ok = ~np.isnan(ref)
        assert_bits_equal(got[ok], ref[ok], f"{variant}: node {i} ({tp.nodes[i].op})")
    for pid, g in want.items():
        got = rp.grad(pid)
        assert np.array_equal(np.isnan(got), np.isnan(g)), pid
        assert_bits_equal(got[~np.isnan(g)], g[~np.isnan(g)], f"{variant}: grad {pid}")


def assert_emitted_c_equals_tape(tmp_path: Path, cases, cc: str, *, cflags=()) -> None:
    """Emit each (name, tape, loss) of ``cases`` as C (gradtool.emit.cuda), compile them
    into one harness program with the real C compiler, run it, and compare every loss and
    parameter gradient with the tape's own backward, bit for bit."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import emitc_harness as H
    from gradtool.emit.cuda import emit_cuda, layout

    sources, runs, want = [], [], {}
    for fname, tp, loss in cases:
        sources.append(emit_cuda(tp, loss, name=fname))
        lay = layout(tp, loss)
        runs.append((fname, tp, lay))
        tp.backward(loss)
        want[fname] = (H.to_bits(tp.value(loss)[0]),
                       [H.to_bits(tp.grad(tp.var(i))[0]) for i in lay.params])
    src = tmp_path / "emitted.c"
    src.write_text(H.harness_program(sources, runs))
    exe = tmp_path / "emitted"
    proc = subprocess.run([cc, "-std=c99", "-O2", "-ffp-contract=off", *cflags, "-o",
                           str(exe), str(src), "-lm"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[:2000]
    got = H.parse_output(subprocess.run([str(exe)], capture_output=True, text=True,
                                        check=True).stdout)
    assert set(got) == set(want)
    for fname, (loss_bits, grads) in want.items():
        assert H.same_bits(got[fname]["loss"], loss_bits), fname
        for j, g in enumerate(grads):
            assert H.same_bits(got[fname]["p"][j], g), f"{fname} p[{j}]"


def mpiexec_path():
    """The mpiexec beside this Python (the mpich wheel's) or on PATH; None without it or
    without mpi4py."""
    import importlib.util
    import shutil
    if importlib.util.find_spec("mpi4py") is None:
        return None
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def train_under_mpiexec(tape, args, save: Path, ranks: int = 2) -> bytes:
    """``mpiexec -n RANKS gradtool train TAPE ARGS --save SAVE`` with this checkout first on
    the path, one BLAS thread a rank and no launcher variables inherited from a caller;
    the bytes it saved.  Skips the test without mpi4py or mpiexec."""
    import pytest
    from gradtool.train.distributed import LAUNCHER_RANK_VARS
    mpiexec = mpiexec_path()
    if mpiexec is None:
        pytest.skip("no mpi4py/mpiexec (pip install -e '.[mpi]'): the in-process runs were "
                    "compared")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    for var in LAUNCHER_RANK_VARS + ("GRADTOOL_MPI_WORKER",):
        env.pop(var, None)
    cmd = [mpiexec, "-n", str(ranks), sys.executable, "-c",
           "from gradtool.cli import main; main()", "train", str(tape), *map(str, args),
           "--save", str(save)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return Path(save).read_bytes()


def run_no_fma(script: str, a, b) -> "np.ndarray":
    """Run ``script`` in a fresh interpreter under ``GRADTOOL_NO_FMA=1`` (so every library
    it loads is the libm-fma build) with argv ``a.npy b.npy out.npy``; what it saved."""
    import os
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        np.save(f"{tmp}/a.npy", a)
        np.save(f"{tmp}/b.npy", b)
        env = {**os.environ, "GRADTOOL_NO_FMA": "1", "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-c", script, f"{tmp}/a.npy", f"{tmp}/b.npy",
                        f"{tmp}/c.npy"], env=env, check=True, timeout=600)
        return np.load(f"{tmp}/c.npy")
