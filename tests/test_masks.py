"""Masks and integer data (docs/ops.md, "Masks and integer data"): comparisons, where,
logical ops, to_f64, ids computed on the tape, against torch float64 and across backends.

The table-driven tests (test_ops_table.py) already run every new op through numpy vs the
host kernels, the emitter, fd-check and the file round trip; this file pins what they
cannot: IEEE special values against torch, the composites, the cross-entropy chain that
torch.export produces for ``F.cross_entropy(ignore_index=-100)``, and bad computed ids.
"""

import math

import msgpack
import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal, require_c_compiler
from gradtool.tapefile import dumps, load
from support import assert_emitted_c_equals_tape, assert_one_line_error, run

try:
    import torch
except ImportError:                     # torch is an optional extra: its oracles skip
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 2.5, np.inf, -np.inf, np.nan, 1e-300, -7.0])
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")


def _t(x):
    return torch.tensor(np.asarray(x), dtype=torch.float64)


def _bits(x):
    return np.asarray(x, dtype=np.float64).view(np.int64)


# ── comparisons ──────────────────────────────────────────────────────────────

@needs_torch
@pytest.mark.parametrize("op", COMPARISONS)
def test_comparisons_are_torchs_masks_on_every_pair_of_special_values(op):
    tp = gt.Tape()
    a = tp.param(SPECIALS.reshape(-1, 1))                 # [10,1] against [10]: every pair
    b = tp.const(SPECIALS)
    m = getattr(tp, op)(a, b)
    want = getattr(torch, op)(_t(SPECIALS.reshape(-1, 1)), _t(SPECIALS)).double().numpy()
    assert_bits_equal(tp.value(m), want, op)
    assert set(np.unique(tp.value(m))) <= {0.0, 1.0}
    assert not tp.requires[m.id], "a comparison carries no gradient"


def test_comparisons_read_integer_inputs_and_python_numbers():
    tp = gt.Tape()
    t = tp.const(np.array([3, -100, 0, 2 ** 40]), name="target", dtype="i64")
    assert tp.value(tp.ne(t, -100)).tolist() == [1.0, 0.0, 1.0, 1.0]
    assert tp.value(tp.ge(t, 0.5)).tolist() == [1.0, 0.0, 0.0, 1.0]
    assert tp.value(tp.eq(t, tp.const(np.array([3.0])))).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert tp.value(tp.to_f64(t)).tolist() == [3.0, -100.0, 0.0, float(2 ** 40)]
    with pytest.raises(gt.TapeError, match="holds integer data, which exp does not read"):
        tp.exp(t)


def test_no_gradient_flows_through_a_comparison_on_any_backend():
    """where(x > 0, x, y): the mask's input x gets its gradient from where alone."""
    rng = np.random.default_rng(0)
    tp = gt.Tape()
    x = tp.param(rng.normal(size=(3, 4)))
    y = tp.param(rng.normal(size=(3, 4)))
    m = tp.gt(x, 0.0)
    out = tp.where(m, x, y)
    loss = tp.sum(tp.mul(out, tp.const(rng.uniform(0.5, 1.5, (3, 4)))))
    tp.backward(loss)
    assert not tp.touched(m)
    w = tp.value(tp.var(loss.id - 1)) / np.where(tp.value(m) != 0, tp.value(x), tp.value(y))
    assert np.allclose(tp.grad(x), np.where(tp.value(m) != 0, w, 0.0), rtol=1e-15)
    _host_gives_no_gradient(tp, loss, m, [x, y])


def _host_gives_no_gradient(tp, loss, stop, params):
    """On the host device program ``stop`` has no gradient slot, and every param's
    gradient is the tape's, bit for bit."""
    require_c_compiler()
    from gradtool.device import capture
    rp = capture(tp, loss, "host")
    assert rp.program.grad_off[stop.id] < 0, f"the device program gives node {stop.id} a gradient"
    rp.forward()
    rp.backward()
    for p in params:
        assert_bits_equal(rp.grad(p), tp.grad(p))


def test_detach_stops_the_gradient_on_every_backend_and_fd_check_agrees(tmp_path):
    """A straight-through estimator, x + detach(q(x) - x): the value is q(x) (up to the two
    roundings), the gradient the identity's; loss = sum(x * detach(x * x)) has gradient
    x * x exactly.  fd-check holds a detach node's value while it perturbs a param, so it
    passes where a plain central difference (which sees 3 x^2) would not."""
    rng = np.random.default_rng(3)
    tp = gt.Tape()
    x = tp.param(rng.normal(size=(3, 4)), name="x")
    q = tp.tanh(tp.muls(x, 3.0))
    ste = tp.add(x, tp.detach(tp.sub(q, x)))
    sq = tp.detach(tp.mul(x, x))
    k = rng.uniform(0.5, 1.5, (3, 4))
    loss = tp.add(tp.sum(tp.mul(ste, tp.const(k))), tp.sum(tp.mul(x, sq)))
    tp.backward(loss)
    assert not tp.touched(sq)
    xv = tp.value(x)
    assert_bits_equal(tp.value(sq), xv * xv)
    assert_bits_equal(tp.grad(x), k + xv * xv)        # one rounding each: exact copies
    report = gt.fd_check(tp, loss)
    assert report.passed, report
    path = tmp_path / "ste.msgpack"
    path.write_bytes(dumps(tp, loss=loss))
    r = run("fd-check", str(path))
    assert r.exit_code == 0, (r.stdout, r.stderr)
    _host_gives_no_gradient(tp, loss, sq, [x])


# ── where ────────────────────────────────────────────────────────────────────

@needs_torch
def test_where_copies_signed_zeros_infinities_and_nans_like_torch_where():
    mask = (np.arange(10) % 3 == 0).astype(np.float64)           # [10]
    a = SPECIALS.reshape(-1, 1)                                  # [10,1]
    b = -SPECIALS[::-1]                                          # [10]
    tp = gt.Tape()
    out = tp.where(tp.const(mask), tp.const(a), tp.const(b))    # [10,10], broadcast
    want = torch.where(_t(mask).bool(), _t(a), _t(b)).numpy()
    got = tp.value(out)
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all()
    assert (_bits(got)[~nan] == _bits(want)[~nan]).all(), "every non-NaN bit, signs of 0 too"
    # the NaN copied is the input's own NaN, bit for bit (x + (-0.0) keeps its payload)
    src = np.broadcast_to(np.where(mask != 0, a, b), want.shape)
    assert (_bits(got)[nan] == _bits(src)[nan]).all()


def test_where_with_numbers_and_a_nan_mask():
    tp = gt.Tape()
    m = tp.const(np.array([1.0, 0.0, np.nan, -0.0]))
    x = tp.const(np.array([-0.0, 5.0, 7.0, 8.0]))
    assert _bits(tp.value(tp.where(m, x, 0.0))).tolist() == _bits([-0.0, 0.0, 7.0, 0.0]).tolist()
    ids = tp.where(m, tp.const(np.array([4, 5, 6, 7]), dtype="i64"), 0)
    assert tp.integral[ids.id], "where of integer data and an int stays integer-valued"
    assert tp.value(ids).tolist() == [4.0, 0.0, 6.0, 0.0]


@needs_torch
def test_where_matches_torch_values_and_gradients_with_broadcasting():
    rng = np.random.default_rng(1)
    xa, xb = rng.normal(size=(2, 3, 1)), rng.normal(size=(4,))
    mask = (rng.random((3, 4)) < 0.5).astype(np.float64)
    w = rng.normal(size=(2, 3, 4))
    tp = gt.Tape()
    a, b = tp.param(xa), tp.param(xb)
    out = tp.where(tp.const(mask), a, b)
    loss = tp.sum(tp.mul(tp.mul(out, out), tp.const(w)))
    tp.backward(loss)
    ta, tb = _t(xa).requires_grad_(), _t(xb).requires_grad_()
    tout = torch.where(_t(mask).bool(), ta, tb)
    tl = ((tout * tout) * _t(w)).sum()
    tl.backward()
    assert_bits_equal(tp.value(out), tout.detach().numpy(), "where's values are copies")
    assert abs(tp.value(loss)[0] - tl.item()) <= 1e-12 * abs(tl.item())
    for mine, theirs in ((a, ta), (b, tb)):
        g, tg = tp.grad(mine), theirs.grad.numpy()
        assert np.linalg.norm(g - tg) <= 1e-11 * np.linalg.norm(tg)
    assert gt.fd_check(tp, loss, eps=1e-6, rtol=1e-5, atol=1e-7).passed


@needs_torch
def test_logical_ops_any_and_counts_match_torch():
    rng = np.random.default_rng(2)
    m = (rng.random((3, 5)) < 0.4).astype(np.float64)
    n = (rng.random((5,)) < 0.6).astype(np.float64)
    tp = gt.Tape()
    cm, cn = tp.const(m), tp.const(n)
    tm, tn = _t(m).bool(), _t(n).bool()
    assert_bits_equal(tp.value(tp.logical_and(cm, cn)), torch.logical_and(tm, tn).double())
    assert_bits_equal(tp.value(tp.logical_or(cm, cn)), torch.logical_or(tm, tn).double())
    assert_bits_equal(tp.value(tp.logical_not(cm)), torch.logical_not(tm).double())
    assert_bits_equal(tp.value(tp.max(cm, axis=1)), tm.any(dim=1).double())     # any
    assert_bits_equal(tp.value(tp.sum(cm, axis=0)), tm.sum(dim=0).double())      # counts
    assert_bits_equal(tp.value(tp.logical_not(tp.const(np.array([-0.0, np.nan])))),
                      np.array([1.0, 0.0]))


# ── cross entropy with ignore_index, as torch.export decomposes it ──────────

N, C, D = 6, 5, 4
TARGETS = np.array([1, -100, 4, 0, -100, 2])


def ce_tape(rng):
    """The decomposition of F.cross_entropy(x @ w + b, target, ignore_index=-100):
    ne -> where -> unsqueeze -> gather(log_softmax) -> squeeze -> neg -> where -> sum /
    sum(mask).to(float), recorded by hand through the Tape."""
    tp = gt.Tape()
    x = tp.const(rng.normal(size=(N, D)), name="x")
    target = tp.const(TARGETS, name="target", dtype="i64")
    w = tp.param(rng.normal(size=(D, C)) * 0.5, name="w")
    b = tp.param(np.zeros((1, C)), name="b")
    logits = tp.add(tp.matmul(x, w), b)
    valid = tp.ne(target, -100)                                    # [N] mask
    ids = tp.reshape(tp.where(valid, target, 0), [N, 1])           # unsqueeze: computed ids
    picked = tp.take_along(tp.log_softmax(logits, axis=1), ids, axis=1)
    nll = tp.neg(tp.reshape(picked, [N]))                          # squeeze, neg
    total = tp.sum(tp.where(valid, nll, 0.0))
    loss = tp.div(total, tp.to_f64(tp.sum(valid)))
    return tp, loss


def torch_ce(tp):
    x = torch.tensor(tp.value(tp.var("x")))
    w = torch.tensor(tp.value(tp.var("w"))).requires_grad_()
    b = torch.tensor(tp.value(tp.var("b"))).requires_grad_()
    target = torch.tensor(tp.value(tp.var("target")))
    loss = torch.nn.functional.cross_entropy(x @ w + b, target, ignore_index=-100)
    loss.backward()
    return loss.item(), {"w": w.grad.numpy(), "b": b.grad.numpy()}


@needs_torch
def test_cross_entropy_with_ignore_index_matches_torch_float64():
    tp, loss = ce_tape(np.random.default_rng(3))
    tp.backward(loss)
    want, grads = torch_ce(tp)
    assert abs(tp.value(loss)[0] - want) <= 1e-12 * abs(want)
    for name, g in grads.items():
        assert np.linalg.norm(tp.grad(tp.var(name)) - g) <= 1e-11 * np.linalg.norm(g), name
    assert gt.fd_check(tp, loss, eps=1e-6, rtol=1e-5, atol=1e-7).passed
    # new targets per minibatch: the mask and the ids are recomputed by the replay
    tp.set_value(tp.var("target"), np.array([-100, 3, 3, -100, 0, -100]))
    tp.forward()
    tp.zero_grad()
    tp.backward(loss)
    want, grads = torch_ce(tp)
    assert abs(tp.value(loss)[0] - want) <= 1e-12 * abs(want)
    assert np.linalg.norm(tp.grad(tp.var("w")) - grads["w"]) <= 1e-11 * np.linalg.norm(grads["w"])


def test_cross_entropy_round_trips_and_host_replay_is_bit_identical():
    require_c_compiler()
    from gradtool.device import capture

    tp, loss = ce_tape(np.random.default_rng(4))
    raw = dumps(tp, loss=loss, values=True)
    back = load(raw)
    assert dumps(back.tape, loss=back.loss, values=True) == raw
    tp.backward(loss)
    for variant in ("tiled", "per-thread", "per-thread-reversed"):
        for fuse in (False, True):
            rp = capture(tp, loss, "host", host_kernels=variant, fuse=fuse)
            rp.forward()
            rp.backward()
            assert_bits_equal(rp.value(loss), tp.value(loss), f"loss {variant} {fuse}")
            for p in tp.params():
                assert_bits_equal(rp.grad(p), tp.grad(p), f"grad {p.id} {variant} {fuse}")


@pytest.fixture
def ce_files(tmp_path):
    rng = np.random.default_rng(5)
    tp, loss = ce_tape(rng)
    path = tmp_path / "ce.msgpack"
    path.write_bytes(dumps(tp, loss=loss))
    xs = rng.normal(size=(4 * N, D))
    ys = rng.integers(0, C, 4 * N)
    ys[rng.random(4 * N) < 0.3] = -100
    data = tmp_path / "data.npz"
    np.savez(data, x=xs, target=ys)
    return tmp_path, path, data


def test_cross_entropy_trains_to_the_same_bytes_on_cpu_and_host(ce_files):
    require_c_compiler()
    tmp, path, data = ce_files
    outs = {}
    for backend in ("cpu", "host"):
        out = tmp / f"{backend}.msgpack"
        result = run("train", path, "--data", data, "--epochs", "3", "--lr", "0.01",
                     "--backend", backend, "--save", out)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        outs[backend] = out.read_bytes()
    assert outs["cpu"] == outs["host"]
    result = run("replay-gpu", path, "--backend", "host", "--check", "--episodes", "2",
                 "--warmup", "0")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    result = run("fd-check", path)
    assert result.exit_code == 0, (result.stdout, result.stderr)


@pytest.mark.parametrize("backend", ["cpu", "host"])
def test_a_computed_id_out_of_range_at_run_time_is_one_clear_error(ce_files, backend):
    if backend == "host":
        require_c_compiler()
    tmp, path, data = ce_files
    bad = tmp / "bad.npz"
    ys = np.load(data)["target"].copy()
    ys[7] = C + 2                                    # not ignored: an id past the 5 classes
    np.savez(bad, x=np.load(data)["x"], target=ys)
    result = run("train", path, "--data", bad, "--backend", backend, "--no-shuffle")
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    *progress, last = result.stderr.splitlines()      # the run's header lines, then ONE error
    assert not any("node" in line for line in progress), result.stderr
    for needle in ("node 14 (take_along): its ids, computed by node 12 (reshape)",
                   f"id {C + 2} at position [1, 0] is outside [0, {C})"):
        assert needle in last, (needle, last)


def test_bad_computed_ids_are_refused_by_the_tape_and_the_device():
    tp, loss = ce_tape(np.random.default_rng(6))
    tp.set_value(tp.var("target"), np.array([1, 2, 9, 0, -100, -5]))
    with pytest.raises(gt.GradtoolError, match=r"\(take_along\): its ids, computed by node "
                                               r"\d+ \(reshape\): id 9 at position \[2, 0\] "
                                               r"is outside \[0, 5\)"):
        tp.forward()
    require_c_compiler()
    from gradtool.device import capture
    tp, loss = ce_tape(np.random.default_rng(6))
    rp = capture(tp, loss, "host")
    rp.set_input(tp.var("target"), np.array([1, 2, 9, 0, -100, -5]))
    with pytest.raises(gt.GradtoolError, match=r"id 9 at position \[2, 0\] is outside"):
        rp.forward()
    rp.set_input(tp.var("target"), TARGETS)      # the flag is cleared: good ids run again
    rp.forward()
    assert math.isfinite(float(rp.value(loss)[0]))


def test_fractional_and_nan_ids_are_bad_ids():
    tp = gt.Tape()
    table = tp.param(np.ones((4, 2)))
    half = tp.const(np.array([0.5]))
    with pytest.raises(gt.TapeError, match="must be integer ids"):
        tp.take(table, half)                       # a float node is not integer-valued
    tp.reset_to(2)
    ids = tp.const(np.array([1, 2]), dtype="i64", name="ids")
    scaled = tp.mul(tp.to_f64(ids), tp.to_f64(ids))   # integer-valued: 1, 4 -> 4 is out
    with pytest.raises(gt.TapeError, match=r"id 4 at position \[1\] is outside \[0, 4\)"):
        tp.take(table, scaled)
    assert gt.ops.bad_id(np.array([1.0, 2.5]), 4) == "id 2.5 at position [1] is not a whole number"
    assert gt.ops.bad_id(np.array([np.nan]), 4) == "id nan at position [0] is outside [0, 4)"


def test_adds_and_muls_by_a_whole_number_keep_ids_integer_valued(tmp_path):
    """ids + 1 and ids * 2 (a whole s) stay integer-valued, for the recorder and the
    loader alike; ids * 0.5 or ids + 0.5 do not, and a take of them is refused."""
    tp = gt.Tape()
    table = tp.param(np.arange(12.0).reshape(6, 2))
    ids = tp.to_f64(tp.const(np.array([0, 2, 1]), dtype="i64", name="ids"))
    shifted = tp.muls(tp.adds(ids, 1.0), 2.0)             # 2, 6, 4
    picked = tp.take(table, tp.adds(shifted, -2.0))       # 0, 4, 2
    assert_bits_equal(tp.value(picked), tp.value(table)[[0, 4, 2]])
    loss = tp.sum(picked)
    loaded = load(dumps(tp, loss=loss)).tape
    assert loaded.nodes[picked.id].op == "take" and loaded.integral[picked.id - 1]
    for s_op, s in (("muls", 0.5), ("adds", 0.5), ("muls", float("inf"))):
        with pytest.raises(gt.TapeError, match="must be integer ids"):
            tp.take(table, getattr(tp, s_op)(ids, s))
        tp.reset_to(len(tp.nodes) - 1)


def test_a_file_whose_computed_ids_are_out_of_range_is_refused(tmp_path):
    tp, loss = ce_tape(np.random.default_rng(7))
    doc = msgpack.unpackb(dumps(tp, loss=loss))
    t = next(k for k, n in enumerate(doc["nodes"]) if n.get("name") == "target")
    take = next(k for k, n in enumerate(doc["nodes"]) if n["op"] == "take_along")
    doc["nodes"][t] = dict(doc["nodes"][t], data=np.array([1, 2, 3, 4, 5, 6], "<i8").tobytes())
    path = tmp_path / "bad.msgpack"
    path.write_bytes(msgpack.packb(doc))
    with pytest.raises(gt.TapeFileError) as err:
        load(path)
    assert (err.value.node, err.value.field) == (take, "b")
    assert_one_line_error(run("inspect", path), 2, f"node {take}: field 'b'",
                          "id 5 at position [4, 0] is outside [0, 5)")
    # ids from a node that is not integer-valued (the log_softmax itself)
    doc = msgpack.unpackb(dumps(tp, loss=loss))
    doc["nodes"][take] = dict(doc["nodes"][take], b=doc["nodes"][take]["a"])
    path.write_bytes(msgpack.packb(doc))
    assert_one_line_error(run("inspect", path), 2, f"node {take}: field 'b'",
                          "reads integer ids here", "it is a log_softmax")


def test_take_with_computed_ids_and_a_learning_table_on_the_host():
    """An embedding whose ids are computed on the tape: the device has no host-built index
    for them, so its backward scans (k_take_bwd_scan) in the same order."""
    require_c_compiler()
    from gradtool.device import capture
    rng = np.random.default_rng(8)
    tp = gt.Tape()
    table = tp.param(rng.normal(size=(5, 3)))
    tokens = tp.const(np.array([[4, -1, 3], [3, 0, -1]]), name="tokens", dtype="i64")
    ids = tp.where(tp.ge(tokens, 0), tokens, 0)                # padding -1 -> row 0
    emb = tp.take(table, ids)
    loss = tp.sum(tp.mul(emb, tp.const(rng.normal(size=(2, 3, 3)))))
    tp.backward(loss)
    for variant in ("tiled", "per-thread", "per-thread-reversed"):
        rp = capture(tp, loss, "host", host_kernels=variant)
        rp.forward()
        rp.backward()
        assert_bits_equal(rp.grad(table), tp.grad(table), variant)


def test_integer_data_read_as_values_must_convert_exactly():
    big = np.array([1, 2 ** 53 + 1])
    tp = gt.Tape()
    t = tp.const(big, dtype="i64", name="t")
    with pytest.raises(gt.TapeError, match=r"integer 9007199254740993 at position \[1\] is "
                                           r"beyond \+-9007199254740992"):
        tp.ne(t, 0)
    tp = gt.Tape()
    t = tp.const(np.array([1, 2]), dtype="i64", name="t")
    x = tp.param(np.ones(2))
    loss = tp.sum(tp.mul(tp.to_f64(tp.ne(t, 1)), x))
    with pytest.raises(gt.TapeError, match="beyond"):
        tp.set_value(t, big)
    doc = msgpack.unpackb(dumps(tp, loss=loss))
    doc["nodes"][0] = dict(doc["nodes"][0], data=big.astype("<i8").tobytes())
    with pytest.raises(gt.TapeFileError, match="beyond") as err:
        load(msgpack.packb(doc))
    assert err.value.node == 3
    require_c_compiler()
    from gradtool.device import capture
    rp = capture(tp, loss, "host")
    with pytest.raises(gt.GradtoolError, match="beyond"):
        rp.set_input(t, big)
    # The f32 device copy (replay-gpu --dtype f32: leaves rounded once, the ids kept i64)
    # no longer reads integers as float32 values, so 2^24 + 1 is no error of its own; but
    # to_f64 stays float64 whatever its input, so the copy holds both float dtypes, and a
    # device program runs one: refused in one line, never computed in the wrong dtype.
    tp.set_value(t, np.array([1, 2 ** 24 + 1]))
    with pytest.raises(gt.GradtoolError, match="holds float32 values and node .* float64"):
        capture(tp, loss, "host", dtype="f32")


def test_training_data_read_as_values_must_convert_exactly(ce_files):
    tmp, path, data = ce_files
    ys = np.load(data)["target"].copy()
    ys[3] = 2 ** 60
    np.savez(tmp / "big.npz", x=np.load(data)["x"], target=ys)
    assert_one_line_error(run("train", path, "--data", tmp / "big.npz"), 2, "array 'target'",
                          f"integer {2 ** 60} at position [3] is beyond")


def test_emitted_c_reads_integer_inputs_and_computes_where_like_the_tape(tmp_path):
    """A scalar tape (the emitter's scope) with an i64 input slot compared and where-d."""
    import shutil
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    cases = []
    for k, (target, xv) in enumerate([(3, 0.5), (-100, -0.0), (0, -2.0), (-100, 1.5)]):
        tp = gt.Tape()
        t = tp.const(np.array([target]), name="t", dtype="i64")
        x = tp.param(np.array([xv]), name="x")
        y = tp.where(tp.ne(t, -100), tp.mul(x, x), tp.to_f64(t))
        cases.append((f"masks_{k}", tp, tp.mul(y, tp.where(tp.lt(x, 0.0), x, 1.0))))
    assert_emitted_c_equals_tape(tmp_path, cases, cc, cflags=("-Wall", "-Werror"))


# ── on a GPU (skipped without one; scripts/gpu_check.sh runs them) ─────────

def _cuda_ok():
    from gradtool.device.cuda import cuda_status
    ok, why = cuda_status()
    if not ok:
        pytest.skip(f"no CUDA backend here: {why}")


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("graph", [True, False])
def test_cross_entropy_on_cuda_is_bit_identical_and_refuses_bad_computed_ids(graph, fuse):
    _cuda_ok()
    from gradtool.device import capture
    tp, loss = ce_tape(np.random.default_rng(9))
    tp.backward(loss)
    rp = capture(tp, loss, "cuda", graph=graph, fuse=fuse)
    rp.forward()
    rp.backward()
    assert_bits_equal(rp.value(loss), tp.value(loss), "loss")
    for p in tp.params():
        assert_bits_equal(rp.grad(p), tp.grad(p), f"grad {p.id}")
    rp.set_input(tp.var("target"), np.array([1, 2, 9, 0, -100, -5]))
    with pytest.raises(gt.GradtoolError, match=r"node 14 \(take_along\): its ids, computed by "
                                               r"node 12 \(reshape\): id 9 at position \[2, 0\]"):
        rp.forward()
    rp.set_input(tp.var("target"), TARGETS)
    rp.forward()
    assert_bits_equal(rp.value(loss), tp.value(loss), "loss after the error")


def test_take_with_computed_ids_on_cuda():
    _cuda_ok()
    from gradtool.device import capture
    rng = np.random.default_rng(10)
    tp = gt.Tape()
    table = tp.param(rng.normal(size=(5, 3)))
    tokens = tp.const(np.array([[4, -1, 3], [3, 0, -1]]), name="tokens", dtype="i64")
    emb = tp.take(table, tp.where(tp.ge(tokens, 0), tokens, 0))
    loss = tp.sum(tp.mul(emb, tp.const(rng.normal(size=(2, 3, 3)))))
    tp.backward(loss)
    rp = capture(tp, loss, "cuda")
    rp.forward()
    rp.backward()
    assert_bits_equal(rp.grad(table), tp.grad(table))
