"""The table's convolution and pooling (NCHW)."""

from __future__ import annotations

from .. import numerics as nx
from ..errors import ShapeError
from .spec import Attr, OpSpec, _register, attr, format_shape, kernel


# ── the table: convolution and pooling (NCHW) ──────────────────────────────
#
# conv2d(x [N, C, H, W], w [OC, C/groups, KH, KW]) is torch's cross-correlation
# with stride, padding, dilation and groups (a bias is a broadcast add:
# gradtool.nn.conv2d).  Its products are the matmul's own: im2col columns, then
# per group w_g @ cols_g by the matmul kernel (numerics.conv2d), so conv2d follows
# whatever inner-product contract matmul has.  max_pool2d and avg_pool2d follow
# torch's output sizes (ceil_mode) and avg_pool2d torch's divisor
# (count_include_pad).  The orders: numerics.conv2d, max_pool2d, avg_pool2d.  On
# the device: conv2d's three products are one launch each, k_matmul_conv2d (one
# thread per output), k_matmul_conv2d_dw (per weight) and k_matmul_conv2d_dx (per
# input element), each the matmul's FMA chain in numerics' order (the tiled host
# build runs csrc/gt_conv.h, the CPU reference's code, instead); the pools are one
# thread per output (forward) and per input element (backward), no atomics.

_GEOMETRY = ("nb:i ch:i ih:i iw:i kh:i kw:i oh:i ow:i sh:i sw:i ph:i pw:i dh:i dw:i")
_CONV = "oc:i groups:i " + _GEOMETRY
kernel("k_matmul_conv2d", "out:w x:r w:r " + _CONV,
       "out[n, o, y, z] = the FMA chain over (c, i, j) ascending from +0.0 of w * x (+0.0 "
       "at padding; numerics.conv2d)")
kernel("k_matmul_conv2d_dw", "gw:w g:r x:r " + _CONV,
       "gw = gw + the FMA chain over (n, y, z) ascending from +0.0 of g * x, per weight "
       "(numerics.conv2d_backward)")
kernel("k_matmul_conv2d_dx", "gx:w g:r w:r " + _CONV,
       "gx = gx + (0.0 + term + ...) over (i, j) ascending, each term the FMA chain over "
       "the group's output channels of w * g, per input element (numerics.conv2d_backward)")
kernel("k_max_pool", "out:w x:r " + _GEOMETRY,
       "per window the first maximum inside the input, (i, j) row-major; -inf if none "
       "(numerics.max_pool2d)")
kernel("k_max_pool_bwd", "gx:w g:r x:r " + _GEOMETRY,
       "gx = gx + (0.0 + g of each window whose maximum it is, (i, j) ascending), per input "
       "element")
kernel("k_avg_pool", "out:w x:r incl:i " + _GEOMETRY,
       "per window (0.0 + x + ...) / torch's divisor (incl: count_include_pad)")
kernel("k_avg_pool_bwd", "gx:w g:r incl:i " + _GEOMETRY,
       "gx = gx + (0.0 + g/divisor + ...) over the windows reading it, (i, j) ascending")

PAIR = "two ints: (height, width)"


def _pairs(attrs, *names):
    return [tuple(attrs[name]) for name in names]


def _check_pairs(opname, attrs, positive=(), nonneg=()):
    for name in (*positive, *nonneg):
        value = attrs[name]
        low = 1 if name in positive else 0
        if len(value) != 2 or min(value) < low:
            raise ShapeError(f"{opname} {name} must be two ints >= {low}, got {list(value)}")


def _conv2d_shape(sa, sb, attrs):
    _check_pairs("conv2d", attrs, positive=("stride", "dilation"), nonneg=("padding",))
    groups = attrs["groups"]
    if len(sa) != 4 or len(sb) != 4:
        raise ShapeError(f"conv2d needs x [N,C,H,W] and w [OC,C/groups,KH,KW], got "
                         f"{format_shape(sa)} and {format_shape(sb)}")
    if groups < 1 or sa[1] % groups or sb[0] % groups or sb[1] * groups != sa[1]:
        raise ShapeError(f"conv2d with groups={groups} needs C and OC divisible by groups and "
                         f"w's dim 1 = C/groups, got x {format_shape(sa)} w {format_shape(sb)}")
    (sh, sw), (ph, pw), (dh, dw) = _pairs(attrs, "stride", "padding", "dilation")
    oh = nx.conv_out_size(sa[2], sb[2], sh, ph, dh)
    ow = nx.conv_out_size(sa[3], sb[3], sw, pw, dw)
    if oh < 1 or ow < 1:
        raise ShapeError(f"conv2d of {format_shape(sa)} by a {sb[2]}x{sb[3]} kernel (padding "
                         f"{[ph, pw]}, dilation {[dh, dw]}) leaves no output")
    return (sa[0], sb[0], oh, ow)


def _conv_geometry(at):
    return dict(stride=tuple(at["stride"]), padding=tuple(at["padding"]),
                dilation=tuple(at["dilation"]), groups=at["groups"])


def _conv2d_f(a, b, s, at):
    return nx.conv2d(a, b, **_conv_geometry(at))


def _conv2d_b(g, a, b, t, s, at, na, nb):
    return nx.conv2d_backward(g, a, b, **_conv_geometry(at), need_x=na, need_w=nb)


def _pool_shape(opname, sa, attrs, dilation):
    _check_pairs(opname, attrs, positive=("kernel", "stride") + (("dilation",) if dilation
                                                                  else ()),
                 nonneg=("padding",))
    if len(sa) != 4:
        raise ShapeError(f"{opname} needs x [N,C,H,W], got {format_shape(sa)}")
    (kh, kw), (sh, sw), (ph, pw) = _pairs(attrs, "kernel", "stride", "padding")
    if 2 * ph > kh or 2 * pw > kw:
        raise ShapeError(f"{opname} padding {[ph, pw]} must be at most half the kernel "
                         f"{[kh, kw]} (as torch)")
    dh, dw = tuple(attrs["dilation"]) if dilation else (1, 1)
    ceil = bool(attr(attrs, "ceil_mode", False))
    oh = nx.pool_out_size(sa[2], kh, sh, ph, dh, ceil)
    ow = nx.pool_out_size(sa[3], kw, sw, pw, dw, ceil)
    if oh < 1 or ow < 1:
        raise ShapeError(f"{opname} of {format_shape(sa)} by a {kh}x{kw} window leaves no "
                         f"output")
    return (sa[0], sa[1], oh, ow)


def _max_pool_args(at):
    return (tuple(at["kernel"]), tuple(at["stride"]), tuple(at["padding"]),
            tuple(at["dilation"]), bool(attr(at, "ceil_mode", False)))


def _max_pool_f(a, b, s, at):
    return nx.max_pool2d(a, *_max_pool_args(at))


def _max_pool_b(g, a, b, t, s, at, na, nb):
    return (nx.max_pool2d_backward(g, a, *_max_pool_args(at)), None)


def _avg_pool_args(at):
    return (tuple(at["kernel"]), tuple(at["stride"]), tuple(at["padding"]),
            bool(attr(at, "ceil_mode", False)), bool(attr(at, "count_include_pad", True)))


def _avg_pool_f(a, b, s, at):
    return nx.avg_pool2d(a, *_avg_pool_args(at))


def _avg_pool_b(g, a, b, t, s, at, na, nb):
    return (nx.avg_pool2d_backward(g, a, *_avg_pool_args(at)), None)


_WINDOW = (Attr("kernel", "indices", "the window: " + PAIR),
           Attr("stride", "indices", "the window's step: " + PAIR))
_CEIL = Attr("ceil_mode", "flag", "torch's ceil_mode: count a last partial window",
             default=False, optional=True)
_register(OpSpec("conv2d", "conv2d", 2, "NCHW cross-correlation of x [N,C,H,W] by w "
                 "[OC,C/groups,KH,KW] (torch's conv2d, no bias), the matmul's products",
                 _conv2d_shape, _conv2d_f, _conv2d_b,
                 kernels=("k_matmul_conv2d", "k_matmul_conv2d_dw", "k_matmul_conv2d_dx"),
                 attrs=(Attr("stride", "indices", "the step: " + PAIR, default=(1, 1)),
                        Attr("padding", "indices", "zeros on each side: " + PAIR,
                             default=(0, 0)),
                        Attr("dilation", "indices", "the kernel's spacing: " + PAIR,
                             default=(1, 1)),
                        Attr("groups", "count", "input and output channels in this many "
                             "groups (C: depthwise)", default=1))))
_register(OpSpec("max_pool2d", "max_pool2d", 1, "NCHW max pooling (torch's max_pool2d): the "
                 "first maximum of each window gets the gradient; a NaN wins",
                 lambda sa, sb, at: _pool_shape("max_pool2d", sa, at, True),
                 _max_pool_f, _max_pool_b, kernels=("k_max_pool", "k_max_pool_bwd"),
                 attrs=_WINDOW + (Attr("padding", "indices", "-inf on each side: " + PAIR,
                                       default=(0, 0)),
                                  Attr("dilation", "indices", "the window's spacing: " + PAIR,
                                       default=(1, 1)), _CEIL)))
_register(OpSpec("avg_pool2d", "avg_pool2d", 1, "NCHW average pooling (torch's avg_pool2d: "
                 "ceil_mode, count_include_pad)",
                 lambda sa, sb, at: _pool_shape("avg_pool2d", sa, at, False),
                 _avg_pool_f, _avg_pool_b, kernels=("k_avg_pool", "k_avg_pool_bwd"),
                 attrs=_WINDOW + (Attr("padding", "indices", "zeros on each side: " + PAIR,
                                       default=(0, 0)), _CEIL,
                                  Attr("count_include_pad", "flag", "torch's "
                                       "count_include_pad: padding counts in the divisor",
                                       default=True, optional=True))))
