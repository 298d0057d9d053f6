"""Convolutions, NCHW with torch.nn.functional's arguments: ``conv1d``/``2d``/``3d`` and
``conv_transpose1d``/``2d``/``3d`` (each the stride-1 convolution it is the gradient of)."""

from __future__ import annotations

from ..errors import TapeError
from ..tape import GVar
from ._args import depth_out, pair, rank5, tape_of, triple
from .layout import spread

__all__ = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d"]


def conv2d(x: GVar, w: GVar, b: GVar = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> GVar:
    """torch's ``conv2d``: x [N, C, H, W], w [OC, C/groups, KH, KW], b [OC] (optional).

    One ``conv2d`` node (the matmul's products, numerics.conv2d), then b
    reshaped to [OC, 1, 1] and added with broadcasting (its gradient the
    serial sum over (n, oh, ow)).
    """
    tp = tape_of(x, "conv2d")
    y = tp.conv2d(x, w, stride=pair(stride, "conv2d stride"),
                  padding=pair(padding, "conv2d padding"),
                  dilation=pair(dilation, "conv2d dilation"), groups=groups)
    return y if b is None else tp.add(y, tp.reshape(b, [b.shape[0], 1, 1]))


def conv1d(x: GVar, w: GVar, b: GVar = None, stride: int = 1, padding: int = 0,
           dilation: int = 1, groups: int = 1) -> GVar:
    """torch's ``conv1d`` (x [N, C, L], w [OC, C/groups, K]) as a conv2d of height 1:
    reshapes around one ``conv2d`` node, the same products."""
    tp = tape_of(x, "conv1d")
    n, c, length = x.shape
    oc, cg, k = w.shape
    y = conv2d(tp.reshape(x, [n, c, 1, length]), tp.reshape(w, [oc, cg, 1, k]), None,
               stride=[1, stride], padding=[0, padding], dilation=[1, dilation], groups=groups)
    y = tp.reshape(y, [n, oc, y.shape[3]])
    return y if b is None else tp.add(y, tp.reshape(b, [oc, 1]))


def conv_transpose2d(x: GVar, w: GVar, b: GVar = None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1) -> GVar:
    """torch's ``conv_transpose2d``: x [N, C, H, W], w [C, OC/groups, KH, KW] (the
    layout of ``nn.ConvTranspose2d.weight``), b [OC] (optional); output size
    ``(H - 1) * stride - 2 * padding + dilation * (KH - 1) + output_padding + 1``.

    Recorded as the convolution it is the gradient of: x spread by the stride (zeros
    between its entries), padded by ``dilation * (K - 1) - padding`` on each side (and
    ``output_padding`` more after; cropped where that is negative), then one ``conv2d``
    of stride 1 by w with its spatial axes reversed and its channel axes exchanged per
    group.  Its products are therefore the matmul's own, as conv2d's; the spread input's
    zeros are multiplied too (stride**2 the work of a direct transposed convolution).
    """
    tp = tape_of(x, "conv_transpose2d")
    s = pair(stride, "conv_transpose2d stride")
    p = pair(padding, "conv_transpose2d padding")
    op = pair(output_padding, "conv_transpose2d output_padding")
    d = pair(dilation, "conv_transpose2d dilation")
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise TapeError(f"nn.conv_transpose2d: expected x [N,C,H,W] and w [C,OC/groups,KH,KW], "
                        f"got {list(x.shape)} and {list(w.shape)}")
    return _transposed(tp, "conv_transpose2d", x, w, b, s, p, op, d, groups,
                       lambda y, wt, pads, g: tp.conv2d(y, wt, stride=[1, 1], padding=pads,
                                                        dilation=d, groups=g))


def _transposed(tp, what, x, w, b, s, p, op, d, groups, conv):
    """The transposed convolution of x [N, C, *spatial] by w [C, OC/groups, *kernel] as the
    stride-1 convolution ``conv(y, wt, pads, groups)`` it is the gradient of (see
    :func:`conv_transpose2d`), for 2 or 3 spatial dims."""
    c, cg, *k = w.shape
    nd = len(k)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or \
            c % groups or x.shape[1] != c:
        raise TapeError(f"nn.{what}: x's {x.shape[1]} channels must be w's dim 0 "
                        f"({c}), divisible by groups={groups!r}")
    if min(s + d) < 1 or min(p) < 0 or min(op) < 0 or any(
            o >= max(si, di) for o, si, di in zip(op, s, d)):
        raise TapeError(f"nn.{what}: stride {s} and dilation {d} must be >= 1, "
                        f"padding {p} >= 0, output_padding {op} >= 0 and smaller than the "
                        f"stride or the dilation")
    y = x
    pads = []
    for i in range(nd):
        axis, ki, si, pi, oi, di = 2 + i, k[i], s[i], p[i], op[i], d[i]
        y = spread(tp, y, axis, si)
        lo = di * (ki - 1) - pi
        hi = lo + oi
        size = y.shape[axis]
        if size + lo + hi - di * (ki - 1) < 1:
            raise TapeError(f"nn.{what}: the output of {list(x.shape)} by a "
                            f"{'x'.join(map(str, k))} kernel (stride {s}, padding {p}) would "
                            f"be empty")
        if min(lo, hi) < 0:                             # crop where padding exceeds the kernel
            y = tp.narrow(y, axis, max(0, -lo), size - max(0, -hi))
            lo, hi = max(0, lo), max(0, hi)
        if hi > lo:                                     # output_padding: zeros after
            widths = [(0, 0)] * (2 + nd)
            widths[axis] = (0, hi - lo)
            y = tp.pad(y, widths)
        pads.append(lo)
    g = groups
    wt = tp.reshape(w, [g, c // g, cg, *k])
    wt = tp.reshape(tp.permute(wt, [0, 2, 1] + list(range(3, 3 + nd))), [g * cg, c // g, *k])
    y = conv(y, tp.flip(wt, tuple(range(2, 2 + nd))), pads, g)
    return y if b is None else tp.add(y, tp.reshape(b, [b.shape[0]] + [1] * nd))


def conv_transpose3d(x: GVar, w: GVar, b: GVar = None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1) -> GVar:
    """torch's ``conv_transpose3d``: x [N, C, D, H, W], w [C, OC/groups, KD, KH, KW] (the
    layout of ``nn.ConvTranspose3d.weight``), b [OC] (optional): as
    :func:`conv_transpose2d`, the stride-1 :func:`conv3d` it is the gradient of (the
    input spread by the stride along each spatial axis, padded or cropped, the kernel
    reversed and its channel axes exchanged per group)."""
    tp = tape_of(x, "conv_transpose3d")
    rank5(x, "conv_transpose3d")
    rank5(w, "conv_transpose3d", "w", "[C, OC/groups, KD, KH, KW]")
    s, p, op, d = (triple(v, f"conv_transpose3d {n}") for v, n in (
        (stride, "stride"), (padding, "padding"), (output_padding, "output_padding"),
        (dilation, "dilation")))
    return _transposed(tp, "conv_transpose3d", x, w, b, s, p, op, d, groups,
                       lambda y, wt, pads, g: conv3d(y, wt, stride=1, padding=pads,
                                                     dilation=d, groups=g))


def conv_transpose1d(x: GVar, w: GVar, b: GVar = None, stride: int = 1, padding: int = 0,
                     output_padding: int = 0, groups: int = 1, dilation: int = 1) -> GVar:
    """torch's ``conv_transpose1d`` (x [N, C, L], w [C, OC/groups, K]) as a
    :func:`conv_transpose2d` of height 1."""
    tp = tape_of(x, "conv_transpose1d")
    if len(x.shape) != 3 or len(w.shape) != 3:
        raise TapeError(f"nn.conv_transpose1d: expected x [N,C,L] and w [C,OC/groups,K], got "
                        f"{list(x.shape)} and {list(w.shape)}")
    n, c, length = x.shape
    y = conv_transpose2d(tp.reshape(x, [n, c, 1, length]), tp.reshape(w, [*w.shape[:2], 1,
                                                                           w.shape[2]]),
                         None, stride=[1, stride], padding=[0, padding],
                         output_padding=[0, output_padding], groups=groups,
                         dilation=[1, dilation])
    y = tp.reshape(y, [n, y.shape[1], y.shape[3]])
    return y if b is None else tp.add(y, tp.reshape(b, [b.shape[0], 1]))


def conv3d(x: GVar, w: GVar, b: GVar = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> GVar:
    """torch's ``conv3d``: x [N, C, D, H, W], w [OC, C/groups, KD, KH, KW], b [OC].

    Per output depth one ``conv2d`` node of the input's depth slab merged into the
    channels ([N, C*KD, H, W], channel-major) by w reshaped to [OC, C/groups*KD, KH, KW]:
    each output's products are one FMA chain over (channel, depth tap, row, column),
    the matmul's inner products as every convolution's, and groups stay contiguous
    blocks of the merged channels.  The depths are joined by ``stack``; zero depth
    padding is a const block (``pad``)."""
    tp = tape_of(x, "conv3d")
    rank5(x, "conv3d")
    rank5(w, "conv3d", "w", "[OC, C/groups, KD, KH, KW]")
    (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = (triple(v, f"conv3d {n}") for v, n in (
        (stride, "stride"), (padding, "padding"), (dilation, "dilation")))
    n, c, d, h, wd = x.shape
    oc, cg, kd, kh, kw = w.shape
    out_d = depth_out(tp, "conv3d", d, kd, sd, pd, dd)
    if pd:
        x = tp.pad(x, [(0, 0), (0, 0), (pd, pd), (0, 0), (0, 0)])
    w2 = tp.reshape(w, [oc, cg * kd, kh, kw])
    outs = []
    for o in range(out_d):
        slab = tp.narrow(x, 2, o * sd, o * sd + dd * (kd - 1) + 1, dd)      # [N, C, KD, H, W]
        outs.append(tp.conv2d(tp.reshape(slab, [n, c * kd, h, wd]), w2, stride=[sh, sw],
                              padding=[ph, pw], dilation=[dh, dw], groups=groups))
    y = tp.stack(outs, 2)
    return y if b is None else tp.add(y, tp.reshape(b, [oc, 1, 1, 1]))
