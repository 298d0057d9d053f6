"""Record the autoencoder benchmark: a 6-64-32-64-6 ReLU autoencoder and its data.

    python samples/autoencoder/make_autoencoder.py [OUTDIR]   # default: next to this script

writes ``ae.msgpack`` (the tape) and ``ae_data.npz`` (the training data).
Re-running reproduces both files byte for byte on any machine.

The data: 1,200 points of a noisy 2-D manifold embedded in 6-D.  A latent
point (u, v) is uniform in [-1, 1]^2 and its six coordinates are polynomials
and rational functions of it, so the surface is curved in every direction
an autoencoder with a 2-D-ish bottleneck has to learn:

    x0 = u                      x3 = 2uv / (1 + v^2)
    x1 = v                      x4 = u^2 - v^2
    x2 = (1 - u^2) / (1 + u^2)  x5 = v^3 - uv

plus independent noise on every coordinate, 0.05 * (r1 + r2 + r3 - 1.5)
with r uniform in [0, 1) (a sum of three uniforms: bell-shaped, standard
deviation 0.025).  Only numpy's PCG64 uniform doubles (exact 53-bit values)
and + - * /, each correctly rounded, make these numbers: no libm call, so
the bytes never change with the platform.

The tape: one minibatch of 200 rows, ``x`` the input slot (a named const):

    h1  = relu(x  @ W1 + b1)          [200, 64]
    h2  = relu(h1 @ W2 + b2)          [200, 32]   (output "code")
    h3  = relu(h2 @ W3 + b3)          [200, 64]
    out = h3 @ W4 + b4                [200, 6]    (output "reconstruction", linear)
    loss = mean((out - x)^2)

Weights are uniform: He bounds sqrt(6 / fan_in) for the ReLU layers, LeCun
sqrt(3 / fan_in) for the linear output layer (math.sqrt is correctly rounded
by IEEE 754; Generator.uniform is ``low + (high - low) * u``); biases are
zero, [1, n], broadcast over the batch.  No L2.

``meta["train"]`` holds the benchmark's schedule (docs/training.md): Adam,
lr 0.003, 60 epochs, no shuffle.  1,200 examples at batch 200 are 6 steps
per epoch, so ``gradtool train`` runs the 360 episodes of
``scripts/bench_ae.py`` in file order.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

from gradtool.npzio import write_npz
from gradtool.tape import Tape
from gradtool.tapefile import save

TAPE_FILE = "ae.msgpack"
DATA_FILE = "ae_data.npz"
SEED = 20240612
EXAMPLES = 1200
BATCH = 200
LAYERS = (6, 64, 32, 64, 6)          # input, hidden (relu) x 3, output (linear)
BOTTLENECK = 1                       # the layer (0-based) whose output is the 32-wide code
NOISE = 0.05
TRAIN_DEFAULTS = {"optimizer": "adam", "lr": 0.003, "epochs": 60, "shuffle": False}


def manifold(rng) -> np.ndarray:
    """[EXAMPLES, 6]: the embedded surface plus bell-shaped noise (see the module doc)."""
    latent = rng.uniform(-1.0, 1.0, size=(EXAMPLES, 2))
    u, v = latent[:, 0], latent[:, 1]
    uu, vv, uv = u * u, v * v, u * v
    clean = np.stack([u, v,
                      (1.0 - uu) / (1.0 + uu),
                      (2.0 * uv) / (1.0 + vv),
                      uu - vv,
                      vv * v - uv], axis=1)
    r = rng.random((3, EXAMPLES, 6))
    noise = NOISE * (((r[0] + r[1]) + r[2]) - 1.5)
    return clean + noise


def init_params(rng) -> list:
    """[(W, b)] per layer: He-uniform for the relu layers, LeCun-uniform for the output."""
    params = []
    last = len(LAYERS) - 2
    for k, (fan_in, fan_out) in enumerate(zip(LAYERS[:-1], LAYERS[1:])):
        bound = math.sqrt((3.0 if k == last else 6.0) / fan_in)
        params.append((rng.uniform(-bound, bound, size=(fan_in, fan_out)),
                       np.zeros((1, fan_out))))
    return params


def record(x: np.ndarray, params: list):
    """The tape on the first BATCH rows; returns (tape, loss, outputs)."""
    tp = Tape()
    xs = tp.const(x[:BATCH], name="x")
    h = xs
    outputs = {}
    last = len(params) - 1
    for k, (w, b) in enumerate(params):
        wk = tp.param(w, name=f"W{k + 1}")
        bk = tp.param(b, name=f"b{k + 1}")
        h = h @ wk + bk
        if k < last:
            h = tp.relu(h)
        if k == BOTTLENECK:
            outputs["code"] = h                          # relu(h1 @ W2 + b2), 32 wide
    outputs["reconstruction"] = h
    loss = tp.mse(h, xs)
    return tp, loss, outputs


def meta() -> dict:
    return {
        "producer": "samples/autoencoder/make_autoencoder.py",
        "description": "6-64-32-64-6 ReLU autoencoder (linear output), batch 200, MSE "
                       "reconstruction of a noisy 2-D manifold in 6-D; data in ae_data.npz",
        "data": DATA_FILE,
        "config": {"layers": list(LAYERS), "batch": BATCH, "examples": EXAMPLES,
                   "noise": NOISE, "seed": SEED},
        "train": dict(TRAIN_DEFAULTS),
    }


def main(out_dir) -> tuple:
    rng = np.random.default_rng(SEED)
    x = manifold(rng)
    params = init_params(rng)
    tp, loss, outputs = record(x, params)
    tape_path = os.path.join(out_dir, TAPE_FILE)
    data_path = os.path.join(out_dir, DATA_FILE)
    save(tp, tape_path, loss=loss, outputs=outputs, meta=meta())
    write_npz(data_path, {"x": x})
    return tape_path, data_path


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for path in main(out):
        print(path)
