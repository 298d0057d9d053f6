"""The host build's row-wise kernels against the CPU reference and the per-thread bodies.

1. The float32 broadcast gradients (kernels.cu, GT_BWD_BROADCAST).

A binary op's gradient for an input it broadcast is summed over the broadcast
coordinates in numerics32.reduce_to_shape's lane tree.  The host's tiled build sums
64 target elements at a time (rows of lane partials, the block tree and the fold run
across them); the per-thread build runs the one-element body the GPU runs.  Both must
equal the CPU reference to the bit, for every shape class the tiled path treats apart:
fewer than 32 contributions, a partial block, several blocks (the block tree's
stack), a tile remainder, kept dims that collapse to one (unit and other strides) or
not (gathered offsets), broadcasting on both sides, and signed zeros.

2. Slice's gradient (k_slice_bwd), row by row along the last axis: rows outside the
region on an outer axis, a region at the start, middle and end of the row, steps on the
last axis and on outer ones, in float64 and float32, on a slot that already holds
another contribution (the reference adds the whole scattered array, +0.0 outside the
region; the host adds +0.0 there too).
"""

from __future__ import annotations

import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal_nan_any, require_c_compiler

# (a's shape, b's shape): the out shape is their broadcast
SHAPES = [
    ((200, 64), (64,)),            # the autoencoder's bias: 200 contributions, one partial block
    ((128, 10), (10,)),            # fewer target elements than a tile
    ((7,), (1,)),                  # 7 contributions, one target element
    ((40, 3), (1, 3)),             # 40: past one lane round
    ((1000, 3), (1, 3)),           # 4 blocks: the block tree
    ((1300, 130), (130,)),         # 6 blocks (stack of two), 3 tiles, the last partial
    ((3, 300, 5), (3, 1, 5)),      # kept dims that do not collapse: gathered offsets
    ((4, 2, 70, 33), (2, 1, 33)),  # two broadcast dims, two kept ones
    ((5, 1300), (5, 1)),           # kept dim with stride 1300 (a row's sum)
    ((5, 1, 7), (1, 6, 7)),        # both sides broadcast
]
OPS = ["add", "sub", "mul", "div", "maximum"]


def tape_of(op, sa, sb, rng):
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    if op == "div":
        b = np.where(np.abs(b) < 0.25, np.float32(0.5), b).astype(np.float32)
    a.reshape(-1)[::7] = -0.0                       # signed zeros in the contributions
    a.reshape(-1)[1::11] = 0.0
    tp = gt.Tape()
    pa, pb = tp.param(a, name="a"), tp.param(b, name="b")
    out = tp.record(op, pa, pb)
    w = rng.uniform(-1.5, 1.5, tp.value(out).shape).astype(np.float32)
    w.reshape(-1)[::5] = -0.0                       # gradients of -0.0 and +0.0
    loss = tp.sum(tp.mul(out, tp.const(w, name="w")))
    assert tp.values[loss.id].dtype == np.float32
    tp.backward(loss)
    return tp, loss


@pytest.mark.parametrize("variant", ["tiled", "per-thread"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("sa, sb", SHAPES)
def test_f32_broadcast_gradients_host_equal_reference(sa, sb, op, variant):
    require_c_compiler()
    from gradtool.device import capture
    rng = np.random.default_rng([*sa, *sb, OPS.index(op)])
    for swap in (False, True):                      # the broadcast side as a and as b
        tp, loss = tape_of(op, *((sb, sa) if swap else (sa, sb)), rng)
        replay = capture(tp, loss, "host", host_kernels=variant)
        assert replay.dtype == "f32"
        replay.forward()
        replay.backward()
        for p in tp.params():
            g = replay.grad(p.id)
            assert g.dtype == np.float32 and g.shape == tp.grad(p).shape
            assert_bits_equal_nan_any(g, tp.grad(p), f"{op} {sa} {sb} swap={swap} grad of "
                                                     f"{p.id} ({variant})")


SLICES = [
    ((4, 5), [1, 0], [3, 4], [1, 1]),
    ((4, 5), [1, 0], [4, 5], [2, 3]),
    ((4, 5), [0, 1], [4, 4], [3, 1]),
    ((3, 7, 9), [1, 2, 0], [3, 6, 9], [1, 2, 1]),      # whole last axis, stepped middle
    ((3, 7, 9), [0, 0, 4], [3, 7, 9], [2, 1, 1]),      # region at the row's end
    ((2, 3, 40), [0, 1, 3], [2, 3, 37], [1, 1, 4]),    # stepped last axis
    ((5, 33), [2, 0], [5, 1], [1, 1]),                 # one column
    ((6, 8), [0, 7], [6, 8], [1, 1]),                  # the last column only
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape, starts, stops, steps", SLICES)
def test_slice_gradient_rows_equal_reference(shape, starts, stops, steps, dtype):
    require_c_compiler()
    from gradtool.device import capture
    rng = np.random.default_rng([*shape, *starts, *stops, *steps])
    x = rng.standard_normal(shape).astype(dtype)
    tp = gt.Tape()
    px = tp.param(x, name="x")
    out = tp.record("slice", px, attrs={"starts": starts, "stops": stops, "steps": steps})
    other = tp.mul(px, tp.const(rng.uniform(-1, 1, shape).astype(dtype), name="u"))
    shape_out = tp.value(out).shape
    w = rng.uniform(-1.5, 1.5, shape_out).astype(dtype)
    loss = tp.add(tp.sum(tp.mul(out, tp.const(w, name="w"))), tp.sum(other))
    tp.backward(loss)
    for variant in ("tiled", "per-thread"):
        replay = capture(tp, loss, "host", host_kernels=variant)
        replay.forward()
        replay.backward()
        g = replay.grad(px.id)
        assert g.dtype == dtype
        assert_bits_equal_nan_any(g, tp.grad(px), f"slice {shape} {starts} {stops} {steps} "
                                                   f"({variant})")
