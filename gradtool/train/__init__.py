"""Training: the loop, data, options, reports, engines and data-parallel shards, one package.

    from gradtool.train import Trainer, TrainOptions, train
    result = train(gradtool.load("model.msgpack"), "data.npz", TrainOptions(epochs=3))

Modules, along the data flow: :mod:`~gradtool.train.options` (settings and their
precedence), :mod:`~gradtool.train.data` (slots and datasets from .npz),
:mod:`~gradtool.train.engines` (cpu / device engines),
:mod:`~gradtool.train.distributed` (shards and MPI ranks),
:mod:`~gradtool.train.report` (results, logs, plots) and
:mod:`~gradtool.train.loop` (the Trainer).  ``docs/training.md`` describes it for
users.
"""

from .engines import CpuEngine, make_engine
from .loop import StopFlag, Trainer, train
from .options import DEFAULTS, META_KEYS, TrainError, TrainOptions
from .report import Reporter, TrainResult, plot_losses, require_plotting

__all__ = ["CpuEngine", "make_engine", "Trainer", "train", "StopFlag", "TrainOptions",
           "TrainResult", "TrainError", "Reporter", "DEFAULTS", "META_KEYS", "plot_losses",
           "require_plotting"]
