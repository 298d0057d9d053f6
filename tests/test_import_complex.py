"""The PyTorch importer on complex rotary embeddings, as Meta's LLaMA reference code
writes them (view_as_complex, the complex product, view_as_real): each complex value a
pair of float64 values, torch float64's loss and gradients, the same bytes on every
engine; complex ops beyond them are refused in one line each.  Skipped cleanly without
torch.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from gradtool.interop import aten as A                         # noqa: E402
from gradtool.interop.torch import TorchImportError, import_module  # noqa: E402
from torch_cases import (RMSNorm, assert_trains_to_the_same_bytes,  # noqa: E402
                         import_matching_torch)

warnings.filterwarnings("ignore", category=FutureWarning)


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
