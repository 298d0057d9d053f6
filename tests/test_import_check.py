"""The PyTorch import checked against torch's own run of the program.

Every import runs torch on the exported program and compares the recorded loss: it
finds torch's wrong decomposition of multilabel_margin_loss and a mapping that computes
another value, each one line.  And the ops that check covers beyond the model set:
argmax/argmin ties, pow of two tensors, the elementwise math of the table's functions
at chosen points (and where torch's float64 is off), hypot, bilinear and distances, 3-d
transposed convolution and pooling, grid_sample, logcumsumexp, channel and alpha
dropouts, stochastic depth, fmax/fmin, a VAE's draws; the caller's program is left
alone.  Skipped cleanly without torch.
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
from gradtool.interop import aten as A                         # noqa: E402
from gradtool.interop.torch import TorchImportError, import_module  # noqa: E402
from conftest import require_c_compiler                        # noqa: E402
from torch_cases import (ENGINES, Metric, SpatialTransformer, Transposed3d,  # noqa: E402
                         assert_trains_to_the_same_bytes, import_matching_torch,
                         mlp_case)

warnings.filterwarnings("ignore", category=FutureWarning)


class MultiLabel(nn.Module):
    """nn.MultiLabelMarginLoss: each row's targets end at the first -1."""

    def __init__(self, reduction="mean"):
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.reduction = reduction

    def forward(self, x, targets):
        out = F.multilabel_margin_loss(self.fc(x), targets, reduction=self.reduction)
        return out if self.reduction != "none" else (out * torch.arange(1.0, 6.0)).sum()


MULTI_LABEL_TARGETS = torch.tensor([[0, 1, -1, 2], [3, -1, 0, 0], [-1, 2, 2, 2],
                                    [2, 1, 0, 3], [1, 1, -1, 0]])


def test_torchs_wrong_decomposition_of_multilabel_margin_loss_is_found_and_named():
    """torch 2.13's decomposition of multilabel_margin_loss reads the entries after a
    row's -1 end marker as targets: another loss.  Run through torch's own default
    decompositions, the check finds the difference and names the op and its line."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from gradtool.interop import verify
    torch.manual_seed(20)
    x = torch.randn(5, 4, dtype=torch.float64)
    op = torch.ops.aten.multilabel_margin_loss.default
    table = torch.export.default_decompositions()
    decomposed = make_fx(lambda a, t: op(a, t, 1), decomposition_table=table)(
        x, MULTI_LABEL_TARGETS)(x, MULTI_LABEL_TARGETS)
    if not abs(float(decomposed) - float(op(x, MULTI_LABEL_TARGETS, 1))) > 1e-3:
        pytest.skip("this torch's decomposition of multilabel_margin_loss is right")
    module = MultiLabel().double()
    ep = torch.export.export(module, (torch.randn(5, 8, dtype=torch.float64),
                                      MULTI_LABEL_TARGETS))
    want, _ = verify.torch_loss(ep, 0)
    bad = float(ep.run_decompositions(table).module()(*ep.example_inputs[0]))
    assert abs(bad - want) > 1e-3 * abs(want)          # what a plain import would record
    from gradtool.interop.torch import _Problems
    problems = _Problems()
    verify.check_against_torch(ep, table, bad, 0, problems)
    (line,) = problems.error().lines
    assert line.startswith("wrong decomposition of aten.multilabel_margin_loss.default (x1) at ")
    assert "F.multilabel_margin_loss(self.fc(x), targets" in line
    problems = _Problems()
    verify.check_against_torch(ep, table, want, 0, problems)    # torch's own value passes
    assert not problems


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multilabel_margin_loss_imports_as_torchs_op(reduction):
    """Kept out of run_decompositions and recorded by its own entry: loss and gradients
    torch's, with targets an i64 input slot (rows ending early, repeats, none at all)."""
    torch.manual_seed(21)
    result, _ = import_matching_torch(MultiLabel(reduction),
                                      (torch.randn(5, 8), MULTI_LABEL_TARGETS))
    assert result.histogram["aten.multilabel_margin_loss.default"] == 1
    assert gt.fd_check(result.tape, result.loss).passed


def test_a_mapping_that_computes_another_value_is_refused(monkeypatch):
    """The check against torch's run catches a wrong recording too (here relu recorded
    as abs): one line with both losses, and nothing imported."""
    entry = A.ATEN["aten.relu.default"]
    monkeypatch.setitem(A.ATEN, "aten.relu.default",
                        A.Entry(entry.name, lambda r, node, a: r.tp.abs(r.f(a)), (), ""))
    module, inputs = mlp_case()
    with pytest.raises(TorchImportError) as info:
        import_module(module, inputs, dtype="f64")
    (line,) = info.value.lines
    assert line.startswith("imported loss differs from torch's (")
    monkeypatch.undo()
    import_matching_torch(module, inputs)


class ArgExtremes(nn.Module):
    """argmax of logits (an accuracy-style one-hot product), argmin along an axis, and
    a max's indices; ties and a NaN-free tie-break as torch's (the first extreme)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        y = self.fc(x)
        hot = F.one_hot(y.argmax(dim=1), 4).to(y.dtype)
        tied = torch.round(y * 2) / 2                         # exact ties to break
        lows = tied.argmin(dim=0, keepdim=True).to(y.dtype)
        flat = tied.argmax().to(y.dtype)
        return (hot * y).sum() + (lows * tied[:1]).sum() + flat * y.mean()


def test_argmax_and_argmin_import_with_torchs_ties():
    torch.manual_seed(22)
    import_matching_torch(ArgExtremes(), (torch.randn(7, 6),))


class Powers(nn.Module):
    """pow of two tensors: a learnt exponent on a positive base, a number base (2 ** y),
    and a negative base whose exponent tensor holds integers (an odd one negates)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 4)
        self.e = nn.Parameter(torch.tensor([0.5, 1.5, -0.7, 2.0]))

    def forward(self, x):
        y = self.fc(x)
        base = torch.sigmoid(y) + 0.1
        ints = torch.tensor([1.0, 2.0, 3.0, 0.0])
        return (base ** (y + self.e)).sum() + (2.0 ** y).mean() + ((-base) ** ints).sum()


def test_pow_of_two_tensors_imports_as_torchs():
    torch.manual_seed(23)
    result, _ = import_matching_torch(Powers(), (torch.randn(6, 5),))
    assert result.histogram["aten.pow.Tensor_Tensor"] >= 2
    assert gt.fd_check(result.tape, result.loss).passed


MATH_POINTS = {
    "log2": [1e-300, 0.3, 1.0, 1.0 + 2.0 ** -40, 7.5, 1e300],
    "log10": [1e-300, 0.3, 1.0, 1.0 + 2.0 ** -40, 7.5, 1e300],
    "exp2": [-1000.0, -3.3, -1e-20, 0.0, 0.7, 10.5, 1000.0],
    "tan": [-1.5, -1e-10, 0.0, 0.3, 1.2, 100.0],
    "sinh": [-710.0, -30.0, -21.9, -1.0, -1e-9, -0.0, 0.0, 1e-300, 0.5, 22.0, 300.0, 710.0],
    "cosh": [-710.0, -30.0, -1.0, -1e-9, 0.0, 1e-8, 0.5, 21.99, 22.0, 300.0, 710.0],
    "asinh": [-1e10, -2.0, -1e-12, -0.0, 0.0, 1e-300, 0.5, 3.0, 2.0 ** 28, 1e100],
    "acosh": [1.0 + 1e-12, 1.5, 2.0, 3.0, 1e8, 2.0 ** 28, 1e100],
    "atanh": [-0.5, -1e-10, -0.0, 0.0, 1e-300, 0.25, 0.5, 0.75],
    "asin": [-1.0, -0.999999, -0.5, -1e-300, -0.0, 0.0, 1e-10, 0.3, 0.7, 1.0, 1.5],
    "acos": [-1.0, -0.999999, -0.5, -1e-300, -0.0, 0.0, 1e-10, 0.3, 0.7, 1.0, 1.5],
}


class OneFunction(nn.Module):
    """torch.<fn> of a parameter vector, each entry weighted: values and gradients at
    chosen points (piece boundaries, signed zeros, tiny and huge arguments)."""

    def __init__(self, fn, points):
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(torch.tensor(points, dtype=torch.float64))

    def forward(self, c):
        return getattr(torch, self.fn)(self.w) * c


@pytest.mark.parametrize("fn", sorted(MATH_POINTS))
def test_elementwise_math_from_the_tables_functions_matches_torch(fn):
    """log2, log10, exp2, tan, sinh, cosh, asinh, acosh, atanh: per point, the value
    (1e-12 relative, signed zeros and infinities exactly) and the gradient (1e-11) are
    torch float64's."""
    points = MATH_POINTS[fn]
    for i, p in enumerate(points):
        module = OneFunction(fn, points)
        c = torch.zeros(len(points), dtype=torch.float64)
        c[i] = 1.0
        result = import_module(_Pick(module, i), (c,), dtype="f64")
        result.tape.backward(result.loss)
        w = torch.tensor([p], dtype=torch.float64, requires_grad=True)
        y = getattr(torch, fn)(w)
        y.sum().backward()
        got = float(result.tape.values[result.loss.id][0])
        grad = float(result.tape.grad(result.params["inner.w"])[i])
        want, want_g = float(y), float(w.grad)
        if math.isnan(want):                      # outside the domain: NaN, as torch's
            assert math.isnan(got) and math.isnan(grad) == math.isnan(want_g), (fn, p)
            continue
        assert math.copysign(1.0, got) == math.copysign(1.0, want), (fn, p, got, want)
        assert got == want or abs(got - want) <= 1e-12 * abs(want), (fn, p, got, want)
        assert grad == want_g or abs(grad - want_g) <= 1e-11 * abs(want_g), \
            (fn, p, grad, want_g)


class _Pick(nn.Module):
    """Entry i of a module's vector output (a scalar loss for the import)."""

    def __init__(self, inner, i):
        super().__init__()
        self.inner, self.i = inner, i

    def forward(self, c):
        return self.inner(c)[self.i]


def test_elementwise_math_where_torchs_float64_is_off():
    """Where torch's float64 formulas lose accuracy, gradtool's are the exact values
    (50-digit mpmath): atanh's gradient near -1 (torch 5e-10 off), asin's near 1 (torch
    3e-10 off: 1 - x*x cancels), asinh and acosh of 1e300 (torch's gradient underflows
    to 0 through x*x)."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    for fn, p, exact in (("atanh", -0.999999999, lambda x: 1 / (1 - x * x)),
                         ("asin", 0.99999999, lambda x: 1 / mpmath.sqrt(1 - x * x)),
                         ("asinh", 1e300, lambda x: 1 / mpmath.sqrt(x * x + 1)),
                         ("acosh", 1e300, lambda x: 1 / mpmath.sqrt(x * x - 1))):
        result = import_module(_Pick(OneFunction(fn, [p]), 0), (torch.ones(1),), dtype="f64")
        result.tape.backward(result.loss)
        grad = float(result.tape.grad(result.params["inner.w"])[0])
        want = float(exact(mpmath.mpf(p)))
        assert abs(grad - want) <= 4e-16 * abs(want), (fn, grad, want)
        got = float(result.tape.values[result.loss.id][0])
        value = float(getattr(mpmath, fn)(mpmath.mpf(p)))
        assert abs(got - value) <= 4e-16 * abs(value), (fn, got, value)


def test_hypot_matches_torch_and_keeps_range():
    """hypot: torch's values and gradients (a/h, b/h, also on a tie |a| == |b|), and
    no overflow where a*a would (1e200), inf where either is inf."""
    class Hypot(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.tensor([3.0, -2.0, 1e200, 1e-200, 0.5, -0.7],
                                               dtype=torch.float64))

        def forward(self, b):
            return (torch.hypot(self.a, b) * torch.arange(1.0, 7.0)).sum() / 1e200

    b = torch.tensor([4.0, 2.0, 1e200, -3e-200, 0.0, 0.7], dtype=torch.float64)
    import_matching_torch(Hypot(), (b,))
    inf = torch.tensor([math.inf, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    result = import_module(Hypot(), (inf,), dtype="f64")
    assert float(result.tape.values[result.loss.id][0]) == math.inf


def test_bilinear_distances_and_3d_adaptive_pooling_match_torch():
    torch.manual_seed(24)
    result, _ = import_matching_torch(Metric(), (torch.randn(6, 5), torch.randn(6, 4)))
    for op in ("aten._trilinear.default", "aten._cdist_forward.default",
               "aten._pdist_forward.default", "aten._adaptive_avg_pool3d.default",
               "aten.adaptive_max_pool3d.default"):
        assert result.histogram[op] >= 1, op
    assert gt.fd_check(result.tape, result.loss).passed


def test_conv_transpose3d_matches_torch():
    torch.manual_seed(25)
    result, _ = import_matching_torch(Transposed3d(), (torch.randn(2, 4, 3, 4, 3),))
    assert result.histogram["aten.convolution.default"] == 2


@pytest.mark.parametrize("kernel, stride, padding, count_include_pad", [
    ((2, 2, 2), None, 0, True), ((3, 2, 3), (2, 2, 2), (1, 1, 1), True),
    ((3, 2, 3), (2, 2, 2), (1, 1, 1), False), (2, 2, 1, True), (3, 2, 1, False)])
def test_avg_pool3d_with_ceil_mode_matches_torch(kernel, stride, padding, count_include_pad):
    """ceil_mode's last windows hang over the padded input: torch's divisors (the taps
    inside the padded depth, or inside the input) per axis."""
    torch.manual_seed(26)
    module = nn.Sequential(nn.Conv3d(2, 2, 1),
                           nn.AvgPool3d(kernel, stride, padding, ceil_mode=True,
                                        count_include_pad=count_include_pad))
    wrapped = _Squares(module)
    import_matching_torch(wrapped, (torch.randn(1, 2, 5, 6, 7),))


class _Squares(nn.Module):
    """The sum of squares of a module's output (a scalar loss for the import)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return (self.inner(x) ** 2).sum()


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("jitter, crop", [(0.0, False), (0.0, True), (0.1, True)])
def test_spatial_transformer_grid_sample_matches_torch(align_corners, jitter, crop):
    torch.manual_seed(27)
    result, _ = import_matching_torch(SpatialTransformer(align_corners, jitter, crop),
                                      (torch.randn(2, 2, 7, 8),))
    assert result.histogram["aten.grid_sampler_2d.default"] == 1


def test_grid_sample_other_modes_are_refused_in_one_line():
    class Nearest(SpatialTransformer):
        def forward(self, x):
            g = F.affine_grid(self.theta.unsqueeze(0), [1, 2, 4, 4], align_corners=False)
            return F.grid_sample(x, g, mode="nearest", align_corners=False).sum()

    with pytest.raises(TorchImportError) as info:
        import_module(Nearest(False, 0.0, False), (torch.randn(1, 2, 5, 5),), dtype="f64")
    (line,) = info.value.lines
    assert line.startswith("unsupported use of aten.grid_sampler_2d.default (x1) at ")
    assert "mode 'nearest'" in line


class LogCumSumExp(nn.Module):
    """torch.logcumsumexp along both axes, entries far apart (x300, x-900: one exp of
    the line's maximum would underflow) and -inf entries (which stay -inf)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        y = self.fc(x) * torch.tensor([1.0, 300.0, 1.0, -900.0, 2.0])
        y = torch.cat([y, torch.full((x.shape[0], 2), -math.inf), y[:, :1]], 1)
        return ((torch.logcumsumexp(y, 1) * torch.linspace(0.1, 1.0, 8)).sum()
                + torch.logcumsumexp(y[:, :2], 0).sum())


def test_logcumsumexp_matches_torch():
    torch.manual_seed(28)
    result, _ = import_matching_torch(LogCumSumExp(), (torch.randn(4, 6),))
    assert result.histogram["aten.logcumsumexp.default"] == 2


class ChannelDropouts(nn.Module):
    """nn.Dropout1d/2d/3d, AlphaDropout and FeatureAlphaDropout in train mode (torch's
    run_decompositions would turn them into bernoulli, which is refused)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 6, 1)
        self.fc = nn.Linear(4, 4)
        self.d1, self.d2, self.d3 = nn.Dropout1d(0.2), nn.Dropout2d(0.3), nn.Dropout3d(0.4)
        self.alpha, self.feature_alpha = nn.AlphaDropout(0.2), nn.FeatureAlphaDropout(0.25)

    def forward(self, x):
        h = self.conv(x)
        return ((self.d2(h) ** 2).mean() + self.d1(h[:, :, 0]).sum()
                + self.d3(h.unsqueeze(2)).mean()
                + self.alpha(torch.selu(self.fc(x[:, 0, 0]))).sum()
                + (self.feature_alpha(h) ** 2).mean())


def test_channel_and_alpha_dropouts_import_and_train(tmp_path):
    torch.manual_seed(29)
    m = ChannelDropouts().train()
    x = torch.randn(8, 2, 4, 4)
    result = import_module(m, (x,), dtype="f64")               # the import check passed inside
    assert result.histogram["gradtool.feature_dropout.default"] == 3
    assert result.histogram["gradtool.alpha_dropout.default"] == 2
    shapes = [n.aux["shape"] for n in result.tape.nodes if n.op == "uniform"]
    assert shapes == [[8, 6, 1, 1], [8, 6, 1], [8, 6, 1, 1, 1], [8, 4], [8, 6, 1, 1]]
    tape = result.tape
    tape.set_value(tape.rng(), [0.0, 0.0, 0.0])
    tape.forward()
    with torch.no_grad():
        want = float(copy.deepcopy(m).double().eval()(x.double()))
    assert abs(float(tape.values[result.loss.id][0]) - want) <= 1e-12 * abs(want)
    plain = import_module(copy.deepcopy(m).eval(), (x,), dtype="f64")
    assert not any(n.op == "uniform" for n in plain.tape.nodes)
    require_c_compiler()
    tape.set_value(tape.rng(), [0.0, 0.0, 1.0])
    tape.forward()
    assert_trains_to_the_same_bytes(result, tmp_path, ENGINES[:2],
                                    x=np.random.default_rng(8).standard_normal((32, 2, 4, 4)))


class StochasticDepth(nn.Module):
    """DropPath (timm's and torchvision's stochastic depth: a per-sample bernoulli mask
    divided by the keep probability) on a residual branch, and bernoulli of a tensor of
    probabilities."""

    def __init__(self, keep=0.8):
        super().__init__()
        self.keep = keep
        self.branch = nn.Linear(4, 4)
        self.gate = nn.Linear(4, 4)

    def forward(self, x):
        mask = x.new_empty((x.shape[0], 1)).bernoulli_(self.keep)
        mask.div_(self.keep)
        h = x + self.branch(x) * mask
        return (h ** 2).sum() + (x * torch.bernoulli(torch.sigmoid(self.gate(x)))).sum()

    def mean_loss(self, x):
        """The loss with each draw replaced by its mean (what the flag 0 computes)."""
        h = x + self.branch(x) * (torch.full((x.shape[0], 1), self.keep) / self.keep)
        return (h ** 2).sum() + (x * torch.sigmoid(self.gate(x))).sum()


def test_stochastic_depth_and_bernoulli_import_and_train(tmp_path):
    torch.manual_seed(30)
    m = StochasticDepth().train()
    x = torch.randn(6, 4)
    result = import_module(m, (x,), dtype="f64")               # the import check (draws as means) passed
    assert result.histogram["aten.bernoulli.p"] == 1
    assert result.histogram["aten.bernoulli.default"] == 1
    tape = result.tape
    assert [n.aux["shape"] for n in tape.nodes if n.op == "uniform"] == [[6, 1], [6, 4]]
    tape.set_value(tape.rng(), [0.0, 0.0, 0.0])
    tape.forward()
    with torch.no_grad():
        want = float(copy.deepcopy(m).double().mean_loss(x.double()))
    assert abs(float(tape.values[result.loss.id][0]) - want) <= 1e-12 * abs(want)
    tape.set_value(tape.rng(), [0.0, 0.0, 1.0])
    tape.forward()
    assert_trains_to_the_same_bytes(result, tmp_path,
                                    x=np.random.default_rng(9).standard_normal((24, 4)))


class NanAware(nn.Module):
    """torch.fmax and torch.fmin: the other operand where one is NaN (a NaN mask on the
    input's values), broadcasting, ties."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        holes = torch.where(x > 1.0, torch.full_like(x, float("nan")), y)
        return (torch.fmax(holes, y.flip(0)).sum() + torch.fmin(holes, y[:1]).sum()
                + torch.fmax(y, y).sum())


def test_fmax_and_fmin_match_torch():
    torch.manual_seed(34)
    x = torch.randn(6, 4)
    assert bool((x > 1.0).any())
    result, _ = import_matching_torch(NanAware(), (x,))
    assert result.histogram["aten.fmax.default"] == 2


def test_import_program_leaves_the_callers_program_alone():
    """The check against torch runs the exported (training) IR, which updates batch
    norm's running statistics and num_batches_tracked in place: on copies, so the
    caller's program keeps every buffer and example bit for bit (and so does a second
    import of it)."""
    from gradtool.interop.torch import import_program
    torch.manual_seed(35)
    module = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3), nn.Flatten(),
                           nn.Linear(27, 1)).double().train()
    x = torch.randn(4, 2, 3, 3, dtype=torch.float64)
    ep = torch.export.export(_Squares(module), (x,))
    before = {k: v.clone() for k, v in ep.state_dict.items()}
    example = ep.example_inputs[0][0].clone()
    first = import_program(ep)
    for k, v in ep.state_dict.items():
        assert torch.equal(v, before[k]), k
    assert torch.equal(ep.example_inputs[0][0], example)
    second = import_program(ep)
    assert float(first.tape.values[first.loss.id][0]) == \
        float(second.tape.values[second.loss.id][0])


class VAE(nn.Module):
    """A variational autoencoder: z = mu + exp(logvar / 2) * randn_like(mu), noise by
    torch.randn and torch.normal (number and tensor means), reconstruction + KL."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(6, 4)
        self.dec = nn.Linear(2, 6)

    def forward(self, x, eps_scale=1.0):
        mu, logvar = self.enc(x).chunk(2, -1)
        if eps_scale:
            z = mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)
            z = z + torch.randn(x.shape[0], 2) * 0.1 + torch.normal(mu, 0.5)
        else:                                 # every draw its mean: what the flag 0 gives
            z = mu + mu
        return (((self.dec(z) - x) ** 2).sum()
                - 0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum())


def test_a_vae_imports_and_trains_to_the_same_bytes(tmp_path):
    torch.manual_seed(36)
    m = VAE()
    x = torch.randn(5, 6)
    result = import_module(m, (x,), dtype="f64")               # the import check (draws as means) passed
    for op in ("aten.randn_like.default", "aten.randn.default", "aten.normal.Tensor_float"):
        assert result.histogram[op] == 1, op
    tape = result.tape
    tape.set_value(tape.rng(), [0.0, 0.0, 0.0])
    tape.forward()
    with torch.no_grad():
        want = float(copy.deepcopy(m).double()(x.double(), eps_scale=0))
    assert abs(float(tape.values[result.loss.id][0]) - want) <= 1e-12 * abs(want)
    tape.set_value(tape.rng(), [0.0, 0.0, 1.0])
    tape.forward()
    assert float(tape.values[result.loss.id][0]) != want
    assert_trains_to_the_same_bytes(result, tmp_path,
                                    x=np.random.default_rng(12).standard_normal((20, 6)))
