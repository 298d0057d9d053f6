"""``gtt.optim``: ``torch.optim.Optimizer`` subclasses whose step is gradtool's optimizer
table (:mod:`gradtool.optim.table`), for a training loop of one's own::

    import gradtool.interop.torch as gtt
    gm = gtt.wrap(model, (x, y), loss_fn=F.cross_entropy)
    opt = gtt.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    for x, y in loader:
        loss = gm(x, y); loss.backward()
        gtt.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); opt.zero_grad(); sched.step()

They are torch optimizers in every way a loop sees: ``param_groups`` (each group its own
``lr``, ``weight_decay``, betas ..., as people exclude biases and norms from decay),
``state`` and ``state_dict``/``load_state_dict``, ``zero_grad``, and torch's LR
schedulers drive them by writing ``group["lr"]``.  Only the update differs: each
parameter steps in place by the table entry's per-element rule
(:meth:`gradtool.optim.table.Entry.apply`), with the bias corrections kept as running
products, so a step gives the bits ``gradtool train`` gives for the same parameter,
gradient, step count and learning rate (``tests/test_wrap_optim.py`` trains the digits
both ways and compares bytes).

Differences from torch's own classes, each deliberate:

* the step count ``t`` is per parameter, as torch keeps it (``state[p]["step"]``);
  ``gradtool train`` keeps one count for all, the same whenever every parameter has a
  gradient at every step;
* parameters must be CPU tensors of float64 or float32, contiguous; the update runs on a
  numpy view of ``p.data`` and ``p.grad`` (no copies), in the parameter's dtype: one
  pass over a group whose params, gradients and state each lie in one run of memory (a
  host wrapper's do; the state made for a group's first step is laid out so), param by
  param otherwise, the same bits either way (the rule is per element);
* torch's ``foreach``, ``fused``, ``capturable`` and ``differentiable`` options do not
  exist here (one update rule, on the CPU); passing them is a ``GradtoolError``;
* ``load_state_dict`` refuses a state whose keys are not this entry's slots (plus
  ``step``), whose shapes differ from the parameter's, or whose values are not finite,
  before anything changes.
"""

from __future__ import annotations

import ctypes
import importlib
import itertools
import math
import operator

import numpy as np
import torch

from ..errors import OptimizerError
from ..optim import table as _table
from ..optim.core import Update as _Update
from ..optim.core import _pack_values
from ..optim.core import compiled_library as _library_of

_OPTIM_PACKAGE = importlib.import_module("gradtool.optim")

__all__ = ["SGD", "Adam", "AdamW", "AdamSeed", "Optimizer"]

_UNSUPPORTED = ("foreach", "fused", "capturable", "differentiable")


def _compiled() -> bool:
    return _OPTIM_PACKAGE._COMPILED[0]


def _library(dtype):
    return _library_of(np.float32 if dtype is torch.float32 else np.float64)


_profiling = torch._C._autograd._profiler_enabled
_OPTIM = importlib.import_module("torch.optim.optimizer")


def _step_hooks(opt) -> bool:
    """Whether any optimizer step hook is registered, on ``opt`` or for every optimizer."""
    return bool(opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks
                or _OPTIM._global_optimizer_pre_hooks or _OPTIM._global_optimizer_post_hooks)


class Optimizer(torch.optim.Optimizer):
    """The shared part: a ``torch.optim.Optimizer`` stepping by table entry ``kind``."""

    kind = ""

    def __init__(self, params, defaults: dict, extra: dict):
        bad = sorted(k for k in extra if k in _UNSUPPORTED)
        if bad:
            raise OptimizerError(f"gtt.optim.{type(self).__name__}: {', '.join(bad)} "
                                 "is torch's kernel choice; gradtool has one update rule")
        if extra:
            raise OptimizerError(f"gtt.optim.{type(self).__name__} has no option "
                                 f"{', '.join(map(repr, sorted(extra)))}")
        self.entry = _table.get(self.kind)
        super().__init__(params, defaults)
        for group in self.param_groups:
            self._hparams(group)          # every group's values checked now, not at step 1

    # ── torch keyword names <-> the table's ───────────────────────────────
    def _hparams(self, group: dict) -> dict:
        """The entry's hyperparameters for ``group`` (checked by the table's ranges)."""
        hp = {}
        for h in self.entry.hypers:
            if h.name in ("beta1", "beta2"):
                betas = group.get("betas")
                if not isinstance(betas, (tuple, list)) or len(betas) != 2:
                    raise OptimizerError(f"gtt.optim.{type(self).__name__}: betas must be "
                                         f"a pair, got {betas!r}")
                hp[h.name] = float(betas[0 if h.name == "beta1" else 1])
            elif h.name in group:
                hp[h.name] = group[h.name]
        return self.entry.hparams(hp, f"gtt.optim.{type(self).__name__}: ")

    @staticmethod
    def _lr(group: dict) -> float:
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            lr = lr.item()
        lr = float(lr)
        if not math.isfinite(lr) or lr < 0.0:
            raise OptimizerError(f"learning rate must be finite and >= 0, got {lr!r}")
        return lr

    @staticmethod
    def _view(t: torch.Tensor, gi: int, pi: int, grad: bool = False) -> np.ndarray:
        """A numpy view of ``t`` (param ``pi`` of group ``gi``, or its ``.grad``)."""
        if (t.dtype is torch.float32 or t.dtype is torch.float64) and t.device.type == "cpu" \
                and t.is_contiguous():
            return t.numpy()
        what = f"param {pi} of group {gi}" + ("'s .grad" if grad else "")
        if t.device.type != "cpu" or t.dtype not in (torch.float64, torch.float32):
            raise OptimizerError(f"gtt.optim steps CPU float64 or float32 tensors; {what} "
                                 f"is {t.dtype} on {t.device}")
        raise OptimizerError(f"gtt.optim steps contiguous tensors; {what} is not")

    # ── the step ──────────────────────────────────────────────────────────
    def _rule(self, group: dict):
        """(hyperparameters, :class:`gradtool.optim.core.Update`) of ``group``: checked
        and built once per distinct set of values (a scheduler changes ``lr`` only)."""
        # each group's values (all but params and lr) at its last step, compared first:
        # no repr a step while they stay
        lasts = self.__dict__.setdefault("_last_rules", {})
        values = [(k, tuple(v) if type(v) is list else v) for k, v in group.items()
                  if k != "params" and k != "lr"]
        last = lasts.get(id(group))
        if last is not None and last[0] is group and last[1] == values:
            return last[2]
        key = tuple((k, repr(v)) for k, v in values)
        cache = self.__dict__.setdefault("_rules", {})
        found = cache.get(key)
        if found is None:
            hp = self._hparams(group)
            found = cache[key] = (hp, _Update(self.entry, hp))
        if len(lasts) > 64:
            lasts.clear()
        lasts[id(group)] = (group, values, found)
        return found

    def _power(self, base: float, t: int) -> float:
        """``running_power(base, t)``, advanced by one multiplication from the last step's
        value where it can be (the bits are those of the loop in running_power)."""
        memo = self.__dict__.setdefault("_powers", {})
        last = memo.get(base)
        if last is not None and last[0] == t:
            return last[1]
        if last is not None and last[0] == t - 1:
            following = last[1] * base
            value = last[1] if following == last[1] else following
        else:
            value = _table.running_power(base, t)
        memo[base] = (t, value)
        return value

    def step(self, closure=None):
        """One update of every param that has a gradient.  torch's ``step``: its step
        pre- and post-hooks run, and a running profiler records it, as torch's wrapper
        does (:meth:`torch.optim.Optimizer.profile_hook_step`); with neither, the
        update runs without that wrapper (its record call alone is ~7 us a step)."""
        if _profiling() or _step_hooks(self):
            return _HOOKED_STEP(self, closure)
        return self._step(closure)
    step.hooked = True        # (torch's marker: then it does not wrap this step itself)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's (every ``.grad`` set to None, or zeroed with ``set_to_none=False``),
        without its profiler record while no profiler runs."""
        if not set_to_none or _profiling():
            return super().zero_grad(set_to_none)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad = None

    def _step(self, closure=None):
        # (no torch.no_grad() around it: the update writes numpy views, which autograd
        # does not see; only the closure runs torch, under enable_grad as in torch's)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group in enumerate(self.param_groups):
            hp, update = self._rule(group)
            lr = self._lr(group)
            params = group["params"]
            grads = list(map(_GRAD, params))
            if any(map(operator.is_, grads, itertools.repeat(None))):
                active = [p for p, g in zip(params, grads) if g is not None]
                grads = [g for g in grads if g is not None]
            else:
                active = params
            if not self._step_all(active, grads, hp, update, lr):
                self._step_each(gi, group, hp, update, lr)
        return loss

    def _state(self, p, update) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = 0
            for s in update.slots:
                state[s] = torch.zeros_like(p.data, memory_format=torch.contiguous_format)
        return state

    def _corrections(self, hp: dict, t: int) -> tuple:
        """(beta1**t, beta2**t) as the bias corrections keep them (1.0, 1.0 for an entry
        without them)."""
        powers = self.entry.powers
        if not powers:
            return 1.0, 1.0
        return self._power(hp[powers[0]], t), self._power(hp[powers[1]], t)

    def _scalars(self, hp: dict, lr: float, t: int) -> dict:
        return self.entry.scalars(hp, lr, t, *self._corrections(hp, t))

    def _packed(self, hp: dict, lr: float, t: int):
        """:meth:`_scalars` packed for the compiled step (``Update.pack``'s array),
        without the map between."""
        return _pack_values(self.entry.scalar_values(hp, lr, t, *self._corrections(hp, t)))

    def _step_all(self, active: list, grads: list, hp: dict, update, lr: float) -> bool:
        """The group's params in one compiled call (``gt_opt_table_steps_py``) where they
        allow it: CPU tensors of one float dtype, contiguous, every one at the same step
        count (as they are when each has had a gradient at every step), the compiled
        library present; False, with nothing changed, where they do not."""
        if not active:
            return True
        dtype = active[0].dtype
        if dtype is not torch.float32 and dtype is not torch.float64:
            return False
        lib = _library(dtype) if _compiled() else None
        if lib is None or lib.py_opt_table_steps is None:
            return False
        plan = self._plan(active, update)
        if plan is None:
            return False
        states, ws, slots, _ = plan
        t = states[0]["step"]
        if list(map(_STEP, states)).count(t) != len(states):
            return False
        flat = self._flat(plan, grads)
        if flat is not None:                      # all of them as one run of elements
            ws, gs, slots = flat
        else:
            try:
                gs = [g.numpy() for g in grads]
            except (TypeError, RuntimeError):    # a CUDA gradient, ...
                return False
        t = int(t) + 1
        packed = self._packed(hp, lr, t)
        if lib.py_opt_table_steps(update.variant, ws, gs, *slots, packed):
            return False                          # one not as it wants: nothing written
        for st in states:
            st["step"] = t
        return True

    def _plan(self, active: list, update):
        """(states, numpy views of the params, of their slots, the runs :meth:`_flat`
        uses or None) for ``active``, made once
        and kept while the same params, with the same memory (``data_ptr``), the same
        state dicts and the same rule step; None where a param is not a CPU tensor
        numpy can view (the one-by-one path then names it)."""
        plans = self.__dict__.setdefault("_plans", {})
        # (the plan holds the params themselves, so an id in its key is still theirs)
        key = (tuple(map(id, active)), update.variant)
        ptrs = list(map(_DATA_PTR, active))
        plan = plans.get(key)
        if plan is not None and plan[0] == ptrs and plan[1] is self.state:
            return plan[3]
        if all(not self.state[p] for p in active):
            self._fresh_states(active, update)
        states = [self._state(p, update) for p in active]
        try:
            ws = [p.detach().numpy() for p in active]
            slots = [[st[s].numpy() for st in states] for s in update.slots]
        except (TypeError, RuntimeError):        # a CUDA tensor, bfloat16, ...
            return None
        if any(w.dtype != ws[0].dtype for w in ws):
            return None
        slots += [None] * (_table.MAX_SLOTS - len(slots))
        if len(plans) > 8:
            plans.clear()
        # the params and each slot as one run of memory each, where they are (the host
        # wrapper's params live in its arena in order; fresh slots are made so)
        runs = [_run(ws)] + [_run(a) for a in slots if a is not None]
        flat = None
        if all(r is not None for r in runs):
            flat = {"w": runs[0], "slots": runs[1:] + [None] * (_table.MAX_SLOTS + 1
                                                                 - len(runs)),
                    "sizes": [w.size for w in ws], "grads": None}
        plans[key] = (ptrs, self.state, list(active), (states, ws, slots, flat))
        return states, ws, slots, flat

    def _fresh_states(self, active: list, update) -> None:
        """First states for ``active``: each slot (``exp_avg`` ...) of every param a view
        of one zeroed tensor of all of theirs, in order (so a step can run over them as
        one run of elements: :meth:`_flat`); each ``state[p][slot]`` is still a tensor of
        its param's shape."""
        dtype = active[0].dtype
        if any(p.dtype is not dtype or p.device.type != "cpu" for p in active):
            return
        n = sum(p.numel() for p in active)
        bufs = {s: torch.zeros(n, dtype=dtype) for s in update.slots}
        at = 0
        for p in active:
            k = p.numel()
            state = self.state[p]
            state["step"] = 0
            for s in update.slots:
                state[s] = bufs[s][at:at + k].view(p.shape)
            at += k

    def _flat(self, plan, grads: list):
        """(ws, gs, slots) as one-item lists, each one run of memory, where the group's
        params, slots and this step's gradients lie so, in order (the host wrapper's
        gradients are views of one tensor): one pass over all the elements, the same
        per-element rule, so the same bits as param by param; None otherwise.  The
        gradients' run is made once per memory they lie in and kept with the tensor
        holding it (``_base``), so their addresses in that memory, checked each step,
        prove it is theirs."""
        flat = plan[3]
        if flat is None:
            return None
        ptrs = list(map(_DATA_PTR, grads))
        cached = flat["grads"]
        if cached is None or cached[0] != ptrs:
            found = _grad_run(grads, ptrs, flat["sizes"])
            if found is None:
                flat["grads"] = None
                return None
            ptrs, run, holder = found
            cached = flat["grads"] = (ptrs, run, holder, (
                [flat["w"][1]], [run], [[a[1]] if a is not None else None
                                        for a in flat["slots"]]))
        if not all(map(_CONTIGUOUS, grads)):
            return None
        return cached[3]

    def _step_each(self, gi: int, group: dict, hp: dict, update, lr: float) -> None:
        """The params one by one (any mix of step counts; a clear error for a param the
        update cannot take)."""
        scalars = {}                     # per step count t: (scalars, packed)
        for pi, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            w = self._view(p.data, gi, pi)
            g = self._view(p.grad, gi, pi, grad=True)
            if g.dtype != w.dtype:
                raise OptimizerError(f"param {pi} of group {gi} is {p.dtype} and its "
                                     f".grad {p.grad.dtype}")
            state = self._state(p, update)
            slots = {s: state[s].numpy() for s in update.slots}
            t = state["step"] = int(state["step"]) + 1
            found = scalars.get(t)
            if found is None:
                sc = self._scalars(hp, lr, t)
                found = scalars[t] = (sc, update.pack(sc))
            update(w, g, slots, None, 0.0, *found)

    # ── saved state ───────────────────────────────────────────────────────
    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, after checking every parameter's state against this entry: its keys
        (``step`` and the slots of its group's options), shapes and finite values."""
        groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        states = state_dict.get("state") if isinstance(state_dict, dict) else None
        if not isinstance(groups, list) or not isinstance(states, dict):
            raise OptimizerError("optimizer state: a dict with 'state' and 'param_groups' "
                                 "is needed")
        if len(groups) != len(self.param_groups):
            raise OptimizerError(f"optimizer state has {len(groups)} param groups, this "
                                 f"optimizer {len(self.param_groups)}")
        for gi, (saved, mine) in enumerate(zip(groups, self.param_groups)):
            ids = saved.get("params", [])
            if len(ids) != len(mine["params"]):
                raise OptimizerError(f"optimizer state: group {gi} has {len(ids)} params, "
                                     f"this optimizer's {len(mine['params'])}")
            hp = self._hparams({**mine, **{k: v for k, v in saved.items() if k != "params"}})
            want = {"step", *self.entry.slot_names(hp)}
            for pid, p in zip(ids, mine["params"]):
                s = states.get(pid)
                if s is None:
                    continue
                keys = set(s)
                if keys != want:
                    extra, missing = sorted(keys - want), sorted(want - keys)
                    raise OptimizerError(
                        f"optimizer state of param {pid}: "
                        + "; ".join(x for x in (extra and f"unknown keys {extra}",
                                                missing and f"missing keys {missing}") if x))
                step = s["step"]
                step = step.item() if isinstance(step, torch.Tensor) else step
                if isinstance(step, bool) or not float(step).is_integer() or step < 0:
                    raise OptimizerError(f"optimizer state of param {pid}: step {step!r} "
                                         "is not a count")
                for k in want - {"step"}:
                    v = s[k]
                    if not isinstance(v, torch.Tensor) or tuple(v.shape) != tuple(p.shape):
                        raise OptimizerError(f"optimizer state of param {pid}: {k!r} is not "
                                             f"a tensor of the param's shape {list(p.shape)}")
                    if not bool(torch.isfinite(v).all()):
                        raise OptimizerError(f"optimizer state of param {pid}: {k!r} holds "
                                             "non-finite values")
                    if k in ("v", "vmax") and bool((v < 0).any()):
                        raise OptimizerError(f"optimizer state of param {pid}: {k!r} holds "
                                             "negative values")
        super().load_state_dict(state_dict)
        self.__dict__.pop("_plans", None)          # views of the tensors replaced here
        for state in self.state.values():       # the step a plain int, the slots contiguous
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = int(state["step"].item())
            for k, v in list(state.items()):
                if isinstance(v, torch.Tensor):
                    state[k] = v.contiguous()


_DATA_PTR = torch.Tensor.data_ptr          # (unbound: twice as fast as a methodcaller)
_GRAD = operator.attrgetter("grad")
_STEP = operator.itemgetter("step")
_CONTIGUOUS = torch.Tensor.is_contiguous


def _from_address(ptr: int, n: int, dtype) -> np.ndarray:
    """A numpy array of ``n`` elements of ``dtype`` at address ``ptr`` (its memory kept
    alive by the caller)."""
    dtype = np.dtype(dtype)
    return np.frombuffer((ctypes.c_char * (n * dtype.itemsize)).from_address(ptr), dtype)


def _run(arrays: list):
    """(arrays, one array over all of them) where ``arrays`` (contiguous, of one dtype)
    lie one after another in memory, in order; None otherwise."""
    for a, b in zip(arrays, arrays[1:]):
        if a.ctypes.data + a.nbytes != b.ctypes.data or a.dtype != b.dtype:
            return None
    n = sum(a.size for a in arrays)
    return arrays, _from_address(arrays[0].ctypes.data, n, arrays[0].dtype)


def _grad_run(grads: list, ptrs: list, sizes: list):
    """(ptrs, one array over all of ``grads``, the tensor whose memory it is) where the
    gradients (of the params' sizes) lie one after another, in order, inside the memory
    of the first one's base tensor (kept here, so that memory stays theirs while their
    addresses match); None otherwise."""
    g0 = grads[0]
    if g0 is None or g0.device.type != "cpu" or not g0.is_contiguous():
        return None
    size = g0.element_size()
    for k in range(len(ptrs) - 1):
        if ptrs[k] + sizes[k] * size != ptrs[k + 1]:
            return None
    holder = g0._base
    if holder is None or holder.dtype is not g0.dtype or holder.device.type != "cpu" \
            or not holder.is_contiguous():
        return None
    start, n = holder.data_ptr(), holder.numel()
    total = sum(sizes)
    if not (start <= ptrs[0] and ptrs[0] + total * size <= start + n * size):
        return None
    dtype = np.float32 if g0.dtype is torch.float32 else np.float64
    return ptrs, _from_address(ptrs[0], total, dtype), holder


# torch's own wrapper around the update, for a step that has hooks or a profiler
_HOOKED_STEP = torch.optim.Optimizer.profile_hook_step(Optimizer._step)


class SGD(Optimizer):
    """``torch.optim.SGD``'s keywords; the update is the table's ``sgd``."""

    kind = "sgd"

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 **extra):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize), extra)


class Adam(Optimizer):
    """``torch.optim.Adam``'s keywords (eps on the bias-corrected sqrt(v-hat)); the table's
    ``adam``."""

    kind = "adam"

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *, maximize: bool = False,
                 **extra):
        super().__init__(params, dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize), extra)


class AdamW(Adam):
    """``torch.optim.AdamW``'s keywords (decoupled weight decay, default 0.01); the
    table's ``adamw``."""

    kind = "adamw"

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 **extra):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         **extra)


class AdamSeed(Optimizer):
    """The seed's eps-hat Adam (``--optimizer adam-seed``): fixed betas and eps."""

    kind = "adam-seed"

    def __init__(self, params, lr: float = 1e-3, **extra):
        super().__init__(params, dict(lr=lr, betas=(_table.SEED_B1, _table.SEED_B2)), extra)
