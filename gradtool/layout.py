"""Layout composites and multi-axis reductions, by their old path: ``gradtool.layout``.

The functions live in :mod:`gradtool.composites`: the copies (expand ... pad) in
``composites.layout``, the reductions and running scans in ``composites.reductions``, sort
and topk in ``composites.sorting``.  Each ``fn(tp, ...)`` is also a
:class:`~gradtool.tape.Tape` method of its name (``METHODS``, installed by tape.py), so
``tp.cat(...)`` and ``gradtool.layout.cat(tp, ...)`` are the same call.
"""

from __future__ import annotations

from .composites.layout import (  # noqa: F401 (re-exported)
    cat, expand, flatten, flip, index_add, index_select, narrow, pad, repeat_interleave,
    reshape_to, select, split, squeeze, stack, swapaxes, unsqueeze)
from .composites.methods import (  # noqa: F401 (re-exported)
    METHODS, reduction_method)
from .composites.reductions import (  # noqa: F401 (re-exported)
    amin, cummax, cummin, cumprod, cumsum, logcumsumexp, prod, reduce_axes, std, variance)
from .composites.sorting import (  # noqa: F401 (re-exported)
    PAIRWISE_LIMIT, sort, topk)

__all__ = ["METHODS", "reduction_method"]
