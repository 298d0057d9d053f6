"""Keep your own PyTorch loop: a module whose forward and gradients are gradtool's.

    import gradtool.interop.torch as gtt
    gm = gtt.wrap(model, (x, y), backend="cpu")        # or "host", "cuda"
    for x, y in loader:
        loss = gm(x, y)                  # a torch scalar, computed by gradtool
        loss.backward()                  # gradtool's gradients into each param's .grad
        gtt.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); opt.zero_grad()

How (``docs/torch.md``, "Your own loop"):

* A graph is recorded by :func:`~gradtool.interop.torch.import_module` (the one importer)
  per *key*: the inputs' shapes and dtype kinds, the module's train/eval mode and the
  module's float dtype.  A new key (the last partial batch, another sequence length,
  ``eval()``) records again and caches the tape, as ``torch.compile`` recompiles for a
  new shape; past ``max_shapes`` cached keys a warning says so once.  The batch
  dimension is not symbolic: a tape has fixed shapes, and every backend's arena is laid
  out for them.
* Every call reads the module's current trainable parameters and the buffers the
  forward updates (BatchNorm's running statistics), so a ``torch.optim`` step, a
  ``load_state_dict`` or any in-place change on the torch side is seen.  On the cpu
  backend a CPU parameter is not copied: the tape's leaf is a numpy view of the
  tensor's memory.  On host the first graph's arena becomes the parameters' memory
  (:meth:`_Graph.home`): a call reads them there, and copies them in only where one
  was given other memory since.  The module's parameter and buffer dicts are walked
  again only when its members may have changed (:class:`_Members`).  Frozen
  parameters and other buffers are constants of the
  recorded tape (they may be folded); when one of them changes (its version counter
  moves), the next call records again.
* The tape replays forward and backward (the cpu engine: ``Tape.forward/backward``; host
  and cuda: the device engine's :func:`~gradtool.device.engine.capture`).  The loss
  goes to torch as a lazy tensor (:func:`_lazy_loss`): its plain ``backward()`` writes
  gradtool's gradients into each ``.grad`` as torch's ``AccumulateGrad`` would, and any
  other use first makes the ``torch.autograd.Function`` node whose inputs are the
  parameters (:func:`_loss_function`: the gradients times the incoming gradient, when
  it is not 1.0; handed to torch's nodes where a hook watches them, and then made at
  once).  On host the gradients are views of one tensor per graph (:class:`_GradSet`).
* In train mode the rng slot (dropout's and the other draws' counters) is
  ``[step, 0, 1]``, the step counter then advancing by one; in eval mode
  ``[step, 0, 0]``: the draws are off, as ``gradtool train``'s validation.  ``step`` is
  saved and restored with :meth:`GradtoolModule.state_dict`.
"""

from __future__ import annotations

import collections
import inspect
import math
import operator
import warnings
import weakref
from typing import Optional

import numpy as np

from ..errors import GradtoolError, IdsError, WrapError  # noqa: F401  (WrapError: public)
from .handoff import (_GradSet, _as_grad, _hooked, _lazy_class, _lazy_loss,  # noqa: F401
                      _loss_function, _torch)

BACKENDS = ("cpu", "host", "cuda")
MAX_SHAPES = 8        # cached graphs before the warning (torch.compile's default limit)


def compute_dtype(module_dtype) -> str:
    """The tape dtype a module of ``module_dtype`` computes in: the one switch point.

    A float32 module computes in float32 (an f32 tape: ``import_module(dtype="f32")``),
    a float64 one in float64; any other float dtype (float16, bfloat16: no such tape
    dtype) in float64, its gradients rounded once to the parameter's dtype on the way
    back (``docs/torch.md``, "dtype").  :class:`_Graph` passes the answer to the
    importer and the device capture, and fills the leaves in it."""
    return "f32" if str(module_dtype) == "torch.float32" else "f64"


# the torch dtype of a tape dtype (compute_dtype's answers)
_TORCH_DTYPES = {"f64": lambda torch: torch.float64, "f32": lambda torch: torch.float32}


def _required_positional(fn) -> Optional[int]:
    """How many required positional parameters ``fn`` (a module: its forward) takes; None
    when it takes ``*args`` or has no signature."""
    torch = _torch()
    if isinstance(fn, torch.nn.Module):
        fn = fn.forward
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               and p.default is p.empty)


def _float_dtype(params: dict, buffers: dict):
    """The module's float dtype: its first floating parameter's (else buffer's), float64
    for a module with neither."""
    for members in (params, buffers):
        for t in members.values():
            if t.is_floating_point():
                return t.dtype
    return _torch().float64


def _kind(dtype) -> str:
    if dtype.is_floating_point:
        return "float"
    if dtype.is_complex:
        return "complex"
    return "bool" if str(dtype) == "torch.bool" else "int"


def _with_outputs(loss_fn):
    """``loss_fn`` returning ``(loss, the model's outputs)``, under ``loss_fn``'s own
    signature (the importer names the target slots from it)."""
    def composite(out, *targets):
        return loss_fn(out, *targets), out
    torch = _torch()
    fn = loss_fn.forward if isinstance(loss_fn, torch.nn.Module) else loss_fn
    try:
        composite.__signature__ = inspect.signature(fn)
    except (TypeError, ValueError):
        pass
    return composite


class _Graph:
    """One recorded tape (one key) and its engine; what a call needs, found once."""

    def __init__(self, owner, args: tuple, params: dict, buffers: dict):
        model = owner.model
        n_model = owner.n_model
        loss_fn = owner.loss_fn
        if loss_fn is not None and owner.with_outputs:
            loss_fn = _with_outputs(loss_fn)
        self.tape_dtype = compute_dtype(_float_dtype(params, buffers))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # torch.export's own deprecations
            result = owner.importer(model, args[:n_model], loss_fn, args[n_model:],
                                    loss_output=owner.loss_output, dtype=self.tape_dtype)
        self.result = result
        tp = self.tape = result.tape
        self.loss_id = result.loss.id
        self.params = [(k, v.id) for k, v in result.params.items()]
        # the input slots in call order (the importer names them from the signatures)
        self.inputs = [(k, g.id, "int" if tp.holds_ids(g.id) else "float")
                       for k, g in result.inputs.items()]
        if len(self.inputs) != len(args):
            raise WrapError(f"wrap: {len(args)} inputs, but the recorded graph has "
                            f"{len(self.inputs)} input slots (pass tensors only)")
        # the bounds of the ops reading each ids slot, found once (not per call)
        self.id_bounds = {i: tp.id_bounds(i) for _, i, kind in self.inputs if kind == "int"}
        self.id_values = {i for i in self.id_bounds if tp.read_as_values(i)}   # exact in f64
        self.state = [(k, tp.var(k).id, result.outputs[k].id) for k in result.state]
        self.rng_id = tp.rng_id()
        # each user output in torch's flattened order: an output<i>'s node, or -1 (the
        # loss, returned as the loss tensor; or not recorded: returned as None)
        self.out_ids = [-1 if i == owner.loss_output else
                        (result.outputs[f"output{i}"].id if f"output{i}" in result.outputs
                         else -1) for i in range(len(result.out_dtypes))]
        self.out_spec, self.out_dtypes = result.out_spec, result.out_dtypes
        self.out_shapes = result.out_shapes
        # the module returns the loss alone (no pytree to rebuild)
        self.single = (owner.loss_output == 0 and len(self.out_ids) == 1
                       and result.out_spec.is_leaf())
        self.state_names = {k for k, _, _ in self.state}
        self.consts = _consts(params, buffers, self.state_names)
        self.replay = None
        self.views = None
        self.grads_as_params = False
        self.loss_view = None
        self.grad_block = None          # (host arena, start, end) of the params' gradients
        if owner.backend != "cpu":
            from ..device.engine import capture
            self.replay = capture(tp, self.loss_id, owner.backend, dtype=self.tape_dtype)
            prog = self.replay.program
            # per param: (its arena offset, its gradient's (-1: backward never reaches it),
            # its size): written and read straight, the shape checked by _leaf
            self.arena = {i: (prog.val_off[i], prog.grad_off[i], prog.size_of(i))
                          for _, i in self.params}
            # a backend whose arena is a numpy array here (host): each param's values and
            # gradient as tensors viewing it (the param's shape), copied in and out by one
            # torch call for all of them (_params_in, _grads_out)
            host = getattr(self.replay.dev, "host_arena", None)
            if host is not None and all(params[k].numel() == self.arena[i][2]
                                        for k, i in self.params):
                torch = _torch()
                shaped = [(k, self.arena[i], params[k].shape) for k, i in self.params]
                self.views = (
                    [torch.from_numpy(host[v:v + n]).view(shape) for _, (v, _, n), shape in shaped],
                    [None if g < 0 else torch.from_numpy(host[g:g + n]).view(shape)
                     for _, (_, g, n), shape in shaped])
                self.view_ptrs = [v.data_ptr() for v in self.views[0]]
                # the loss where the run leaves it: copied into the loss tensor (no
                # tensor made from a Python float; numpy's copy, lighter than a torch op)
                off = prog.val_off[self.loss_id]
                self.loss_view = torch.from_numpy(host[off:off + 1]).view(())
                self.loss_array = host[off:off + 1].reshape(())
                # the gradients as they are handed to torch: each param's dtype already
                self.grads_as_params = all(params[k].dtype == v.dtype and params[k].device.type
                                           == "cpu" for (k, _), v in zip(self.params,
                                                                        self.views[0]))
                # the params' gradients as one block of the arena, in params order (the
                # layout puts them so): copied out by one copy into a _GradSet
                g0 = self.arena[self.params[0][1]][1] if self.params else -1
                ends = [(g, g + n) for _, (_, g, n) in ((k, self.arena[i])
                                                       for k, i in self.params)]
                if g0 >= 0 and all(g >= 0 for g, _ in ends) and all(
                        a[1] == b[0] for a, b in zip(ends, ends[1:])):
                    self.grad_block = (host, g0, ends[-1][1])
        self.grad_set = None
        self._tensors = None

    def tensors(self, params: dict) -> list:
        """The recorded params' tensors in :attr:`params` order, from the module's
        ``params`` dict (kept for the dict last asked about: the members' cache's, the
        same object while the module's members stay)."""
        found = self._tensors
        if found is None or found[0] is not params:
            found = self._tensors = (params, [params[k] for k, _ in self.params])
        return found[1]

    def current(self, params: dict, buffers: dict) -> bool:
        """Whether the constants the tape was recorded with are unchanged: the same
        tensors (the key names every member and which params train), each at the same
        version."""
        for members, k, t, version in self.consts:
            if (params if members == "p" else buffers).get(k) is not t or t._version != version:
                return False
        return True

    # ── one call ───────────────────────────────────────────────────────────
    def run(self, params: dict, buffers: dict, args, rng, need_grad: bool):
        """(loss, [each param's gradient or None, in :attr:`params` order], [output
        arrays], [new state]): numpy arrays, or tensors (:meth:`_grads_out`)."""
        try:
            if self.replay is None:
                return self._run_cpu(params, buffers, args, rng, need_grad)
            return self._run_device(params, buffers, args, rng, need_grad)
        except IdsError as exc:
            raise self._bad_ids(exc, args) from None

    def _bad_ids(self, exc, args) -> GradtoolError:
        """A take's bad id, computed from an input: which input, which example of the
        batch (:func:`gradtool.tape.ids_culprit`)."""
        from ..tape import ids_culprit
        values = {i: np.asarray(t.detach().cpu()) for (_, i, _), t in zip(self.inputs, args)}
        found = ids_culprit(self.tape, exc, values)
        if found is None:
            return exc
        name, row = found
        where = f"example {row} of the batch" if row is not None else "the batch"
        return WrapError(f"input {name!r}: {where}: {exc}")

    def _leaf(self, i: int, t, what: str) -> np.ndarray:
        """``t``'s values as an array of the tape's dtype and node ``i``'s shape: a view of
        the tensor's own memory where it is a contiguous CPU tensor of that dtype, else a
        converted copy."""
        torch = _torch()
        want = _TORCH_DTYPES[self.tape_dtype](torch)
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype != want:
            t = t.to(want)
        arr = t.numpy()
        shape = self.tape.values[i].shape
        if arr.shape != shape:
            if arr.size != math.prod(shape):
                raise WrapError(f"{what} has shape {list(arr.shape)}; the recorded graph's is "
                                f"{list(shape)}")
            arr = arr.reshape(shape)
        return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)

    def _ids(self, i: int, name: str, t, check: bool = True) -> np.ndarray:
        """``t`` as int64 ids of node ``i``'s shape, checked in range (unless the setter
        checks them: the device engine's ``set_input`` with this input's name)."""
        torch = _torch()
        if t.requires_grad:                     # (a float tensor given as ids)
            t = t.detach()
        if not t.is_cpu:
            t = t.cpu()
        if t.dtype is not torch.int64:
            t = t.to(torch.int64)
        arr = t.numpy().reshape(self.tape.values[i].shape)
        if check:
            from ..ops import inexact_int
            from ..tape import check_ids
            check_ids(arr, self.id_bounds[i], f"input {name!r}", WrapError)
            if i in self.id_values and inexact_int(arr):
                raise WrapError(f"input {name!r}: {inexact_int(arr)}")
        return arr

    def _fill(self, set_leaf, params, buffers, args, rng, set_param=None,
              with_params=True, set_ids=None) -> None:
        """Every leaf's values through the setters; ``set_ids(i, ids, name)`` (checking
        them) where given, else ``set_leaf`` after the checks here."""
        set_param = set_param or set_leaf
        for k, i in self.params if with_params else ():
            set_param(i, self._leaf(i, params[k], f"parameter {k!r}"))
        for k, i, _ in self.state:
            set_leaf(i, self._leaf(i, buffers[k], f"buffer {k!r}"))
        for (name, i, kind), t in zip(self.inputs, args):
            if kind != "int":
                set_leaf(i, self._leaf(i, t, f"input {name!r}"))
            elif set_ids is not None:
                set_ids(i, self._ids(i, name, t, check=False), name)
            else:
                set_leaf(i, self._ids(i, name, t))
        if self.rng_id >= 0:
            set_leaf(self.rng_id, np.array(rng, dtype=np.float64))

    def _run_cpu(self, params, buffers, args, rng, need_grad):
        tp = self.tape

        def set_leaf(i, arr):          # the leaf IS the array: no copy (a view of a tensor)
            tp.values[i] = arr
        self._fill(set_leaf, params, buffers, args, rng)
        tp.forward()
        loss = float(tp.values[self.loss_id].reshape(-1)[0])
        grads = []
        if need_grad:
            tp.zero_grad()
            tp.backward(tp.var(self.loss_id))
            grads = [tp.grads[i] for _, i in self.params]
            tp.zero_grad()             # torch owns the arrays now; the next backward makes new ones
        outs = [tp.values[i].copy() if i >= 0 else None for i in self.out_ids]
        state = [tp.values[o].copy() for _, _, o in self.state]
        return loss, grads, outs, state

    def home(self, params: dict) -> bool:
        """Make the arena (host) the params' own memory: each param's values copied into
        its arena view, and the view made the param's ``.data``, so that a call reads
        them where they are and an optimizer steps them there.  Only where every param
        can live there (a CPU tensor of the arena's dtype and the node's shape); False,
        nothing changed, where one cannot."""
        if self.views is None:
            return False
        torch = _torch()
        tensors = [params[k] for k, _ in self.params]
        views = self.views[0]
        if not all(isinstance(t, torch.nn.Parameter) and t.device.type == "cpu"
                   and t.dtype == v.dtype and t.shape == v.shape
                   for t, v in zip(tensors, views)):
            return False
        with torch.no_grad():
            for t, v in zip(tensors, views):
                v.copy_(t)
                t.data = v
        return True

    def _params_in(self, params) -> bool:
        """Every param's values in its arena view (host): nothing to do where the params
        live there (:meth:`home`: their memory is the arena's still), else copied by one
        ``_foreach_copy_`` (torch converts a dtype or device); False (nothing copied)
        where that cannot be done (no views, a param of another shape): :meth:`_fill`
        then converts each and names a bad one."""
        if self.views is None:
            return False
        tensors = self.tensors(params)
        if list(map(_DATA_PTR, tensors)) == self.view_ptrs:
            return True
        views = self.views[0]
        if any(t.shape != v.shape for t, v in zip(tensors, views)):
            return False
        torch = _torch()
        with torch.no_grad():
            _foreach(torch, "_foreach_copy_", views, tensors)
        return True

    def _grads_out(self) -> list:
        """Copies of every param's gradient (host arena views) in :attr:`params` order,
        as tensors (None for one backward never reaches): where they are one block of
        the arena, one copy into this graph's :class:`_GradSet` (the last one again when
        nothing but this graph holds it any more); else one ``_foreach_clone``."""
        torch = _torch()
        if self.grad_block is not None:
            gs = self.grad_set
            if gs is None or not gs.free():
                gs = self.grad_set = _GradSet(torch, self.views[0])
            host, start, end = self.grad_block
            np.copyto(gs.flat, host[start:end])
            return list(gs.views)
        live = [g for g in self.views[1] if g is not None]
        it = iter(_foreach(torch, "_foreach_clone", live))
        return [None if g is None else next(it) for g in self.views[1]]

    def _run_device(self, params, buffers, args, rng, need_grad):
        rp = self.replay
        dev, arena = rp.dev, self.arena

        def set_param(i, arr):         # a param's values: no checks to make (floats)
            dev.write(arena[i][0], arr)

        def set_ids(i, arr, name):     # checked there, named as the input
            rp.set_input(i, arr, f"input {name!r}", WrapError)
        inside = self._params_in(params)
        self._fill(rp.set_input, {} if inside else params, buffers, args, rng, set_param,
                   with_params=not inside, set_ids=set_ids)
        if need_grad:
            rp.episode(train=False)    # forward and backward, no optimizer
        else:
            rp.forward()
        # (the loss tensor is the arena's loss, where there is one: no float read here)
        loss = rp.loss() if self.loss_view is None else None
        grads = []
        if need_grad and self.views is not None:     # copies of the views, in their dtype
            grads = self._grads_out()
        elif need_grad:
            for _, i in self.params:
                _, g_off, size = arena[i]
                grads.append(dev.read(g_off, size).reshape(self.tape.values[i].shape)
                             if g_off >= 0 else None)
        outs = [rp.value(i) if i >= 0 else None for i in self.out_ids]
        state = [rp.value(o) for _, _, o in self.state]
        return loss, grads, outs, state


def _leave_arena(tensors: list, ptrs: list) -> None:
    """Give each param still in a wrapper's arena (its memory there) a copy of its own."""
    torch = _torch()
    with torch.no_grad():
        for t, ptr in zip(tensors, ptrs):
            if t.data_ptr() == ptr:
                t.data = t.data.clone()


def _foreach(torch, name: str, *lists):
    """``torch._foreach_<op>`` over the lists (one call for every tensor), or the op
    tensor by tensor where this torch has no such function."""
    fn = getattr(torch, name, None)
    if fn is not None:
        return fn(*lists)
    if name == "_foreach_copy_":
        for dst, src in zip(*lists):
            dst.copy_(src)
        return None
    return [t.clone() for t in lists[0]]          # _foreach_clone


# ── the module's members, walked once while its structure stays ──────────

_STRUCTURE = [0]        # bumped by torch's global registration hooks (installed once)
_NAMES: dict = {}       # (param names, buffer names) -> a small int (_Members.names)
_TRAINS = operator.attrgetter("requires_grad")
# (torch's unbound methods once torch is imported, :func:`module_class`: twice as fast)
_CONTIGUOUS = operator.methodcaller("is_contiguous")
_DATA_PTR = operator.methodcaller("data_ptr")


def _watch_structure(torch) -> None:
    """Count every parameter, buffer and submodule registered anywhere (``__setattr__``,
    ``register_*``: torch's global registration hooks, which leave the value as it is)."""
    if "watch" in _CLASSES:
        return

    def registered(module, name, value):
        _STRUCTURE[0] += 1
    m = torch.nn.modules.module
    m.register_module_parameter_registration_hook(registered)
    m.register_module_buffer_registration_hook(registered)
    m.register_module_module_registration_hook(registered)
    _CLASSES["watch"] = registered


class _Members:
    """The module's named parameters and buffers (torch's walk of its tree), kept while
    it may still be current: nothing was registered anywhere since (a new or replaced
    parameter, buffer or submodule) and every member found is still where it was (not
    deleted).  A walk is ~50 us on a small transformer; the check, one identity test per
    member."""

    def __init__(self, model):
        self.structure = _STRUCTURE[0]
        self.params = dict(model.named_parameters())
        self.buffers = dict(model.named_buffers())
        held = []
        for kind, members in (("_parameters", self.params), ("_buffers", self.buffers)):
            for name, t in members.items():
                owner, _, leaf = name.rpartition(".")
                held.append((getattr(model.get_submodule(owner), kind), leaf, t))
        for name, mod in model.named_modules():
            if name:
                owner, _, leaf = name.rpartition(".")
                held.append((model.get_submodule(owner)._modules, leaf, mod))
        # as three lists: the check is then two C-level maps, no Python loop
        self.held = ([d for d, _, _ in held], [k for _, k, _ in held], [t for _, _, t in held])
        # part of a graph's key: the members' names, as a small int (one per distinct
        # set of names seen in this process: no tuple of every name hashed per call)
        self.names = _NAMES.setdefault((tuple(self.params), tuple(self.buffers)),
                                       len(_NAMES))

    def current(self) -> bool:
        dicts, names, members = self.held
        return _STRUCTURE[0] == self.structure and all(
            map(operator.is_, map(dict.get, dicts, names), members))


def _consts(params: dict, buffers: dict, state_names) -> list:
    """("p" or "b", name, tensor, version counter) of what a recorded tape holds as
    constants (and may have folded): frozen parameters and the buffers the forward does
    not update."""
    out = [("p", k, p, p._version) for k, p in params.items() if not p.requires_grad]
    out += [("b", k, b, b._version) for k, b in buffers.items() if k not in state_names]
    return out


_CLASSES: dict = {}       # made on first use: the module class, the registration hook


# ── the module ─────────────────────────────────────────────────────────────

class _Wrapper:
    """The methods of :class:`GradtoolModule` (an ``nn.Module`` subclass made on first
    use, so that this file imports without torch)."""

    def _setup(self, model, example_inputs, backend, loss_fn, loss_output, outputs,
               targets, max_shapes, importer):
        torch = _torch()
        if not isinstance(model, torch.nn.Module):
            raise WrapError(f"wrap: expected a torch.nn.Module, got {type(model).__name__}")
        if backend not in BACKENDS:
            raise WrapError(f"wrap: unknown backend {backend!r} (choose from "
                            f"{', '.join(BACKENDS)})")
        args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) \
            else (example_inputs,)
        # what a copy is made with (__deepcopy__): the wrap arguments, the example's
        # tensors detached (no graph kept alive)
        self._made_with = (tuple(a.detach() if isinstance(a, torch.Tensor) else a
                                 for a in args),
                           dict(backend=backend, loss_fn=loss_fn, loss_output=loss_output,
                                outputs=outputs, targets=targets, max_shapes=max_shapes,
                                importer=importer))
        self.model = model                          # a submodule: train()/eval() reach it
        self.backend, self.loss_fn, self.loss_output = backend, loss_fn, int(loss_output)
        self.with_outputs = bool(outputs)
        if outputs and loss_fn is None:
            raise WrapError("wrap: outputs=True needs loss_fn= (without it the call returns "
                            "what the module returns)")
        self.importer = importer
        self.n_args = len(args)
        self.n_model = self._model_inputs(len(args), targets)
        self.max_shapes = int(max_shapes)
        self.graphs = collections.OrderedDict()
        self.step = 0
        self._warned = False
        self._home = None                           # the graph whose arena holds the params
        self._release = None                        # (its finalizer: _leave_arena)
        _watch_structure(torch)
        self._members = _Members(model)
        self._graph(args, self._members.params, self._members.buffers)
        # (recorded now: an import problem surfaces here)

    def _model_inputs(self, n: int, targets) -> int:
        if self.loss_fn is None:
            return n
        if targets is None:
            need = _required_positional(self.loss_fn)
            if need is None or need < 1:
                raise WrapError("wrap: cannot tell how many of the inputs are loss_fn's "
                                "targets from its signature; pass targets=N")
            targets = need - 1
        if not 0 <= int(targets) < n:
            raise WrapError(f"wrap: {targets} targets for loss_fn, but {n} example inputs")
        return n - int(targets)

    @property
    def dtype(self):
        """The module's float dtype (its first floating parameter's)."""
        return _float_dtype(dict(self.model.named_parameters()),
                            dict(self.model.named_buffers()))

    # ── the cache ──────────────────────────────────────────────────────────
    def _key(self, args, params: dict, dtype) -> tuple:
        torch = _torch()
        for k, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                raise WrapError(f"input {k}: expected a tensor, got {type(a).__name__}")
        return (tuple((tuple(a.shape), _kind(a.dtype)) for a in args), bool(self.training),
                str(dtype), self._members.names, tuple(map(_TRAINS, params.values())))

    def _graph(self, args, params: dict, buffers: dict, dtype=None) -> _Graph:
        key = self._key(args, params, dtype or _float_dtype(params, buffers))
        graph = self.graphs.get(key)
        if graph is not None and not graph.current(params, buffers):
            graph = None                            # a constant changed: record again
        if graph is None:
            old = self.graphs.get(key)
            graph = self.graphs[key] = _Graph(self, args, params, buffers)
            if (self._home is None or self._home is old) and graph.home(params):
                self._home = graph                  # the params live in its arena now
                # when the wrapper goes, the params move to memory of their own (the
                # arena, all of a step's values, is not kept alive by them)
                tensors = [params[k] for k, _ in graph.params]
                if self._release is not None:
                    self._release.detach()
                self._release = weakref.finalize(self, _leave_arena, tensors,
                                                 list(graph.view_ptrs))
                self._release.atexit = False
            if len(self.graphs) > self.max_shapes and not self._warned:
                self._warned = True
                warnings.warn(
                    f"gradtool.wrap: {len(self.graphs)} graphs recorded (one per input "
                    f"shape and train/eval mode), more than max_shapes={self.max_shapes}; "
                    f"each new shape records the model again (pad inputs to a few shapes, "
                    f"or drop_last=True in the DataLoader)", stacklevel=4)
        self.graphs.move_to_end(key)
        return graph

    # ── a call ─────────────────────────────────────────────────────────────
    def forward(self, *args):
        torch = _torch()
        if len(args) != self.n_args:
            raise WrapError(f"the wrapped module takes {self.n_args} inputs (as its "
                            f"example), got {len(args)}")
        members = self._members
        if not members.current():
            members = self._members = _Members(self.model)
        params, buffers = members.params, members.buffers
        dtype = _float_dtype(params, buffers)
        graph = self._graph(args, params, buffers, dtype)
        train = bool(self.training)
        tensors = graph.tensors(params)
        # (the key holds which params train: the graph's are those, all requiring grad)
        need_grad = bool(tensors) and torch.is_grad_enabled()
        loss, grads, outs, state = graph.run(params, buffers, args,
                                             (float(self.step), 0.0, 1.0 if train else 0.0),
                                             need_grad)
        if train:
            self.__dict__["step"] += 1              # (not through Module.__setattr__)
        if graph.state:
            with torch.no_grad():                   # BatchNorm's statistics flow back
                for (k, _, _), value in zip(graph.state, state):
                    b = buffers[k]
                    b.copy_(torch.from_numpy(value).reshape(b.shape).to(b.dtype))
        on_cpu = tensors[0].is_cpu if tensors else True
        view = graph.loss_view
        if view is not None and on_cpu and view.dtype == dtype:
            loss_t = view if need_grad else view.clone()    # (apply's forward copies it)
        else:
            loss_t = torch.tensor(graph.replay.loss() if loss is None else loss, dtype=dtype)
            if not on_cpu:
                loss_t = loss_t.to(tensors[0].device)
        loss_shape = tuple(loss_t.shape)
        if need_grad:
            g = grads if graph.grads_as_params and on_cpu else [
                None if a is None else _as_grad(torch, a, p) for a, p in zip(grads, tensors)]
            # gradtool writes .grad itself unless a hook watches it (then torch's own
            # AccumulateGrad, as for its ops) or a param is not contiguous (torch then
            # gives .grad the param's strides)
            direct = not _hooked(tensors) and all(map(_CONTIGUOUS, tensors))
            if direct and _lazy_class() is not None:    # torch's graph made only if used
                loss_t = _lazy_loss(torch.from_numpy(graph.loss_array.copy())
                                    if loss_t is view else loss_t, g, tensors)
            else:
                loss_t = _loss_function().apply(loss_t, g, direct, *tensors)
        if graph.single:
            return loss_t if graph.out_shapes[0] in (None, ()) else loss_t.reshape(
                graph.out_shapes[0])
        flat = []
        device = tensors[0].device if tensors else torch.device("cpu")
        for i, (value, odt, shape) in enumerate(zip(outs, graph.out_dtypes,
                                                     graph.out_shapes)):
            if i == self.loss_output:
                flat.append(loss_t if shape in (None, loss_shape) else loss_t.reshape(shape))
            elif value is None:
                flat.append(None)
            else:
                t = torch.from_numpy(np.asarray(value))
                want = dtype if odt is None or odt.is_floating_point else odt
                flat.append(t.reshape(shape if shape is not None else t.shape)
                            .to(want).to(device))
        import torch.utils._pytree as pytree
        return pytree.tree_unflatten(flat, graph.out_spec)

    def __deepcopy__(self, memo):
        """A wrapper of a deep copy of the module, made as ``wrap`` made this one (its
        first graph recorded again; the engines and arenas are this process's, not
        copied), in the same train/eval mode and at the same step."""
        import copy
        args, options = self._made_with
        new = type(self)(copy.deepcopy(self.model, memo), copy.deepcopy(args, memo),
                         **options)
        new.train(self.training)
        new.__dict__["step"] = self.step
        memo[id(self)] = new
        return new

    def __reduce__(self):
        """Pickled (``torch.save(gm)``, multiprocessing) as the module, the wrap arguments,
        the mode and the step: unpickling wraps the module again (:func:`_rewrap`)."""
        args, options = self._made_with
        return (_rewrap, (self.model, args, options, bool(self.training), self.step))

    # ── the step counter in state_dict ─────────────────────────────────────
    def get_extra_state(self):
        return {"gradtool.step": self.step}

    def set_extra_state(self, state):
        if not (isinstance(state, dict) and isinstance(state.get("gradtool.step"), int)
                and state["gradtool.step"] >= 0):
            raise WrapError(f"the wrapped module's state: expected {{'gradtool.step': a "
                            f"count >= 0}}, got {state!r}"[:300])
        self.step = state["gradtool.step"]

    def extra_repr(self) -> str:
        return (f"backend={self.backend!r}, step={self.step}, graphs={len(self.graphs)}"
                + (f", loss_fn={getattr(self.loss_fn, '__name__', self.loss_fn)!r}"
                   if self.loss_fn is not None else ""))


def _rewrap(model, args, options: dict, training: bool, step: int):
    """A pickled wrapper made again (:meth:`_Wrapper.__reduce__`)."""
    new = module_class()(model, args, **options)
    new.train(training)
    new.__dict__["step"] = step
    return new


def module_class():
    """:class:`GradtoolModule`: ``torch.nn.Module`` with the wrapper's methods."""
    if "module" not in _CLASSES:
        torch = _torch()
        global _CONTIGUOUS, _DATA_PTR
        _CONTIGUOUS, _DATA_PTR = torch.Tensor.is_contiguous, torch.Tensor.data_ptr

        class GradtoolModule(_Wrapper, torch.nn.Module):
            """A module whose forward and gradients gradtool computes: see :func:`wrap`
            (``gradtool.interop.torch.wrap``) and ``docs/torch.md``."""

            def __init__(self, model, example_inputs, backend="cpu", loss_fn=None, *,
                         loss_output=0, outputs=False, targets=None,
                         max_shapes=MAX_SHAPES, importer=None):
                torch.nn.Module.__init__(self)
                self._setup(model, example_inputs, backend, loss_fn, loss_output, outputs,
                            targets, max_shapes, importer)

        GradtoolModule.__module__ = __name__
        _CLASSES["module"] = GradtoolModule
    return _CLASSES["module"]


# ── clipping ───────────────────────────────────────────────────────────────

def clip_grad_norm_(parameters, max_norm: float):
    """Scale the ``.grad`` of ``parameters`` so their global norm is at most ``max_norm``,
    in place, and return the norm before clipping (a 0-dim float64 tensor), as
    ``torch.nn.utils.clip_grad_norm_`` does, by ``gradtool train --clip``'s rule
    (:func:`gradtool.optim.global_norm`): params without a ``.grad`` are skipped, the
    others' gradients (as float64) are squared and summed serially from 0.0, in the
    order given, row-major; ``norm = sqrt(sum)``; only where ``norm > max_norm`` is every
    gradient multiplied by ``max_norm / norm`` (one float64 rounding each, then one to
    the gradient's dtype).  torch's own divides by ``norm + 1e-6`` and multiplies every
    gradient by ``min(1, that)``, with a reduction order of its kernels' choosing."""
    from ..optim import clip_scale, global_norm
    torch = _torch()
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    try:
        max_norm = float(max_norm)
    except (TypeError, ValueError):
        raise WrapError(f"clip_grad_norm_: max_norm must be a number, got "
                        f"{type(max_norm).__name__}") from None
    if not (math.isfinite(max_norm) and max_norm >= 0.0):
        raise WrapError(f"clip_grad_norm_: max_norm must be a finite number >= 0, got "
                        f"{max_norm!r}")
    arrays = [g.detach().cpu().to(torch.float64).numpy() for g in grads]
    norm = global_norm(arrays)
    scale = clip_scale(norm, max_norm) if max_norm > 0.0 else None
    if scale is not None:
        with torch.no_grad():
            for g, a in zip(grads, arrays):
                g.copy_(torch.from_numpy(a * scale).to(g.dtype))
    return torch.tensor(norm, dtype=torch.float64)
