"""The text of a million table rows at numpy speed: ``inspect``'s node table and the node
list of ``inspect --json`` at the node limit.

A row is a sequence of fields, and a field gives every row a run of ASCII bytes: a
constant, a decimal integer (as ``str`` writes it, or right-aligned in a width as ``%*d``
does), or an entry of a small table (an op's cell, a shape's).  A field is a matrix of
bytes, one line per row (or one line for every row), where a NUL is no byte (the texts
here never hold one: JSON writes it as ``\\u0000``, the table's cells are op names, shapes,
numbers); the text of all rows is the matrices side by side, read in row-major order,
without the NULs: nothing is done in Python per row.  Rows whose text is made otherwise
(a node with a name or attributes) are given as bytes and put in at their place.
"""

from __future__ import annotations

from itertools import repeat

import numpy as np

_CHUNK = 1 << 13                  # rows rendered at a time: the matrix stays in the cache
_POWERS = 10 ** np.arange(1, 19, dtype=np.int64)
_PAIRS = np.frombuffer("".join(f"{k:02d}" for k in range(100)).encode("ascii"),
                       dtype=np.uint16)          # "00".."99", two bytes each


class Field:
    """Row r's bytes are ``matrix[r]`` (``matrix`` of one line: the same for every row)
    without its NULs, ``length`` of them (an int, or one per row)."""

    __slots__ = ("matrix", "length")

    def __init__(self, matrix: np.ndarray, length):
        self.matrix, self.length = matrix, length


def const(text: str) -> Field:
    """``text`` in every row."""
    return Field(_ascii(text).reshape(1, -1), len(text))


def integers(values: np.ndarray, width: int = 0) -> Field:
    """Each row's int64 in decimal: ``str(v)``, or with ``width`` (at least the longest
    text), ``"%*d" % (width, v)``."""
    v = np.asarray(values, dtype=np.int64)
    negative = v < 0
    magnitude = np.abs(v)
    length = np.searchsorted(_POWERS, magnitude, side="right") + 1 + negative
    longest = int(length.max()) if v.size else 1
    if longest > width > 0:                  # rows longer than the width: spaces, then these
        digits = integers(v)
        return join(pad(np.maximum(width - digits.length, 0)), digits)
    w = max(longest, width)
    w += w % 2                               # two digits at a time
    matrix = np.empty((v.size, w), dtype=np.uint8)
    pairs = matrix.view(np.uint16)           # a pair of digits, as one table entry
    rest = magnitude.astype(np.uint32 if w <= 9 else np.uint64)
    for k in range(w // 2 - 1, -1, -1):
        quotient = rest // 100
        np.take(_PAIRS, rest - quotient * 100, out=pairs[:, k])
        rest = quotient
    first = w - length                       # where each row's text begins
    matrix[np.arange(w) < first[:, None]] = ord(" ") if width else 0
    matrix[np.flatnonzero(negative), first[negative]] = ord("-")
    if width:
        return Field(matrix[:, w - width:], width)
    return Field(matrix, length)


def join(*fields: Field) -> Field:
    """The fields one after the other, as one."""
    n = max(len(f.matrix) for f in fields)
    return Field(np.concatenate([np.broadcast_to(f.matrix, (n, f.matrix.shape[1]))
                                 for f in fields], axis=1), sum(f.length for f in fields))


def lookup(texts: list, codes: np.ndarray) -> Field:
    """Row r gets ``texts[codes[r]]``."""
    encoded = [t.encode("ascii") for t in texts]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    w = max(1, int(lengths.max()) if encoded else 1)
    table = np.frombuffer(b"".join(map(bytes.ljust, encoded, repeat(w), repeat(b"\0"))),
                          dtype=np.uint8).reshape(len(encoded), w)
    return Field(table[codes], lengths[codes])


def pad(length: np.ndarray) -> Field:
    """``length[r]`` spaces (one per row, >= 0)."""
    length = np.asarray(length, dtype=np.int64)
    return lookup([" " * k for k in range(int(length.max()) + 1 if length.size else 1)],
                  length)


def when(field: Field, rows: np.ndarray) -> Field:
    """``field`` in the rows where ``rows`` (a bool per row) is true, nothing elsewhere."""
    return Field(np.where(rows[:, None], field.matrix, np.uint8(0)),
                 np.where(rows, field.length, 0))


def render(n: int, fields: list, sep: str, others: dict) -> list:
    """The text of rows 0..n-1, joined by ``sep``, as a list of bytes to join: row r is
    the fields' bytes, or ``others[r]`` (bytes) where given."""
    last = np.zeros((n, len(sep)), dtype=np.uint8)   # sep after every row but the last
    last[:-1] = _ascii(sep)
    fields = [*fields, Field(last, np.where(np.arange(n) < n - 1, len(sep), 0))]
    width = sum(f.matrix.shape[1] for f in fields)
    skip = sorted(others)
    length = np.zeros(n, dtype=np.int64)
    for f in fields:
        length += f.length
    length[skip] = 0
    starts = np.cumsum(length) - length         # where each row begins in the output
    out, big = [], np.empty((_CHUNK, width), dtype=np.uint8)
    skip_rows = np.zeros(n, dtype=bool)
    skip_rows[skip] = True
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        rows = big[:hi - lo]
        col = 0
        for f in fields:
            w = f.matrix.shape[1]
            rows[:, col:col + w] = f.matrix[lo:hi] if len(f.matrix) > 1 else f.matrix
            col += w
        rows[skip_rows[lo:hi]] = 0
        out.append(rows[rows != 0].tobytes())
    text = b"".join(out)
    parts, at, sep_bytes = [], 0, sep.encode("ascii")
    for r in skip:
        begin = int(starts[r])
        parts.append(text[at:begin])
        parts.append(others[r] + (sep_bytes if r < n - 1 else b""))
        at = begin
    parts.append(text[at:])
    return parts


def _ascii(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("ascii"), dtype=np.uint8)
