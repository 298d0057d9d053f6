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
    result = import_module(module, inputs, loss_fn, loss_inputs)   # checked against torch
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
