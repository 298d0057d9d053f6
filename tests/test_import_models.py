"""The PyTorch importer (gradtool.interop.torch) on models written in plain torch.nn.

Each model is exported by the real torch.export, recorded, saved and loaded back as a
tape file, and then checked against torch float64 autograd of the same module (loss
within 1e-12 relative, every parameter's gradient within 1e-11 relative norm-wise), by
finite differences, and on the host C backend (``replay-gpu --backend host --check``:
identical to the bit to the CPU engine).  Then what an import holds: named input slots
and parameters, frozen parameters and buffers as named constants, a loss function's
targets, and the weights copied back into the torch module.  The models shared with other
tests are in tests/torch_cases.py.  Skipped cleanly without torch.
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
from gradtool.interop.torch import (TorchImportError, import_module,  # noqa: E402
                                    load_weights)
from conftest import require_c_compiler                        # noqa: E402
from support import run                                        # noqa: E402
from torch_cases import (MLP, Metric, RMSNorm, SpatialTransformer, Transposed3d,  # noqa: E402
                         gpt_case, mlp_case, needs, torch_reference, unet_case)

warnings.filterwarnings("ignore", category=FutureWarning)


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
