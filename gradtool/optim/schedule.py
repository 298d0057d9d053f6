"""Learning-rate schedules with torch.optim.lr_scheduler's semantics, libm-free.

The learning rate of the optimizer's step ``t`` (1-based) is ``lr(base, k)`` with
``k = t - 1`` steps taken before it (torch's ``last_epoch`` after ``k`` calls of
``scheduler.step()``).  Every formula is a few IEEE operations of Python floats and
gradtool's fdlibm ``cos`` (never the platform's libm), so every machine computes the
same bits, and a resumed run (``t`` restored from the saved state) continues the same
sequence to the bit:

* warmup ``N`` (any schedule): for ``k < N``, ``base * k / N`` (torch's ``LinearLR``
  closed form with start factor 0 and end factor 1, as ``LambdaLR(lambda k: k / N)``);
  from ``k = N`` on, the schedule below at ``k - N`` (torch's ``SequentialLR`` with the
  milestone N).
* ``none``: ``base``.
* ``cosine`` (``t_max``, ``eta_min``): ``eta_min + (base - eta_min) * (1 + cos(pi * k /
  t_max)) / 2`` (the closed form of ``CosineAnnealingLR``; torch updates it step to
  step, so the two agree within 1e-12, not bit for bit; past ``t_max`` the cosine goes
  on, as torch's closed form does).
* ``step`` (``step_size``, ``gamma``): ``base * gamma^(k // step_size)``.
* ``exponential`` (``gamma``): ``base * gamma^k``.

``gamma^n`` is a running product (``gamma`` multiplied into 1.0 n times, one rounding
each; :func:`gradtool.optim_state.running_power`), never ``pow``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .. import fdlibm
from ..errors import OptimizerError

KINDS = ("none", "cosine", "step", "exponential")
FIELDS = ("kind", "warmup", "t_max", "eta_min", "step_size", "gamma")


@dataclass
class Schedule:
    kind: str = "none"
    warmup: int = 0
    t_max: int = 1
    eta_min: float = 0.0
    step_size: int = 1
    gamma: float = 0.1

    def __post_init__(self):

        def bad(field, want):
            return OptimizerError(f"lr schedule {field!r} must be {want}, "
                                  f"got {getattr(self, field)!r}")
        if self.kind not in KINDS:
            raise bad("kind", f"one of {', '.join(KINDS)}")
        for name, least in (("warmup", 0), ("t_max", 1), ("step_size", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < least:
                raise bad(name, f"an integer >= {least}")
            setattr(self, name, int(v))
        for name in ("eta_min", "gamma"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(
                    float(v)) or float(v) < 0.0:
                raise bad(name, "a finite number >= 0")
            setattr(self, name, float(v))
        self._power = (0, 1.0)          # the last (n, gamma^n) computed

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in FIELDS}

    @classmethod
    def from_dict(cls, d) -> "Schedule":
        """A saved schedule (None or absent in files older than schedules: ``none``)."""
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise OptimizerError(f"lr schedule must be a map, got {type(d).__name__}")
        unknown = sorted(set(d) - set(FIELDS))
        if unknown:
            raise OptimizerError(f"lr schedule has unknown keys {unknown} (known: "
                                 f"{', '.join(FIELDS)})")
        return cls(**d)

    def _gamma_power(self, n: int) -> float:
        last, value = self._power
        if n < last:
            last, value = 0, 1.0
        while last < n:
            following = value * self.gamma
            last += 1
            if following == value:          # a fixed point: every further power is this
                last = n
                break
            value = following
        self._power = (n, value)
        return value

    def lr(self, base: float, k: int) -> float:
        """The learning rate after ``k`` steps (the lr of step ``k + 1``)."""
        base = float(base)
        if k < self.warmup:
            return base * k / self.warmup
        k -= self.warmup
        if self.kind == "none":
            return base
        if self.kind == "cosine":
            c = float(fdlibm.cos(np.array([math.pi * k / self.t_max]))[0])
            return self.eta_min + (base - self.eta_min) * (1.0 + c) / 2.0
        if self.kind == "step":
            return base * self._gamma_power(k // self.step_size)
        return base * self._gamma_power(k)


__all__ = ["Schedule", "KINDS"]
