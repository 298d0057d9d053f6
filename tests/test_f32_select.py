"""expr.select_numpy on float32 (relu and its gradient on an f32 tape in the CPU
reference): the compiled gt_select_zero of the float32 library and the numpy bit mask
it falls back to give np.where's float32 bit patterns, NaN payloads and signed zeros
included, as the float64 path does (tests/test_numerics.py)."""

from __future__ import annotations

import numpy as np

from conftest import require_c_compiler
from gradtool import numerics as nx
from gradtool.expr import select_numpy


def test_the_float32_select_against_zero_gives_np_where_bits(rng, monkeypatch):
    require_c_compiler()
    assert nx.cpu_kernels32() is not None, "a C compiler is here, yet the f32 kernels failed"
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45,
                         3e38, -1.5, 2.5], dtype=np.float32)
    payload = np.array([0x7f800001, 0xffc0beef], dtype=np.uint32).view(np.float32)
    x = rng.choice(np.concatenate([specials, payload,
                                   rng.standard_normal(5).astype(np.float32)]), 10_007)
    assert x.dtype == np.float32
    cond = rng.random(x.size) < 0.5
    want = {False: np.where(cond, x, 0.0), True: np.where(cond, 0.0, x)}
    assert want[False].dtype == np.float32
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(nx, "cpu_kernels32", lambda: None)
        for invert, got in ((False, select_numpy(cond, x, 0.0)),
                            (True, select_numpy(cond, 0.0, x))):
            assert got.dtype == np.float32, (compiled, invert)
            assert np.array_equal(got.view(np.int32), want[invert].view(np.int32)), \
                (compiled, invert)
        # the f32 rule bodies select against np.float32 constants: the same bits, and
        # -0.0 (whose pattern is not all zeros) goes to np.where
        for zero in (np.float32(0.0), np.float32(-0.0)):
            for got, ref in ((select_numpy(cond, x, zero), np.where(cond, x, zero)),
                             (select_numpy(cond, zero, x), np.where(cond, zero, x))):
                assert got.dtype == ref.dtype == np.float32
                assert np.array_equal(got.view(np.int32), ref.view(np.int32)), (compiled, zero)
        got = select_numpy(cond[::2].copy(), x[::2], 0.0)
        assert got.dtype == np.float32
        assert np.array_equal(got.view(np.int32),
                              np.where(cond[::2], x[::2], 0.0).view(np.int32))


def test_the_compiled_lane_tree_down_columns_equals_numerics32s(rng):
    """numerics32._lane_tree's compiled path (gt_lane_tree_cols, 64 columns at a time)
    against its numpy body, bit for bit: fewer rows than a lane round, a partial block,
    one full block, several (the block tree's counter), column counts around the tile,
    infinities, NaNs, signed zeros and values whose sums round."""
    from gradtool import numerics32 as n32
    require_c_compiler()
    assert n32.cpu_library() is not None
    specials = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, 3.4e38, -3.4e38],
                        dtype=np.float32)
    for rows in (1, 7, 32, 33, 255, 256, 257, 1000, 1537, 4097):
        for cols in (1, 3, 64, 65, 200):
            x = (rng.standard_normal((rows, cols)) * 10.0 ** rng.integers(-3, 4, (rows, cols))
                 ).astype(np.float32)
            if rows * cols > 50:
                flat = x.reshape(-1)
                flat[rng.integers(0, flat.size, 4)] = rng.choice(specials, 4)
            with np.errstate(over="ignore", invalid="ignore"):
                want = n32._lane_tree_body(x)
            got = n32._lane_tree(x)
            assert got.dtype == np.float32 and got.shape == want.shape
            same = (got.view(np.int32) == want.view(np.int32)) | (np.isnan(got) & np.isnan(want))
            assert same.all(), (rows, cols)
    # more than two dims: the kept dims flattened and restored
    x = rng.standard_normal((300, 4, 5)).astype(np.float32)
    assert n32._lane_tree(x).tobytes() == n32._lane_tree_body(x).tobytes()
