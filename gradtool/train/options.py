"""What a training run is asked to do: options, meta["train"] defaults, their precedence.

Every setting comes from, in order: the caller's :class:`TrainOptions`; the
saved optimizer state of a file written by ``--save``; the tape file's
``meta["train"]`` (keys :data:`META_KEYS`, validated here); :data:`DEFAULTS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ..errors import GradtoolError
from ..fileio import NUL_IN_NAME, check_regular_destination, check_writable
from ..device.backends import choices as backends_choices
from ..optim_state import KINDS, LEGACY_KINDS, STATE_VERSION

# the default optimizer is the seed's Adam: a tape that names none trains as it always did
DEFAULTS = {"optimizer": "adam-seed", "lr": 1e-3, "epochs": 1, "steps": None, "clip": 0.0,
            "seed": 0, "shuffle": True, "val_split": None, "val": None, "accuracy": None,
            "shards": 1}
# "optimizer_version": 2 says meta's "optimizer" is a table name; without it the name is
# read as before the optimizer table ("adam" is "adam-seed": LEGACY_KINDS)
META_KEYS = tuple(DEFAULTS) + ("optimizer_version",)


class TrainError(GradtoolError):
    """Training cannot start: bad options, meta or saved state (exit 2)."""


@dataclass
class TrainOptions:
    """What the caller asked for; None means "not given" (saved state, meta or default)."""

    optimizer: Optional[str] = None
    lr: Optional[float] = None
    epochs: Optional[int] = None
    steps: Optional[int] = None
    clip: Optional[float] = None
    l2: Optional[float] = None
    seed: Optional[int] = None
    shuffle: Optional[bool] = None
    val_split: Optional[float] = None
    val: Optional[str] = None
    accuracy: Optional[str] = None
    save: Optional[str] = None
    every: Optional[int] = None
    log: Optional[str] = None
    backend: str = "cpu"
    fuse: bool = False            # device backends: fused kernels (gradtool.device.fusion)
    plot: Optional[str] = None
    shards: Optional[int] = None      # S shards per minibatch (gradtool.train.distributed)
    max_memory: Optional[int] = None  # bytes (gradtool.budget); None: the default budget
    hparams: Optional[dict] = None    # the optimizer's hyperparameters given (table names)
    schedule: Optional[dict] = None   # gradtool.optim.Schedule fields given


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


_CHECKS = {
    "optimizer": (lambda x: x in KINDS, " or ".join(map(repr, KINDS))),
    "optimizer_version": (lambda x: x == STATE_VERSION, f"{STATE_VERSION}"),
    "lr": (lambda x: _is_num(x) and x >= 0, "a number >= 0"),
    "epochs": (lambda x: _is_int(x) and x >= 1, "an integer >= 1"),
    "steps": (lambda x: _is_int(x) and x >= 1, "an integer >= 1"),
    "clip": (lambda x: _is_num(x) and x >= 0, "a number >= 0"),
    "l2": (lambda x: _is_num(x) and x >= 0, "a number >= 0"),
    "seed": (lambda x: _is_int(x) and x >= 0, "an integer >= 0"),
    "shuffle": (lambda x: isinstance(x, bool), "true or false"),
    "val_split": (lambda x: _is_num(x) and 0 < x < 1, "a fraction between 0 and 1"),
    "val": (lambda x: isinstance(x, str) and x and "\0" not in x,
            "a file name (non-empty, without NUL bytes)"),
    "accuracy": (lambda x: isinstance(x, str) and x, "'OUTPUT:TARGET'"),
    "every": (lambda x: _is_int(x) and x >= 1, "an integer >= 1"),
    "shards": (lambda x: _is_int(x) and x >= 1, "an integer >= 1"),
}


def _check(key, value, label):
    ok, want = _CHECKS[key]
    if value is not None and not ok(value):
        raise TrainError(f"{label} must be {want}, got {value!r}")


def meta_defaults(meta: dict, source: str) -> dict:
    """``meta["train"]``, validated (unknown keys and bad values are errors)."""
    train = (meta or {}).get("train")
    if train is None:
        return {}
    if not isinstance(train, dict):
        raise TrainError(f"{source}: meta 'train' must be a map, got {type(train).__name__}")
    for key, value in train.items():
        if key not in META_KEYS:
            raise TrainError(f"{source}: meta 'train' has unknown key {key!r} "
                             f"(known: {', '.join(META_KEYS)})")
        _check(key, value, f"{source}: meta 'train' key {key!r}")
    if train.get("val") is not None and train.get("val_split") is not None:
        raise TrainError(f"{source}: meta 'train' sets both 'val' and 'val_split'")
    train = dict(train)
    if "optimizer" in train and "optimizer_version" not in train:
        name = train["optimizer"]
        if name not in LEGACY_KINDS:
            raise TrainError(f"{source}: meta 'train' key 'optimizer' {name!r} needs "
                             f"'optimizer_version': {STATE_VERSION} (without it the names "
                             f"are {', '.join(LEGACY_KINDS)}, and 'adam' is 'adam-seed')")
        train["optimizer"] = LEGACY_KINDS[name]
    train.pop("optimizer_version", None)
    return train


def check_options(options: TrainOptions, outputs: bool = True) -> None:
    """Reject bad or conflicting options before anything is loaded.  ``outputs=False``
    (a data-parallel rank other than 0, which writes nothing) skips checking that the
    output files can be written."""
    for key in _CHECKS:
        _check(key, getattr(options, key, None), "--" + key.replace("_", "-"))
    if options.every is not None and not options.save:
        raise TrainError("--every needs --save (the file checkpoints are written to)")
    if options.val is not None and options.val_split is not None:
        raise TrainError("give --val or --val-split, not both")
    if options.fuse and options.backend == "cpu":
        *first, last = backends_choices()
        raise TrainError(f"--fuse needs a device backend (--backend {', '.join(first)} or {last})")
    written = (("--save", options.save), ("--plot", options.plot), ("--log", options.log))
    for flag, path in written:
        if path is not None and "\0" in path:
            raise TrainError(f"{flag} {path!r}: {NUL_IN_NAME}")
    for flag, path in written if outputs else ():
        # fail now, not after the training the file was meant to keep
        if path is not None:
            if flag != "--log":       # a log may be a stream; a checkpoint or plot may not
                check_regular_destination(path, flag)
            try:
                check_writable(path)
            except OSError as exc:
                raise TrainError(f"{flag} {path}: {exc.strerror}") from None


class Precedence:
    """``pick(key)``: the option, else the saved value, else meta["train"], else the default."""

    def __init__(self, options: TrainOptions, meta: dict):
        self.options, self.meta = options, meta

    def pick(self, key, saved_value=None):
        for value in (getattr(self.options, key), saved_value, self.meta.get(key)):
            if value is not None:
                return value
        return DEFAULTS[key]


def position_int(position: dict, key: str, source: str, minimum: int = 0) -> int:
    value = position.get(key, minimum)
    if not _is_int(value) or value < minimum:
        raise TrainError(f"{source}: optimizer 'position' {key!r} must be an integer "
                         f">= {minimum}, got {value!r}")
    return value
