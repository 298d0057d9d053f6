"""The f32 dtype (issue 38) through the recorder, the op table, files, the numpy reference
(the cpu engine), the command line, the device replay and emit-cuda.

Bits: every f32 rule is checked against the float32 contract's own functions
(gradtool.numerics32: fmaf chains, the lane-tree sum, fdlibm rounded once) and numpy's
binary32 ufuncs.  Accuracy: against torch float32 within F32_BOUND (docs/ops.md,
"dtypes"): |ours - torch| <= 64 * eps32 * max(1, max|torch|) per element, which
covers the summation orders' differences (the lane tree against torch's cascade) and
fdlibm against torch's vectorised functions.
"""

from __future__ import annotations

import io
import json

import msgpack
import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal
from gradtool import numerics32 as n32
from gradtool.errors import DtypeError, TapeError, TapeFileError
from gradtool.ops import OPS, infer_dtype
from gradtool.tapefile import dumps, load
from support import TABLE_OPS, assert_one_line_error, op_case, run

EPS32 = float(np.finfo(np.float32).eps)
F32_BOUND = 64 * EPS32


def f32(x):
    return np.asarray(x, dtype=np.float32)


def f32_op_tape(name, rng):
    """op_tape's case with every float input an f32 param: (tape, leaves, out, loss)."""
    inputs, s, attrs = op_case(name, rng)
    tp = gt.Tape()
    leaves = [tp.const(x, dtype="i64") if "ab"[k] in OPS[name].id_inputs
              else tp.const(x, name=gt.RNG_NAME) if OPS[name].rng_input and k == 0
              else tp.param(f32(x), name=f"in{k}") for k, x in enumerate(inputs)]
    out = tp.record(name, *leaves, s=s, attrs=attrs)
    w = tp.const(rng.uniform(0.5, 1.5, tp.value(out).shape), dtype=tp.value(out).dtype.name
                 .replace("float", "f"))
    loss = tp.sum(tp.mul(out, w))
    return tp, leaves, out, loss, s, attrs


# ── the recorder ───────────────────────────────────────────────────────────

def test_leaves_take_the_dtype_of_their_data_and_convert_on_request():
    tp = gt.Tape()
    assert tp.param(np.ones(3, np.float32)).dtype == "f32"
    assert tp.param(np.ones(3)).dtype == "f64"
    assert tp.param([1, 2, 3]).dtype == "f64"                 # integers: float64 as before
    assert tp.const(np.ones(3, np.float32)).dtype == "f32"
    assert tp.const(np.arange(3), dtype="i64").dtype == "i64"
    x = np.array([0.1, 1e-46, 3.5e38, -0.0])                  # rounded once, to nearest even
    c = tp.const(x, dtype="f32")
    with np.errstate(over="ignore"):
        assert_bits_equal(tp.value(c), x.astype(np.float32))
    p = tp.param(np.float32([0.1]), dtype="f64")              # widened exactly
    assert_bits_equal(tp.value(p), np.float32([0.1]).astype(np.float64))
    with pytest.raises(TapeError, match="dtype must be 'f64' or 'f32'"):
        tp.param(np.ones(2), dtype="i64")
    with pytest.raises(TapeError, match="'f64' or 'i64' \\(or 'f32'"):
        tp.const(np.ones(2), dtype="f16")


def test_a_mix_of_f32_and_f64_is_refused_naming_both_dtypes_and_cast():
    tp = gt.Tape()
    a, b = tp.param(np.ones(3, np.float32)), tp.param(np.ones(3))
    for op in ("add", "mul", "maximum", "atan2", "pow", "lt"):
        with pytest.raises(DtypeError) as exc:
            tp.record(op, a, b)
        text = str(exc.value)
        assert "input a is f32 and input b is f64" in text and "tape.cast" in text, text
        assert tp.reset_to(len(tp)) is None
    with pytest.raises(DtypeError, match="input a is f64 and input b is f32"):
        tp.matmul(tp.param(np.ones((2, 3))), tp.param(np.ones((3, 2), np.float32)))
    # a poisoned tape without raise_on_error
    soft = gt.Tape(raise_on_error=False)
    v = soft.add(soft.param(np.ones(2, np.float32)), soft.param(np.ones(2)))
    assert v.poisoned and "input a is f32 and input b is f64" in soft.error


def test_dtype_rules_of_the_table():
    assert infer_dtype("add", "f32", "f32") == "f32"
    assert infer_dtype("take", "f32", "i64") == "f32"             # ids are not values
    assert infer_dtype("lt", "i64", "i64") == "f64"               # a mask of integer data
    assert infer_dtype("eq", "i64", "f32") == "f32"
    assert infer_dtype("keep", "f32", "f64") == "f32"             # a mask of any dtype
    assert infer_dtype("keep", "i64", "f32") == "f64"
    assert infer_dtype("to_f64", "f32", None) == "f64"
    assert infer_dtype("cast", "f64", None, {"dtype": "f32"}) == "f32"
    with pytest.raises(DtypeError):
        infer_dtype("concat", "f32", "f64", {"axis": 0})


def test_cast_rounds_once_and_its_gradient_is_cast_back():
    rng = np.random.default_rng(1)
    tp = gt.Tape()
    x = rng.standard_normal(50) * 10.0 ** rng.integers(-40, 40, 50)
    a = tp.param(x)
    c = tp.cast(a, "f32")
    assert tp.cast(c, "f32") is c                                   # no node: already f32
    assert_bits_equal(tp.value(c), x.astype(np.float32))
    w = tp.const(rng.standard_normal(50).astype(np.float32))
    loss = tp.cast(tp.sum(tp.mul(c, w)), "f64")
    tp.backward(loss)
    assert_bits_equal(tp.grad(a), tp.value(w).astype(np.float64))   # g * w: w, widened
    with pytest.raises(TapeError, match="'f32' or 'f64'"):
        tp.cast(a, "i64")


def test_scalar_operands_are_rounded_to_float32_once():
    x = f32(np.linspace(-3, 3, 25))
    tp = gt.Tape()
    a = tp.param(x)
    s = 0.1                                      # not a float32: rounded once, as torch's
    assert_bits_equal(tp.value(tp.muls(a, s)), x * np.float32(s))
    assert_bits_equal(tp.value(tp.adds(a, s)), x + np.float32(s))
    assert_bits_equal(tp.value(tp.clamp(a, -0.3, 0.7)),
                      np.minimum(np.maximum(x, np.float32(-0.3)), np.float32(0.7)))
    assert_bits_equal(tp.value(a / 3), x / np.float32(3))
    assert tp.value(a / 3).dtype == np.float32 and (a / 3).dtype == "f32"
    assert tp.gt(a, 0.5).dtype == "f32" and tp.where(tp.gt(a, 0.5), a, 0).dtype == "f32"
    torch = pytest.importorskip("torch")
    t = torch.tensor(x)
    for ours, theirs in ((tp.muls(a, s), t * s), (tp.adds(a, s), t + s), (a / 3, t / 3)):
        assert_bits_equal(tp.value(ours), theirs.numpy())


# ── every op: dtype f32 in, f32 out, and back through the file ─────────────

@pytest.mark.parametrize("name", TABLE_OPS + ["cast"])
def test_every_op_computes_in_f32_and_round_trips_through_a_file(name):
    rng = np.random.default_rng(sum(map(ord, name)))
    if name == "cast":
        tp = gt.Tape()
        leaves = [tp.param(rng.standard_normal((3, 4)))]
        out = tp.cast(leaves[0], "f32")
        loss = tp.sum(tp.mul(out, tp.const(f32(rng.uniform(0.5, 1.5, (3, 4))))))
    else:
        tp, leaves, out, loss, _, _ = f32_op_tape(name, rng)
    tp.backward(loss)
    want = "f64" if name in ("uniform", "to_f64") else "f32"
    assert out.dtype == want and loss.dtype == want
    for leaf in leaves:
        if tp.nodes[leaf.id].op == "param":
            assert tp.grad(leaf).dtype == tp.value(leaf).dtype, name
    raw = dumps(tp, loss=loss, values=True)
    tf = load(io.BytesIO(raw))
    assert [v.dtype for v in tf.tape.values] == [v.dtype for v in tp.values]
    for i, v in enumerate(tp.values):
        assert_bits_equal(tf.tape.values[i], v, f"{name} node {i}")
    tf.tape.backward(tf.loss)
    for leaf in leaves:
        if tp.nodes[leaf.id].op == "param":
            assert_bits_equal(tf.tape.grad(tf.tape.var(leaf.id)), tp.grad(leaf), name)
    assert tf.dumps(values=True) == raw


# ── bits: each family against the float32 contract's definitions ───────────

def test_elementwise_rules_are_binary32_and_fdlibm_rounded_once():
    rng = np.random.default_rng(2)
    x, y = f32(rng.uniform(0.2, 2.0, 40)), f32(rng.uniform(0.2, 2.0, 40))
    tp = gt.Tape()
    a, b = tp.param(x), tp.param(y)
    checks = {
        "add": (tp.add(a, b), x + y), "sub": (tp.sub(a, b), x - y),
        "mul": (tp.mul(a, b), x * y), "div": (tp.div(a, b), x / y),
        "sqrt": (tp.sqrt(a), np.sqrt(x)),
        "exp": (tp.exp(a), n32.unary("exp", x)), "log": (tp.log(a), n32.unary("log", x)),
        "tanh": (tp.tanh(a), n32.unary("tanh", x)), "erf": (tp.erf(a), n32.unary("erf", x)),
        "sin": (tp.sin(a), n32.unary("sin", x)), "atan2": (tp.atan2(a, b), n32.atan2(x, y)),
        "sigmoid": (tp.sigmoid(a), np.float32(1) / (np.float32(1) + n32.unary("exp", -x))),
        "rsqrt": (tp.rsqrt(a), np.float32(1) / np.sqrt(x)),
        "pows": (tp.pows(a, 2.5), n32.unary("exp", np.float32(2.5) * n32.unary("log", x))),
    }
    for name, (ours, want) in checks.items():
        assert want.dtype == np.float32, name
        assert_bits_equal(tp.value(ours), want, name)
    # a backward rule: tanh's g * (1 - t*t) in binary32
    loss = tp.sum(tp.tanh(a))
    tp.backward(loss)
    t = n32.unary("tanh", x)
    assert_bits_equal(tp.grad(a), np.float32(1) * (np.float32(1) - t * t))


def test_products_reductions_and_softmax_follow_numerics32():
    rng = np.random.default_rng(3)
    xa, xb = f32(rng.standard_normal((7, 300))), f32(rng.standard_normal((300, 5)))
    bias = f32(rng.standard_normal(5))
    tp = gt.Tape()
    a, b, c = tp.param(xa), tp.param(xb), tp.param(bias)
    h = tp.add(tp.matmul(a, b), c)
    assert_bits_equal(tp.value(tp.matmul(a, b)), n32.matmul(xa, xb))
    sm = tp.softmax(h, axis=1)
    hv = tp.value(h)
    e = n32.unary("exp", hv - hv.max(axis=1, keepdims=True))
    assert_bits_equal(tp.value(sm), e / n32.sum_axis(e, 1))
    big = tp.param(f32(rng.standard_normal(1000)))
    assert_bits_equal(tp.value(tp.sum(big)), n32.sum_all(tp.value(big)))
    assert_bits_equal(tp.value(tp.mean(big)), n32.mean_all(tp.value(big)))
    assert_bits_equal(tp.value(tp.sum(a, axis=1)),
                      n32.sum_axis(xa, 1).reshape(7))
    loss = tp.mean(tp.mul(h, h))
    tp.backward(loss)
    g = tp.grad(h)
    assert_bits_equal(tp.grad(c), n32.reduce_to_shape(g, (5,)))       # the bias: broadcast
    assert_bits_equal(tp.grad(a), n32.matmul(g, xb.T))
    assert_bits_equal(tp.grad(b), n32.matmul(xa.T, g))


def test_conv2d_is_im2col_then_the_fmaf_chain():
    rng = np.random.default_rng(4)
    x, w = f32(rng.standard_normal((2, 4, 6, 5))), f32(rng.standard_normal((4, 2, 3, 2)))
    tp = gt.Tape()
    out = tp.conv2d(tp.param(x), tp.param(w), stride=[2, 1], padding=[1, 1],
                    dilation=[1, 2], groups=2)
    cols = gt.numerics.im2col(x, (3, 2), (2, 1), (1, 1), (1, 2), 2)
    want = n32.bmm(w.reshape(2, 2, -1), cols)
    assert cols.dtype == np.float32
    assert_bits_equal(tp.value(out), np.ascontiguousarray(
        want.reshape(4, 2, -1).transpose(1, 0, 2)).reshape(tp.value(out).shape))


# ── accuracy: against torch float32 ────────────────────────────────────────

def _torch_fn(torch, name, attrs, s):
    F = torch.nn.functional
    table = {
        "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
        "maximum": torch.maximum, "minimum": torch.minimum, "atan2": torch.atan2,
        "neg": torch.neg, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
        "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "abs": torch.abs,
        "erf": torch.erf, "erfc": torch.erfc, "atan": torch.atan, "sin": torch.sin,
        "cos": torch.cos, "expm1": torch.expm1, "log1p": torch.log1p, "rsqrt": torch.rsqrt,
        "adds": lambda a: a + s, "muls": lambda a: a * s, "pows": lambda a: a ** s,
        "clamp_min": lambda a: torch.clamp(a, min=s), "clamp_max": lambda a: torch.clamp(a, max=s),
        "matmul": torch.matmul, "bmm": torch.bmm,
        "transpose": lambda a: a.transpose(-1, -2),
        "softmax": lambda a: torch.softmax(a, attrs.get("axis", -1)),
        "log_softmax": lambda a: torch.log_softmax(a, attrs.get("axis", -1)),
        "sum": lambda a: a.sum(attrs["axis"], keepdim=attrs["keepdims"]),
        "mean": lambda a: a.mean(attrs["axis"], keepdim=attrs["keepdims"]),
        "conv2d": lambda a, b: F.conv2d(a, b, stride=attrs["stride"],
                                        padding=attrs["padding"],
                                        dilation=attrs["dilation"], groups=attrs["groups"]),
        "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc, "round": torch.round,
        "fmods": lambda a: torch.fmod(a, s), "mods": lambda a: torch.remainder(a, s),
        "pow": torch.pow, "detach": lambda a: a.detach(), "to_f64": lambda a: a.double(),
        "max": lambda a: a.max(attrs["axis"], keepdim=attrs["keepdims"])[0],
        "reshape": lambda a: a.reshape(attrs["shape"]),
        "permute": lambda a: a.permute(attrs["dims"]),
        "concat": lambda a, b: torch.cat([a, b], attrs["axis"]),
        "slice": lambda a: a[tuple(slice(lo, hi, st) for lo, hi, st in zip(
            attrs["starts"], attrs["stops"], attrs.get("steps") or [1] * 4))],
        **{op: (lambda f: lambda a, b: f(a, b).float())(getattr(torch, op))
           for op in ("eq", "ne", "lt", "le", "gt", "ge")},
        "max_pool2d": lambda a: F.max_pool2d(a, attrs["kernel"], attrs["stride"],
                                             attrs["padding"], attrs["dilation"],
                                             attrs["ceil_mode"]),
        "avg_pool2d": lambda a: F.avg_pool2d(a, attrs["kernel"], attrs["stride"],
                                             attrs["padding"], attrs["ceil_mode"],
                                             attrs["count_include_pad"]),
    }
    return table.get(name)


@pytest.mark.parametrize("name", [n for n in TABLE_OPS if OPS[n].kind not in
                                  ("take", "take_along", "scatter", "uniform")])
def test_forward_and_backward_within_the_f32_bound_of_torch_float32(name):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(sum(map(ord, name)) + 7)
    tp, leaves, out, loss, s, attrs = f32_op_tape(name, rng)
    fn = _torch_fn(torch, name, attrs or {}, s)
    if fn is None:
        pytest.skip(f"no torch twin listed for {name} (its bits are the table's rule)")
    ts = [torch.tensor(tp.value(l), requires_grad=True) for l in leaves]
    tout = fn(*ts)
    w = torch.tensor(tp.value(tp.var(loss.id - 2)))
    if tout.requires_grad:                    # rounding, comparisons, detach: no gradient
        (tout * w).sum().backward()
    tp.backward(loss)

    def close(ours, theirs, what):
        assert ours.dtype == (np.float64 if name == "to_f64" and "forward" in what
                              else np.float32), what
        scale = max(1.0, float(np.max(np.abs(theirs))))
        err = float(np.max(np.abs(ours.astype(np.float64) - theirs.astype(np.float64))))
        assert err <= F32_BOUND * scale, (what, err / EPS32 / scale)

    close(tp.value(out), tout.detach().numpy(), f"{name} forward")
    for leaf, t in zip(leaves, ts):
        theirs = t.grad.numpy() if t.grad is not None else np.zeros(t.shape, np.float32)
        close(tp.grad(leaf), theirs, f"{name} gradient")


# ── the file ───────────────────────────────────────────────────────────────

def _f32_tape():
    rng = np.random.default_rng(5)
    tp = gt.Tape()
    x = tp.const(f32(rng.standard_normal((4, 3))), name="x")
    w = tp.param(f32(rng.standard_normal((3, 2))), name="w", l2=1e-4)
    scale = tp.param(rng.standard_normal(2), name="scale")            # f64, cast to f32
    h = tp.mul(tp.matmul(x, w), tp.cast(scale, "f32"))
    loss = tp.mean(tp.mul(h, h))
    return tp, loss


def test_the_file_holds_binary32_leaves_and_the_casts_target():
    tp, loss = _f32_tape()
    raw = dumps(tp, loss=loss)
    doc = msgpack.unpackb(raw)
    x, w, scale, cast = doc["nodes"][0], doc["nodes"][1], doc["nodes"][2], doc["nodes"][4]
    assert x["dtype"] == "f32" and len(x["data"]) == 4 * 12
    assert_bits_equal(np.frombuffer(w["data"], "<f4").reshape(3, 2), tp.values[1])
    assert "dtype" not in scale and len(scale["data"]) == 8 * 2
    assert cast["op"] == "cast" and cast["dtype"] == "f32"
    assert doc["version"] == 1


def _write(tmp_path, doc):
    path = tmp_path / "bad.msgpack"
    path.write_bytes(msgpack.packb(doc, use_bin_type=True))
    return path


@pytest.mark.parametrize("case, needle", [
    ("f32_data_of_f64_length", "needs 48 (4 per element, dtype f32)"),
    ("param_i64", "unknown dtype 'i64' (this reader knows 'f64' and 'f32')"),
    ("cast_without_dtype", "dtype"),
    ("cast_to_its_own_dtype", "already f64, to f64"),
    ("mixed_inputs", "input a is f32 and input b is f64"),
])
def test_the_loader_refuses_malformed_f32_files_in_one_line(tmp_path, case, needle):
    tp, loss = _f32_tape()
    doc = msgpack.unpackb(dumps(tp, loss=loss))
    nodes = doc["nodes"]
    if case == "f32_data_of_f64_length":
        nodes[0]["data"] = np.zeros(12).tobytes()
    elif case == "param_i64":
        nodes[1]["dtype"] = "i64"
        nodes[1]["data"] = np.zeros(6, np.int64).tobytes()
    elif case == "cast_without_dtype":
        del nodes[4]["dtype"]
    elif case == "cast_to_its_own_dtype":
        nodes[4]["dtype"] = "f64"
    elif case == "mixed_inputs":              # the mul reads the f32 product and the f64 scale
        nodes[5]["b"] = 2
    path = _write(tmp_path, doc)
    with pytest.raises(TapeFileError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load(path)
    assert_one_line_error(run("inspect", path), 2, needle)


# ── the command line ───────────────────────────────────────────────────────

def test_inspect_json_names_each_params_and_inputs_dtype(tmp_path):
    tp, loss = _f32_tape()
    path = tmp_path / "t.msgpack"
    gt.tapefile.save(tp, path, loss=loss)
    out = json.loads(run("inspect", "--json", path).stdout)
    assert [(p["name"], p["dtype"]) for p in out["params"]] == [("w", "f32"), ("scale", "f64")]
    assert [(p["name"], p["dtype"]) for p in out["inputs"]] == [("x", "f32")]


def test_backward_json_prints_float32_values_exactly_and_shortest(tmp_path):
    tp, loss = _f32_tape()
    path = tmp_path / "t.msgpack"
    gt.tapefile.save(tp, path, loss=loss)
    tp.backward(loss)
    result = run("backward", "--json", path)
    out = json.loads(result.stdout)
    assert np.float32(out["loss"]) == tp.value(loss)[0]
    grads = {p["name"]: p["grad"] for p in out["params"]}
    got = f32(grads["w"]).reshape(3, 2)
    assert_bits_equal(got, tp.grad(tp.var("w")))                    # read back: the same bits
    # shortest: each printed number is numpy's shortest float32 text
    w_text = result.stdout[result.stdout.index('"grad": [') + 9:].split("]")[0].split(", ")
    assert [float(t) for t in w_text] == grads["w"]
    assert all(len(t.replace("-", "").replace(".", "").lstrip("0").split("e")[0]) <= 9
               for t in w_text), w_text
    assert all(t == np.format_float_positional(np.float32(t), unique=True, trim="-")
               or "e" in t for t in w_text)
    hexed = json.loads(run("backward", "--json", "--hex", path).stdout)
    hw = {p["name"]: p["grad"] for p in hexed["params"]}["w"]
    assert_bits_equal(f32([float.fromhex(h) for h in hw]).reshape(3, 2), tp.grad(tp.var("w")))
    assert float.fromhex(hexed["loss"]) == float(tp.value(loss)[0])


# ── devices and emit-cuda: f32 tapes run (tests/test_device_f32.py); mixed ones refused ──

def test_the_device_replay_and_emit_cuda_run_an_f32_tape_and_refuse_a_mixed_one(tmp_path):
    from gradtool.device.program import capture_program
    from gradtool.emit.cuda import emit_cuda
    from gradtool.emit.render import EmitError
    from gradtool.device.launch import CaptureError
    mixed, mixed_loss = _f32_tape()          # an f64 param cast to f32: one arena type only
    with pytest.raises(CaptureError, match="node 0: holds float32 values and node 2 float64 values"):
        capture_program(mixed, mixed_loss.id)
    rng = np.random.default_rng(5)
    tp = gt.Tape()
    x = tp.const(f32(rng.standard_normal((4, 3))), name="x")
    w = tp.param(f32(rng.standard_normal((3, 2))), name="w", l2=1e-4)
    h = tp.matmul(x, w)
    loss = tp.mean(tp.mul(h, h))
    assert capture_program(tp, loss.id).dtype == "f32"     # tests/test_device_f32.py: bits
    one = gt.Tape()
    a = one.param(f32([0.5]))
    assert "float gradtool_grad(const float *p" in emit_cuda(one, one.exp(a))  # float code
    mixed1 = gt.Tape()
    b = mixed1.param(np.array([0.5]))
    with pytest.raises(EmitError, match="op 'cast' has no scalar C form"):   # refused
        emit_cuda(mixed1, mixed1.add(mixed1.cast(b, "f32"), mixed1.const(f32([1.0]))))
    path = tmp_path / "t.msgpack"
    gt.tapefile.save(tp, path, loss=loss)
    data = tmp_path / "d.npz"
    np.savez(data, x=np.ones((4, 3), np.float32))
    saved = {}
    for backend in ("cpu", "host"):
        out = tmp_path / f"{backend}.msgpack"
        result = run("train", path, "--data", data, "--backend", backend, "--steps", "2",
                     "--save", out)
        assert result.exit_code == 0, result.stderr
        saved[backend] = out.read_bytes()
    assert saved["cpu"] == saved["host"]
    gt.tapefile.save(mixed, path, loss=mixed_loss)
    result = run("train", path, "--data", data, "--backend", "host", "--steps", "1")
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "one float dtype per tape" in result.stderr and "Traceback" not in result.stderr


# ── training on the cpu engine ─────────────────────────────────────────────

def test_the_f32_digits_sample_trains_to_97_percent_in_float32(tmp_path):
    from support import SAMPLES
    out = tmp_path / "trained.msgpack"
    result = run("train", SAMPLES / "digits_mlp_f32.msgpack", "--data",
                 SAMPLES / "digits.npz", "--json", "--save", out)
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout.splitlines()[-1])
    assert summary["val_accuracy"] >= 0.97, summary
    tf = load(out)
    assert {tf.tape.values[p.id].dtype for p in tf.tape.params()} == {np.dtype(np.float32)}


def test_f32_training_is_deterministic_and_reads_float64_data_rounded_once(tmp_path):
    from support import SAMPLES
    from gradtool.npzio import NpzArchive, write_npz
    with NpzArchive(SAMPLES / "digits.npz") as raw:
        arrays = {k: raw.load(k) for k in raw}
    wide = tmp_path / "wide.npz"                # float64 data: rounded to float32 once
    write_npz(wide, {k: (v.astype(np.float64) / 3.0 if k.startswith("x") else v)
                     for k, v in arrays.items()})
    narrow = tmp_path / "narrow.npz"            # the same values rounded beforehand
    write_npz(narrow, {k: (v.astype(np.float64) / 3.0).astype(np.float32)
                       if k.startswith("x") else v for k, v in arrays.items()})
    saved = []
    for data in (wide, narrow, wide):
        out = tmp_path / f"out{len(saved)}.msgpack"
        result = run("train", SAMPLES / "digits_mlp_f32.msgpack", "--data", data,
                     "--steps", "5", "--save", out)
        assert result.exit_code == 0, result.stderr
        saved.append(out.read_bytes())
    assert saved[0] == saved[1] == saved[2]


def test_adam_state_is_float32_for_an_f32_param():
    tp = gt.Tape()
    w = tp.param(f32([0.5, -1.5, 2.0]))
    loss = tp.sum(tp.mul(w, w))
    from gradtool.optim import Adam
    opt = Adam(0.1)
    opt.add(tp, w)
    tp.backward(loss)
    opt.step(tp)
    e = opt.entries[0]
    assert e.m.dtype == e.v.dtype == tp.value(w).dtype == np.float32
    # torch's float32 Adam, one step from the same start: the same update within 1 ulp
    torch = pytest.importorskip("torch")
    t = torch.tensor(f32([0.5, -1.5, 2.0]), requires_grad=True)
    topt = torch.optim.Adam([t], lr=0.1)
    (t * t).sum().backward()
    topt.step()
    np.testing.assert_array_max_ulp(tp.value(w), t.detach().numpy(), maxulp=1)


# ── conversion and the importer ────────────────────────────────────────────

def test_to_dtype_rounds_the_leaves_once_and_records_every_op_in_f32():
    from gradtool.convert import to_dtype
    from support import all_ops_tape
    tp, loss, _ = all_ops_tape()
    new, ids = to_dtype(tp, "f32")
    for i, node in enumerate(tp.nodes):
        if node.op == "param":
            assert_bits_equal(new.values[ids[i]], tp.values[i].astype(np.float32))
    lv = new.values[ids[loss.id]]
    assert lv.dtype == np.float32
    assert abs(float(lv[0]) - float(tp.values[loss.id][0])) <= F32_BOUND * abs(
        float(tp.values[loss.id][0]))
    assert tf_bytes_round_trip(new, new.var(ids[loss.id]))


def tf_bytes_round_trip(tape, loss) -> bool:
    raw = dumps(tape, loss=loss)
    return load(io.BytesIO(raw)).dumps() == raw


def test_import_module_records_a_torch_model_at_its_own_float32():
    torch = pytest.importorskip("torch")
    from gradtool.interop.torch import TorchImportError, import_module
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3))
    x, y = torch.randn(5, 1, 6, 6), torch.randint(0, 3, (5,))

    def loss_fn(out, target):
        return torch.nn.functional.cross_entropy(out, target)

    result = import_module(model, (x,), loss_fn, (y,), dtype="module")
    tp = result.tape
    assert {k: tp.value(v).dtype for k, v in result.params.items()} == {
        k: np.dtype(np.float32) for k in dict(model.named_parameters())}
    assert sorted(v.dtype for v in result.inputs.values()) == ["f32", "i64"]     # x, y
    check = result.check
    assert check["dtype"] == "f32" and check["f32_difference"] <= check["bound"]
    assert check["bound"] == 2.0 ** 10 * EPS32 * max(1.0, abs(check["torch_f32_loss"]))
    assert check["f64_difference"] == abs(check["loss"] - check["f64_loss"])
    tp.backward(result.loss)
    (loss_fn(model(x), y)).backward()
    for name, p in model.named_parameters():
        g = tp.grad(result.params[name])
        assert g.dtype == np.float32
        scale = max(1.0, float(p.grad.abs().max()))
        assert float(np.max(np.abs(g - p.grad.numpy()))) <= F32_BOUND * scale, name
    f64 = import_module(model, (x,), loss_fn, (y,), dtype="f64")
    assert f64.tape.value(f64.loss).dtype == np.float64
    with pytest.raises(TorchImportError, match="bfloat16.*--dtype f32 or --dtype f64"):
        import_module(model.to(torch.bfloat16), (x.bfloat16(),), loss_fn, (y,),
                      dtype="module")
    converted = import_module(model, (x.bfloat16(),), loss_fn, (y,), dtype="f32")
    assert converted.tape.value(converted.loss).dtype == np.float32


def test_import_torch_dtype_option(tmp_path):
    pytest.importorskip("torch")
    spec = tmp_path / "model.py"
    spec.write_text(
        "import torch\n"
        "def build(half=False):\n"
        "    torch.manual_seed(0)\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(),\n"
        "                            torch.nn.Linear(3, 1))\n"
        "    class Loss(torch.nn.Module):\n"
        "        def __init__(self):\n"
        "            super().__init__()\n"
        "            self.m = m\n"
        "        def forward(self, x):\n"
        "            return (self.m(x) ** 2).mean()\n"
        "    return Loss(), (torch.randn(6, 4),)\n"
        "def build_half():\n"
        "    model, inputs = build()\n"
        "    return model.to(torch.bfloat16), tuple(t.bfloat16() for t in inputs)\n")
    out = tmp_path / "m.msgpack"
    result = run("import-torch", f"{spec}:build", "-o", out, "--dtype", "f32", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["inputs"]["x"]["dtype"] == "f32"
    info = json.loads(run("inspect", "--json", out).stdout)
    assert {p["dtype"] for p in info["params"]} == {"f32"}
    result = run("import-torch", f"{spec}:build_half", "-o", out, "--dtype", "module")
    assert_one_line_error(result, 2, "bfloat16", "--dtype f32 or --dtype f64")
    result = run("import-torch", f"{spec}:build_half", "-o", out, "--dtype", "f32")
    assert result.exit_code == 0, result.stderr


def test_a_torch_model_imports_at_its_own_float32_by_default_and_trains_alike(tmp_path):
    """issue 38's importer promise: a plain torch.nn model (float32 as built; a mapping
    nobody wrote for it: conv, batch norm in train mode, pooling, a linear head) imports
    by default as an f32 tape, within the f32 bound of torch's float32 run, and `gradtool
    train` gives the same bytes on cpu and host."""
    pytest.importorskip("torch")
    from conftest import require_c_compiler
    require_c_compiler()
    spec = tmp_path / "cnn.py"
    spec.write_text(
        "import torch\n"
        "def build():\n"
        "    torch.manual_seed(5)\n"
        "    m = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1),\n"
        "                            torch.nn.BatchNorm2d(4), torch.nn.ReLU(),\n"
        "                            torch.nn.MaxPool2d(2), torch.nn.Flatten(),\n"
        "                            torch.nn.Linear(4 * 4 * 4, 10))\n"
        "    x = torch.randn(8, 1, 8, 8)\n"
        "    y = torch.randint(0, 10, (8,))\n"
        "    return m, (x,), (y,)\n"
        "def loss(out, target):\n"
        "    return torch.nn.functional.cross_entropy(out, target)\n")
    out = tmp_path / "cnn.msgpack"
    res = run("import-torch", f"{spec}:build", "--loss", "loss", "-o", out, "--json")
    assert res.exit_code == 0, res.stderr
    info = json.loads(run("inspect", "--json", out).stdout)
    assert {p["dtype"] for p in info["params"]} == {"f32"}
    from gradtool.interop.torch import import_module       # the same import, from Python
    namespace: dict = {}
    exec(spec.read_text(), namespace)                       # noqa: S102 - the test's file
    model, inputs, targets = namespace["build"]()
    check = import_module(model, inputs, namespace["loss"], targets).check
    assert check["dtype"] == "f32" and check["f32_difference"] <= check["bound"]
    names = {i["name"]: i for i in info["inputs"]} if isinstance(info["inputs"], list) \
        else info["inputs"]
    rng = np.random.default_rng(6)
    data = tmp_path / "d.npz"
    xname, yname = sorted(names, key=lambda k: names[k]["dtype"] == "i64")
    np.savez(data, **{xname: rng.standard_normal((32, 1, 8, 8)),
                      yname: rng.integers(0, 10, 32)})
    saved = {}
    for backend in ("cpu", "host"):
        saved[backend] = tmp_path / f"{backend}.msgpack"
        r = run("train", out, "--data", data, "--backend", backend, "--optimizer", "adamw",
                "--lr", "0.01", "--epochs", "2", "--save", saved[backend])
        assert r.exit_code == 0, r.stderr
    assert saved["cpu"].read_bytes() == saved["host"].read_bytes()
    trained = load(saved["cpu"]).tape
    first = load(out).tape
    ids = [v.id for v in first.params()]
    moved = [i for i in ids if not np.array_equal(first.values[i], trained.values[i])]
    assert moved and all(trained.values[i].dtype == np.float32 for i in moved)


def test_rules_written_with_one_body_give_the_bits_of_the_two_bodies(rng):
    """compile_numpy writes a rule whose float32 body would be its float64 one (no
    constant, no s, the same functions) without the dtype test: every elementwise rule of
    the op table, on float32 and on float64 arrays (specials among them), gives the dtype
    and bits of its two-body form; add's rules are written with one body, relu's with two."""
    from gradtool import expr as E
    pool = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3e38, -1.5, 2.5, 0.5, 3.0,
                     -4.0, 1e-300])
    one = set()
    for name, spec in OPS.items():
        if spec.kind not in ("unary", "binary"):
            continue
        unary = spec.kind == "unary"
        forms = [(spec.fwd, ("x", "s") if unary else ("x", "y"))]
        forms += [(e, ("g", "x", "t", "s") if unary else ("g", "x", "y", "t"))
                  for e in spec.bwd if e is not None]
        for k, (e, names) in enumerate(forms):
            fast, both = E.compile_numpy(e, names), E.compile_numpy(e, names, one_body=False)
            if "_dtype_" not in fast.__code__.co_varnames:
                one.add((name, k))
            assert "_dtype_" in both.__code__.co_varnames
            for dtype in (np.float32, np.float64):
                args = [0.75 if n == "s" else np.concatenate(
                    [pool, rng.standard_normal(51)]).astype(dtype)[rng.permutation(64)]
                    for n in names]
                with np.errstate(all="ignore"):
                    got, want = fast(*args), both(*args)
                assert np.asarray(got).dtype == np.asarray(want).dtype, (name, k, dtype)
                assert_bits_equal(got, want, f"{name} rule {k} {np.dtype(dtype).name}")
    assert {("add", 0), ("add", 1), ("add", 2), ("mul", 0)} <= one
    assert ("relu", 0) not in one and ("relu", 1) not in one
