"""Library misuse: every entry point that takes a handle refuses every kind of bad handle.

No entry point may compute from a node other than the one the caller meant.
A bad handle is one that is poisoned (a failed op's result), dropped by
``reset_to`` (also once another node has taken its id), from another tape,
or not a handle at all.  Each gets a ``gradtool`` exception -- never a
silent result, never a TypeError from deep inside.  Also here: the other
reproducers of issue 11's library half (views, numpy operators, bad data,
what ``save`` writes ``load`` reads, misuse raising gradtool errors).
"""

import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal, require_c_compiler
from gradtool.optim import SGD, Adam, OptimizerError

# ── the kinds of bad handle, each built on a tape `tp` whose live nodes are x (param) ──

BAD_KINDS = ["poisoned", "dropped", "dropped_replaced", "foreign", "bool", "float",
             "negative", "out_of_range", "none"]


def make_bad(kind):
    """(tape, x, bad): a fresh tape with a live param x (node 0) and an unpoisoned tape."""
    tp = gt.Tape(raise_on_error=False)
    x = tp.param(np.array([0.5, -1.0, 2.0]), name="x")
    m = tp.mark()
    if kind == "poisoned":
        bad = tp.matmul(x, x)                      # shapes do not combine
        assert bad.id == -1
        tp.reset_to(m)
    elif kind in ("dropped", "dropped_replaced"):
        bad = tp.exp(x)
        tp.reset_to(m)
        if kind == "dropped_replaced":
            replacement = tp.tanh(x)               # takes the dropped node's id
            assert replacement.id == bad.id
    elif kind == "foreign":
        other = gt.Tape()
        other.param(np.ones(3))
        bad = other.exp(other.param(np.ones(3)))
    else:
        bad = {"bool": True, "float": 1.0, "negative": -1, "out_of_range": 99,
               "none": None}[kind]
    tp.exp(x)                                       # the last node is a live exp
    assert tp.ok
    return tp, x, bad


UNARY = ["neg", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "sum", "mean", "transpose"]
BINARY = ["add", "sub", "mul", "div", "matmul"]


def entry_points():
    """(name, call(tp, x, bad)) for every public entry point that takes a handle."""
    calls = []
    for op in UNARY:
        calls.append((f"{op}(bad)", lambda tp, x, bad, op=op: getattr(tp, op)(bad)))
    for op in BINARY:
        calls.append((f"{op}(bad, x)", lambda tp, x, bad, op=op: getattr(tp, op)(bad, x)))
        calls.append((f"{op}(x, bad)", lambda tp, x, bad, op=op: getattr(tp, op)(x, bad)))
    calls += [
        ("bmm(bad, x)", lambda tp, x, bad: tp.bmm(bad, x)),
        ("adds(bad)", lambda tp, x, bad: tp.adds(bad, 1.0)),
        ("muls(bad)", lambda tp, x, bad: tp.muls(bad, 2.0)),
        ("reshape(bad)", lambda tp, x, bad: tp.reshape(bad, [3])),
        ("softmax(bad)", lambda tp, x, bad: tp.softmax(bad, -1)),
        ("slice(bad)", lambda tp, x, bad: tp.slice(bad, [0], [1])),
        ("concat(bad, x)", lambda tp, x, bad: tp.concat(bad, x, 0)),
        ("concat(x, bad)", lambda tp, x, bad: tp.concat(x, bad, 0)),
        ("mse(bad, x)", lambda tp, x, bad: tp.mse(bad, x)),
        ("value", lambda tp, x, bad: tp.value(bad)),
        ("grad", lambda tp, x, bad: tp.grad(bad)),
        ("touched", lambda tp, x, bad: tp.touched(bad)),
        ("set_value", lambda tp, x, bad: tp.set_value(bad, np.ones(3))),
        ("backward", lambda tp, x, bad: tp.backward(bad)),
        ("fd_check", lambda tp, x, bad: gt.fd_check(tp, bad)),
        ("save loss", lambda tp, x, bad: gt.save(tp, None, loss=bad)),
        ("Adam.add", lambda tp, x, bad: Adam(0.1).add(tp, bad)),
        ("SGD.add", lambda tp, x, bad: SGD(0.1).add(tp, bad)),
    ]
    return calls


ENTRY_POINTS = entry_points()


@pytest.mark.parametrize("kind", BAD_KINDS)
@pytest.mark.parametrize("name,call", ENTRY_POINTS, ids=[n for n, _ in ENTRY_POINTS])
def test_every_entry_point_refuses_every_bad_handle(name, call, kind):
    tp, x, bad = make_bad(kind)
    n, last = len(tp), np.array(tp.value(tp.var(len(tp) - 1)))
    with pytest.raises(gt.GradtoolError):
        call(tp, x, bad)
    # nothing was recorded, nothing was overwritten
    assert len(tp) == n
    assert_bits_equal(tp.value(tp.var(len(tp) - 1)), last)
    assert_bits_equal(tp.value(x), [0.5, -1.0, 2.0])


def test_the_reported_reproducer_is_refused():
    tp = gt.Tape(raise_on_error=False)
    x = tp.param(np.ones(3))
    m = tp.mark()
    bad = tp.matmul(x, x)
    tp.reset_to(m)
    tp.exp(x)
    with pytest.raises(gt.TapeError, match="poisoned"):
        tp.tanh(bad)
    with pytest.raises(gt.TapeError, match="poisoned"):
        tp.add(x, bad)                             # operand b: not a TypeError
    with pytest.raises(gt.TapeError, match="poisoned"):
        tp.backward(bad)
    with pytest.raises(gt.TapeError, match="poisoned"):
        gt.fd_check(tp, bad)


def test_poison_propagates_on_a_poisoned_tape_and_reset_clears_it():
    tp = gt.Tape(raise_on_error=False)
    x = tp.param(np.ones(3))
    bad = tp.matmul(x, x)
    n = len(tp)
    later = tp.add(tp.exp(bad), x)                 # propagation: no-ops, no error
    assert later.id == -1 and len(tp) == n and not tp.ok
    with pytest.raises(gt.TapeError, match="another tape"):
        tp.exp(gt.Tape().param(np.ones(1)))        # a foreign handle is refused even now
    tp.reset_to(n)
    assert tp.ok
    with pytest.raises(gt.TapeError, match="poisoned"):
        tp.exp(later)


def test_raise_mode_poisons_then_refuses_until_reset():
    tp = gt.Tape()
    x = tp.param(np.ones(3))
    m = tp.mark()
    with pytest.raises(gt.ShapeError):
        tp.matmul(x, x)
    with pytest.raises(gt.TapeError, match="poisoned"):
        tp.exp(x)
    tp.reset_to(m)
    assert_bits_equal(tp.value(tp.exp(x)), gt.numerics.exp(np.ones(3)))


def test_dropped_handles_never_reach_the_node_that_took_their_id():
    tp = gt.Tape()
    x = tp.param(np.array([1.0, 2.0]))
    m = tp.mark()
    old = tp.exp(x)
    tp.reset_to(m)
    new = tp.tanh(x)
    assert new.id == old.id
    for call in (lambda: tp.value(old), lambda: tp.grad(old), lambda: tp.neg(old),
                 lambda: tp.backward(tp.sum(old)), lambda: tp.touched(old)):
        with pytest.raises(gt.TapeError, match="dropped by reset_to"):
            call()
    assert "dropped" in repr(old)
    # the live handle still works
    assert_bits_equal(tp.value(new), gt.numerics.tanh(np.array([1.0, 2.0])))


def test_an_optimizer_holding_a_dropped_param_refuses_to_step():
    tp = gt.Tape()
    m = tp.mark()
    w = tp.param(np.ones(2))
    opt = Adam(0.1)
    opt.add(tp, w)
    tp.reset_to(m)
    w2 = tp.param(np.full(2, 5.0))                 # same id, another param
    loss = tp.sum(w2)
    tp.backward(loss)
    with pytest.raises(OptimizerError, match="dropped"):
        opt.step(tp)
    assert_bits_equal(tp.value(w2), [5.0, 5.0])


def test_optimizers_refuse_to_mix_tapes():
    a, b = gt.Tape(), gt.Tape()
    wa, wb = a.param(np.ones(2)), b.param(np.ones(2))
    opt = Adam(0.1)
    opt.add(a, wa)
    with pytest.raises(OptimizerError, match="another tape"):
        opt.add(b, wb)
    with pytest.raises(OptimizerError, match="another tape"):
        opt.add(a, wb)                             # b's GVar, registered on a
    b.backward(b.sum(wb))
    with pytest.raises(OptimizerError, match="another tape"):
        opt.step(b)


def test_device_capture_and_replay_accessors_refuse_bad_handles():
    require_c_compiler()
    from gradtool.device import capture
    from gradtool.device.program import CaptureError

    a, b = gt.Tape(), gt.Tape()
    wa = a.param(np.array([1.0, 2.0]))
    la = a.sum(a.exp(wa))
    lb = b.sum(b.param(np.ones(2)))
    with pytest.raises(CaptureError, match="another tape"):
        capture(a, lb, "host")
    opt_b = Adam(0.1)
    opt_b.add(b, b.var(0))
    with pytest.raises(gt.GradtoolError, match="another tape"):
        capture(a, la, "host", optimizer=opt_b)
    replay = capture(a, la, "host")
    replay.forward()
    for bad in (-1, True, 1.5, 99, None, "x", lb):
        for call in (replay.value, replay.grad, replay.touched):
            with pytest.raises(gt.GradtoolError):
                call(bad)
    with pytest.raises(gt.GradtoolError):
        replay.set_input(wa, np.array([1.0 + 2.0j, 0.0]))   # complex: refused, not truncated
    with pytest.raises(gt.GradtoolError, match="not a leaf"):
        replay.set_input(la, np.ones(1))
    later = a.exp(wa)                              # recorded after the capture
    with pytest.raises(gt.GradtoolError, match="after this replay was captured"):
        replay.value(later)
    assert_bits_equal(replay.value(wa), [1.0, 2.0])
    assert_bits_equal(replay.value(la.id), a.value(la))


# ── views and numpy interop ────────────────────────────────────────────────

def test_value_is_a_snapshot_and_forward_replays():
    tp = gt.Tape()
    x = tp.const(np.array([1.0, 2.0]), name="x")
    y = tp.exp(x)
    vx, vy = tp.value(x), tp.value(y)
    tp.set_value(x, np.array([0.0, -1.0]))
    tp.forward()
    assert_bits_equal(vx, [1.0, 2.0])                       # snapshots: unchanged
    assert_bits_equal(vy, gt.numerics.exp(np.array([1.0, 2.0])))
    assert_bits_equal(tp.value(x), [0.0, -1.0])             # the tape itself replayed
    assert_bits_equal(tp.value(y), gt.numerics.exp(np.array([0.0, -1.0])))
    with pytest.raises(ValueError):
        tp.value(y)[0] = 1.0                                # read-only


def test_grad_is_a_snapshot():
    tp = gt.Tape()
    w = tp.param(np.array([1.0, 2.0]))
    tp.backward(tp.sum(w))
    g = tp.grad(w)
    tp.backward(tp.sum(tp.muls(w, 3.0)))           # leaf gradients accumulate
    assert_bits_equal(g, [1.0, 1.0])
    assert_bits_equal(tp.grad(w), [4.0, 4.0])


def test_transpose_value_never_aliases_its_input():
    tp = gt.Tape()
    x = tp.const(np.array([[1.0, 2.0, 3.0]]))       # [1,3]: swapaxes is already contiguous
    t = tp.transpose(x)
    assert not np.shares_memory(tp.values[t.id], tp.values[x.id])


@pytest.mark.parametrize("left", [np.ones(3), [1.0, 2.0, 3.0], np.array(2.0)])
def test_numpy_arrays_never_build_object_arrays_of_gvars(left):
    tp = gt.Tape()
    x = tp.param(np.ones(3))
    n = len(tp)
    for op in (lambda: left + x, lambda: left - x, lambda: left * x, lambda: left / x,
               lambda: x + left, lambda: x * left, lambda: x - left, lambda: x / left):
        with pytest.raises(gt.TapeError, match="tape.const"):
            op()
    if isinstance(left, np.ndarray):
        with pytest.raises(gt.TapeError):
            left @ x
    assert len(tp) == n


def test_numpy_scalars_are_numbers():
    tp = gt.Tape()
    x = tp.param(np.array([1.0, 2.0]))
    assert tp.nodes[(np.float64(2.0) * x).id].op == "muls"
    assert tp.nodes[(x + np.int64(3)).id].op == "adds"
    assert tp.nodes[(np.float32(1.5) - x).id].op == "adds"


@pytest.mark.parametrize("bad", [np.array([True, False]), np.array([1 + 2j, 3]),
                                 np.array(["a"]), np.array([object()], dtype=object), True])
def test_leaves_and_set_value_refuse_non_real_data(bad):
    tp = gt.Tape()
    with pytest.raises(gt.TapeError, match="real numbers"):
        tp.const(bad)
    x = tp.const(np.zeros(np.shape(bad) or (1,)))
    with pytest.raises(gt.TapeError, match="real numbers"):
        tp.set_value(x, bad)


@pytest.mark.parametrize("bad", [True, np.bool_(True), "1", None, [1.0]])
def test_scalar_operands_refuse_non_numbers(bad):
    tp = gt.Tape()
    x = tp.param(np.ones(2))
    for call in (lambda: x + bad, lambda: x * bad, lambda: tp.adds(x, bad),
                 lambda: tp.muls(x, bad)):
        with pytest.raises(gt.TapeError):
            call()


# ── library misuse raises gradtool exceptions ──────────────────────────────

def test_misuse_raises_gradtool_errors():
    tp = gt.Tape()
    x = tp.param(np.ones(3))
    loss = tp.sum(x)
    cases = {
        "param(l2='abc')": lambda: tp.param(np.ones(1), l2="abc"),
        "param(l2=-1)": lambda: tp.param(np.ones(1), l2=-1),
        "param(l2=nan)": lambda: tp.param(np.ones(1), l2=float("nan")),
        "param(l2=inf)": lambda: tp.param(np.ones(1), l2=float("inf")),
        "param(l2=True)": lambda: tp.param(np.ones(1), l2=True),
        "x + 10**400": lambda: x + 10**400,
        "x - 10**400": lambda: x - 10**400,
        "x / 10**400": lambda: x / 10**400,
        "10**400 * x": lambda: 10**400 * x,
        "fd_check(eps='1e-6')": lambda: gt.fd_check(tp, loss, eps="1e-6"),
        "fd_check(eps=0)": lambda: gt.fd_check(tp, loss, eps=0.0),
        "fd_check(rtol=nan)": lambda: gt.fd_check(tp, loss, rtol=float("nan")),
        "fd_check(not a tape)": lambda: gt.fd_check("tape", loss),
        "forward(start='a')": lambda: tp.forward(start="a"),
        "forward(start=-1)": lambda: tp.forward(start=-1),
        "forward(start=True)": lambda: tp.forward(start=True),
        "forward(only=[True])": lambda: tp.forward(only=[True]),
        "reset_to(True)": lambda: tp.reset_to(True),
        "reset_to(1.0)": lambda: tp.reset_to(1.0),
        "reset_to(-1)": lambda: tp.reset_to(-1),
        "reset_to(99)": lambda: tp.reset_to(99),
        "reset_to('0')": lambda: tp.reset_to("0"),
        "var(True)": lambda: tp.var(True),
        "Tape('no')": lambda: gt.Tape(raise_on_error="no"),
        "const(GVar)": lambda: tp.const(x),
        "reshape(['3'])": lambda: tp.reshape(x, ["3"]),
        "softmax(axis=1.0)": lambda: tp.softmax(x, 1.0),
        "name=3": lambda: tp.param(np.ones(1), name=3),
        "name=''": lambda: tp.param(np.ones(1), name=""),
        "name=surrogate": lambda: tp.param(np.ones(1), name="a\ud800"),
    }
    n = len(tp)
    for what, call in cases.items():
        try:
            call()
        except gt.GradtoolError:
            pass
        except Exception as exc:  # noqa: BLE001 - the point of the test
            pytest.fail(f"{what}: raised {type(exc).__name__}: {exc}")
        else:
            pytest.fail(f"{what}: accepted")
    assert len(tp) == n and tp.ok


def test_huge_leaves_and_broadcasts_raise_gradtool_errors():
    tp = gt.Tape()
    huge = np.broadcast_to(np.float64(0.0), (1 << 20, 1 << 20))   # 8 TiB as float64, 0 bytes here
    with pytest.raises(gt.TapeError, match="out of memory"):
        tp.param(huge)
    a = tp.const(np.zeros((1 << 20, 1)))
    b = tp.const(np.zeros((1, 1 << 20)))
    n = len(tp)
    with pytest.raises(gt.TapeError, match="out of memory"):
        tp.add(a, b)
    assert len(tp) == n


# ── whatever save writes, load reads ───────────────────────────────────────

def test_the_recorder_refuses_what_the_loader_refuses(tmp_path):
    tp = gt.Tape()
    with pytest.raises(gt.TapeError, match="at most 32"):
        tp.const(np.zeros((1,) * 33))
    x = tp.const(np.zeros(1))
    with pytest.raises(gt.ShapeError, match="at most 32"):
        tp.reshape(x, [1] * 33)
    tp.reset_to(1)
    with pytest.raises(gt.TapeError, match="at most 1048576"):
        tp.param(np.ones(1), name="n" * ((1 << 20) + 1))
    loss = tp.sum(tp.param(np.ones(2), name="w" * (1 << 20)))   # exactly at the limit
    deep = {}
    cursor = deep
    for _ in range(40):
        cursor["k"] = {}
        cursor = cursor["k"]
    with pytest.raises(gt.TapeError, match="cannot save.*nested deeper"):
        gt.save(tp, tmp_path / "deep.msgpack", loss=loss, meta={"deep": deep})
    with pytest.raises(gt.TapeError, match="cannot save"):
        gt.save(tp, tmp_path / "keys.msgpack", loss=loss, meta={"m": {1: "non-string key"}})
    assert not (tmp_path / "deep.msgpack").exists() and not (tmp_path / "keys.msgpack").exists()
    gt.save(tp, tmp_path / "ok.msgpack", loss=loss, meta={"fine": {"a": [1, 2.0, "x"]}})
    back = gt.load(tmp_path / "ok.msgpack")
    assert back.tape.nodes[1].name == "w" * (1 << 20)


def test_records_at_the_limits_round_trip(rng, tmp_path):
    tp = gt.Tape()
    x = tp.param(rng.standard_normal((1,) * 31 + (2,)), name="\u00e9" * 1000, l2=0.0)
    y = tp.reshape(x, [2] + [1] * 31)
    loss = tp.sum(tp.mul(y, y))
    meta = cursor = {}
    for _ in range(29):                            # the file's own maps take the rest
        cursor["k"] = {}
        cursor = cursor["k"]
    gt.save(tp, tmp_path / "edge.msgpack", loss=loss, meta=meta)
    back = gt.load(tmp_path / "edge.msgpack")
    assert back.tape.nodes[0].name == "\u00e9" * 1000
    assert_bits_equal(back.tape.value(back.loss), tp.value(loss))


def test_the_schema_states_the_recorders_dim_limit():
    import json
    from importlib import resources

    from gradtool.limits import MAX_DIMS

    schema = json.loads(resources.files("gradtool").joinpath("schemas/tape.schema.json")
                        .read_text())
    assert schema["$defs"]["dims"]["maxItems"] == MAX_DIMS
    assert schema["$defs"]["indices"]["maxItems"] == MAX_DIMS


def test_describe_refuses_what_is_not_a_loaded_file():
    from gradtool import describe

    tp = gt.Tape()
    for fn in (describe.summary, describe.to_dot, describe.first_mismatch):
        with pytest.raises(gt.GradtoolError, match="loaded tape file"):
            fn(tp)
