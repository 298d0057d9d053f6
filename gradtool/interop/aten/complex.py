"""Complex values: each a pair of float64 parts, and the COMPLEX table of their ops."""

from __future__ import annotations

from dataclasses import dataclass

from . import layout  # noqa: F401  (the layout entries COMPLEX wraps)
from .elementwise import record_add, record_mul, record_sub
from .registry import ATEN, Entry, Unsupported, register


# ── complex values (rotary embeddings as LLaMA's reference code writes them) ──────
#
# The tape holds float64 values only, so a complex tensor is a pair of them, its real
# and its imaginary part, each of the complex tensor's shape (a folded complex tensor,
# a complex buffer: two consts, lifted once; complex64 values are exact in float64).
# The importer sends every node that reads or makes a complex tensor (by the exported
# dtypes) to COMPLEX instead of ATEN; an op COMPLEX lacks is refused in one line.

@dataclass(frozen=True)
class Complex:
    """A complex value on the tape: its real and imaginary parts, two f64 GVars of the
    complex tensor's shape."""
    re: object
    im: object

    @property
    def parts(self) -> tuple:
        return (self.re, self.im)


COMPLEX: dict[str, Entry] = {}

COMPLEX_ONLY = ("complex tensors: gradtool imports view_as_complex, view_as_real, polar, "
                "mul, add, sub, neg, conj and layout ops (views, slices, permutes, expand, "
                "cat, stack, split) of complex values only, each a pair of float64 parts")


def complex_op(*names, needs=(), doc=""):
    """Register the complex form of ATen ops: ``fn(r, node, *args, **kwargs)`` gets the
    node's arguments as an ATEN entry does, complex ones as :class:`Complex`, a folded
    complex tensor or a Python complex number as they are (``r.complex`` lifts them)."""
    return register(COMPLEX, *names, needs=needs, doc=doc)


def _part(r, obj, i):
    """``obj`` (arguments, nested lists and tuples) with each complex value replaced by
    its real (i = 0) or imaginary (i = 1) part; a real tensor among them is refused."""
    if r.is_complex(obj):
        return r.complex(obj).parts[i]
    if isinstance(obj, (list, tuple)):
        return type(obj)(_part(r, x, i) for x in obj)
    if isinstance(obj, dict):
        return {k: _part(r, v, i) for k, v in obj.items()}
    if r.is_gvar(obj) or isinstance(obj, r.torch.Tensor):
        raise Unsupported(f"a real tensor among complex ones; {COMPLEX_ONLY}")
    return obj


def _on_parts(fn):
    """The complex form of the ATEN entry ``fn`` (a layout op, neg): ``fn`` once on the
    real parts and once on the imaginary parts."""
    def on_parts(r, node, *args, **kwargs):
        re, im = (fn(r, node, *_part(r, args, i), **_part(r, kwargs, i)) for i in (0, 1))
        if isinstance(re, tuple):                       # split, unbind
            return tuple(Complex(a, b) for a, b in zip(re, im))
        return Complex(re, im)
    return on_parts


for _name in ["aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
              "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
              "aten.squeeze.default", "aten.view_copy.default", "aten.flatten.using_ints",
              "aten.unflatten.int", "aten.clone.default", "aten.contiguous.default",
              "aten.lift_fresh_copy.default", "aten.alias.default", "aten.detach.default",
              "aten.permute.default", "aten.t.default", "aten.transpose.int",
              "aten.expand.default", "aten.slice.Tensor", "aten.select.int",
              "aten.split_with_sizes.default", "aten.split.Tensor", "aten.unbind.int",
              "aten.cat.default", "aten.stack.default", "aten.neg.default"]:
    complex_op(_name, needs=ATEN[_name].needs,
               doc="the real op on the real parts and on the imaginary parts")(
        _on_parts(ATEN[_name].fn))


@complex_op("aten.view_as_complex.default",
            doc="(x[..., 0], x[..., 1]): two slices of the last axis, reshaped (exact copies)")
def _view_as_complex(r, node, x):
    v = r.value(x)
    last = len(r.tshape(node.args[0])) - 1
    return Complex(*(r.reshape(r.slice_axis(v, last, i, i + 1, 1), r.shape(node))
                     for i in (0, 1)))


@complex_op("aten.view_as_real.default", needs=("cat",),
            doc="the real and the imaginary part stacked on a new last axis: cat (exact)")
def _view_as_real(r, node, c):
    shape = r.tshape(node)
    return r.tp.cat([r.reshape(p, shape[:-1] + [1]) for p in r.complex(c).parts],
                    len(shape) - 1)


@complex_op("aten.polar.default", needs=("sin", "cos"),
            doc="(abs * cos(angle), abs * sin(angle)), as torch's kernel computes it")
def _polar(r, node, magnitude, angle):
    m, t = r.f(magnitude), r.f(angle)
    return Complex(r.tp.mul(m, r.tp.cos(t)), r.tp.mul(m, r.tp.sin(t)))


@complex_op("aten._conj.default", "aten.conj_physical.default",
            doc="(re, neg(im)): exact (torch's conjugate view is resolved at once)")
def _conj(r, node, c):
    c = r.complex(c)
    return Complex(c.re, r.tp.neg(c.im))


@complex_op("aten.mul.Tensor", "aten.mul.Scalar",
            doc="complex * complex: (ar * br - ai * bi, ar * bi + ai * br), each product "
                "rounded, then the sum or difference (torch's order; a fused kernel may "
                "differ by an ulp); by a real tensor or number: each part times it "
                "(torch's ar * b - ai * 0 is ar * b)")
def _complex_mul(r, node, a, b):
    if not (r.is_complex(a) and r.is_complex(b)):
        c, x = (a, b) if r.is_complex(a) else (b, a)
        return Complex(*(record_mul(r, node, p, x) for p in r.complex(c).parts))
    a, b, tp = r.complex(a), r.complex(b), r.tp
    return Complex(tp.sub(tp.mul(a.re, b.re), tp.mul(a.im, b.im)),
                   tp.add(tp.mul(a.re, b.im), tp.mul(a.im, b.re)))


@complex_op("aten.add.Tensor", "aten.add.Scalar",
            doc="the real op on the real parts and on the imaginary parts (alpha as the "
                "real op's); with a real operand, the other's imaginary part as it is, "
                "broadcast to the result's shape")
def _complex_add(r, node, a, b, alpha=1):
    return _complex_sum(r, node, record_add, a, b, alpha)


@complex_op("aten.sub.Tensor", "aten.sub.Scalar",
            doc="as add; a real first operand: the other's imaginary part negated")
def _complex_sub(r, node, a, b, alpha=1):
    return _complex_sum(r, node, record_sub, a, b, alpha)


def _complex_sum(r, node, op, a, b, alpha):
    """a + alpha * b (op: record_add) or a - alpha * b (record_sub) of complex pairs."""
    if isinstance(alpha, complex):
        raise Unsupported(f"a complex alpha; {COMPLEX_ONLY}")
    ca, cb = (r.complex(v) if r.is_complex(v) else None for v in (a, b))
    re = op(r, node, ca.re if ca else a, cb.re if cb else b, alpha)
    if ca and cb:
        im = op(r, node, ca.im, cb.im, alpha)
    elif ca:
        im = ca.im
    else:
        im = cb.im if alpha == 1 else r.scale(cb.im, alpha)
        im = r.tp.neg(im) if op is record_sub else im
    return Complex(re, r.expand(im, r.shape(node)))


@complex_op("aten._to_copy.default", "aten.to.dtype",
            doc="between complex dtypes: the same pair (every complex value is complex128); "
                "to or from a real dtype refused")
def _complex_to_copy(r, node, a, *args, **kwargs):
    if not (r.is_complex(a) and r.torch_dtype(node) == "complex"):
        raise Unsupported(f"a conversion between complex and real dtypes; {COMPLEX_ONLY}")
    return r.complex(a)
