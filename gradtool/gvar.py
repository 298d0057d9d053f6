"""GVar, the handle to one tape node, and its operators' operand coercion.

A Python number on either side of an operator becomes a scalar op; anything else that
is not a GVar is refused with a :class:`gradtool.errors.TapeError`.  Re-exported from
:mod:`gradtool.tape` (``gradtool.tape.GVar``, ``gradtool.GVar``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .errors import TapeError
from .ops import dtype_of
from .tape_checks import _scalar, is_number

if TYPE_CHECKING:
    from .tape import Tape

class GVar:
    """A handle to one tape node: (tape, id, serial).  Supports + - * / @ and unary -.

    ``serial`` is the node's birth stamp on its tape: every appended node gets
    a fresh one, so a handle whose node :meth:`Tape.reset_to` dropped does not
    match the node that later takes its id.  A poisoned handle (the result of a
    failed op with ``raise_on_error=False``) has id -1 and serial -1.  Every
    entry point that takes a handle checks it through :meth:`Tape.node_id`.
    """

    __slots__ = ("tape", "id", "serial")

    # numpy's operators (ndarray + GVar) return NotImplemented instead of building an
    # object array of GVars; Python then calls the reflected method below, which refuses
    __array_ufunc__ = None

    def __init__(self, tape: "Tape", node_id: int, serial: int = -1):
        self.tape, self.id, self.serial = tape, node_id, serial

    @property
    def shape(self) -> tuple:
        return self.tape._checked_value(self).shape

    @property
    def poisoned(self) -> bool:
        return self.id < 0

    def __repr__(self):
        if self.id < 0:
            return "GVar(poisoned)"
        if not self.tape._live(self):
            return f"GVar(id={self.id}, dropped)"
        return f"GVar(id={self.id}, op={self.tape.nodes[self.id].op}, shape={list(self.shape)})"

    # Operators.  A Python number on either side becomes a scalar op:
    # x + c -> adds(x, c); x - c -> adds(x, -c) (negation is exact);
    # c - x -> adds(neg(x), c); x * c -> muls(x, c); x / c divides by a const
    # leaf holding c, because muls(x, 1/c) would round twice.  Anything else
    # that is not a GVar (a numpy array, a string) is refused with a TapeError:
    # record arrays as leaves first (tape.const / tape.param).
    def __add__(self, other):
        if is_number(other):
            return self.tape.adds(self, other)
        return self.tape.add(self, _operand(other, "+"))

    def __radd__(self, other):
        return self.tape.adds(self, _rscalar(other, "+"))

    def __sub__(self, other):
        if is_number(other):
            return self.tape.adds(self, -_scalar(other, "-"))
        return self.tape.sub(self, _operand(other, "-"))

    def __rsub__(self, other):
        c = _rscalar(other, "-")
        return self.tape.adds(self.tape.neg(self), c)

    def __mul__(self, other):
        if is_number(other):
            return self.tape.muls(self, other)
        return self.tape.mul(self, _operand(other, "*"))

    def __rmul__(self, other):
        return self.tape.muls(self, _rscalar(other, "*"))

    def __truediv__(self, other):
        if is_number(other):
            return self.tape.div(self, self.tape._number_leaf(_scalar(other, "/"), "/",
                                                              like=self))
        return self.tape.div(self, _operand(other, "/"))

    def __rtruediv__(self, other):
        c = _rscalar(other, "/")
        return self.tape.div(self.tape._number_leaf(c, "/", like=self), self)

    @property
    def dtype(self) -> str:
        """The node's dtype: "f64", "f32" or "i64" (an integer const)."""
        return dtype_of(self.tape._checked_value(self))

    def __matmul__(self, other):
        other = _operand(other, "@")
        if self.tape.ok and len(self.shape) == 3:
            return self.tape.bmm(self, other)
        return self.tape.matmul(self, other)

    def __rmatmul__(self, other):
        raise _unsupported(other, "@")

    def __neg__(self):
        return self.tape.neg(self)


def _operand(x, op: str) -> "GVar":
    """The other side of a GVar operator when it is not a number: a GVar, else refused."""
    if isinstance(x, GVar):
        return x
    raise _unsupported(x, op)


def _rscalar(x, op: str) -> float:
    """The left side of a reflected operator (number OP GVar): a real number, else refused.

    (Never a GVar: Python tries the left operand's own method first.)
    """
    if not is_number(x):
        raise _unsupported(x, op)
    return _scalar(x, op)


def _unsupported(x, op: str) -> "TapeError":
    hint = (": record it first with tape.const(array) (or tape.param)"
            if isinstance(x, (np.ndarray, list, tuple)) else "")
    return TapeError(f"unsupported operand for {op}: GVar and {type(x).__name__}{hint}")
