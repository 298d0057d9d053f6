"""The recorder environment the mapping table's entries use: argument lifting (numbers,
folded tensors, complex pairs, ids) and shapes.  It records nothing of its own accord:
every op it puts on the tape is one an entry asked for."""

from __future__ import annotations

import math

import numpy as np

from ...tape import GVar
from .complex import COMPLEX_ONLY, Complex
from .registry import Unsupported


def dtype_kind(dtype) -> str:
    """A torch dtype's kind: "float", "bool", "complex" or "int"."""
    if dtype.is_floating_point:
        return "float"
    if str(dtype) == "torch.bool":
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "int"


# ── the recorder environment the mapping table's entries use ───────────────

class Recorder:
    """Argument lifting and shapes for :mod:`gradtool.interop.aten`'s entries.  Every op it
    records is one a table entry asked for; it decides nothing about semantics."""

    def __init__(self, imp):
        self.imp = imp          # the importer (torch.py's _Importer): tape, lifted values
        self.tp = imp.tp
        self.torch = imp.torch

    # kinds of values
    def is_gvar(self, v) -> bool:
        return isinstance(v, GVar)

    def is_ids(self, v) -> bool:
        return self.is_gvar(v) and self.tp.holds_ids(v.id)

    def requires_grad(self, v) -> bool:
        return self.is_gvar(v) and self.tp.requires[v.id]

    def is_complex(self, v) -> bool:
        """A complex value: a :class:`~.aten.Complex` pair, a folded complex tensor, a
        Python complex number."""
        return isinstance(v, (Complex, complex)) or (
            isinstance(v, self.torch.Tensor) and v.is_complex())

    def complex(self, x):
        """The :class:`~.aten.Complex` pair of ``x``: a pair as it is, a folded complex
        tensor as two f64 consts (lifted once; a complex buffer's are named
        ``<name>.real`` and ``<name>.imag`` in ``meta["torch"]["consts"]``), a Python
        complex number as two one-element consts."""
        if isinstance(x, Complex):
            return x
        if isinstance(x, complex):
            return Complex(self.f(x.real), self.f(x.imag))
        key = (id(x), "complex")
        if key not in self.imp.lifted:
            t = x.detach().resolve_conj().resolve_neg()
            pair = Complex(self._lift(t.real, ids=False), self._lift(t.imag, ids=False))
            self.imp.lifted[key] = (x, pair)
            name = self.imp.const_names.get(id(x))
            if name is not None:
                self.imp.consts.setdefault(f"{name}.real", pair.re)
                self.imp.consts.setdefault(f"{name}.imag", pair.im)
        return self.imp.lifted[key][1]

    def torch_dtype(self, node_or_value) -> str:
        val = node_or_value.meta.get("val") if hasattr(node_or_value, "meta") else node_or_value
        if isinstance(val, self.torch.Tensor):
            return dtype_kind(val.dtype)
        if isinstance(val, bool):
            return "bool"
        return "int" if isinstance(val, int) else "float"

    # lifting folded constants and numbers onto the tape
    def _lift(self, t, ids: bool):
        torch = self.torch
        key = (id(t), ids)
        if key in self.imp.lifted:
            return self.imp.lifted[key][1]
        if self.is_complex(t):            # never its real part alone
            raise Unsupported(COMPLEX_ONLY)
        arr = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if ids:
            if arr.dtype.kind not in "iu":
                raise Unsupported("integer ids expected, got floating-point data")
            g = self.tp.const(arr.astype(np.int64), dtype="i64")
        else:
            g = self.tp.const(arr.astype(np.float64))
        self.imp.lifted[key] = (t, g)          # keep t alive: ids are reused otherwise
        name = self.imp.const_names.get(id(t))
        if name is not None and name not in self.imp.consts:
            self.imp.consts[name] = g
        return g

    def f(self, x):
        """A float (or mask) GVar for ``x``: a GVar, a folded tensor or a number.  An i64
        input slot is converted (to_f64: exact, and still integer-valued for ids), and so
        is a folded integer or bool tensor whose values are exact in float64 (lifted as
        an i64 const: ``torch.minimum(ids, torch.full_like(ids, 5))`` stays ids)."""
        if self.is_gvar(x):
            return self.tp.to_f64(x) if self.tp.holds_ids(x.id) else x
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return self.tp.const(np.array([float(x)]))
        if isinstance(x, bool):
            return self.tp.const(np.array([1.0 if x else 0.0]))
        torch = self.torch
        if isinstance(x, torch.Tensor) and dtype_kind(x.dtype) in ("int", "bool"):
            key = (id(x), "whole")
            if key not in self.imp.lifted:
                whole = x if x.dtype == torch.int64 else x.to(torch.int64)
                if whole.numel() and int(whole.abs().max()) > 2 ** 53:
                    return self._lift(x, ids=False)     # rounded, as torch's promotion
                self.imp.lifted[key] = (x, self.tp.to_f64(self._lift(whole, ids=True)))
            return self.imp.lifted[key][1]
        return self._lift(x, ids=False)

    mask = f

    def ids(self, x):
        """Integer ids for take/take_along: an i64 slot or an integer-valued node computed
        from one (where(ne(t, -100), t, 0)), a folded integer tensor, or an int."""
        if self.is_gvar(x):
            if not (self.tp.holds_ids(x.id) or self.tp.integral[x.id]):
                raise Unsupported("ids computed in floating point (gradtool reads ids from "
                                    "integer data and integer-valued ops of it; a float "
                                    "tensor used as indices is refused)")
            return x
        if isinstance(x, int) and not isinstance(x, bool):
            return self.tp.const(np.array([x], dtype=np.int64), dtype="i64")
        return self._lift(x, ids=True)

    def value(self, x):
        """A GVar for a layout op: floats as they are, i64 data through to_f64 (layout ops
        read f64; the result stays integer-valued), folded tensors lifted by dtype."""
        if self.is_gvar(x):
            return self.tp.to_f64(x) if self.tp.holds_ids(x.id) else x
        torch = self.torch
        if isinstance(x, torch.Tensor) and dtype_kind(x.dtype) == "int":
            return self.tp.to_f64(self._lift(x, ids=True))
        return self.f(x)

    def is_integral(self, v) -> bool:
        return self.is_gvar(v) and (self.tp.holds_ids(v.id) or bool(self.tp.integral[v.id]))

    def operands(self, a, b):
        """Two operands of a comparison or where.  Beside integer data (an i64 slot or an
        integer-valued node), an int or a folded integer tensor becomes an i64 const, so
        that where(ne(t, -100), t, 0) stays integer-valued (ids for a gather)."""
        if not (self.is_integral(a) or self.is_integral(b)):
            return self.f(a), self.f(b)
        torch = self.torch

        def conv(v):
            if self.is_gvar(v):
                return v
            if (isinstance(v, int) and not isinstance(v, bool)) or (
                    isinstance(v, torch.Tensor) and dtype_kind(v.dtype) == "int"):
                return self.ids(v)
            return self.f(v)
        return conv(a), conv(b)

    def scalar_const(self, x):
        """A folded one-element tensor as a Python number; anything else as it is."""
        if isinstance(x, self.torch.Tensor) and x.numel() == 1:
            return x.item()
        return x

    def scale(self, b, alpha):
        if isinstance(b, (int, float)):
            return b * alpha
        return self.tp.muls(self.f(b), float(alpha))

    # shapes
    def tshape(self, node) -> list:
        val = node.meta["val"] if hasattr(node, "meta") else node
        return [int(d) for d in val.shape]

    def shape(self, node) -> list:
        return self.tshape(node) or [1]

    def getitems_used(self, node) -> set:
        return {u.args[1] for u in node.users if str(u.target) == "<built-in function getitem>"}

    def reshape(self, v, shape):
        shape = list(shape) or [1]
        if list(v.shape) == shape:
            return v
        return self.tp.reshape(v, shape)

    def conform(self, node, out):
        """The entry's result in the node's exported shape (0-dim tensors are [1])."""
        if isinstance(out, tuple):
            vals = node.meta.get("val")
            return tuple(self._conform1(v, o) if o is not None else None
                         for v, o in zip(vals, out))
        return self._conform1(node.meta.get("val"), out)

    def _conform1(self, val, out):
        if isinstance(out, Complex):
            return Complex(*(self._conform1(val, p) for p in out.parts))
        if not self.is_gvar(out) or not isinstance(val, self.torch.Tensor):
            return out
        want = [int(d) for d in val.shape] or [1]
        if list(out.shape) != want:
            if math.prod(out.shape) != math.prod(want):
                raise Unsupported(f"recorded shape {list(out.shape)} differs from the "
                                    f"exported {want} (an importer bug)")
            return self.tp.reshape(out, want)
        return out

    def axes(self, a, dim) -> list:
        n = len(a.shape)
        if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
            return list(range(n))
        dims = [dim] if isinstance(dim, int) else list(dim)
        return sorted({d % n for d in dims})

    def reduce(self, kind, a, dim, keepdim):
        """sum / mean / max over the axes ``dim`` (None or []: all), as one node."""
        axes = self.axes(a, dim)
        fn = getattr(self.tp, kind)
        if len(axes) == len(a.shape) and not keepdim:
            return fn(a)
        return fn(a, axis=axes[0] if len(axes) == 1 else tuple(axes), keepdims=bool(keepdim))

    def permute(self, v, perm):
        n = len(v.shape)
        perm = [p % n for p in perm]
        if perm == list(range(n)):
            return v
        if perm == list(range(n - 2)) + [n - 1, n - 2]:
            return self.tp.transpose(v)
        return self.tp.permute(v, perm)

    def expand(self, v, shape):
        shape = list(shape)
        return v if list(v.shape) == shape else self.tp.expand(v, shape)

    def slice_axis(self, v, dim, start, stop, step):
        shape = list(v.shape)
        if start == 0 and stop == shape[dim] and step == 1:
            return v
        if stop <= start:
            raise Unsupported("an empty slice (gradtool values have at least one element)")
        starts = [0] * len(shape)
        stops = list(shape)
        starts[dim], stops[dim] = start, stop
        if step == 1:
            return self.tp.slice(v, starts, stops)
        steps = [1] * len(shape)
        steps[dim] = step
        return self.tp.slice(v, starts, stops, steps=steps)
