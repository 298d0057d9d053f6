"""The host backend's strided copies (k_copy_nd: reshape, permute, transpose, slice,
concat, forward and backward) split by rows over the thread pool when they are large:
the same bits as the CPU reference on 1, 2, 3 and 7 threads, float64 and float32.
The tapes are past the split's threshold (2^17 elements) and odd in every dim, so that
the chunks' odometers start mid-row-block."""

from __future__ import annotations

import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal, require_c_compiler
from gradtool import native


@pytest.fixture
def threads_restored():
    yield
    native.set_num_threads(None)


def copies_tape(dtype, rng):
    tp = gt.Tape()
    x = tp.param(rng.standard_normal((7, 13, 45, 61)).astype(dtype), name="x")   # 249,795
    w = tp.param(rng.standard_normal((7, 61, 45, 13)).astype(dtype), name="w")
    a = tp.permute(x, [0, 3, 2, 1])                    # a general permute
    b = tp.transpose(x)                                # the last two dims: the tiled path
    c = tp.slice(x, [1, 0, 2, 3], [7, 13, 44, 61], [2, 1, 3, 2])
    d = tp.concat(x, tp.reshape(b, [7, 13, 45, 61]), axis=1)
    loss = (tp.sum(tp.mul(a, w)) + tp.sum(tp.mul(b, b)) + tp.sum(tp.muls(c, 0.5))
            + tp.sum(tp.mul(d, d)))
    return tp, loss, [x, w], [a, b, c, d]


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_large_copies_are_the_references_bits_on_any_thread_count(dtype, threads,
                                                                   threads_restored):
    require_c_compiler()
    from gradtool.device import capture
    tp, loss, params, copies = copies_tape(dtype, np.random.default_rng(5))
    tp.backward(loss)
    native.set_num_threads(threads)
    replay = capture(tp, loss.id, "host")
    replay.forward()
    replay.backward()
    for v in copies:
        assert_bits_equal(replay.value(v.id), tp.value(v), f"node {v.id} ({threads} threads)")
    for v in params:
        assert_bits_equal(replay.grad(v.id), tp.grad(v), f"grad {v.id} ({threads} threads)")
