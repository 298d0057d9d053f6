"""Scalar tape -> CUDA-C source: `emit_cuda` and its op renderings (`render`)."""

from .cuda import Layout, emit_cuda, gt_math_source, layout
from .render import EmitError, EmitScopeError

__all__ = ["emit_cuda", "layout", "Layout", "gt_math_source", "EmitError", "EmitScopeError"]
