"""Attributes, the OpSpec record and the table it goes into, and the device kernels'
metadata contracts."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..errors import DtypeError
from ..expr import Expr


LEAF_OPS = ("param", "const")
INT_DTYPE = "i64"                   # a const of integer ids (take's ids)
FLOAT_DTYPES = ("f64", "f32")       # the value dtypes: IEEE binary64 and binary32
DTYPES = FLOAT_DTYPES + (INT_DTYPE,)
NUMPY_DTYPES = {"f64": np.dtype(np.float64), "f32": np.dtype(np.float32),
                INT_DTYPE: np.dtype(np.int64)}
KINDS = ("leaf", "unary", "binary", "reduce", "max", "matmul", "bmm", "transpose", "reshape",
         "softmax", "slice", "concat", "take", "take_along", "permute", "conv2d",
         "max_pool2d", "avg_pool2d", "scatter", "uniform", "cast")
_REQUIRED = object()


@dataclass(frozen=True)
class Attr:
    """One attribute of an op's nodes: in the Tape method's signature, the node's ``aux``
    dict, the tape file's node record and the schema.

    kind ``axis``: one int, negative counting from the end when recording (stored
    normalised, >= 0); ``indices``: one int >= 0 per axis of the input;
    ``perm``: a permutation of the input's axes, one int per axis, negative
    counting from the end when recording (stored normalised, >= 0);
    ``shape``: the node's own shape (a reshape's target), which the file
    already stores as ``shape``; ``flag``: True or False; ``count``: one int
    >= 1 (conv2d's groups); ``natural``: one int in [0, 2^63) (uniform's salt);
    ``dtype``: a float dtype, "f32" or "f64" (cast's target).

    ``default`` is the Tape method's default.  An ``optional`` attribute may
    be absent from a file, meaning ``default``: it is written, and kept in
    the node's ``aux`` dict, only when it differs from the default (so files
    written before it existed read unchanged, and write the same bytes).
    """

    name: str
    kind: str
    doc: str
    default: object = _REQUIRED
    optional: bool = False

    @property
    def stored(self) -> bool:
        """Whether the file's node record carries this attribute under its own key."""
        return self.kind != "shape"

    @property
    def required(self) -> bool:
        """Whether the Tape method needs it (it has no default)."""
        return self.default is _REQUIRED

    @property
    def file_required(self) -> bool:
        """Whether every file node of the op must carry it."""
        return self.stored and not self.optional


@dataclass(frozen=True)
class OpSpec:
    name: str
    kind: str                        # one of KINDS: how the op is lowered and checked
    arity: int                       # number of node inputs (0 for leaves)
    doc: str                         # one line for the docs and the Tape method
    shape: Optional[Callable] = None
    forward: Optional[Callable] = None
    backward: Optional[Callable] = None
    attrs: tuple = ()                # Attr, in the Tape method's argument order
    scalar_operand: bool = False     # reads the node's `s` (adds, muls)
    fwd: Optional[Expr] = None       # elementwise ops: the forward rule
    bwd: tuple = ()                  # elementwise ops: each input's contribution
    scalar: Optional[tuple] = None   # non-elementwise ops with a one-element form: (fwd, bwd)
    domain: str = "real"             # where the rule is smooth: "real" or "positive" (tests)
    kernels: tuple = ()              # non-elementwise ops: the kernels its launches use
    parts: Optional[dict] = None     # elementwise parts of a hand-written kernel (GT_<OP>_<PART>)
    int_inputs: tuple = ()           # inputs ("a", "b") that may read integer data (an i64 const)
    index_bound: Optional[Callable] = None   # (sa, attrs) -> ids must lie in [0, bound)
    id_inputs: tuple = ()            # inputs that must be integer-valued ids (take's "b")
    grad_inputs: tuple = ("a", "b")  # inputs the gradient flows to (none: a comparison)
    integral: str = ""               # "always"/"inputs"/"a"/"a_whole_s": values whole numbers
    fresh_grads: bool = False        # backward returns new arrays without a -0.0 (below)
    rng_input: bool = False          # input a must be the tape's rng slot (uniform)
    dtype_free: tuple = ()           # inputs whose float dtype need not match a's (a mask)
    dtype_rule: Optional[Callable] = None   # (da, db, attrs) -> out dtype; None: infer_dtype

    def grad_to(self, role: str) -> bool:
        """Whether the backward walk gives input ``role`` ("a"/"b") a contribution."""
        return role in self.grad_inputs

    def integral_of(self, a_integral: bool, b_integral: bool = True, s: float = 0.0) -> bool:
        """Whether this op's values are whole numbers, given its inputs' and its scalar
        operand ``s`` (adds, muls: "a_whole_s", a whole number s) (docs/ops.md)."""
        return (self.integral == "always" or (self.integral == "a" and a_integral)
                or (self.integral == "inputs" and a_integral and b_integral)
                or (self.integral == "a_whole_s" and a_integral and math.isfinite(s)
                    and s == math.floor(s)))

    @property
    def elementwise(self) -> bool:
        """out[i] depends only on the inputs' elements at i (after broadcasting)."""
        return self.kind in ("unary", "binary")

    @property
    def rules(self) -> Optional[tuple]:
        """(forward, contributions) as expressions: elementwise ops and one-element forms."""
        if self.elementwise:
            return self.fwd, self.bwd
        return self.scalar


OPS: dict[str, OpSpec] = {}


def _register(spec: OpSpec) -> None:
    assert spec.kind in KINDS and spec.name not in OPS, spec.name
    OPS[spec.name] = spec


def dtype_of(arr) -> str:
    """The gradtool dtype ("f64", "f32", "i64") of a node's numpy value."""
    kind = arr.dtype
    if kind == np.float32:
        return "f32"
    return INT_DTYPE if kind == np.int64 else "f64"


def infer_dtype(opname: str, da: str, db: Optional[str], attrs=None) -> str:
    """The op's output dtype from its inputs' (the dtype rule beside the shape rule: the
    recorder and the file loader both use it, so no value is computed to learn a dtype).

    Every input read as values (not ids: take's b; not a mask: keep's b) that holds
    floats must have ONE float dtype, which the output has; integer data (an i64 const)
    is read as exact float64, so an op of integer data only gives f64.  A mix of f32
    and f64 raises :class:`~gradtool.errors.DtypeError`, never a silent promotion.
    An op with a ``dtype_rule`` (cast, to_f64) says its own."""
    spec = OPS[opname]
    if spec.dtype_rule is not None:
        return spec.dtype_rule(da, db, attrs)
    floats = [(role, d) for role, d in (("a", da), ("b", db))
              if d is not None and d != INT_DTYPE and role not in spec.id_inputs
              and role not in spec.dtype_free]
    if len(floats) == 2 and floats[0][1] != floats[1][1]:
        raise DtypeError(f"input a is {da} and input b is {db}; {opname} takes inputs of one "
                         f"float dtype (gradtool never promotes: convert one with "
                         f"tape.cast(x, 'f32') or tape.cast(x, 'f64'))")
    if floats:
        return floats[0][1]
    return "f64"


def format_shape(shape) -> str:
    """[2,3]: how every message in gradtool writes a shape."""
    return "[" + ",".join(map(str, shape)) + "]"


def attr(attrs, name: str, default=None):
    """An attribute from a node's aux dict; an optional one at its default is absent."""
    return default if not attrs else attrs.get(name, default)


def first_bad_id(ids: np.ndarray, bound: int) -> Optional[int]:
    """The flat (row-major) index of the first id outside [0, bound), None when there is
    none.  Ids computed on the tape are float64 whole numbers: a fraction, an infinity or
    a NaN is a bad id too."""
    flat = np.ravel(ids)
    if flat.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(~((flat >= 0) & (flat < bound) & (flat == np.floor(flat))))
    else:
        bad = np.flatnonzero((flat < 0) | (flat >= bound))
    return int(bad[0]) if bad.size else None


def bad_id(ids: np.ndarray, bound: int) -> Optional[str]:
    """None when every id lies in [0, bound); else what the first bad one
    (:func:`first_bad_id`) is and where."""
    k = first_bad_id(ids, bound)
    if k is None:
        return None
    flat = np.ravel(ids)
    where = list(np.unravel_index(k, np.shape(ids)))
    v = flat[k]
    whole = flat.dtype.kind in "iu" or (math.isfinite(v) and v == math.floor(v))
    fraction = not whole and math.isfinite(v)
    return (f"id {int(v) if whole else repr(float(v))} at position {[int(k) for k in where]} "
            + ("is not a whole number" if fraction else f"is outside [0, {bound})"))


EXACT_INT = 2 ** 53     # every integer of at most this magnitude is exact in a float64


def inexact_int(values: np.ndarray, limit: int = EXACT_INT) -> Optional[str]:
    """None when every integer in ``values`` converts exactly (|v| <= limit); else what
    the first one that does not is and where (integer data read as float64 values)."""
    flat = np.ravel(values)
    big = np.flatnonzero((flat > limit) | (flat < -limit))
    if not big.size:
        return None
    where = [int(k) for k in np.unravel_index(int(big[0]), np.shape(values))]
    return (f"integer {int(flat[big[0]])} at position {where} is beyond +-{limit}, where "
            f"floating-point values stop being exact")


def as_ids(b: np.ndarray) -> np.ndarray:
    """Ids as int64 for numpy's gathers: an i64 const as it is, computed (float64,
    checked whole and in range by the caller) ids converted exactly."""
    return b if b.dtype.kind in "iu" else b.astype(np.int64)


# ── device kernels: the metadata contract of every kernel, by field name ────
#
# A launch is (kernel, int64 metadata block).  M[0] is always the number of
# thread indices; the fields below follow in order.  Field kinds: ``w`` an
# arena offset the kernel writes (a gt_real pointer), ``r`` one it only
# reads, ``i`` an int, ``f`` a float64 stored as its bit pattern, ``i[c]`` an
# int array whose length is the int field ``c``.  codegen turns each
# declaration into a C decoder macro ``GT_ARGS_<kernel>``; the device
# program packs a block with :func:`pack` by field name.

@dataclass(frozen=True)
class KernelSpec:
    name: str
    fields: tuple          # (name, kind) pairs, after M[0]
    doc: str

    def field_names(self) -> list:
        return [f for f, _ in self.fields]


KERNELS: dict[str, KernelSpec] = {}


def kernel(name: str, fields: str, doc: str) -> KernelSpec:
    """Declare a kernel's metadata fields: ``"out:w a:r len:i dims:i[nd]"``."""
    spec = _spec(name, fields, doc)
    assert name not in KERNELS, name
    KERNELS[name] = spec
    return spec


def f64_bits(x: float) -> int:
    """The IEEE-754 bit pattern of a float64, as the signed int64 a metadata slot holds."""
    return int(np.array([float(x)], dtype=np.float64).view(np.int64)[0])


def f64_from_bits(bits: int) -> float:
    """The float64 a metadata slot's bit pattern stands for (the inverse of f64_bits)."""
    return float(np.array([bits], dtype=np.int64).view(np.float64)[0])


def pack(kernel_name: str, threads: int, /, **values) -> tuple:
    """The metadata block of one launch: M[0] = threads, then every declared field by name.

    An array field's length field is filled in from the array (and must agree
    between arrays sharing it); float fields take Python floats (packed as
    bit patterns).  A missing or unknown field is an error.
    """
    spec = contract(kernel_name)
    counts = {}
    for fname, kind in spec.fields:
        if kind.startswith("i["):
            count = kind[2:-1]
            length = len(values[fname])
            if counts.setdefault(count, length) != length:
                raise ValueError(f"{kernel_name}: arrays sharing {count} differ in length")
    block = [int(threads)]
    for fname, kind in spec.fields:
        if fname in counts:
            if fname in values and values[fname] != counts[fname]:
                raise ValueError(f"{kernel_name}: {fname} disagrees with its arrays")
            block.append(counts[fname])
        elif kind.startswith("i["):
            block.extend(int(v) for v in values[fname])
        elif kind == "f":
            block.append(f64_bits(values[fname]))
        else:
            block.append(int(values[fname]))
    unknown = set(values) - set(spec.field_names())
    if unknown:
        raise ValueError(f"{kernel_name}: unknown fields {sorted(unknown)}")
    return tuple(block)


def _spec(name: str, fields: str, doc: str) -> KernelSpec:
    return KernelSpec(name, tuple(tuple(f.split(":")) for f in fields.split()), doc)


# the elementwise families: one contract each (decoder GT_ARGS_<family>), one kernel per op
# and direction (and per input, backward of a binary op)
FAMILIES = {
    "UNARY_FWD": _spec("UNARY_FWD", "out:w a:r s:f", "every unary forward kernel"),
    "UNARY_BWD": _spec("UNARY_BWD", "ga:w g:r a:r t:r s:f", "every unary backward kernel"),
    "BINARY_FWD": _spec("BINARY_FWD", "out:w a:r b:r nd:i dims:i[nd] sa:i[nd] sb:i[nd]",
                        "every broadcasting binary forward kernel (strides 0 where an input "
                        "broadcasts)"),
    "BINARY_BWD": _spec("BINARY_BWD",
                        "ga:w g:r a:r b:r t:r nk:i kd:i[nk] kg:i[nk] ka:i[nk] kb:i[nk] "
                        "nb:i bd:i[nb] bg:i[nb] ba:i[nb] bb:i[nb] scratch:i",
                        "every broadcasting binary backward kernel: kept dims (k*) and "
                        "broadcast dims (b*) of the out index space"),
}


def kernel_names(spec: OpSpec) -> tuple:
    """The kernels an op's launches use (forward, then backward)."""
    if spec.kind == "unary":          # no backward kernel where no gradient flows (detach)
        return (f"k_{spec.name}",) + ((f"k_{spec.name}_bwd",) if spec.grad_to("a") else ())
    if spec.kind == "binary":         # a backward kernel per input the gradient flows to
        return (f"k_{spec.name}",) + tuple(f"k_{spec.name}_bwd_{side}" for side in "ab"
                                           if spec.grad_to(side))
    return spec.kernels


def contract(kernel_name: str) -> KernelSpec:
    """The metadata contract of any kernel: declared, or its elementwise family's."""
    spec = KERNELS.get(kernel_name) or _family_of().get(kernel_name)
    if spec is None:
        raise KeyError(f"no kernel {kernel_name!r} in the op table")
    return spec


@functools.lru_cache(maxsize=1)
def _family_of() -> dict:
    """Every elementwise op's kernel name -> its family's contract (built once, on first
    use, when the table is complete)."""
    out = {}
    for spec in OPS.values():
        if spec.elementwise:
            prefix = "UNARY_" if spec.kind == "unary" else "BINARY_"
            for k in kernel_names(spec):
                out[k] = FAMILIES[prefix + ("FWD" if k == f"k_{spec.name}" else "BWD")]
    return out
