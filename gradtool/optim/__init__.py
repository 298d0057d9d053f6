"""Optimizers as one table (:mod:`gradtool.optim.table`): torch's SGD, Adam and AdamW
by torch's own formulas, the seed's Adam (``adam-seed``), learning-rate schedules
(:mod:`gradtool.optim.schedule`), the global-norm clip and per-parameter L2.

Training-loop use (:mod:`gradtool.optim.core` documents the step's exact order)::

    opt = gradtool.optim.AdamW(1e-3, weight_decay=0.01)
    for p in tape.params():
        opt.add(tape, p)            # l2 defaults to the param node's `l2`
    opt.set_clip(1.0)               # optional
    tape.backward(loss)
    opt.step(tape)                  # updates the tape's live parameter values in place

The numpy-level API, per parameter (what a ``torch.optim.Optimizer`` subclass calls;
bit-identical to the training loop's update of a param with that gradient, no clip and
l2 0)::

    entry = gradtool.optim.table.get("adamw")
    hp = {"weight_decay": 0.01}            # the rest: the entry's defaults
    state = entry.init_state(w, hp)        # {slot: zeros of w's shape}
    for t in range(1, steps + 1):
        entry.step(w, g, state, hp, t, lr) # w and state in place; t is 1-based

Names: ``sgd`` (``SGD``), ``adam`` (``Adam``, torch's formula), ``adamw`` (``AdamW``),
``adam-seed`` (``AdamSeed``: the seed's eps-hat Adam; a file written before the table
that says ``adam`` means this one).
"""

import importlib

from ..errors import OptimizerError
from . import table

_COMPILED = [True]      # tests set [False] to run the numpy sequence instead of the compiled one

# the rest on first use (PEP 562): gradtool.optim_state imports the table, and core imports
# gradtool.optim_state, so importing this package must not import core
_LAZY = {"SGD": "core", "Adam": "core", "AdamW": "core", "AdamSeed": "core", "Optimizer": "core",
         "Entry": "core", "CLASSES": "core", "make_optimizer": "core",
         "optimizer_from_state": "core", "advance_adam": "core", "global_norm": "core",
         "clip_scale": "core", "Schedule": "schedule",
         "B1": "..optim_state", "B2": "..optim_state", "EPS": "..optim_state",
         "KINDS": "..optim_state"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module, __name__) if module.startswith(".")
                   else importlib.import_module(f"{__name__}.{module}"), name)

__all__ = ["SGD", "Adam", "AdamW", "AdamSeed", "Optimizer", "Entry", "OptimizerError",
           "Schedule", "make_optimizer", "optimizer_from_state", "advance_adam", "table",
           "global_norm", "clip_scale",
           "B1", "B2", "EPS", "KINDS", "CLASSES"]
