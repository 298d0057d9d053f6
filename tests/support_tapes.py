"""Tapes to test with: the repository's paths and samples, per-op inputs from the op
table (:func:`op_case`, :func:`op_tape`: each op's kind says what shapes and attributes
to build, its ``domain`` where its rule is smooth, so a new elementwise op is covered by
every table-driven test without touching this file; a new *kind* of op needs one builder
in :func:`op_case`), and graph builders: :func:`random_graph` (every op),
:func:`random_unary`, :func:`mlp`, :func:`mlp_tape`, :func:`all_ops_tape`, an
independent writer (:func:`write_independent_mlp`) and numpy backprop to check it.
Tests import these through tests/support.py.
"""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np

import gradtool as gt
from gradtool.ops import OPS
from gradtool.tape import Tape


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
