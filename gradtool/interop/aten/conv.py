"""Convolutions, pooling, batch and group norm, upsampling and grid sampling."""

from __future__ import annotations

import math

import numpy as np

from ... import nn
from .registry import Unsupported, aten


# ── convolutional layers (issue 21) ────────────────────────────────────────
#
# ATen mappings of the convolutional ops (issue 21): convolution, batch norm, pooling.
#
# Each entry records through ``gradtool.nn``:
#
# * ``aten.convolution.default``: ``nn.conv2d`` (NCHW) or ``nn.conv1d`` (NCL), bias
#   added by broadcasting; transposed: ``nn.conv_transpose2d`` or ``nn.conv_transpose1d``.
# * ``aten.max_pool2d_with_indices.default``: ``nn.max_pool2d`` (the values; a graph
#   that reads the indices is refused by the importer's getitem check).
# * ``aten.avg_pool2d.default``: ``nn.avg_pool2d`` (``divisor_override`` refused).
# * ``aten._native_batch_norm_legit_no_training.default``: ``nn.batch_norm2d`` with the
#   running statistics as consts (eval mode).
# * ``aten._native_batch_norm_legit_functional.default``: ``nn.batch_norm2d_train``
#   (train mode): the new running statistics are its outputs 3 and 4, which the
#   importer turns into named outputs under the buffers' names (its BUFFER_MUTATION
#   rule), the buffers themselves being state slots of those names (named consts the
#   outputs replace after every training step); eval mode through this overload
#   records ``nn.batch_norm2d``.
# * ``aten.mean.dim`` (adaptive average pooling to 1x1) is the table's own mean entry.


def _pair(v, what):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if len(v) == 1:
        v = v * 2
    if len(v) != 2 or not all(isinstance(x, int) for x in v):
        raise Unsupported(f"{what} {v} is not one or two ints")
    return v


@aten("aten.convolution.default", needs=("conv2d", "nn.conv2d", "nn.conv1d",
                                         "nn.conv_transpose2d", "nn.conv_transpose1d"),
      doc="gradtool.nn.conv2d (NCHW), nn.conv1d (NCL) or nn.conv3d (NCDHW: a conv2d per "
          "output depth of the depth slab merged into the channels); transposed: "
          "nn.conv_transpose2d or nn.conv_transpose1d (a conv2d of the stride-spread "
          "input); the bias a broadcast add")
def _convolution(r, node, x, w, bias, stride, padding, dilation, transposed,
                 output_padding, groups):
    x, w = r.f(x), r.f(w)
    b = None if bias is None else r.f(bias)
    if transposed:
        return _conv_transpose(x, w, b, stride, padding, dilation, output_padding, groups)
    if len(x.shape) == 4:
        return nn.conv2d(x, w, b, stride=_pair(stride, "stride"),
                         padding=_pair(padding, "padding"),
                         dilation=_pair(dilation, "dilation"), groups=int(groups))
    if len(x.shape) == 3:
        one = lambda v: (list(v) if isinstance(v, (list, tuple)) else [v])[0]   # noqa: E731
        return nn.conv1d(x, w, b, stride=one(stride), padding=one(padding),
                         dilation=one(dilation), groups=int(groups))
    if len(x.shape) == 5:
        return nn.conv3d(x, w, b, stride=stride, padding=padding, dilation=dilation,
                         groups=int(groups))
    raise Unsupported(f"a convolution of a rank-{len(x.shape)} input (1-d, 2-d and 3-d only)")


def _conv_transpose(x, w, b, stride, padding, dilation, output_padding, groups):
    if len(x.shape) == 4:
        return nn.conv_transpose2d(x, w, b, stride=_pair(stride, "stride"),
                                   padding=_pair(padding, "padding"),
                                   output_padding=_pair(output_padding, "output_padding"),
                                   groups=int(groups), dilation=_pair(dilation, "dilation"))
    if len(x.shape) == 3:
        one = lambda v: (list(v) if isinstance(v, (list, tuple)) else [v])[0]   # noqa: E731
        return nn.conv_transpose1d(x, w, b, stride=one(stride), padding=one(padding),
                                   output_padding=one(output_padding), groups=int(groups),
                                   dilation=one(dilation))
    if len(x.shape) == 5:
        return nn.conv_transpose3d(x, w, b, stride=stride, padding=padding,
                                   output_padding=output_padding, groups=int(groups),
                                   dilation=dilation)
    raise Unsupported(f"a transposed convolution of a rank-{len(x.shape)} input (1-d, 2-d "
                      f"and 3-d only)")


@aten("aten.max_pool2d_with_indices.default", needs=("max_pool2d",),
      doc="gradtool.nn.max_pool2d (the values; the indices are not recorded)")
def _max_pool2d(r, node, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    k = _pair(kernel_size, "kernel_size")
    y = nn.max_pool2d(r.f(x), k, _pair(stride, "stride") if stride else k,
                      _pair(padding, "padding"), _pair(dilation, "dilation"),
                      ceil_mode=bool(ceil_mode))
    return (y, None)


@aten("aten.avg_pool2d.default", needs=("avg_pool2d",),
      doc="gradtool.nn.avg_pool2d (ceil_mode, count_include_pad; no divisor_override)")
def _avg_pool2d(r, node, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    if divisor_override is not None:
        raise Unsupported("avg_pool2d's divisor_override")
    k = _pair(kernel_size, "kernel_size")
    return nn.avg_pool2d(r.f(x), k, _pair(stride, "stride") if stride else k,
                         _pair(padding, "padding"), ceil_mode=bool(ceil_mode),
                         count_include_pad=bool(count_include_pad))


def _batched(r, x, fn, rank, what):
    """fn of x of ``rank`` dims ([N, C, ...]), or of an unbatched x (one dim fewer) as a
    batch of one; any other rank is refused."""
    if len(x.shape) not in (rank - 1, rank):
        raise Unsupported(f"{what} of a rank-{len(x.shape)} input")
    if len(x.shape) == rank - 1:
        y = fn(r.reshape(x, [1] + list(x.shape)))
        return r.reshape(y, list(y.shape[1:]))
    return fn(x)


@aten("aten.max_pool3d_with_indices.default", needs=("nn.max_pool3d",),
      doc="gradtool.nn.max_pool3d (per output depth the maximum of the max_pool2d of each "
          "depth in its window; the values, the indices are not recorded)")
def _max_pool3d(r, node, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return (_batched(r, r.f(x), lambda v: nn.max_pool3d(
        v, kernel_size, stride or None, padding, dilation, bool(ceil_mode)), 5,
        "max_pool3d"), None)


@aten("aten.avg_pool3d.default", needs=("nn.avg_pool3d",),
      doc="gradtool.nn.avg_pool3d (the avg_pool2d of each depth in the window summed and "
          "divided by the depth count; ceil_mode, count_include_pad; no divisor_override)")
def _avg_pool3d(r, node, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    if divisor_override is not None:
        raise Unsupported("avg_pool3d's divisor_override")
    return _batched(r, r.f(x), lambda v: nn.avg_pool3d(
        v, kernel_size, stride or None, padding, bool(ceil_mode), bool(count_include_pad)), 5,
        "avg_pool3d")


def _optional(r, v):
    return None if v is None else r.f(v)


def _as_nchw(r, x):
    """Batch norm's input as [N, C, H, W]: [N, C] and [N, C, L] (BatchNorm1d) and [N, C,
    D, H, W] (BatchNorm3d) reshaped to [N, C, rest, 1], the same values per channel."""
    if len(x.shape) < 2:
        raise Unsupported(f"batch norm of a rank-{len(x.shape)} input")
    n, c = x.shape[:2]
    rest = math.prod(x.shape[2:])
    return x if len(x.shape) == 4 else r.reshape(x, [n, c, rest, 1])


@aten("aten._native_batch_norm_legit_no_training.default", needs=("nn.batch_norm2d",),
      doc="gradtool.nn.batch_norm2d (eval mode: the running statistics as consts)")
def _batch_norm_eval(r, node, x, weight, bias, running_mean, running_var, momentum, eps):
    x = r.f(x)
    y = nn.batch_norm2d(_as_nchw(r, x), _optional(r, weight), _optional(r, bias),
                        r.f(running_mean), r.f(running_var), eps=float(eps))
    return (r.reshape(y, x.shape), None, None)


@aten("aten._native_batch_norm_legit_functional.default",
      needs=("nn.batch_norm2d_train",),
      doc="gradtool.nn.batch_norm2d_train (batch statistics; the running statistics' "
          "update as the buffers' named outputs)")
def _batch_norm_train(r, node, x, weight, bias, running_mean, running_var, training,
                      momentum, eps):
    x = r.f(x)
    x4 = _as_nchw(r, x)
    w, b = _optional(r, weight), _optional(r, bias)
    if not training:
        y = nn.batch_norm2d(x4, w, b, r.f(running_mean), r.f(running_var), eps=float(eps))
        return (r.reshape(y, x.shape), None, None, r.f(running_mean), r.f(running_var))
    y, new_mean, new_var = nn.batch_norm2d_train(x4, w, b, r.f(running_mean),
                                                 r.f(running_var), momentum=float(momentum),
                                                 eps=float(eps))
    return (r.reshape(y, x.shape), None, None, new_mean, new_var)


@aten("aten._native_batch_norm_legit.no_stats", needs=("nn.batch_norm2d_train",),
      doc="gradtool.nn.batch_norm2d_train without running statistics (instance norm: "
          "torch's [1, N*C, ...] view, the batch statistics per channel)")
def _batch_norm_no_stats(r, node, x, weight, bias, training, momentum, eps):
    if not training:
        raise Unsupported("batch norm in eval mode without running statistics")
    x = r.f(x)
    y, _, _ = nn.batch_norm2d_train(_as_nchw(r, x), _optional(r, weight), _optional(r, bias),
                                    eps=float(eps))
    return (r.reshape(y, x.shape), None, None)


@aten("aten.native_group_norm.default", needs=("nn.group_norm",),
      doc="gradtool.nn.group_norm (native_layer_norm of each group, then weight and bias)")
def _group_norm(r, node, x, weight, bias, n, c, hxw, group, eps):
    y = nn.group_norm(r.f(x), int(group), _optional(r, weight), _optional(r, bias),
                      eps=float(eps))
    return (y, None, None)


@aten("aten._adaptive_avg_pool2d.default", needs=("nn.adaptive_avg_pool2d",),
      doc="gradtool.nn.adaptive_avg_pool2d (avg_pool2d where the sizes divide, else the "
          "mean of each window's row means)")
def _adaptive_avg_pool2d(r, node, x, output_size):
    return _adaptive_pool(r, nn.adaptive_avg_pool2d, "average", x, output_size)


def _adaptive_pool(r, pool, what, x, output_size):
    """One of nn's adaptive poolings of an [N, C, H, W] input, or of an unbatched [C, H, W]
    one as a batch of one."""
    size = [int(v) for v in output_size]
    return _batched(r, r.f(x), lambda v: pool(v, size), 4, f"adaptive {what} pooling")


@aten("aten.adaptive_max_pool2d.default", needs=("nn.adaptive_max_pool2d",),
      doc="gradtool.nn.adaptive_max_pool2d (max_pool2d where the sizes divide, else the "
          "max of each window's row maxima; the values, the indices not recorded)")
def _adaptive_max_pool2d(r, node, x, output_size):
    return (_adaptive_pool(r, nn.adaptive_max_pool2d, "max", x, output_size), None)


@aten("aten._adaptive_avg_pool3d.default", needs=("nn.adaptive_avg_pool3d",),
      doc="gradtool.nn.adaptive_avg_pool3d (the mean of each window's means, along W, H, D)")
def _adaptive_avg_pool3d(r, node, x, output_size):
    size = [int(v) for v in output_size]
    return _batched(r, r.f(x), lambda v: nn.adaptive_avg_pool3d(v, size), 5,
                    "adaptive average pooling")


@aten("aten.adaptive_max_pool3d.default", needs=("nn.adaptive_max_pool3d",),
      doc="gradtool.nn.adaptive_max_pool3d (the max of each window's maxima along W, H, D; "
          "the values, the indices not recorded)")
def _adaptive_max_pool3d(r, node, x, output_size):
    size = [int(v) for v in output_size]
    return (_batched(r, r.f(x), lambda v: nn.adaptive_max_pool3d(v, size), 5,
                     "adaptive max pooling"), None)


@aten("aten.grid_sampler_2d.default", needs=("nn.grid_sample",),
      doc="gradtool.nn.grid_sample: bilinear, zero padding (torch's floor rule for the "
          "grid's gradient); nearest and bicubic modes, border and reflection padding "
          "refused")
def _grid_sampler_2d(r, node, x, grid, interpolation_mode, padding_mode, align_corners):
    if interpolation_mode != 0 or padding_mode != 0:
        modes = ("bilinear", "nearest", "bicubic")
        pads = ("zeros", "border", "reflection")
        raise Unsupported(f"grid_sample with mode {modes[interpolation_mode]!r} and "
                          f"padding_mode {pads[padding_mode]!r} (bilinear, zeros only)")
    return nn.grid_sample(r.f(x), r.f(grid), align_corners=bool(align_corners))


@aten("aten.upsample_bilinear2d.vec", "aten.upsample_bilinear2d.default",
      needs=("nn.upsample_bilinear2d",),
      doc="gradtool.nn.upsample_bilinear2d (torch's taps and weights; along W, then H)")
def _upsample_bilinear2d(r, node, x, output_size, align_corners, *scales):
    x = r.f(x)
    if len(scales) == 1:                       # .vec: scale_factors (or None)
        scales = scales[0] if scales[0] is not None else (None, None)
    return nn.upsample_bilinear2d(x, r.tshape(node)[2:], bool(align_corners),
                                  [None if v is None else float(v) for v in scales])


@aten("aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default",
      "aten._upsample_nearest_exact2d.vec", "aten._upsample_nearest_exact2d.default",
      needs=("index_select",),
      doc="index_select of rows, then of columns, by the source indices torch's own kernel "
          "picks (it is run once on a map of indices at import): copies")
def _upsample_nearest2d(r, node, x, *args, **kwargs):
    import torch
    x = r.f(x)
    n, c, h, w = x.shape
    oh, ow = r.tshape(node)[2:]
    where = torch.arange(h * w, dtype=torch.float64).reshape(1, 1, h, w)
    src = node.target(where, *args, **kwargs)[0, 0].numpy().astype(np.int64)
    rows, cols = src[:, 0] // w, src[0, :] % w
    if src.shape != (oh, ow) or not np.array_equal(src, rows[:, None] * w + cols[None, :]):
        raise Unsupported("a nearest upsampling that is not one source row and column per "
                          "output row and column (an importer bug)")
    if not np.array_equal(rows, np.arange(h)):
        x = r.tp.index_select(x, 2, rows)
    if not np.array_equal(cols, np.arange(w)):
        x = r.tp.index_select(x, 3, cols)
    return x
