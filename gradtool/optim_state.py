"""A saved optimizer state and training position, checked field by field before a run
continues from it.

``gradtool train --save`` writes, under the tape file's ``optimizer`` key::

    {"kind": "adam" | "sgd", "lr": >= 0, "clip": >= 0, "t": steps taken,
     "b1t": B1 multiplied t times, "b2t": B2 multiplied t times,    # 1.0 for sgd
     "b1": 0.9, "b2": 0.999, "eps": 1e-8,           # adam only; optional (older files)
     "params": [{"id": param node, "l2": >= 0, "m": bytes, "v": bytes}, ...],
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

from .errors import GradtoolError

# Adam's constants and the optimizer kinds: here, with the saved state that records them
# (gradtool.optim, which steps with them, imports them from here)
B1 = 0.9
B2 = 0.999
EPS = 1e-8

KINDS = ("sgd", "adam")


class OptimizerError(GradtoolError):
    """A bad optimizer setting, registration or saved state."""


POSITION_INTS = {"epoch": 0, "step": 0, "global_step": 0, "target_epoch": 0, "examples": 0,
                 "batch": 1, "shards": 1}


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
    kind = state.get("kind")
    if kind not in KINDS:
        raise bad("kind", f"is {kind!r}; expected one of {', '.join(KINDS)}")
    for key in ("lr", "clip"):
        _number(state, key, bad)
    t = state.get("t")
    if not _is_int(t) or t < 0:
        raise bad("t", f"must be an integer >= 0, got {t!r}")
    _check_constants(state, kind, bad)
    for key, base in (("b1t", B1), ("b2t", B2)):
        value = _number(state, key, bad, minimum=None)
        want = running_power(base, t) if kind == "adam" else 1.0
        if value != want or math.copysign(1.0, value) != math.copysign(1.0, want):
            how = (f"{base} multiplied {t} times" if kind == "adam"
                   else "1.0 (sgd has no bias correction)")
            raise bad(key, f"is {value!r}, but after t={t} steps it is {want!r} ({how}); "
                           f"the state is not one a run wrote")
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
        if kind == "adam":
            for key in ("m", "v"):
                data = item.get(key)
                if not isinstance(data, bytes) or len(data) % 8:
                    raise bad(f"{where}.{key}", "must be little-endian float64 bytes")
            for key in ("m", "v"):
                moment = np.frombuffer(item[key], dtype="<f8")
                finite = np.isfinite(moment)
                if not finite.all():
                    raise bad(f"{where}.{key}", f"holds a non-finite moment "
                                                f"({float(moment[np.argmin(finite)])!r})")
            v = np.frombuffer(item["v"], dtype="<f8")
            if (v < 0).any():
                raise bad(f"{where}.v", f"holds a negative second moment "
                                        f"({float(v[np.argmax(v < 0)])!r}); v is a running "
                                        f"mean of squares")
        elif "m" in item or "v" in item:
            raise bad(f"{where}.{'m' if 'm' in item else 'v'}", "is an adam moment, but the "
                                                               "state is sgd")
    return _check_position(state.get("position"), bad)


CONSTANTS = (("b1", B1, "[0, 1)"), ("b2", B2, "[0, 1)"), ("eps", EPS, "> 0"))


def _check_constants(state: dict, kind: str, bad) -> None:
    """Adam's betas and eps, where the state names them: in range, and the values this
    Adam uses (they are fixed, so a state with others cannot continue bit for bit)."""
    for key, want, where in CONSTANTS:
        if key not in state:
            continue
        if kind != "adam":
            raise bad(key, "is an adam constant, but the state is sgd")
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


def running_power(base: float, t: int) -> float:
    """``base`` multiplied into 1.0 ``t`` times, one rounding each (as Adam keeps it).
    The product reaches a fixed point (a subnormal that times the base rounds back to
    itself) after about 7,000 steps of 0.9 and 740,000 of 0.999, so the loop ends there
    for any t."""
    value = 1.0
    for _ in range(t):
        following = value * base
        if following == value:
            break
        value = following
    return value


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


__all__ = ["check_saved_state", "running_power", "OptimizerError", "B1", "B2", "EPS", "KINDS"]
