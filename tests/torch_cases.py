"""The torch models and checks more than one test file uses: the importer's
(test_interop_torch.py, test_import_*.py, test_fd_models.py): the model-set members other
tests use too (the MLP, GPT-2, RMSNorm, the U-Net layers, the spatial transformer, the
metric layers, the transposed 3-d convolution), :func:`needs`, :func:`torch_reference`
(torch float64 autograd of a module), :func:`import_matching_torch` and
:func:`assert_trains_to_the_same_bytes`; and the wrapper's (test_wrap.py,
test_wrap_optim.py): the pieces of a user's own loop on the digits.

Not a test file: a test file imports it after its own ``pytest.importorskip("torch")``,
and it guards torch the same way, so without torch importing it skips (pytest's skip),
never an ImportError.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import gradtool as gt                                          # noqa: E402
import gradtool.interop.torch as gtt                           # noqa: E402
from gradtool.interop.torch import import_module               # noqa: E402
from conftest import assert_bits_equal, require_c_compiler     # noqa: E402
from support import ROOT, run, train_under_mpiexec             # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)


def needs(*methods):
    """Skip (naming them) where this build's Tape lacks ops a model imports to."""
    from gradtool import nn as gnn
    missing = [m for m in methods
               if not (hasattr(gnn, m[3:]) if m.startswith("nn.") else hasattr(gt.Tape, m))]
    return pytest.mark.skipif(bool(missing), reason=f"this build lacks {missing}")


class MLP(nn.Module):
    def __init__(self, n_in=6, hidden=10, classes=4):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x, y):
        return F.cross_entropy(self.fc2(F.relu(self.fc1(x))), y)


def mlp_case():
    torch.manual_seed(1)
    x = torch.randn(7, 6)
    y = torch.tensor([0, 3, -100, 1, 2, -100, 3])
    return MLP(), (x, y)


class Block(nn.Module):
    def __init__(self, d, heads, approximate):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)
        self.approximate = approximate

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q = q.view(B, T, self.heads, D // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, D // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, D // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.0)
        x = x + self.drop(self.proj(a.transpose(1, 2).contiguous().view(B, T, D)))
        h = F.gelu(self.fc(self.ln2(x)), approximate=self.approximate)
        return x + self.drop(self.out(h))


class GPT(nn.Module):
    def __init__(self, vocab=13, block=8, d=8, heads=2, layers=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.ModuleList(
            [Block(d, heads, "tanh" if i % 2 == 0 else "none") for i in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight                     # tied

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(0, T, dtype=torch.long)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def gpt_case():
    torch.manual_seed(2)
    m = GPT().eval()
    idx = torch.randint(0, 13, (2, 6))
    tgt = torch.randint(0, 13, (2, 6))
    return m, (idx, tgt)


class RMSNorm(nn.Module):          # as Llama's reference code writes it
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class UNetLike(nn.Module):
    """The layers of a small U-Net / decoder: GroupNorm, InstanceNorm, a strided transposed
    convolution (output_padding), nearest and bilinear upsampling, a skip joined by cat, adaptive
    average pooling to 3x3 and max pooling to 3x2 (windows that overlap), flip, then a
    classifier.  (No bias
    right before a norm that subtracts its mean: its gradient would be zero up to
    rounding, which no relative tolerance can compare.)"""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(2, 4, 3, stride=2, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.inorm = nn.InstanceNorm2d(4, affine=True)
        self.up = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
        self.mix = nn.Conv2d(5, 4, 1)
        self.pool = nn.AdaptiveAvgPool2d(3)
        self.mpool = nn.AdaptiveMaxPool2d((3, 2))
        self.head = nn.Linear(60, 3)

    def forward(self, x, y):
        h = F.silu(self.gn(self.down(x)))                          # [N, 4, 4, 4]
        u = self.up(self.inorm(h))                                 # [N, 3, 8, 8]
        s = F.interpolate(h[:, :2], scale_factor=2, mode="nearest")   # [N, 2, 8, 8]
        s = s + F.interpolate(h[:, 2:], size=(8, 8), mode="bilinear")
        s = s * F.interpolate(h[:, 1:3], scale_factor=(2, 2), mode="bilinear",
                              align_corners=True)
        z = self.mix(torch.cat([u, s.flip(3)], 1))                 # [N, 4, 8, 8]
        z = z[:, :, :7]
        f = torch.cat([self.pool(z).flatten(1), self.mpool(z).flatten(1)], 1)
        return F.cross_entropy(self.head(f), y)


def unet_case():
    torch.manual_seed(12)
    return UNetLike(), (torch.randn(2, 2, 8, 8), torch.tensor([0, 2]))


def torch_reference(module, inputs):
    """Loss and param grads of torch float64 autograd on a float64 copy of ``module``, with
    torch's default dtype float64 (the importer's dtype policy)."""
    m = copy.deepcopy(module).double()
    args = [t.double() if t.is_floating_point() else t for t in inputs]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        loss = m(*args)
    finally:
        torch.set_default_dtype(default)
    loss.backward()
    grads = {k: p.grad.numpy().copy() for k, p in m.named_parameters() if p.requires_grad}
    return loss.item(), grads


def import_matching_torch(module, inputs, reference=None):
    """Import ``module`` and assert its loss (1e-12 relative) and every param's gradient
    (1e-11 norm-wise) equal torch float64 autograd's of ``reference`` (default the module
    itself; for a rewrite, the original whose gradient it must reproduce).  Returns the
    import and torch's gradients by name."""
    result = import_module(module, inputs, dtype="f64")
    result.tape.backward(result.loss)
    ref_loss, ref = torch_reference(reference if reference is not None else module, inputs)
    loss = float(result.tape.values[result.loss.id][0])
    assert abs(loss - ref_loss) <= 1e-12 * abs(ref_loss), (loss, ref_loss)
    for name, g in ref.items():
        got = result.tape.grad(result.params[name])
        assert np.linalg.norm(got - g) <= 1e-11 * np.linalg.norm(g), name
    return result, ref


ENGINES = (("cpu", []), ("host", ["--backend", "host"]),
           ("fused", ["--backend", "host", "--fuse"]))


def assert_trains_to_the_same_bytes(result, tmp_path, engines=ENGINES, ranks=0, **arrays):
    """``result`` saved and trained by `gradtool train` for 2 epochs on ``arrays`` (the
    data, by input name) on each engine, and with ``ranks`` MPI ranks (then every run
    with ``--shards 2``): every run saves the same bytes, trained ones (not the file's
    own)."""
    require_c_compiler()
    path = tmp_path / "model.msgpack"
    result.save(path)
    data = tmp_path / "data.npz"
    np.savez(data, **arrays)
    common = ["--data", data, "--epochs", 2] + (["--shards", 2] if ranks else [])
    saved = trained_bytes(path, common, tmp_path, engines)
    if ranks:
        saved[f"{ranks} ranks"] = train_under_mpiexec(path, common, tmp_path / "mpi.msgpack",
                                                      ranks)
    assert len(set(saved.values())) == 1 and saved["cpu"] != path.read_bytes()


def trained_bytes(path, common, tmp_path, engines=ENGINES) -> dict:
    """`gradtool train path *common` on each engine (label, extra args): the saved
    file's bytes by label, each run checked to exit 0."""
    saved = {}
    for label, extra in engines:
        out = tmp_path / f"{label}.msgpack"
        res = run("train", path, *common, *extra, "--save", out)
        assert res.exit_code == 0, res.output
        saved[label] = out.read_bytes()
    return saved


class Metric(nn.Module):
    """nn.Bilinear, cdist (p = 2 and 1, with zero distances on the diagonal: gradient
    0 there, as torch's), pdist, and 3-d adaptive pooling of uneven windows."""

    def __init__(self):
        super().__init__()
        self.bil = nn.Bilinear(5, 4, 3)
        self.fc = nn.Linear(5, 5)

    def forward(self, x, y):
        h = self.fc(x)
        vol = h.view(1, 2, 3, 5)
        return ((self.bil(x, y) ** 2).sum() + (torch.cdist(h, x + 1) * 0.3).sum()
                + F.pdist(h).sum() + torch.cdist(h, h, p=1).sum()
                + (torch.cdist(h[:3], h[:3]) ** 2).sum()
                + (F.adaptive_avg_pool3d(vol, (2, 2, 3)) ** 2).sum()
                + F.adaptive_max_pool3d(vol.unsqueeze(0), 2).sum())


class Transposed3d(nn.Module):
    """nn.ConvTranspose3d: grouped, strided, padded, output_padding; then dilated,
    padded past the kernel (a crop), no bias."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose3d(4, 6, (2, 3, 2), stride=(2, 1, 2), padding=(0, 1, 1),
                                     output_padding=(1, 0, 1), groups=2)
        self.mix = nn.ConvTranspose3d(6, 2, 3, padding=2, dilation=(1, 2, 1), bias=False)

    def forward(self, x):
        return (self.mix(torch.tanh(self.up(x))) ** 2).mean()


class SpatialTransformer(nn.Module):
    """F.affine_grid + F.grid_sample (bilinear, zeros) on a conv's output, theta learnt:
    the identity (source coordinates on the pixels, where bilinear weights have their
    kinks: the gradient is torch's floor rule) or jittered; a crop of the grid samples
    between pixels and past the border."""

    def __init__(self, align_corners, jitter, crop):
        super().__init__()
        self.align_corners, self.crop = align_corners, crop
        eye = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        self.theta = nn.Parameter(eye + jitter * torch.randn(2, 3))
        self.conv = nn.Conv2d(2, 3, 3)

    def forward(self, x):
        y = self.conv(x)
        shape = list(x.shape if self.crop else y.shape)
        g = F.affine_grid(self.theta.unsqueeze(0).expand(x.shape[0], 2, 3), shape,
                          align_corners=self.align_corners)
        if self.crop:
            g = g[:, 1:-1, 1:-1]
        return (F.grid_sample(y, g, align_corners=self.align_corners) ** 2).mean()


# ── a user's own loop (tests/test_wrap.py, tests/test_wrap_optim.py) ─────────

def digits_tensors(n, dtype):
    """The repository's first ``n`` digits as torch tensors: the pixels / 16 as ``dtype``
    (a numpy float type) and the integer labels."""
    data = np.load(ROOT / "samples" / "digits.npz")
    x = data["x"][:n].astype(dtype) / 16.0
    y = data["y"][:n].argmax(1).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def seeded_loader(x, y):
    """A DataLoader of batches of 128 shuffled by a seeded generator (a last partial
    batch each epoch)."""
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=128,
                                       shuffle=True,
                                       generator=torch.Generator().manual_seed(0))


def clipped_step(model, opt, loss, max_norm):
    """One step of a user's loop: backward, gtt.clip_grad_norm_, the optimizer's step."""
    loss.backward()
    gtt.clip_grad_norm_(model.parameters(), max_norm)
    opt.step()
    opt.zero_grad()


def assert_same_state_bytes(cpu, host):
    """Two trained modules' state dicts hold the same bytes, entry by entry."""
    hs = host.state_dict()
    for k, v in cpu.state_dict().items():
        assert_bits_equal(hs[k].numpy(), v.numpy(), k)
