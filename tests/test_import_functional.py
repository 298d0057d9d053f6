"""The PyTorch importer on torch.nn.functional beyond the model set, and on the things
models do around it.

Each function of a table (activations, reductions, losses, pads, slice assignment,
scatters and index_put, complex values, pooling ...) applied to a parameter and imported:
loss and gradient torch float64's.  Then scatters by input and computed indices (and
the ones refused, each one line), detach as a stop-gradient, EmbeddingBag, values under
no_grad, custom autograd Functions and gradient hooks (refused, the suggested rewrite
giving torch's gradient), indexing by rows and labels, InstanceNorm's and BatchNorm's
running statistics as state, activation checkpointing, padding_idx, float64 factories,
and the U-Net layers trained to the same bytes on every engine and two MPI ranks.
Skipped cleanly without torch.
"""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import gradtool as gt                                          # noqa: E402
from gradtool.interop.torch import TorchImportError, import_module  # noqa: E402
from conftest import assert_bits_equal, require_c_compiler     # noqa: E402
from support import run                                        # noqa: E402
from torch_cases import (assert_trains_to_the_same_bytes, import_matching_torch,  # noqa: E402
                         needs, torch_reference, unet_case)

warnings.filterwarnings("ignore", category=FutureWarning)


def _assign_slices(y):
    """In-place slice assignment on a clone (copy + slice_scatter, select_scatter)."""
    z = y.clone()
    z[:, 1:3] = y[:, :2] * 2
    z[:, 0] = 0.5
    z[1] = y[2] * 3
    z[:, -1] = y[:, 0]
    return z


def _assign_steps(y):
    """Stepped slices assigned (slice_scatter with a step), and one added into in place."""
    z = y.clone()
    z[:, ::2] = y[:, 1::2].exp()
    z[1:4:2, 1:6:2] = 1.0
    z[..., 0] += y[..., 1]
    return z


def _assign_into_zeros(y):
    z = torch.zeros(4, 8)             # float64 under the importer's dtype policy
    z[:, 1:7] = y
    return z * 2



_DRAW = torch.Generator().manual_seed(21)                   # folded ids with duplicates
_ROWS = torch.randint(0, 5, (3, 4), generator=_DRAW)        # varying along every dim
_COLS = torch.randint(0, 6, (4, 6), generator=_DRAW)
_LAST = torch.randint(0, 4, (2, 3, 4), generator=_DRAW)
_MID = torch.randint(0, 3, (2, 2, 3), generator=_DRAW)


def _scatter_any_index(y):
    """scatter_add by indices varying along every dim: dim 0 into part of a zeros output,
    dim 1 into y, the last dim and a middle one of 3-d tensors."""
    y3 = y.reshape(2, 3, 4)
    return (torch.zeros(5, 6).scatter_add(0, _ROWS, y[:3, :4] * 3)[1:]
            + y.scatter_add(1, _COLS, y.exp())
            + y3.scatter_add(-1, _LAST, y3.tanh()).reshape(4, 6)
            + torch.zeros(2, 3, 4).scatter_add(1, _MID, y3[:, :2, :3] ** 2).reshape(4, 6))


def _scatter_means(y):
    """scatter_reduce 'mean' (with and without self) and 'sum' without self, by indices
    varying along every dim and by a line expanded (index_add's pattern)."""
    return (y.scatter_reduce(1, _COLS, y * 2, "mean")
            + y.scatter_reduce(0, _ROWS[:, :3].remainder(4), y[:3, :3] ** 2, "mean",
                               include_self=False)
            + torch.zeros(4, 6).scatter_reduce(0, _ROWS.remainder(4), y[1:, :4].exp(), "mean",
                                               include_self=False)
            + y.scatter_reduce(1, _COLS, y.sin(), "sum", include_self=False)
            + y.scatter_reduce(1, torch.tensor([[0, 0, 2]]).expand(4, 3), y[:, :3], "mean",
                               include_self=False))


def _index_put_several(y):
    """index_put(accumulate=True) with several index tensors: adjacent (negatives and
    repeats), split by a full slice (the broadcast dims first) and into zeros with values
    broadcast."""
    y3 = y.reshape(2, 3, 4)
    return (torch.ops.aten.index_put(y, [torch.tensor([1, -1, 1]), torch.tensor([5, 0, 5])],
                                     y[0, :3] * 3, True)
            + torch.ops.aten.index_put(y3, [torch.tensor([[1], [0]]), None,
                                            torch.tensor([3, -1, 3])], y3[:, :, :3], True
                                       ).reshape(4, 6)
            + torch.zeros(4, 6).index_put((torch.tensor([0, 3, 0]), torch.tensor([[5], [2]])),
                                          y[2, :3], accumulate=True))



def _complex_values(y):
    """Complex values through every kind of op the complex table records: layout ops
    (views, slices with a step, select, permute, expand, cat, stack, unbind, split),
    conj, neg, polar of recorded values, products and sums by complex values, real
    tensors, numbers and a Python complex, and c.real * c.imag (selects of view_as_real)."""
    c = torch.view_as_complex(y.reshape(4, 3, 2))
    p = torch.polar(y[:, :3].exp(), y[:, 3:])
    a = c.t().reshape(3, 4)[1:3].t()
    b = torch.cat((c, p * c.conj()), 1)[:, ::2]
    e = torch.stack((c - 1.0, 2 * p + y[:, :3]), -1).unbind(-1)[1]
    f = c.unsqueeze(0).expand(2, 4, 3).flatten(0, 1)[3:7] * (0.5 - 2j)
    s = torch.split(-c, 2, 1)[0]
    g = 1.5 - c.transpose(0, 1)[2].clone()
    return torch.cat([torch.view_as_real(v).reshape(-1) for v in (a * s + b[:, :2], e, f, g)]
                     + [(c.real * c.imag).reshape(-1)])


FUNCTIONS = {
    "softplus": (F.softplus, ()), "logsigmoid": (F.logsigmoid, ()),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), ("gt", "where")),
    "hardtanh": (lambda x: F.hardtanh(x, -0.5, 0.5), ("le", "ge", "where")),
    "elu": (F.elu, ("gt", "where", "expm1")), "selu": (F.selu, ("gt", "where", "expm1")),
    "silu": (F.silu, ()), "mish": (F.mish, ()), "gelu": (F.gelu, ("erf",)),
    "hardswish": (F.hardswish, ()), "glu": (lambda x: F.glu(x), ()),
    "normalize": (lambda x: F.normalize(x, dim=-1) + x, ()),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), ()),
    "std": (lambda x: x.std(-1), ()), "var_all": (lambda x: x.var(), ()),
    "max_dim": (lambda x: x.max(dim=1).values, ()), "min_dim": (lambda x: x.min(dim=0).values, ()),
    "amin": (lambda x: x.amin(dim=(0, 1)), ()), "einsum": (lambda x: torch.einsum("ij,kj->ik", x, x), ()),
    "softmin": (lambda x: F.softmin(x, -1), ()), "repeat": (lambda x: x.repeat(2, 1, 3), ()),
    "pad": (lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), ()),
    "pad_crop": (lambda x: F.pad(x, (-1, 2, 1, -2), value=-0.5), ()),
    "index": (lambda x: x[:, torch.tensor([[0, 2], [5, 5]])], ()),
    "masked_fill": (lambda x: x.masked_fill(torch.ones(4, 6).tril().bool(), 0.0), ("where",)),
    "l1": (lambda x: F.l1_loss(x, torch.zeros_like(x)), ()),
    "smooth_l1": (lambda x: F.smooth_l1_loss(x, torch.full_like(x, 0.2)), ()),
    "bce_logits": (lambda x: F.binary_cross_entropy_with_logits(x, torch.full_like(x, 0.3)), ()),
    "soft_targets": (lambda x: F.cross_entropy(
        x, torch.softmax(torch.arange(6.0, dtype=x.dtype).expand(4, 6), -1)), ()),
    "label_smoothing": (lambda x: F.cross_entropy(x, torch.tensor([0, 1, 2, 1]),
                                                  label_smoothing=0.1), ()),
    "cosine": (lambda x: F.cosine_similarity(x, x * x + 1), ()),
    "addcmul_lerp": (lambda x: torch.lerp(torch.addcmul(x, x, x), x * 2, 0.3), ()),
    "flip": (lambda x: x.flip(0) * x + x.flip((0, 1)), ("flip",)),
    "cumsum": (lambda x: torch.cumsum(x, 1) + torch.cumsum(x, 0), ("cumsum",)),
    "var_mean": (lambda x: torch.var_mean(x, 1)[0] * torch.var_mean(x, 1)[1], ()),
    "norm_1": (lambda x: torch.linalg.vector_norm(x, 1, dim=1), ("abs",)),
    "norm_inf": (lambda x: torch.linalg.vector_norm(x, math.inf, dim=0), ("abs",)),
    "norm_minus_inf": (lambda x: torch.linalg.vector_norm(x, -math.inf), ("abs",)),
    "norm_3": (lambda x: torch.linalg.vector_norm(x, 3, dim=(0, 1)), ("abs",)),
    "isnan": (lambda x: torch.where(torch.isnan(x.log()), 0.0, x), ("where",)),
    "sign": (lambda x: torch.sign(x) * x.exp() + torch.sign(x - x), ("gt", "lt")),
    "cumprod": (lambda x: torch.cumprod(x, 1) + torch.cumprod(x, 0), ("cumprod",)),
    "prod": (lambda x: x.prod(0) + x.prod(1, keepdim=True) * x.prod(), ("prod",)),
    "rounding": (lambda x: torch.round(x * 3.0) * x + torch.floor(x) - torch.ceil(x * x),
                 ("round", "floor", "ceil")),
    "slice_assign": (_assign_slices, ("cat",)), "slice_assign_step": (_assign_steps, ("cat",)),
    "assign_into_zeros": (_assign_into_zeros, ("cat",)),
    "pad_circular": (lambda x: F.pad(x.reshape(1, 1, 4, 6), (1, 2, 1, 0), mode="circular"),
                     ("cat",)),
    "diagonal": (lambda x: torch.diagonal(x)[:3] + torch.diagonal(x, 2)[:3] * torch.diagonal(x, -1)
                 + torch.trace(x[:, :4]) + torch.diagonal(x.reshape(2, 2, 6), 1, 2, 0).sum(),
                 ("permute",)),
    "clamp_tensor": (lambda x: torch.clamp(x, min=x.flip(0) * 0.5, max=x.sum(0) * 0.3 + 0.2)
                     + torch.clamp(x, max=torch.zeros(6)) + torch.clamp_min(x, x.mean(1, True)),
                     ("minimum", "maximum")),
    "topk": (lambda x: torch.topk(x, 3, dim=1).values * torch.topk(x, 2, dim=0, largest=False)[0][1, :3],
             ("topk",)),
    "sort": (lambda x: torch.sort(x, dim=1, descending=True).values * torch.arange(6.0)
             + x.gather(0, torch.sort(x, dim=0).indices), ("sort",)),
    "median": (lambda x: torch.median(x, dim=1).values + torch.median(x) * x.median(0)[0][2],
               ("sort",)),
    "addmm_scaled": (lambda x: torch.addmm(x[:, :4], x, x.t()[:, :4], beta=0.5, alpha=-2.0)
                     + torch.baddbmm(x[None, :, :4], x[None], x.t()[None, :, :4], beta=0.0,
                                     alpha=3.0), ()),
    "index_rows_cols": (lambda x: x[torch.arange(4), torch.tensor([1, 5, 0, 2])]
                        + x[torch.tensor([[0], [3]]), torch.tensor([5, -1, 2, 2])].sum(0), ()),
    "unfold": (lambda x: F.unfold(x.reshape(1, 1, 4, 6), (2, 3), stride=(1, 2)), ()),
    "cummax_cummin": (lambda x: torch.cummax(x, 1).values * torch.cummin(x.round(), 0)[0],
                      ("cummax", "round")),
    "erfc_atan_atan2": (lambda x: torch.erfc(x * 2.0) * torch.atan(x * x - 1.0)
                        + torch.atan2(x, x.flip(0) - 0.3) * torch.special.erfc(-x)
                        + torch.arctan(x.sum(0)), ("erfc", "atan", "atan2")),
    "fmod_remainder": (lambda x: torch.fmod(x * 3.0, 1.5) * torch.remainder(x, -0.7)
                       + (x * 5.0) % 2.0, ("fmods", "mods")),
    "fake_quant": (lambda x: x + (torch.round(x * 4.0) / 4.0 - x).detach()
                   + (torch.floor(x) + torch.ceil(x) + torch.trunc(x)).detach() * x,
                   ("round", "floor", "ceil", "trunc", "detach")),
    "index_add_axes_alpha": (lambda x: x.index_add(1, torch.tensor([5, 0, 5]), x[:, 1:4] * x[:, :3],
                                                   alpha=-1.5)
                             + torch.zeros(4, 6).index_add(0, torch.tensor([3, 3, 1]), x[:3])
                             + x.t().clone().index_add_(0, torch.tensor([2, 0]), x[:, 4:].t()).t(),
                             ("index_add",)),
    "scatter_add_reduce": (lambda x: torch.zeros(5, 6).scatter_add(
                               0, torch.tensor([4, 0, 4, 1]).unsqueeze(-1).expand(4, 6), x)
                           .scatter_reduce(1, torch.tensor([[0, 0, 2]] * 5), x[:1].expand(5, 6)[:, :3] ** 2,
                                           "sum")[:4]
                           + x.scatter_add(1, torch.tensor([[1, 1, 0]]).expand(4, 3), x[:, 2:5].exp()),
                           ("index_add",)),
    "index_put_accumulate": (lambda x: torch.ops.aten.index_put(x, [None, torch.tensor([[5, 0], [5, 5]])],
                                                                x[:, :4].reshape(4, 2, 2), True)
                             + x.clone().index_put_((torch.tensor([-1, 0, -1]),), x[1], accumulate=True),
                             ("index_add",)),
    "scatter_add_any_index": (_scatter_any_index, ("scatter",)),
    "scatter_reduce_means": (_scatter_means, ("scatter", "where")),
    "index_put_several": (_index_put_several, ("scatter", "where")),
    "complex_values": (_complex_values, ("cat", "sin", "cos")),
    "adaptive_pool_unbatched": (lambda x: F.adaptive_avg_pool2d(x.reshape(1, 4, 6), (3, 4))
                                * F.adaptive_max_pool2d(x.reshape(1, 4, 6), (3, 4)),
                                ("nn.adaptive_avg_pool2d", "nn.adaptive_max_pool2d")),
}


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(torch.randn(4, 6))

    def forward(self, x):
        y = self.fn(x * self.w)
        return (y * y).sum()


@pytest.mark.parametrize("fn", [pytest.param(f, id=k, marks=needs(*n))
                                for k, (f, n) in FUNCTIONS.items()])
def test_functional_matches_torch_float64(fn):
    torch.manual_seed(10)
    module, x = Fn(fn), torch.randn(4, 6)
    try:
        result = import_module(module, (x,), dtype="f64")
    except TorchImportError as exc:
        lacks = [p for p in exc.problems if "this build lacks" in p.detail]
        if lacks and len(lacks) == len(exc.problems):
            pytest.skip(str(exc))
        raise
    tape = result.tape
    tape.backward(result.loss)
    ref_loss, ref = torch_reference(module, (x,))
    got = float(tape.values[result.loss.id][0])
    assert abs(got - ref_loss) <= 1e-12 * abs(ref_loss), (got, ref_loss)
    g = tape.grad(result.params["w"])
    assert np.linalg.norm(g - ref["w"]) <= 1e-11 * np.linalg.norm(ref["w"])


class ColumnScatter(nn.Module):
    """scatter_add by an index input that is already a column ([E, 1], expanded)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x, col):
        m = self.fc(x)
        return torch.zeros(4, 3).scatter_add(0, col.expand_as(m), m).tanh().square().sum()


def test_scatter_add_by_an_index_column_input_matches_torch():
    torch.manual_seed(16)
    result, _ = import_matching_torch(ColumnScatter(), (torch.randn(5, 3),
                                                        torch.tensor([[3], [0], [3], [2], [3]])))
    scatter = next(n for n in result.tape.nodes if n.op == "scatter")
    assert scatter.aux == {"rows": 4} and result.tape.integral[scatter.b]


class ComputedScatters(nn.Module):
    """General scatters by computed indices: topk's (along the last dim of a 3-d tensor)
    and argmax's, an index input (src larger than it: torch reads the part the index
    reaches; ``cut`` slices it for torch's gradient, which wants src shaped like the
    index), a mean by it, and index_put(accumulate=True) by two index inputs, adjacent
    and split by a full slice."""

    def __init__(self, cut=False):
        super().__init__()
        self.cut = cut
        self.w = nn.Parameter(torch.randn(3, 4, 5))

    def forward(self, x, idx, rows, cols):
        y = x * self.w
        top = torch.topk(y, 3, dim=2).indices                            # [3, 4, 3]
        a = torch.zeros(3, 4, 5).scatter_add(2, top, y[..., :3] if self.cut else y)
        am = y.argmax(dim=0, keepdim=True)                                # [1, 4, 5]
        b = y.scatter_add(0, am, y.exp()[:1] if self.cut else y.exp())
        c = y[0].scatter_add(1, idx, y[1, :, :4] if self.cut else y[1])  # idx [4, 4]
        d = y[1].t().scatter_reduce(0, idx, y[2, :, :4].sin(), "mean", include_self=False)
        e = torch.ops.aten.index_put(y, [rows, None, cols], y[1, :, :2].t() * 2, True)
        f = torch.zeros(4, 5).index_put((rows[:, None], cols), y[0, 0, :2] * y.sum(),
                                        accumulate=True)
        return ((a * y).sum() + (b * b).sum() + (c * c).sum() + (d * d).sum()
                + (e * e).sum() + (f * y[1]).sum())


def test_scatters_by_computed_indices_match_torch():
    """Each a scatter by computed linear ids: loss and gradient torch's (of the same
    model with src cut to the index); an id out of range raises at replay, as torch
    raises: the leading index's through the scatter's range, index_put's other one's
    through the masks."""
    torch.manual_seed(18)
    x, idx = torch.randn(3, 4, 5), torch.randint(0, 5, (4, 4))
    rows, cols = torch.tensor([2, 0]), torch.tensor([4, 1])
    module, reference = ComputedScatters(), ComputedScatters(cut=True)
    reference.load_state_dict(module.state_dict())
    result, _ = import_matching_torch(module, (x, idx, rows, cols), reference)
    tape = result.tape
    assert sum(n.op == "scatter" for n in tape.nodes) == 7      # d: the sums and the counts
    loss = tape.values[result.loss.id].copy()
    for name, bad in (("idx", [[0, 1, 5, 2]] + idx.tolist()[1:]), ("rows", [3, 0]),
                      ("cols", [5, 1]), ("cols", [-1, 1])):
        tape.set_value(result.inputs[name], bad)
        with pytest.raises(gt.GradtoolError, match="outside"):
            tape.forward()
        for slot, good in (("idx", idx), ("rows", rows), ("cols", cols)):
            tape.set_value(result.inputs[slot], good.numpy())
    tape.forward()
    assert_bits_equal(tape.values[result.loss.id], loss)


class TopScatter(nn.Module):
    """Each sample's top-3 features summed into a code by topk's own ids (scatter_add by
    computed ids) and averaged by them (scatter_reduce 'mean'), added into the sample's
    row by index_put with the batch's arange and those ids, and a table filled by
    index_put with two folded index tensors."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, x, y):
        h = self.fc(x)                                                  # [B, 6]
        top = torch.topk(h, 3, dim=1).indices                           # [B, 3]
        picked = h.gather(1, top)
        s = torch.zeros_like(h).scatter_add(1, top, picked.tanh())
        m = h.scatter_reduce(1, top, torch.sigmoid(picked), "mean")
        acc = h.index_put((torch.arange(x.shape[0])[:, None], top), picked * 0.5,
                          accumulate=True)
        mix = torch.zeros(6, 6).index_put((torch.tensor([0, 5, 5, 2]),
                                           torch.tensor([1, -1, 5, 4])), h.mean(0)[:4],
                                          accumulate=True)
        return F.mse_loss(self.out(s + m * acc + h @ mix), y)


def test_general_scatters_train_to_the_same_bytes_on_every_engine(tmp_path):
    """Scatters by computed linear ids (and index_put's masks) through `gradtool train`:
    cpu, host and host fused save the same bytes."""
    torch.manual_seed(19)
    result, _ = import_matching_torch(TopScatter(), (torch.randn(8, 6), torch.randn(8, 3)))
    assert sum(n.op == "scatter" for n in result.tape.nodes) == 5
    rng = np.random.default_rng(19)
    assert_trains_to_the_same_bytes(result, tmp_path, x=rng.standard_normal((32, 6)),
                                    y=rng.standard_normal((32, 3)))


class Scatters(nn.Module):
    """Scatters gradtool does not import: an amax reduction and a sum by a boolean mask
    (``which`` 0); an assignment by index (the last of repeated ids wins) and a mean of
    integers (torch floors it; ``which`` 1)."""

    def __init__(self, which):
        super().__init__()
        self.which = which
        self.fc = nn.Linear(3, 3)

    def forward(self, x, idx, ids, mask):
        m = self.fc(x)
        if self.which == 0:
            a = torch.zeros(4, 3).scatter_reduce(0, idx, m, "amax")
            b = torch.zeros(4, 3).index_put_((mask,), m, accumulate=True)
            return (a * b).sum()
        c = torch.zeros(4, 3).index_put_((ids,), m)
        d = torch.zeros(4, 3, dtype=torch.long).scatter_reduce(0, idx, idx * 3, "mean")
        return (c * d).sum()


def test_scatters_it_cannot_import_are_each_one_line_naming_why():
    x, idx, ids = torch.randn(5, 3), torch.randint(0, 4, (5, 3)), torch.tensor([0, 3, 3, 1, 0])
    mask = torch.tensor([True, False, True, True, False])
    why = {}
    for which in (0, 1):
        with pytest.raises(TorchImportError) as info:
            import_module(Scatters(which), (x, idx, ids, mask), dtype="f64")
        lines = info.value.lines
        assert len(lines) == 2, lines
        for line in lines:
            op = line.split()[3]
            assert line.startswith(f"unsupported use of {op} (x1) at "), line
            why[which, op] = line
    assert why[0, "aten.scatter_reduce.two"].endswith(
        "scatter_reduce with reduce='amax' (only 'sum' and 'mean' import)")
    assert why[0, "aten.index_put.default"].endswith(
        "index_put by a boolean mask (a data-dependent shape)")
    assert "index_put without accumulate" in why[1, "aten.index_put.default"]
    assert why[1, "aten.scatter_reduce.two"].endswith(
        "scatter_reduce with reduce='mean' of integer data (torch floors the quotient)")


class Detaches(nn.Module):
    """Soft targets from the logits themselves, and a straight-through estimator: both need
    detach() to be a stop-gradient."""

    def __init__(self, detach=True):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6))
        self.stop = (lambda t: t.detach()) if detach else (lambda t: t)

    def forward(self, x):
        y = x * self.w
        ste = y + self.stop(torch.tanh(y * 3.0) - y)
        return F.cross_entropy(y, torch.softmax(self.stop(y) * 0.5, -1)) + (ste * ste).sum()


def test_detach_is_a_stop_gradient_as_in_torch():
    """torch.export's detach() is kept out of run_decompositions (which would make it an
    alias) and recorded as the table's detach: loss and gradient torch's, and the gradient
    is not the one of the same model without the detaches."""
    torch.manual_seed(4)
    module, x = Detaches(), torch.randn(4, 6)
    result, ref = import_matching_torch(module, (x,))
    assert sum(n.op == "detach" for n in result.tape.nodes) == 2
    plain = Detaches(detach=False)
    plain.load_state_dict(module.state_dict())
    _, plain_ref = torch_reference(plain, (x,))
    assert np.linalg.norm(plain_ref["w"] - ref["w"]) > 1e-3 * np.linalg.norm(ref["w"])


class Bags(nn.Module):
    """nn.EmbeddingBag: a 2-d input (equal bags) by mean and max, a 1-d input with fixed
    offsets (unequal bags, one empty) by sum."""

    def __init__(self):
        super().__init__()
        self.mean = nn.EmbeddingBag(10, 4, mode="mean")
        self.max = nn.EmbeddingBag(10, 4, mode="max")
        self.sum = nn.EmbeddingBag(10, 4, mode="sum")
        self.head = nn.Linear(4, 3)

    def forward(self, ids, flat):
        offsets = torch.tensor([0, 2, 2, 5])
        h = self.mean(ids) * self.max(ids) + self.sum(flat, offsets)[:2]
        return (self.head(h) ** 2).mean()


def test_embedding_bag_matches_torch():
    torch.manual_seed(7)
    module = Bags()
    ids, flat = torch.tensor([[0, 2, 3], [2, 7, 9]]), torch.tensor([1, 2, 3, 4, 5, 6, 9])
    import_matching_torch(module, (ids, flat))


class NoGrad(nn.Module):
    """A target computed under torch.no_grad() (and a stretch re-enabling grad inside it)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6))

    def forward(self, x):
        y = x * self.w
        with torch.no_grad():
            target = torch.softmax(y * 2.0, -1)
            with torch.enable_grad():
                live = y * y
        return F.cross_entropy(y, target) + live.mean()


def test_values_computed_under_no_grad_carry_no_gradient():
    """run_decompositions inlines a no_grad block without a trace of it; the importer
    detaches the block's values first, so the gradient is torch's (differentiating the
    target too gives another, by more than 1e-3)."""
    torch.manual_seed(8)
    module, x = NoGrad(), torch.randn(4, 6)
    result, ref = import_matching_torch(module, (x,))
    assert sum(n.op == "detach" for n in result.tape.nodes) == 1
    m = copy.deepcopy(module)
    with torch.enable_grad():
        y = x.double() * m.double().w
        full = F.cross_entropy(y, torch.softmax(y * 2.0, -1)) + (y * y).mean()
    full.backward()
    assert np.linalg.norm(m.w.grad.numpy() - ref["w"]) > 1e-3 * np.linalg.norm(ref["w"])


class GradReverse(torch.autograd.Function):
    """A gradient-reversal layer (domain-adversarial training): the identity forward, -g
    backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -g


class Adversarial(nn.Module):
    def __init__(self, custom=True):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6))
        self.custom = custom

    def forward(self, x):
        y = x * self.w
        r = GradReverse.apply(y) if self.custom else y.detach() - (y - y.detach())
        return (r * torch.tanh(y)).sum()


def test_a_custom_autograd_function_is_refused_and_the_suggested_rewrite_is_torchs():
    """torch.export records a custom Function's forward and drops its backward: imported as
    is, the gradient would be the identity's (a silent wrong result), so it is one error
    naming the class and the line; the rewrite the message suggests imports and gives
    the custom Function's gradient, as torch computes it."""
    torch.manual_seed(9)
    module, x = Adversarial(), torch.randn(4, 6)
    before = torch.autograd.Function.__dict__["apply"]
    with pytest.raises(TorchImportError) as info:
        import_module(module, (x,), dtype="f64")
    assert len(info.value.lines) == 1
    line = info.value.lines[0]
    assert line.startswith("custom torch.autograd.Function GradReverse (x")
    assert "GradReverse.apply(y)" in line and "drops its backward" in line
    assert torch.autograd.Function.__dict__["apply"] is before           # restored
    rewrite = Adversarial(custom=False)
    rewrite.load_state_dict(module.state_dict())
    import_matching_torch(rewrite, (x,), reference=module)   # torch runs its backward


class Hooked(nn.Module):
    def __init__(self, hook=True):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.hook = hook

    def forward(self, x):
        y = self.fc(x)
        if self.hook:
            y.register_hook(lambda g: g * 2.0)
        else:
            y = y.detach() + 2.0 * (y - y.detach())
        return (torch.tanh(y) ** 2).mean()


def test_gradient_hooks_are_refused_and_the_suggested_rewrite_is_torchs():
    """torch.export drops Tensor.register_hook, module backward hooks and parameter
    hooks, which exist to change gradients: each is one error line at the hook, and
    the forward-side rewrite the message suggests gives the hooked gradient."""
    torch.manual_seed(11)
    x = torch.randn(3, 6)
    module = Hooked()
    before = torch.Tensor.register_hook
    with pytest.raises(TorchImportError) as info:
        import_module(module, (x,), dtype="f64")
    assert torch.Tensor.register_hook is before
    assert len(info.value.lines) == 1
    assert info.value.lines[0].startswith("gradient hook Tensor.register_hook (x1) at ")
    assert "y.register_hook(lambda g: g * 2.0)" in info.value.lines[0]
    rewrite = Hooked(hook=False)
    rewrite.load_state_dict(module.state_dict())
    import_matching_torch(rewrite, (x,), reference=module)   # torch runs the hook
    hooked = Hooked(hook=False)
    hooked.fc.register_full_backward_hook(lambda m, gi, go: (gi[0] * 3.0,))
    hooked.fc.bias.register_hook(lambda g: g * 0.0)
    with pytest.raises(TorchImportError) as info:
        import_module(hooked, (x,), dtype="f64")
    lines = info.value.lines
    assert len(lines) == 2
    assert lines[0].startswith("backward hook on module fc (x1) at ") and "lambda" in lines[0]
    assert lines[1].startswith("gradient hook on parameter fc.bias (x1) at ")


class PickTrueClass(nn.Module):
    """A custom loss: the log-probability of each example's true class by x[rows, labels],
    labels an input slot."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 4)

    def forward(self, x, labels):
        logp = torch.log_softmax(self.fc(x), -1)
        return -logp[torch.arange(x.shape[0]), labels].mean()


def test_indexing_by_rows_and_input_labels_trains_like_torch(tmp_path):
    torch.manual_seed(12)
    module = PickTrueClass()
    x, labels = torch.randn(6, 5), torch.tensor([0, 3, 1, 1, 2, 3])
    result, _ = import_matching_torch(module, (x, labels))
    ce = F.cross_entropy(copy.deepcopy(module.fc).double()(x.double()), labels).item()
    loss = float(result.tape.values[result.loss.id][0])
    assert abs(loss - ce) <= 1e-12 * ce                 # the same loss as cross_entropy
    path = tmp_path / "pick.msgpack"
    result.save(path)
    require_c_compiler()
    out = run("replay-gpu", path, "--backend", "host", "--check", "--episodes", "2",
              "--warmup", "0")
    assert out.exit_code == 0, out.output


class TrackedInstanceNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, bias=False)      # a bias before a norm has none
        self.norm = nn.InstanceNorm2d(3, affine=True, track_running_stats=True)

    def forward(self, x):
        return (self.norm(self.conv(x)) * torch.arange(16.0).reshape(4, 4)).mean()


def test_instance_norm_with_running_statistics_carries_them_as_state():
    """torch writes InstanceNorm's averaged statistics back with aten.copy, which now
    imports: the running mean and variance are training state whose new values equal
    torch's buffers after the same forward."""
    torch.manual_seed(13)
    module, x = TrackedInstanceNorm(), torch.randn(2, 2, 6, 6)
    result, _ = import_matching_torch(module, (x,))
    assert set(result.state) == {"norm.running_mean", "norm.running_var"}
    ref = copy.deepcopy(module).double()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        ref(x.double())
    finally:
        torch.set_default_dtype(default)
    buffers = dict(ref.named_buffers())
    for name in result.state:
        got = result.tape.value(result.outputs[name])
        assert np.abs(got - buffers[name].numpy()).max() <= 1e-14, name


class Checkpointed(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.reentrant = reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        h = checkpoint(lambda t: torch.tanh(self.fc(t)), x, use_reentrant=self.reentrant)
        return (h * h).mean()


def test_activation_checkpointing_imports_and_the_reentrant_form_is_one_error():
    torch.manual_seed(10)
    x = torch.randn(3, 6)
    module = Checkpointed(reentrant=False)
    import_matching_torch(module, (x,))
    with pytest.raises(TorchImportError) as info:
        import_module(Checkpointed(reentrant=True), (x,), dtype="f64")
    assert len(info.value.lines) == 1
    assert info.value.lines[0].startswith("reentrant torch.utils.checkpoint")
    assert "use_reentrant=False" in info.value.lines[0]


class PaddedEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4, padding_idx=2)
        self.head = nn.Linear(4, 3)

    def forward(self, ids):
        return (self.head(self.emb(ids)) ** 2).mean()


def test_embedding_with_padding_idx_gives_its_row_no_gradient():
    torch.manual_seed(5)
    module = PaddedEmbedding()
    with torch.no_grad():
        module.emb.weight[2] = 0.5          # a nonzero padding row: its values still read
    ids = torch.tensor([[0, 2, 3], [2, 2, 9]])
    result, _ = import_matching_torch(module, (ids,))
    g = result.tape.grad(result.params["emb.weight"])
    assert_bits_equal(g[2], np.zeros(4))
    assert np.all(g[[0, 3, 9]] != 0.0)


class Factories(nn.Module):
    """Tensors the forward creates without a dtype: float32 where the default dtype is."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6))

    def forward(self, x):
        y = x * self.w + torch.tensor(0.1)
        return (y * torch.full((4, 6), 0.3) + torch.arange(6.0)).pow(2).sum()


def test_tensors_the_forward_creates_are_float64():
    """The export (and run_decompositions' re-trace, and the folding) run with the default
    dtype float64: the loss is the float64 program's within 1e-12, where the float32
    constants 0.1f and 0.3f would be 1e-9 away."""
    torch.manual_seed(6)
    module, x = Factories(), torch.randn(4, 6)
    import_matching_torch(module, (x,))
    ref_loss, _ = torch_reference(module, (x,))
    f32_consts = copy.deepcopy(module).double()(x.double()).item()   # default float32
    assert abs(f32_consts - ref_loss) > 1e-10 * abs(ref_loss)
    assert torch.get_default_dtype() == torch.float32                 # restored


class Norms(nn.Module):
    """A batch norm of any rank in train mode, then a weight it does not cancel."""

    def __init__(self, norm, shape):
        super().__init__()
        self.norm = norm
        self.w = nn.Parameter(torch.randn(*shape[1:]))

    def forward(self, x):
        return ((self.norm(x) * self.w).sin()).sum()


@pytest.mark.parametrize("norm, shape", [(nn.BatchNorm1d(3), (5, 3)),
                                         (nn.BatchNorm1d(3), (4, 3, 6)),
                                         (nn.BatchNorm3d(2), (3, 2, 2, 3, 2))],
                         ids=["BatchNorm1d [N,C]", "BatchNorm1d [N,C,L]", "BatchNorm3d"])
def test_batch_norm_of_every_rank_and_its_running_statistics_match_torch(norm, shape):
    torch.manual_seed(14)
    module, x = Norms(norm, shape).train(), torch.randn(*shape)
    result = import_module(module, (x,), dtype="f64")
    tape = result.tape
    tape.backward(result.loss)
    ref = copy.deepcopy(module).double()
    ref_loss = ref(x.double())
    ref_loss.backward()
    assert abs(float(tape.value(result.loss)[0]) - ref_loss.item()) <= 1e-12 * abs(
        ref_loss.item())
    for name, p in ref.named_parameters():
        g = tape.grad(result.params[name])
        assert np.linalg.norm(g - p.grad.numpy()) <= 1e-11 * np.linalg.norm(p.grad.numpy()), name
    buffers = dict(ref.named_buffers())
    assert sorted(result.outputs) == sorted(buffers)       # each a state output of its name
    for name, v in result.outputs.items():
        want = buffers[name].double().numpy()
        assert np.abs(tape.value(v) - want).max() <= 1e-12 * max(1.0, np.abs(want).max()), name


def test_the_unet_layers_train_to_the_same_bytes_on_every_engine_and_two_ranks(tmp_path):
    """The new layers' records (transposed convolution, group and instance norm, both
    upsamplings, adaptive pooling) through `gradtool train`: cpu, host, host fused and
    two MPI ranks save the same bytes."""
    module, _ = unet_case()
    torch.manual_seed(15)
    result = import_module(module, (torch.randn(8, 2, 8, 8), torch.randint(0, 3, (8,))), dtype="f64")
    rng = np.random.default_rng(15)
    assert_trains_to_the_same_bytes(result, tmp_path, ranks=2,
                                    x=rng.standard_normal((32, 2, 8, 8)),
                                    y=rng.integers(0, 3, 32))
