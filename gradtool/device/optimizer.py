"""The device optimizer: :mod:`gradtool.optim` mirrored bit for bit.

The host half (:class:`OptimizerPlan`) keeps the scalar state that
``optim.Optimizer`` keeps (``t``, ``b1t``, ``b2t``) and, before every step,
computes the one scalar a step needs with the same Python float expressions
(:meth:`OptimizerPlan.begin_step`): Adam's ``lr_t = (lr * sqrt(1 - b2t)) /
(1 - b1t)`` or SGD's ``lr``.  It is written into the program's control
buffer ``ctl = [lr_or_lr_t, clip_scale, clip_active, loss_finite]``; the
guard and clip-norm kernels fill the other entries on the device.  The launches never change, so a
whole training episode can be one CUDA graph.

The device half is four kernels of ``kernels.cu``: ``k_guard`` (a
non-finite loss updates nothing, the training loop's contract), ``k_clip_norm`` (the
global norm over the active params' raw gradients, registration order,
row-major, serial from 0.0), ``k_sgd`` and ``k_adam`` (clip, then L2, then
the update, one element per thread, exactly the optim module's order).
Active params are the registered params backward touches -- on a static
program that is fixed at capture time (:func:`gradtool.device.program.reach`);
the others are skipped entirely, like ``Optimizer.step`` skips untouched
params.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import GradtoolError
from ..optim import B1, B2, EPS, advance_adam
from .launch import CaptureError, launch


@dataclass
class PlanEntry:
    node_id: int
    active: bool          # touched by backward
    n: int
    m_off: int = -1       # Adam moments (active params only)
    v_off: int = -1


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

    def counters(self) -> tuple:
        return self.t, self.b1t, self.b2t

    def restore(self, counters: tuple) -> None:
        """Undo :meth:`begin_step` (a step whose loss was not finite updated nothing)."""
        self.t, self.b1t, self.b2t = counters

    def begin_step(self) -> float:
        """Advance the step counter exactly like ``Optimizer._begin_step``; return ctl[0]."""
        self.t += 1
        if self.kind == "adam":
            self.b1t, self.b2t, lr_t = advance_adam(self.lr, self.b1t, self.b2t)
            return lr_t
        return self.lr

    def write_back(self, opt, read) -> None:
        """Hand the device state back to ``opt``: counters, and moments in place.

        ``read(offset, n)`` downloads n arena elements as float64.
        """
        opt.t, opt.b1t, opt.b2t = self.t, self.b1t, self.b2t
        by_id = {e.node_id: e for e in opt.entries}
        for pe in self.entries:
            entry = by_id[pe.node_id]
            if pe.m_off >= 0:
                entry.m[...] = read(pe.m_off, pe.n).reshape(entry.m.shape)
                entry.v[...] = read(pe.v_off, pe.n).reshape(entry.v.shape)


def plan_optimizer(builder, prog, opt) -> OptimizerPlan:
    """Allocate the moments and emit the optimizer launches for ``opt`` over ``prog``."""
    kind = getattr(opt, "kind", None)
    if kind not in ("sgd", "adam"):
        raise CaptureError(f"the device optimizer supports sgd and adam, not {kind!r}")
    plan = OptimizerPlan(kind=kind, lr=float(opt.lr), clip=float(opt.clip), t=int(opt.t),
                         b1t=float(opt.b1t), b2t=float(opt.b2t), ctl_off=prog.ctl_off)
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
    for e in opt.entries:
        nid = e.node_id
        if not 0 <= nid < len(prog.shapes) or builder.tape.nodes[nid].op != "param":
            raise CaptureError(f"optimizer entry {nid} is not a param node of this tape")
        pe = PlanEntry(nid, prog.grad_off[nid] >= 0, prog.size_of(nid))
        if pe.active and kind == "adam":
            pe.m_off = builder.alloc(pe.n)
            pe.v_off = builder.alloc(pe.n)
            prog.init.append((pe.m_off, np.asarray(e.m, dtype=np.float64)))
            prog.init.append((pe.v_off, np.asarray(e.v, dtype=np.float64)))
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
    for pe in active:
        w, g, l2 = prog.val_off[pe.node_id], prog.grad_off[pe.node_id], l2_of[pe.node_id]
        if kind == "sgd":
            plan.launches.append(launch("k_sgd", pe.n, pe.node_id, "sgd", w=w, g=g, ctl=ctl,
                                        use_clip=use_clip, l2=l2))
        else:
            plan.launches.append(launch("k_adam", pe.n, pe.node_id, "adam", w=w, g=g,
                                        m=pe.m_off, v=pe.v_off, ctl=ctl, use_clip=use_clip,
                                        l2=l2, b1=B1, b2=B2, omb1=1.0 - B1, omb2=1.0 - B2,
                                        eps=EPS))
    return plan
