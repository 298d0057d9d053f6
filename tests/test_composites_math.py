"""gradtool.composites.math (sinh ... hypot, the importer's math) against PyTorch float64:
values and gradients on each function's domain, the special values, and a call with no
torch installed.  The ATen entries call these functions (tests/test_import_check.py
imports models using them)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gradtool as gt
from gradtool.composites import math as gm
from gradtool.errors import TapeError
from support import assert_elementwise_close, check_specials, check_unary, torch_oracle

INF, NAN = math.inf, math.nan


def _wide(lo, hi, n=200):
    return lambda rng: rng.uniform(lo, hi, n)


# composite -> (torch function name, inputs drawn in its domain)
UNARY = {
    "sinh": ("sinh", lambda rng: np.concatenate([rng.uniform(-30, 30, 200),
                                                 rng.uniform(-700, 700, 50),
                                                 rng.uniform(-1e-6, 1e-6, 20)])),
    "cosh": ("cosh", lambda rng: np.concatenate([rng.uniform(-30, 30, 200),
                                                 rng.uniform(-700, 700, 50)])),
    "asinh": ("asinh", lambda rng: np.concatenate([rng.uniform(-5, 5, 200),
                                                   rng.uniform(-1e9, 1e9, 50),
                                                   rng.uniform(-1e-9, 1e-9, 20)])),
    "acosh": ("acosh", lambda rng: np.concatenate([rng.uniform(1.001, 5, 200),
                                                   rng.uniform(1e8, 1e10, 50)])),
    "atanh": ("atanh", _wide(-0.999, 0.999)),
    "tan": ("tan", _wide(-1.5, 1.5)),
    "exp2": ("exp2", _wide(-50, 50)),
    "log2": ("log2", _wide(1e-3, 1e3)),
    "log10": ("log10", _wide(1e-3, 1e3)),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_composite_against_pytorch_float64(name):
    fname, draw = UNARY[name]
    check_unary(lambda tp, a: getattr(gm, name)(a), fname, draw, name)


def test_unary_composite_specials_match_pytorch():
    """inf, NaN, signed zeros, domain edges and overflow: torch's values.  (Not 710:
    sinh(710) = 1.117e308 is finite and so is gradtool's, where torch's CPU kernel,
    going through exp(710), gives inf.)"""
    x = np.array([0.0, -0.0, INF, -INF, NAN, -1.0, 1.0, 2.0, -2.0, 1e-310, 22.0, 709.0,
                  711.0, -800.0, 1e300, 2.0 ** 28, 0.5])
    check_specials(lambda tp, name, a: getattr(gm, name)(a), UNARY, x)


def test_hypot_against_pytorch_float64():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    a = np.concatenate([rng.uniform(-10, 10, 100), rng.uniform(-1e200, 1e200, 20)])
    b = np.concatenate([rng.uniform(-10, 10, 100), rng.uniform(-1e-200, 1e-200, 20)])
    (v, tv), grads = torch_oracle(lambda tp, x, y: gm.hypot(x, y), torch.hypot, [a, b])
    assert_elementwise_close(v, tv, 1e-12, "hypot value")
    for i, (g, tg) in enumerate(grads):
        assert_elementwise_close(g, tg, 1e-11, f"hypot gradient {i}")
    specials = np.array([0.0, -0.0, INF, -INF, NAN, 3.0])
    x, y = np.meshgrid(specials, specials)
    tp = gt.Tape()
    got = tp.value(gm.hypot(tp.const(x.ravel()), tp.const(y.ravel())))
    want = torch.hypot(torch.tensor(x.ravel()), torch.tensor(y.ravel())).numpy()
    assert_elementwise_close(got, want, 1e-15, "hypot specials")      # inf with a NaN: inf, as C's hypot


def test_a_composite_refuses_what_is_not_a_gvar():
    with pytest.raises(TapeError, match="sinh: expected a GVar, got float"):
        gm.sinh(0.5)
    tp = gt.Tape()
    with pytest.raises(TapeError, match="hypot: expected a GVar, got list"):
        gm.hypot(tp.const(np.ones(2)), [1.0, 2.0])


NO_TORCH = '''
import sys
sys.modules["torch"] = None              # "import torch" raises ImportError
import math
import numpy as np
import gradtool as gt
from gradtool.composites import math as gm
from gradtool.composites import distances
tp = gt.Tape()
x = tp.param(np.array([0.25, -1.5, 3.0]))
y = tp.sum(tp.add(tp.add(gm.sinh(x), gm.asinh(x)), gm.hypot(x, gm.cosh(x))))
tp.backward(y)
want = sum(math.sinh(v) + math.asinh(v) + math.hypot(v, math.cosh(v)) for v in [0.25, -1.5, 3.0])
assert abs(tp.value(y)[0] - want) <= 1e-13 * abs(want), (tp.value(y), want)
assert np.all(np.isfinite(tp.grad(x)))
d = distances.cdist(tp.const(np.eye(3)), tp.const(np.zeros((2, 3))))
assert np.array_equal(tp.value(d), np.ones((3, 2)))
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
print("ok")
'''


def test_composites_work_without_torch():
    proc = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
