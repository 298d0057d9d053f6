"""The axis and shape checks the Tape-method composites share (layout, reductions,
sorting): ``is_int``, ``shape_of``, ``fail`` (poison the tape, as ops do),
``checked_axis``, ``checked_axes``, ``checked_dims``.

Apart from :mod:`._args` because ``tape.py`` imports those families (they are Tape
methods): nothing here imports the tape.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..errors import ShapeError, TapeError


def is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def shape_of(tp, a, what: str) -> tuple:
    return tuple(tp.values[tp.node_id(a, what)].shape)


def fail(tp, message: str):
    """A shape problem: poison the tape (ShapeError with raise_on_error), as ops do."""
    return tp._poison(message, ShapeError)


def checked_axis(x, rank: int, what: str, *, extra: int = 0) -> int:
    """One axis in [-rank-extra, rank+extra), normalised to >= 0; TapeError otherwise."""
    if not is_int(x):
        raise TapeError(f"{what}: an axis must be an int, got {x!r}"[:200])
    n = rank + extra
    if not -n <= int(x) < n:
        raise TapeError(f"{what}: axis {int(x)} is out of range for rank {rank}")
    return int(x) + n if x < 0 else int(x)


def checked_axes(axis, rank: int, what: str) -> list:
    """None -> every axis; an int or a sequence of ints -> sorted distinct axes >= 0."""
    if axis is None:
        return list(range(rank))
    items = [axis] if is_int(axis) else None
    if items is None:
        try:
            items = list(axis)
        except TypeError:
            raise TapeError(f"{what}: axis must be None, an int or a sequence of ints, "
                            f"got {axis!r}"[:200]) from None
    out = [checked_axis(x, rank, what) for x in items]
    for x in out:
        if out.count(x) > 1:
            raise TapeError(f"{what}: axis {x} appears more than once in {list(items)}")
    return sorted(out)


def checked_dims(shape, what: str) -> list:
    try:
        dims = list(shape)
    except TypeError:
        raise TapeError(f"{what}: expected a sequence of ints, got {shape!r}"[:200]) from None
    if not all(is_int(d) for d in dims):
        raise TapeError(f"{what}: expected ints, got {dims!r}"[:200])
    return [int(d) for d in dims]
