"""Ours against PyTorch float64, element by element (test_ops_math.py,
test_composites_math.py, test_composites_distances.py): :func:`torch_oracle` (values
and every input's gradient, ours and torch's), :func:`assert_elementwise_close` (NaNs
and infinities where torch's are, elsewhere within a relative tolerance),
:func:`check_unary` and :func:`check_specials`.  torch is imported when a check runs
(the test skips without it).  Tests import these through tests/support.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradtool as gt


def assert_elementwise_close(ours, theirs, rtol, what):
    """Same positions of NaN and of infinities (with signs); elsewhere within rtol
    relative to each element (an exact zero must be exact)."""
    ours, theirs = np.asarray(ours, float), np.asarray(theirs, float)
    assert ours.shape == theirs.shape, what
    assert np.array_equal(np.isnan(ours), np.isnan(theirs)), what
    fin = np.isfinite(theirs)
    assert np.array_equal(ours[~fin & ~np.isnan(theirs)], theirs[~fin & ~np.isnan(theirs)]), what
    err = np.abs(ours[fin] - theirs[fin])
    bad = err > rtol * np.abs(theirs[fin])
    assert not bad.any(), (what, ours[fin][bad][:3], theirs[fin][bad][:3])


def torch_oracle(build, torch_build, inputs, w=None):
    """Values and gradients of every input, ours and PyTorch float64's."""
    torch = pytest.importorskip("torch")
    tp = gt.Tape()
    leaves = [tp.param(a) for a in inputs]
    y = build(tp, *leaves)
    w = np.random.default_rng(0).uniform(0.5, 1.5, tp.value(y).shape) if w is None else w
    tp.backward(tp.sum(tp.mul(y, tp.const(w))))
    t_leaves = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in inputs]
    t_y = torch_build(*t_leaves)
    (t_y * torch.tensor(w)).sum().backward()
    return ((tp.value(y), t_y.detach().numpy()),
            [(tp.grad(p), t.grad.numpy()) for p, t in zip(leaves, t_leaves, strict=True)])


def check_unary(build, fname, draw, name):
    """``build(tp, a)`` against torch.<fname> on ``draw``'s inputs: values within 1e-12,
    gradients within 1e-11 relative."""
    torch = pytest.importorskip("torch")
    x = draw(np.random.default_rng(sum(map(ord, name))))
    (v, tv), grads = torch_oracle(build, getattr(torch, fname), [x])
    assert_elementwise_close(v, tv, 1e-12, f"{name} value")
    assert_elementwise_close(grads[0][0], grads[0][1], 1e-11, f"{name} gradient")


def check_specials(build, table, x):
    """``build(tp, name, a)`` for each ``name -> (torch name, _)`` of ``table`` on the
    special inputs ``x``: NaN where torch's is, signed zeros as torch's."""
    torch = pytest.importorskip("torch")
    for name, (fname, _) in table.items():
        tp = gt.Tape()
        got = tp.value(build(tp, name, tp.const(x)))
        want = getattr(torch, fname)(torch.tensor(x)).numpy()
        assert np.array_equal(np.isnan(got), np.isnan(want)), name
        ok = ~np.isnan(want)
        assert_elementwise_close(got[ok], want[ok], 1e-12, name)
        assert np.array_equal(np.signbit(got[ok & (want == 0)]),
                              np.signbit(want[ok & (want == 0)])), name
