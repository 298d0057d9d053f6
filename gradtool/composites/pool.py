"""Pooling, torch's: ``max_pool2d``/``avg_pool2d`` (one node each), the 3-d pools (per
output depth, the 2-d pool of each depth in the window), ``global_avg_pool2d`` and the
adaptive pools."""

from __future__ import annotations

import numpy as np

from ..errors import TapeError
from ..tape import GVar
from ._args import depth_out, pair, rank5, tape_of, triple

__all__ = ["max_pool2d", "avg_pool2d", "max_pool3d", "avg_pool3d", "global_avg_pool2d",
           "adaptive_avg_pool2d", "adaptive_max_pool2d", "adaptive_avg_pool3d",
           "adaptive_max_pool3d"]


def max_pool2d(x: GVar, kernel, stride=None, padding=0, dilation=1,
               ceil_mode: bool = False) -> GVar:
    """torch's ``max_pool2d`` (stride defaults to the kernel): the first maximum of each
    window gets the gradient, a NaN wins (numerics.max_pool2d)."""
    tp = tape_of(x, "max_pool2d")
    k = pair(kernel, "max_pool2d kernel")
    return tp.max_pool2d(x, kernel=k, stride=k if stride is None else pair(stride, "stride"),
                         padding=pair(padding, "max_pool2d padding"),
                         dilation=pair(dilation, "max_pool2d dilation"), ceil_mode=ceil_mode)


def avg_pool2d(x: GVar, kernel, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> GVar:
    """torch's ``avg_pool2d`` (stride defaults to the kernel; numerics.avg_pool2d)."""
    tp = tape_of(x, "avg_pool2d")
    k = pair(kernel, "avg_pool2d kernel")
    return tp.avg_pool2d(x, kernel=k, stride=k if stride is None else pair(stride, "stride"),
                         padding=pair(padding, "avg_pool2d padding"), ceil_mode=ceil_mode,
                         count_include_pad=count_include_pad)


def _depth_taps(d, k, stride, pad, dil, out_d):
    """The input depths each output depth's window reads (padding taps left out)."""
    return [[t for t in (o * stride - pad + j * dil for j in range(k)) if 0 <= t < d]
            for o in range(out_d)]


def max_pool3d(x: GVar, kernel, stride=None, padding=0, dilation=1,
               ceil_mode: bool = False) -> GVar:
    """torch's ``max_pool3d``: per output depth the ``maximum`` of the ``max_pool2d`` of
    each depth its window reads, in ascending depth (a tie keeps the earlier depth: the
    first maximum in (depth, row, column) order gets the gradient, as torch's scan)."""
    tp = tape_of(x, "max_pool3d")
    rank5(x, "max_pool3d")
    k = triple(kernel, "max_pool3d kernel")
    s = k if stride is None else triple(stride, "stride")
    p, dl = triple(padding, "max_pool3d padding"), triple(dilation, "max_pool3d dilation")
    n, c, d, h, wd = x.shape
    out_d = depth_out(tp, "max_pool3d", d, k[0], s[0], p[0], dl[0], ceil_mode)
    outs = []
    for taps in _depth_taps(d, k[0], s[0], p[0], dl[0], out_d):
        pooled = [max_pool2d(tp.reshape(tp.narrow(x, 2, t, t + 1), [n, c, h, wd]), k[1:],
                             s[1:], p[1:], dl[1:], ceil_mode) for t in taps]
        m = pooled[0]
        for q in pooled[1:]:
            m = tp.maximum(m, q)
        outs.append(m)
    return tp.stack(outs, 2)


def avg_pool3d(x: GVar, kernel, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> GVar:
    """torch's ``avg_pool3d``: per output depth the ``avg_pool2d`` of each depth its window
    reads (``ceil_mode`` and ``count_include_pad`` passed on), summed in ascending depth
    and divided by the depth taps counted: with count_include_pad those of the window
    inside the padded depth (torch's ``min(start + k, D + pad) - start``), else those
    inside the input.  The product of the two divisors is torch's; the average over the
    window's elements, rounded differently from torch's one sum."""
    tp = tape_of(x, "avg_pool3d")
    rank5(x, "avg_pool3d")
    k = triple(kernel, "avg_pool3d kernel")
    s = k if stride is None else triple(stride, "stride")
    p = triple(padding, "avg_pool3d padding")
    n, c, d, h, wd = x.shape
    out_d = depth_out(tp, "avg_pool3d", d, k[0], s[0], p[0], 1, bool(ceil_mode))
    outs = []
    for o, taps in enumerate(_depth_taps(d, k[0], s[0], p[0], 1, out_d)):
        pooled = [avg_pool2d(tp.reshape(tp.narrow(x, 2, t, t + 1), [n, c, h, wd]), k[1:],
                             s[1:], p[1:], bool(ceil_mode), count_include_pad) for t in taps]
        total = pooled[0]
        for q in pooled[1:]:
            total = tp.add(total, q)
        start = o * s[0] - p[0]
        count = min(start + k[0], d + p[0]) - start if count_include_pad else len(taps)
        outs.append(tp.div(total, tp.const_like(total, np.array([float(count)])))
                    if count > 1 else total)
    return tp.stack(outs, 2)


def global_avg_pool2d(x: GVar) -> GVar:
    """torch's ``adaptive_avg_pool2d(x, 1)``: the mean over H and W, [N, C, 1, 1].

    x reshaped to [N, C, H*W], one axis ``mean`` (serial sum over (h, w)
    row-major / (H*W)), reshaped back."""
    tp = tape_of(x, "global_avg_pool2d")
    n, c, h, w = x.shape
    m = tp.mean(tp.reshape(x, [n, c, h * w]), axis=2, keepdims=True)
    return tp.reshape(m, [n, c, 1, 1])


def _windows(size: int, out: int) -> list:
    """Adaptive pooling's windows along one axis (torch's): [floor(i * size / out),
    ceil((i + 1) * size / out)) for each output index i."""
    return [((i * size) // out, -(-((i + 1) * size) // out)) for i in range(out)]


def _adaptive_size(x, output_size, what, dims=2):
    if len(x.shape) != 2 + dims:
        want = "[N,C,H,W]" if dims == 2 else "[N,C,D,H,W]"
        raise TapeError(f"nn.{what}: expected x {want}, got {list(x.shape)}")
    size = list(output_size) if isinstance(output_size, (list, tuple)) else \
        [output_size] * dims
    if len(size) != dims:
        count = ("two", "three")[dims - 2]
        raise TapeError(f"nn.{what}: output_size must be an int or {count}, got "
                        f"{output_size!r}"[:200])
    size = [x.shape[2 + k] if v is None else v for k, v in enumerate(size)]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in size):
        raise TapeError(f"nn.{what}: output_size must be ints >= 1, got "
                        f"{output_size!r}"[:200])
    return size


def _separable_windows(tp, x, size, out, reduce):
    """torch's adaptive windows reduced one spatial axis at a time, the last first."""
    y = x
    for k in reversed(range(len(size))):
        axis, n, o = 2 + k, size[k], out[k]
        if n != o:
            y = tp.cat([reduce(tp.narrow(y, axis, lo, hi), axis=axis, keepdims=True)
                        for lo, hi in _windows(n, o)], axis)
    return y


def adaptive_avg_pool2d(x: GVar, output_size) -> GVar:
    """torch's ``adaptive_avg_pool2d``: x [N, C, H, W] to [N, C, OH, OW] (``output_size``
    an int or two; None keeps that dim).

    Where OH divides H and OW divides W, one ``avg_pool2d`` (kernel = stride = H/OH x
    W/OW: the sum of each window / its count, as torch).  Else the windows overlap or
    differ in size: along W, each window's axis ``mean`` (a slice), joined; then the same
    along H -- a mean of the window's row means, equal to torch's mean in value (the
    windows are rectangles), not in its last bits.
    """
    tp = tape_of(x, "adaptive_avg_pool2d")
    (h, w), (oh, ow) = x.shape[2:], _adaptive_size(x, output_size, "adaptive_avg_pool2d")
    if h % oh == 0 and w % ow == 0:
        if (oh, ow) == (h, w):
            return x
        return tp.avg_pool2d(x, kernel=[h // oh, w // ow], stride=[h // oh, w // ow],
                             padding=[0, 0], ceil_mode=False, count_include_pad=True)
    return _separable_windows(tp, x, (h, w), (oh, ow), tp.mean)


def adaptive_max_pool2d(x: GVar, output_size) -> GVar:
    """torch's ``adaptive_max_pool2d`` (the values): one ``max_pool2d`` where the output
    size divides the input's, else each window's axis ``max`` along W, joined, then
    along H.  Either way the first maximum of a window in row-major order gets the
    gradient (along W first, then H, picks the first row holding the maximum and
    the first column in it), as max_pool2d; a NaN wins."""
    tp = tape_of(x, "adaptive_max_pool2d")
    (h, w), (oh, ow) = x.shape[2:], _adaptive_size(x, output_size, "adaptive_max_pool2d")
    if h % oh == 0 and w % ow == 0:
        if (oh, ow) == (h, w):
            return x
        k = [h // oh, w // ow]
        return tp.max_pool2d(x, kernel=k, stride=k, padding=[0, 0], dilation=[1, 1],
                             ceil_mode=False)
    return _separable_windows(tp, x, (h, w), (oh, ow), tp.max)


def adaptive_avg_pool3d(x: GVar, output_size) -> GVar:
    """torch's ``adaptive_avg_pool3d``: x [N, C, D, H, W] to [N, C, OD, OH, OW]
    (``output_size`` an int or three; None keeps that dim): each window's axis ``mean``
    along W, joined, then along H, then along D -- the mean of the window's means, torch's
    mean in value (the windows are boxes), not in its last bits."""
    tp = tape_of(x, "adaptive_avg_pool3d")
    size, out = list(x.shape[2:]), _adaptive_size(x, output_size, "adaptive_avg_pool3d", 3)
    return _separable_windows(tp, x, size, out, tp.mean)


def adaptive_max_pool3d(x: GVar, output_size) -> GVar:
    """torch's ``adaptive_max_pool3d`` (the values): each window's axis ``max`` along W,
    joined, then along H, then D; the first maximum of a window in (depth, row, column)
    order gets the gradient, torch's scan order; a NaN wins."""
    tp = tape_of(x, "adaptive_max_pool3d")
    size, out = list(x.shape[2:]), _adaptive_size(x, output_size, "adaptive_max_pool3d", 3)
    return _separable_windows(tp, x, size, out, tp.max)
