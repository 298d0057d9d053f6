"""Build samples/digits.npz and record samples/digits_mlp.msgpack.

    pip install scikit-learn        # only to run this script; gradtool does not need it
    python samples/make_digits.py

The data is the UCI "Optical Recognition of Handwritten Digits" test set as
shipped inside scikit-learn (``sklearn.datasets.load_digits``: 1,797 8x8
images, 16 grey levels, CC BY 4.0; see samples/DIGITS_LICENSE.md).  Both
outputs are byte-for-byte reproducible: fixed seeds, the reproducible npz
writer, and the tape file's fixed key order.

digits.npz
    x [1477,64], y [1477,10]            training images (grey levels 0..16) and one-hot
                                        labels, stored as uint8 (the loader makes float64)
    x_val [320,64], y_val [320,10]      validation: 32 images of every digit
The validation images are drawn per class with a seeded permutation; the
training rows are the rest, in a seeded random order.

digits_mlp.msgpack
    A 64-64-10 MLP classifier for minibatches of 32:
        h      = relu((x * 0.0625) @ W1 + b1)
        logits = h @ W2 + b2                 (output "logits")
        p      = softmax(logits, axis=1)     (output "probs")
        loss   = -mean(log((y * p) @ ones[10,1]))
    i.e. the mean negative log-likelihood of the true class.  W1 and W2 carry
    L2 1e-4, the biases none; meta["train"] holds the defaults
    ``gradtool train`` uses (docs/training.md).
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from gradtool.npzio import write_npz        # noqa: E402
from gradtool.tape import Tape              # noqa: E402
from gradtool.tapefile import save          # noqa: E402

SEED = 20240607
VAL_PER_CLASS = 32
BATCH = 32
HIDDEN = 64
TRAIN_DEFAULTS = {"optimizer": "adam", "lr": 0.005, "epochs": 20, "seed": 0,
                  "accuracy": "logits:y"}


def build_arrays():
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = digits.data.astype(np.uint8)            # grey levels 0..16; the tape scales them
    labels = digits.target.astype(np.int64)
    rng = np.random.default_rng(SEED)
    order = rng.permutation(len(labels))
    val_rows = np.concatenate([order[labels[order] == c][:VAL_PER_CLASS] for c in range(10)])
    val_rows = rng.permutation(val_rows)
    in_val = np.zeros(len(labels), dtype=bool)
    in_val[val_rows] = True
    train_rows = order[~in_val[order]]
    eye = np.eye(10, dtype=np.uint8)
    return {"x": x[train_rows], "y": eye[labels[train_rows]],
            "x_val": x[val_rows], "y_val": eye[labels[val_rows]]}


def record_mlp(arrays, dtype="f64"):
    """The MLP in ``dtype``: "f64", or "f32" (every leaf float32: the same draws rounded
    to float32 once; the pixels and one-hot labels exact)."""
    rng = np.random.default_rng(SEED + 1)
    tp = Tape()
    x = tp.const(arrays["x"][:BATCH], name="x", dtype=dtype)
    y = tp.const(arrays["y"][:BATCH], name="y", dtype=dtype)
    w1 = tp.param(rng.standard_normal((64, HIDDEN)) * np.sqrt(2.0 / 64), name="W1", l2=1e-4,
                  dtype=dtype)
    b1 = tp.param(np.zeros((1, HIDDEN)), name="b1", dtype=dtype)
    w2 = tp.param(rng.standard_normal((HIDDEN, 10)) * np.sqrt(1.0 / HIDDEN), name="W2", l2=1e-4,
                  dtype=dtype)
    b2 = tp.param(np.zeros((1, 10)), name="b2", dtype=dtype)
    pixels = x * 0.0625                                # / 16, exact: a power of two
    h = tp.relu(pixels @ w1 + b1)
    logits = h @ w2 + b2
    p = tp.softmax(logits, axis=1)
    p_true = (y * p) @ tp.const(np.ones((10, 1)), dtype=dtype)   # the true class's probability
    loss = -tp.mean(tp.log(p_true))
    meta = {"description": ("64-64-10 MLP classifier for the 8x8 digits "
                            "(samples/digits.npz); mean negative log-likelihood"
                            + ("; float32 (f32 leaves)" if dtype == "f32" else "")),
            "train": TRAIN_DEFAULTS}
    return tp, loss, {"logits": logits, "probs": p}, meta


def main():
    arrays = build_arrays()
    write_npz(os.path.join(HERE, "digits.npz"), arrays)
    tp, loss, outputs, meta = record_mlp(arrays)
    save(tp, os.path.join(HERE, "digits_mlp.msgpack"), loss=loss, outputs=outputs, meta=meta)
    tp32, loss32, outputs32, meta32 = record_mlp(arrays, "f32")
    save(tp32, os.path.join(HERE, "digits_mlp_f32.msgpack"), loss=loss32, outputs=outputs32,
         meta=meta32)
    print(f"digits.npz: {len(arrays['x'])} training, {len(arrays['x_val'])} validation images; "
          f"digits_mlp.msgpack: {len(tp)} nodes, loss {float(tp.value(loss)[0]):.6f}")


if __name__ == "__main__":
    main()
