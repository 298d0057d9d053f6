"""The tape's argument checks: scalar operands, indices, names, ids.

Every :class:`gradtool.tape.Tape` entry point checks its plain arguments through these
(a real scalar, an integer index, a name a tape file can hold, ids inside their table),
raising :class:`gradtool.errors.TapeError` with one line naming the argument.  The
names are re-exported from :mod:`gradtool.tape`, where callers import them.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .errors import TapeError
from .limits import MAX_NAME_BYTES
from .ops import bad_id

def is_number(x) -> bool:
    """A real scalar operand: int, float, numpy real scalar (never bool, never an array)."""
    return (isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_, np.ndarray)))


def _one_line(exc: BaseException, limit: int = 200) -> str:
    return " ".join(str(exc).split())[:limit]


def _readonly(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


def _scalar(s, what) -> float:
    """A finite-or-not real scalar operand as a float; never bool, never an overflow."""
    if not is_number(s):
        raise TapeError(f"{what}: scalar operand must be a real number, got {type(s).__name__}")
    try:
        return float(s)
    except OverflowError:
        raise TapeError(f"{what}: scalar operand {show_int(s)} is too large for a float64") \
            from None


def show_int(x) -> str:
    text = str(x)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"


def _real(x, what: str, nonneg: bool = False) -> float:
    """A finite real number (>= 0 with ``nonneg``) as a float, else TapeError."""
    if not is_number(x):
        raise TapeError(f"{what} must be a real number, got {type(x).__name__}")
    value = _scalar(x, what)
    if not math.isfinite(value) or (nonneg and value < 0.0):
        raise TapeError(f"{what} must be finite{' and >= 0' if nonneg else ''}, got {x!r}")
    return value


def is_index(x) -> bool:
    """An integer index or node id: int or numpy integer (never bool)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def check_name(name, what: str) -> str:
    """A leaf or output name a tape file can hold: a non-empty str of at most
    MAX_NAME_BYTES UTF-8 bytes."""
    if not isinstance(name, str) or not name:
        raise TapeError(f"{what} must be a non-empty string, got {name!r}"[:200])
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise TapeError(f"{what} is not valid Unicode text ({exc.reason} at index "
                        f"{exc.start})") from None
    if size > MAX_NAME_BYTES:
        raise TapeError(f"{what} is {size} bytes long; a tape file allows at most "
                        f"{MAX_NAME_BYTES}")
    return name


def check_ids(ids: np.ndarray, bounds, what: str, error=TapeError) -> None:
    """Raise ``error`` naming the first id outside [0, bound) for any (node, bound) in
    ``bounds`` (the ops that read these ids)."""
    for node, bound in bounds:
        problem = bad_id(ids, bound)
        if problem:
            raise error(f"{what}: {problem}, the range of the {bound}-row table that node "
                        f"{node} reads")


def _int_list(values, what) -> list:
    try:
        items = list(values)
    except TypeError:
        raise TapeError(f"{what}: expected a sequence of integers, got {values!r}") from None
    out = []
    for x in items:
        if not is_index(x):
            raise TapeError(f"{what}: expected integers, got {x!r}"[:200])
        out.append(int(x))
    return out
