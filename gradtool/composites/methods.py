"""The Tape methods the composites give: ``METHODS`` maps a method name to the composite
``fn(tp, ...)`` it calls (the layout, reduction and sorting families'), and
:func:`~gradtool.composites.reductions.reduction_method` makes ``sum``/``mean``/``max``
take a tuple of axes.  ``tape.py`` installs them on :class:`~gradtool.tape.Tape`."""

from __future__ import annotations

from . import layout, reductions, sorting
from .reductions import reduction_method

__all__ = ["METHODS", "reduction_method"]

METHODS = {**layout.METHODS, **reductions.METHODS, **sorting.METHODS}
