"""The registry the entries go in: :class:`Entry`, :data:`ATEN`, the :func:`aten`
decorator, :class:`Unsupported` and the Tape-method checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ... import nn
from ...errors import GradtoolError
from ...tape import Tape


class Unsupported(GradtoolError):
    """An entry cannot record this particular call (an argument it does not handle)."""


@dataclass(frozen=True)
class Entry:
    name: str                 # aten.add.Tensor
    fn: Callable
    needs: tuple              # Tape methods (or "nn.<fn>") the entry requires
    doc: str                  # how it is recorded (docs/torch.md)


ATEN: dict[str, Entry] = {}


def register(table: dict, *names, needs=(), doc=""):
    """A decorator putting ``fn`` into ``table`` (:data:`ATEN`, ``COMPLEX``) as the entry
    of each op in ``names``; an op mapped twice is a ValueError at import."""
    def add(fn):
        for name in names:
            if name in table:
                raise ValueError(f"{name} is mapped twice")
            table[name] = Entry(name, fn, tuple(needs), doc)
        return fn
    return add


def aten(*names, needs=(), doc=""):
    """Register ``fn`` as the entry of each ATen op in ``names`` (one entry per overload;
    several names only where the overloads compute the same thing)."""
    return register(ATEN, *names, needs=needs, doc=doc)


def missing_needs(entry: Entry) -> list:
    """The Tape methods (or nn functions) this build lacks for ``entry``."""
    out = []
    for need in entry.needs:
        if need.startswith("nn."):
            if not hasattr(nn, need[3:]):
                out.append(f"gradtool.{need}")
        elif not hasattr(Tape, need):
            out.append(f"Tape.{need}")
    return out


def has(method: str) -> bool:
    """Whether this build's Tape has ``method``."""
    return hasattr(Tape, method)


def is_num(x) -> bool:
    """A Python number (not a bool): an operand recorded as a scalar attribute."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)
