"""A saved optimizer state and training position, checked field by field before a run
continues from it.

``gradtool train --save`` writes, under the tape file's ``optimizer`` key::

    {"version": 2,                   # absent in files written before the optimizer table
     "kind": "sgd" | "adam" | "adamw" | "adam-seed",   # without version: "sgd" | "adam",
                                     # and that "adam" is "adam-seed" (legacy_kind)
     "lr": >= 0 (the base lr), "clip": >= 0, "t": steps taken,
     "b1t": beta1 multiplied t times, "b2t": beta2 multiplied t times,  # 1.0 for sgd
     "hparams": {name: value}        # the table entry's hyperparameters (version 2)
     "schedule": {"kind", "warmup", "t_max", "eta_min", "step_size", "gamma"},  # (v2)
     "b1": 0.9, "b2": 0.999, "eps": 1e-8,           # adam-seed only; optional
     "params": [{"id": param node, "l2": >= 0, <slot>: bytes, ...}, ...],
     "position": {"epoch", "step", "global_step", "target_epoch", "examples": ints >= 0,
                  "batch", "shards": ints >= 1, "seed": int >= 0, "shuffle": bool}}

Every field is checked here, so that a state no run could have written (``b2t``
above 1, ``b1t`` that is not ``0.9**t`` as a running product, a NaN or negative
seed, a negative or NaN second moment, a beta outside [0, 1)) is one clear error
before training, not a ZeroDivisionError or a domain error steps later.  The library's
``Optimizer.load_state_dict`` runs the same checks (with ``source`` None).  The bias powers are running
products (see :mod:`gradtool.optim`), so they are a function of ``t`` and are
compared with it to the bit.  What depends on the tape (param ids, moment lengths)
is checked by :func:`gradtool.optim.optimizer_from_state`; what depends on the
data (the examples an unfinished epoch was counting) by the trainer.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .errors import GradtoolError, OptimizerError  # noqa: F401 (re-exported)
from .optim.table import running_power  # noqa: F401 (re-exported)

# Adam's constants and the optimizer kinds: here, with the saved state that records them
# (gradtool.optim, which steps with them, imports them from here)
B1 = 0.9
B2 = 0.999
EPS = 1e-8

# the table's names (gradtool.optim.table; test_optim checks the two agree): written here so
# that the state checks import nothing heavier
KINDS = ("sgd", "adam", "adamw", "adam-seed")
LEGACY_KINDS = {"sgd": "sgd", "adam": "adam-seed"}
STATE_VERSION = 2          # "version" of a state this gradtool writes; absent: version 1


POSITION_INTS = {"epoch": 0, "step": 0, "global_step": 0, "target_epoch": 0, "examples": 0,
                 "batch": 1, "shards": 1}


def legacy_kind(state: dict):
    """The table name a saved state means: a version-2 state's ``kind``; a state without
    ``version`` (written before the optimizer table) names ``sgd`` or ``adam``, and its
    ``adam`` is the seed's variant, ``adam-seed``."""
    kind = state.get("kind")
    if "version" not in state:
        return LEGACY_KINDS.get(kind, kind) if isinstance(kind, str) else kind
    return kind


TOP_KEYS = {"version", "kind", "lr", "clip", "t", "b1t", "b2t", "hparams", "schedule",
            "params", "position", "b1", "b2", "eps"}
REQUIRED = ("kind", "lr", "clip", "t", "b1t", "b2t", "params")


def check_saved_state(state, source: str) -> dict:
    """Validate a saved optimizer map; return its training position (a map, maybe empty).

    Raises OptimizerError naming the file (``source``; None for a state handed to
    ``load_state_dict``) and the field.
    """
    head = "optimizer state" if source is None else f"{source}: saved optimizer state"

    def bad(field: str, problem: str) -> OptimizerError:
        return OptimizerError(f"{head}: '{field}' {problem}")

    if not isinstance(state, dict):
        raise OptimizerError(f"{head} is {type(state).__name__}, not a map")
    version = state.get("version", 1)
    if "version" in state and (not _is_int(version) or version != STATE_VERSION):
        raise bad("version", f"is {version!r}; this gradtool reads 1 (no field) and "
                             f"{STATE_VERSION}")
    kind = legacy_kind(state)
    if kind not in (KINDS if "version" in state else LEGACY_KINDS.values()):
        known = KINDS if "version" in state else tuple(LEGACY_KINDS)
        raise bad("kind", f"is {state.get('kind')!r}; expected one of {', '.join(known)}")
    unknown = sorted(set(state) - TOP_KEYS, key=str)
    if unknown:
        raise bad(str(unknown[0]), f"is not a field of an optimizer state (known: "
                                   f"{', '.join(sorted(TOP_KEYS))})")
    for key in REQUIRED:
        if key not in state:
            raise bad(key, "is missing")
    if version == 1 and ("hparams" in state or "schedule" in state):
        raise bad("hparams" if "hparams" in state else "schedule",
                  "needs a version-2 state (this one has no 'version')")
    from .optim import table
    from .optim.schedule import Schedule
    entry = table.get(kind)
    try:
        hp = entry.hparams(state.get("hparams"), "")
        Schedule.from_dict(state.get("schedule"))
    except OptimizerError as exc:
        raise bad("hparams" if "hparams" in str(exc) or kind in str(exc) else "schedule",
                  f"is refused: {exc}") from None
    for key in ("lr", "clip"):
        _number(state, key, bad)
    t = state.get("t")
    if not _is_int(t) or t < 0:
        raise bad("t", f"must be an integer >= 0, got {t!r}")
    _check_constants(state, kind, bad)
    for key, power in zip(("b1t", "b2t"), entry.powers or (None, None)):
        value = _number(state, key, bad, minimum=None)
        base = hp[power] if power else None
        want = running_power(base, t) if power else 1.0
        if value != want or math.copysign(1.0, value) != math.copysign(1.0, want):
            how = (f"{base} multiplied {t} times" if power
                   else f"1.0 ({kind} has no bias correction)")
            raise bad(key, f"is {value!r}, but after t={t} steps it is {want!r} ({how}); "
                           f"the state is not one a run wrote")
    slots = entry.slot_names(hp)
    others = set(entry.all_slots()) | {"m", "v", "vmax", "buf"}
    params = state.get("params")
    if not isinstance(params, list):
        raise bad("params", f"must be a list, got {type(params).__name__}")
    seen = set()
    for k, item in enumerate(params):
        where = f"params[{k}]"
        if not isinstance(item, dict):
            raise bad(where, f"must be a map, got {type(item).__name__}")
        node = item.get("id")
        if not _is_int(node) or node < 0:
            raise bad(f"{where}.id", f"must be a node id (an integer >= 0), got {node!r}")
        if node in seen:
            raise bad(f"{where}.id", f"repeats param node {node}")
        seen.add(node)
        _number(item, "l2", lambda field, problem: bad(f"{where}.{field}", problem))
        for key in item:
            if key in ("id", "l2") or key in slots:
                continue
            if key in others:
                if kind == "sgd" and key in ("m", "v"):
                    raise bad(f"{where}.{key}", "is an adam moment, but the state is sgd")
                raise bad(f"{where}.{key}", f"is not a slot of {kind} with these "
                                            f"hyperparameters (slots: {', '.join(slots) or 'none'})")
            raise bad(f"{where}.{key}", "is not a field of a param's state")
        for key in slots:
            data = item.get(key)
            if not isinstance(data, bytes) or len(data) % 8:
                raise bad(f"{where}.{key}", "must be little-endian float64 bytes")
        for key in slots:
            values = np.frombuffer(item[key], dtype="<f8")
            finite = np.isfinite(values)
            if not finite.all():
                raise bad(f"{where}.{key}", f"holds a non-finite moment "
                                            f"({float(values[np.argmin(finite)])!r})")
        for key in ("v", "vmax"):
            if key not in slots:
                continue
            v = np.frombuffer(item[key], dtype="<f8")
            if (v < 0).any():
                raise bad(f"{where}.{key}", f"holds a negative second moment "
                                            f"({float(v[np.argmax(v < 0)])!r}); v is a running "
                                            f"mean of squares")
    return _check_position(state.get("position"), bad)


CONSTANTS = (("b1", B1, "[0, 1)"), ("b2", B2, "[0, 1)"), ("eps", EPS, "> 0"))


def _check_constants(state: dict, kind: str, bad) -> None:
    """Adam's betas and eps, where the state names them: in range, and the values this
    Adam uses (they are fixed, so a state with others cannot continue bit for bit)."""
    for key, want, where in CONSTANTS:
        if key not in state:
            continue
        if kind != "adam-seed":
            raise bad(key, f"is an adam constant, but the state is {kind}")
        value = _number(state, key, bad, minimum=None)
        inside = 0.0 < value if key == "eps" else 0.0 <= value < 1.0
        if not inside:
            raise bad(key, f"must be in {where}, got {value!r}")
        if value != want:
            raise bad(key, f"is {value!r}; gradtool's Adam uses {want!r}")


def _check_position(position, bad) -> dict:
    if position is None:
        return {}
    if not isinstance(position, dict):
        raise bad("position", f"must be a map, got {type(position).__name__}")
    for key, least in POSITION_INTS.items():
        if key in position:
            value = position[key]
            if not _is_int(value) or value < least:
                raise bad(f"position.{key}", f"must be an integer >= {least}, got {value!r}")
    seed = position.get("seed")
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise bad("position.seed", f"must be an integer >= 0, got {seed!r}")
    shuffle = position.get("shuffle")
    if shuffle is not None and not isinstance(shuffle, bool):
        raise bad("position.shuffle", f"must be true or false, got {shuffle!r}")
    total, step = position.get("global_step", 0), position.get("step", 0)
    if total < step:
        raise bad("position.global_step", f"is {total}, fewer than the {step} steps of the "
                                          f"current epoch")
    return position


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _number(state: dict, key: str, bad, minimum=0.0) -> float:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise bad(key, f"must be a number, got {value!r}")
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        raise bad(key, f"must be finite{' and >= 0' if minimum is not None else ''}, "
                       f"got {value!r}")
    return value


__all__ = ["check_saved_state", "running_power", "legacy_kind", "OptimizerError", "B1", "B2",
           "EPS", "KINDS", "LEGACY_KINDS", "STATE_VERSION"]
