"""The ops for real models (axis reductions, max, abs, maximum, log_softmax, take,
take_along, broadcast bmm) beyond what every op gets from tests/test_ops_table.py:

* the documented tie and NaN rules of max and maximum, pinned on the numpy reference
  and on the host backend (all three kernel variants);
* integer ids: out-of-range and float ids refused at record, set_value, load, device
  input and training-data time, each with a clear one-line error;
* the reference against PyTorch float64, forward and backward, including the
  positions of infinities and NaNs;
* more shapes and axes on the host backend, and the old full reductions unchanged.
"""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal, bits, require_c_compiler
from gradtool import numerics as nx
from gradtool.device import capture
from gradtool.errors import GradtoolError
from gradtool.npzio import write_npz
from gradtool.tapefile import dumps, load
from support import VARIANTS, assert_one_line_error, backward_grads, host_matches, run

NAN, INF = math.nan, math.inf
# ── max: ties, signed zeros, NaN ──────────────────────────────────────────

MAX_ROWS = [
    # row, the documented max (an exact copy of the element), the index that gets g
    ([1.0, 3.0, 3.0, 2.0], 3.0, 1),                  # a tie: the first one
    ([-0.0, 0.0, -1.0], -0.0, 0),                     # -0.0 and +0.0 tie: the first, sign and all
    ([0.0, -0.0, -1.0], 0.0, 0),
    ([1.0, NAN, 5.0, NAN], NAN, 1),                   # a NaN wins: the first NaN
    ([-INF, -INF], -INF, 0),
    ([2.0, INF, INF], INF, 1),
]


@pytest.mark.parametrize("row,value,index", MAX_ROWS)
def test_max_picks_the_first_maximal_element_and_gives_it_the_whole_gradient(row, value, index):
    for axis, shape in ((None, (len(row),)), (1, (1, len(row))), (0, (len(row), 1))):
        tp = gt.Tape()
        x = tp.param(np.array(row).reshape(shape))
        m = tp.max(x, axis=axis)
        got = float(tp.value(m)[0])
        assert bits(got) == bits(value) or (math.isnan(value) and math.isnan(got))
        loss = tp.muls(tp.sum(m), 2.5)
        grad = backward_grads(tp, loss)[x.id].reshape(-1)
        want = np.zeros(len(row))
        want[index] = 2.5
        assert_bits_equal(grad, want, f"max gradient of {row}")
        for variant in VARIANTS:
            host_matches(tp, loss, variant)


def test_first_max_is_the_documented_loop():
    """numerics.first_max (np.argmax) == the loop in its docstring, on rows full of ties,
    signed zeros, infinities and NaNs."""
    rng = np.random.default_rng(4)
    pool = np.array([0.0, -0.0, 1.0, -1.0, 1.0, INF, -INF, NAN, 2.0, 2.0])
    rows = rng.choice(pool, size=(3000, 5))
    vals, idx = nx.first_max(rows, 1)
    for r in range(rows.shape[0]):
        m, best = rows[r, 0], 0
        for j in range(1, 5):
            x = rows[r, j]
            if m == m and (x > m or x != x):
                m, best = x, j
        assert idx[r, 0] == best, rows[r]
        assert bits(vals[r, 0]) == bits(rows[r, best])


# ── maximum: ties, signed zeros, NaN on either side ──────────────────────

MAXIMUM_PAIRS = [
    # a, b, the documented result, the gradient to (a, b) for g = 1
    (2.0, 2.0, 2.0, (1.0, 0.0)),                      # a tie: all of it to a
    (-0.0, 0.0, -0.0, (1.0, 0.0)),                    # zeros tie: a, sign and all
    (0.0, -0.0, 0.0, (1.0, 0.0)),
    (1.0, 3.0, 3.0, (0.0, 1.0)),
    (NAN, 1.0, NAN, (0.0, 1.0)),                      # NaN on either side: NaN, gradient to b
    (1.0, NAN, NAN, (0.0, 1.0)),
    (INF, -INF, INF, (1.0, 0.0)),
]


def test_maximum_ties_and_nan_follow_the_documented_rule():
    a_vals = np.array([p[0] for p in MAXIMUM_PAIRS])
    b_vals = np.array([p[1] for p in MAXIMUM_PAIRS])
    tp = gt.Tape()
    a, b = tp.param(a_vals), tp.param(b_vals)
    y = tp.maximum(a, b)
    for k, (_, _, want, _) in enumerate(MAXIMUM_PAIRS):
        got = tp.value(y)[k]
        assert bits(got) == bits(want) or (math.isnan(want) and math.isnan(got)), k
    loss = tp.sum(y)
    grads = backward_grads(tp, loss)
    assert_bits_equal(grads[a.id], np.array([p[3][0] for p in MAXIMUM_PAIRS]), "to a")
    assert_bits_equal(grads[b.id], np.array([p[3][1] for p in MAXIMUM_PAIRS]), "to b")
    for variant in VARIANTS:
        host_matches(tp, loss, variant)


def test_abs_is_exact_and_its_gradient_is_zero_at_zero():
    x_vals = np.array([-2.5, -0.0, 0.0, 3.0, 5e-324, -INF, NAN])
    tp = gt.Tape()
    x = tp.param(x_vals)
    y = tp.abs(x)
    assert_bits_equal(tp.value(y)[:6], np.array([2.5, 0.0, 0.0, 3.0, 5e-324, INF]), "abs")
    loss = tp.sum(tp.muls(y, 1.5))
    g = backward_grads(tp, loss)[x.id]
    assert_bits_equal(g, np.array([-1.5, 0.0, 0.0, 1.5, 1.5, -1.5, 0.0]), "abs gradient")
    for variant in VARIANTS:
        host_matches(tp, loss, variant)


# ── axis reductions, log_softmax, gathers, broadcast bmm on the host ──────

@pytest.mark.parametrize("op", ["sum", "mean", "max"])
@pytest.mark.parametrize("shape,axis", [((7,), 0), ((3, 5), 0), ((3, 5), 1), ((2, 3, 4), 1),
                                        ((2, 3, 4), -1), ((2, 3, 4), None), ((1, 4), 0)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_along_each_axis(op, shape, axis, keepdims, rng):
    tp = gt.Tape()
    x = tp.param(rng.uniform(-1.0, 1.0, shape))
    t = tp.tanh(x)
    y = getattr(tp, op)(t, axis=axis, keepdims=keepdims)
    ref = {"sum": np.sum, "mean": np.mean, "max": np.max}[op](tp.value(t), axis=axis,
                                                              keepdims=keepdims)
    assert tp.value(y).shape == (np.shape(ref) or (1,))       # numpy's, [1] for no dims
    np.testing.assert_allclose(tp.value(y).reshape(np.shape(ref)), ref, rtol=1e-14)
    loss = tp.sum(tp.mul(y, tp.const(rng.uniform(-1, 1, tp.value(y).shape))))
    host_matches(tp, loss, "per-thread-reversed")
    host_matches(tp, loss)


def test_full_reductions_are_unchanged():
    """No axis: shape [1], the serial order, and no attribute in the node or the file,
    so files written before axis reductions existed read and write the same bytes."""
    tp = gt.Tape()
    x = tp.param(np.array([[1.0, 2.0], [3.0, -0.0]]))
    s, m = tp.sum(x), tp.mean(x)
    assert tp.value(s).shape == (1,) and tp.nodes[s.id].aux is None
    assert_bits_equal(tp.value(s), nx.serial_sum(tp.value(x)), "sum")
    assert_bits_equal(tp.value(m), nx.serial_mean(tp.value(x)), "mean")
    doc = msgpack.unpackb(dumps(tp, loss=m))
    assert set(doc["nodes"][s.id]) == {"op", "a", "b", "s", "shape"}
    assert tp.value(tp.sum(x, keepdims=True)).shape == (1, 1)


@pytest.mark.parametrize("shape,axis", [((3, 5), 1), ((3, 5), 0), ((2, 3, 4), 1), ((6,), 0)])
def test_log_softmax_each_axis(shape, axis, rng):
    tp = gt.Tape()
    x = tp.param(rng.uniform(-4.0, 4.0, shape))
    y = tp.log_softmax(x, axis=axis)
    loss = tp.sum(tp.mul(y, tp.const(rng.uniform(-1, 1, shape))))
    for variant in VARIANTS:
        host_matches(tp, loss, variant)


def test_log_softmax_stays_finite_where_log_of_softmax_underflows():
    tp = gt.Tape()
    x = tp.param(np.array([[0.0, 800.0, -800.0]]))
    old = tp.log(tp.softmax(x, axis=1))
    new = tp.log_softmax(x, axis=1)
    assert np.isneginf(tp.value(old)).sum() == 2
    assert_bits_equal(tp.value(new), np.array([[-800.0, 0.0, -1600.0]]), "log_softmax")


@pytest.mark.parametrize("table_shape,ids_shape", [((5, 3), (2, 4)), ((6,), (3,)),
                                                   ((4, 2, 3), (5,)), ((3, 1), (2, 2, 2))])
def test_take_shapes_and_repeated_ids(table_shape, ids_shape, rng):
    tp = gt.Tape()
    table = tp.param(rng.uniform(-1, 1, table_shape))
    ids_np = rng.integers(0, table_shape[0], ids_shape)
    ids = tp.const(ids_np, name="ids", dtype="i64")
    y = tp.take(table, ids)
    assert_bits_equal(tp.value(y), np.take(tp.value(table), ids_np, axis=0), "take")
    w = rng.uniform(-1, 1, tp.value(y).shape)
    loss = tp.sum(tp.mul(y, tp.const(w)))
    g = backward_grads(tp, loss)[table.id]
    want = np.zeros(table_shape)          # the serial scatter: row by row, positions ascending
    flat_ids, rows = ids_np.reshape(-1), w.reshape((ids_np.size,) + table_shape[1:])
    for p in range(ids_np.size):
        want[flat_ids[p]] = want[flat_ids[p]] + rows[p]
    assert_bits_equal(g, want, "take gradient")
    for variant in VARIANTS:
        host_matches(tp, loss, variant)


def test_take_index_lists_each_rows_positions_ascending():
    order, start = nx.take_index(np.array([[3, 0, 3], [1, 3, 0]]), 5)
    assert start.tolist() == [0, 2, 3, 3, 6, 6]
    assert order.tolist() == [1, 5, 3, 0, 2, 4]


@pytest.mark.parametrize("shape,ids_shape,axis", [((3, 4), (3, 1), 1), ((3, 4), (3, 3), 1),
                                                  ((4, 2), (2, 2), 0), ((2, 3, 4), (2, 5, 4), 1)])
def test_take_along_each_axis(shape, ids_shape, axis, rng):
    tp = gt.Tape()
    a = tp.param(rng.uniform(-1, 1, shape))
    ids_np = rng.integers(0, shape[axis], ids_shape)
    y = tp.take_along(a, tp.const(ids_np, dtype="i64"), axis=axis)
    assert_bits_equal(tp.value(y), np.take_along_axis(tp.value(a), ids_np, axis=axis), "gather")
    loss = tp.sum(tp.mul(y, tp.const(rng.uniform(-1, 1, ids_shape))))
    for variant in VARIANTS:
        host_matches(tp, loss, variant)


@pytest.mark.parametrize("sa,sb", [((1, 3, 4), (5, 4, 2)), ((5, 3, 4), (1, 4, 2)),
                                   ((1, 3, 4), (1, 4, 2)), ((4, 2, 3), (4, 3, 2))])
def test_bmm_broadcasts_a_batch_of_one_and_sums_its_gradient_serially(sa, sb, rng):
    tp = gt.Tape()
    a, b = tp.param(rng.uniform(-1, 1, sa)), tp.param(rng.uniform(-1, 1, sb))
    y = tp.bmm(a, b)
    batch = max(sa[0], sb[0])
    assert tp.value(y).shape == (batch, sa[1], sb[2])
    w = rng.uniform(-1, 1, tp.value(y).shape)
    grads = backward_grads(tp, tp.sum(tp.mul(y, tp.const(w))))
    wa, wb = np.broadcast_to(tp.value(a), (batch,) + sa[1:]), np.broadcast_to(tp.value(b),
                                                                             (batch,) + sb[1:])
    per_a = nx.bmm(w, np.swapaxes(wb, 1, 2))
    if sa[0] == 1 and batch > 1:          # 0.0 + P[0] + P[1] + ..., batch ascending
        per_a = 0.0 + sum(per_a[k:k + 1] for k in range(batch))
    assert_bits_equal(grads[a.id], per_a, "stretched side's gradient")
    per_b = nx.bmm(np.swapaxes(wa, 1, 2), w)
    if sb[0] == 1 and batch > 1:
        per_b = 0.0 + sum(per_b[k:k + 1] for k in range(batch))
    assert_bits_equal(grads[b.id], per_b, "b's gradient")
    for variant in VARIANTS:
        host_matches(tp, tp.sum(tp.mul(y, tp.const(w))), variant)


def test_bmm_still_refuses_batches_that_do_not_broadcast():
    tp = gt.Tape(raise_on_error=False)
    tp.bmm(tp.param(np.ones((2, 3, 4))), tp.param(np.ones((3, 4, 2))))
    assert not tp.ok and "a batch of 1 on either side stretches" in tp.error


# ── integer ids: range and type, everywhere they enter ────────────────────

def ids_tape(ids=((0, 2), (1, 2))):
    tp = gt.Tape()
    table = tp.param(np.arange(6.0).reshape(3, 2), name="table")
    tokens = tp.const(np.array(ids), name="tokens", dtype="i64")
    loss = tp.sum(tp.take(table, tokens))
    return tp, table, tokens, loss


@pytest.mark.parametrize("bad,where", [(3, "[1, 1]"), (-1, "[1, 1]")])
def test_out_of_range_ids_are_refused_when_recording(bad, where):
    tp = gt.Tape(raise_on_error=False)
    table = tp.param(np.zeros((3, 2)))
    tokens = tp.const(np.array([[0, 2], [1, bad]]), dtype="i64")
    assert tp.take(table, tokens).poisoned
    assert f"id {bad} at position {where} is outside [0, 3)" in tp.error
    with pytest.raises(gt.TapeError, match=r"outside \[0, 3\)"):
        ids_tape(ids=((0, 2), (1, bad)))


def test_ids_must_be_integers_and_only_ids_inputs_read_them():
    tp = gt.Tape()
    with pytest.raises(gt.TapeError, match="float ids are refused, even whole ones"):
        tp.const(np.array([1.0, 2.0]), dtype="i64")
    with pytest.raises(gt.TapeError, match="got bool data"):
        tp.const(np.array([True]), dtype="i64")
    with pytest.raises(gt.TapeError, match="dtype must be 'f64' or 'i64'"):
        tp.const(np.array([1]), dtype="int32")
    table = tp.param(np.ones((3, 2)))
    floats = tp.const(np.array([1.0]))
    ids = tp.const(np.array([1]), dtype="i64")
    with pytest.raises(gt.TapeError, match=r"input b \(node 1\) must be integer ids"):
        tp.take(table, floats)
    tp.reset_to(3)                        # the failed op poisoned the tape
    with pytest.raises(gt.TapeError, match=r"input a \(node 2\) holds integer data, which exp "
                                           r"does not read"):
        tp.exp(ids)
    tp.reset_to(3)
    with pytest.raises(gt.TapeError, match=r"input a \(node 2\) holds integer data, which take "
                                           r"does not read"):
        tp.take(ids, ids)


def test_set_value_checks_ids():
    tp, table, tokens, loss = ids_tape()
    tp.set_value(tokens, np.array([[2, 2], [0, 0]], dtype=np.uint8))
    assert tp.value(tokens).dtype == np.int64
    with pytest.raises(gt.TapeError, match=r"id 3 at position \[0, 1\] is outside \[0, 3\), "
                                           r"the range of the 3-row table that node 2 reads"):
        tp.set_value(tokens, np.array([[0, 3], [0, 0]]))
    with pytest.raises(gt.TapeError, match="float ids are refused"):
        tp.set_value(tokens, np.array([[0.0, 1.0], [0.0, 0.0]]))
    assert tp.value(tokens).tolist() == [[2, 2], [0, 0]]     # nothing written


def test_device_set_input_checks_ids_and_rebuilds_the_take_index():
    require_c_compiler()
    tp, table, tokens, loss = ids_tape()
    rp = capture(tp, loss, "host")
    with pytest.raises(GradtoolError, match=r"id 7 at position \[1, 0\] is outside \[0, 3\)"):
        rp.set_input(tokens, np.array([[0, 0], [7, 0]]))
    with pytest.raises(GradtoolError, match="float ids are refused"):
        rp.set_input(tokens, np.zeros((2, 2)))
    new = np.array([[1, 1], [1, 0]])
    rp.set_input(tokens, new)
    tp.set_value(tokens, new)
    rp.forward()
    rp.backward()
    assert rp.value(tokens).dtype == np.int64 and rp.value(tokens).tolist() == new.tolist()
    want = backward_grads(tp, loss)[table.id]
    assert_bits_equal(rp.grad(table), want, "take backward after new ids")
    assert want[:, 0].tolist() == [1.0, 3.0, 0.0]


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_unchecked_id_in_the_arena_reads_a_nan_row_never_out_of_bounds(variant):
    """Every entry point checks ids; should one reach a kernel anyway (written into the
    arena directly), the gather yields NaN instead of reading outside the table."""
    require_c_compiler()
    tp = gt.Tape()
    table = tp.param(np.arange(6.0).reshape(3, 2))
    tokens = tp.const(np.array([0, 2, 1, 0]), dtype="i64")
    y = tp.take(table, tokens)
    a = tp.param(np.ones((3, 2)))
    z = tp.take_along(a, tp.const(np.array([[1], [0], [1]]), dtype="i64"), axis=1)
    rp = capture(tp, tp.add(tp.sum(y), tp.sum(z)), "host", host_kernels=variant)
    rp.dev.write(rp.program.val_off[tokens.id], np.array([1.0, 3.0, -1.0, 1e300]))
    rp.dev.write(rp.program.val_off[z.id - 1], np.array([2.0, NAN, 1.0]))
    rp.forward()
    assert_bits_equal(rp.value(y)[0], np.array([2.0, 3.0]), "a valid id")
    assert np.isnan(rp.value(y)[1:]).all() and np.isnan(rp.value(z)[:2]).all()
    assert rp.value(z)[2, 0] == 1.0


def test_a_file_with_out_of_range_or_float_ids_is_refused(tmp_path):
    tp, table, tokens, loss = ids_tape()
    doc = msgpack.unpackb(dumps(tp, loss=loss))
    bad = dict(doc, nodes=list(doc["nodes"]))
    bad["nodes"][1] = dict(doc["nodes"][1], data=np.array([0, 2, 1, 3], "<i8").tobytes())
    path = tmp_path / "bad.msgpack"
    path.write_bytes(msgpack.packb(bad))
    with pytest.raises(gt.TapeFileError) as err:
        load(path)
    assert (err.value.node, err.value.field) == (2, "b")
    assert "node 1: id 3 at position [1, 1] is outside [0, 3) for take's input a [3,2]" \
        in str(err.value)
    assert_one_line_error(run("backward", path), 2, "node 2: field 'b'", "outside [0, 3)")
    no_dtype = dict(doc, nodes=list(doc["nodes"]))
    no_dtype["nodes"][1] = {k: v for k, v in doc["nodes"][1].items() if k != "dtype"}
    path.write_bytes(msgpack.packb(no_dtype))
    assert_one_line_error(run("inspect", path), 2, "node 2: field 'b'",
                          "take reads integer ids here, but node 1 is not a const with dtype i64")


def test_a_reader_names_a_dtype_or_op_it_does_not_know(tmp_path):
    tp, table, tokens, loss = ids_tape()
    doc = msgpack.unpackb(dumps(tp, loss=loss))
    path = tmp_path / "future.msgpack"
    for node, field, needle in ((dict(doc["nodes"][1], dtype="u8"), "dtype",
                                 "unknown dtype 'u8' (this reader knows 'f64', 'f32' and 'i64')"),
                                (dict(doc["nodes"][2], op="segsum"), "op",
                                 "unknown op 'segsum'")):
        k = 1 if field == "dtype" else 2
        path.write_bytes(msgpack.packb(dict(doc, nodes=doc["nodes"][:k] + [node]
                                            + doc["nodes"][k + 1:])))
        assert_one_line_error(run("inspect", path), 2, f"node {k}: field '{field}'", needle)


def test_ids_round_trip_as_int64_bytes():
    tp, table, tokens, loss = ids_tape()
    raw = dumps(tp, loss=loss)
    node = msgpack.unpackb(raw)["nodes"][1]
    assert node["dtype"] == "i64" and node["data"] == np.array([0, 2, 1, 2], "<i8").tobytes()
    back = load(raw)
    assert back.tape.values[1].dtype == np.int64 and dumps(back.tape, loss=back.loss) == raw
    out = run("inspect", "--json", "-", input=raw)
    assert out.exit_code == 0 and '"dtype": "i64"' in out.stdout


def test_training_feeds_integer_slots_and_refuses_float_or_out_of_range_ids(tmp_path):
    tp = gt.Tape()
    table = tp.param(np.linspace(-1, 1, 8).reshape(4, 2), name="table")
    tokens = tp.const(np.zeros((2, 3), dtype=int), name="tokens", dtype="i64")
    target = tp.const(np.zeros((2, 3, 2)), name="target")
    loss = tp.mse(tp.take(table, tokens), target)
    path = tmp_path / "emb.msgpack"
    gt.save(tp, path, loss=loss)
    rng = np.random.default_rng(0)
    ok = {"tokens": rng.integers(0, 4, (10, 3)), "target": rng.uniform(-1, 1, (10, 3, 2))}
    write_npz(tmp_path / "ok.npz", ok)
    for backend in ("cpu", "host"):
        result = run("train", path, "--data", tmp_path / "ok.npz", "--epochs", "3",
                     "--backend", backend, "--save", tmp_path / f"{backend}.msgpack")
        assert result.exit_code == 0, result.stderr
    trained = [load(tmp_path / f"{b}.msgpack").tape for b in ("cpu", "host")]
    assert_bits_equal(trained[1].values[0], trained[0].values[0], "host == cpu after training")
    assert not np.array_equal(trained[0].values[0], tp.values[0])
    write_npz(tmp_path / "float.npz", dict(ok, tokens=ok["tokens"].astype(float)))
    assert_one_line_error(run("train", path, "--data", tmp_path / "float.npz"), 2,
                          "array 'tokens' has dtype float64", "takes integer ids",
                          "float ids are refused")
    far = ok["tokens"].copy()
    far[7, 2] = 4
    write_npz(tmp_path / "far.npz", dict(ok, tokens=far))
    assert_one_line_error(run("train", path, "--data", tmp_path / "far.npz"), 2,
                          "id 4 at position [7, 2] is outside [0, 4)")


# ── PyTorch float64 oracle ────────────────────────────────────────────────
#
# Each case records one op on params, weighs its output with a random const, and runs
# the same in torch: the outputs agree where finite (to rounding: torch sums in other
# orders), and infinities and NaNs sit at the same positions; so do the gradients,
# except where the documented rules differ from torch's on purpose (noted per case).

def _specials(rng, shape, k=3):
    x = rng.uniform(-3.0, 3.0, shape)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, size=min(k, flat.size), replace=False)] = \
        rng.choice([INF, -INF, NAN, 0.0, -0.0], size=min(k, flat.size))
    return x


def _oracle_cases(rng):
    """(label, inputs, ids, ours(tp, leaves, ids) -> GVar, theirs(torch, leaves, ids),
    compare gradients)."""
    return [
        ("sum axis 1 keepdims", [_specials(rng, (4, 5))], None,
         lambda tp, x, i: tp.sum(x[0], axis=1, keepdims=True),
         lambda t, x, i: t.sum(x[0], 1, keepdim=True), True),
        ("mean axis 0", [_specials(rng, (4, 5))], None,
         lambda tp, x, i: tp.mean(x[0], axis=0), lambda t, x, i: t.mean(x[0], 0), True),
        ("mean of everything", [rng.uniform(-1, 1, (3, 4))], None,
         lambda tp, x, i: tp.mean(x[0]), lambda t, x, i: t.mean(x[0]).reshape(1), True),
        # max: torch.max(dim) also sends the gradient to the first NaN, or to one maximal
        # element; the rows here have no ties
        ("max axis 1 with inf and nan", [np.array([[1.0, 4.0, -2.0], [NAN, 2.0, NAN],
                                                   [-INF, 3.0, INF], [-INF, -INF, -1.0]])],
         None, lambda tp, x, i: tp.max(x[0], axis=1),
         lambda t, x, i: t.max(x[0], 1).values, True),
        ("max of everything", [rng.uniform(-1, 1, (3, 4))], None,
         lambda tp, x, i: tp.max(x[0]), lambda t, x, i: t.max(x[0]).reshape(1), True),
        # abs: torch's gradient is g * sgn(x), 0 at 0 and at NaN, like ours
        ("abs", [np.array([-2.0, -0.0, 0.0, 3.5, INF, -INF, NAN, 5e-324])], None,
         lambda tp, x, i: tp.abs(x[0]), lambda t, x, i: t.abs(x[0]), True),
        # maximum: torch splits a tie's gradient in halves and sends a NaN's to both
        # sides; the gradient comparison uses tie-free finite inputs
        ("maximum with inf and nan (values)", [_specials(rng, (3, 1, 4)), _specials(rng, (2, 1))],
         None, lambda tp, x, i: tp.maximum(x[0], x[1]),
         lambda t, x, i: t.maximum(x[0], x[1]), False),
        ("maximum broadcast", [rng.uniform(-1, 1, (3, 1, 4)), rng.uniform(-1, 1, (2, 1))],
         None, lambda tp, x, i: tp.maximum(x[0], x[1]),
         lambda t, x, i: t.maximum(x[0], x[1]), True),
        ("log_softmax with inf and nan",
         [np.array([[0.5, -1.0, 2.0], [-INF, 1.0, 2.0], [0.0, INF, -1.0],
                    [-INF, -INF, -INF], [1e308, -1e308, 0.0], [NAN, 0.0, 1.0]])], None,
         lambda tp, x, i: tp.log_softmax(x[0], axis=1),
         lambda t, x, i: t.log_softmax(x[0], 1), True),
        ("log_softmax axis 0", [rng.uniform(-30, 30, (5, 3))], None,
         lambda tp, x, i: tp.log_softmax(x[0], axis=0),
         lambda t, x, i: t.log_softmax(x[0], 0), True),
        ("take", [rng.uniform(-1, 1, (6, 3))], np.array([[5, 0, 5], [2, 5, 0]]),
         lambda tp, x, i: tp.take(x[0], i), lambda t, x, i: x[0][i], True),
        ("take_along", [rng.uniform(-1, 1, (4, 5))], np.array([[4, 4], [0, 1], [2, 2], [3, 0]]),
         lambda tp, x, i: tp.take_along(x[0], i, axis=1),
         lambda t, x, i: t.gather(x[0], 1, i), True),
        ("bmm [1,M,K] @ [B,K,N]", [rng.uniform(-1, 1, (1, 3, 4)), rng.uniform(-1, 1, (5, 4, 2))],
         None, lambda tp, x, i: tp.bmm(x[0], x[1]), lambda t, x, i: t.matmul(x[0], x[1]), True),
        ("bmm [B,M,K] @ [1,K,N]", [rng.uniform(-1, 1, (5, 3, 4)), rng.uniform(-1, 1, (1, 4, 2))],
         None, lambda tp, x, i: tp.bmm(x[0], x[1]), lambda t, x, i: t.matmul(x[0], x[1]), True),
    ]


def assert_like_torch(ours, theirs, what, rtol=1e-13):
    ours, theirs = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    assert ours.shape == theirs.shape, what
    for kind in (np.isnan, np.isposinf, np.isneginf):
        assert np.array_equal(kind(ours), kind(theirs)), (what, kind.__name__, ours, theirs)
    finite = np.isfinite(theirs)
    scale = max(1.0, float(np.max(np.abs(theirs[finite]), initial=0.0)))
    worst = float(np.max(np.abs(ours[finite] - theirs[finite]), initial=0.0))
    assert worst <= rtol * scale, (what, worst, scale)


@pytest.mark.parametrize("case", range(len(_oracle_cases(np.random.default_rng(0)))))
def test_against_pytorch_float64(case):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(100 + case)
    label, inputs, ids, ours, theirs, grads = _oracle_cases(rng)[case]
    tp = gt.Tape()
    leaves = [tp.param(x) for x in inputs]
    tid = None if ids is None else tp.const(ids, dtype="i64")
    with np.errstate(all="ignore"):
        y = ours(tp, leaves, tid)
    w = rng.uniform(0.5, 1.5, tp.value(y).shape)
    loss = tp.sum(tp.mul(y, tp.const(w)))
    got = backward_grads(tp, loss)

    t_leaves = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in inputs]
    t_ids = None if ids is None else torch.tensor(ids)
    t_y = theirs(torch, t_leaves, t_ids)
    (t_y * torch.tensor(w)).sum().backward()
    assert_like_torch(tp.value(y), t_y.detach().numpy(), f"{label}: forward")
    if grads:
        for leaf, t_leaf in zip(leaves, t_leaves, strict=True):
            assert_like_torch(got[leaf.id], t_leaf.grad.numpy(), f"{label}: gradient")


def test_the_oracle_covers_every_new_op():
    ops = set()
    for _, inputs, ids, ours, _, _ in _oracle_cases(np.random.default_rng(0)):
        tp = gt.Tape()
        with np.errstate(all="ignore"):
            ours(tp, [tp.param(x) for x in inputs],
                 None if ids is None else tp.const(ids, dtype="i64"))
        ops |= {n.op for n in tp.nodes}
    assert {"sum", "mean", "max", "abs", "maximum", "log_softmax", "take", "take_along",
            "bmm"} <= ops


# ── one graph of every new op: float32 replay, fd-check from the command line ──

def models_tape(rng):
    tp = gt.Tape()
    table = tp.param(rng.uniform(-1, 1, (6, 4)), name="table")
    ids = tp.const(rng.integers(0, 6, (2, 3)), name="tokens", dtype="i64")
    h = tp.take(table, ids)                                               # [2, 3, 4]
    w = tp.param(rng.uniform(-1, 1, (1, 4, 5)), name="w")
    z = tp.bmm(tp.abs(h), w)                                              # [2, 3, 5]
    z = tp.maximum(z, tp.param(rng.uniform(-0.5, 0.5, (5,)), name="floor"))
    n = tp.div(z, tp.adds(tp.mean(tp.mul(z, z), axis=-1, keepdims=True), 1.0))
    lp = tp.log_softmax(tp.sub(n, tp.max(n, axis=1, keepdims=True)), axis=2)
    target = tp.const(rng.integers(0, 5, (2, 3, 1)), name="target", dtype="i64")
    return tp, tp.neg(tp.sum(tp.take_along(lp, target, axis=2), axis=None))


def test_float32_replay_of_every_new_op_is_within_the_bound():
    require_c_compiler()
    from gradtool.device.engine import F32_BOUND, relative_error
    tp, loss = models_tape(np.random.default_rng(9))
    grads = backward_grads(tp, loss)
    rp = capture(tp, loss, "host", "f32")
    rp.forward()
    rp.backward()
    assert relative_error(rp.loss(), tp.values[loss.id]) <= F32_BOUND
    for pid, g in grads.items():
        assert relative_error(rp.grad(pid), g) <= F32_BOUND, pid
    assert relative_error(rp.grad(0), grads[0]) > 0.0       # really float32


def test_fd_check_command_on_every_new_op(tmp_path):
    tp, loss = models_tape(np.random.default_rng(10))
    path = tmp_path / "models.msgpack"
    gt.save(tp, path, loss=loss)
    result = run("fd-check", path)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert {n.op for n in tp.nodes} >= {"take", "bmm", "abs", "maximum", "mean", "max",
                                         "log_softmax", "take_along", "sum"}
