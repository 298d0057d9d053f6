"""Resampling, torch's bilinear rules: ``grid_sample`` and ``upsample_bilinear2d``."""

from __future__ import annotations

import numpy as np

from ..errors import TapeError
from ..tape import GVar
from ._args import pair, tape_of

__all__ = ["grid_sample", "upsample_bilinear2d"]


def _linear_taps(size: int, out: int, align_corners: bool, scale) -> tuple:
    """Linear interpolation's two source indices and weights per output index along one
    axis, torch's rule (area_pixel_compute_source_index, in float64): the source
    coordinate ``scale * dst`` (align_corners) or ``max(scale * (dst + 0.5) - 0.5, 0)``,
    i0 its floor, i1 = i0 + 1 short of the edge, weights ``1 - l`` and ``l``, ``l`` the
    fraction."""
    if align_corners:
        ratio = (size - 1) / (out - 1) if out > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale is not None and scale > 0 else size / out
    i0, i1, w0, w1 = [], [], [], []
    for dst in range(out):
        src = ratio * dst if align_corners else max(ratio * (dst + 0.5) - 0.5, 0.0)
        lo = min(int(src), size - 1)
        frac = min(src - lo, 1.0)
        i0.append(lo)
        i1.append(lo + (1 if lo < size - 1 else 0))
        w0.append(1.0 - frac)
        w1.append(frac)
    return i0, i1, np.array(w0), np.array(w1)


def grid_sample(x: GVar, grid: GVar, align_corners: bool = False) -> GVar:
    """torch's ``grid_sample(x, grid, mode="bilinear", padding_mode="zeros")``: x [N, C, H,
    W] sampled at grid [N, OH, OW, 2] ((x, y) in [-1, 1]) to [N, C, OH, OW].

    Each grid point's source coordinate is torch's unnormalisation, ``((g + 1) * W - 1) /
    2`` (``(g + 1) / 2 * (W - 1)`` with align_corners); ``x0 = floor(ix)`` (no gradient)
    and ``f = ix - x0``; the weight of column j is ``1 - f`` where ``j == x0``, ``f`` where
    ``j == x0 + 1``, 0 elsewhere (a column outside the input is no column: zero padding).
    So the gradient with respect to the grid is torch's floor rule (``v[x0 + 1] - v[x0]``
    times the other axis' weights), also at whole-number coordinates, where an identity
    grid lies.  The sample is ``sum_i wy[i] * sum_j wx[j] * x[i, j]``: the sum over j one
    batched product by the column weights (FMA chains, as every product), then over i a
    serial sum: torch's value within rounding.  Dense in the input's rows and columns:
    [N, C*H, W] @ [N, W, OH*OW] -- meant for the small images spatial transformers warp.
    """
    tp = tape_of(x, "grid_sample")
    if len(x.shape) != 4 or len(grid.shape) != 4 or grid.shape[3] != 2 or \
            grid.shape[0] != x.shape[0]:
        raise TapeError(f"nn.grid_sample: expected x [N,C,H,W] and grid [N,OH,OW,2], got "
                        f"{list(x.shape)} and {list(grid.shape)}")
    n, c, h, w = x.shape
    _, oh, ow, _ = grid.shape
    pts = oh * ow

    def weights(axis, size):
        g = tp.reshape(tp.slice(grid, [0, 0, 0, axis], [n, oh, ow, axis + 1]), [n, pts, 1])
        if align_corners:
            at = tp.muls(tp.muls(tp.adds(g, 1.0), 0.5), float(size - 1))
        else:
            at = tp.muls(tp.adds(tp.muls(tp.adds(g, 1.0), float(size)), -1.0), 0.5)
        x0 = tp.floor(at)
        f = tp.sub(at, x0)
        cols = tp.const(np.arange(size, dtype=np.float64).reshape(1, 1, size))
        lo = tp.mul(tp.eq(cols, x0), tp.sub(tp.const(np.ones(1)), f))
        return tp.add(lo, tp.mul(tp.eq(cols, tp.adds(x0, 1.0)), f))        # [N, P, size]

    wx, wy = weights(0, w), weights(1, h)
    rows = tp.bmm(tp.reshape(x, [n, c * h, w]), tp.permute(wx, [0, 2, 1]))  # [N, C*H, P]
    rows = tp.permute(tp.reshape(rows, [n, c, h, pts]), [0, 1, 3, 2])      # [N, C, P, H]
    out = tp.sum(tp.mul(rows, tp.reshape(wy, [n, 1, pts, h])), axis=3)     # [N, C, P]
    return tp.reshape(out, [n, c, oh, ow])


def upsample_bilinear2d(x: GVar, size, align_corners: bool = False, scale_factor=None) -> GVar:
    """torch's ``interpolate(x, size, mode="bilinear", align_corners=...)``: x [N, C, H, W]
    to [N, C, OH, OW] (``scale_factor``, one or two, only sets where the taps fall, as
    torch's ``recompute_scale_factor=None``; ``size`` is the output size either way).

    Separable: along W, ``x[..., i0] * w0 + x[..., i1] * w1`` (two index_selects, two
    muls by const weights, an add), then the same along H; the weights are torch's,
    the roundings of a different grouping than torch's kernel (within 1e-15)."""
    tp = tape_of(x, "upsample_bilinear2d")
    if len(x.shape) != 4:
        raise TapeError(f"nn.upsample_bilinear2d: expected x [N,C,H,W], got {list(x.shape)}")
    out = pair(size, "upsample_bilinear2d size")
    scales = (list(scale_factor) if isinstance(scale_factor, (list, tuple))
              else [scale_factor] * 2)
    if min(out) < 1 or len(scales) != 2:
        raise TapeError(f"nn.upsample_bilinear2d: size must be ints >= 1 and scale_factor "
                        f"one or two numbers, got {size!r}, {scale_factor!r}"[:200])
    y = x
    for axis, n, o, sc in ((3, x.shape[3], out[1], scales[1]), (2, x.shape[2], out[0], scales[0])):
        if n == o and (align_corners or sc in (None, 1.0)):          # the identity
            continue
        i0, i1, w0, w1 = _linear_taps(n, o, bool(align_corners), sc)
        shape = [1] * 4
        shape[axis] = o
        y = tp.add(tp.mul(tp.index_select(y, axis, i0), tp.const(w0.reshape(shape))),
                   tp.mul(tp.index_select(y, axis, i1), tp.const(w1.reshape(shape))))
    return y
