"""scatter (the scatter-add of rows by ids, take's adjoint) and Tape.index_add, beyond
what every op gets from tests/test_ops_table.py:

* the numpy reference against a scalar loop (positions ascending from 0.0), forward and
  backward, to the bit; the order pinned by sums whose bits depend on it;
* the host backend (all three kernel variants, and fused) == the reference, with ids
  from a leaf (the uploaded index, re-uploaded with new ids) and computed on the tape
  (the scan kernel, which raises the bad-id flag);
* every misuse one gradtool error: bad ids when recording, set_value, set_input, load
  and at run time, bad shapes and rows;
* the file round trip, fd-check, and index_add against torch float64.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal, require_c_compiler
from gradtool.device import capture
from gradtool.tapefile import dumps, load
from support import VARIANTS, backward_grads, host_matches, perturb_leaves


def oracle(src, ids, rows):
    """out[v] = 0.0 + src[p0] + src[p1] + ... over the positions reading v, ascending."""
    flat, width = ids.reshape(-1), src.reshape(ids.size, -1)
    out = np.zeros((rows, width.shape[1]))
    for p in range(ids.size):
        for j in range(width.shape[1]):
            out[flat[p], j] = out[flat[p], j] + width[p, j]
    return out.reshape((rows,) + src.shape[ids.ndim:])


def spread(rng, shape):
    """Values of many magnitudes and both zeros: sums whose bits depend on their order."""
    x = rng.uniform(-1, 1, shape) * 10.0 ** rng.integers(-8, 9, shape)
    x[rng.random(shape) < 0.1] = -0.0
    return x


def ids_size(shape):
    return int(np.prod(shape))


CASES = [((4, 3), (4,), 5), ((2, 4, 3), (2, 4), 6), ((6,), (6,), 3),
         ((3, 2, 2, 2), (3,), 4), ((2, 3), (2, 3), 7), ((9, 2), (9,), 1)]


@pytest.mark.parametrize("src_shape,ids_shape,rows", CASES)
def test_scatter_is_the_scalar_loop_forward_and_backward(src_shape, ids_shape, rows, rng):
    tp = gt.Tape()
    src = tp.param(spread(rng, src_shape))
    ids_np = np.resize(np.arange(max(min(rows - 1, 3), 1)), ids_size(ids_shape))
    ids_np = rng.permutation(ids_np).reshape(ids_shape)     # repeated ids, unused rows
    y = tp.scatter(src, tp.const(ids_np, name="ids", dtype="i64"), rows=rows)
    want = oracle(tp.value(src), ids_np, rows)
    assert_bits_equal(tp.value(y), want, "scatter")
    unused = np.setdiff1d(np.arange(rows), ids_np)          # +0.0 where nothing adds
    assert unused.size >= 1 or rows == 1
    assert_bits_equal(tp.value(y)[unused], np.zeros((unused.size,) + want.shape[1:]), "unused")
    w = spread(rng, want.shape)
    loss = tp.sum(tp.mul(y, tp.const(w)))
    g = backward_grads(tp, loss)[src.id]
    # the gradient of src[p] is g[ids[p]] (an exact gather), added into a +0.0 slot
    assert_bits_equal(g, 0.0 + np.take(w, ids_np, axis=0), "scatter gradient")
    for variant in VARIANTS:
        host_matches(tp, loss, variant)


def test_the_order_is_positions_ascending_from_zero():
    tp = gt.Tape()
    src = tp.param(np.array([[1e16], [1.0], [-1e16], [3.0], [-0.0]]))
    ids = tp.const(np.array([0, 0, 0, 1, 2]), dtype="i64")
    y = tp.scatter(src, ids, rows=4)
    # ((0 + 1e16) + 1) - 1e16 = 0 (1 is lost), where any other grouping keeps the 1
    assert_bits_equal(tp.value(y), np.array([[0.0], [3.0], [0.0], [0.0]]), "order")
    loss = tp.sum(tp.mul(y, tp.const(np.array([[2.0], [-3.0], [5.0], [7.0]]))))
    for variant in VARIANTS:
        host_matches(tp, loss, variant)


def test_scatter_is_takes_backward_to_the_bit(rng):
    tp = gt.Tape()
    table = tp.param(rng.uniform(-1, 1, (5, 3)))
    ids = tp.const(rng.integers(0, 5, (4, 2)), dtype="i64")
    g_rows = spread(rng, (4, 2, 3))
    tp.backward(tp.sum(tp.mul(tp.take(table, ids), tp.const(g_rows))))
    summed = tp.scatter(tp.const(g_rows), ids, rows=5)
    assert_bits_equal(tp.value(summed), tp.grad(table), "take's gradient")


# ── ids computed on the tape, and the device's index ───────────────────────

def computed_tape(rng):
    tp = gt.Tape()
    src = tp.param(spread(rng, (2, 3, 4)))
    tokens = tp.const(np.array([[4, -1, 3], [3, 0, -1]]), name="tokens", dtype="i64")
    ids = tp.where(tp.ge(tokens, 0), tokens, 0)            # padding -1 -> row 0
    y = tp.scatter(src, ids, rows=6)
    loss = tp.sum(tp.mul(tp.tanh(y), tp.const(rng.uniform(-1, 1, (6, 4)))))
    return tp, src, y, loss


def test_computed_ids_scan_in_the_same_order_on_the_host(rng):
    tp, src, y, loss = computed_tape(rng)
    assert tp.nodes[tp.nodes[y.id].b].a >= 0                  # ids computed, no leaf
    assert_bits_equal(tp.value(y), oracle(tp.value(src), np.array([[4, 0, 3], [3, 0, 0]]), 6),
                      "scatter")
    for variant in VARIANTS:
        host_matches(tp, loss, variant)
    rp = capture(tp, loss, "host")
    assert "k_take_bwd_scan" in {la.kernel for la in rp.program.launches["forward"]}


def test_a_bad_computed_id_is_one_error_on_the_tape_and_the_device(rng):
    tp, src, y, loss = computed_tape(rng)
    tp.set_value(tp.var("tokens"), np.array([[4, 6, 3], [3, 0, -1]]))
    with pytest.raises(gt.GradtoolError, match=r"node \d+ \(scatter\): its ids, computed by "
                                               r"node \d+ \(\w+\): id 6 at position \[0, 1\] "
                                               r"is outside \[0, 6\) \(scatter of src "
                                               r"\[2, 3, 4\] into 6 rows\)"):
        tp.forward()
    require_c_compiler()
    tp, src, y, loss = computed_tape(rng)
    rp = capture(tp, loss, "host")
    rp.set_input(tp.var("tokens"), np.array([[4, 6, 3], [3, 0, -1]]))
    with pytest.raises(gt.GradtoolError, match=r"id 6 at position \[0, 1\] is outside"):
        rp.forward()
    rp.set_input(tp.var("tokens"), np.array([[4, -1, 3], [3, 0, -1]]))
    rp.forward()                                            # the flag is cleared
    assert_bits_equal(rp.value(y), tp.value(y), "good ids again")


def gnn_tape(rng, nodes=5, edges=9, feat=3):
    """Two rounds of message passing: rows of a matmul picked by the edges' sources
    (take), summed into their destinations (scatter), a relu between."""
    tp = gt.Tape()
    x = tp.const(rng.normal(size=(nodes, feat)), name="x")
    src = tp.const(rng.integers(0, nodes, edges), name="src", dtype="i64")
    dst = tp.const(rng.integers(0, nodes - 1, edges), name="dst", dtype="i64")  # one unused
    w1 = tp.param(rng.normal(size=(feat, feat)), name="w1")
    w2 = tp.param(rng.normal(size=(feat, 2)), name="w2")
    h = tp.relu(tp.scatter(tp.take(x @ w1, src), dst, rows=nodes))
    out = tp.scatter(tp.take(h @ w2, src), dst, rows=nodes)
    return tp, tp.mean(tp.mul(out, out))


@pytest.mark.parametrize("kernels", VARIANTS)
def test_message_passing_per_node_and_fused_equal_the_reference_with_new_ids(kernels, rng):
    """Leaf ids: each scatter walks its uploaded index (k_take_bwd); new ids re-upload it.
    The fused program (row kernels around the scatters) gives the same bits."""
    require_c_compiler()
    for fuse in (False, True):
        tp, loss = gnn_tape(rng)
        rp = capture(tp, loss, "host", host_kernels=kernels, fuse=fuse)
        assert {ti.node for ti in rp.program.take_indexes} >= {
            i for i, n in enumerate(tp.nodes) if n.op == "scatter"}
        assert bool(rp.program.fusion and rp.program.fusion.kernels) == fuse
        perturb_leaves(tp, rp, rng)                          # new ids, values, index
        tp.forward()
        tp.zero_grad()
        tp.backward(loss)
        rp.forward()
        rp.backward()
        for i in range(len(tp.nodes)):
            what = f"fuse={fuse} node {i} ({tp.nodes[i].op})"
            assert_bits_equal(rp.value(i), tp.values[i], what + " value")
            want = tp.grads[i] if tp.grads[i] is not None else np.zeros(tp.values[i].shape)
            assert_bits_equal(rp.grad(i), want, what + " grad")


# ── misuse: one gradtool error each ────────────────────────────────────────

@pytest.mark.parametrize("ids,rows,kind,needle", [
    ([0, 5, 1], 5, gt.TapeError, "id 5 at position [1] is outside [0, 5) (scatter of src "
                                 "[3, 2] into 5 rows)"),
    ([0, -1, 1], 5, gt.TapeError, "id -1 at position [1] is outside [0, 5)"),
    ([0, 1], 5, gt.ShapeError, "src [3,2] does not start with the ids' [2]"),
    ([[0, 1, 2]], 5, gt.ShapeError, "src [3,2] does not start with the ids' [1,3]"),
    ([0, 1, 2], 0, gt.TapeError, "scatter rows: expected an integer >= 1, got 0"),
    ([0, 1, 2], 2.5, gt.TapeError, "scatter rows: expected integers, got 2.5"),
])
def test_bad_ids_shapes_and_rows_are_refused_when_recording(ids, rows, kind, needle):
    tp = gt.Tape()
    src = tp.param(np.ones((3, 2)))
    with pytest.raises(kind) as err:
        tp.scatter(src, tp.const(np.array(ids), dtype="i64"), rows=rows)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_float_ids_and_a_missing_rows_are_refused():
    tp = gt.Tape()
    src = tp.param(np.ones((3, 2)))
    with pytest.raises(gt.TapeError, match="must be integer ids"):
        tp.scatter(src, tp.param(np.array([0.0, 1.0, 2.0])), rows=3)
    tp = gt.Tape()
    src = tp.param(np.ones((3, 2)))
    with pytest.raises(gt.TapeError, match=r"record: scatter needs attribute\(s\) \['rows'\]"):
        tp.record("scatter", src, tp.const(np.array([0, 1, 2]), dtype="i64"))


def test_bad_ids_are_refused_by_set_value_set_input_and_load(tmp_path):
    tp = gt.Tape()
    src = tp.param(np.arange(6.0).reshape(3, 2), name="src")
    ids = tp.const(np.array([0, 2, 2]), name="ids", dtype="i64")
    loss = tp.sum(tp.scatter(src, ids, rows=3))
    with pytest.raises(gt.GradtoolError, match=r"id 3 at position \[2\] is outside \[0, 3\)"):
        tp.set_value(ids, np.array([0, 1, 3]))
    doc = msgpack.unpackb(dumps(tp, loss=loss))
    doc["nodes"][ids.id] = dict(doc["nodes"][ids.id],
                                data=np.array([0, 1, 3], "<i8").tobytes())
    with pytest.raises(gt.TapeFileError) as err:
        load(msgpack.packb(doc))
    assert (err.value.node, err.value.field) == (loss.id - 1, "b")
    assert "id 3 at position [2] is outside [0, 3)" in str(err.value)
    require_c_compiler()
    rp = capture(tp, loss, "host")
    with pytest.raises(gt.GradtoolError, match=r"id 3 at position \[2\] is outside \[0, 3\)"):
        rp.set_input(ids, np.array([0, 1, 3]))


def test_a_file_whose_scatter_shape_or_rows_disagree_is_refused():
    tp = gt.Tape()
    src = tp.param(np.ones((3, 2)))
    y = tp.scatter(src, tp.const(np.array([0, 1, 1]), dtype="i64"), rows=4)
    doc = msgpack.unpackb(dumps(tp, loss=tp.sum(y)))
    for change, field in (({"rows": 0}, "rows"), ({"rows": 5}, "shape"),
                          ({"rows": 2}, "shape"), ({"rows": 1, "shape": [1, 2]}, "b"),
                          ({"rows": [4]}, "rows"), ({"rows": True}, "rows")):
        bad = dict(doc, nodes=[dict(n, **change) if k == y.id else n
                               for k, n in enumerate(doc["nodes"])])
        with pytest.raises(gt.TapeFileError) as err:
            load(msgpack.packb(bad))
        assert err.value.node == y.id and err.value.field.startswith(field), (change, err.value)


def test_round_trip_and_fd_check(rng, tmp_path):
    tp, src, y, loss = computed_tape(rng)
    raw = dumps(tp, loss=loss, outputs={"y": y}, values=True)
    back = load(raw)
    assert dumps(back.tape, loss=back.loss, outputs=back.outputs, values=True) == raw
    assert_bits_equal(back.tape.value(back.outputs["y"]), tp.value(y), "loaded")
    assert back.tape.nodes[y.id].aux == {"rows": 6}
    report = gt.fd_check(tp, loss)
    assert report.passed, [(p.name, p.max_abs_err) for p in report.params if not p.passed]


# ── Tape.index_add ─────────────────────────────────────────────────────────


@pytest.mark.parametrize("shape,axis,ids,alpha", [
    ((5, 3), 0, [1, 3, 1, 0, 1], 1.0), ((3, 5, 2), 1, [4, 0, 4], 1.0),
    ((3, 4), -1, [0, 0, 3, 2, 0, 1], -2.5), ((2, 2, 3), 2, [2], 1.0)])
def test_index_add_is_torchs_into_zeros_to_the_bit_and_within_rounding_otherwise(
        shape, axis, ids, alpha, rng):
    torch = pytest.importorskip("torch")
    ax = axis % len(shape)
    src_np = rng.normal(size=shape[:ax] + (len(ids),) + shape[ax + 1:])
    base_np = rng.normal(size=shape)
    ids_np = np.array(ids)
    tp = gt.Tape()
    base, src = tp.param(base_np), tp.param(src_np)
    y = tp.index_add(base, axis, ids_np, src, alpha=alpha)
    zeros = tp.index_add(tp.const(np.zeros(shape)), axis, ids_np, src, alpha=alpha)
    w = rng.normal(size=shape)
    loss = tp.sum(tp.mul(tp.add(y, tp.muls(zeros, 0.5)), tp.const(w)))
    tp.backward(loss)
    tb, ts = (torch.tensor(base_np, requires_grad=True), torch.tensor(src_np, requires_grad=True))
    ty = tb.index_add(axis, torch.tensor(ids_np), ts, alpha=alpha)
    tz = torch.zeros(shape, dtype=torch.float64).index_add(axis, torch.tensor(ids_np), ts,
                                                            alpha=alpha)
    ((ty + tz * 0.5) * torch.tensor(w)).sum().backward()
    assert np.allclose(tp.value(y), ty.detach().numpy(), rtol=1e-15, atol=1e-15)
    if alpha == 1.0:                                         # one sum from 0.0: torch's bits
        assert_bits_equal(tp.value(zeros), tz.detach().numpy(), "into zeros")
    assert_bits_equal(tp.grad(base), tb.grad.numpy(), "base gradient: g")
    assert np.allclose(tp.grad(src), ts.grad.numpy(), rtol=1e-15, atol=0)
    assert {n.op for n in tp.nodes} >= {"scatter", "add"}
    for variant in VARIANTS:
        host_matches(tp, loss, variant)


@pytest.mark.parametrize("call,kind,needle", [
    (lambda tp, b, s: tp.index_add(b, 2, [0, 1], s), gt.TapeError,
     "index_add: axis 2 is out of range for rank 2"),
    (lambda tp, b, s: tp.index_add(b, 0, [[0, 1]], s), gt.ShapeError,
     "index_add: ids must be 1-d, got [1,2]"),
    (lambda tp, b, s: tp.index_add(b, 0, [0, 1, 2], s), gt.ShapeError,
     "index_add along axis 0 of [4,3] by 3 ids needs src [3,3], got [2,3]"),
    (lambda tp, b, s: tp.index_add(b, 0, [0.0, 1.0], s), gt.TapeError,
     "index_add: ids must be integer data, got dtype float64"),
    (lambda tp, b, s: tp.index_add(b, 0, [0, 4], s), gt.TapeError,
     "id 4 at position [1] is outside [0, 4)"),
    (lambda tp, b, s: tp.index_add(b, 0, [0, 1], s, alpha="2"), gt.TapeError,
     "index_add: alpha must be a number, got '2'"),
])
def test_index_add_misuse_is_one_line(call, kind, needle):
    tp = gt.Tape()
    base, src = tp.param(np.ones((4, 3))), tp.param(np.ones((2, 3)))
    with pytest.raises(kind) as err:
        call(tp, base, src)
    assert needle in str(err.value) and "\n" not in str(err.value)
