"""The op table's rules rendered as kernel C: what the runtime renders too.

:mod:`gradtool.expr` renders one expression tree in a dialect; this module fixes
how the kernel families of ``kernels.cu`` name the per-element operands and how a
metadata field is declared, so that the generated header (``gt_ops.h``, written at
build time by :mod:`gradtool.codegen`) and the fused kernels generated at run time
(:mod:`gradtool.device.fusion`) spell every rule and field the same way, from one
place.  Nothing here writes files or imports the generator.
"""

from __future__ import annotations

from . import expr as E
from .ops import OPS, kernel_names

# how the kernel families name the per-element operands (kernels.cu)
UNARY_FWD_ENV = {"x": "xv", "s": "s"}
UNARY_BWD_ENV = {"g": "gv", "x": "xv", "t": "tv", "s": "s"}
BINARY_FWD_ENV = {"x": "xv", "y": "yv"}
BINARY_BWD_ENV = {"g": "gv", "x": "xv", "y": "yv", "t": "tv"}


def kernel_c(e, env) -> str:
    """Expression ``e`` as the device kernels' C (``R_*`` macros), symbols named by ``env``."""
    return E.render(e, E.KERNEL, env)


_ENVS = {"UNARY_FWD": UNARY_FWD_ENV, "UNARY_BWD": UNARY_BWD_ENV,
         "BINARY_FWD": BINARY_FWD_ENV, "BINARY_BWD": BINARY_BWD_ENV}


def elementwise_rule(kernel_name: str) -> tuple:
    """(family, C expression) of one elementwise kernel: the table's rule rendered exactly
    as gt_ops.h renders it for that kernel (the fusion pass expands the family's body,
    gt_bodies.h, with this text)."""
    for spec in OPS.values():
        if not spec.elementwise:
            continue
        prefix = "UNARY_" if spec.kind == "unary" else "BINARY_"
        rules = {f"k_{spec.name}": spec.fwd, f"k_{spec.name}_bwd": spec.bwd[0],
                 **{f"k_{spec.name}_bwd_{side}": e for side, e in zip("ab", spec.bwd)}}
        if kernel_name in kernel_names(spec):
            family = prefix + ("FWD" if kernel_name == f"k_{spec.name}" else "BWD")
            return family, kernel_c(rules[kernel_name], _ENVS[family])
    raise KeyError(f"{kernel_name!r} is not an elementwise kernel")


_SCALAR_TYPES = {"w": "gt_real *GT_RESTRICT", "r": "const gt_real *GT_RESTRICT",
                 "i": "const long long", "f": "const gt_real"}


def field_declaration(name: str, kind: str, value: str) -> str:
    """The C declaration of one scalar metadata field (kinds w, r, i, f) whose value is the
    C expression ``value`` (an arena offset for w/r): shared by the GT_ARGS decoders and
    the fused kernels' constant declarations (gradtool/device/fusion.py)."""
    if kind not in _SCALAR_TYPES:
        raise ValueError(f"{name}: unknown field kind {kind!r}")
    init = f"W + {value}" if kind in ("w", "r") else value
    return f"{_SCALAR_TYPES[kind]} {name} = {init};"


__all__ = ["elementwise_rule", "field_declaration", "kernel_c", "UNARY_FWD_ENV",
           "UNARY_BWD_ENV", "BINARY_FWD_ENV", "BINARY_BWD_ENV"]
