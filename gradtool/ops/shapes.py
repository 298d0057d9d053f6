"""The shape rules: each op's output shape from its inputs', without arithmetic or
allocation."""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .spec import attr, format_shape


# ── shape rules ────────────────────────────────────────────────────────────

def broadcast_shape(sa, sb, _attrs=None):
    """numpy broadcasting: trailing dims aligned; 1 or a missing dim stretches."""
    nd = max(len(sa), len(sb))
    pa = (1,) * (nd - len(sa)) + tuple(sa)
    pb = (1,) * (nd - len(sb)) + tuple(sb)
    out = []
    for da, db in zip(pa, pb):
        if da != db and da != 1 and db != 1:
            raise ShapeError(f"shapes {format_shape(sa)} and {format_shape(sb)} do not broadcast")
        out.append(max(da, db))
    return tuple(out)


def _same_shape(sa, _sb, _attrs):
    return tuple(sa)


def _matmul_shape(sa, sb, _attrs):
    if len(sa) != 2 or len(sb) != 2 or sa[1] != sb[0]:
        raise ShapeError(f"matmul needs [M,K] @ [K,N], got {format_shape(sa)} @ {format_shape(sb)}")
    return (sa[0], sb[1])


def _bmm_shape(sa, sb, _attrs):
    if (len(sa) != 3 or len(sb) != 3 or sa[2] != sb[1]
            or (sa[0] != sb[0] and 1 not in (sa[0], sb[0]))):
        raise ShapeError(f"bmm needs [B,M,K] @ [B,K,N] (a batch of 1 on either side "
                         f"stretches), got {format_shape(sa)} @ {format_shape(sb)}")
    return (max(sa[0], sb[0]), sa[1], sb[2])


def _transpose_shape(sa, _sb, _attrs):
    if len(sa) < 2:
        raise ShapeError(f"transpose needs rank >= 2, got {format_shape(sa)}")
    return tuple(sa[:-2]) + (sa[-1], sa[-2])


def _reshape_shape(sa, _sb, attrs):
    target = tuple(attrs["shape"])
    if not target or any(d < 1 for d in target):
        raise ShapeError(f"reshape target {format_shape(target)} must have dims >= 1")
    if int(np.prod(target, dtype=object)) != int(np.prod(sa, dtype=object)):
        raise ShapeError(f"cannot reshape {format_shape(sa)} into {format_shape(target)}")
    return target


def _axis_check(sa, axis, opname):
    if not 0 <= axis < len(sa):
        raise ShapeError(f"{opname} axis {axis} out of range for {format_shape(sa)}")


def _softmax_shape(sa, _sb, attrs):
    _axis_check(sa, attrs["axis"], "softmax")
    return tuple(sa)


def _slice_steps(sa, attrs) -> tuple:
    steps = attr(attrs, "steps")
    return (1,) * len(sa) if steps is None else tuple(steps)


def _slice_shape(sa, _sb, attrs):
    starts, stops = tuple(attrs["starts"]), tuple(attrs["stops"])
    steps = _slice_steps(sa, attrs)
    if len(starts) != len(sa) or len(stops) != len(sa) or len(steps) != len(sa):
        raise ShapeError(f"slice needs one start, stop (and step) per axis of "
                         f"{format_shape(sa)}, got starts {list(starts)} stops {list(stops)}"
                         + ("" if attr(attrs, "steps") is None else f" steps {list(steps)}"))
    for lo, hi, dim in zip(starts, stops, sa):
        if not 0 <= lo < hi <= dim:
            raise ShapeError(f"slice [{lo}, {hi}) is empty or outside an axis of size {dim} "
                             f"in {format_shape(sa)}")
    if any(st < 1 for st in steps):
        raise ShapeError(f"slice steps {list(steps)} must be >= 1")
    return tuple(-(-(hi - lo) // st) for lo, hi, st in zip(starts, stops, steps))


def _equal_but_axis(sa, sb, axis) -> bool:
    """Same rank, and equal dims everywhere except on ``axis``."""
    return len(sa) == len(sb) and all(x == y for i, (x, y) in enumerate(zip(sa, sb))
                                      if i != axis)


def _take_shape(sa, sb, _attrs):
    return tuple(sb) + tuple(sa[1:])


def _scatter_shape(sa, sb, attrs):
    if len(sb) > len(sa) or tuple(sa[:len(sb)]) != tuple(sb):
        raise ShapeError(f"scatter needs src shaped [*ids.shape, ...]: src {format_shape(sa)} "
                         f"does not start with the ids' {format_shape(sb)}")
    return (attrs["rows"],) + tuple(sa[len(sb):])


def _take_along_shape(sa, sb, attrs):
    axis = attrs["axis"]
    _axis_check(sa, axis, "take_along")
    if not _equal_but_axis(sa, sb, axis):
        raise ShapeError(f"take_along on axis {axis} needs ids shaped like {format_shape(sa)} "
                         f"except on that axis, got {format_shape(sb)}")
    return tuple(sb)


def _concat_shape(sa, sb, attrs):
    axis = attrs["axis"]
    _axis_check(sa, axis, "concat")
    if not _equal_but_axis(sa, sb, axis):
        raise ShapeError(f"concat along axis {axis} needs equal other dims, got "
                         f"{format_shape(sa)} and {format_shape(sb)}")
    return tuple(sa[:axis]) + (sa[axis] + sb[axis],) + tuple(sa[axis + 1:])


def _permute_shape(sa, _sb, attrs):
    dims = tuple(attrs["dims"])
    if sorted(dims) != list(range(len(sa))):
        raise ShapeError(f"permute dims {list(dims)} are not a permutation of the "
                         f"{len(sa)} axes of {format_shape(sa)}")
    return tuple(sa[d] for d in dims)
