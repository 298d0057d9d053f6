"""ATen mappings of the convolutional ops (issue 21): convolution, batch norm, pooling.

PENDING THE IMPORTER (branch i20-importer): on merging, move this file to
``gradtool/interop/aten_conv.py`` and add, as the last line of
``gradtool/interop/aten.py``::

    from . import aten_conv  # noqa: E402,F401  (issue 21's entries)

It was developed and tested against i20-importer's tree (tests/test_digits_cnn.py's
importer tests skip until then).  Registered into :data:`gradtool.interop.aten.ATEN`
when imported.  Each entry records through ``gradtool.nn``:

* ``aten.convolution.default``: ``nn.conv2d`` (NCHW) or ``nn.conv1d`` (NCL), bias
  added by broadcasting; transposed convolution is refused by name.
* ``aten.max_pool2d_with_indices.default``: ``nn.max_pool2d`` (the values; a graph
  that reads the indices is refused by the importer's getitem check).
* ``aten.avg_pool2d.default``: ``nn.avg_pool2d`` (``divisor_override`` refused).
* ``aten._native_batch_norm_legit_no_training.default``: ``nn.batch_norm2d`` with the
  running statistics as consts (eval mode).
* ``aten._native_batch_norm_legit_functional.default``: ``nn.batch_norm2d_train``
  (train mode): the new running statistics are its outputs 3 and 4, which the
  importer turns into named outputs under the buffers' names (its BUFFER_MUTATION
  rule); eval mode through this overload records ``nn.batch_norm2d``.
* ``aten.mean.dim`` (adaptive average pooling to 1x1) is the table's own mean entry.
"""

from __future__ import annotations

from .aten import Unsupported, aten


def _pair(v, what):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if len(v) == 1:
        v = v * 2
    if len(v) != 2 or not all(isinstance(x, int) for x in v):
        raise Unsupported(f"{what} {v} is not one or two ints")
    return v


@aten("aten.convolution.default", needs=("conv2d", "nn.conv2d", "nn.conv1d"),
      doc="gradtool.nn.conv2d (NCHW) or nn.conv1d (NCL); the bias a broadcast add")
def _convolution(r, node, x, w, bias, stride, padding, dilation, transposed,
                 output_padding, groups):
    from .. import nn
    if transposed:
        raise Unsupported("transposed convolution is not an op of gradtool yet")
    x, w = r.f(x), r.f(w)
    b = None if bias is None else r.f(bias)
    if len(x.shape) == 4:
        return nn.conv2d(x, w, b, stride=_pair(stride, "stride"),
                         padding=_pair(padding, "padding"),
                         dilation=_pair(dilation, "dilation"), groups=int(groups))
    if len(x.shape) == 3:
        one = lambda v: (list(v) if isinstance(v, (list, tuple)) else [v])[0]   # noqa: E731
        return nn.conv1d(x, w, b, stride=one(stride), padding=one(padding),
                         dilation=one(dilation), groups=int(groups))
    raise Unsupported(f"a convolution of a rank-{len(x.shape)} input (1-d and 2-d only)")


@aten("aten.max_pool2d_with_indices.default", needs=("max_pool2d",),
      doc="gradtool.nn.max_pool2d (the values; the indices are not recorded)")
def _max_pool2d(r, node, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    from .. import nn
    k = _pair(kernel_size, "kernel_size")
    y = nn.max_pool2d(r.f(x), k, _pair(stride, "stride") if stride else k,
                      _pair(padding, "padding"), _pair(dilation, "dilation"),
                      ceil_mode=bool(ceil_mode))
    return (y, None)


@aten("aten.avg_pool2d.default", needs=("avg_pool2d",),
      doc="gradtool.nn.avg_pool2d (ceil_mode, count_include_pad; no divisor_override)")
def _avg_pool2d(r, node, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    from .. import nn
    if divisor_override is not None:
        raise Unsupported("avg_pool2d's divisor_override")
    k = _pair(kernel_size, "kernel_size")
    return nn.avg_pool2d(r.f(x), k, _pair(stride, "stride") if stride else k,
                         _pair(padding, "padding"), ceil_mode=bool(ceil_mode),
                         count_include_pad=bool(count_include_pad))


def _optional(r, v):
    return None if v is None else r.f(v)


def _check_rank(x):
    if len(x.shape) != 4:
        raise Unsupported(f"batch norm of a rank-{len(x.shape)} input (NCHW only)")


@aten("aten._native_batch_norm_legit_no_training.default", needs=("nn.batch_norm2d",),
      doc="gradtool.nn.batch_norm2d (eval mode: the running statistics as consts)")
def _batch_norm_eval(r, node, x, weight, bias, running_mean, running_var, momentum, eps):
    from .. import nn
    x = r.f(x)
    _check_rank(x)
    y = nn.batch_norm2d(x, _optional(r, weight), _optional(r, bias), r.f(running_mean),
                        r.f(running_var), eps=float(eps))
    return (y, None, None)


@aten("aten._native_batch_norm_legit_functional.default",
      needs=("nn.batch_norm2d_train",),
      doc="gradtool.nn.batch_norm2d_train (batch statistics; the running statistics' "
          "update as the buffers' named outputs)")
def _batch_norm_train(r, node, x, weight, bias, running_mean, running_var, training,
                      momentum, eps):
    from .. import nn
    x = r.f(x)
    _check_rank(x)
    w, b = _optional(r, weight), _optional(r, bias)
    if not training:
        y = nn.batch_norm2d(x, w, b, r.f(running_mean), r.f(running_var), eps=float(eps))
        return (y, None, None, r.f(running_mean), r.f(running_var))
    y, new_mean, new_var = nn.batch_norm2d_train(x, w, b, r.f(running_mean),
                                                 r.f(running_var), momentum=float(momentum),
                                                 eps=float(eps))
    return (y, None, None, new_mean, new_var)
