"""Emit a scalar tape as one self-contained CUDA-C gradient function.

The output is a single ``.cu`` file that compiles both as C99
(``cc -std=c99 -O2 -ffp-contract=off``) and as CUDA (``nvcc -c``):

1. a header comment: source, node counts, the p[j] / x[k] leaf order;
2. ``gradtool/csrc/gt_math.h`` verbatim (the libm-free exp/log/tanh and the
   GT_ADD/GT_SUB/GT_MUL/GT_DIV/GT_SQRT macros that cannot be contracted);
3. a small guarded prelude (``GT_DEVICE``, ``GT_G_ADD``);
4. ``GT_DEVICE double NAME(const double *p, const double *x, double *g)``:
   forward as ``double tN = <expr>;`` per node in tape order, backward as
   ``gN`` slots filled in reverse tape order from the seed 1.0, exactly the
   walk of :meth:`gradtool.tape.Tape.backward` (each contribution added as
   ``slot = slot + c``, a fresh slot starting at 0.0, input a before input
   b), then ``GT_G_ADD(g, j, gN)`` per parameter;
5. with ``kernel=True``, a ``__global__`` batch wrapper under ``__CUDACC__``.

Leaf binding: parameters are ``p[j]`` in registration order; constants are
``x[k]`` in registration order over the constants that are not bound (named
or not: an unnamed constant such as the 2.0 of ``y / 2.0`` is still a data
leaf the caller supplies, and the header comment lists its recorded value);
``binds={"name": "C expr"}`` replaces a named constant by an expression.

Only the loss's ancestors are emitted, and only the ancestors that depend on
a parameter (``tape.requires``) get backward code, as in the CPU walk.
Because every rendering comes from :mod:`gradtool.emit.render`, the result
reproduces the tape's loss and gradients bit for bit on any IEEE host, and on
a GPU for everything except NaN payloads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Mapping, Optional

from ..errors import GradtoolError
from ..ops import format_shape
from ..tape import Tape
from .render import EmitError, EmitScopeError, c_double, rule

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_C_KEYWORDS = frozenset("""
    auto break case char const continue default do double else enum extern float for goto
    if inline int long register restrict return short signed sizeof static struct switch
    typedef union unsigned void volatile while _Bool _Complex _Imaginary
    asm bool catch class delete false friend namespace new operator private protected public
    template this throw true try typename using virtual main
""".split())
# names the function body and the batch wrapper use themselves
_RESERVED = frozenset({"p", "x", "g", "n", "i", "j", "gi", "loss"})


@dataclass(frozen=True)
class Layout:
    """Where each leaf of the emitted function comes from.

    params: node ids of the parameters, p[0], p[1], ... (registration order)
    data:   node ids of the unbound constants, x[0], x[1], ... (registration order)
    binds:  node id -> C expression, for the bound named constants
    loss:   the loss node id
    """

    params: tuple
    data: tuple
    binds: dict
    loss: int


def gt_math_source() -> str:
    """The text of gradtool/csrc/gt_math.h, shipped as package data."""
    return (resources.files("gradtool") / "csrc" / "gt_math.h").read_text(encoding="utf-8")


def _loss_id(tape: Tape, loss) -> int:
    if isinstance(loss, str):
        raise EmitError(f"loss {loss!r} is not a node of this tape ({len(tape.nodes)} nodes)")
    try:
        return tape.var(loss).id        # a live GVar of this tape, or a node id in range
    except GradtoolError as exc:
        raise EmitError(f"loss: {exc}") from None


def check_scope(tape: Tape) -> None:
    """EmitScopeError naming the first node that is not a one-element tensor or scalar op."""
    if not tape.ok:
        raise EmitError(f"the tape is poisoned: {tape.error}")
    for i, node in enumerate(tape.nodes):
        if tape.values[i].size != 1:
            raise EmitScopeError(f"node {i} ({node.op}) has shape {format_shape(tape.values[i].shape)}; emit-cuda "
                                 f"needs every node to be a one-element tensor such as [1]")
        if node.op not in ("param", "const"):
            try:
                rule(node.op)
            except EmitScopeError as exc:
                raise EmitScopeError(f"node {i}: {exc}") from None


def _check_expr(name: str, expr: str) -> str:
    text = expr.strip() if isinstance(expr, str) else ""
    if not text:
        raise EmitError(f"--bind {name}: the C expression is empty")
    bad = next((tok for tok in ("\n", "\r", ";", "{", "}", "#", "//", "/*", "*/") if tok in text),
               None)
    if bad is not None:
        raise EmitError(f"--bind {name}={text!r}: a bound value must be one C expression "
                        f"(found {bad!r})")
    depth = 0
    for ch in text:
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
        if depth < 0:
            break
    if depth != 0:
        raise EmitError(f"--bind {name}={text!r}: unbalanced brackets")
    return text


def layout(tape: Tape, loss, binds: Optional[Mapping[str, str]] = None) -> Layout:
    """The p[j] / x[k] / bound-expression assignment of every leaf (see :class:`Layout`)."""
    li = _loss_id(tape, loss)
    by_name = {n.name: i for i, n in enumerate(tape.nodes) if n.op == "const" and n.name}
    bound = {}
    for name, expr in (binds or {}).items():
        if name not in by_name:
            params = [i for i, n in enumerate(tape.nodes) if n.op == "param" and n.name == name]
            if params:
                raise EmitError(f"--bind {name}: node {params[0]} is a param; only named consts "
                                f"can be bound (parameters are always p[j])")
            names = sorted(by_name)
            known = (", ".join(names[:10]) + (", ..." if len(names) > 10 else "")) or "none"
            raise EmitError(f"--bind {name}: no const named {name!r} (named consts: {known})")
        bound[by_name[name]] = _check_expr(name, expr)
    params = tuple(i for i, n in enumerate(tape.nodes) if n.op == "param")
    data = tuple(i for i, n in enumerate(tape.nodes) if n.op == "const" and i not in bound)
    return Layout(params, data, bound, li)


def _ancestors(tape: Tape, li: int) -> list:
    anc = [False] * (li + 1)
    anc[li] = True
    for i in range(li, -1, -1):
        node = tape.nodes[i]
        if anc[i] and node.a >= 0:
            anc[node.a] = True
            if node.b >= 0:
                anc[node.b] = True
    return anc


def _comment_text(text) -> str:
    """Text safe inside a /* */ comment on one line."""
    out = "".join(ch if 32 <= ord(ch) < 127 else f"\\x{ord(ch):02x}" for ch in str(text))
    return out.replace("*/", "*\\/")


def _leaf_label(tape: Tape, i: int) -> str:
    name = tape.nodes[i].name
    return _comment_text(name) if name else "(unnamed)"


def _header(tape, lay, name, source, n_emitted, kernel) -> list:
    loss_node = tape.nodes[lay.loss]
    up = name.upper()
    lines = [
        "/*",
        f" * {name}: loss and gradient of a gradtool tape, generated by `gradtool emit-cuda`.",
        " * Do not edit: regenerate from the tape.",
        " *",
        f" * Source: {_comment_text(source) if source else '(in-memory tape)'}",
        f" * Tape: {len(tape.nodes)} nodes; loss = node {lay.loss} ({loss_node.op}); "
        f"{n_emitted} nodes emitted (the loss and its ancestors).",
        " *",
        f" *   GT_DEVICE double {name}(const double *p, const double *x, double *g)",
        " * returns the loss and adds dL/dp[j] into g[j] through GT_G_ADD(g, j, v)",
        " * (default g[j] = g[j] + v; predefine GT_G_ADD before this file to change it,",
        " * e.g. to atomicAdd).  GT_DEVICE is __device__ under nvcc, static otherwise.",
        " *",
        " * The loss and every gradient are identical to the bit to the CPU tape",
        " * (`gradtool backward`): every operation is the same separately rounded",
        " * binary64 operation, in the same order, and nothing calls libm.  Compile",
        " * the host build WITHOUT contraction or fast-math:",
        " *   cc -std=c99 -O2 -ffp-contract=off ...      nvcc -c -arch=sm_90 ...",
        " *",
        f" * Parameters p[j], registration order ({up}_N_PARAMS = {len(lay.params)}):",
    ]
    for j, i in enumerate(lay.params):
        lines.append(f" *   p[{j}]  node {i}  {_leaf_label(tape, i)}  "
                     f"(recorded {tape.values[i].item().hex()})")
    lines.append(f" * Data leaves x[k]: the unbound consts, named or not, registration order "
                 f"({up}_N_DATA = {len(lay.data)}):")
    for k, i in enumerate(lay.data):
        lines.append(f" *   x[{k}]  node {i}  {_leaf_label(tape, i)}  "
                     f"(recorded {tape.values[i].item().hex()})")
    if lay.binds:
        lines.append(" * Bound consts:")
        for i, expr in sorted(lay.binds.items()):
            lines.append(f" *   node {i}  {_leaf_label(tape, i)} := {_comment_text(expr)}")
    if kernel:
        lines.append(f" * With nvcc, {name}_batch (end of file) runs one example per thread.")
    lines += [" */", ""]
    return lines


# before gt_math.h, so that it covers the whole file
_GUARDS = """\
/* ---- refuse builds that would change the bits -------------------------- */
#if !defined(__CUDACC__)
#  if defined(__FAST_MATH__)
#    error "gradtool emit-cuda: do not compile with -ffast-math (it reorders and fuses arithmetic)"
#  endif
#  if defined(__FLT_EVAL_METHOD__) && __FLT_EVAL_METHOD__ != 0
#    error "gradtool emit-cuda: doubles must be evaluated in double precision (on 32-bit x86: -msse2 -mfpmath=sse)"
#  endif
#  if defined(__clang__)
#    pragma STDC FP_CONTRACT OFF
#  endif
#endif
"""

_PRELUDE = """\
/* ---- gradtool emit prelude ------------------------------------------- */
#ifndef GRADTOOL_EMIT_PRELUDE
#define GRADTOOL_EMIT_PRELUDE
#ifndef GT_DEVICE
#  if defined(__CUDACC__)
#    define GT_DEVICE __device__
#  else
#    define GT_DEVICE static
#  endif
#endif
/* where a gradient lands; a caller may predefine it (e.g. as atomicAdd) */
#ifndef GT_G_ADD
#  define GT_G_ADD(g, j, v) ((g)[j] = GT_ADD((g)[j], (v)))
#endif
#endif /* GRADTOOL_EMIT_PRELUDE */
"""


def _function(tape, lay, name, anc) -> list:
    nodes, requires, li = tape.nodes, tape.requires, lay.loss
    p_index = {i: j for j, i in enumerate(lay.params)}
    x_index = {i: k for k, i in enumerate(lay.data)}
    body = ["    /* forward, tape order */"]
    used = set()
    for i in range(li + 1):
        if not anc[i]:
            continue
        node = nodes[i]
        if node.op == "param":
            used.add("p")
            body.append(f"    double t{i} = p[{p_index[i]}];  /* param {_leaf_label(tape, i)} */")
        elif node.op == "const" and i in lay.binds:
            body.append(f"    double t{i} = ({lay.binds[i]});  "
                        f"/* const {_leaf_label(tape, i)}, bound */")
        elif node.op == "const":
            used.add("x")
            body.append(f"    double t{i} = x[{x_index[i]}];  /* const {_leaf_label(tape, i)} */")
        else:
            b = f"t{node.b}" if node.b >= 0 else None
            expr = rule(node.op).forward(f"t{node.a}", b, c_double(node.s))
            body.append(f"    double t{i} = {expr};")

    if requires[li]:
        body.append("    /* backward, reverse tape order; dL/d(loss) = 1.0; a fresh slot "
                    "starts at 0.0 */")
        body.append(f"    double g{li} = 1.0;")
    declared = {li}
    for i in range(li, -1, -1):
        node = nodes[i]
        if not (anc[i] and requires[i]) or node.a < 0:
            continue
        b = f"t{node.b}" if node.b >= 0 else None
        ca, cb = rule(node.op).backward(f"g{i}", f"t{node.a}", b, f"t{i}", c_double(node.s))
        for dst, c in ((node.a, ca), (node.b, cb)):
            if dst < 0 or not requires[dst]:
                continue
            if dst in declared:
                body.append(f"    g{dst} = GT_ADD(g{dst}, {c});")
            else:
                declared.add(dst)
                body.append(f"    double g{dst} = GT_ADD(0.0, {c});")

    body.append("    /* dL/dp[j] */")
    for j, i in enumerate(lay.params):
        if i in declared:
            used.add("g")
            body.append(f"    GT_G_ADD(g, {j}, g{i});  /* {_leaf_label(tape, i)} */")
        else:
            body.append(f"    /* p[{j}] {_leaf_label(tape, i)}: the loss does not depend on it */")
    body.append(f"    return t{li};")
    unused = [f"(void){arg};" for arg in ("p", "x", "g") if arg not in used]
    head = [f"GT_DEVICE double {name}(const double *p, const double *x, double *g)", "{"]
    return head + ([("    " + " ".join(unused))] if unused else []) + body + ["}", ""]


def _kernel(name: str) -> list:
    up = name.upper()
    return f"""\
#ifdef __CUDACC__
/* {name}_batch: one thread per example, deterministic (no atomics).
 *   p     {up}_N_PARAMS doubles, shared by every example
 *   x     n rows of {up}_N_DATA doubles, row-major: example i reads x + i*{up}_N_DATA
 *   loss  n doubles: loss[i] is example i's loss
 *   g     n rows of {up}_N_PARAMS doubles: row i is overwritten with dloss[i]/dp
 * Usage:
 *   {name}_batch<<<(n + 255) / 256, 256>>>(d_p, d_x, n, d_loss, d_g);
 * Reduce the gradient rows in a fixed order (e.g. a serial sum over i) if the
 * batch gradient must be reproducible too. */
extern "C" __global__ void {name}_batch(const double *p, const double *x, long long n,
                                       double *loss, double *g)
{{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double *gi = g + i * {up}_N_PARAMS;
    for (int j = 0; j < {up}_N_PARAMS; ++j) gi[j] = 0.0;
    loss[i] = {name}(p, x + i * {up}_N_DATA, gi);
}}
#endif /* __CUDACC__ */
""".splitlines() + [""]


def emit_cuda(tape: Tape, loss, *, binds: Optional[Mapping[str, str]] = None,
              name: str = "gradtool_grad", kernel: bool = False,
              source: Optional[str] = None) -> str:
    """The CUDA-C source of ``loss``'s gradient function (see the module docstring).

    Raises EmitScopeError naming the first node that is not a one-element
    tensor or whose op has no scalar form, and EmitError for a bad name or
    binding.
    """
    if (not isinstance(name, str) or not _IDENT.match(name) or name in _C_KEYWORDS
            or name in _RESERVED or name.startswith(("gt_", "gtm_", "GT_"))
            or re.fullmatch(r"[tg][0-9]+", name)):
        raise EmitError(f"function name {name!r} is not a usable C identifier (a C identifier "
                        f"that is not a keyword, not p/x/g/n/i/j/gi/loss/tN/gN, and not "
                        f"starting with gt_/gtm_/GT_)")
    check_scope(tape)
    lay = layout(tape, loss, binds)
    anc = _ancestors(tape, lay.loss)
    up = name.upper()
    lines = _header(tape, lay, name, source, sum(anc), kernel)
    lines += _GUARDS.splitlines()
    lines.append("")
    lines.append(gt_math_source().rstrip("\n"))
    lines.append("")
    lines += _PRELUDE.splitlines()
    lines += ["", f"#define {up}_N_PARAMS {len(lay.params)}",
              f"#define {up}_N_DATA {len(lay.data)}", ""]
    lines += _function(tape, lay, name, anc)
    if kernel:
        lines += _kernel(name)
    return "\n".join(lines)
