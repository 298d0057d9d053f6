"""The models people have, as their libraries build them (issue 43): torchvision's
resnet, mobilenet_v3, efficientnet, VisionTransformer, squeezenet, shufflenet_v2,
densenet and convnext, and transformers' BERT and DistilBERT (sequence classification),
GPT-2 and Llama (causal LM) and T5 (conditional generation), each with an attention
mask and labels and the default attention implementation: random init, tiny configs
(tests/zoo_models.py), nothing downloaded, in eval and in train mode.

For each: ``import_module`` works (its check against torch's own run passed inside);
the loss and every gradient match torch float64 autograd (train mode: the tape with the
rng slot's train flag 0 against torch with every dropout at p = 0); the host C backend
(``replay-gpu --backend host --check``) is identical to the bit to the CPU engine; and
``gradtool train`` runs two steps to the same bytes on cpu and host.  Skipped cleanly
without torch, torchvision or transformers (``pip install -e '.[zoo]'``).
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gradtool as gt                                          # noqa: E402
from gradtool.interop.torch import import_module              # noqa: E402
from conftest import require_c_compiler                        # noqa: E402
from support import run                                        # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)


def _have(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


import zoo_models as Z                                          # noqa: E402

NEEDS = {**{k: "torchvision" for k in Z.VISION}, **{k: "transformers" for k in Z.TEXT}}
LTOL, GTOL = 1e-12, 1e-11        # the importer's tests' bounds (docs/torch.md)
# A gradient that is zero in exact arithmetic (a key projection's bias, which softmax
# ignores; a BatchNorm bias in train mode ahead of another batch-normalised layer) is
# rounding noise on both sides, of the size of the model's other gradients: each
# parameter's error is measured against at least FLOOR x the norm of all gradients.
FLOOR = 1e-4


def _cases():
    out = []
    for name in Z.MODELS:
        for mode in ("eval", "train"):
            out.append(pytest.param(name, mode, id=f"{name}-{mode}", marks=pytest.mark.skipif(
                not _have(NEEDS[name]), reason=f"needs {NEEDS[name]} (pip install -e '.[zoo]')")))
    return out


_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


class Float64Everywhere(torch.overrides.TorchFunctionMode):
    """The importer's dtype policy in torch's reference run: a cast to float32 (or half)
    stays float64 -- transformers' losses upcast the logits with ``.float()``, T5's and
    Llama's RMS norms compute their variance after ``.to(torch.float32)``, Llama's
    rotary tables are ``.float()``: on a float64 copy each is a cast *down*, which the
    importer (every float value float64, docs/torch.md) does not make."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16):
            return args[0].to(torch.float64)

        def f64(v):
            return torch.float64 if v in _FLOATS else v
        args = tuple(f64(a) for a in args)
        kwargs = {k: f64(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


@contextlib.contextmanager
def dropout_off(module):
    """torch with every dropout at p = 0, the module left in its mode: nn.Dropout and
    F.dropout, SDPA's dropout_p, torchvision's StochasticDepth (what the tape's train
    flag 0 switches off); every cast to another float dtype kept float64; hardsigmoid
    and hardswish as their definitions."""
    F = torch.nn.functional
    dropout, sdpa = F.dropout, F.scaled_dot_product_attention
    saved = []
    for m in module.modules():
        if type(m).__name__ == "StochasticDepth" or isinstance(
                m, torch.nn.modules.dropout._DropoutNd):
            saved.append((m, m.p))
            m.p = 0.0

    def no_dropout(x, p=0.5, training=True, inplace=False):
        return dropout(x, 0.0, training, inplace)

    def no_sdpa_dropout(*args, **kwargs):
        if len(args) > 4:
            args = args[:4] + (0.0,) + args[5:]
        kwargs.pop("dropout_p", None)
        return sdpa(*args, **kwargs)

    # torch's hardsigmoid and hardswish backward multiply by 1/6 rounded to float32
    # (docs/torch.md, Pitfalls: 3e-8 off per layer, 4e-8 through MobileNetV3); the
    # reference computes them as their definitions, whose float64 backward divides by 6
    hard = F.hardsigmoid, F.hardswish

    def hardsigmoid(x, inplace=False):
        return F.relu6(x + 3.0) / 6.0

    def hardswish(x, inplace=False):
        return x * F.relu6(x + 3.0) / 6.0

    F.dropout, F.scaled_dot_product_attention = no_dropout, no_sdpa_dropout
    F.hardsigmoid, F.hardswish = hardsigmoid, hardswish
    try:
        with Float64Everywhere():
            yield
    finally:
        F.dropout, F.scaled_dot_product_attention = dropout, sdpa
        F.hardsigmoid, F.hardswish = hard
        for m, p in saved:
            m.p = p


def torch_reference(module, inputs):
    """Loss and param grads of torch float64 autograd (dropout off) on a float64 copy."""
    m = copy.deepcopy(module).double()
    args = [t.double() if t.is_floating_point() else t for t in inputs]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with dropout_off(m):
            loss = m(*args)
    finally:
        torch.set_default_dtype(default)
    loss.backward()
    grads = {k: p.grad.numpy().copy() for k, p in m.named_parameters()
             if p.requires_grad and p.grad is not None}
    return loss.item(), grads


class WithLoss(torch.nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, x, labels):
        return self.loss_fn(self.model(x), labels)


def _data(inputs, n_rows, seed):
    """Training arrays of ``n_rows`` examples, by input name, drawn like the example's
    (ids in range, the same masks pattern)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in inputs:
        reps = [n_rows // t.shape[0]] + [1] * (t.dim() - 1)
        if t.is_floating_point():
            out.append(torch.randn(n_rows, *t.shape[1:], generator=g).numpy())
        else:                     # ids, labels, masks: the example's rows, shuffled
            out.append(t.repeat(*reps)[torch.randperm(n_rows, generator=g)].numpy())
    return out


@pytest.mark.parametrize("name,mode", _cases())
def test_real_model_imports_matches_torch_and_trains(name, mode, tmp_path):
    module, inputs, loss_fn, loss_inputs = Z.MODELS[name]()
    getattr(module, mode)()
    result = import_module(module, inputs, loss_fn, loss_inputs, dtype="f64")   # checked against torch
    if (name, mode) == ("gpt2", "eval"):    # torch 2.13's decomposition fails; SDPA kept
        assert len(result.notes) == 1, result.notes
        assert "aten.scaled_dot_product_attention.default undecomposed" in result.notes[0]
        assert "modeling_gpt2.py" in result.notes[0]
    path = tmp_path / "model.msgpack"
    result.save(path)
    tf = gt.load(path)
    tape, loss = tf.tape, tf.tape.var(tf.loss)
    if tape.rng_id() >= 0:                       # train mode: dropout off (flag 0)
        rng = tape.var(tape.rng_id())
        off = tape.values[rng.id].copy()
        off[2] = 0.0
        tape.set_value(rng, off)
        tape.forward()
    draws = mode == "train" and any(
        (isinstance(m, torch.nn.modules.dropout._DropoutNd) or
         type(m).__name__ == "StochasticDepth") and m.p > 0 for m in module.modules())
    assert (tape.rng_id() >= 0) == draws, name       # dropout imported in train mode only
    tape.backward(loss)
    reference = WithLoss(module, loss_fn) if loss_fn is not None else module
    ref_loss, ref_grads = torch_reference(reference, tuple(inputs) + tuple(loss_inputs))
    got = float(tape.values[loss.id][0])
    assert abs(got - ref_loss) <= LTOL * abs(ref_loss), (got, ref_loss)
    prefix = "model." if loss_fn is not None else ""
    names = [tape.nodes[p.id].name for p in tape.params()]
    assert names and set(names) <= {k[len(prefix):] for k in ref_grads}
    scale = FLOOR * np.sqrt(sum(np.linalg.norm(g) ** 2 for g in ref_grads.values()))
    for p in tape.params():
        n = tape.nodes[p.id].name
        g, ref = tape.grad(p), ref_grads[prefix + n]
        err = np.linalg.norm(g.reshape(-1) - ref.reshape(-1))
        assert err <= GTOL * max(np.linalg.norm(ref), scale), (n, err, np.linalg.norm(ref))
    # the host C backend: identical to the bit to the CPU engine
    require_c_compiler()
    out = run("replay-gpu", path, "--backend", "host", "--check", "--episodes", "1",
              "--warmup", "0")
    assert out.exit_code == 0, out.output
    # gradtool train, two steps, the same bytes on cpu and host (train mode: dropout on)
    data = tmp_path / "data.npz"
    rows = inputs[0].shape[0]
    arrays = _data(tuple(inputs) + tuple(loss_inputs), 2 * rows, seed=1)
    np.savez(data, **{k: a for k, a in zip(result.inputs, arrays)})
    saved = {}
    for label, extra in (("cpu", []), ("host", ["--backend", "host"])):
        res = run("train", path, "--data", data, "--epochs", 1, "--lr", "0.01",
                  *extra, "--save", tmp_path / f"{label}.msgpack")
        assert res.exit_code == 0, res.output
        saved[label] = (tmp_path / f"{label}.msgpack").read_bytes()
    assert saved["cpu"] == saved["host"] and saved["cpu"] != path.read_bytes()


# ── the blockers one by one, on plain torch modules (no zoo package needed) ─────

nn, F = torch.nn, torch.nn.functional


def matches_torch(module, inputs, flag=0.0):
    """Import ``module`` on ``inputs``; its loss and every gradient with the train flag
    ``flag`` (dropout off) against torch float64 autograd with dropout off."""
    result = import_module(module, inputs, dtype="f64")
    tape, loss = result.tape, result.loss
    if tape.rng_id() >= 0:
        rng = tape.var(tape.rng_id())
        off = tape.values[rng.id].copy()
        off[2] = flag
        tape.set_value(rng, off)
        tape.forward()
    tape.backward(loss)
    ref_loss, ref_grads = torch_reference(module, inputs)
    got = float(tape.values[loss.id][0])
    assert abs(got - ref_loss) <= LTOL * abs(ref_loss), (got, ref_loss)
    for name, p in result.params.items():
        err = np.linalg.norm(tape.grad(p).reshape(-1) - ref_grads[name].reshape(-1))
        assert err <= GTOL * np.linalg.norm(ref_grads[name]), name
    return result


class BoolMasks(nn.Module):
    """transformers' mask builders: & | ^ ~ on bool masks, then where."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x, pad):
        h = self.fc(x)
        causal = torch.ones(5, 5, dtype=torch.bool).tril()
        keep = (causal[None] & pad[:, None, :]) | (h > 0.5)
        keep = keep ^ (h < -1.0)
        keep = keep & ~(h > 2.0)
        return torch.where(keep, h, torch.zeros_like(h)).pow(2).sum()


def test_bitwise_ops_on_bool_masks_are_logical_ops():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 5)
    pad = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    result = matches_torch(BoolMasks(), (x, pad))
    for op in ("bitwise_and.Tensor", "bitwise_or.Tensor", "bitwise_xor.Tensor"):
        assert result.histogram[f"aten.{op}"] >= 1, op


class IntBits(nn.Module):
    def forward(self, x, ids):
        return (x * (ids & 3)).sum()


def test_bitwise_and_of_integers_stays_refused_at_its_line():
    with pytest.raises(gt.GradtoolError) as e:
        import_module(IntBits(), (torch.randn(4), torch.tensor([1, 2, 3, 7])), dtype="f64")
    assert "aten.bitwise_and.Scalar" in str(e.value) and "test_zoo.py" in str(e.value)
    assert "bitwise_and of integers" in str(e.value)


class InplaceDropout(nn.Module):
    """MobileNetV3's head: an in-place activation, then nn.Dropout(inplace=True)."""

    def __init__(self):
        super().__init__()
        self.fc, self.act = nn.Linear(6, 8), nn.Hardswish(inplace=True)
        self.drop, self.out = nn.Dropout(0.4, inplace=True), nn.Linear(8, 3)

    def forward(self, x, y):
        return F.cross_entropy(self.out(self.drop(self.act(self.fc(x)))), y)


def test_inplace_dropout_in_train_mode_imports_and_its_flag_0_is_torch_without_it():
    torch.manual_seed(1)
    m = InplaceDropout().train()
    result = matches_torch(m, (torch.randn(8, 6), torch.randint(0, 3, (8,))))
    assert result.histogram["aten.dropout_.default"] == 1 or any(
        n.op == "uniform" for n in result.tape.nodes)


def test_the_check_names_no_op_when_only_a_draw_differs():
    """The culprit search reads each node's value as the node made it (an in-place op
    later changes the tensor) and skips the draws: on a correct program it finds
    nothing (it named the conv before an in-place hardswish_)."""
    from gradtool.interop import verify
    torch.manual_seed(2)

    class ConvHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.act = nn.Conv2d(3, 4, 3), nn.Hardswish(inplace=True)
            self.conv2, self.drop = nn.Conv2d(4, 4, 1), nn.Dropout(0.5, inplace=True)

        def forward(self, x):
            return self.drop(self.conv2(self.act(self.conv(x)))).sum()

    ep = torch.export.export(ConvHead().double().train(),
                             (torch.randn(2, 3, 6, 6, dtype=torch.float64),))
    table = torch.export.default_decompositions()
    _, rec = verify.torch_loss(ep, 0)
    assert verify.decomposition_culprit(ep, table, rec) is None


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(8, 3)

    def forward(self, x, y):
        return F.cross_entropy(self.head(self.enc(x).mean(1)), y)


def test_sdpa_dropout_imports_as_dropout_on_the_weights_and_trains(tmp_path):
    """nn.TransformerEncoder with its default dropout=0.1 in train mode (issue 40):
    SDPA's dropout_p is nn.dropout on the attention weights; flag 0 is torch at p = 0,
    flag 1 another loss; gradtool train gives the same bytes on cpu and host."""
    torch.manual_seed(3)
    m = Encoder().train()
    x, y = torch.randn(4, 5, 8), torch.randint(0, 3, (4,))
    result = matches_torch(m, (x, y))
    tape = result.tape
    assert sum(n.op == "uniform" for n in tape.nodes) == 4   # attention, 2 in the FFN, 1
    flag0 = float(tape.values[result.loss.id][0])
    rng = tape.var(tape.rng_id())
    on = tape.values[rng.id].copy()
    on[2] = 1.0
    tape.set_value(rng, on)
    tape.forward()
    assert float(tape.values[result.loss.id][0]) != flag0
    require_c_compiler()
    path, data = tmp_path / "enc.msgpack", tmp_path / "data.npz"
    result.save(path)
    g = np.random.default_rng(0)
    np.savez(data, x=g.standard_normal((8, 5, 8)), y=g.integers(0, 3, 8))
    saved = []
    for extra in ([], ["--backend", "host"]):
        out = tmp_path / f"{len(saved)}.msgpack"
        res = run("train", path, "--data", data, *extra, "--save", out)
        assert res.exit_code == 0, res.output
        saved.append(out.read_bytes())
    assert saved[0] == saved[1]


class KVCache(nn.Module):
    """A cache that starts empty: cat onto a [0] tensor, and an empty value unread."""

    def __init__(self):
        super().__init__()
        self.k = nn.Linear(4, 4)

    def forward(self, x):
        past = torch.zeros(x.shape[0], 0, 4)
        flat = torch.tensor([])
        unused = torch.empty(0) * 2.0                       # noqa: F841 - nothing reads it
        new = self.k(x)
        keys = torch.cat([past, new[:, :0], new], dim=1)     # a computed empty slice too
        total = torch.cat([flat, keys.reshape(-1)])
        return (total ** 2).sum()


def test_empty_tensors_fold_away_at_import():
    torch.manual_seed(4)
    result = matches_torch(KVCache(), (torch.randn(2, 3, 4),))
    assert all(0 not in v.shape for v in result.tape.values)


class EmptyRead(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = nn.Linear(4, 4)

    def forward(self, x):
        h = self.k(x)
        return (h ** 2).sum() + h[:, :0].sum()


def test_an_empty_value_another_op_reads_is_refused_at_its_line():
    with pytest.raises(gt.GradtoolError) as e:
        import_module(EmptyRead(), (torch.randn(3, 4),), dtype="f64")
    lines = str(e.value).splitlines()
    assert len(lines) == 2 and "an empty slice" in lines[1]
    assert "test_zoo.py" in lines[1] and "h[:, :0].sum()" in lines[1]


class ShiftedLabels(nn.Module):
    """HF's causal-LM loss: labels padded with -100 (constant_pad_nd), shifted; and ids
    through cat, where and layout ops before a gather."""

    def __init__(self):
        super().__init__()
        self.emb, self.out = nn.Embedding(7, 6), nn.Linear(6, 7)

    def forward(self, ids, labels, keep):
        logits = self.out(self.emb(ids))
        shifted = F.pad(labels, (0, 1), value=-100)[..., 1:]
        shifted = torch.where(keep, shifted, torch.full_like(shifted, -100))
        tail = torch.cat([shifted, torch.full((ids.shape[0], 1), -100)], dim=1)[:, :-1]
        flat = tail.transpose(0, 1).contiguous().transpose(0, 1).reshape(-1)
        return F.cross_entropy(logits.reshape(-1, 7), flat, ignore_index=-100)


def test_ids_stay_ids_through_pad_cat_where_and_layout_ops():
    torch.manual_seed(5)
    ids = torch.randint(0, 7, (2, 5))
    labels = ids.clone()
    labels[1, -2:] = -100
    keep = torch.tensor([[True] * 5, [True, False, True, True, True]])
    matches_torch(ShiftedLabels(), (ids, labels, keep))


class Strided(nn.Module):
    def __init__(self, size, stride, offset=None):
        super().__init__()
        self.fc, self.args = nn.Linear(4, 4), (size, stride, offset)

    def forward(self, x):
        return (torch.as_strided(self.fc(x), *self.args) ** 2).sum()


@pytest.mark.parametrize("args,op", [(((4, 6), (1, 4)), "transpose"),
                                     (((24,), (1,)), "reshape"),
                                     (((3, 4), (8, 1)), "slice"),
                                     (((2, 2), (4, 1), 5), "slice")])
def test_as_strided_as_a_reshape_permute_or_slice(args, op):
    torch.manual_seed(6)
    result = matches_torch(Strided(*args), (torch.randn(6, 4),))
    assert any(n.op == op for n in result.tape.nodes)


@pytest.mark.parametrize("args,why", [(((3, 3), (1, 1)), "not a reshape, permute or slice"),
                                      (((4, 4), (4, 1), 20), "outside its input")])
def test_any_other_as_strided_is_refused_at_the_users_line(args, why):
    with pytest.raises(gt.GradtoolError) as e:
        import_module(Strided(*args), (torch.randn(6, 4),), dtype="f64")
    lines = str(e.value).splitlines()
    assert len(lines) == 2 and "aten.as_strided.default" in lines[1] and why in lines[1]
    assert "test_zoo.py" in lines[1] and "torch.as_strided(self.fc(x)" in lines[1]


class Attention(nn.Module):
    def __init__(self, kind, heads=4, kv_heads=4, p=0.0):
        super().__init__()
        self.kind, self.h, self.kvh, self.p = kind, heads, kv_heads, p
        self.q, self.kv = nn.Linear(8, 8), nn.Linear(8, 4 * kv_heads)

    def forward(self, x, mask):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.h, 2).transpose(1, 2)
        k, v = self.kv(x).view(b, t, self.kvh, 4).transpose(1, 2).split(2, dim=-1)
        kw = dict(dropout_p=self.p)
        if self.kind == "causal":
            kw["is_causal"] = True
        elif self.kind == "bool":
            kw["attn_mask"] = mask
        elif self.kind == "float":
            kw["attn_mask"] = torch.where(mask, 0.0, -1e4)
        if self.kvh != self.h:
            kw["enable_gqa"] = True
        return F.scaled_dot_product_attention(q, k, v, **kw).pow(2).sum()


@pytest.mark.parametrize("kind,kv_heads,p", [("causal", 4, 0.0), ("bool", 4, 0.0),
                                              ("float", 4, 0.0), ("bool", 2, 0.0),
                                              ("bool", 4, 0.3)])
def test_sdpa_kept_undecomposed_is_torchs_math_kernel(kind, kv_heads, p, monkeypatch):
    """The SDPA entry (used where torch's own decomposition fails and the op is kept):
    masks, a row masked whole (0, as torch's safe softmax), grouped-query heads,
    dropout (flag 0: torch at p = 0)."""
    from gradtool.interop import aten as A
    monkeypatch.setattr(A, "PRESERVE", A.PRESERVE | A.RETRY_UNDECOMPOSED)
    torch.manual_seed(7)
    mask = torch.rand(2, 1, 5, 5) > 0.3
    mask[1, 0, 2] = False                                  # a row masked whole
    mask[:, :, :, 0] |= torch.arange(2)[:, None, None] == 0
    m = Attention(kind, kv_heads=kv_heads, p=p).train()
    result = matches_torch(m, (torch.randn(2, 5, 8), mask))
    assert result.histogram["aten.scaled_dot_product_attention.default"] == 1
    assert (result.tape.rng_id() >= 0) == (p > 0)


def test_a_culprit_message_shows_the_first_element_that_differs():
    """Not the first element (issue 40: 'gives 0.5187271055067558 where the op itself
    gives 0.5187271055067558')."""
    from gradtool.interop import verify
    want = torch.tensor([[0.5, 0.25], [1.0, -2.0]], dtype=torch.float64)
    got = want.clone()
    got[1, 0] = 1.5
    g, w = verify._first_difference(torch, (got, want), (want, want))
    assert (float(g), float(w)) == (1.5, 1.0)
    g, w = verify._first_difference(torch, torch.tensor([1, 2, 4]), torch.tensor([1, 2, 3]))
    assert (int(g), int(w)) == (4, 3)


@pytest.mark.skipif(not _have("transformers"), reason="needs transformers")
def test_cli_says_when_it_kept_sdpa_undecomposed(tmp_path):
    """GPT-2 in eval mode: torch 2.13's run_decompositions fails; import-torch retries
    keeping SDPA, writes the tape and says so in one stderr line with the user's line."""
    spec = tmp_path / "gpt2.py"
    spec.write_text("import zoo_models as Z\n\n\ndef build():\n"
                    "    module, inputs, _, _ = Z.MODELS['gpt2']()\n"
                    "    return module.eval(), inputs\n")
    out = tmp_path / "gpt2.msgpack"
    res = run("import-torch", f"{spec}:build", "-o", out, "--dtype", "f64")
    assert res.exit_code == 0, res.output
    notes = [line for line in res.stderr.splitlines() if line.startswith("gradtool: ")]
    assert len(notes) == 1 and ": note: torch's run_decompositions failed" in notes[0]
    assert "scaled_dot_product_attention.default undecomposed (x1) at" in notes[0]
    assert "modeling_gpt2.py:" in notes[0] and out.exists()


def test_a_decomposition_that_fails_again_is_refused_at_the_users_line():
    """Where the retry cannot help (no kept op in the program), the refusal is one
    problem naming the innermost user frame of torch's traceback."""
    from gradtool.interop.torch import TorchImportError, _run_decompositions

    class Failing:                       # what torch's ExportedProgram raises, verbatim
        class graph_module:
            class graph:
                nodes = []

        def run_decompositions(self, table):
            raise ValueError(
                "Cannot view a tensor with shape torch.Size([2, 6, 8]) and strides "
                "(8, 16, 1) as a tensor with shape (12, 8)!\n\nWhile executing %view_7 ...\n"
                "Original traceback:\n"
                f'  File "{__file__}", line 12, in forward\n'
                "    return self.model(x)\n"
                f'  File "{torch.__file__}", line 3, in _call_impl\n'
                "    return forward_call(*args)\n")

    with pytest.raises(TorchImportError) as e:
        _run_decompositions(Failing(), {}, [], torch)
    (line,) = e.value.lines
    assert line.startswith("run_decompositions failed: ValueError (x1) at ")
    assert "test_zoo.py:12 (forward): return self.model(x): Cannot view a tensor" in line
    assert "While executing" not in line


@pytest.mark.skipif(not _have("torchvision"), reason="needs torchvision")
def test_torchvision_imports_beside_a_cpu_torch():
    """PyPI's torchvision wheel is a CUDA build whose extension does not load beside a CPU
    torch; import_torchvision defines the two op schemas its import needs (no kernel)."""
    from gradtool.interop.zoo import define_torchvision_ops, import_torchvision
    tv = import_torchvision()
    assert tv.__version__.startswith("0.28")
    for op in ("nms", "qnms"):
        assert hasattr(torch.ops.torchvision, op)
    assert define_torchvision_ops() == []                      # once is enough
    if not tv.extension._has_ops():                            # the CPU-torch case:
        boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0]])           # no kernel, torch's error
        with pytest.raises(NotImplementedError):
            torch.ops.torchvision.nms(boxes, torch.tensor([1.0]), 0.5)


@pytest.mark.skipif(not _have("torchvision"), reason="needs torchvision")
def test_cli_runs_a_file_that_imports_torchvision_itself(tmp_path):
    """A fresh interpreter: the user's file does `import torchvision` (which fails beside a
    CPU torch on its own); import-torch defines the two schemas before running it."""
    import subprocess
    import sys
    spec = tmp_path / "vit.py"
    spec.write_text(
        "import torch\nimport torch.nn.functional as F\nimport torchvision\n\n\n"
        "class WithLoss(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.m = torchvision.models.VisionTransformer(16, 8, 1, 2, 8, 16,"
        " num_classes=3)\n\n"
        "    def forward(self, x, y):\n        return F.cross_entropy(self.m(x), y)\n\n\n"
        "def build():\n    torch.manual_seed(0)\n"
        "    return WithLoss().eval(), (torch.randn(2, 3, 16, 16), torch.tensor([0, 2]))\n")
    out = tmp_path / "vit.msgpack"
    res = subprocess.run([sys.executable, "-m", "gradtool", "import-torch", f"{spec}:build",
                          "-o", str(out), "--dtype", "f64"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert out.exists() and "Traceback" not in res.stderr
