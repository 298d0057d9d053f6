"""The op table: the one place that says what every op is.

Each entry (:class:`OpSpec`) gives the op's name (the Tape method and the
tape file's ``op``), its arity, its attributes (:class:`Attr`), a shape rule
(used both when recording and when loading a file, so a bad file is rejected
before any arithmetic or allocation), and its rules:

* an **elementwise** op (kind ``unary``: same shape, or ``binary``: numpy
  broadcasting) states its forward rule and, right under it, each input's
  backward contribution as ONE expression each (:mod:`gradtool.expr`) over
  ``x``/``y`` (the inputs), ``s`` (the scalar operand), ``t`` (the output)
  and ``g`` (the output's gradient).  Those expressions are evaluated by
  numpy for the CPU reference and rendered to C for the device kernels (host
  and CUDA) and for the emitter: every layer runs the same rule by
  construction;
* every other op keeps a hand-written numpy rule here (its order documented
  in :mod:`gradtool.numerics`) and a hand-written kernel in
  ``gradtool/csrc/kernels.cu`` whose launches and metadata fields are
  declared by name right next to the entry (:data:`KERNELS`); the C
  decoders of those fields are generated from the declaration, and
  ``gradtool/device/lowering.py`` packs them by name.  Where such an op has
  elementwise parts (softmax) or a one-element form for the emitter (sum,
  mean), those are expressions in the entry too.

Everything else is generated from this table: the Tape's recording methods,
the file writer's node records and the loader's attribute checks, the JSON
Schema (``gradtool/schemas/tape.schema.json``), ``gradtool/csrc/gt_ops.h``
(elementwise kernels, field decoders, the kernel list), the emitter's scalar
rules, the device program's lowering, and the op reference ``docs/ops.md``.
``python -m gradtool.codegen`` regenerates the committed files; a test fails
when they are stale.  docs/ops.md ("Adding an op") lists what to write.

The package: :mod:`~gradtool.ops.spec` (the records: :class:`Attr`, :class:`OpSpec`,
the table :data:`OPS`, the kernels' metadata contracts :data:`KERNELS`),
:mod:`~gradtool.ops.shapes` (the shape rules), then the table itself by family, in
the order the ops are registered: :mod:`~gradtool.ops.elementwise`,
:mod:`~gradtool.ops.reductions`, :mod:`~gradtool.ops.products`,
:mod:`~gradtool.ops.movement`, :mod:`~gradtool.ops.masks`,
:mod:`~gradtool.ops.conv`, :mod:`~gradtool.ops.random`; this module adds the engine's own kernels.

Conventions for the hand-written numpy rules
--------------------------------------------
shape(sa, sb, attrs) -> tuple      sa/sb are input shapes (None if absent).
                                   Raises ShapeError with a message naming
                                   the shapes; the caller adds the node id.
forward(a, b, s, attrs) -> array   a/b are input values, s the scalar operand.
backward(g, a, b, t, s, attrs, need_a, need_b) -> (ca, cb)
                                   g is dL/d(out), t the out value.  Returns the
                                   contribution to each input's gradient,
                                   already in that input's shape (None where
                                   not needed).  The tape adds it into the
                                   input's gradient slot: ``grad = grad + c``.
                                   A negated contribution (sub, div, neg) is
                                   exactly a subtraction, since x + (-y) is
                                   x - y in IEEE arithmetic.
"""

from __future__ import annotations

from .. import numerics, numerics32

# the float32 contract's orders: numerics routes float32 arrays to numerics32 (which reads
# numerics, so it is installed here rather than imported there)
numerics.use_f32_orders(numerics32)

# the families register their ops in import order: that order is the table's (OP_NAMES,
# the generated files, docs/ops.md)
from . import elementwise, reductions, products, movement, masks, conv, random  # noqa: F401
from .movement import LOG_SOFTMAX_PARTS, SOFTMAX_PARTS
from .random import RNG_NAME, RNG_RECORDED, bad_rng
from .shapes import broadcast_shape
from .spec import (DTYPES, EXACT_INT, FAMILIES, FLOAT_DTYPES, INT_DTYPE, KERNELS, LEAF_OPS,
                   NUMPY_DTYPES, OPS, Attr, KernelSpec, OpSpec, as_ids, attr, bad_id, contract,
                   dtype_of, f64_bits, f64_from_bits, first_bad_id, format_shape, inexact_int,
                   infer_dtype, kernel, kernel_names, pack)

# ── kernels of the engine that belong to no op ─────────────────────────────

kernel("k_fill", "dst:w value:f", "dst[i] = value")
kernel("k_from_f64", "dst:w src:r",
       "dst[i] = the float64 at src[i] (a staging area) rounded to gt_real: f32 uploads")
kernel("k_guard", "ctl:w loss:r", "ctl[3] = 1 when the loss is finite, else 0")
kernel("k_clip_norm", "ctl:w clip:f np:i offs:i[np] lens:i[np]",
       "norm of every active gradient (offs[p], lens[p] elements), the clip scale into ctl")
kernel("k_opt", "w:w g:r s0:w s1:w s2:w ctl:r use_clip:i l2:f var:i",
       "one param's update after clip and L2: the optimizer table's variant var "
       "(gt_optim_table.h), slots s0..s2 (w's offset where unused), scalars ctl[4:]")


OP_NAMES = tuple(OPS)
# the ops that read integer data (an i64 const), for messages
INTEGER_READERS = "integer data is read by " + ", ".join(
    n for n, spec in OPS.items() if spec.int_inputs)


def infer_shape(opname: str, sa, sb, attrs) -> tuple:
    """The op's output shape, or ShapeError.  No arithmetic, no allocation."""
    return tuple(map(int, OPS[opname].shape(sa, sb, attrs)))


__all__ = ["OPS", "OP_NAMES", "OpSpec", "Attr", "LEAF_OPS", "KERNELS", "FAMILIES", "KernelSpec",
           "contract", "pack", "attr", "bad_id", "first_bad_id", "as_ids", "inexact_int",
           "EXACT_INT", "INT_DTYPE", "INTEGER_READERS", "FLOAT_DTYPES", "DTYPES", "NUMPY_DTYPES",
           "dtype_of", "infer_dtype",
           "kernel_names", "f64_bits", "f64_from_bits", "infer_shape", "broadcast_shape",
           "format_shape",
           "SOFTMAX_PARTS", "LOG_SOFTMAX_PARTS", "RNG_NAME", "RNG_RECORDED", "bad_rng"]
