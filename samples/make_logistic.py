"""Record samples/logistic.msgpack: one example's logistic-regression loss, all scalars.

Every node has shape [1], so the tape can be emitted as scalar C/CUDA code
(`gradtool emit-cuda`).  Params w0, w1, b come first (registration order is
the emitter's parameter order), then the input slots x0, x1 (features) and
y (label):

    z = w0*x0 + w1*x1 + b;  p = sigmoid(z)
    loss = -(y*log(p) + (1-y)*log(1-p))

Usage: python samples/make_logistic.py [OUTDIR]   (default: next to this script)
Re-running reproduces the file byte for byte.
"""

import sys
from pathlib import Path

from gradtool.tape import Tape
from gradtool.tapefile import save

FILENAME = "logistic.msgpack"


def record():
    tp = Tape()
    w0 = tp.param([0.75], name="w0")
    w1 = tp.param([-0.5], name="w1")
    b = tp.param([0.125], name="b")
    x0 = tp.const([1.5], name="x0")
    x1 = tp.const([-2.0], name="x1")
    y = tp.const([1.0], name="y")
    z = w0 * x0 + w1 * x1 + b
    p = tp.sigmoid(z)
    loss = -(y * tp.log(p) + (1.0 - y) * tp.log(1.0 - p))
    return tp, loss, {"z": z, "p": p}


def main(outdir) -> Path:
    tp, loss, outputs = record()
    dest = Path(outdir) / FILENAME
    save(tp, dest, loss=loss, outputs=outputs, values=True,
         meta={"producer": "gradtool samples/make_logistic.py",
               "description": "per-example logistic-regression loss; every node has shape [1]"})
    return dest


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent))
