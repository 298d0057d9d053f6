"""The argument checks the building blocks share (one home, so each check is written once).

``tape_of`` (the tape a building block records on: its first argument's, which must be a
GVar), ``ints``/``pair``/``triple`` (an int, or one int per spatial axis) and
``depth_out``/``rank5`` (the 3-d layers' depth and rank checks).  Messages keep the
``nn.`` prefix the building blocks have always had.  The Tape-method composites' axis
checks are in :mod:`._axes`.
"""

from __future__ import annotations

from ..errors import TapeError
from ..tape import GVar


def tape_of(x, what: str):
    """The tape ``x`` (a GVar) records on; TapeError naming ``nn.<what>`` otherwise."""
    if not isinstance(x, GVar):
        raise TapeError(f"nn.{what}: expected a GVar, got {type(x).__name__}")
    return x.tape


def ints(v, count: int, what: str) -> list:
    """An int (repeated) or ``count`` ints: [height, width], or [depth, height, width]."""
    words = {2: "two", 3: "three"}[count]
    if isinstance(v, int) and not isinstance(v, bool):
        return [v] * count
    try:
        out = [int(x) for x in v]
    except (TypeError, ValueError):
        out = None
    if out is None or len(out) != count:
        raise TapeError(f"nn.{what}: expected an int or {words} ints, got {v!r}"[:200])
    return out


def pair(v, what: str) -> list:
    """:func:`ints` for [height, width]."""
    return ints(v, 2, what)


def triple(v, what: str) -> list:
    """:func:`ints` for [depth, height, width]."""
    return ints(v, 3, what)


def depth_out(tp, what, d, k, stride, pad, dil, ceil_mode=False) -> int:
    """The output depth of a 3-d window (torch's rule, ``ceil_mode`` included), checked."""
    if k < 1 or stride < 1 or dil < 1 or pad < 0:
        raise TapeError(f"nn.{what}: the depth's kernel, stride and dilation must be >= 1 "
                        f"and its padding >= 0, got {k}, {stride}, {dil}, {pad}")
    span = d + 2 * pad - dil * (k - 1) - 1
    if span < 0:
        raise TapeError(f"nn.{what}: the depth window ({k} taps, dilation {dil}) is larger "
                        f"than the padded depth {d + 2 * pad}")
    out = -(-span // stride) + 1 if ceil_mode else span // stride + 1
    if ceil_mode and (out - 1) * stride >= d + pad:     # torch: no window starts in the pad
        out -= 1
    return out


def rank5(x, what, name="x", dims="[N, C, D, H, W]"):
    """TapeError unless ``x`` has five dims (a 3-d layer's input or kernel)."""
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) != 5:
        raise TapeError(f"nn.{what}: expected {name} {dims}, got "
                        f"{list(shape) if shape is not None else type(x).__name__}")
