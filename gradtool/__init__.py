"""gradtool: reverse-mode autodiff whose gradients are identical to the bit everywhere.

    import gradtool as gt
    tp = gt.Tape()
    w = tp.param(np.ones((3, 1)), name="w")
    x = tp.const(np.arange(6.0).reshape(2, 3), name="x")
    loss = tp.mean((x @ w) * (x @ w))
    tp.backward(loss)
    tp.grad(w)
"""

from .errors import GradtoolError, ShapeError, TapeError, TapeFileError
from .gradcheck import FDReport, ParamCheck, fd_check
from .ops import OPS, OP_NAMES
from .tape import GVar, Node, Tape
from .tapefile import TapeFile, load
from . import nn

__version__ = "0.1.0"

__all__ = [
    "Tape", "GVar", "Node", "TapeFile", "load", "OPS", "OP_NAMES", "fd_check", "FDReport", "ParamCheck",
    "GradtoolError", "ShapeError", "TapeError", "TapeFileError", "nn", "__version__",
]
