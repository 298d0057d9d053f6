"""Record samples/digits_cnn/digits_cnn.msgpack: a small CNN for samples/digits.npz.

    python samples/digits_cnn/make_digits_cnn.py      # rewrites the tape (same bytes)

The network, for minibatches of 32 of the shipped 8x8 one-channel digits (the
``x`` rows of digits.npz are 64 grey levels 0..16, reshaped to [32, 1, 8, 8]):

    pixels = reshape(x * 0.0625, [32, 1, 8, 8])            (/ 16: exact)
    h1     = max_pool2d(relu(conv2d(pixels, K1, pad 1) + c1), 2)    [32, 8, 4, 4]
    h2     = max_pool2d(relu(conv2d(h1, K2, pad 1) + c2), 2)        [32, 16, 2, 2]
    logits = reshape(h2, [32, 64]) @ W + b                  (output "logits")
    loss   = -mean(sum(y * log_softmax(logits, axis=1), axis=1))

K1 [8, 1, 3, 3], K2 [16, 8, 3, 3] and W [64, 10] are He-uniform (numpy's uniform
doubles and + - * / only, so the bytes are the same on any machine); the conv
biases start at 0.01 (a blank 8x8 region then sits on no ReLU kink, so fd-check
is smooth there), b at zero; W carries L2 1e-4.  meta["train"] holds what ``gradtool train`` uses.
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from gradtool import nn                     # noqa: E402
from gradtool.tape import Tape              # noqa: E402
from gradtool.tapefile import save          # noqa: E402

SEED = 20261202
BATCH = 32
TRAIN_DEFAULTS = {"optimizer": "adam", "lr": 0.01, "epochs": 15, "seed": 0,
                  "accuracy": "logits:y"}


def he_uniform(rng, shape, fan_in):
    """uniform in [-sqrt(6 / fan_in), sqrt(6 / fan_in))."""
    bound = np.sqrt(6.0 / fan_in)
    return (rng.uniform(0.0, 1.0, shape) * 2.0 - 1.0) * bound


def record_cnn(arrays, dtype="f64"):
    """The CNN in ``dtype``: "f64", or "f32" (every leaf float32: the same draws rounded
    to float32 once)."""
    rng = np.random.default_rng(SEED)
    tp = Tape()
    x = tp.const(arrays["x"][:BATCH].astype(np.float64), name="x", dtype=dtype)
    y = tp.const(arrays["y"][:BATCH].astype(np.float64), name="y", dtype=dtype)
    k1 = tp.param(he_uniform(rng, (8, 1, 3, 3), 9), name="K1", dtype=dtype)
    c1 = tp.param(np.full(8, 0.01), name="c1", dtype=dtype)
    k2 = tp.param(he_uniform(rng, (16, 8, 3, 3), 72), name="K2", dtype=dtype)
    c2 = tp.param(np.full(16, 0.01), name="c2", dtype=dtype)
    w = tp.param(he_uniform(rng, (64, 10), 64), name="W", l2=1e-4, dtype=dtype)
    b = tp.param(np.zeros((1, 10)), name="b", dtype=dtype)
    pixels = tp.reshape(x * 0.0625, [BATCH, 1, 8, 8])
    h1 = nn.max_pool2d(tp.relu(nn.conv2d(pixels, k1, c1, padding=1)), 2)
    h2 = nn.max_pool2d(tp.relu(nn.conv2d(h1, k2, c2, padding=1)), 2)
    logits = tp.reshape(h2, [BATCH, 64]) @ w + b
    picked = tp.sum(y * tp.log_softmax(logits, axis=1), axis=1)
    loss = -tp.mean(picked)
    meta = {"description": ("8x8 digits CNN (samples/digits.npz): conv 8@3x3, pool, conv "
                            "16@3x3, pool, linear; mean cross-entropy"
                            + ("; float32 (f32 leaves)" if dtype == "f32" else "")),
            "train": TRAIN_DEFAULTS}
    return tp, loss, {"logits": logits}, meta


def main():
    with np.load(os.path.join(ROOT, "samples", "digits.npz")) as data:
        arrays = {k: data[k] for k in ("x", "y")}
    tp, loss, outputs, meta = record_cnn(arrays)
    save(tp, os.path.join(HERE, "digits_cnn.msgpack"), loss=loss, outputs=outputs, meta=meta)
    tp32, loss32, outputs32, meta32 = record_cnn(arrays, "f32")
    save(tp32, os.path.join(HERE, "digits_cnn_f32.msgpack"), loss=loss32, outputs=outputs32,
         meta=meta32)
    print(f"digits_cnn.msgpack: {len(tp)} nodes, loss {float(tp.value(loss)[0]):.6f}")


if __name__ == "__main__":
    main()
