"""gradtool: reverse-mode autodiff whose gradients are identical to the bit everywhere.

    import gradtool as gt
    tp = gt.Tape()
    w = tp.param(np.ones((3, 1)), name="w")
    x = tp.const(np.arange(6.0).reshape(2, 3), name="x")
    loss = tp.mean((x @ w) * (x @ w))
    tp.backward(loss)
    tp.grad(w)

The names below are imported on first use (PEP 562), so that ``import gradtool``
itself is instant: the command line's entry point (:mod:`gradtool.__main__`) relies
on that to answer Ctrl-C during start-up with one line instead of a traceback.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "GradtoolError": "errors", "ShapeError": "errors", "TapeError": "errors",
    "TapeFileError": "errors",
    "FDReport": "gradcheck", "ParamCheck": "gradcheck", "fd_check": "gradcheck",
    "OPS": "ops", "OP_NAMES": "ops", "RNG_NAME": "ops",
    "GVar": "tape", "Node": "tape", "Tape": "tape",
    "TapeFile": "tapefile", "load": "tapefile", "save": "tapefile",
}

__all__ = [
    "Tape", "GVar", "Node", "TapeFile", "load", "save", "OPS", "OP_NAMES", "RNG_NAME", "fd_check",
    "FDReport", "ParamCheck",
    "GradtoolError", "ShapeError", "TapeError", "TapeFileError", "nn", "__version__",
]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        try:                              # a submodule not imported yet: gradtool.optim
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
