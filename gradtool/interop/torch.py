"""Import a PyTorch module into a gradtool tape: ``torch.export`` -> Tape -> tape file.

    from gradtool.interop.torch import import_module, load_weights
    result = import_module(model, (x, y))            # the module returns its scalar loss
    result.save("model.msgpack")                     # gradtool train model.msgpack ...
    load_weights(model, "trained.msgpack")           # the trained params back, by name

Or keep your own training loop (``gradtool/interop/wrap.py``)::

    import gradtool.interop.torch as gtt
    gm = gtt.wrap(model, (x, y), backend="cpu", loss_fn=F.cross_entropy)
    loss = gm(x, y); loss.backward()                 # gradtool's gradients into .grad
    gtt.clip_grad_norm_(model.parameters(), 1.0)     # gradtool train --clip's norm
    opt = gtt.optim.AdamW(model.parameters(), lr=3e-4)  # the optimizer table's step

How it works (``docs/torch.md``):

1. ``torch.export.export(module, inputs)`` then ``run_decompositions()`` give a
   graph of core ATen ops.  :func:`import_module` exports a float64 copy of
   the module (every float becomes float64: see "dtype policy" below).
2. ``graph_signature.input_specs`` first: each PARAMETER becomes ``tp.param``
   named by its state_dict name, in registration order; frozen params
   (``requires_grad=False``), BUFFERs and CONSTANT_TENSORs are constants; each
   USER_INPUT becomes a named const (an input slot ``gradtool train`` fills
   from an npz member of that name), floats f64, integers i64 ids, bools a
   0.0/1.0 f64 mask; names come from the forward's signature.
3. Two passes over the nodes before anything is recorded: constant folding
   (a node whose inputs are all constants -- shapes, arange, full, frozen
   weights, buffers -- is evaluated once by torch in float64 and becomes a
   const where a recorded op reads it: causal masks, RoPE tables of constant
   positions) and the problem report (unsupported ops, random ops,
   data-dependent shapes, mutated inputs).  Any problem raises ONE
   :class:`TorchImportError` listing every offending target with its count
   and the user's source line; nothing is written.
4. Then every remaining node, in graph order, goes through the mapping table
   :data:`gradtool.interop.aten.ATEN` (one small function per ATen op that
   records through the Tape).

Buffers and frozen params are recorded as *unnamed* consts (a named const is
a training input slot, which a buffer is not); their names and node ids are
kept in the tape file's ``meta["torch"]["consts"]``.  Buffers the forward
mutates (batch norm's running statistics and ``num_batches_tracked`` in train
mode) are *state*: a named float64 const under the buffer's name, and the new
value a named output of the same name, paired in the file's ``state`` map, so
``gradtool train`` replaces the one by the other after every step and
:func:`load_weights` copies the trained state back into the buffers.

dtype policy (``dtype=``, the command line's ``--dtype``; :data:`DEFAULT_DTYPE` "module",
the module's own float dtype):
the module is always recorded in float64 first -- parameters, buffers, inputs and every
intermediate (float32, float16 and bfloat16 alike) become float64, and the export runs
with torch's default dtype float64, so a tensor the forward creates without a dtype
(``torch.zeros(n)``, ``torch.tensor(0.1)``) is float64 too, as it is in
``torch.set_default_dtype(torch.float64)``.  With "f64" that is the tape: it matches
torch float64 autograd of the same module (loss within 1e-12 relative in the tests).
With "f32" the recording becomes an f32 tape (:func:`gradtool.convert.to_dtype`: params
and float consts rounded once, every op re-recorded by its f32 rule), whose loss is
checked against the module's torch float32 run within :data:`F32_CHECK` (skipped where
the tape draws random numbers).  "module" picks "f32" or "f64" from the module's own
floating dtype (a torch.nn model as built: f32); a float16 or bfloat16 module, or mixed
dtypes, is refused with a message to pass "f32" or "f64".  :func:`load_weights` rounds
the trained params to each parameter's own dtype.

Complex values (Meta's LLaMA rotary embeddings: ``view_as_complex``, a product by a
complex table, ``view_as_real``) are complex128 likewise (complex64 is exact in it)
and never reach the tape as such: each is a pair of float64 values, its real and
imaginary parts (:class:`~.aten.Complex`; a complex buffer or folded table, two
consts).  A node that reads or makes a complex tensor is recorded by the table's
``COMPLEX`` entries instead of ``ATEN``; any other op on one, a complex input and a
trainable complex parameter are refused, one line each.

Dropout and random draws: eval-mode dropout disappears in the export.  Train-mode
dropout (``native_dropout``, ``dropout``; ``feature_dropout`` and ``alpha_dropout``,
kept out of ``run_decompositions`` as gradtool's custom ops) and the draws torch's
random ops make (``bernoulli``, ``rand*``, ``randn*``, ``normal``, ``randint``,
``randperm``, ``multinomial``) are imported as gradtool's counter-based draws
(:func:`gradtool.nn.dropout`, :func:`gradtool.nn.rand` ...: each mask a pure function
of the tape's rng slot -- seed, step -- and the element index, the same bits on every
backend), so a module trains with dropout on; with the rng slot's train flag 0
(validation) dropout is off and each draw is its mean.  torch's own masks are other
numbers, so the import's check against torch runs with dropout off.  A random op the
table lacks is refused by name, one line; nothing random is ever folded.
"""

from __future__ import annotations

import collections
import copy
import inspect

import numpy as np

from ..errors import GradtoolError
from . import aten as A
from .aten.recorder import Recorder, dtype_kind
from .export import (as_f64, backward_hooks, custom_functions, detach_no_grad_blocks,
                     float64_default, keep_dropouts, quiet_leafspec, run_decompositions,
                     stderr_kept, torch_failed, user_outputs)
from .problems import (NOT_A_LOSS, Problem, Problems, TorchImportError, WeightsError,
                       mentions_dropout, source_line)
from .result import TorchImport
from .verify import check_against_torch
from .weights import load_weights

__all__ = ["import_module", "import_program", "load_weights", "TorchImport",
           "TorchImportError", "WeightsError", "Problem", "NOT_A_LOSS", "DEFAULT_DTYPE",
           "IMPORT_DTYPES", "F32_CHECK", "Recorder", "wrap", "clip_grad_norm_",
           "check_against_torch", "source_line"]

# the names these had when they lived here (tests/test_import_check.py, tests/test_zoo.py)
_Problems, _run_decompositions = Problems, run_decompositions

_MISSING = object()           # the value of a node that could not be recorded


# ── entry points ───────────────────────────────────────────────────────────

def _float64_copy(module, torch):
    """A copy of ``module`` whose floating params and buffers are float64 and complex ones
    complex128 (exact: the dtype policy); ``Module.to(torch.float64)`` would make a complex
    buffer float64, dropping its imaginary part."""
    return copy.deepcopy(module)._apply(lambda t: t.to(_f64(torch, t.dtype)))


def _with_loss(module, loss_fn, n_inputs: int):
    import torch

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = module

        def forward(self, *args):
            out = self.model(*args[:n_inputs])
            return loss_fn(out, *args[n_inputs:])

    return WithLoss()


# the importer's dtype when none is asked for: "f64" (every f64 test of the importer and the
# f64 contract), or "module" (the module's own dtype: a torch.nn model as built imports at
# float32, issue 38; docs/torch.md "dtype")
DEFAULT_DTYPE = "module"
IMPORT_DTYPES = ("f32", "f64", "module")
EPS32 = 2.0 ** -23
# the f32 import check: |gradtool f32 loss - torch float32 loss| <= F32_CHECK * max(1, |loss|)
F32_CHECK = 2.0 ** 10 * EPS32


def import_module(module, example_inputs, loss_fn=None, loss_inputs=(), *,
                  input_names=None, loss_output: int = 0, strict: bool = True,
                  dtype: str = DEFAULT_DTYPE) -> TorchImport:
    """Record ``module`` applied to ``example_inputs`` (a tuple of tensors) as a Tape.

    The loss is the module's scalar output (``loss_output`` picks it among several
    outputs; the others become named outputs ``output<i>``), or ``loss_fn(outputs,
    *loss_inputs)`` with ``loss_inputs`` (targets) as further input slots, named
    from ``loss_fn``'s signature.  Input slot names default to the forward's
    parameter names.  The module itself is not changed (a float64 copy is
    exported).  Raises :class:`TorchImportError` listing every problem.

    ``dtype``: "f64" (every float becomes float64, the module's torch float64 run),
    "f32" (that recording as an f32 tape, :func:`gradtool.convert.to_dtype`, checked
    against the module's torch float32 run within :data:`F32_CHECK`), or "module" (the
    module's own dtype: float32 for a torch.nn model as built; a float16 or bfloat16
    module is refused, and converts with "f32" or "f64").
    """
    import torch
    if not isinstance(module, torch.nn.Module):
        raise TorchImportError([Problem("not a torch.nn.Module:", type(module).__name__,
                                        count=1)])
    example_inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) \
        else (example_inputs,)
    loss_inputs = tuple(loss_inputs)
    target = _target_dtype(torch, module, example_inputs + loss_inputs, dtype)
    result = _import_f64(module, example_inputs, loss_fn, loss_inputs, input_names,
                         loss_output, strict)
    if target == "f32":
        result = _as_f32(torch, result, module, example_inputs, loss_fn, loss_inputs,
                         loss_output)
    return result


def _target_dtype(torch, module, tensors, dtype: str) -> str:
    """The import's dtype ("f32"/"f64") from ``dtype`` (:data:`IMPORT_DTYPES`)."""
    from ..convert import module_dtype
    if dtype not in IMPORT_DTYPES:
        raise TorchImportError([Problem("dtype", repr(dtype), count=1, detail=(
            "choose 'f32', 'f64' or 'module' (the module's own dtype)"))])
    if dtype != "module":
        return dtype
    found = sorted({str(t.dtype).removeprefix("torch.")
                    for t in list(module.parameters()) + list(module.buffers()) + list(tensors)
                    if isinstance(t, torch.Tensor) and t.is_floating_point()})
    own = module_dtype(found)
    if own is None:
        raise TorchImportError([Problem("module dtype", "/".join(found), count=1, detail=(
            "gradtool computes in f32 or f64; pass --dtype f32 or --dtype f64 "
            "(dtype='f32'/'f64') to convert it"))])
    return own


def _as_f32(torch, result, module, example_inputs, loss_fn, loss_inputs, loss_output):
    """The f64 import ``result`` as an f32 tape (gradtool.convert.to_dtype: params and
    float consts rounded once, every op re-recorded by its f32 rule), its loss checked
    against the module's torch float32 run (skipped, as the f64 check treats dropout,
    where the tape draws numbers: torch's draws differ).  ``result.check`` says both
    differences: f32 against torch float32, and f32 against the f64 recording."""
    from ..convert import as_dtype, to_dtype
    tape, ids = to_dtype(result.tape, "f32")

    def moved(v):
        return as_dtype(tape, ids, v.id, "f32")

    loss64 = _eval_loss(result.tape, result.loss)
    out = TorchImport(tape, moved(result.loss),
                      {k: moved(v) for k, v in result.outputs.items()},
                      {k: tape.var(ids[v.id]) for k, v in result.params.items()},
                      {k: tape.var(ids[v.id]) for k, v in result.inputs.items()},
                      {k: tape.var(ids[v.id]) for k, v in result.consts.items()},
                      result.histogram, result.input_dtypes, dict(result.state))
    # what the f64 import found of the module's outputs (the own-loop wrapper's), its notes
    out.out_spec, out.out_dtypes = result.out_spec, result.out_dtypes
    out.out_shapes, out.notes = result.out_shapes, result.notes
    loss32 = _eval_loss(tape, out.loss)
    out.check = {"dtype": "f32", "loss": loss32, "f64_loss": loss64,
                 "f64_difference": abs(loss32 - loss64), "bound": None,
                 "torch_f32_loss": None, "f32_difference": None}
    if tape.rng_id() >= 0:
        return out
    want = _torch_loss32(torch, module, example_inputs, loss_fn, loss_inputs, loss_output)
    bound = F32_CHECK * max(1.0, abs(want))
    out.check.update(torch_f32_loss=want, f32_difference=abs(loss32 - want), bound=bound)
    if not abs(loss32 - want) <= bound:
        raise TorchImportError([Problem("f32 import check", "loss", count=1, detail=(
            f"the f32 tape's loss {loss32!r} differs from torch's float32 run {want!r} by "
            f"{abs(loss32 - want):.3g}, over the bound {bound:.3g} (2^10 float32 eps "
            f"scaled by the loss); the f64 recording gives {loss64!r}"))])
    return out


def _torch_loss32(torch, module, inputs, loss_fn, loss_inputs, loss_output) -> float:
    """The module's loss in torch float32 (a copy: buffers the forward updates stay)."""
    def f32(t):
        return t.to(torch.float32) if t.is_floating_point() else t

    m32 = copy.deepcopy(module)._apply(f32)
    with torch.no_grad():
        out = m32(*[f32(t) for t in inputs])
        if loss_fn is not None:
            out = loss_fn(out, *[f32(t) for t in loss_inputs])
        if isinstance(out, (tuple, list)):      # the module's, or a loss_fn's (loss, ...)
            out = out[loss_output]
    return float(out.to(torch.float64).reshape(()))


def _import_f64(module, example_inputs, loss_fn, loss_inputs, input_names, loss_output,
                strict) -> TorchImport:
    """The f64 import (the dtype policy above)."""
    import torch
    names = list(input_names) if input_names is not None else \
        _arg_names(module.forward, len(example_inputs))
    if loss_fn is not None and input_names is None:
        names += _arg_names(loss_fn, len(loss_inputs) + 1)[1:]
    hooks = backward_hooks(module)
    if hooks:
        raise TorchImportError(hooks)
    m64 = _float64_copy(module, torch)
    args = tuple(as_f64(t) for t in example_inputs + loss_inputs)
    prefix = ""
    if loss_fn is not None:
        m64 = _with_loss(m64, loss_fn, len(example_inputs))
        prefix = "model."
    # parameters frozen in the user's module stay frozen in the copy (deepcopy keeps it)
    with float64_default(torch), custom_functions(torch) as custom:
        try:
            with stderr_kept(lambda exc: hasattr(exc, "partial_fx_graph")):
                ep = torch.export.export(m64, args)
        except Exception as exc:      # torch's own refusal (data-dependent control flow...)
            raise torch_failed("torch.export", exc) from None
    if custom:
        raise TorchImportError(list(custom.values()))
    return import_program(ep, input_names=names, loss_output=loss_output, strip=prefix,
                          strict=strict)


def _arg_names(fn, n: int) -> list:
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[:n]]
    names += [f"input{i}" for i in range(len(names), n)]
    return names


def import_program(ep, *, input_names=None, loss_output: int = 0, strip: str = "",
                   strict: bool = True) -> TorchImport:
    """Record an ``ExportedProgram`` (decomposed here with ``run_decompositions()``, whose
    table keeps ``aten.PRESERVE`` as they are: ``aten.detach``, a stop-gradient, which it
    would make an alias; ``aten.index_add``, recorded as Tape.index_add, which it would make
    index_put; an op whose decomposition is not the op),
    and refuse it if the tape's loss is not torch's run of ``ep`` (:mod:`.verify`)."""
    import torch
    with quiet_leafspec():              # both deep-copy the program
        ep = detach_no_grad_blocks(ep, torch)
        ep = keep_dropouts(ep, torch)
    table = torch.export.default_decompositions()
    for op in list(table):            # kept: detach (a stop-gradient, not an alias), and
        if str(op) in A.PRESERVE:     # ops whose decomposition is not the op
            del table[op]
    notes = []
    with float64_default(torch), quiet_leafspec():
        decomposed = run_decompositions(ep, table, notes, torch)
        result = _Importer(decomposed, input_names, loss_output, strip).run()
        result.notes = notes
        result.out_spec = ep.call_spec.out_spec
        outs = user_outputs(decomposed)
        result.out_dtypes = [getattr(v, "dtype", None) for v in outs]
        result.out_shapes = [tuple(v.shape) if hasattr(v, "shape") else None for v in outs]
        problems = Problems()        # the tape's loss against torch's run of ep itself
        check_against_torch(ep, table, _eval_loss(result.tape, result.loss), loss_output,
                            problems)
    if problems:
        raise problems.error()
    return result


def _eval_loss(tape, loss) -> float:
    """The tape's loss with dropout off (the rng slot's train flag 0), what the import
    check compares with torch's run (which treats dropout as the identity); the tape is
    left as recorded (flag 1, values replayed)."""
    rng = tape.rng_id()
    if rng < 0:
        return float(tape.values[loss.id][0])
    recorded = tape.values[rng].copy()
    off = recorded.copy()
    off[2] = 0.0
    tape.set_value(tape.var(rng), off)
    tape.forward()
    value = float(tape.values[loss.id][0])
    tape.set_value(tape.var(rng), recorded)
    tape.forward()
    return value


# ── the importer ───────────────────────────────────────────────────────────

class _Importer:
    def __init__(self, ep, input_names, loss_output, strip):
        import torch
        from torch.export.graph_signature import InputKind, OutputKind
        from ..tape import Tape
        self.torch, self.ep = torch, ep
        self.IK, self.OK = InputKind, OutputKind
        self.input_names = input_names
        self.loss_output = loss_output
        self.strip = strip
        self.tp = Tape()
        self.env: dict = {}
        self.const_nodes: set = set()
        self.problems = Problems()
        self.params: dict = {}
        self.inputs: dict = {}
        self.input_dtypes: dict = {}
        self.const_names: dict = {}          # id(tensor) -> torch name (buffers, frozen)
        self.consts: dict = {}               # torch name -> GVar, once lifted
        self.lifted: dict = {}
        self.histogram = collections.Counter()
        self.graph = ep.graph_module.graph
        self.examples = None
        self.user_tensor_i = 0
        self.state: dict = {}                # mutated buffer's name -> its state const

    def name(self, target: str) -> str:
        return target[len(self.strip):] if self.strip and target.startswith(self.strip) \
            else target

    # pass 0: the signature
    def signature(self):
        torch, IK = self.torch, self.IK
        ep = self.ep
        placeholders = {n.name: n for n in self.graph.nodes if n.op == "placeholder"}
        user_i = 0
        state = ep.state_dict
        tied = {}                               # id(tensor) -> its param (or const)
        mutated = {spec.target for spec in ep.graph_signature.output_specs
                   if spec.kind == self.OK.BUFFER_MUTATION}
        # the params first, in the module's registration order (the state dict's), as
        # torch >= 2.7 lists them; torch 2.6 lists them in the order the forward uses them
        # (a tied weight under its first name there, as named_parameters gives it)
        specs = list(ep.graph_signature.input_specs)
        first = {}
        for k, t in state.items():
            first.setdefault(id(t), k)
        order = {k: i for i, k in enumerate(state)}

        def key(spec):
            t = state.get(spec.target)
            return order.get(first.get(id(t), spec.target), len(order))
        params = sorted((s for s in specs if s.kind == IK.PARAMETER), key=key)
        for spec in params + [s for s in specs if s.kind != IK.PARAMETER]:
            node = placeholders[spec.arg.name]
            if spec.kind == IK.PARAMETER:
                t = state[spec.target]
                name = self.name(first.get(id(t), spec.target))
                if t.requires_grad and t.is_complex():
                    self.problems.add("unsupported parameter", repr(name), node,
                                      "complex tensors: gradtool imports complex buffers and "
                                      "constants only, not a trainable complex parameter "
                                      "(hold it real, of shape [..., 2], and view_as_complex "
                                      "it in the forward)")
                    self.env[node] = _MISSING
                    continue
                if id(t) in tied:               # a tied weight: one param, its first name
                    self.env[node] = tied[id(t)]
                    if not t.requires_grad:
                        self.const_nodes.add(node)
                    continue
                if t.requires_grad:
                    arr = t.detach().to(torch.float64).numpy()
                    self.params[name] = self.tp.param(arr, name=name)
                    self.env[node] = tied[id(t)] = self.params[name]
                else:
                    self._constant(node, t, name)
                    tied[id(t)] = self.env[node]
            elif spec.kind == IK.BUFFER and spec.target in mutated:
                self._state(node, state[spec.target], self.name(spec.target))
            elif spec.kind in (IK.BUFFER, IK.CONSTANT_TENSOR):
                t = state[spec.target] if spec.target in state else ep.constants[spec.target]
                self._constant(node, t, self.name(spec.target))
            elif spec.kind == IK.USER_INPUT:
                val = node.meta.get("val")
                names = self.input_names or []
                name = names[user_i] if user_i < len(names) else spec.arg.name
                user_i += 1
                if not isinstance(val, torch.Tensor):
                    self.const_nodes.add(node)
                    self.env[node] = val           # a specialised Python value
                    continue
                self._input(node, val, name)
            elif spec.kind == getattr(IK, "TOKEN", None):
                self.env[node] = _MISSING       # threads with_effects nodes (below) only
            else:
                self.problems.add("unsupported input kind", str(spec.kind), node)

    def _constant(self, node, t, name):
        torch = self.torch
        t = t.detach()
        if t.is_floating_point() or t.is_complex():
            t = t.to(_f64(torch, t.dtype))     # complex64 is exact as complex128
        self.env[node] = t
        self.const_nodes.add(node)
        self.const_names[id(t)] = name

    def _state(self, node, t, name):
        """A buffer the forward mutates: a named float64 const (a state slot), recorded
        now, read by the ops like any value; its new value becomes the output ``name``.
        An integer buffer (``num_batches_tracked``) is held exactly as float64 up to 2^53."""
        torch = self.torch
        t = t.detach()
        if dtype_kind(t.dtype) not in ("float", "int"):
            self.problems.add("unsupported buffer", repr(name), node,
                              f"the forward updates a {t.dtype} buffer (float and integer "
                              f"buffers only)")
            self.env[node] = _MISSING
            return
        arr = t.to(torch.float64).numpy().reshape(tuple(t.shape) or (1,))
        if dtype_kind(t.dtype) == "int" and not (np.abs(arr) <= 2.0 ** 53).all():
            self.problems.add("unsupported buffer", repr(name), node,
                              "an integer buffer beyond 2^53 has no exact float64 value")
            self.env[node] = _MISSING
            return
        self.state[name] = self.env[node] = self.tp.const(arr.copy(), name=name)

    def _input(self, node, val, name):
        torch = self.torch
        shape = tuple(val.shape)
        if not all(isinstance(d, int) for d in shape):
            self.problems.add("data-dependent shape", f"input {name!r}", node)
            self.env[node] = _MISSING
            return
        kind = dtype_kind(val.dtype)
        if kind == "complex":
            self.problems.add("unsupported input", repr(name), node,
                              "complex tensors: gradtool imports complex buffers and "
                              "constants only, not a complex input (pass torch.view_as_real "
                              "of it and view_as_complex it in the forward)")
            self.env[node] = _MISSING
            return
        self.input_dtypes[name] = str(val.dtype).removeprefix("torch.")
        # the example's values seed the slot (training refills it)
        example = self._example_value(node, val)
        if kind == "int":
            g = self.tp.const(example.astype(np.int64), name=name, dtype="i64")
        else:
            g = self.tp.const(example.astype(np.float64), name=name)
        self.inputs[name] = g
        self.env[node] = g

    def _example_value(self, node, val) -> np.ndarray:
        """The example input's values (the slot's initial contents), else zeros."""
        shape = tuple(val.shape) or (1,)
        if self.examples is None:
            import torch.utils._pytree as pytree
            try:
                args, kwargs = self.ep.example_inputs
                flat = pytree.tree_leaves((args, kwargs))
            except Exception:                # noqa: BLE001 - a program without examples
                flat = []
            self.examples = [t for t in flat if isinstance(t, self.torch.Tensor)]
        i = self.user_tensor_i
        self.user_tensor_i += 1
        if i < len(self.examples) and tuple(self.examples[i].shape) == tuple(val.shape):
            t = self.examples[i].detach()
            if t.dtype == self.torch.bool:
                t = t.to(self.torch.float64)
            return t.numpy().reshape(shape)
        return np.zeros(shape)

    # pass 1: constant folding
    def fold(self):
        torch = self.torch
        for node in self.graph.nodes:
            if node.op != "call_function":
                continue
            name = _target_name(node)
            if name in A.SKIP:
                continue
            inputs = node.all_input_nodes
            shape_only = name in A.SHAPE_ONLY
            if _seeded(node, name):
                continue
            if not shape_only and not all(n in self.const_nodes for n in inputs):
                continue
            try:
                self.env[node] = self._evaluate(node, shape_only)
            except Exception as exc:       # noqa: BLE001 - reported, not swallowed
                self.problems.add("constant folding failed for", name, node,
                                  " ".join(str(exc).split())[:200])
                self.env[node] = _MISSING
            self.const_nodes.add(node)

    def _evaluate(self, node, shape_only):
        torch = self.torch

        def arg(n):
            if n in self.const_nodes:
                return self.env[n]
            val = n.meta["val"]        # shape_only: only the shape (and dtype) is read
            return torch.zeros(tuple(val.shape), dtype=_f64(torch, val.dtype))

        args = _map_nodes(node.args, arg)
        kwargs = _map_nodes(node.kwargs, arg)
        if "dtype" in kwargs and isinstance(kwargs["dtype"], torch.dtype):
            kwargs["dtype"] = _f64(torch, kwargs["dtype"])
        if "device" in kwargs:
            kwargs["device"] = torch.device("cpu")
        out = node.target(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            out = out.to(_f64(torch, out.dtype))
        return out

    # pass 2: the problem report
    def check(self):
        torch = self.torch
        for node in self.graph.nodes:
            if node.op != "call_function" or node in self.const_nodes:
                continue
            name = _target_name(node)
            if name in A.SKIP:
                continue
            if _draws(node, name):
                if "dropout" in name or mentions_dropout(node):
                    self.problems.add("train-mode dropout", name, node,
                                      "this dropout draws its own random numbers; gradtool "
                                      "imports nn.Dropout / F.dropout (native_dropout) only: "
                                      "use one, call module.eval(), or remove it")
                else:
                    self.problems.add("random op", name, node,
                                      "gradtool records deterministic computations only")
                continue
            val = node.meta.get("val")
            if _data_dependent(val, torch):
                self.problems.add("data-dependent shape", name, node,
                                  "the output's shape depends on the input's values; "
                                  "gradtool records fixed shapes")
                continue
            if name == "<built-in function getitem>":
                continue
            if name == "with_effects":
                effect = str(node.args[1])      # an op run for its side effect
                if effect not in _ERROR_CHECKS:
                    self.problems.add("unsupported op", effect, node)
                continue
            complex_ = _complex(node, torch)
            entry = (A.COMPLEX if complex_ else A.ATEN).get(name)
            if entry is None:
                self.problems.add("unsupported op", name, node,
                                  A.COMPLEX_ONLY if complex_ else "")
                continue
            missing = A.missing_needs(entry)
            if missing:
                self.problems.add("unsupported op", name, node,
                                  f"this build lacks {', '.join(missing)}")
        OK = self.OK
        outputs = list(self.graph.output_node().args[0])
        for spec, out in zip(self.ep.graph_signature.output_specs, outputs):
            if spec.kind == OK.USER_INPUT_MUTATION:
                self.problems.add("in-place mutation of user input", repr(spec.target),
                                  out if hasattr(out, "meta") else None,
                                  "the forward writes into its input; copy it first")
            elif spec.kind == getattr(OK, "PARAMETER_MUTATION", None):    # torch >= 2.7
                self.problems.add("in-place mutation of parameter", repr(spec.target),
                                  out if hasattr(out, "meta") else None)

    # pass 3: recording
    def record(self):
        r = Recorder(self)
        for node in self.graph.nodes:
            if node.op != "call_function" or node in self.const_nodes:
                continue
            name = _target_name(node)
            if name in A.SKIP:
                continue
            inputs = node.all_input_nodes
            if name == "with_effects" or any(self.env.get(n, _MISSING) is _MISSING
                                             for n in inputs):
                self.env[node] = _MISSING
                continue
            if name == "<built-in function getitem>":
                src, idx = node.args
                value = self.env[src][idx]
                if value is None:
                    self.problems.add("unsupported use of", _target_name(src), node,
                                      f"its output {idx} is not recorded (a max's indices, "
                                      f"a norm's saved statistics, a dropout's mask)")
                    value = _MISSING
                self.env[node] = value
                continue
            if _empty_for_cat(node, self.torch):   # no tape value: cat drops it unread
                self.env[node] = _EMPTY
                continue
            entry = (A.COMPLEX if _complex(node, self.torch) else A.ATEN)[name]
            args = _map_nodes(node.args, self.env.__getitem__)
            kwargs = _map_nodes(node.kwargs, self.env.__getitem__)
            try:
                out = entry.fn(r, node, *args, **kwargs)
                out = r.conform(node, out)
            except A.Unsupported as exc:
                self.problems.add("unsupported use of", name, node, str(exc))
                out = _MISSING
            except GradtoolError as exc:     # the tape refused a record: it is poisoned,
                self.problems.add("cannot record", name, node,     # so nothing more records
                                  " ".join(str(exc).split())[:300])
                raise self.problems.error() from None
            self.histogram[name] += 1
            self.env[node] = out

    def outputs(self):
        torch, OK = self.torch, self.OK
        r = Recorder(self)
        out_nodes = list(self.graph.output_node().args[0])
        user = []
        named = {}
        for spec, out in zip(self.ep.graph_signature.output_specs, out_nodes):
            if spec.kind in (OK.USER_OUTPUT, OK.LOSS_OUTPUT):
                user.append(out)
            elif spec.kind == OK.BUFFER_MUTATION:
                named[self.name(spec.target)] = out
        if not user:
            self.problems.add("no output", "forward", None)
            return None, {}
        if not 0 <= self.loss_output < len(user):
            self.problems.add("no output", f"#{self.loss_output}", None,
                              f"the module has {len(user)} outputs")
            return None, {}
        loss_node = user[self.loss_output]
        for i, out in enumerate(user):
            if i != self.loss_output:
                named[f"output{i}"] = out
        val = loss_node.meta.get("val") if hasattr(loss_node, "meta") else None
        if not isinstance(val, torch.Tensor) or val.numel() != 1:
            shape = list(val.shape) if isinstance(val, torch.Tensor) else type(val).__name__
            self.problems.add("non-scalar loss", f"of shape {shape}",
                              loss_node if hasattr(loss_node, "meta") else None,
                              NOT_A_LOSS)
            return None, {}
        loss = self.env.get(loss_node, _MISSING)
        if loss is _MISSING:
            return None, {}
        complex_ = [n for n in [loss_node, *named.values()]
                    if hasattr(n, "meta") and isinstance(self.env.get(n), A.Complex)]
        for n in complex_:
            self.problems.add("complex output", n.name, n,
                              f"{A.COMPLEX_ONLY}; return torch.view_as_real of it")
        if complex_:
            return None, {}
        if not r.is_gvar(loss) or not self.tp.requires[loss.id]:
            self.problems.add("constant loss", "(no parameter reaches it)", loss_node)
            return None, {}
        outputs = {}
        for k, n in named.items():
            v = self.env.get(n, _MISSING) if hasattr(n, "meta") else n
            if v is _MISSING:
                continue
            outputs[k] = r.value(v)
        for k, slot in self.state.items():
            if k not in outputs or list(outputs[k].shape) != list(slot.shape):
                self.problems.add("unsupported buffer", repr(k), None,
                                  "the forward's new value of the buffer was not recorded "
                                  "with the buffer's shape")
        return loss, outputs

    def run(self) -> TorchImport:
        self.signature()
        self.fold()
        self.check()
        if self.problems:
            raise self.problems.error()
        self.record()
        loss, outputs = self.outputs()
        if self.problems:
            raise self.problems.error()
        return TorchImport(self.tp, loss, outputs, self.params, self.inputs, self.consts,
                           self.histogram, self.input_dtypes, {k: k for k in self.state})


# ops torch.export wraps in ``with_effects`` that only raise on bad values (a singular
# matrix for linalg.inv): nothing to record, and the op they check is reported on its own
_ERROR_CHECKS = {"aten._linalg_check_errors.default"}


def _draws(node, name: str) -> bool:
    """Whether the node draws random numbers that gradtool cannot record: one of the
    table's RANDOM ops, or any op torch tags ``nondeterministic_seeded`` (``randint.low``,
    ``normal``, ``multinomial``, ...) that the table does not map (native_dropout and
    bernoulli are mapped: gradtool's counter-based draws).  Refused, one line each; no
    random node is ever folded (:func:`_seeded`: a draw frozen at import would be another
    program)."""
    return _seeded(node, name) and name not in A.ATEN


def _seeded(node, name: str) -> bool:
    """Whether the node draws random numbers (mapped or not): never folded."""
    import torch
    return name in A.RANDOM or torch.Tag.nondeterministic_seeded in getattr(
        node.target, "tags", ())


_EMPTY = "<an empty value cat drops>"


def _empty_for_cat(node, torch) -> bool:
    """Whether ``node`` makes a zero-size tensor that only ``cat`` reads (which drops
    empty inputs): it is not recorded (the tape holds no zero-size values); a zero-size
    value that another op reads goes to that op's entry, which refuses it."""
    val = node.meta.get("val")
    return (isinstance(val, torch.Tensor) and val.numel() == 0 and bool(node.users)
            and all(str(u.target) == "aten.cat.default" for u in node.users))


def _target_name(node) -> str:
    return str(node.target)


def _f64(torch, dtype):
    """float64 for a floating dtype and complex128 for a complex one (the dtype policy),
    any other dtype as it is."""
    if dtype.is_floating_point:
        return torch.float64
    return torch.complex128 if dtype.is_complex else dtype


def _complex(node, torch) -> bool:
    """Whether the node reads or makes a complex tensor (by the exported dtypes): the
    mapping table's COMPLEX entries record it, on pairs of float64 values."""
    def complex_(val):
        if isinstance(val, (tuple, list)):
            return any(complex_(v) for v in val)
        return isinstance(val, torch.Tensor) and val.is_complex()
    return any(complex_(n.meta.get("val")) for n in [node, *node.all_input_nodes])


def _data_dependent(val, torch) -> bool:
    if isinstance(val, (tuple, list)):
        return any(_data_dependent(v, torch) for v in val)
    if isinstance(val, torch.Tensor):
        return not all(isinstance(d, int) for d in val.shape)
    return False


def _map_nodes(obj, fn):
    """``obj`` (args/kwargs, nested lists and tuples) with every graph node replaced."""
    from torch.fx import Node
    if isinstance(obj, Node):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map_nodes(x, fn) for x in obj)
    if isinstance(obj, list):
        return [_map_nodes(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {k: _map_nodes(v, fn) for k, v in obj.items()}
    return obj


# ── your own loop (gradtool/interop/wrap.py) ───────────────────────────────

def wrap(model, example_inputs, backend: str = "cpu", loss_fn=None, *, loss_output: int = 0,
         outputs: bool = False, targets=None, max_shapes: int = 8):
    """``model`` as a ``torch.nn.Module`` whose forward and gradients gradtool computes,
    for a training loop of your own (``loss = gm(x, y); loss.backward()``: gradtool's
    gradients into each parameter's ``.grad``).  ``backend``: ``"cpu"``, ``"host"`` or
    ``"cuda"``, the same bits on each.  See :mod:`gradtool.interop.wrap` and
    ``docs/torch.md``, "Your own loop"."""
    # wrap.py is handed import_module, so it imports nothing of this file (no cycle)
    from .wrap import module_class
    return module_class()(model, example_inputs, backend, loss_fn, loss_output=loss_output,
                          outputs=outputs, targets=targets, max_shapes=max_shapes,
                          importer=import_module)


def clip_grad_norm_(parameters, max_norm: float):
    """``torch.nn.utils.clip_grad_norm_`` by ``gradtool train --clip``'s documented rule
    (bit-exact): see :func:`gradtool.interop.wrap.clip_grad_norm_`."""
    from .wrap import clip_grad_norm_ as clip
    return clip(parameters, max_norm)


def __getattr__(name):
    """``gtt.optim``: the torch.optim subclasses stepping by gradtool's optimizer table
    (:mod:`gradtool.interop.torch_optim`), imported on first use: they subclass
    ``torch.optim.Optimizer``, and this module imports without torch."""
    if name == "optim":
        from . import torch_optim
        return torch_optim
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
