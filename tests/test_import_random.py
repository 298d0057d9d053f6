"""The PyTorch importer on models that draw: rand, randint and randperm (diffusion, a
DDPM UNet, flow matching, mixup, REINFORCE): with the rng slot's flag 0 each draw is its
mean and the loss and gradients are torch float64's of the same model with those values;
with the flag 1 the draws are live; `gradtool train` gives the same bytes on every
engine.  Float-to-integer conversions and integer index arithmetic give torch's ids;
draws past exact integers and a record the tape refuses are one line each.  Skipped
cleanly without torch.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from gradtool.interop.torch import TorchImportError, import_module  # noqa: E402
from torch_cases import (assert_trains_to_the_same_bytes, import_matching_torch,  # noqa: E402
                         torch_reference)

warnings.filterwarnings("ignore", category=FutureWarning)


class Diffusion(nn.Module):
    """A DDPM training step: a timestep per sample by torch.randint, the noise schedule
    gathered by it (abar[t]), noise by randn_like, the timestep fed to the network as
    t / T; with ``mean`` every draw is what the flag 0 gives (the middle step, no noise)."""

    def __init__(self, d=3, steps=40):
        super().__init__()
        self.steps = steps
        betas = torch.linspace(1e-4, 0.2, steps, dtype=torch.float64)
        self.register_buffer("abar", torch.cumprod(1 - betas, 0).float())
        self.net = nn.Sequential(nn.Linear(d + 1, 16), nn.SiLU(), nn.Linear(16, d))

    def forward(self, x0, mean=False):
        if mean:
            t = torch.full((x0.shape[0],), (self.steps - 1) // 2)
            noise = torch.zeros_like(x0)
        else:
            t = torch.randint(0, self.steps, (x0.shape[0],))
            noise = torch.randn_like(x0)
        a = self.abar[t].unsqueeze(1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        pred = self.net(torch.cat([xt, (t.to(x0.dtype) / self.steps).unsqueeze(1)], 1))
        return F.mse_loss(pred, noise)


class FlowMatching(nn.Module):
    """Rectified flow: t by torch.rand, x0 by randn_like, the velocity x1 - x0 regressed
    at (1 - t) x0 + t x1; with ``mean``: t = 0.5, x0 = 0."""

    def __init__(self, d=3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d + 1, 16), nn.SiLU(), nn.Linear(16, d))

    def forward(self, x1, mean=False):
        t = torch.full((x1.shape[0], 1), 0.5) if mean else torch.rand(x1.shape[0], 1)
        x0 = torch.zeros_like(x1) if mean else torch.randn_like(x1)
        xt = (1 - t) * x0 + t * x1
        return F.mse_loss(self.net(torch.cat([xt, t], 1)), x1 - x0)


class Mixup(nn.Module):
    """Mixup inside the model (x[perm] by torch.randperm, the targets mixed alike), a
    bucket id by (torch.rand * 3).long() into an embedding, uniform_ noise; with ``mean``:
    perm the identity, the bucket int(1.5) = 1, the noise 0."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bucket = nn.Embedding(3, 3)

    def forward(self, x, y, mean=False):
        n = x.shape[0]
        perm = torch.arange(n) if mean else torch.randperm(n)
        xm = 0.7 * x + 0.3 * x[perm]
        ids = torch.ones(n, dtype=torch.long) if mean else (torch.rand(n) * 3).long()
        noise = torch.zeros(n, 3) if mean else torch.empty(n, 3).uniform_(-1, 1)
        out = self.fc(xm) + self.bucket(ids) + noise
        return 0.7 * F.cross_entropy(out, y) + 0.3 * F.cross_entropy(out, y[perm])


class Reinforce(nn.Module):
    """REINFORCE: actions sampled from the policy by torch.distributions.Categorical and
    by torch.multinomial (two draws each with replacement), their log-probabilities
    weighted by the rewards; with ``mean`` every action is the most likely one."""

    def __init__(self):
        super().__init__()
        self.policy = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))

    def forward(self, x, reward, mean=False):
        logits = self.policy(x)
        dist = torch.distributions.Categorical(logits=logits, validate_args=False)
        probs = F.softmax(logits, -1)
        if mean:
            a = logits.argmax(-1)
            b = a[:, None].expand(-1, 2)
        else:
            a = dist.sample()
            b = torch.multinomial(probs, 2, replacement=True)
        picked = torch.log(probs.gather(1, b)).sum(1)
        return -((dist.log_prob(a) + picked) * reward).mean()


def _timestep_embedding(t, dim):
    """The sinusoidal timestep embedding of DDPM's UNet (t a tensor of int64 steps)."""
    freqs = torch.exp(-math.log(10000.0) * torch.arange(dim // 2) / (dim // 2))
    angles = t.to(freqs.dtype)[:, None] * freqs[None]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class _ResBlock(nn.Module):
    def __init__(self, cin, cout, tdim):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(4, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(tdim, cout)
        self.n2, self.c2 = nn.GroupNorm(4, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, te, drop):
        h = self.c1(F.silu(self.n1(x))) + self.t(te)[:, :, None, None]
        h = self.c2(F.dropout(F.silu(self.n2(h)), 0.1, drop))
        return h + self.skip(x)


class DiffusionUNet(nn.Module):
    """A small DDPM UNet as its users write it: randint timesteps, randn_like noise, the
    schedule gathered by the steps, a sinusoidal embedding of them through an MLP,
    GroupNorm/SiLU residual blocks with train-mode dropout, a strided down-sampling conv,
    nearest up-sampling and a skip concat; ``mean``: the flag-0 values and no dropout."""

    def __init__(self, steps=100):
        super().__init__()
        self.steps = steps
        self.temb = nn.Sequential(nn.Linear(16, 16), nn.SiLU(), nn.Linear(16, 16))
        self.inc = nn.Conv2d(1, 8, 3, padding=1)
        self.down1, self.down = _ResBlock(8, 8, 16), nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.mid = _ResBlock(8, 8, 16)
        self.up, self.up1 = nn.Upsample(scale_factor=2), _ResBlock(16, 8, 16)
        self.out = nn.Conv2d(8, 1, 3, padding=1)
        self.register_buffer("abar", torch.cumprod(1 - torch.linspace(1e-4, 0.02, steps), 0))

    def forward(self, x0, mean=False):
        n = x0.shape[0]
        if mean:
            t, noise = torch.full((n,), (self.steps - 1) // 2), torch.zeros_like(x0)
        else:
            t, noise = torch.randint(0, self.steps, (n,)), torch.randn_like(x0)
        a = self.abar[t].view(-1, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        te = self.temb(_timestep_embedding(t, 16))
        drop = self.training and not mean
        h1 = self.down1(self.inc(xt), te, drop)
        h2 = self.mid(self.down(h1), te, drop)
        h = self.up1(torch.cat([self.up(h2), h1], 1), te, drop)
        return F.mse_loss(self.out(h), noise)


class _MeanDraws(nn.Module):
    """``module`` with every draw its flag-0 value (forward(..., mean=True))."""

    def __init__(self, module):
        super().__init__()
        self.inner = module

    def forward(self, *args):
        return self.inner(*args, mean=True)


RANDOM_MODELS = {
    "diffusion": (Diffusion, lambda g: (torch.randn(8, 3, generator=g),),
                  ("aten.randint.low", "aten.randn_like.default")),
    "unet": (DiffusionUNet, lambda g: (torch.randn(4, 1, 8, 8, generator=g),),
             ("aten.randint.low", "aten.randn_like.default", "aten.native_dropout.default")),
    "reinforce": (Reinforce, lambda g: (torch.randn(8, 4, generator=g),
                                        torch.randn(8, generator=g)),
                  ("aten.multinomial.default",)),
    "flow": (FlowMatching, lambda g: (torch.randn(8, 3, generator=g),),
             ("aten.rand.default", "aten.randn_like.default")),
    "mixup": (Mixup, lambda g: (torch.randn(6, 4, generator=g),
                                torch.randint(0, 3, (6,), generator=g)),
              ("aten.randperm.default", "aten.rand.default", "aten.uniform.default")),
}


@pytest.mark.parametrize("name", sorted(RANDOM_MODELS))
def test_models_drawing_rand_randint_randperm_import_and_train(name, tmp_path):
    """Each imports (the check against torch with every draw its mean passed); with the
    flag 0 its loss and gradients are torch float64's of the same model with those values;
    with the flag 1 the draws are live (another loss); `gradtool train` gives the same
    bytes on cpu, host and host --fuse, and (but the UNet, for time) on two MPI ranks."""
    make, example, ops = RANDOM_MODELS[name]
    torch.manual_seed(40)
    module = make()
    inputs = example(torch.Generator().manual_seed(41))
    result = import_module(module, inputs, dtype="f64")
    for op in ops:
        assert result.histogram[op] >= 1, op
    tape = result.tape
    tape.set_value(tape.rng(), [0.0, 0.0, 0.0])
    tape.forward()
    tape.zero_grad()
    tape.backward(result.loss)
    ref_loss, ref = torch_reference(_MeanDraws(module), inputs)
    loss = float(tape.values[result.loss.id][0])
    assert abs(loss - ref_loss) <= 1e-12 * abs(ref_loss), (loss, ref_loss)
    for key, g in ref.items():
        got = tape.grad(result.params[key.removeprefix("inner.")])
        assert np.linalg.norm(got - g) <= 1e-11 * np.linalg.norm(g), key
    tape.set_value(tape.rng(), [3.0, 0.0, 1.0])
    tape.forward()
    assert float(tape.values[result.loss.id][0]) != loss
    rng = np.random.default_rng(13)
    assert_trains_to_the_same_bytes(result, tmp_path, ranks=0 if name == "unet" else 2, **{
        k: (rng.standard_normal((24,) + tuple(t.shape[1:])) if t.is_floating_point()
            else rng.integers(0, 3, (24,) + tuple(t.shape[1:])))
        for k, t in zip(result.inputs, inputs)})


def test_a_float_converted_to_an_integer_dtype_truncates_as_torch():
    """x.long() of computed floats (bucketing: floor for positives, toward zero for
    negatives) gives ids, and bool() is x != 0 (a NaN counts as True): torch's values."""

    class Buckets(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(7, 2)
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            ids = (x * 2.5).long() + 3                       # -1.2 * 2.5 -> -3: id 0
            keep = torch.where(x > 1.0, torch.nan, x - 0.5).bool()
            return (self.fc(self.emb(ids)).square() * keep.unsqueeze(-1)).sum()

    x = torch.tensor([[-1.2, -0.3, 0.0, 0.39], [0.41, 1.1, 0.5, -0.45]])
    result, _ = import_matching_torch(Buckets(), (x,))
    assert result.histogram["aten._to_copy.default"] >= 2
    assert sum(n.op == "trunc" for n in result.tape.nodes) == 1


class IndexArithmetic(nn.Module):
    """Ids computed from integer data the way models write them: shifted by a number,
    clamped into range, flipped, the minimum of two (and of a folded integer tensor),
    a where with a folded integer tensor, scaled and offset into a flat table."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(12, 2)

    def forward(self, x, ids):
        shifted = self.emb((ids - 2).clamp(0, 5)).sum(-1)
        flipped = self.emb(torch.minimum(ids + 1, ids.flip(0))).sum(-1)
        flat = self.emb(ids * 2 + 1).sum(-1)
        capped = self.emb(torch.minimum(ids + 7, torch.full_like(ids, 11))).sum(-1)
        held = self.emb(torch.where(ids > 2, ids, torch.tensor([9, 8, 7, 6, 5]))).sum(-1)
        return ((shifted + flipped * x + flat + capped * held) ** 2).sum()


def test_integer_index_arithmetic_gives_ids_as_torch():
    torch.manual_seed(42)
    x = torch.randn(5)
    ids = torch.tensor([0, 3, 5, 4, 1])
    result, _ = import_matching_torch(IndexArithmetic(), (x, ids))
    for op, count in (("aten.clamp.default", 1), ("aten.flip.default", 1),
                      ("aten.minimum.default", 2), ("aten.where.self", 1)):
        assert result.histogram[op] == count, op


class HugeRandint(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        return (self.fc(x) * torch.randint(0, 2 ** 60, (3, 2))).sum()


def test_a_randint_beyond_exact_integers_is_refused_in_one_line():
    """Draws past 2^53 would not be whole float64 numbers (nor drawn alike): refused,
    naming the op and its bounds, nothing recorded."""
    with pytest.raises(TorchImportError) as info:
        import_module(HugeRandint(), (torch.randn(3, 2),), dtype="f64")
    (line,) = info.value.lines
    assert line.startswith("unsupported use of aten.randint.low (x1) at "), line
    assert line.endswith(f"randint over [0, {2 ** 60}) (gradtool draws integers in [low, high) "
                         f"with low < high <= low + 2^53, both within +-2^53)"), line


class LongPermutation(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        return (self.fc(x).sum() * torch.randperm(3000)[:4]).sum()


def test_a_record_the_tape_refuses_is_one_line_naming_the_op():
    """randperm(3000) sorts 3000 draws pairwise, past Tape.sort's limit: the tape's own
    refusal (a TapeError inside the mapping) becomes the import's one line, with the op
    and its source line, and nothing after it is recorded."""
    with pytest.raises(TorchImportError) as info:
        import_module(LongPermutation(), (torch.randn(3, 2),), dtype="f64")
    (line,) = info.value.lines
    assert line.startswith("cannot record aten.randperm.default (x1) at "), line
    assert "torch.randperm(3000)" in line and line.endswith(
        "sort: rows of 3000 entries compared pairwise: 1 x 3000 x 3000 elements exceed the "
        "limit of 4194304"), line
