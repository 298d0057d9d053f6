"""Central finite differences against backward, for every parameter element.

The recorded graph is replayed (``Tape.forward``) on perturbed parameters:
the user records once, the checker re-runs only the descendants of the
parameter being perturbed.  An element passes when

    |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|)

with numeric = (L(w + eps) - L(w - eps)) / (2 eps).  A kink at the evaluation
point (relu at exactly 0) makes the two one-sided slopes differ, so the check
FAILS there, as it should: the gradient is not the derivative at a kink.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .budget import node_work
from .errors import TapeError
from .tape import GVar, Tape, is_number


@dataclass
class ParamCheck:
    id: int
    name: str | None
    shape: tuple
    max_abs_err: float
    max_rel_err: float
    worst_index: tuple
    analytic: float          # at the worst element
    numeric: float
    passed: bool


@dataclass
class FDReport:
    loss: float
    eps: float
    rtol: float
    atol: float
    params: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(p.passed for p in self.params)


def _descendants(tape: Tape, root: int) -> list:
    """The nodes a perturbation of ``root`` reaches.  A detach node is not one of them:
    its value is held as recorded, the function whose derivative the stop-gradient
    defines (so fd-check agrees with backward through it)."""
    flags = [False] * len(tape.nodes)
    flags[root] = True
    for i in range(root + 1, len(tape.nodes)):
        node = tape.nodes[i]
        flags[i] = (node.a >= 0 and node.op != "detach"
                    and (flags[node.a] or (node.b >= 0 and flags[node.b])))
    return flags


def _positive(x, what: str, strict: bool = False) -> float:
    if not is_number(x):
        raise TapeError(f"fd_check: {what} must be a real number, got {type(x).__name__}")
    value = float(x)
    if not math.isfinite(value) or value < 0.0 or (strict and value == 0.0):
        raise TapeError(f"fd_check: {what} must be finite and {'> 0' if strict else '>= 0'}, "
                        f"got {x!r}")
    return value


# A node's fixed cost in one replay (a Python call and numpy's dispatch, about 5
# microseconds), in the unit of the work estimate: element operations (about half a
# nanosecond each).
NODE_OVERHEAD = 10_000
# What `gradtool fd-check` does without --max-evals: about 10 s of replays here.
FD_WORK_BUDGET = 1 << 34


@dataclass(frozen=True)
class FDCost:
    """What :func:`fd_check` will do, known before it starts: loss evaluations (two per
    parameter element) and the work of their replays, in element operations
    (:mod:`gradtool.budget`; a node's replay also costs :data:`NODE_OVERHEAD`)."""

    params: int
    elements: int
    evals: int
    work: int

    @property
    def work_per_eval(self) -> float:
        return self.work / self.evals if self.evals else 0.0


def fd_cost(tape: Tape, params=None) -> FDCost:
    """The cost of checking ``params`` (GVars or leaf names; default every param)."""
    chosen = _chosen_params(tape, params)
    shapes = [v.shape for v in tape.values]
    works = [node_work(n.op, shapes[i], shapes[n.a] if n.a >= 0 else None,
                       shapes[n.b] if n.b >= 0 else None, n.aux) + NODE_OVERHEAD * (n.a >= 0)
             for i, n in enumerate(tape.nodes)]
    elements = evals = work = 0
    for p in chosen:
        size = tape.values[p.id].size
        per_eval = sum(w for w, flag in zip(works, _descendants(tape, p.id)) if flag)
        elements += size
        evals += 2 * size
        work += (2 * size + 1) * per_eval
    return FDCost(len(chosen), elements, evals, work)


def fd_check(tape: Tape, loss: GVar, eps: float = 1e-6, rtol: float = 1e-5,
             atol: float = 1e-6, *, params=None, progress=None) -> FDReport:
    """Check every parameter element of ``tape`` by central differences.

    ``params``: only these params (GVars or leaf names), in tape order; default all.
    ``progress(done, total, param_id)`` is called after every element with the loss
    evaluations done and due (two per element).  :func:`fd_cost` says beforehand
    what a check will cost.
    """
    if not isinstance(tape, Tape):
        raise TapeError(f"fd_check: expected a Tape, got {type(tape).__name__}")
    tape.node_id(loss, "fd_check loss")
    eps = _positive(eps, "eps", strict=True)
    rtol = _positive(rtol, "rtol")
    atol = _positive(atol, "atol")
    chosen = _chosen_params(tape, params)
    if progress is not None and not callable(progress):
        raise TapeError(f"fd_check: progress must be callable, got {type(progress).__name__}")
    # inf - inf and 0/0 in the differences are results to report, not warnings
    with np.errstate(all="ignore"):
        return _check_all_params(tape, loss, eps, rtol, atol, chosen, progress)


def _chosen_params(tape: Tape, params) -> list:
    if params is None:
        return tape.params()
    if isinstance(params, (str, GVar)):
        params = [params]
    try:
        items = list(params)
    except TypeError:
        raise TapeError(f"fd_check params: expected GVars or leaf names, got "
                        f"{type(params).__name__}") from None
    ids = set()
    for ref in items:
        i = tape.node_id(tape.var(ref) if isinstance(ref, str) else ref, "fd_check params")
        if tape.nodes[i].op != "param":
            raise TapeError(f"fd_check params: node {i} is a {tape.nodes[i].op}, not a param")
        ids.add(i)
    return [p for p in tape.params() if p.id in ids]


def _check_all_params(tape, loss, eps, rtol, atol, chosen, progress) -> FDReport:
    tape.zero_grad()
    tape.backward(loss)
    li = loss.id
    report = FDReport(loss=float(tape.values[li].reshape(-1)[0]), eps=eps, rtol=rtol, atol=atol)
    total = 2 * sum(tape.values[p.id].size for p in chosen)
    done = 0
    for p in chosen:
        analytic = np.array(tape.grad(p))
        w = tape.values[p.id]          # the live copy, perturbed in place
        flat = w.reshape(-1)
        only = _descendants(tape, p.id)
        numeric = np.empty(flat.size)
        for k in range(flat.size):
            orig = flat[k]
            flat[k] = orig + eps
            tape.forward(p.id + 1, only)
            up = tape.values[li].reshape(-1)[0]
            flat[k] = orig - eps
            tape.forward(p.id + 1, only)
            down = tape.values[li].reshape(-1)[0]
            flat[k] = orig
            numeric[k] = (up - down) / (2.0 * eps)
            done += 2
            if progress is not None:
                progress(done, total, p.id)
        tape.forward(p.id + 1, only)   # restore the recorded values exactly
        an = analytic.reshape(-1)
        abs_err = np.abs(an - numeric)
        scale = np.maximum(np.abs(an), np.abs(numeric))
        rel_err = np.where(scale > 0, abs_err / np.where(scale > 0, scale, 1.0), 0.0)
        ok = abs_err <= atol + rtol * scale
        ok &= np.isfinite(an) & np.isfinite(numeric)
        worst = int(np.argmax(np.where(np.isnan(abs_err), np.inf, abs_err)))
        report.params.append(ParamCheck(
            id=p.id, name=tape.nodes[p.id].name, shape=tuple(w.shape),
            max_abs_err=float(np.nanmax(abs_err)) if not np.all(np.isnan(abs_err)) else float("nan"),
            max_rel_err=float(np.nanmax(rel_err)) if not np.all(np.isnan(rel_err)) else float("nan"),
            worst_index=tuple(int(i) for i in np.unravel_index(worst, w.shape)),
            analytic=float(an[worst]), numeric=float(numeric[worst]), passed=bool(ok.all())))
    return report
