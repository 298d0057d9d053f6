"""The float32 host backend's broadcast reductions (the binary ops' backward into a
broadcast input, numerics32.reduce_to_shape's lane-tree sum), sum/mean of strided rows
(f32 and f64) and sum/mean backward:
the tiled host build computes each target's contributions into a row, sums it with
gt_sum32 and splits the targets over threads (kernels.cu); these tapes are large
enough to take those paths (and the threaded ones) and odd enough to reach every
stride pattern.  The host backend must give the CPU reference's bits on 1, 2 and 3
threads."""

from __future__ import annotations

import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal_nan_any, require_c_compiler
from gradtool import native

# (x shape, y shape): out = op(x, y) broadcast; the two inputs' gradients are reduced
BROADCASTS = [
    ((16, 16, 32, 32), (1, 16, 1, 1)),     # batch norm's per-channel operands: 16384 terms
    ((5, 7, 13, 11), (7, 1, 1)),           # odd sizes, fewer dims on one side
    ((257, 300), (300,)),                  # a bias: the kept dim contiguous, terms strided
    ((9, 6, 37, 41), (9, 1, 37, 41)),      # the broadcast dim in the middle: 6 terms each
    ((16, 1, 32, 1), (1, 8, 1, 33)),       # both sides broadcast, interleaved
    ((3, 4, 50, 60), (1,)),                # one target, every element a term (36000)
    ((64, 1030), (64, 1030)),              # nothing broadcast: one term per target
    ((16384, 16), (16,)),                  # batch norm as imported: [N*H*W, C] by [C]
    ((1000, 33), (1, 33)),                 # contiguous targets, a partial last block
    ((7, 300, 9, 40), (9, 40)),            # contiguous targets over two kept dims
]
OPS = ("add", "sub", "mul", "div")


@pytest.fixture
def threads_restored():
    yield
    native.set_num_threads(None)


def values(rng, shape, specials=False):
    x = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape)).astype(np.float32)
    if specials and x.size > 10:
        flat = x.reshape(-1)
        at = rng.choice(flat.size, 6, replace=False)
        flat[at] = np.array([-0.0, 1e-45, -3e-39, 3.4e38, np.inf, np.nan], np.float32)
    return x


def host_matches_reference(tp, loss, checked, what, values=(), dtype="f32"):
    from gradtool.device import capture
    replay = capture(tp, loss.id, "host")
    assert replay.dtype == dtype
    replay.forward()
    replay.backward()
    for v in values:
        assert_bits_equal_nan_any(replay.value(v.id), tp.value(v), f"{what}: node {v.id}")
    for v in checked:
        got, want = replay.grad(v.id), tp.grad(v)
        assert got.dtype == want.dtype == (np.float32 if dtype == "f32" else np.float64)
        assert_bits_equal_nan_any(got, want, f"{what}: grad of node {v.id}")


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("xs, ys", BROADCASTS, ids=lambda s: "x".join(map(str, s)))
def test_f32_host_broadcast_reductions_equal_reference(xs, ys, threads, threads_restored):
    require_c_compiler()
    native.set_num_threads(threads)
    rng = np.random.default_rng(sum(xs) * 31 + sum(ys))
    for k, op in enumerate(OPS):
        tp = gt.Tape()
        x = tp.param(values(rng, xs, specials=k == 0))
        y = tp.param(values(rng, ys))
        out = getattr(tp, op)(x, y)
        w = tp.const(rng.uniform(-1.5, 1.5, tp.value(out).shape).astype(np.float32))
        loss = tp.sum(tp.mul(out, w))
        assert tp.value(loss).dtype == np.float32
        tp.backward(loss)
        # the reductions must be doing something: a broadcast side's gradient is a sum
        if int(np.prod(ys)) < int(np.prod(tp.value(out).shape)):
            assert np.isfinite(tp.grad(y)).any()
        host_matches_reference(tp, loss, [x, y], f"{op} {xs} {ys} on {threads} threads")


# (shape, axis): sum and mean backward, k_sum_bwd's rows (inner 1 and inner > 1), large
# enough for the launch to be split over threads (2^18 elements)
# ... and the forward sums of strided rows (k_sum with inner > 1: the rows of an outer
# index summed side by side, one lane-tree state per row): batch norm's mean over
# [N*H*W, C] (16384 rows of 16), one, four and 274 blocks of 256, several outer indices
SUM_CASES = [((16, 64, 16, 16), (2, 3)), ((16, 64, 16, 16), 1), ((16, 64, 16, 16), 0),
             ((7, 9, 11, 13, 31), (0, 2)), ((262147,), None), ((3, 5), 1),
             ((16384, 16), 0), ((1000, 3), 0), ((70001, 2), 0), ((5, 257, 33), 1),
             ((2, 256, 4), 1), ((4, 1, 7), 1)]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("shape, axis", SUM_CASES, ids=str)
def test_host_sum_and_mean_equal_reference(shape, axis, threads, dtype, threads_restored):
    require_c_compiler()
    native.set_num_threads(threads)
    rng = np.random.default_rng(len(shape) * 7 + threads)
    typ = np.float32 if dtype == "f32" else np.float64
    for reduce in ("sum", "mean"):
        tp = gt.Tape()
        x = tp.param(values(rng, shape).astype(typ))
        r = getattr(tp, reduce)(tp.mul(x, x), axis=axis)
        w = tp.const(rng.uniform(-1.5, 1.5, tp.value(r).shape).astype(typ))
        loss = tp.sum(tp.mul(r, w))
        tp.backward(loss)
        assert tp.value(r).dtype == typ
        host_matches_reference(tp, loss, [x], f"{reduce} {shape} axis {axis}", values=[r],
                               dtype=dtype)


# transpose (the last two axes) forward and backward: k_copy_nd's tiled path for the
# importer's NCHW -> [N, HW, C] before batch norm's sums, odd sizes, a single row
TRANSPOSES = [(16, 16, 1024), (5, 37, 19), (3, 4, 17, 33), (1, 2), (40, 1, 3)]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("shape", TRANSPOSES, ids=str)
def test_host_transpose_equals_reference(shape, dtype):
    require_c_compiler()
    rng = np.random.default_rng(len(shape) + shape[-1])
    typ = np.float32 if dtype == "f32" else np.float64
    tp = gt.Tape()
    x = tp.param(values(rng, shape).astype(typ))
    t = tp.transpose(x)
    u = tp.transpose(tp.mul(x, x))              # x's gradient: two transposes' backward
    w = tp.const(rng.uniform(-1.5, 1.5, tp.value(t).shape).astype(typ))
    loss = tp.sum(tp.mul(tp.add(t, u), w))
    tp.backward(loss)
    assert tp.value(t).shape == shape[:-2] + (shape[-1], shape[-2])
    host_matches_reference(tp, loss, [x], f"transpose {shape}", values=[t, u], dtype=dtype)
