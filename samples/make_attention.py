"""Record samples/attention.msgpack: a small two-head self-attention block.

Sequence length 6, model width 8, 2 heads of width 4, a residual connection
and a mean-squared loss against a target:

    qkv = x @ Wqkv                         [6,24]   (matmul)
    q, k, v = column slices of qkv          [6,8]   (slice)
    Q = concat(reshape(q[:, :4], [1,6,4]), reshape(q[:, 4:], [1,6,4]))  [2,6,4]
        (same for K, V: heads split with slice + reshape + concat)
    att = softmax(bmm(Q, transpose(K)) * 0.5, axis=2)   [2,6,6]  (scale 1/sqrt(4))
    o = bmm(att, V)                          [2,6,4]
    merged = concat(reshape(o[0], [6,4]), reshape(o[1], [6,4]), axis=1)  [6,8]
    out = x + (merged @ Wo + bo)             [6,8]
    loss = mean((out - target)^2)

Usage: python samples/make_attention.py [OUTDIR]   (default: next to this script)
Re-running reproduces the file byte for byte.
"""

import sys
from pathlib import Path

import numpy as np

from gradtool.tape import Tape
from gradtool.tapefile import save

FILENAME = "attention.msgpack"
SEED = 7
T, D, HEADS = 6, 8, 2
DH = D // HEADS


def uniform(rng, shape, lo, hi):
    return lo + (hi - lo) * rng.random(shape)


def split_heads(tp, m):
    """[T, D] -> [HEADS, T, DH] using slice, reshape and concat."""
    heads = [tp.reshape(tp.slice(m, [0, h * DH], [T, (h + 1) * DH]), [1, T, DH])
             for h in range(HEADS)]
    out = heads[0]
    for h in heads[1:]:
        out = tp.concat(out, h, axis=0)
    return out


def merge_heads(tp, m):
    """[HEADS, T, DH] -> [T, D]."""
    parts = [tp.reshape(tp.slice(m, [h, 0, 0], [h + 1, T, DH]), [T, DH]) for h in range(HEADS)]
    out = parts[0]
    for p in parts[1:]:
        out = tp.concat(out, p, axis=1)
    return out


def record():
    rng = np.random.default_rng(SEED)
    tp = Tape()
    wqkv = tp.param(uniform(rng, (D, 3 * D), -0.5, 0.5), name="Wqkv", l2=1e-4)
    wo = tp.param(uniform(rng, (D, D), -0.5, 0.5), name="Wo", l2=1e-4)
    bo = tp.param(uniform(rng, (D,), -0.1, 0.1), name="bo")
    x = tp.const(uniform(rng, (T, D), -1.0, 1.0), name="x")
    target = tp.const(uniform(rng, (T, D), -1.0, 1.0), name="target")
    qkv = x @ wqkv
    q, k, v = (tp.slice(qkv, [0, j * D], [T, (j + 1) * D]) for j in range(3))
    qh, kh, vh = split_heads(tp, q), split_heads(tp, k), split_heads(tp, v)
    scores = tp.muls(tp.bmm(qh, tp.transpose(kh)), 0.5)     # 1/sqrt(DH), exact
    att = tp.softmax(scores, axis=2)
    merged = merge_heads(tp, tp.bmm(att, vh))
    out = x + (merged @ wo + bo)
    loss = tp.mse(out, target)
    return tp, loss, {"attention": att, "out": out}


def main(outdir) -> Path:
    tp, loss, outputs = record()
    dest = Path(outdir) / FILENAME
    save(tp, dest, loss=loss, outputs=outputs, values=True,
         meta={"producer": "gradtool samples/make_attention.py",
               "description": "two-head self-attention block (T=6, D=8) with residual, "
                              "mse loss against a target"})
    return dest


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent))
