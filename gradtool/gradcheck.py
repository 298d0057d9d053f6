"""Central finite differences against backward, for every parameter element (or a
seeded sample of them).

The recorded graph is replayed (``Tape.forward``) on perturbed parameters:
the user records once, the checker re-runs only the descendants of the
parameter being perturbed.  An element passes when

    |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|)

with numeric = D(eps) = (L(w + eps) - L(w - eps)) / (2 eps).

Kinks.  A model with relu (or max, abs, clamp...) is not smooth everywhere, and a
point within eps of a kink gives a D(eps) that mixes the slopes on both sides: a
correct gradient "fails".  (A ResNet's BatchNorm in train mode moves every later
activation when one weight moves, so with enough activations some relu input is
always that close.)  So an element whose D(eps) disagrees with the analytic
gradient is measured again at eps/10.  Where the loss is smooth at the scale of
eps, D(eps) and D(eps/10) agree (they differ by O(eps^2)), the one-sided slopes
converge (:func:`_kink`), and the disagreement with the analytic gradient stands:
a FAILURE.  Where D(eps) and D(eps/10) disagree with each other (by more than the
same tolerance), or the one-sided slopes at eps/10 still differ by as much as at
eps (a kink closer than eps/10, or at the point itself: relu at exactly 0), the
element is reported as NON-SMOOTH, with the figures, and not counted as a failure:
there the gradient is one of the one-sided slopes, not a derivative to check.
A non-finite analytic or numeric value is always a failure.

Sampling.  ``sample=N`` checks N coordinates of each parameter (all of a smaller
one), drawn without replacement by ``numpy.random.default_rng((seed, param id))``,
so a whole model can be checked within a budget; :func:`sample_within` finds the
largest N that fits.

Float32.  Finite differences of a float32 computation are noise at these steps
(float32 resolves about 6e-8 relative: a step of 1e-6 moves the loss by a handful
of ulps), so a tape holding float32 values is refused (:func:`require_float64`),
naming the way to check it: the same model at float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .budget import node_work
from .errors import TapeError
from .tape import GVar, Tape, is_number


@dataclass
class NonSmooth:
    """An element where D(eps) and D(eps/10) disagree: not counted as a failure."""
    index: tuple
    analytic: float
    numeric: float           # D(eps)
    numeric_small: float     # D(eps / 10)


@dataclass
class ParamCheck:
    id: int
    name: str | None
    shape: tuple
    max_abs_err: float       # over the elements that count (the non-smooth ones do not)
    max_rel_err: float
    worst_index: tuple
    analytic: float          # at the worst element
    numeric: float
    passed: bool
    checked: int = 0         # elements checked (all, or the sample)
    sampled: bool = False    # a sample of the elements, not all of them
    nonsmooth: list = field(default_factory=list)     # NonSmooth, in index order


@dataclass
class FDReport:
    loss: float
    eps: float
    rtol: float
    atol: float
    params: list = field(default_factory=list)
    sample: int | None = None        # coordinates per parameter; None: all
    seed: int = 0

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


def fd_cost(tape: Tape, params=None, sample=None) -> FDCost:
    """The cost of checking ``params`` (GVars or leaf names; default every param), every
    element or (``sample=N``) N per param.  An element measured again at eps/10 (one
    whose D(eps) disagrees with backward) costs two more evaluations, not counted."""
    return _costs(tape, _chosen_params(tape, params))(_sample_count(sample))


def _costs(tape: Tape, chosen: list):
    """``cost(sample)`` for these params: the descendants' work is found once."""
    shapes = [v.shape for v in tape.values]
    works = [node_work(n.op, shapes[i], shapes[n.a] if n.a >= 0 else None,
                       shapes[n.b] if n.b >= 0 else None, n.aux) + NODE_OVERHEAD * (n.a >= 0)
             for i, n in enumerate(tape.nodes)]
    per_param = [(tape.values[p.id].size,
                  sum(w for w, flag in zip(works, _descendants(tape, p.id)) if flag))
                 for p in chosen]

    def cost(sample) -> FDCost:
        elements = evals = work = 0
        for size, per_eval in per_param:
            n = size if sample is None else min(size, sample)
            elements += n
            evals += 2 * n
            work += (2 * n + 1) * per_eval
        return FDCost(len(chosen), elements, evals, work)
    return cost


def sample_within(tape: Tape, params=None, budget: int = FD_WORK_BUDGET):
    """The largest N such that checking N elements per param costs at most ``budget``
    work; None when every element fits, 0 when not even one per param does."""
    chosen = _chosen_params(tape, params)
    cost = _costs(tape, chosen)
    if cost(None).work <= budget:
        return None
    lo, hi = 0, max((tape.values[p.id].size for p in chosen), default=0)
    while lo < hi:                                  # the largest N with cost(N) <= budget
        mid = (lo + hi + 1) // 2
        if cost(mid).work <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _sample_count(sample):
    if sample is None:
        return None
    if isinstance(sample, bool) or not isinstance(sample, (int, np.integer)) or sample < 1:
        raise TapeError(f"fd_check: sample must be a whole number >= 1 (coordinates per "
                        f"parameter) or None, got {sample!r}")
    return int(sample)


def sample_indices(size: int, sample, seed: int, param_id: int) -> np.ndarray:
    """The flat indices checked of a parameter of ``size`` elements: all of them, or
    ``sample`` drawn without replacement by ``default_rng((seed, param_id))``, sorted."""
    if sample is None or sample >= size:
        return np.arange(size)
    rng = np.random.default_rng((seed, param_id))
    return np.sort(rng.choice(size, size=sample, replace=False))


def require_float64(tape: Tape, what: str = "fd_check") -> None:
    """Refuse a tape holding float32 values (see the module docstring).

    The hook for the float32 dtype: a float32 node (a param, const or op value of dtype
    float32) is refused here, naming the node, so fd-check never reports noise as a
    verdict."""
    for i, value in enumerate(tape.values):
        if getattr(value, "dtype", None) == np.float32:
            raise TapeError(
                f"{what}: node {i} ({tape.nodes[i].op}) is float32: finite differences "
                f"in float32 are noise at these steps; check the same model at float64 "
                f"(gradtool import-torch --dtype f64, or record it from float64 arrays)")


def fd_check(tape: Tape, loss: GVar, eps: float = 1e-6, rtol: float = 1e-5,
             atol: float = 1e-6, *, params=None, progress=None, sample=None,
             seed: int = 0) -> FDReport:
    """Check every parameter element of ``tape`` by central differences, telling a kink
    from a wrong gradient (the module docstring).

    ``params``: only these params (GVars or leaf names), in tape order; default all.
    ``sample``: N elements per param (seeded by ``seed``), else all.
    ``progress(done, total, param_id)`` is called after every element with the loss
    evaluations done and due (two per element; the eps/10 re-measurements are not
    counted).  :func:`fd_cost` says beforehand what a check will cost.
    """
    if not isinstance(tape, Tape):
        raise TapeError(f"fd_check: expected a Tape, got {type(tape).__name__}")
    tape.node_id(loss, "fd_check loss")
    eps = _positive(eps, "eps", strict=True)
    rtol = _positive(rtol, "rtol")
    atol = _positive(atol, "atol")
    chosen = _chosen_params(tape, params)
    sample = _sample_count(sample)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise TapeError(f"fd_check: seed must be a whole number >= 0, got {seed!r}")
    if progress is not None and not callable(progress):
        raise TapeError(f"fd_check: progress must be callable, got {type(progress).__name__}")
    require_float64(tape)
    # inf - inf and 0/0 in the differences are results to report, not warnings
    with np.errstate(all="ignore"):
        return _check_all_params(tape, loss, eps, rtol, atol, chosen, progress, sample,
                                 int(seed))


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


def _close(a, b, rtol, atol):
    """The tolerance rule, elementwise: |a - b| <= atol + rtol * max(|a|, |b|)."""
    return np.abs(a - b) <= atol + rtol * np.maximum(np.abs(a), np.abs(b))


def _kink(loss, eps, up, down, numeric, up_small, down_small, small, rtol, atol) -> bool:
    """Whether the loss is not smooth at the scale of ``eps`` along this element:

    * D(eps) and D(eps/10) disagree (a kink between eps/10 and eps away), or
    * the one-sided slopes at eps/10 still differ, as much as at eps: their difference
      S(h) = (L(w+h) - 2 L(w) + L(w-h)) / h is h L'' + O(h^3) where L is smooth, so
      it shrinks tenfold from h = eps to eps/10; a kink closer than eps/10 (or at the
      point itself) keeps it near the jump in slope.  It must also exceed the
      tolerance, so a smooth loss's curvature and rounding never count."""
    if not _close(numeric, small, rtol, atol):
        return True
    s_eps = (up - 2.0 * loss + down) / eps
    s_small = (up_small - 2.0 * loss + down_small) / (eps / 10.0)
    tol = atol + rtol * max(abs(numeric), abs(small))
    return bool(abs(s_small) > tol and abs(s_small) > 0.5 * abs(s_eps))


def _check_all_params(tape, loss, eps, rtol, atol, chosen, progress, sample, seed) -> FDReport:
    tape.zero_grad()
    tape.backward(loss)
    li = loss.id
    report = FDReport(loss=float(tape.values[li].reshape(-1)[0]), eps=eps, rtol=rtol, atol=atol,
                      sample=sample, seed=seed)
    picks = {p.id: sample_indices(tape.values[p.id].size, sample, seed, p.id) for p in chosen}
    total = 2 * sum(ks.size for ks in picks.values())
    done = 0
    for p in chosen:
        w = tape.values[p.id]          # the live copy, perturbed in place
        flat = w.reshape(-1)
        only = _descendants(tape, p.id)

        def losses(k: int, h: float) -> tuple:
            """(L(w + h e_k), L(w - h e_k))."""
            orig = flat[k]
            flat[k] = orig + h
            tape.forward(p.id + 1, only)
            up = tape.values[li].reshape(-1)[0]
            flat[k] = orig - h
            tape.forward(p.id + 1, only)
            down = tape.values[li].reshape(-1)[0]
            flat[k] = orig
            return up, down

        ks = picks[p.id]
        an = np.array(tape.grad(p)).reshape(-1)[ks]
        up, down = np.empty(ks.size), np.empty(ks.size)
        for j, k in enumerate(ks):
            up[j], down[j] = losses(int(k), eps)
            done += 2
            if progress is not None:
                progress(done, total, p.id)
        numeric = (up - down) / (2.0 * eps)
        # the elements that disagree, where both figures are finite: measured at eps/10
        nonsmooth, counted = [], np.ones(ks.size, dtype=bool)
        suspects = ~_close(an, numeric, rtol, atol) & np.isfinite(an) & np.isfinite(numeric)
        for j in np.flatnonzero(suspects):
            up_small, down_small = losses(int(ks[j]), eps / 10.0)
            small = (up_small - down_small) / (2.0 * eps / 10.0)
            if _kink(report.loss, eps, up[j], down[j], numeric[j], up_small, down_small,
                     small, rtol, atol):
                counted[j] = False
                nonsmooth.append(NonSmooth(
                    index=tuple(int(i) for i in np.unravel_index(int(ks[j]), w.shape)),
                    analytic=float(an[j]), numeric=float(numeric[j]),
                    numeric_small=float(small)))
        tape.forward(p.id + 1, only)   # restore the recorded values exactly
        report.params.append(_verdict(p, tape, w.shape, ks, an, numeric, counted, nonsmooth,
                                      rtol, atol, sample))
    return report


def _verdict(p, tape, shape, ks, an, numeric, counted, nonsmooth, rtol, atol, sample):
    """One param's ParamCheck: errors and the worst element over the counted elements."""
    sampled = sample is not None and ks.size < int(np.prod(shape, dtype=np.int64))
    if not counted.any():             # nothing counted: every checked element non-smooth
        first = nonsmooth[0] if nonsmooth else None
        return ParamCheck(id=p.id, name=tape.nodes[p.id].name, shape=tuple(shape),
                          max_abs_err=0.0, max_rel_err=0.0,
                          worst_index=first.index if first else (),
                          analytic=first.analytic if first else 0.0,
                          numeric=first.numeric if first else 0.0, passed=True,
                          checked=int(ks.size), sampled=sampled, nonsmooth=nonsmooth)
    ks, an, numeric = ks[counted], an[counted], numeric[counted]
    abs_err = np.abs(an - numeric)
    scale = np.maximum(np.abs(an), np.abs(numeric))
    rel_err = np.where(scale > 0, abs_err / np.where(scale > 0, scale, 1.0), 0.0)
    ok = abs_err <= atol + rtol * scale
    ok &= np.isfinite(an) & np.isfinite(numeric)
    worst = int(np.argmax(np.where(np.isnan(abs_err), np.inf, abs_err)))
    return ParamCheck(
        id=p.id, name=tape.nodes[p.id].name, shape=tuple(shape),
        max_abs_err=float(np.nanmax(abs_err)) if not np.all(np.isnan(abs_err)) else float("nan"),
        max_rel_err=float(np.nanmax(rel_err)) if not np.all(np.isnan(rel_err)) else float("nan"),
        worst_index=tuple(int(i) for i in np.unravel_index(int(ks[worst]), shape)),
        analytic=float(an[worst]), numeric=float(numeric[worst]), passed=bool(ok.all()),
        checked=int(counted.size), sampled=sampled, nonsmooth=nonsmooth)
