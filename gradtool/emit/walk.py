"""The walk every emitted ABI shares: scope, leaf layout, forward and backward statements.

An ABI module (:mod:`.cuda` for gradtool's own function, :mod:`.swarm` for
swarm-mcp's ``compute_iterate``) chooses the signature, where each leaf's
value comes from and the epilogue; the statements in between come from
here, and each op's C from :mod:`.render`.

Leaves (:func:`layout`):

* a chosen param is ``p[j]``, in registration order or in the order of
  ``params``; a param that is not chosen is FROZEN;
* a named const in ``binds`` is the caller's C expression;
* every other const is ``x[k]`` (the gradtool ABI's data slots, in
  registration order) or, with ``freeze_consts``, FROZEN;
* a frozen leaf is its recorded value as an exact C literal
  (:func:`.render.c_double`: a C99 hex float, or the bits of an inf/NaN).

Statements (:func:`statements`): ``double tN = <forward>;`` for the loss and
its ancestors in tape order (for a function that returns no loss, only the
values the gradient reads), then the backward walk of
:meth:`gradtool.tape.Tape.backward` restricted to the chosen params
(:func:`gradtool.tape.requires_wrt`, :func:`gradtool.tape.reach`): the loss
seeded with 1.0, nodes in reverse id order, each contribution added into
its input's slot as ``slot = slot + c`` (a fresh slot starting at 0.0), input
a before input b.  A branch that depends only on consts or on params that
are not chosen gets no backward statement.  Since a node that depends on a
chosen param passes that dependence to every consumer, restricting the walk
changes no chosen param's gradient: they equal the full walk's to the bit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Mapping, Optional, Sequence

import numpy as np

from ..errors import GradtoolError
from ..ops import OPS, format_shape
from ..tape import GVar, Tape, f32_refusal, reach, requires_wrt
from .render import EmitError, EmitScopeError, c_double, rule

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
C_KEYWORDS = frozenset("""
    auto break case char const continue default do double else enum extern float for goto
    if inline int long register restrict return short signed sizeof static struct switch
    typedef union unsigned void volatile while _Bool _Complex _Imaginary
    asm bool catch class delete false friend namespace new operator private protected public
    template this throw true try typename using virtual main
""".split())


@dataclass(frozen=True)
class Layout:
    """Where each leaf of the emitted function comes from.

    params: node ids of the chosen parameters, p[0], p[1], ...
    data:   node ids of the unbound consts read from x[0], x[1], ... (gradtool ABI)
    binds:  node id -> C expression, for the bound named consts
    loss:   the loss node id
    frozen: node id -> exact C literal of the recorded value, for the frozen leaves
            (params not chosen; with freeze_consts, the unbound consts)
    """

    params: tuple
    data: tuple
    binds: dict
    loss: int
    frozen: dict = field(default_factory=dict)


def gt_math_source() -> str:
    """The text of gradtool/csrc/gt_math.h, shipped as package data."""
    return (resources.files("gradtool") / "csrc" / "gt_math.h").read_text(encoding="utf-8")


def check_identifier(what: str, name, reserved=()) -> str:
    """``name`` if it is a C identifier the emitted code can use, else EmitError."""
    if (not isinstance(name, str) or not _IDENT.match(name) or name in C_KEYWORDS
            or name in reserved or name.startswith(("gt_", "gtm_", "GT_"))
            or re.fullmatch(r"[tg][0-9]+", name)):
        taken = "/".join(sorted(reserved))
        raise EmitError(f"{what} {name!r} is not a usable C identifier (a C identifier that "
                        f"is not a keyword, not {taken + '/' if taken else ''}tN/gN, and not "
                        f"starting with gt_/gtm_/GT_)")
    return name


def loss_id(tape: Tape, loss) -> int:
    if isinstance(loss, str):
        raise EmitError(f"loss {loss!r} is not a node of this tape ({len(tape.nodes)} nodes)")
    try:
        return tape.var(loss).id        # a live GVar of this tape, or a node id in range
    except GradtoolError as exc:
        raise EmitError(f"loss: {exc}") from None


def float_dtype(tape: Tape) -> str:
    """The emitted code's float type: "f32" (``float``) when the tape's float values are
    float32, else "f64" (``double``); EmitError for a tape holding both."""
    first = {}
    for i, value in enumerate(tape.values):
        if value.dtype in (np.float32, np.float64):
            first.setdefault("f32" if value.dtype == np.float32 else "f64", i)
    if len(first) > 1:
        raise EmitError(f"node {first['f32']}: holds float32 values and node {first['f64']} "
                        f"float64 values; emit-cuda emits one float type per tape")
    return next(iter(first), "f64")


# per float type: the C type, the add macro, the literals 0 and 1
CTYPES = {"f64": ("double", "GT_ADD", "0.0", "1.0"),
          "f32": ("float", "GT_FADD", "0.0f", "1.0f")}


def check_scope(tape: Tape, abi: str = "gradtool") -> None:
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
    if float_dtype(tape) == "f32" and abi != "gradtool":       # (a mixed tape: EmitError)
        refusal = f32_refusal(tape, f"emit-cuda's {abi} ABI")
        if refusal:
            raise EmitError(refusal)


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


def _bound(tape: Tape, binds) -> dict:
    by_name = {n.name: i for i, n in enumerate(tape.nodes) if n.op == "const" and n.name}
    bound = {}
    for name, expr in (binds or {}).items():
        if name not in by_name:
            params = [i for i, n in enumerate(tape.nodes) if n.op == "param" and n.name == name]
            if params:
                raise EmitError(f"--bind {name}: node {params[0]} is a param; only named consts "
                                f"can be bound (parameters are p[j], or frozen)")
            names = sorted(by_name)
            known = (", ".join(names[:10]) + (", ..." if len(names) > 10 else "")) or "none"
            raise EmitError(f"--bind {name}: no const named {name!r} (named consts: {known})")
        bound[by_name[name]] = _check_expr(name, expr)
    return bound


def _param_id(tape: Tape, spec) -> int:
    """The node id of the param ``spec`` names: a GVar, a node id, a name, or ``node<ID>``."""
    nodes = tape.nodes
    if isinstance(spec, GVar):
        try:
            i = tape.node_id(spec, "--params")     # live, of this tape
        except GradtoolError as exc:
            raise EmitError(str(exc)) from None
        label = f"node{i}"
    elif isinstance(spec, int) and not isinstance(spec, bool):
        i, label = spec, f"node{spec}"
    elif isinstance(spec, str):
        label = spec
        named = [k for k, n in enumerate(nodes) if n.name == spec]
        match = re.fullmatch(r"node([0-9]+)", spec)
        if named:
            i = named[0]
        elif match:
            i = int(match.group(1))
        else:
            names = [n.name for n in nodes if n.op == "param" and n.name]
            known = (", ".join(names[:10]) + (", ..." if len(names) > 10 else "")) or "none"
            raise EmitError(f"--params {spec}: no param named {spec!r} (named params: {known}; "
                            f"node<ID> names any param)")
    else:
        raise EmitError(f"--params: expected a param name, node id or GVar, got "
                        f"{type(spec).__name__}")
    if not 0 <= i < len(nodes):
        raise EmitError(f"--params {label}: no node {i} (the tape has {len(nodes)} nodes)")
    if nodes[i].op != "param":
        raise EmitError(f"--params {label}: node {i} is a {nodes[i].op}, not a param")
    return i


def _chosen(tape: Tape, params) -> tuple:
    if params is None:
        return tuple(i for i, n in enumerate(tape.nodes) if n.op == "param")
    if isinstance(params, (str, GVar)) or not isinstance(params, Sequence):
        raise EmitError(f"--params: expected a list of params, got {type(params).__name__}")
    chosen = []
    for spec in params:
        i = _param_id(tape, spec)
        if i in chosen:
            raise EmitError(f"--params {spec if isinstance(spec, str) else f'node{i}'}: "
                            f"param node {i} is named twice")
        chosen.append(i)
    return tuple(chosen)


def layout(tape: Tape, loss, binds: Optional[Mapping[str, str]] = None, params=None,
           freeze_consts: bool = False) -> Layout:
    """The p[j] / x[k] / bound / frozen assignment of every leaf (see :class:`Layout`)."""
    li = loss_id(tape, loss)
    bound = _bound(tape, binds)
    chosen = _chosen(tape, params)
    frozen = {i: c_double(float(tape.values[i].item())) for i, n in enumerate(tape.nodes)
              if (n.op == "param" and i not in chosen)
              or (freeze_consts and n.op == "const" and i not in bound)}
    data = tuple(i for i, n in enumerate(tape.nodes)
                 if n.op == "const" and i not in bound and i not in frozen)
    return Layout(chosen, data, bound, li, frozen)


def ancestors(tape: Tape, li: int) -> list:
    """Which nodes the forward pass of node ``li`` needs: ``li`` and its ancestors."""
    anc = [False] * (li + 1)
    anc[li] = True
    for i in range(li, -1, -1):
        node = tape.nodes[i]
        if anc[i] and node.a >= 0:
            anc[node.a] = True
            if node.b >= 0:
                anc[node.b] = True
    return anc


def comment_text(text) -> str:
    """Text safe inside a /* */ comment on one line."""
    out = "".join(ch if 32 <= ord(ch) < 127 else f"\\x{ord(ch):02x}" for ch in str(text))
    return out.replace("*/", "*\\/")


def leaf_label(tape: Tape, i: int) -> str:
    name = tape.nodes[i].name
    return comment_text(name) if name else "(unnamed)"


@dataclass
class Body:
    """The statements of one emitted function.

    forward, backward: C statements (indented lines)
    grad:    chosen param node id -> its gradient slot ``gN``, or None where the
             loss does not depend on it (backward never reaches it)
    uses:    which of the arrays ``p``/``x`` the forward statements read
    emitted: how many nodes the forward pass computes
    bound:   the bound expressions the forward statements read (a bound const
             the loss does not depend on is not emitted)
    """

    forward: list
    backward: list
    grad: dict
    uses: set
    emitted: int
    bound: list


def statements(tape: Tape, lay: Layout, loss_value: bool = True) -> Body:
    """Forward and backward statements of ``lay.loss`` (see the module docstring).

    With ``loss_value=False`` (a function that does not return the loss) the forward
    pass computes only the values the backward statements read, and what those need.
    """
    nodes, li = tape.nodes, lay.loss
    dtype = float_dtype(tape)
    ctype, add, zero, one = CTYPES[dtype]

    def scalar(i: int) -> str:          # node i's scalar operand, rounded as its dtype does
        lit = c_double(nodes[i].s)
        return f"((float){lit})" if dtype == "f32" else lit

    anc = ancestors(tape, li)
    p_index = {i: j for j, i in enumerate(lay.params)}
    x_index = {i: k for k, i in enumerate(lay.data)}
    requires = requires_wrt(tape, lay.params)
    reached = reach(tape, li, requires)
    backward = []
    if requires[li]:
        backward.append("    /* backward, reverse tape order; dL/d(loss) = 1.0; a fresh slot "
                        "starts at 0.0 */")
        backward.append(f"    {ctype} g{li} = {one};")
    declared = {li} if requires[li] else set()
    for i in range(li, -1, -1):
        node = nodes[i]
        if not (reached[i] and requires[i]) or node.a < 0:
            continue
        b = f"t{node.b}" if node.b >= 0 else None
        ca, cb = rule(node.op, dtype).backward(f"g{i}", f"t{node.a}", b, f"t{i}", scalar(i))
        for role, dst, c in (("a", node.a, ca), ("b", node.b, cb)):
            if dst < 0 or not requires[dst] or not OPS[node.op].grad_to(role):
                continue
            if dst in declared:
                backward.append(f"    g{dst} = {add}(g{dst}, {c});")
            else:
                declared.add(dst)
                backward.append(f"    {ctype} g{dst} = {add}({zero}, {c});")

    if loss_value:
        live = anc
        forward = ["    /* forward, tape order */"]
    else:
        live = [False] * (li + 1)
        for m in re.findall(r"\bt([0-9]+)\b", "\n".join(backward)):
            live[int(m)] = True
        for i in range(li, -1, -1):
            if live[i] and nodes[i].a >= 0:
                live[nodes[i].a] = True
                if nodes[i].b >= 0:
                    live[nodes[i].b] = True
        forward = ["    /* forward, tape order: the values the gradient reads */"]
    uses, bound = set(), []
    for i in range(li + 1):
        if not live[i]:
            continue
        node = nodes[i]
        if i in p_index:
            uses.add("p")
            forward.append(f"    {ctype} t{i} = p[{p_index[i]}];  /* param {leaf_label(tape, i)} */")
        elif i in lay.binds:
            bound.append(lay.binds[i])
            forward.append(f"    {ctype} t{i} = ({lay.binds[i]});  "
                           f"/* const {leaf_label(tape, i)}, bound */")
        elif i in x_index:
            uses.add("x")
            forward.append(f"    {ctype} t{i} = x[{x_index[i]}];  /* const {leaf_label(tape, i)} */")
        elif i in lay.frozen:
            forward.append(f"    {ctype} t{i} = {lay.frozen[i]};  "
                           f"/* {node.op} {leaf_label(tape, i)}, frozen */")
        else:
            b = f"t{node.b}" if node.b >= 0 else None
            expr = rule(node.op, dtype).forward(f"t{node.a}", b, scalar(i))
            forward.append(f"    {ctype} t{i} = {expr};")

    grad = {i: (f"g{i}" if i in declared else None) for i in lay.params}
    return Body(forward, backward, grad, uses, sum(live), bound)


def leaf_table(tape: Tape, lay: Layout, data_title: Optional[str] = None) -> list:
    """Header comment lines listing p[j], then (under ``data_title``) x[k], then the
    bound and the frozen leaves."""
    lines = []
    for j, i in enumerate(lay.params):
        lines.append(f" *   p[{j}]  node {i}  {leaf_label(tape, i)}  "
                     f"(recorded {float(tape.values[i].item()).hex()})")
    if data_title is not None:
        lines.append(f" * {data_title}")
        for k, i in enumerate(lay.data):
            lines.append(f" *   x[{k}]  node {i}  {leaf_label(tape, i)}  "
                         f"(recorded {float(tape.values[i].item()).hex()})")
    if lay.binds:
        lines.append(" * Bound consts:")
        for i, expr in sorted(lay.binds.items()):
            lines.append(f" *   node {i}  {leaf_label(tape, i)} := {comment_text(expr)}")
    if lay.frozen:
        lines.append(" * Frozen leaves (their recorded value, inlined exactly):")
        for i, lit in sorted(lay.frozen.items()):
            lines.append(f" *   node {i}  {tape.nodes[i].op} {leaf_label(tape, i)} = {lit}")
    return lines


def tape_lines(tape: Tape, lay: Layout, source, emitted: int,
               which: str = "the loss and its ancestors") -> list:
    """The header comment's source and tape-summary lines."""
    return [
        f" * Source: {comment_text(source) if source else '(in-memory tape)'}",
        f" * Tape: {len(tape.nodes)} nodes; loss = node {lay.loss} ({tape.nodes[lay.loss].op}); "
        f"{emitted} nodes emitted ({which}).",
    ]


# before gt_math.h, so that it covers the whole file
GUARDS = """\
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


# after gt_real32.h (an f32 tape): the binary32 operations its GT_FADD has no twin of
FLOAT_OPS = """\
/* ---- binary32 operations that cannot be contracted (an f32 tape) -------- */
#ifndef GT_FSUB
#  if defined(__CUDACC__)
#    define GT_FSUB(a, b) __fsub_rn((a), (b))
#    define GT_FMUL(a, b) __fmul_rn((a), (b))
#    define GT_FDIV(a, b) __fdiv_rn((a), (b))
#    define GT_FSQRT(a) __fsqrt_rn((a))
#  else
#    define GT_FSUB(a, b) ((a) - (b))
#    define GT_FMUL(a, b) ((a) * (b))
#    define GT_FDIV(a, b) ((a) / (b))
#    define GT_FSQRT(a) sqrtf((a))
#  endif
#endif
/* fmod is exact: the float64 remainder of the widened operands is a float */
#define GT_FMODF(x, y) ((float)gt_fmod((double)(x), (double)(y)))
"""


def gt_real32_source() -> str:
    """gradtool/csrc/gt_real32.h without its #include of gt_math.h (inlined above it)."""
    text = (resources.files("gradtool") / "csrc" / "gt_real32.h").read_text(encoding="utf-8")
    return "\n".join(line for line in text.splitlines()
                     if line.strip() != '#include "gt_math.h"')


def preamble(dtype: str = "f64") -> list:
    """The build guards and gt_math.h, verbatim: what every emitted file starts with; for
    an f32 tape (``dtype`` "f32") also gt_real32.h (fmaf, gt_expf ...) and the binary32
    operation macros."""
    out = GUARDS.splitlines() + ["", gt_math_source().rstrip("\n"), ""]
    if dtype == "f32":
        out += [gt_real32_source().rstrip("\n"), "", *FLOAT_OPS.splitlines(), ""]
    return out
