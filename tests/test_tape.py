"""The tape as an arena: leaves, operators, poisoning, borrows, mark/reset, determinism."""

import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal


def test_param_copies_and_value_is_readonly(rng):
    data = rng.standard_normal((2, 3))
    tp = gt.Tape()
    w = tp.param(data, name="w", l2=0.1)
    data[0, 0] = 99.0
    assert tp.value(w)[0, 0] != 99.0
    with pytest.raises(ValueError):
        tp.value(w)[0, 0] = 1.0
    with pytest.raises(ValueError):
        tp.grad(w)[0, 0] = 1.0
    assert tp.nodes[w.id].l2 == 0.1 and tp.nodes[w.id].name == "w"


def test_scalar_leaf_becomes_shape_1():
    tp = gt.Tape()
    assert tp.value(tp.const(3.0)).shape == (1,)


@pytest.mark.parametrize("bad", [np.array(["a", "b"]), np.zeros((0, 3)), [[1, 2], [3]], np.array([1j])])
def test_bad_leaf_data_is_a_clear_error(bad):
    with pytest.raises(gt.GradtoolError):
        gt.Tape().param(bad)


def test_operators_map_to_ops(rng):
    tp = gt.Tape()
    x = tp.param(rng.standard_normal((2, 2)))
    y = tp.param(rng.standard_normal((2, 2)))
    assert tp.nodes[(x + y).id].op == "add"
    assert tp.nodes[(x + 2.0).id].op == "adds"
    assert tp.nodes[(2.0 + x).id].op == "adds"
    sub = x - 2.0
    assert tp.nodes[sub.id].op == "adds" and tp.nodes[sub.id].s == -2.0
    rsub = 2.0 - x
    assert tp.nodes[rsub.id].op == "adds" and tp.nodes[tp.nodes[rsub.id].a].op == "neg"
    assert tp.nodes[(3 * x).id].op == "muls"
    q = x / 3.0
    assert tp.nodes[q.id].op == "div" and tp.nodes[tp.nodes[q.id].b].op == "const"
    assert_bits_equal(tp.value(q), tp.value(x) / 3.0)
    assert tp.nodes[(x @ y).id].op == "matmul"
    assert tp.nodes[(-x).id].op == "neg"
    assert_bits_equal(tp.value(2.0 - x), 2.0 - tp.value(x))


def test_poison_raises_and_appends_nothing():
    tp = gt.Tape()
    a = tp.param(np.ones((2, 3)))
    b = tp.param(np.ones((4,)))
    n = len(tp)
    with pytest.raises(gt.ShapeError) as info:
        tp.add(a, b)
    assert len(tp) == n and not tp.ok
    msg = str(info.value)
    assert "add" in msg and "[2,3]" in msg and "[4]" in msg and "node 0" in msg and "node 1" in msg
    assert issubclass(gt.ShapeError, gt.GradtoolError)


def test_poison_without_raise_makes_later_ops_noops():
    tp = gt.Tape(raise_on_error=False)
    a = tp.param(np.ones((2, 3)))
    bad = tp.matmul(a, a)
    assert not tp.ok and "matmul" in tp.error and bad.id == -1
    n = len(tp)
    later = tp.exp(tp.relu(bad))
    assert later.id == -1 and len(tp) == n
    with pytest.raises(gt.GradtoolError):
        tp.backward(later)
    with pytest.raises(gt.GradtoolError):
        tp.backward(tp.var(0))


def test_bad_arguments(rng):
    tp, other = gt.Tape(), gt.Tape()
    a = tp.param(np.ones(3))
    b = other.param(np.ones(3))
    with pytest.raises(gt.TapeError, match="another tape"):
        tp.add(a, b)
    with pytest.raises(gt.TapeError, match="one-element"):
        tp.backward(a)
    with pytest.raises(gt.TapeError):
        tp.var(17)
    with pytest.raises(gt.TapeError):
        tp.add(a, np.ones(3))
    for bad_op in (lambda t, v: t.reshape(v, [2, 2]), lambda t, v: t.slice(v, [2], [1]),
                   lambda t, v: t.softmax(v, 3), lambda t, v: t.concat(v, v, 1)):
        fresh = gt.Tape()
        with pytest.raises(gt.ShapeError):
            bad_op(fresh, fresh.param(np.ones(3)))
        with pytest.raises(gt.TapeError, match="poisoned"):
            fresh.exp(fresh.var(0))


def test_untouched_grad_is_zeros():
    tp = gt.Tape()
    a = tp.param(np.ones((2, 2)))
    assert_bits_equal(tp.grad(a), np.zeros((2, 2)))
    assert not tp.touched(a)


def test_mark_reset_over_many_minibatches(rng):
    tp = gt.Tape()
    w = tp.param(rng.standard_normal((3, 2)), name="w")
    b = tp.param(np.zeros(2), name="b")
    mark = tp.mark()
    for step in range(50):
        x = tp.const(rng.standard_normal((4, 3)))
        y = tp.const(rng.standard_normal((4, 2)))
        loss = tp.mse(tp.add(x @ w, b), y)
        tp.backward(loss)
        assert tp.touched(w)
        tp.reset_to(mark)
        assert len(tp) == mark
        assert not tp.touched(w) and not tp.touched(b)
    assert tp.value(w).shape == (3, 2)
    with pytest.raises(gt.TapeError):
        tp.value(x)


def test_same_recording_twice_is_identical(rng):
    def record(seed):
        r = np.random.default_rng(seed)
        tp = gt.Tape()
        x = tp.const(r.standard_normal((8, 5)))
        w1 = tp.param(r.standard_normal((5, 6)))
        w2 = tp.param(r.standard_normal((6, 3)))
        h = tp.tanh(x @ w1)
        p = tp.softmax(h @ w2, 1)
        loss = tp.mean(tp.log(p))
        tp.backward(loss)
        return [np.array(tp.value(loss))] + [np.array(tp.grad(v)) for v in (w1, w2)]
    for a, b in zip(record(7), record(7), strict=True):
        assert_bits_equal(a, b)


def test_forward_replay_reproduces_recording(rng):
    tp = gt.Tape()
    x = tp.const(rng.standard_normal((4, 3)), name="x")
    w = tp.param(rng.standard_normal((3, 2)))
    out = tp.sigmoid(x @ w)
    loss = tp.mean(out)
    before = np.array(tp.value(loss))
    tp.set_value(x, rng.standard_normal((4, 3)))
    tp.forward()
    assert not np.array_equal(tp.value(loss), before)
    with pytest.raises(gt.ShapeError):
        tp.set_value(x, np.ones((2, 3)))
    with pytest.raises(gt.TapeError):
        tp.set_value(out, np.ones((4, 2)))


def test_backward_twice_accumulates_leaves_only(rng):
    tp = gt.Tape()
    x = tp.param(rng.standard_normal(3))
    loss = tp.sum(tp.exp(x))
    tp.backward(loss)
    once = np.array(tp.grad(x))
    tp.backward(loss)
    assert_bits_equal(tp.grad(x), once + once)
    tp.zero_grad()
    tp.backward(loss)
    assert_bits_equal(tp.grad(x), once)


def test_attention_block_records(rng):
    tp = gt.Tape()
    x = tp.const(rng.standard_normal((2, 4, 6)), name="x")
    wq = tp.param(rng.standard_normal((2, 6, 6)) * 0.3, name="wq")
    q = x @ wq
    scores = tp.bmm(q, tp.transpose(x))
    att = tp.softmax(scores, -1)
    ctx = tp.bmm(att, x)
    head = tp.slice(ctx, [0, 0, 0], [2, 4, 3])
    both = tp.concat(head, head, axis=2)
    loss = tp.mean(tp.reshape(both, [8, 6]))
    tp.backward(loss)
    assert tp.grad(wq).shape == (2, 6, 6)
    report = gt.fd_check(tp, loss, rtol=1e-6, atol=1e-8)
    assert report.passed


def test_reach_is_what_backward_touches_and_requires_wrt_narrows_it(rng):
    from gradtool.tape import reach, requires_wrt
    tp = gt.Tape()
    w = tp.param(rng.normal(size=3), name="w")
    u = tp.param(rng.normal(size=3), name="u")
    unused = tp.param(rng.normal(size=3), name="unused")
    c = tp.const(rng.normal(size=3), name="c")
    branch_u = tp.exp(tp.mul(u, u))
    const_only = tp.sqrt(tp.mul(c, c))
    loss = tp.sum(tp.add(tp.mul(tp.tanh(tp.mul(w, c)), const_only), branch_u))
    tp.backward(loss)
    touched = [tp.touched(tp.var(i)) for i in range(len(tp.nodes))]
    assert reach(tp, loss.id) == touched
    assert requires_wrt(tp, [v.id for v in tp.params()]) == tp.requires
    only_w = requires_wrt(tp, [w.id])
    assert not only_w[u.id] and not only_w[branch_u.id] and not only_w[unused.id]
    assert only_w[loss.id] and not only_w[const_only.id]
    narrowed = reach(tp, loss.id, only_w)
    assert narrowed[w.id] and not narrowed[u.id] and not narrowed[branch_u.id]
    assert [a and b for a, b in zip(touched, only_w)] == [
        n and r for n, r in zip(narrowed, only_w)]
