"""The device optimizer: :mod:`gradtool.optim` mirrored bit for bit.

The host half (:class:`OptimizerPlan`) keeps the scalar state that
``optim.Optimizer`` keeps (``t``, ``b1t``, ``b2t``) and, before every step,
computes the scalars a step needs with the same Python float expressions (the
table entry's ``scalars``: hyperparameters, then the per-step host scalars such
as Adam's ``step_size`` and ``bc2_sqrt``, the schedule's lr included).  They are
written into the program's control buffer ``ctl = [lr, clip_scale, clip_active,
loss_finite, scalars...]``; the guard and clip-norm kernels fill entries 1 to 3 on
the device.  The launches never change, so a whole training episode can be one
CUDA graph.

The device half is three kernels of ``kernels.cu``: ``k_guard`` (a non-finite loss
updates nothing, the training loop's contract), ``k_clip_norm`` (the global norm
over the active params' raw gradients, registration order, row-major, serial from
0.0) and ``k_opt`` (clip, then L2, then the optimizer table's variant for these
hyperparameters, ``csrc/gt_optim_table.h``, one element per thread: the same
rendering the CPU reference's compiled step runs).  Active params are the registered
params backward touches -- on a static program that is fixed at capture time
(:func:`gradtool.device.program.reach`); the others are skipped entirely, like
``Optimizer.step`` skips untouched params.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import GradtoolError
from ..optim import table as optim_table
from .launch import CaptureError, launch

CTL_SCALARS = 4                                  # ctl[4:] holds the entry's scalars
CTL_SIZE = CTL_SCALARS + optim_table.MAX_SCALARS


@dataclass
class PlanEntry:
    node_id: int
    active: bool          # touched by backward
    n: int
    slot_offs: dict = field(default_factory=dict)   # slot name -> arena offset (active only)


@dataclass
class OptimizerPlan:
    kind: str
    lr: float
    clip: float
    t: int
    b1t: float
    b2t: float
    ctl_off: int
    entries: list = field(default_factory=list)
    launches: list = field(default_factory=list)
    schedule: object = None         # the optimizer's gradtool.optim.Schedule
    hparams: dict = field(default_factory=dict)

    def counters(self) -> tuple:
        return self.t, self.b1t, self.b2t

    def restore(self, counters: tuple) -> None:
        """Undo :meth:`begin_step` (a step whose loss was not finite updated nothing)."""
        self.t, self.b1t, self.b2t = counters

    def begin_step(self) -> list:
        """Advance the step counter exactly like ``Optimizer.begin_step``; return the
        scalars for ctl[CTL_SCALARS:], in the entry's ``scalar_names`` order."""
        self.t += 1
        entry = optim_table.get(self.kind)
        self.b1t, self.b2t = entry.advance(self.hparams, self.b1t, self.b2t)
        lr = self.schedule.lr(self.lr, self.t - 1) if self.schedule is not None else self.lr
        return entry.scalar_values(self.hparams, lr, self.t, self.b1t, self.b2t)

    def write_back(self, opt, read) -> None:
        """Hand the device state back to ``opt``: counters, and slots in place.

        ``read(offset, n)`` downloads n arena elements as float64.
        """
        opt.t, opt.b1t, opt.b2t = self.t, self.b1t, self.b2t
        by_id = {e.node_id: e for e in opt.entries}
        for pe in self.entries:
            entry = by_id[pe.node_id]
            for name, off in pe.slot_offs.items():
                entry.state[name][...] = read(off, pe.n).reshape(entry.state[name].shape)


def plan_optimizer(builder, prog, opt) -> OptimizerPlan:
    """Allocate the slots and emit the optimizer launches for ``opt`` over ``prog``."""
    kind = getattr(opt, "kind", None)
    try:
        entry = optim_table.get(kind)
    except GradtoolError as exc:
        raise CaptureError(str(exc)) from None
    hparams = dict(opt.hparams)
    plan = OptimizerPlan(kind=kind, lr=float(opt.lr), clip=float(opt.clip), t=int(opt.t),
                         b1t=float(opt.b1t), b2t=float(opt.b2t), ctl_off=prog.ctl_off,
                         schedule=getattr(opt, "schedule", None), hparams=hparams)
    if hasattr(opt, "check_tape"):
        try:
            opt.check_tape(builder.tape)
        except GradtoolError as exc:
            # a rounded f32 copy (program.rounded_tape) answers for its original's params
            original = getattr(builder.tape, "rounded_from", None)
            try:
                if original is None:
                    raise
                opt.check_tape(original)
            except GradtoolError:
                raise CaptureError(str(exc)) from None
    slots = entry.slot_names(hparams)
    for e in opt.entries:
        nid = e.node_id
        if not 0 <= nid < len(prog.shapes) or builder.tape.nodes[nid].op != "param":
            raise CaptureError(f"optimizer entry {nid} is not a param node of this tape")
        pe = PlanEntry(nid, prog.grad_off[nid] >= 0, prog.size_of(nid))
        if pe.active:
            for name in slots:
                pe.slot_offs[name] = builder.alloc(pe.n)
                prog.init.append((pe.slot_offs[name], np.asarray(e.state[name],
                                                                 dtype=np.float64)))
        plan.entries.append(pe)

    active = [pe for pe in plan.entries if pe.active]
    use_clip = int(plan.clip > 0.0)
    ctl = prog.ctl_off
    if active:
        plan.launches.append(launch("k_guard", 1, -1, "loss finite?", ctl=ctl,
                                    loss=prog.val_off[prog.loss]))
    if use_clip and active:
        plan.launches.append(launch("k_clip_norm", 1, -1, "clip norm", ctl=ctl, clip=plan.clip,
                                    offs=[prog.grad_off[pe.node_id] for pe in active],
                                    lens=[pe.n for pe in active]))
    l2_of = {e.node_id: float(e.l2) for e in opt.entries}
    variant = optim_table.variant_id(entry, hparams)
    for pe in active:
        w, g, l2 = prog.val_off[pe.node_id], prog.grad_off[pe.node_id], l2_of[pe.node_id]
        offs = [pe.slot_offs[name] for name in slots]
        offs += [w] * (optim_table.MAX_SLOTS - len(offs))      # unused: never read
        plan.launches.append(launch("k_opt", pe.n, pe.node_id, kind, w=w, g=g, s0=offs[0],
                                    s1=offs[1], s2=offs[2], ctl=ctl, use_clip=use_clip, l2=l2,
                                    var=variant))
    return plan
