"""conv2d's compiled forward and weight gradient read the input planes in place.

The weight gradient (csrc/gt_conv.h: the input planes copied with their
zero padding and read in place by the chain-continuing tiles, lanes over output
channels, threads over blocks of rows (c, i, j), the output gradient transposed once for all
the blocks when they run on several threads) equals the numpy rule
(numerics.conv2d_backward_numpy: whole-batch im2col, then each output one FMA chain over
(n, oh, ow) ascending from +0.0) to the bit, in float32 and float64, on 1, 2 and 3
threads.  The shapes reach the partial tiles (rows not a multiple of the tile), output
channels that are not a whole vector, blocks of rows that span channels, stride 2,
padding, dilation, groups and odd sizes."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_bits_equal_nan_any, require_c_compiler
from gradtool import native
from gradtool import numerics as nx

# (n, c, h, w, oc, k, stride, padding, dilation, groups)
SHAPES = [
    (3, 16, 12, 12, 16, 3, 1, 1, 1, 1),     # whole vectors of output channels (f32)
    (2, 5, 9, 11, 7, 3, 1, 1, 1, 1),        # 7 channels: a partial vector; 45 rows
    (2, 6, 13, 10, 10, 3, 2, 1, 1, 1),      # stride 2, odd sizes
    (2, 4, 10, 10, 24, 1, 2, 0, 1, 1),      # 1x1 stride 2 (a shortcut)
    (1, 3, 11, 9, 33, 5, 1, 2, 1, 1),       # 33 channels: three vectors and one lane
    (2, 4, 12, 12, 6, 3, 1, 2, 2, 2),       # dilation 2, two groups
    (3, 9, 7, 8, 80, 2, 3, 1, 1, 1),        # stride 3, even kernel, 5+ vectors (f32)
    (2, 64, 6, 6, 64, 3, 1, 1, 1, 1),       # many rows: several blocks per thread
    (8, 12, 20, 20, 10, 3, 1, 1, 1, 2),     # threaded, two groups of 5 channels (a partial
]                                           # vector): g transposed once for all blocks


@pytest.fixture
def threads_restored():
    yield
    native.set_num_threads(None)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(map(str, s)))
def test_conv2d_weight_gradient_compiled_equals_numpy(shape, threads, dtype, threads_restored):
    require_c_compiler()
    import gradtool.ops  # noqa: F401  (numerics32 as numerics' float32 twin)
    native.set_num_threads(threads)
    n, c, h, w, oc, k, s, p, d, g = shape
    rng = np.random.default_rng(sum(shape) + threads)
    geo = ((s, s), (p, p), (d, d), g)
    x = (rng.standard_normal((n, c, h, w)) * 10.0 ** rng.uniform(-3, 3, (n, c, h, w)))
    x = x.astype(dtype)
    x.reshape(-1)[rng.choice(x.size, 3, replace=False)] = [-0.0, np.inf, 1e-40]
    wt = rng.standard_normal((oc, c // g, k, k)).astype(dtype)
    out = nx.conv2d(x, wt, *geo)
    gr = rng.standard_normal(out.shape).astype(dtype)
    for acc_dx in (False, True):                 # dw alone, and beside dx
        got = nx.conv2d_backward(gr, x, wt, *geo, acc_dx, True)
        want = nx.conv2d_backward_numpy(gr, x, wt, *geo, acc_dx, True)
        assert got[1].dtype == dtype and got[1].shape == wt.shape
        assert_bits_equal_nan_any(got[1], want[1], f"dw {shape} {threads} threads")
        if acc_dx:
            assert_bits_equal_nan_any(got[0], want[0], f"dx {shape} {threads} threads")
    # the chains really are long: a sum over every sample and position, not one term
    assert np.count_nonzero(got[1]) > got[1].size // 2


# (n, c, h, w, oc, k, stride (h, w), padding, dilation, groups): the forward's in-place
# path (stride 1 along w, whole vectors of outputs per row, 256 outputs a plane or more:
# gt_conv_fwd_direct, for float32 and float64 vectors) and its neighbours on the im2col
# path
FORWARD = [
    (2, 5, 16, 16, 7, 3, (1, 1), 1, 1, 1),       # 7 channels: a partial tile of rows
    (2, 4, 18, 34, 9, 3, (1, 1), 0, 1, 1),       # no padding, 32 outputs a row
    (1, 6, 40, 36, 12, 5, (2, 1), 2, 1, 1),      # stride 2 along h only
    (2, 4, 32, 32, 6, 3, (1, 1), 2, 2, 2),       # dilation 2, two groups
    (1, 3, 64, 64, 20, 1, (1, 1), 0, 1, 1),      # 1x1, a 64-wide row (several vectors)
    (2, 3, 32, 32, 16, 3, (2, 2), 1, 1, 1),      # stride 2: the columns
    (3, 8, 8, 8, 16, 3, (1, 1), 1, 1, 1),        # a small plane: the columns
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("shape", FORWARD, ids=lambda s: "-".join(map(str, s)))
def test_conv2d_forward_compiled_equals_numpy(shape, threads, dtype, threads_restored):
    require_c_compiler()
    import gradtool.ops  # noqa: F401
    native.set_num_threads(threads)
    n, c, h, w, oc, k, s, p, d, g = shape
    rng = np.random.default_rng(n * 1000 + c * 100 + h + threads)
    geo = (s, (p, p), (d, d), g)
    x = (rng.standard_normal((n, c, h, w)) * 10.0 ** rng.uniform(-3, 3, (n, c, h, w)))
    x = x.astype(dtype)
    x.reshape(-1)[rng.choice(x.size, 3, replace=False)] = [-0.0, np.inf, 1e-40]
    wt = rng.standard_normal((oc, c // g, k, k)).astype(dtype)
    got = nx.conv2d(x, wt, *geo)
    want = nx.conv2d_numpy(x, wt, *geo)
    assert got.dtype == dtype and got.shape == want.shape
    assert_bits_equal_nan_any(got, want, f"conv2d {shape} {threads} threads")
    assert np.count_nonzero(got) > got.size // 2
