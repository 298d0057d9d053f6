"""Record samples/digits_cnn/digits_cnn_torch.msgpack: the digits CNN written in torch.nn,
recorded through the importer (gradtool.interop.torch; needs torch); and
digits_cnn_bn_torch.msgpack, the same with batch norm.

    python samples/digits_cnn/make_digits_cnn_torch.py     # rewrites both tapes (same bytes)

The module (torch's default init under torch.manual_seed(SEED)) returns its loss and
its logits; the importer names the logits output ``output1`` and the input slots x and
y after forward's arguments, so ``gradtool train`` reads samples/digits.npz directly:

    x [32, 64] * 0.0625 -> [32, 1, 8, 8]
    Conv2d(1, 8, 3, padding=1), ReLU, MaxPool2d(2)
    Conv2d(8, 16, 3, padding=1), ReLU, MaxPool2d(2)
    Conv2d(16, 10, 2) -> flatten: the logits (a linear layer over the 64 features)
    loss = -(y * log_softmax(logits)).sum(1).mean()

(The last layer is a 2x2 convolution rather than nn.Linear so that the recording
needs only the importer and the conv ops, not the layout ops a Linear's weight
transpose records through.)

The batch-norm variant (``batch_norm=True``) puts a BatchNorm2d, in train mode, after
each of the two feature convolutions (which then have no bias: batch norm's shift
takes its place).  The importer records its running statistics and
num_batches_tracked as state (docs/training.md, "Training state").
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

SEED = 20261202
BATCH = 32
TRAIN_DEFAULTS = {"optimizer": "adam", "lr": 0.01, "epochs": 15, "seed": 0,
                  "accuracy": "output1:y"}


def build(batch_norm: bool = False):
    import torch

    def block(c_in, c_out):
        if not batch_norm:
            return [torch.nn.Conv2d(c_in, c_out, 3, padding=1), torch.nn.ReLU(),
                    torch.nn.MaxPool2d(2)]
        return [torch.nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                torch.nn.BatchNorm2d(c_out), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]

    class DigitsCNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.features = torch.nn.Sequential(*block(1, 8), *block(8, 16))
            self.classifier = torch.nn.Conv2d(16, 10, 2)

        def forward(self, x, y):
            h = self.features((x * 0.0625).reshape(-1, 1, 8, 8))
            logits = self.classifier(h).flatten(1)
            loss = -(y * torch.log_softmax(logits, dim=1)).sum(1).mean()
            return loss, logits

    torch.manual_seed(SEED)
    return DigitsCNN().double()


def record(arrays, batch_norm: bool = False):
    import torch

    from gradtool.interop.torch import import_module
    model = build(batch_norm)
    x = torch.tensor(arrays["x"][:BATCH].astype(np.float64))
    y = torch.tensor(arrays["y"][:BATCH].astype(np.float64))
    return model, import_module(model, (x, y))


def main():
    with np.load(os.path.join(ROOT, "samples", "digits.npz")) as data:
        arrays = {k: data[k] for k in ("x", "y")}
    for name, batch_norm in (("digits_cnn_torch.msgpack", False),
                             ("digits_cnn_bn_torch.msgpack", True)):
        _, result = record(arrays, batch_norm)
        result.save(os.path.join(HERE, name), meta=META[batch_norm])
        print(f"{name}: {len(result.tape)} nodes")


META = {False: {"description": "8x8 digits CNN written in torch.nn, recorded through "
                               "gradtool.interop.torch", "train": TRAIN_DEFAULTS},
        True: {"description": "8x8 digits CNN with batch norm written in torch.nn, "
                              "recorded through gradtool.interop.torch (its running "
                              "statistics are training state)", "train": TRAIN_DEFAULTS}}


if __name__ == "__main__":
    main()
