"""How a wrapped module hands its gradients to torch, and how ``gtt.optim`` reads them.

* A plain ``loss.backward()`` writes each gradient into ``.grad`` without torch's
  graph; any other use of the loss makes its node, with the parameters as inputs (one
  ``AccumulateGrad`` each): ``torch.autograd.grad`` and ``backward(inputs=...)`` reach
  them, and a parameter hook runs.  The bits are the same either way.
* On host the gradients are views of one tensor per graph, filled by one copy and used
  again only when nothing else holds them: a ``.grad`` kept by the user (itself, a view
  of it, a numpy array of it) is never written again.
* ``gtt.optim`` steps a group whose params, slots and gradients each lie in one run of
  memory in one pass, to the bits of the param-by-param pass.

Real torch, the real importer and the real host C backend.  Skipped without torch.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import gradtool.interop.torch as gtt                            # noqa: E402
from gradtool.interop.handoff import _lazy_class                 # noqa: E402
from gradtool.interop.wrap import WrapError                     # noqa: E402
from conftest import assert_bits_equal, require_c_compiler      # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 12), nn.Linear(12, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def batch(seed, n=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 4, (n,), generator=g)


def grads(model) -> dict:
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def pair(backend="cpu", **kw):
    torch.manual_seed(3)
    model = Net()
    x, y = batch(0)
    return model, gtt.wrap(model, (x, y), backend=backend, loss_fn=F.cross_entropy, **kw)


@pytest.mark.parametrize("backend", ["cpu", "host"])
def test_plain_backward_and_torchs_graph_give_the_same_gradient_bits(backend):
    """A plain ``loss.backward()`` writes .grad without torch's graph (the call's node
    is never made); accumulation over two calls, a scaled loss, a torch term added to
    the loss (its own AccumulateGrad beside gradtool's write) and a backward with an
    explicit gradient go through the node, made on that use, with the params as its
    inputs.  The same bits as the same steps with the node made first."""
    if backend == "host":
        require_c_compiler()
    runs = {}
    for made_first in (True, False):
        model, gm = pair(backend)
        (x1, y1), (x2, y2) = batch(1), batch(2)
        loss = gm(x1, y1)
        if made_first:
            inputs = [f for f, _ in loss.grad_fn.next_functions if f is not None]
            assert len(inputs) == len(list(model.parameters()))
        loss.backward()
        if _lazy_class() is not None:         # (a torch whose autograd.backward offers
            assert (loss._gt.node is not None) == made_first    # the call: 2.13, not 2.9)
        loss = gm(x2, y2)
        if made_first:
            loss.backward(gradient=torch.ones(()))
        else:
            loss.backward()
        first = grads(model)
        model.zero_grad()
        (gm(x1, y1) * 0.5).backward()
        scaled = grads(model)
        model.zero_grad()
        (gm(x2, y2) + 0.01 * model.fc1.weight.square().sum()).backward()
        runs[made_first] = (first, scaled, grads(model))
    for a, b in zip(runs[False], runs[True]):
        for k in a:
            assert_bits_equal(a[k].numpy(), b[k].numpy(), k)


def test_the_loss_is_a_torch_tensor_in_every_use():
    """The loss reads as its value (item, float, format, detach) without a node; every
    other use (an op, grad_fn, a hook on the loss, retain_grad, torch.autograd.backward)
    is that of the node's output; a second backward through one call is a WrapError,
    whichever path took the gradients first."""
    model, gm = pair()
    x, y = batch(1)
    loss = gm(x, y)
    assert isinstance(loss, torch.Tensor) and loss.shape == () and loss.requires_grad
    value = loss.item()
    assert float(loss) == value and f"{loss:.6f}" == f"{value:.6f}"
    assert loss.detach().item() == value and loss.tolist() == value
    assert type(loss.detach()) is torch.Tensor
    assert "grad_fn" in repr(loss)                    # (repr is a use: the node made)
    loss.retain_grad()
    seen = []
    loss.register_hook(lambda g: seen.append(g.item()))
    loss.backward()
    assert seen == [1.0] and loss.grad.item() == 1.0
    first = grads(model)
    with pytest.raises(WrapError, match="backward twice"):
        loss.backward()
    model.zero_grad()
    fresh = gm(x, y)
    torch.autograd.backward([fresh])
    for k, g in grads(model).items():
        assert_bits_equal(g.numpy(), first[k].numpy(), k)
    fresh = gm(x, y)
    fresh.backward()
    with pytest.raises(WrapError, match="backward twice"):
        fresh.backward()
    with pytest.raises(WrapError, match="backward twice"):
        (fresh * 2.0).backward()
    assert (gm(x, y) + 1.0).item() == (torch.tensor(value) + 1.0).item()
    assert type(gm(x, y) * 1.0) is torch.Tensor         # an op's result: a plain tensor


def test_autograd_grad_and_backward_inputs_reach_the_params():
    """The params are in torch's graph of the loss: torch.autograd.grad and
    backward(inputs=...) give gradtool's gradients."""
    model, gm = pair()
    x, y = batch(1)
    got = torch.autograd.grad(gm(x, y), list(model.parameters()))
    gm(x, y).backward(inputs=[model.fc2.bias])
    assert model.fc1.bias.grad is None
    assert_bits_equal(model.fc2.bias.grad.numpy(), got[-1].numpy(), "inputs=")
    model.zero_grad()
    gm(x, y).backward()
    for g, p in zip(got, model.parameters()):
        assert_bits_equal(g.numpy(), p.grad.numpy(), "autograd.grad vs .grad")


def test_parameter_hooks_run_as_in_torch():
    """A hook on a parameter sees gradtool's gradient, and a post-accumulate hook runs
    after .grad is set: a call whose params have hooks hands torch's AccumulateGrad the
    gradients."""
    model, gm = pair()
    ref_model, ref = pair()
    x, y = batch(1)
    ref(x, y).backward()
    seen = []
    model.fc2.bias.register_hook(lambda g: g * 2.0)
    model.fc1.bias.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    gm(x, y).backward()
    assert_bits_equal(model.fc2.bias.grad.numpy(), (ref_model.fc2.bias.grad * 2.0).numpy(),
                      "hooked grad")
    assert len(seen) == 1
    assert_bits_equal(seen[0].numpy(), ref_model.fc1.bias.grad.numpy(), "post hook")


def test_host_gradients_held_by_the_user_are_never_written_again():
    """The host gradients handed to .grad are views of one tensor used again call after
    call; one kept (the tensor, a view of it, a numpy array of it) keeps its values, and
    each call's .grad is the cpu backend's."""
    require_c_compiler()
    model, gm = pair("host")
    cpu_model, cpu = pair("cpu")
    graph = next(iter(gm.graphs.values()))
    assert graph.grad_block is not None

    def step(seed):
        model.zero_grad()
        cpu_model.zero_grad()
        x, y = batch(seed)
        gm(x, y).backward()
        cpu(x, y).backward()
        for (k, p), q in zip(model.named_parameters(), cpu_model.parameters()):
            assert_bits_equal(p.grad.numpy(), q.grad.numpy(), k)
        return [p.grad for p in model.parameters()]

    first = step(1)
    ptrs = [g.data_ptr() for g in first]
    first = None
    second = step(2)                                   # nothing held: the same memory
    assert [g.data_ptr() for g in second] == ptrs
    def as_array(h):
        return h if isinstance(h, np.ndarray) else h.detach().numpy()

    for keep in (lambda g: g, lambda g: g.view(-1), lambda g: g.numpy(),
                 lambda g: g.detach()):
        held = [keep(g) for g in step(3)]
        values = [as_array(h).copy() for h in held]
        step(4)
        step(5)
        for h, v in zip(held, values):
            assert_bits_equal(as_array(h), v, "a held gradient")
        held = None
    # accumulation without zero_grad: the sum, as torch and the cpu backend give it
    for m in (model, cpu_model):
        m.zero_grad()
    for seed in (6, 7):
        x, y = batch(seed)
        gm(x, y).backward()
        cpu(x, y).backward()
    for (k, p), q in zip(model.named_parameters(), cpu_model.parameters()):
        assert_bits_equal(p.grad.numpy(), q.grad.numpy(), k)


@pytest.mark.parametrize("cls, kw", [("AdamW", {"weight_decay": 0.1}),
                                     ("SGD", {"momentum": 0.9}),
                                     ("Adam", {"amsgrad": True})])
def test_gtt_optim_one_pass_over_a_run_is_the_per_param_bits(cls, kw):
    """The host wrapper's params (its arena) and gradients (one tensor) and the fresh
    slots (one tensor each) make a step one pass; the same steps on a copy whose
    gradients are separate tensors take the param-by-param pass: the same bytes."""
    require_c_compiler()
    model, gm = pair("host")
    other = copy.deepcopy(model)
    opt = getattr(gtt.optim, cls)(model.parameters(), lr=0.01, **kw)
    opt2 = getattr(gtt.optim, cls)(other.parameters(), lr=0.01, **kw)
    passes = []
    for seed in range(1, 6):
        x, y = batch(seed)
        gm(x, y).backward()
        for p, q in zip(model.parameters(), other.parameters()):
            q.grad = p.grad.clone()                   # each its own memory
        opt.step()
        opt2.step()
        plan = next(iter(opt._plans.values()))[3]
        passes.append(plan[3] is not None and plan[3]["grads"] is not None)
        flat2 = next(iter(opt2._plans.values()))[3][3]
        assert flat2 is None or flat2["grads"] is None        # param by param
        opt.zero_grad()
        opt2.zero_grad()
    assert all(passes)
    for (k, p), q in zip(model.named_parameters(), other.parameters()):
        assert_bits_equal(p.detach().numpy(), q.detach().numpy(), k)
        for s in opt.state[p]:
            if s != "step":
                assert_bits_equal(opt.state[p][s].numpy(), opt2.state[q][s].numpy(), s)


def test_torch_distributed_running_hands_every_gradient_to_torchs_nodes(tmp_path):
    """With torch.distributed initialized (DDP and FSDP hook each AccumulateGrad node)
    the call hands the gradients to torch's nodes, whose hooks then see them; without
    it, .grad is gradtool's own tensor.  The same bits both ways."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    require_c_compiler()
    model, gm = pair("host")
    x, y = batch(1)
    gm(x, y).backward()
    alone = grads(model)
    assert model.fc1.weight.grad._base is not None          # a view of the grad set
    model.zero_grad()
    seen = []
    node = model.fc1.weight.view_as(model.fc1.weight).grad_fn.next_functions[0][0]
    node.register_hook(lambda grad_in, grad_out: seen.append(grad_out[0]))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        gm(x, y).backward()
    finally:
        dist.destroy_process_group()
    assert model.fc1.weight.grad._base is None              # torch's own clone
    assert len(seen) == 1 and seen[0] is not None
    assert_bits_equal(seen[0].numpy(), alone["fc1.weight"].numpy(), "the node's hook")
    for k, g in grads(model).items():
        assert_bits_equal(g.numpy(), alone[k].numpy(), k)
