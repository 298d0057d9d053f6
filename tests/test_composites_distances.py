"""gradtool.composites.distances (cdist, pdist) against PyTorch float64: values and
gradients, zero distances (gradient 0, torch's convention), batch dims; and the imported
aten._cdist_forward / _pdist_forward giving the composite's bits."""

from __future__ import annotations

import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal
from gradtool.composites import distances
from gradtool.errors import TapeError
from support import assert_elementwise_close, torch_oracle


@pytest.mark.parametrize("p", [1.0, 2.0])
@pytest.mark.parametrize("shapes", [((5, 3), (4, 3)), ((2, 5, 3), (2, 4, 3))])
def test_cdist_against_pytorch_float64(p, shapes):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(int(p) + len(shapes[0]))
    a, b = rng.normal(size=shapes[0]), rng.normal(size=shapes[1])
    b[..., 1, :] = a[..., 2, :]                   # a zero distance: gradient 0 there
    (v, tv), grads = torch_oracle(lambda tp, x, y: distances.cdist(x, y, p),
                             lambda x, y: torch.cdist(x, y, p=p,
                                                      compute_mode="donot_use_mm_for_euclid_dist"),
                             [a, b])
    assert_elementwise_close(v, tv, 1e-12, "cdist value")
    for i, (g, tg) in enumerate(grads):
        assert_elementwise_close(g, tg, 1e-11, f"cdist gradient {i}")


@pytest.mark.parametrize("p", [1.0, 2.0])
def test_pdist_against_pytorch_float64(p):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(3).normal(size=(6, 4))
    x[4] = x[1]                                   # a zero distance
    (v, tv), grads = torch_oracle(lambda tp, a: distances.pdist(a, p),
                             lambda a: torch.pdist(a, p=p), [x])
    assert_elementwise_close(v, tv, 1e-12, "pdist value")
    assert_elementwise_close(grads[0][0], grads[0][1], 1e-11, "pdist gradient")


def test_distances_refuse_other_orders_and_shapes():
    tp = gt.Tape()
    x = tp.const(np.ones((3, 2)))
    with pytest.raises(TapeError, match="p = 3.0"):
        distances.cdist(x, x, 3)
    with pytest.raises(TapeError, match="a matrix"):
        distances.pdist(tp.const(np.ones((2, 3, 2))))


def test_imported_cdist_and_pdist_are_the_composites_bits():
    torch = pytest.importorskip("torch")
    from gradtool.interop.torch import import_module

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(5, 3, dtype=torch.float64))

        def forward(self, y):
            return torch.cdist(self.w, y).sum() + torch.pdist(self.w, p=1.0).sum()

    torch.manual_seed(0)
    m, y = M(), torch.randn(4, 3, dtype=torch.float64)
    res = import_module(m, (y,), dtype="f64")
    tp = res.tape
    tp.backward(res.loss)
    ours = gt.Tape()
    w = ours.param(m.w.detach().numpy())
    loss = ours.add(ours.sum(distances.cdist(w, ours.const(y.numpy()))),
                    ours.sum(distances.pdist(w, 1.0)))
    ours.backward(loss)
    assert_bits_equal(tp.value(res.loss), ours.value(loss))
    assert_bits_equal(tp.grad(res.params["w"]), ours.grad(w))
