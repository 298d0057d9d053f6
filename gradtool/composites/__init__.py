"""Composites: what is recorded from the op table's ops, usable from ``gt.Tape`` alone.

Each function records its computation on a tape as ordinary nodes (no node type of its
own), so everything a tape does -- save, load, backward, fd-check, device replay -- works
on them unchanged, and the exact sequence of roundings is the sequence of recorded ops
each docstring spells out.  None needs torch; the importer (``gradtool.interop``) records
torch's modules through them.

Two calling conventions, as before the move:

- the building blocks of models take :class:`~gradtool.tape.GVar` handles and record on
  their first argument's tape (``conv.conv2d(x, w, b)``); weights are params or consts the
  caller records (``tp.param(...)``), numbers are Python floats.  ``gradtool.nn`` re-exports
  them all under their old names;
- the layout, reduction and sorting composites take the tape first (``layout.cat(tp, xs)``)
  and are also Tape methods (``tp.cat(xs)``, :mod:`.methods`); ``gradtool.layout``
  re-exports them.

One module per family (docs/library.md, "Composites"):

    dense        linear, silu, gelu
    norms        rms_norm, layer_norm, native_layer_norm, group_norm, batch_norm2d(_train)
    losses       softmax_cross_entropy, mse
    random       rng_slot, dropout (feature, alpha), bernoulli, normal, rand, randint,
                 randperm, multinomial: the counter-based draws
    conv         conv1d/2d/3d, conv_transpose1d/2d/3d
    pool         max/avg pools (2-d, 3-d), global and adaptive pools
    resample     grid_sample, upsample_bilinear2d
    layout       expand ... pad, index_select, index_add, flip, spread
    reductions   multi-axis sum/mean/max, variance, std, amin, prod, the cumulative scans
    sorting      sort, topk
    math         sinh, cosh, asinh, acosh, atanh, hypot, tan, exp2, log2, log10 (the
                 importer's elementwise math torch has and the op table lacks)
    distances    cdist, pdist

    import gradtool as gt
    from gradtool.composites import dense, losses
    tp = gt.Tape()
    x = tp.const(batch, name="x")                     # [N, 16]
    ids = tp.const(labels[:, None], name="y", dtype="i64")   # [N, 1]
    h = dense.gelu(dense.linear(x, tp.param(w1), tp.param(b1)))
    loss = losses.softmax_cross_entropy(dense.linear(h, tp.param(w2)), ids)
"""

from . import conv  # noqa: F401
from . import dense  # noqa: F401
from . import distances  # noqa: F401
from . import layout  # noqa: F401
from . import losses  # noqa: F401
from . import math  # noqa: F401
from . import methods  # noqa: F401
from . import norms  # noqa: F401
from . import pool  # noqa: F401
from . import random  # noqa: F401
from . import reductions  # noqa: F401
from . import resample  # noqa: F401
from . import sorting  # noqa: F401
