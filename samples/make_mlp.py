"""Record samples/mlp_regression.msgpack and its training data samples/mlp_regression.npz.

An MLP regression episode on one batch of 32 rows:

    pred = tanh(x @ W1 + b1) @ W2 + b2      x [32,4] -> 16 hidden -> [32,1]
    loss = mean((pred - y)^2)

The biases broadcast ([16] over [32,16], [1] over [32,1]); the weights carry
l2 = 1e-4 (the optimizers' default weight decay for them), the biases none.
"x" and "y" are named consts: the input slots `gradtool train` refills per
minibatch from the npz (arrays "x" [512,4] and "y" [512,1]: a smooth
rational function of x plus uniform noise, fixed seed).  The tape holds the
first 32 rows.  Only the PCG64 stream's uniform doubles, IEEE arithmetic and
gradtool's libm-free numerics are used, so the bytes are the same on every
machine.

Usage: python samples/make_mlp.py [OUTDIR]   (default: next to this script)
Re-running reproduces both files byte for byte.
"""

import math
import sys
from pathlib import Path

import numpy as np

from gradtool.npzio import write_npz
from gradtool.tape import Tape
from gradtool.tapefile import save

FILENAME = "mlp_regression.msgpack"
DATA_FILENAME = "mlp_regression.npz"
SEED = 20240611
ROWS, BATCH, N_IN, N_HIDDEN = 512, 32, 4, 16


def uniform(rng, shape, lo, hi):
    return lo + (hi - lo) * rng.random(shape)


def dataset(rng):
    x = uniform(rng, (ROWS, N_IN), -2.0, 2.0)
    x0, x1, x2, x3 = (x[:, k:k + 1] for k in range(N_IN))
    # Only + - * /, each correctly rounded: the data never changes with a libm.
    smooth = 1.5 * x0 / (1.0 + x0 * x0) + 0.3 * x1 * x2 - 0.25 * x3 * x3 + 0.2 * x3
    y = smooth + uniform(rng, (ROWS, 1), -0.05, 0.05)
    return x, y


def record(rng, x, y):
    lim1 = math.sqrt(6.0 / (N_IN + N_HIDDEN))          # Glorot-uniform bounds
    lim2 = math.sqrt(6.0 / (N_HIDDEN + 1))
    tp = Tape()
    w1 = tp.param(uniform(rng, (N_IN, N_HIDDEN), -lim1, lim1), name="W1", l2=1e-4)
    b1 = tp.param(uniform(rng, (N_HIDDEN,), -0.1, 0.1), name="b1")
    w2 = tp.param(uniform(rng, (N_HIDDEN, 1), -lim2, lim2), name="W2", l2=1e-4)
    b2 = tp.param(uniform(rng, (1,), -0.1, 0.1), name="b2")
    xs = tp.const(x[:BATCH], name="x")
    ys = tp.const(y[:BATCH], name="y")
    hidden = tp.tanh(xs @ w1 + b1)
    pred = hidden @ w2 + b2
    loss = tp.mse(pred, ys)
    return tp, loss, {"pred": pred}


def main(outdir) -> Path:
    rng = np.random.default_rng(SEED)
    x, y = dataset(rng)
    tp, loss, outputs = record(rng, x, y)
    outdir = Path(outdir)
    write_npz(outdir / DATA_FILENAME, {"x": x, "y": y})
    dest = outdir / FILENAME
    save(tp, dest, loss=loss, outputs=outputs, values=True,
         meta={"producer": "gradtool samples/make_mlp.py",
               "description": "MLP regression 4-16-1 (tanh), batch 32, mse loss; "
                              "training data in mlp_regression.npz",
               "data": DATA_FILENAME})
    return dest


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent))
