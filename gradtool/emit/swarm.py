"""The swarm ABI: the ``grad`` device function swarm-mcp's ``compute_iterate`` runs per example.

``gradtool emit-cuda TAPE --abi swarm`` writes, as the original design's
emitter (``emitc.nu``) does::

    __device__ void grad(long long x, double v, double* g, const double* p)
    __device__ void grad(long long x, double* g, const double* p)     (has_v=False)

``x`` is the example's index, ``v`` its dataset value, ``p`` the K chosen
params (compute_iterate's state vector) and ``g`` the K-vector the call adds
its example's gradient into, through the worker's ``swarm_g_add(g, j, val)``.

* Leaves (:func:`.walk.layout` with ``freeze_consts``): the chosen params are
  ``p[j]`` (registration order, or the order of ``params``); a named const in
  ``binds`` is the caller's C expression (``--bind y=v --bind x0='(double)x'``);
  every other leaf, unnamed consts and params that are not chosen included, is
  FROZEN: its recorded value inlined as an exact C99 hex literal.
* Body: the backward statements of :func:`.walk.statements`, and the forward
  statements of the values they read (``grad`` returns no loss, so a value
  only the loss needs is not computed); branches that depend only on frozen
  or bound leaves get no backward code.
* Epilogue: one ``swarm_g_add(g, j, gN)`` for EVERY chosen param, in p order,
  with ``0.0`` for a param the loss does not depend on, as the seed does: the
  call count is K whatever the tape, and a worker that accumulates sees every
  slot written.

The file compiles as CUDA (nvcc, NVRTC: nothing is included under
``__CUDACC__``) and as C99 (``__device__`` is defined away on the host).  It
declares the accumulator as swarm's worker does,
``__device__ void swarm_g_add(double* g, long long j, double val);``, unless a
macro of that name is defined; it never defines it: the worker (or a host
driver such as ``scripts/swarm_driver.c``) does.  The function name, the
``x``/``v`` parameter names and the accumulator's name can be changed.
"""

from __future__ import annotations

import re
from typing import Optional

from ..tape import Tape
from .render import EmitError
from .walk import (Layout, check_identifier, leaf_label, leaf_table, preamble, statements,
                   tape_lines)


def _uses(name: str, exprs) -> bool:
    word = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])")
    return any(word.search(e) for e in exprs)


def _host_prelude(g_add: str) -> list:
    return f"""\
/* ---- swarm ABI prelude -------------------------------------------------- */
/* on the host, __device__ means nothing (nvcc and NVRTC define it themselves) */
#if !defined(__CUDACC__) && !defined(__device__)
#  define __device__
#endif
/* the accumulator compute_iterate's worker defines; declared here as the worker
 * declares it, unless it is a macro */
#ifndef {g_add}
__device__ void {g_add}(double* g, long long j, double val);
#endif
""".splitlines() + [""]


def emit_swarm(tape: Tape, lay: Layout, name: Optional[str] = None, source=None,
               chosen: bool = False, x_name: str = "x", v_name: str = "v",
               g_add: str = "swarm_g_add", has_v: bool = True) -> str:
    """The swarm ABI's file for a checked tape and its layout (see the module docstring)."""
    if not isinstance(has_v, bool):
        raise EmitError(f"has_v must be True or False, got {has_v!r}")
    x_name = check_identifier("x parameter name", x_name, {"p", "g"})
    v_name = check_identifier("v parameter name", v_name, {"p", "g", x_name})
    args = {"p", "g", x_name} | ({v_name} if has_v else set())
    g_add = check_identifier("accumulator name", g_add, args)
    name = check_identifier("function name", "grad" if name is None else name,
                            args | {g_add})

    body = statements(tape, lay, loss_value=False)
    k = len(lay.params)
    epilogue = [f"    /* dL/dp[j] into the K = {k} gradient slots: one {g_add} per chosen "
                f"param, 0.0 where the loss does not depend on it */"]
    for j, i in enumerate(lay.params):
        label = leaf_label(tape, i)
        if body.grad[i] is not None:
            epilogue.append(f"    {g_add}(g, {j}, {body.grad[i]});  /* {label} */")
        else:
            epilogue.append(f"    {g_add}(g, {j}, 0.0);  /* {label}: unreached */")

    exprs = body.bound
    unused = [arg for arg, used in ((x_name, _uses(x_name, exprs)),
                                    (v_name, not has_v or _uses(v_name, exprs)),
                                    ("g", k > 0), ("p", "p" in body.uses)) if not used]
    v_arg = f"double {v_name}, " if has_v else ""
    signature = f"__device__ void {name}(long long {x_name}, {v_arg}double* g, const double* p)"
    func = [signature, "{"]
    if unused:
        func.append("    " + " ".join(f"(void){arg};" for arg in unused))
    func += body.forward + body.backward + epilogue + ["}", ""]

    order = "--params order" if chosen else "registration order"
    header = [
        "/*",
        f" * {name}: the per-example gradient of a gradtool tape for swarm-mcp's compute_iterate,",
        " * generated by `gradtool emit-cuda --abi swarm`.  Do not edit: regenerate from the tape.",
        " *",
        *tape_lines(tape, lay, source, body.emitted, "the loss's ancestors its gradient reads"),
        " *",
        f" *   {signature}",
        f" * {x_name}: the example's index" + (f"; {v_name}: its dataset value" if has_v else "")
        + f"; p: the K = {k} chosen params;",
        f" * every call adds its example's dL/dp[j] into g through {g_add}(g, j, val), once",
        " * for every j (0.0 where the loss does not depend on p[j]).",
        " *",
        " * Each call's gradient is identical to the bit to the CPU tape's for that example",
        " * (`gradtool backward TAPE --data`): the same separately rounded binary64",
        " * operations in the same order, nothing from libm.  Host builds WITHOUT",
        " * contraction or fast-math:  cc -std=c99 -O2 -ffp-contract=off ...",
        " *",
        f" * Parameters p[j], {order} (K = {k}):",
        *leaf_table(tape, lay),
        " */",
        "",
    ]
    return "\n".join(header + preamble() + _host_prelude(g_add) + func)
