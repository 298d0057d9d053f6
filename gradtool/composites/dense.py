"""Dense layers and their activations: ``linear``, ``silu``, ``gelu``."""

from __future__ import annotations

import math

from ..errors import TapeError
from ..tape import GVar
from ._args import tape_of

__all__ = ["linear", "silu", "gelu"]


GELU_C = math.sqrt(2.0 / math.pi)     # the tanh form's constant, rounded once
GELU_K = 0.044715
SQRT1_2 = float.fromhex("0x1.6a09e667f3bcdp-1")   # 1/sqrt(2) rounded once (M_SQRT1_2)


def linear(x: GVar, w: GVar, b: GVar = None) -> GVar:
    """``x @ w + b``: x [N, in] or [B, T, in], w [in, out], b [out] (optional).

    A 3-dim x multiplies every batch by the same w, recorded as a broadcast
    ``bmm`` with w reshaped to [1, in, out], whose gradient sums the batches
    serially.  b broadcasts over the rows (numpy rules).
    """
    tp = tape_of(x, "linear")
    y = tp.bmm(x, tp.reshape(w, [1, *w.shape])) if len(x.shape) == 3 else tp.matmul(x, w)
    return y if b is None else tp.add(y, b)


def silu(x: GVar) -> GVar:
    """SiLU (swish): ``x * sigmoid(x)``."""
    tp = tape_of(x, "silu")
    return tp.mul(x, tp.sigmoid(x))


def gelu(x: GVar, approximate: str = "none") -> GVar:
    """GELU, PyTorch's ``F.gelu`` (same default, same two forms).

    ``approximate="none"`` (exact): ``x * 0.5 * (1 + erf(x * M_SQRT1_2))``, recorded in
    PyTorch's CPU order as ``(x * 0.5) * (erf(x * SQRT1_2) + 1.0)`` with SQRT1_2 =
    1/sqrt(2) rounded once; erf is the libm-free fdlibm port (within 1 ulp).

    ``approximate="tanh"``: ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``,
    recorded as ``((x * (tanh((x + (x*x*x) * 0.044715) * c) + 1.0)) * 0.5)`` with
    c = sqrt(2/pi) rounded once.
    """
    tp = tape_of(x, "gelu")
    if approximate == "none":
        return tp.mul(tp.muls(x, 0.5), tp.adds(tp.erf(tp.muls(x, SQRT1_2)), 1.0))
    if approximate != "tanh":
        raise TapeError(f"nn.gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    cube = tp.mul(tp.mul(x, x), x)
    inner = tp.add(x, tp.muls(cube, GELU_K))
    return tp.muls(tp.mul(x, tp.adds(tp.tanh(tp.muls(inner, GELU_C)), 1.0)), 0.5)
