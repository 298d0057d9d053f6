"""Building blocks of models, recorded from the op table's ops: ``gradtool.nn``.

The functions live in :mod:`gradtool.composites`, one module per family (dense, norms,
losses, random, conv, pool, resample); this module keeps their old import path, so
``from gradtool import nn`` and ``nn.conv2d(...)`` work as they always have.  Each
records its computation on the tape of its first argument as ordinary nodes (no node
type of its own); ``tests/test_nn.py`` compares every function with PyTorch float64.

    import gradtool as gt
    from gradtool import nn
    tp = gt.Tape()
    x = tp.const(batch, name="x")                     # [N, 16]
    ids = tp.const(labels[:, None], name="y", dtype="i64")   # [N, 1]
    h = nn.gelu(nn.linear(x, tp.param(w1), tp.param(b1)))
    loss = nn.softmax_cross_entropy(nn.linear(h, tp.param(w2)), ids)
"""

from __future__ import annotations

from .composites.conv import (  # noqa: F401 (re-exported)
    conv1d, conv2d, conv3d, conv_transpose1d, conv_transpose2d, conv_transpose3d)
from .composites.dense import (  # noqa: F401 (re-exported)
    GELU_C, GELU_K, SQRT1_2, gelu, linear, silu)
from .composites.losses import (  # noqa: F401 (re-exported)
    mse, softmax_cross_entropy)
from .composites.norms import (  # noqa: F401 (re-exported)
    batch_norm2d, batch_norm2d_train, group_norm, layer_norm, native_layer_norm, rms_norm)
from .composites.pool import (  # noqa: F401 (re-exported)
    adaptive_avg_pool2d, adaptive_avg_pool3d, adaptive_max_pool2d, adaptive_max_pool3d,
    avg_pool2d, avg_pool3d, global_avg_pool2d, max_pool2d, max_pool3d)
from .composites.random import (  # noqa: F401 (re-exported)
    ALPHA_SELU, TWO_PI, alpha_dropout, bernoulli, dropout, feature_dropout, multinomial,
    normal, rand, randint, randperm, rng_slot)
from .composites.resample import (  # noqa: F401 (re-exported)
    grid_sample, upsample_bilinear2d)

__all__ = ["linear", "rms_norm", "layer_norm", "native_layer_norm", "silu", "gelu",
           "softmax_cross_entropy", "mse", "conv2d", "conv1d", "max_pool2d", "avg_pool2d",
           "global_avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d",
           "upsample_bilinear2d", "conv_transpose2d", "conv_transpose1d", "conv3d",
           "conv_transpose3d", "grid_sample", "feature_dropout", "alpha_dropout", "bernoulli",
           "normal", "rand", "randint", "randperm", "multinomial",
           "max_pool3d", "avg_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool3d",
           "group_norm", "batch_norm2d", "batch_norm2d_train", "rng_slot", "dropout"]
