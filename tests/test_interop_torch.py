"""The PyTorch importer (gradtool.interop.torch) on models written in plain torch.nn.

Each model is exported by the real torch.export, recorded, saved and loaded back as a
tape file, and then checked against torch float64 autograd of the same module (loss
within 1e-12 relative, every parameter's gradient within 1e-11 relative norm-wise), by
finite differences, and on the host C backend (``replay-gpu --backend host --check``:
identical to the bit to the CPU engine).  Skipped cleanly without torch.
"""

from __future__ import annotations

import copy
import json
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import gradtool as gt                                          # noqa: E402
from gradtool.interop import aten as A                         # noqa: E402
from gradtool.interop.torch import (TorchImportError, import_module,  # noqa: E402
                                    load_weights)
from conftest import assert_bits_equal, require_c_compiler      # noqa: E402
from support import run, train_under_mpiexec                   # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)


def needs(*methods):
    """Skip (naming them) where this build's Tape lacks ops a model imports to."""
    from gradtool import nn as gnn
    missing = [m for m in methods
               if not (hasattr(gnn, m[3:]) if m.startswith("nn.") else hasattr(gt.Tape, m))]
    return pytest.mark.skipif(bool(missing), reason=f"this build lacks {missing}")


# ── the models ─────────────────────────────────────────────────────────────

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


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    """RMSNorm, RoPE (tables of constant positions), SwiGLU, grouped-query attention
    (repeat_interleave of the key/value heads), as Qwen2/Llama write it."""

    def __init__(self, d=16, heads=4, kv_heads=2, hidden=24, vocab=11, max_t=8):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.embed = nn.Embedding(vocab, d)
        self.norm1 = RMSNorm(d)
        self.q = nn.Linear(d, heads * self.hd, bias=True)
        self.k = nn.Linear(d, kv_heads * self.hd, bias=True)
        self.v = nn.Linear(d, kv_heads * self.hd, bias=True)
        self.o = nn.Linear(heads * self.hd, d, bias=False)
        self.norm2 = nn.RMSNorm(d, eps=1e-6)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        self.lm = nn.Linear(d, vocab, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.embed(idx)
        pos = torch.arange(T).float()
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        h = self.norm1(x)
        q = self.q(h).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.k(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v[:, :, None].expand(B, self.kv_heads, rep, T, self.hd).reshape(
            B, self.heads, T, self.hd)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, -1))
        h = self.norm2(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return F.cross_entropy(self.lm(x).flatten(0, 1), targets.flatten())


def llama_case():
    torch.manual_seed(3)
    return LlamaBlock(), (torch.randint(0, 11, (2, 5)), torch.randint(0, 11, (2, 5)))


class WhereModel(nn.Module):
    """Masks with torch.where on its inputs: a leaky clamp of x, a validity mask."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 3)

    def forward(self, x, valid, t):
        h = torch.where(x > 0, x, 0.1 * x)
        y = self.fc(h)
        err = torch.where(valid, (y - t) ** 2, torch.zeros_like(y))
        return err.sum() / valid.sum()


def where_case():
    torch.manual_seed(4)
    x = torch.randn(6, 5)
    valid = torch.rand(6, 3) > 0.3
    return WhereModel(), (x, valid, torch.randn(6, 3))


class GRUModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(4, 5, batch_first=True)
        self.head = nn.Linear(5, 2)

    def forward(self, x, t):
        out, h = self.rnn(x)
        return F.mse_loss(self.head(out[:, -1]), t)


def gru_case():
    torch.manual_seed(5)
    return GRUModel(), (torch.randn(3, 4, 4), torch.randn(3, 2))


class LSTMModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(3, 4, batch_first=True)
        self.head = nn.Linear(4, 1)

    def forward(self, x, t):
        out, _ = self.rnn(x)
        return F.mse_loss(self.head(out).squeeze(-1), t)


def lstm_case():
    torch.manual_seed(6)
    return LSTMModel(), (torch.randn(2, 3, 3), torch.randn(2, 3))


class MHAModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 3)

    def forward(self, x, y):
        a, _ = self.attn(x, x, x, need_weights=False)
        return F.cross_entropy(self.head(self.norm(x + a)).mean(1), y)


def mha_case():
    torch.manual_seed(7)
    return MHAModel().eval(), (torch.randn(2, 5, 8), torch.tensor([0, 2]))


class RopeFromInputs(nn.Module):
    """RoPE on positions that are an input (so sin and cos stay on the tape)."""

    def __init__(self, d=8):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)))

    def forward(self, x, pos, t):
        freqs = pos[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        q = self.q(x)
        q = q * emb.cos() + rotate_half(q) * emb.sin()
        return F.mse_loss(q, t)


def rope_inputs_case():
    torch.manual_seed(11)
    return RopeFromInputs(), (torch.randn(2, 5, 8), torch.arange(10.0).view(2, 5) * 3.5,
                              torch.randn(2, 5, 8))


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


class Seq1d(nn.Module):
    """A 1-d decoder: Conv1d, BatchNorm1d of [N, C, L] (train mode), a grouped
    ConvTranspose1d, cumsum over time, and BatchNorm1d of [N, C] after a Linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 3, bias=False)
        self.bn = nn.BatchNorm1d(4)
        self.up = nn.ConvTranspose1d(4, 2, 4, stride=3, padding=1, groups=2)
        self.fc = nn.Linear(2, 5)
        self.side = nn.Linear(3, 5, bias=False)
        self.bn2 = nn.BatchNorm1d(5)

    def forward(self, x, t):
        h = self.up(F.relu(self.bn(self.conv(x))))                 # [N, 2, L']
        h = torch.cumsum(h, dim=2).mean(2)                         # [N, 2]
        return F.mse_loss(self.fc(h) + self.bn2(self.side(x.mean(2))), t)


def seq1d_case():
    torch.manual_seed(13)
    return Seq1d(), (torch.randn(4, 3, 7), torch.randn(4, 5))


class TopKMoE(nn.Module):
    """A mixture of experts with top-2 routing, dense: every expert runs, the router's two
    best per token are picked by topk's indices (gather of expanded ids) and weighted by
    a softmax over their logits."""

    def __init__(self, d=6, experts=4, k=2):
        super().__init__()
        self.k = k
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(experts))

    def forward(self, x, y):
        logits, idx = torch.topk(self.router(x), self.k, dim=-1)
        gates = torch.softmax(logits, -1)
        outs = torch.stack([F.gelu(e(x)) for e in self.experts], 1)           # [B, E, d]
        picked = outs.gather(1, idx.unsqueeze(-1).expand(-1, -1, outs.shape[-1]))
        return F.mse_loss((gates.unsqueeze(-1) * picked).sum(1), y)


class Net3d(nn.Module):
    """A volumetric CNN: Conv3d (padding; then stride, groups), BatchNorm3d in train mode,
    MaxPool3d, AvgPool3d, LocalResponseNorm (an avg_pool3d over channels)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv3d(2, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm3d(4)
        self.pool = nn.MaxPool3d(2)
        self.c2 = nn.Conv3d(4, 4, (2, 3, 3), stride=(1, 2, 1), groups=2)
        self.avg = nn.AvgPool3d((1, 2, 2))
        self.lrn = nn.LocalResponseNorm(3)
        self.head = nn.Linear(4, 3)

    def forward(self, x, y):
        h = self.pool(F.relu(self.bn(self.c1(x))))
        h = self.lrn(self.avg(F.relu(self.c2(h))))
        return F.cross_entropy(self.head(h.mean((2, 3, 4))), y)


def net3d_case():
    torch.manual_seed(15)
    return Net3d(), (torch.randn(2, 2, 6, 10, 10), torch.tensor([0, 2]))


class Normalised(nn.Module):
    """Weight parametrizations: spectral_norm (a power-iteration step under no_grad whose
    u, v buffers are training state) and weight_norm; an exponential moving average
    buffer updated under no_grad and read by the loss.  Before no_grad blocks were
    detached, the EMA model's gradient was 5-10% off torch's, spectral_norm's 7e-8."""

    def __init__(self):
        super().__init__()
        from torch.nn.utils.parametrizations import spectral_norm, weight_norm
        self.sn = spectral_norm(nn.Linear(5, 4))
        self.wn = weight_norm(nn.Linear(4, 4))
        self.register_buffer("avg", torch.zeros(4))

    def forward(self, x):
        h = self.wn(torch.tanh(self.sn(x)))
        with torch.no_grad():
            self.avg.mul_(0.9).add_(0.1 * h.mean(0))
        return ((h - self.avg) ** 2).mean()


class AngleFeatures(nn.Module):
    """An angle feature atan2(y, x) of two Linear outputs (torch.arctan2 too, against a
    broadcast row), an erfc-based gate and atan: fdlibm's erfc, atan and atan2."""

    def __init__(self):
        super().__init__()
        self.px = nn.Linear(5, 4)
        self.py = nn.Linear(5, 4)
        self.out = nn.Linear(8, 3)

    def forward(self, x, t):
        u, v = self.px(x), self.py(x)
        angle = torch.atan2(v, u) + torch.arctan2(u, torch.full((4,), -0.5))
        gate = 0.5 * torch.erfc(-v / math.sqrt(2.0))          # the normal CDF of v
        h = torch.cat([angle, gate * torch.atan(3.0 * u)], dim=1)
        return F.mse_loss(self.out(h), t)


def angle_case():
    torch.manual_seed(17)
    return AngleFeatures(), (torch.randn(9, 5), torch.randn(9, 3))


def normalised_case():
    torch.manual_seed(16)
    return Normalised(), (torch.randn(6, 5),)


class GNN(nn.Module):
    """Two rounds of message passing over an edge list (inputs): messages are rows of a
    linear map picked by the edges' sources, summed into their destinations by
    index_add, by scatter_add_ with the destinations expanded (PyG's and
    torch_scatter's pattern) and by index_put_(accumulate=True) into a learnt base."""

    def __init__(self, d_in=4, d=5, nodes=6):
        super().__init__()
        self.nodes = nodes
        self.msg1 = nn.Linear(d_in, d)
        self.msg2 = nn.Linear(d, d)
        self.self2 = nn.Linear(d, d)
        self.base = nn.Parameter(torch.randn(nodes, d) * 0.1)
        self.head = nn.Linear(d, 1)

    def forward(self, x, src, dst, y):
        m1 = self.msg1(x)[src]                                        # [E, d]
        h = torch.relu(torch.zeros(self.nodes, m1.shape[1]).index_add(0, dst, m1))
        m2 = self.msg2(h)[src]
        agg = torch.zeros(self.nodes, m2.shape[1])
        agg.scatter_add_(0, dst.view(-1, 1).expand_as(m2), m2)
        h2 = torch.tanh(agg + self.self2(h))
        acc = self.base.clone()
        acc.index_put_((dst,), h2[src] * 0.5, accumulate=True)
        return F.mse_loss(self.head(acc).squeeze(-1), y)


def gnn_case():
    torch.manual_seed(15)
    src = torch.tensor([0, 1, 2, 3, 4, 5, 0, 2, 2, 4])
    dst = torch.tensor([1, 2, 3, 4, 0, 0, 2, 1, 1, 3])             # node 5 gets nothing
    return GNN(), (torch.randn(6, 4), src, dst, torch.randn(6))


def moe_case():
    torch.manual_seed(14)
    return TopKMoE(), (torch.randn(16, 6), torch.randn(16, 6))


CASES = {
    "mlp_cross_entropy": (mlp_case, ("ne", "where", "to_f64")),
    "gpt2": (gpt_case, ("ne", "eq", "where", "logical_not", "logical_and", "erf", "to_f64")),
    "llama_block": (llama_case, ("ne", "eq", "where", "logical_not", "to_f64")),
    "where_inputs": (where_case, ("gt", "where")),
    "gru": (gru_case, ()),
    "lstm": (lstm_case, ()),
    "multihead_attention": (mha_case, ("ne", "where", "to_f64")),
    "rope_positions_input": (rope_inputs_case, ("sin", "cos")),
    "unet_layers": (unet_case, ("ne", "where", "to_f64", "conv2d", "avg_pool2d",
                                "max_pool2d", "nn.group_norm", "nn.conv_transpose2d")),
    "conv1d_batch_norm_1d": (seq1d_case, ("conv2d", "nn.conv_transpose1d", "cumsum")),
    "top2_mixture_of_experts": (moe_case, ("topk", "erf")),
    "gnn_message_passing": (gnn_case, ("scatter", "index_add")),
    "parametrizations_and_ema": (normalised_case, ("detach",)),
    "conv3d_net": (net3d_case, ("conv2d", "nn.conv3d", "nn.max_pool3d", "nn.avg_pool3d")),
    "angle_erfc_features": (angle_case, ("atan2", "erfc", "atan")),
    "spatial_transformer": (lambda: stn_case(), ("nn.grid_sample",)),
    "metric_layers": (lambda: metric_case(), ("nn.adaptive_avg_pool3d",)),
    "transposed_3d": (lambda: transposed3d_case(), ("nn.conv_transpose3d",)),
}


def stn_case():
    torch.manual_seed(31)
    return SpatialTransformer(False, 0.1, True), (torch.randn(2, 2, 7, 8),)


def metric_case():
    torch.manual_seed(32)
    return Metric(), (torch.randn(6, 5), torch.randn(6, 4))


def transposed3d_case():
    torch.manual_seed(33)
    return Transposed3d(), (torch.randn(2, 4, 3, 4, 3),)


def _case_params():
    out = []
    for name, (fn, methods) in CASES.items():
        out.append(pytest.param(fn, id=name, marks=needs(*methods)))
    return out


# ── the checks ─────────────────────────────────────────────────────────────

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


@pytest.mark.parametrize("case", _case_params())
def test_model_matches_torch_float64(case, tmp_path):
    module, inputs = case()
    result = import_module(module, inputs, dtype="f64")
    path = tmp_path / "model.msgpack"
    result.save(path)
    tf = gt.load(path)
    tape, loss = tf.tape, tf.tape.var(tf.loss)
    tape.backward(loss)
    ref_loss, ref_grads = torch_reference(module, inputs)
    got = float(tape.values[loss.id][0])
    assert abs(got - ref_loss) <= 1e-12 * abs(ref_loss), (got, ref_loss)
    names = [tape.nodes[p.id].name for p in tape.params()]
    assert names == list(ref_grads)              # state_dict names, registration order
    for p in tape.params():
        name = tape.nodes[p.id].name
        g, ref = tape.grad(p), ref_grads[name]
        assert g.shape == ref.shape or (ref.ndim == 0 and g.shape == (1,)), name
        err = np.linalg.norm(g.reshape(-1) - ref.reshape(-1))
        assert err <= 1e-11 * np.linalg.norm(ref), (name, err, np.linalg.norm(ref))
    report = gt.fd_check(tape, loss)
    assert report.passed, [(p.name, p.max_abs_err) for p in report.params if not p.passed]
    require_c_compiler()
    out = run("replay-gpu", path, "--backend", "host", "--check", "--episodes", "2",
              "--warmup", "0")
    assert out.exit_code == 0, out.output


def test_inputs_are_named_slots_and_backward_names_params(tmp_path):
    module, inputs = mlp_case() if hasattr(gt.Tape, "where") else (None, None)
    if module is None:
        pytest.skip("needs the mask ops")
    result = import_module(module, inputs, dtype="f64")
    assert sorted(result.inputs) == ["x", "y"]
    assert result.tape.holds_ids(result.inputs["y"].id)
    path = tmp_path / "m.msgpack"
    result.save(path)
    out = run("backward", path, "--json")
    assert out.exit_code == 0, out.output
    names = [p["name"] for p in json.loads(out.stdout)["params"]]
    assert names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


class Regression(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(4, 6)
        self.l2 = nn.Linear(6, 2)
        self.l2.bias.requires_grad_(False)               # frozen: a const
        self.register_buffer("scale", torch.tensor([2.0, 0.5]))

    def forward(self, x, t):
        y = self.l2(torch.tanh(self.l1(x))) * self.scale
        return F.mse_loss(y, t)


def regression_case():
    torch.manual_seed(8)
    return Regression(), (torch.randn(5, 4), torch.randn(5, 2))


def test_frozen_params_and_buffers_are_consts_named_in_meta(tmp_path):
    module, inputs = regression_case()
    result = import_module(module, inputs, dtype="f64")
    assert list(result.params) == ["l1.weight", "l1.bias", "l2.weight"]
    assert sorted(result.consts) == ["l2.bias", "scale"]
    path = tmp_path / "r.msgpack"
    result.save(path)
    tf = gt.load(path)
    assert sorted(tf.meta["torch"]["consts"]) == ["l2.bias", "scale"]
    assert [tf.tape.nodes[v.id].name for v in tf.tape.input_slots()] == ["x", "t"]
    ref_loss, _ = torch_reference(module, inputs)
    assert abs(float(tf.tape.values[tf.tape.var(tf.loss).id][0]) - ref_loss) <= 1e-12 * abs(ref_loss)


def test_loss_fn_names_its_targets_and_other_outputs_are_named():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x)

    def loss_fn(out, target):
        return F.mse_loss(out, target)

    torch.manual_seed(9)
    net = Net()
    result = import_module(net, (torch.randn(4, 3),), loss_fn, (torch.randn(4, 2),), dtype="f64")
    assert list(result.inputs) == ["x", "target"]
    assert list(result.params) == ["fc.weight", "fc.bias"]

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            y = self.fc(x)
            return (y * y).mean(), y

    r2 = import_module(Two(), (torch.randn(4, 3),), dtype="f64")
    assert list(r2.outputs) == ["output1"]
    assert r2.outputs["output1"].shape == (4, 2)


def test_weights_back_give_torch_the_tapes_loss(tmp_path):
    module, inputs = regression_case()
    result = import_module(module, inputs, dtype="f64")
    tape = result.tape
    rng = np.random.default_rng(0)
    for p in tape.params():               # stand-in for training: new weights
        tape.set_value(p, tape.values[p.id] + 0.1 * rng.standard_normal(p.shape))
    tape.forward()
    path = tmp_path / "trained.msgpack"
    gt.save(tape, path, loss=result.loss)
    copied = load_weights(module, path)
    assert copied == ["l1.weight", "l1.bias", "l2.weight"]
    for name, p in module.named_parameters():
        assert p.dtype == torch.float32
    m64 = copy.deepcopy(module).double()
    with torch.no_grad():
        m64.l1.weight.copy_(torch.from_numpy(tape.values[result.params["l1.weight"].id]))
        m64.l1.bias.copy_(torch.from_numpy(tape.values[result.params["l1.bias"].id]))
        m64.l2.weight.copy_(torch.from_numpy(tape.values[result.params["l2.weight"].id]))
        loss = m64(*[t.double() for t in inputs]).item()
    got = float(tape.values[result.loss.id][0])
    assert abs(loss - got) <= 1e-12 * abs(got)


def test_weights_back_refuse_mismatches_naming_them():
    module, inputs = regression_case()
    result = import_module(module, inputs, dtype="f64")
    other = MLP()
    with pytest.raises(TorchImportError) as info:
        load_weights(other, result)
    text = str(info.value)
    assert "'l1.weight'" in text and "'fc1.weight'" in text
    small = Regression()
    small.l1 = nn.Linear(4, 7)
    small.l2 = nn.Linear(7, 2)
    with pytest.raises(TorchImportError, match="shape mismatch for 'l1.weight'"):
        load_weights(small, result)


# ── failures ───────────────────────────────────────────────────────────────

class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = torch.lgamma(self.fc(x) + x)
        z = torch.digamma(y)
        w = torch.lgamma(z * z)
        return (w * w).sum()


SPEC_FILE = '''
import torch, torch.nn as nn

class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = torch.lgamma(self.fc(x) + x)
        z = torch.digamma(y)
        w = torch.lgamma(z * z)
        return (w * w).sum()

class Nonzero(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = self.fc(x)
        idx = torch.nonzero(y > 0)
        return y[idx[:, 0]].sum()

def unsupported():
    return Unsupported(), (torch.randn(2, 3),)

def nonzero():
    return Nonzero(), (torch.randn(4, 3),)

class Fine(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, input):
        return self.fc(input).square().mean()

def fine():
    torch.manual_seed(0)
    return Fine(), (torch.randn(2, 3),)

def mse(out, target):
    return ((out - target) ** 2).mean()

def with_targets():
    torch.manual_seed(0)
    return nn.Linear(3, 2), (torch.randn(4, 3),), (torch.randn(4, 2),)
'''


def test_unsupported_ops_one_error_listing_each_with_count_and_line():
    with pytest.raises(TorchImportError) as info:
        import_module(Unsupported(), (torch.randn(2, 3),), dtype="f64")
    lines = info.value.lines
    assert len(lines) == 2
    assert lines[0].startswith("unsupported op aten.lgamma.default (x2) at ")
    assert "test_interop_torch.py" in lines[0] and "torch.lgamma(self.fc(x) + x)" in lines[0]
    assert "and 1 more places" in lines[0]
    assert lines[1].startswith("unsupported op aten.digamma.default (x1) at ")


def test_cli_a_model_that_fails_on_its_example_shapes_is_one_line(tmp_path, capfd):
    """torch's fake-tensor logger prints a traceback when an op fails on the example
    shapes; the import keeps it quiet and reports the failure in one line, exit 2."""
    spec = tmp_path / "model.py"
    spec.write_text("import torch\n\ndef build():\n"
                    "    return torch.nn.Linear(2, 1), (torch.randn(3, 5),)\n")
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "gradtool", "import-torch", f"{spec}:build",
                           "-o", str(tmp_path / "m.msgpack"), "--dtype", "f64"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradtool: "), proc.stderr
    assert "torch.export failed: RuntimeError" in lines[0] and "[3, 5]" in lines[0]
    assert not (tmp_path / "m.msgpack").exists()


def test_cli_unsupported_op_exit_2_one_line_per_op_no_file(tmp_path):
    spec = tmp_path / "model.py"
    spec.write_text(SPEC_FILE)
    out_file = tmp_path / "m.msgpack"
    res = run("import-torch", f"{spec}:unsupported", "-o", out_file)
    assert res.exit_code == 2, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 2, res.stderr
    assert "aten.lgamma.default (x2)" in lines[0] and "model.py:10 (forward)" in lines[0]
    assert "aten.digamma.default (x1)" in lines[1] and "model.py:11 (forward)" in lines[1]
    assert all(line.startswith("gradtool: ") for line in lines)
    assert "Traceback" not in res.stderr
    assert not out_file.exists()
    assert list(tmp_path.iterdir()) == [spec]        # no temporary left behind either


def test_cli_nonzero_is_refused_with_its_line(tmp_path):
    spec = tmp_path / "model.py"
    spec.write_text(SPEC_FILE)
    out_file = tmp_path / "m.msgpack"
    res = run("import-torch", f"{spec}:nonzero", "-o", out_file, "--json")
    assert res.exit_code == 2, res.output
    lines = res.stderr.splitlines()
    assert any("aten.nonzero.default" in line and "model.py:22" in line for line in lines), \
        res.stderr
    assert all(line.startswith("gradtool: ") for line in lines)
    report = json.loads(res.stdout)
    assert any(p["target"] == "aten.nonzero.default" for p in report["unsupported"])
    assert not out_file.exists()


def test_cli_writes_a_tape_and_a_json_summary(tmp_path):
    spec = tmp_path / "model.py"
    spec.write_text(SPEC_FILE)
    out_file = tmp_path / "m.msgpack"
    res = run("import-torch", f"{spec}:fine", "-o", out_file, "--json", "--dtype", "f64")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["params"] == {"fc.weight": [1, 3], "fc.bias": [1]}
    assert summary["inputs"] == {"input": {"shape": [2, 3], "dtype": "f64"}}
    assert summary["unsupported"] == []
    assert summary["aten_ops"]["aten.addmm.default"] == 1
    tf = gt.load(out_file)
    assert [tf.tape.nodes[p.id].name for p in tf.tape.params()] == ["fc.weight", "fc.bias"]


def test_cli_bad_spec_is_one_line(tmp_path):
    res = run("import-torch", f"{tmp_path}/nope.py:build", "-o", tmp_path / "m.msgpack")
    assert res.exit_code == 2
    assert len(res.stderr.splitlines()) == 1 and "no such file" in res.stderr


class TrainDropout(nn.Module):
    def __init__(self, p=0.3):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.drop = nn.Dropout(p)
        self.out = nn.Linear(8, 3)

    def forward(self, x, y):
        h = self.drop(torch.tanh(self.fc(x)))
        return F.mse_loss(F.dropout(self.out(h), 0.1, training=self.training), y)


def test_train_mode_dropout_imports_and_matches_torch_eval_with_the_flag_off(tmp_path):
    torch.manual_seed(3)
    m = TrainDropout().train()
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    result = import_module(m, (x, y), dtype="f64")                 # the import check passed inside
    assert result.histogram["aten.native_dropout.default"] == 2
    tape = result.tape
    uniforms = [n for n in tape.nodes if n.op == "uniform"]
    assert [n.aux["salt"] for n in uniforms] == [0, 1]
    assert list(result.params) == ["fc.weight", "fc.bias", "out.weight", "out.bias"]
    assert sorted(v.id for v in tape.input_slots()) == sorted(v.id for v in result.inputs.values())
    with torch.no_grad():
        want = float(copy.deepcopy(m).double().eval()(x.double(), y.double()))
    r = tape.rng()
    tape.set_value(r, [0.0, 0.0, 0.0])
    tape.forward()
    got = float(tape.values[result.loss.id][0])
    assert abs(got - want) <= 1e-12 * abs(want)
    tape.set_value(r, [0.0, 0.0, 1.0])                # train mode: another (dropped) loss
    tape.forward()
    assert float(tape.values[result.loss.id][0]) != got
    # eval mode still imports as the identity: no uniform at all
    plain = import_module(copy.deepcopy(m).eval(), (x, y), dtype="f64")
    assert not any(n.op == "uniform" for n in plain.tape.nodes)
    # and the imported tape trains under gradtool train, every engine the same bytes
    rng = np.random.default_rng(4)
    assert_trains_to_the_same_bytes(result, tmp_path, x=rng.standard_normal((32, 6)),
                                    y=rng.standard_normal((32, 3)))


class ReadsTheMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y, mask = torch.ops.aten.native_dropout(self.fc(x), 0.5, True)
        return (y * mask).sum()


class Poisson(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return (self.fc(x) * torch.poisson(torch.ones(2, 3))).sum()


def test_a_read_mask_and_other_random_ops_stay_refused_in_one_line():
    with pytest.raises(TorchImportError) as info:
        import_module(ReadsTheMask(), (torch.randn(2, 3),), dtype="f64")
    assert len(info.value.lines) == 1, info.value.lines
    assert "native_dropout" in info.value.lines[0] and "a dropout's mask" in info.value.lines[0]
    with pytest.raises(TorchImportError) as info:
        import_module(Poisson(), (torch.randn(2, 3),), dtype="f64")
    assert len(info.value.lines) == 1, info.value.lines
    assert info.value.lines[0].startswith("random op aten.poisson.default (x1) at ")


class DrawsTargets(nn.Module):
    """Random ops outside the table's list: Tensor.geometric_ and Tensor.exponential_
    (aten.geometric.default, aten.exponential.default); their inputs are constants, so
    before the nondeterministic_seeded tag was read such ops were folded: one draw frozen
    into the tape, silently (torch.randint(lo, hi, shape), aten.randint.low, was found so
    by the import check; it now imports as gradtool.nn.randint)."""

    def __init__(self, which):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.which = which

    def forward(self, x):
        y = self.fc(x)
        if self.which == "geometric":
            return (y * torch.empty(x.shape[0], 4).geometric_(0.5)).sum()
        return (y * torch.empty(x.shape[0], 4).exponential_()).sum()


@pytest.mark.parametrize("which, op", [("geometric", "aten.geometric.default"),
                                       ("exponential", "aten.exponential.default")])
def test_every_seeded_random_op_is_refused_not_folded(which, op):
    with pytest.raises(TorchImportError) as info:
        import_module(DrawsTargets(which), (torch.randn(5, 3),), dtype="f64")
    (line,) = info.value.lines
    assert line.startswith(f"random op {op} (x1) at "), line


class Mutates(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        x.mul_(2.0)
        return self.fc(x).sum()


def test_mutating_a_user_input_is_refused():
    with pytest.raises(TorchImportError, match="in-place mutation of user input"):
        import_module(Mutates(), (torch.randn(2, 3),), dtype="f64")


class NotScalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(x)


def test_non_scalar_loss_is_refused():
    with pytest.raises(TorchImportError) as info:
        import_module(NotScalar(), (torch.randn(2, 3),), dtype="f64")
    assert info.value.lines[0].startswith("non-scalar loss of shape [2, 3]")


def test_every_table_entry_is_documented_and_the_table_is_generated():
    from gradtool import codegen
    text = (codegen.ROOT / "docs" / "torch.md").read_text(encoding="utf-8")
    for name in A.ATEN:
        assert f"`{name}`" in text, name


# ── torch.nn.functional beyond the model set ───────────────────────────────

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


def test_the_command_line_starts_without_importing_torch():
    import subprocess
    import sys
    code = "import sys, gradtool.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_cli_loss_function_names_its_targets(tmp_path):
    spec = tmp_path / "model.py"
    spec.write_text(SPEC_FILE)
    out_file = tmp_path / "m.msgpack"
    res = run("import-torch", f"{spec}:with_targets", "--loss", "mse", "-o", out_file, "--json",
              "--dtype", "f64")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert list(summary["inputs"]) == ["input", "target"]
    assert list(summary["params"]) == ["weight", "bias"]
    res = run("import-torch", f"{spec}:with_targets", "-o", out_file)
    assert res.exit_code == 2 and "no --loss function" in res.stderr


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


# ── the import checked against torch's own run of the program ──────────────

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


def test_bilinear_distances_and_3d_adaptive_pooling_match_torch():
    torch.manual_seed(24)
    result, _ = import_matching_torch(Metric(), (torch.randn(6, 5), torch.randn(6, 4)))
    for op in ("aten._trilinear.default", "aten._cdist_forward.default",
               "aten._pdist_forward.default", "aten._adaptive_avg_pool3d.default",
               "aten.adaptive_max_pool3d.default"):
        assert result.histogram[op] >= 1, op
    assert gt.fd_check(result.tape, result.loss).passed


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


# ── rand, randint and randperm: diffusion, flow matching, mixup ───────────

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


# ── complex rotary embeddings, as Meta's LLaMA reference code writes them ───────

def precompute_freqs_cis(dim, end, theta=10000.0, cast=torch.Tensor.float):
    """Meta's llama/model.py, its ``.float()`` as ``cast`` (see :func:`float64_casts`)."""
    freqs = 1.0 / (theta ** (cast(torch.arange(0, dim, 2)[: (dim // 2)]) / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = cast(torch.outer(t, freqs))
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq, xk, freqs_cis, cast=torch.Tensor.float):
    """Meta's llama/model.py, its ``.float()`` as ``cast``."""
    xq_ = torch.view_as_complex(cast(xq).reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(cast(xk).reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class ComplexRopeAttention(nn.Module):
    """A LLaMA attention block as Meta's reference code writes it: RMSNorm, q, k, v by
    Linear layers, rotary embeddings by complex products (view_as_complex * freqs_cis,
    view_as_real), causal SDPA, a residual, a head and cross-entropy.  ``freqs_cis`` is a
    non-persistent complex64 buffer sliced to the sequence, or (``in_forward``) computed
    in the forward from constants, which the import folds to a complex table."""

    def __init__(self, d=16, heads=2, vocab=11, max_t=8, in_forward=False):
        super().__init__()
        self.heads, self.hd, self.max_t, self.in_forward = heads, d // heads, max_t, in_forward
        self.cast = torch.Tensor.float
        self.embed = nn.Embedding(vocab, d)
        self.norm = RMSNorm(d)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.lm = nn.Linear(d, vocab, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(self.hd, max_t),
                             persistent=False)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.embed(idx)
        h = self.norm(x)
        q, k, v = (w(h).view(B, T, self.heads, self.hd) for w in (self.wq, self.wk, self.wv))
        freqs_cis = precompute_freqs_cis(self.hd, self.max_t, cast=self.cast) \
            if self.in_forward else self.freqs_cis
        q, k = apply_rotary_emb(q, k, freqs_cis[:T], self.cast)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(B, T, -1))
        return F.cross_entropy(self.lm(x).flatten(0, 1), targets.flatten())


def float64_casts(module):
    """A copy of ``module`` whose float32 casts (Meta's ``.float()``) are float64: the
    program the dtype policy records (every float float64, every complex complex128), so
    its torch float64 autograd is the reference; the module itself rotates in float32."""
    ref = copy.deepcopy(module)
    ref.cast = torch.Tensor.double
    return ref


def rope_tokens(seed):
    torch.manual_seed(seed)
    return torch.randint(0, 11, (2, 5)), torch.randint(0, 11, (2, 5))


@pytest.mark.parametrize("in_forward", [False, True], ids=["buffer", "in_forward"])
def test_complex_rotary_embeddings_as_meta_writes_them_match_torch(in_forward):
    """view_as_complex, the complex product, view_as_real: each complex value a pair of
    f64 values; the complex64 table (two consts, lifted once for q and k) exact in f64;
    the import check ran torch on the program itself (float32 rotations: within 1e-6)."""
    torch.manual_seed(23)
    m = ComplexRopeAttention(in_forward=in_forward)
    assert m.freqs_cis.dtype == torch.complex64
    result, _ = import_matching_torch(m, rope_tokens(23), reference=float64_casts(m))
    for op in ("aten.view_as_complex.default", "aten.view_as_real.default"):
        assert result.histogram[op] == 2, op
    tape = result.tape
    tables = [i for i, n in enumerate(tape.nodes)
              if n.op == "const" and tape.values[i].shape == (1, 5, 1, 4)]
    assert len(tables) == 2                                  # re and im, for q and k
    want = m.freqs_cis[:5].reshape(1, 5, 1, 4).to(torch.complex128)
    re, im = (tape.values[i] for i in tables)
    if in_forward:        # folded in float64: torch's float64 table, not the float32 one
        want = precompute_freqs_cis(8, 8, cast=torch.Tensor.double)[:5].reshape(1, 5, 1, 4)
    np.testing.assert_array_equal(re + 1j * im, want.numpy())


def test_complex_ops_beyond_rotary_embeddings_are_refused_in_one_line():
    """abs of a complex value (the check pass, before recording), a complex output, a
    complex input and a trainable complex parameter: one line each, naming the op or
    the name."""

    class Magnitude(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            c = torch.view_as_complex(self.fc(x).view(3, 2, 2))
            return c.abs().sum()

    class ComplexOut(Magnitude):
        def forward(self, x):
            return self.fc(x).sum(), torch.view_as_complex(self.fc(x).view(3, 2, 2))

    class ComplexIn(nn.Module):
        def __init__(self, param=False):
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, 2, dtype=torch.complex64) if param
                                  else torch.randn(3, 2))

        def forward(self, z):
            return torch.view_as_real(z * self.w).square().sum()

    with pytest.raises(TorchImportError) as info:
        import_module(Magnitude(), (torch.randn(3, 4),), dtype="f64")
    (line,) = info.value.lines
    assert line.startswith("unsupported op aten.abs.default (x1) at ") and "\n" not in line
    assert "return c.abs().sum()" in line
    assert line.endswith(A.COMPLEX_ONLY) and A.COMPLEX_ONLY.startswith(
        "complex tensors: gradtool imports ")
    with pytest.raises(TorchImportError) as info:
        import_module(ComplexOut(), (torch.randn(3, 4),), dtype="f64")
    (line,) = info.value.lines
    assert line.startswith("complex output ") and "return torch.view_as_real of it" in line
    with pytest.raises(TorchImportError) as info:
        import_module(ComplexIn(), (torch.randn(3, 2, dtype=torch.complex64),), dtype="f64")
    assert [ln.split(" at ")[0] for ln in info.value.lines] == ["unsupported input 'z' (x1)"]
    with pytest.raises(TorchImportError) as info:
        import_module(ComplexIn(param=True), (torch.randn(3, 2, dtype=torch.complex64),), dtype="f64")
    assert [ln.split(" at ")[0] for ln in info.value.lines] == [
        "unsupported parameter 'w' (x1)", "unsupported input 'z' (x1)"]
    assert all("complex tensors: gradtool imports complex buffers and constants only" in ln
               for ln in info.value.lines)


def test_complex_rotary_embeddings_train_to_the_same_bytes_on_every_engine(tmp_path):
    result = import_module(ComplexRopeAttention(), rope_tokens(29), dtype="f64")
    rng = np.random.default_rng(29)
    assert_trains_to_the_same_bytes(result, tmp_path, idx=rng.integers(0, 11, (16, 5)),
                                    targets=rng.integers(0, 11, (16, 5)))
