"""Scalar tape -> CUDA-C source: `emit_cuda` (one module per ABI: `cuda` for gradtool's
own, `swarm` for swarm-mcp's compute_iterate), their shared walk (`walk`) and the op
renderings (`render`)."""

from .cuda import ABIS, emit_cuda
from .render import EmitError, EmitScopeError
from .walk import Layout, gt_math_source, layout

__all__ = ["emit_cuda", "ABIS", "layout", "Layout", "gt_math_source", "EmitError",
           "EmitScopeError"]
