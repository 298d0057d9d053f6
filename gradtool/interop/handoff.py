"""How a wrapped module's call hands torch its loss and gradients (``gtt.wrap``).

* :func:`_lazy_loss` (the usual call: no hook watches the parameters): the loss as a
  tensor whose plain ``backward()`` writes each ``.grad`` itself, without torch's
  engine, and whose any other use first makes :func:`_loss_function`'s node.
* :func:`_loss_function`: the loss's ``autograd.Function`` with the parameters as
  inputs: its backward writes each ``.grad`` as torch's ``AccumulateGrad`` would
  (:func:`_accumulate`), or hands the gradients to those nodes where a hook watches them
  (:func:`_hooked`) and to ``torch.autograd.grad``.
* :class:`_GradSet`: the host gradients as views of one tensor per graph, used again
  only when nothing else holds them.

``docs/torch.md``, "Your own loop" ("Who writes ``.grad``").  Imports without torch.
"""

from __future__ import annotations

import itertools
import operator
import sys

import numpy as np

from ..errors import WrapError

_refcount = sys.getrefcount
_GRAD = operator.attrgetter("grad")
_HOOKS = operator.attrgetter("_backward_hooks")
_POST_HOOKS = operator.attrgetter("_post_accumulate_grad_hooks")
_CLASSES: dict = {}


def _torch():
    """torch (imported on first use: the wrapper's files import without it; kept after,
    as an import statement per call is ~1 us)."""
    found = _TORCH_MODULE[0]
    if found is None:
        import torch
        found = _TORCH_MODULE[0] = torch
    return found


_TORCH_MODULE = [None]


class _GradSet:
    """The tensors a call hands torch as its gradients (host, gradients in one block):
    one flat tensor and a view of it per param, each of the param's shape and dtype.

    Used again by the next call only when nothing but this set holds them: no ``.grad``
    is one of them any more (``zero_grad``), and no one kept one, a view of one or a
    numpy array of one (each view's Python reference count and its tensor's own use
    count, and the flat storage's use count, are as they were when the set was made; a
    ``.grad`` holds the tensor, and on torch 2.9 not its Python object).  Otherwise the
    set is left to its holders as it is and the call makes a new one: a gradient once
    handed out is never written again, as torch's own (fresh tensors each backward).
    Saves the ~30 tensors' allocation and creation a call (``_foreach_clone``) on a small
    model."""

    def __init__(self, torch, like: list):
        n = sum(t.numel() for t in like)
        self.base = torch.empty(n, dtype=like[0].dtype)
        views, at = [], 0
        for t in like:
            views.append(self.base[at:at + t.numel()].view(t.shape))
            at += t.numel()
        self.views = views
        self.flat = self.base.numpy()
        use_count = getattr(torch._C, "_storage_Use_Count", None)
        self.tensor_count = getattr(torch.Tensor, "_use_count", None)
        self.cdata = self.base.untyped_storage()._cdata
        self.use_count = use_count if self.tensor_count is not None else None
        self.counts = self._counts(self.use_count)

    def _counts(self, use_count):
        if use_count is None:
            return None
        return (list(map(_refcount, self.views)), list(map(self.tensor_count, self.views)),
                use_count(self.cdata))

    def free(self) -> bool:
        """Whether nothing but this set holds its tensors (see the class)."""
        return self.use_count is not None and self._counts(self.use_count) == self.counts



def _as_grad(torch, a, p):
    """Gradient ``a`` (an owned array or tensor: a copy) as a tensor of param ``p``'s
    shape, dtype and device (no conversion call where it has them already)."""
    t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.asarray(a))
    if t.shape != p.shape:
        t = t.reshape(p.shape)
    if t.dtype != p.dtype:
        t = t.to(p.dtype)
    if t.device != p.device:
        t = t.to(p.device)
    return t


def _accumulate(params, grads) -> None:
    """Each gradient into its param's ``.grad`` as torch's ``AccumulateGrad`` puts it
    there: the gradient itself where ``.grad`` is None (the call's own tensor, handed to
    nobody else), else ``.grad += g`` in place (one rounding, torch's
    ``variable_grad += new_grad``)."""
    none = itertools.repeat(None)
    if all(map(operator.is_, map(_GRAD, params), none)) and not any(
            map(operator.is_, grads, none)):
        list(map(setattr, params, itertools.repeat("grad"), grads))    # (the usual step)
        return
    for p, x in zip(params, grads):
        if x is None:
            continue
        if p.grad is None:
            p.grad = x
        else:
            p.grad.add_(x)


def _taken(ctx, g) -> list:
    """A call's gradients, taken from its node's ``ctx`` (or its :class:`_Call`) once (a
    second backward through the call is a :class:`WrapError`), times the incoming
    gradient ``g`` (as they are where it is None or exactly 1.0)."""
    grads, ctx.grads = ctx.grads, None
    if grads is None:
        raise WrapError("gradtool's gradients of this call were already handed to torch "
                        "(backward twice through one call)")
    if g is None or float(g) == 1.0:
        return grads
    return [x if x is None else x * g.to(x.dtype) for x in grads]


def _loss_function():
    """The loss's Function with the parameters as inputs (torch's graph reaches them).

    Forward: the loss gradtool computed.  Backward: gradtool's gradient of each
    parameter (``None`` for one the loss does not reach, whose ``.grad`` torch then
    leaves as it is), times the incoming gradient where that is not exactly 1.0.  Where
    the call asked for it (``direct``: no hooks to run), a param whose ``AccumulateGrad``
    this backward runs (``loss.backward()``; with ``inputs=``, those) gets its gradient
    written into ``.grad`` here (:func:`_accumulate`), the node then given None (~2 us a
    param less than its clone-and-accumulate); ``torch.autograd.grad`` and the params
    ``inputs=`` leaves out get the gradients, as torch's own ops give them."""
    if "loss" in _CLASSES:
        return _CLASSES["loss"]
    torch = _torch()
    will_run = getattr(torch._C, "_will_engine_execute_node", None)

    class GradtoolLoss(torch.autograd.Function):
        @staticmethod
        def forward(ctx, loss, grads, direct, *params):
            ctx.grads = grads
            ctx.params = params if direct and will_run is not None else None
            return loss.clone()

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, g):
            grads = _taken(ctx, g)
            params, ctx.params = ctx.params, None
            if not params:
                return (None, None, None) + tuple(grads)
            nodes = [n for n, _ in ctx.next_functions[1:]]
            try:
                runs = list(map(will_run, nodes))
            except RuntimeError:          # torch.autograd.grad: no AccumulateGrad runs
                return (None, None, None) + tuple(grads)
            if all(runs):
                _accumulate(params, grads)
                return (None, None, None) + (None,) * len(grads)
            _accumulate([p for p, r in zip(params, runs) if r],
                        [x for x, r in zip(grads, runs) if r])
            return (None, None, None) + tuple(None if r else x for x, r in zip(grads, runs))

    _CLASSES["loss"] = GradtoolLoss
    return GradtoolLoss


class _Call:
    """What a lazy loss (:func:`_lazy_loss`) holds: the loss ``value``, the call's
    ``grads`` (None once taken: :func:`_taken`), the ``params`` and, once made, the
    ``node``'s output (:func:`_loss_function`)."""
    __slots__ = ("value", "grads", "params", "node")

    def __init__(self, value, grads, params):
        self.value, self.grads, self.params, self.node = value, grads, params, None

    def made(self):
        """The loss as the output of :func:`_loss_function`'s node (made on first use,
        with the gradients not yet taken)."""
        if self.node is None:
            grads, self.grads = self.grads, None
            self.node = _loss_function().apply(self.value, grads, True, *self.params)
        return self.node


def _lazy_loss(value, grads, params):
    """The usual call's loss (no hook watches the parameters): ``value`` (a fresh tensor,
    the loss gradtool computed) as a :func:`_lazy_class` tensor, a leaf needing a
    gradient."""
    t = _CLASSES["tensor"]._make_subclass(_CLASSES["lazy"], value, True)
    t._gt = _Call(value, grads, params)
    return t


def _lazy_class():
    """The class of :func:`_lazy_loss`'s tensors (made once, on first use), or None where
    this torch's ``torch.autograd.backward`` would not offer it the call
    (:func:`_backward_dispatches`).

    A plain ``loss.backward()`` (no ``gradient``, ``inputs`` or ``create_graph``, the
    node not made) is the one use taken without torch's graph: the gradients go into
    ``.grad`` (:func:`_accumulate`) as :func:`_loss_function`'s backward writes them
    when every ``AccumulateGrad`` runs, and are taken (a second backward through the
    call is the same :class:`WrapError`).  ``item``, ``detach``, ``float``, ``tolist``
    and ``format`` read the value.  Any other use (an op, an attribute such as
    ``grad_fn`` or ``requires_grad``, ``torch.autograd.grad``, ``backward(inputs=...)``,
    a hook on the loss) is that of the node's output, made first (:meth:`_Call.made`),
    so torch sees exactly the default Function's graph.  Saves the Function's 30-odd
    inputs and torch's engine through one ``AccumulateGrad`` per param: ``backward()``
    took 131 us in the loop on 28 params, 20 us now (``docs/torch.md``, "Overhead")."""
    if "lazy" in _CLASSES:
        return _CLASSES["lazy"]
    torch = _torch()
    hash_ = torch.Tensor.__hash__
    plain = {torch.Tensor.item, torch.Tensor.detach, torch.Tensor.__float__,
             torch.Tensor.__format__, torch.Tensor.tolist}
    from torch.utils._pytree import tree_map

    class GradtoolLazyLoss(torch.Tensor):
        def backward(self, gradient=None, retain_graph=None, create_graph=False,
                     inputs=None):
            """``Tensor.backward`` (a method here: no dispatch through torch's
            ``handle_torch_function`` for the usual call)."""
            call = self._gt
            if call.node is None and gradient is None and inputs is None \
                    and not create_graph:
                _accumulate(call.params, _taken(call, None))
                return None
            return call.made().backward(gradient, retain_graph, create_graph, inputs)

        def item(self):
            return self._gt.value.item()

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in plain:
                return func(*[a._gt.value if type(a) is cls else a for a in args], **kwargs)
            if func is hash_:
                return id(args[0])

            def made(a):
                return a._gt.made() if type(a) is cls else a
            return func(*tree_map(made, args), **tree_map(made, kwargs))

    _CLASSES["tensor"] = torch.Tensor
    _CLASSES["lazy"] = GradtoolLazyLoss if _backward_dispatches(torch) else None
    return _CLASSES["lazy"]


def _backward_dispatches(torch) -> bool:
    """Whether ``torch.autograd.backward`` offers a tensor subclass's
    ``__torch_function__`` the call, as ``torch.autograd.grad`` does (torch 2.13's does,
    2.9's does not: there it runs torch's engine on the lazy loss itself, a leaf, and no
    gradient would reach the params).  Where it does not, a call's loss is the node's
    output from the start (:func:`_loss_function`)."""
    seen = []

    class Probe(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.autograd.backward:
                seen.append(func)
                return None
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
    try:
        torch.autograd.backward(torch.Tensor._make_subclass(Probe, torch.zeros(()), True))
    except Exception:                 # (an older torch's own complaint: not offered)
        return False
    return bool(seen)


def _hooked(tensors) -> bool:
    """Whether anything may watch the parameters' accumulation in torch's graph: a
    parameter's own hooks (``register_hook``, ``register_post_accumulate_grad_hook``), or
    torch.distributed running (DDP, FSDP and DeepSpeed hook each parameter's
    ``AccumulateGrad`` node, which a direct call would not run)."""
    running = _CLASSES.get("dist")
    if running is None:
        dist = getattr(_torch(), "distributed", None)
        running = _CLASSES["dist"] = (dist.is_initialized if dist is not None
                                      and dist.is_available() else bool)
    return running() or any(map(_HOOKS, tensors)) or any(map(_POST_HOOKS, tensors))
