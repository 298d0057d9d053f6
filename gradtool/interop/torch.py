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

dtype policy: every floating-point value becomes float64 -- parameters,
buffers, inputs and every intermediate (float32, float16 and bfloat16 alike),
and the export runs with torch's default dtype float64, so a tensor the forward
creates without a dtype (``torch.zeros(n)``, ``torch.tensor(0.1)``) is float64
too, as it is in ``torch.set_default_dtype(torch.float64)``.  gradtool's results
therefore match torch float64 autograd of the same module (loss within 1e-12
relative in the tests), not a float32 run: against the
user's own float32 training, expect float32-sized differences (1e-7
relative per op, growing with depth), which are the float32 run's rounding,
not gradtool's.  :func:`load_weights` rounds the trained float64 params to
each parameter's own dtype.

Complex values (Meta's LLaMA rotary embeddings: ``view_as_complex``, a product by a
complex table, ``view_as_real``) are complex128 likewise (complex64 is exact in it)
and never reach the tape as such: each is a pair of float64 values, its real and
imaginary parts (:class:`~.aten.Complex`; a complex buffer or folded table, two
consts).  A node that reads or makes a complex tensor is recorded by the table's
``COMPLEX`` entries instead of ``ATEN``; any other op on one, a complex input and a
trainable complex parameter are refused, one line each.

Dropout policy: eval-mode dropout disappears in the export and imports; a
train-mode dropout (``native_dropout``, ``bernoulli``, ``rand*``) is refused
with a message to call ``module.eval()`` or remove it.  Random masks whose
bits agree on every backend need a counter-based generator op (Philox-style:
the mask a pure function of (seed, step, element index)), future work.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import inspect
import logging
import math
import os
import re
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from ..errors import GradtoolError
from ..ops import dtype_of
from . import aten as A
from .verify import check_against_torch

_MISSING = object()           # the value of a node that could not be recorded


# ── the one error ──────────────────────────────────────────────────────────

@dataclass
class Problem:
    kind: str                 # "unsupported op", "train-mode dropout", ...
    target: str               # aten.sort.default, an input's name, ...
    sources: list = field(default_factory=list)
    count: int = 0
    detail: str = ""

    def line(self) -> str:
        where = self.sources[0] if self.sources else "unknown source line"
        more = f" (and {len(self.sources) - 1} more places)" if len(self.sources) > 1 else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.kind} {self.target} (x{self.count}) at {where}{more}{detail}"


# what a module returning outputs (logits) instead of its loss is told; the command line
# says --loss NAME instead (gradtool/cli/interop.py)
NOT_A_LOSS = ("the module returns outputs, not a scalar loss: pass loss_fn= (a function "
              "of the outputs and the targets, e.g. loss_fn=F.cross_entropy), or return "
              "the loss from forward")


class TorchImportError(GradtoolError):
    """The module cannot be imported: ``problems`` lists every offending target (one
    :class:`Problem` each, with its count and the user's source lines)."""

    def __init__(self, problems: list):
        self.problems = problems
        self.lines = [p.line() for p in problems]
        n = len(problems)
        super().__init__(f"cannot import the module ({n} problem{'s' * (n != 1)}):\n  "
                         + "\n  ".join(self.lines))


class WeightsError(TorchImportError):
    """:func:`load_weights` refused: the tape's params and the module's do not match.  One
    line (a load has no source lines): each kind of mismatch with its count and the
    first few names; ``problems`` lists them all."""

    def __init__(self, problems: list):
        self.problems = problems
        self.lines = [p.line() for p in problems]
        groups: dict = {}
        for p in problems:
            groups.setdefault(p.kind, []).append(p)
        parts = []
        for kind, ps in groups.items():
            shown = [p.target + (f" ({p.detail})" if p.detail else "") for p in ps[:4]]
            more = f", and {len(ps) - 4} more" if len(ps) > 4 else ""
            parts.append(f"{kind} {', '.join(shown)}{more}")
        GradtoolError.__init__(self, "cannot load the weights into the module: "
                               + "; ".join(parts))


class _Problems:
    def __init__(self):
        self.by_key: dict = {}

    def add(self, kind: str, target: str, node=None, detail: str = "") -> None:
        p = self.by_key.setdefault((kind, target), Problem(kind, target, detail=detail))
        p.count += 1
        src = source_line(node) if node is not None else None
        if src and src not in p.sources:
            p.sources.append(src)

    def __bool__(self):
        return bool(self.by_key)

    def error(self, cls=None) -> TorchImportError:
        return (cls or TorchImportError)(list(self.by_key.values()))


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _mentions_dropout(node) -> bool:
    """Whether a function or a line of code in ``node``'s stack trace says dropout
    (F.dropout2d's bernoulli, a user's own mask): the file paths are not read."""
    trace = node.meta.get("stack_trace") if hasattr(node, "meta") else None
    for text in (trace or "").splitlines():
        m = _FRAME.search(text)
        words = m.group(3) if m else text
        if "dropout" in words.lower():
            return True
    return False


def source_line(node) -> Optional[str]:
    """``path:line (function): code`` of the user's frame in ``node.meta["stack_trace"]``
    (the innermost frame outside torch itself)."""
    trace = node.meta.get("stack_trace") if hasattr(node, "meta") else None
    if not trace:
        return None
    lines = trace.splitlines()
    frames = []
    for i, text in enumerate(lines):
        m = _FRAME.search(text)
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.search(
                lines[i + 1]) else ""
            frames.append((m.group(1), m.group(2), m.group(3), code))
    if not frames:
        return None
    torch_dir = _torch_dir()
    user = [f for f in frames if not (torch_dir and f[0].startswith(torch_dir))]
    path, line, func, code = (user or frames)[-1]
    return f"{_display_path(path)}:{line} ({func})" + (f": {code}" if code else "")


def _display_path(path: str) -> str:
    """``path`` relative to the working directory where it lies below it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def _torch_dir() -> str:
    import torch
    return os.path.dirname(torch.__file__) + os.sep


# ── the result ─────────────────────────────────────────────────────────────

@dataclass
class TorchImport:
    """What :func:`import_module` recorded: the tape, its loss, named outputs, and the
    torch names of params, input slots and consts (each a GVar)."""
    tape: Any
    loss: Any
    outputs: dict
    params: dict
    inputs: dict
    consts: dict
    histogram: collections.Counter
    input_dtypes: dict
    state: dict = field(default_factory=dict)     # buffer name -> output name (the same)
    out_spec: Any = None          # the pytree structure of the module's outputs (torch's)
    out_dtypes: list = field(default_factory=list)  # each user output's exported dtype
    out_shapes: list = field(default_factory=list)  # ... and shape (a 0-dim loss: [])
    notes: list = field(default_factory=list)     # what the import did that one should know
    check: dict = field(default_factory=dict)     # an f32 import's check (_as_f32)

    def meta(self) -> dict:
        return {"torch": {
            "params": {k: v.id for k, v in self.params.items()},
            "inputs": {k: {"node": v.id, "dtype": self.input_dtypes[k]}
                       for k, v in self.inputs.items()},
            "consts": {k: v.id for k, v in self.consts.items()},
        }}

    def save(self, path, meta=None) -> None:
        """Write the tape file (atomically: a path is replaced whole or not at all).

        ``meta``: further meta entries (``{"train": {...}}`` training defaults) next to
        ``meta["torch"]`` (the torch names of params, input slots and consts)."""
        from ..tapefile import save
        save(self.tape, path, loss=self.loss, outputs=self.outputs or None,
             meta={**self.meta(), **(meta or {})}, state=self.state or None)

    def summary(self) -> dict:
        tp = self.tape
        return {
            "params": {k: list(tp.values[v.id].shape) for k, v in self.params.items()},
            "param_count": int(sum(tp.values[v.id].size for v in self.params.values())),
            "inputs": {k: {"shape": list(tp.values[v.id].shape),
                           "dtype": dtype_of(tp.values[v.id])}
                       for k, v in self.inputs.items()},
            "consts": sorted(self.consts),
            "state": sorted(self.state),
            "outputs": sorted(self.outputs),
            "nodes": len(tp.nodes),
            "aten_ops": dict(sorted(self.histogram.items())),
            "unsupported": [],
            "notes": list(self.notes),
        }


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
DEFAULT_DTYPE = "f64"
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
    hooks = _backward_hooks(module)
    if hooks:
        raise TorchImportError(hooks)
    m64 = _float64_copy(module, torch)
    args = tuple(_as_f64(t) for t in example_inputs + loss_inputs)
    prefix = ""
    if loss_fn is not None:
        m64 = _with_loss(m64, loss_fn, len(example_inputs))
        prefix = "model."
    # parameters frozen in the user's module stay frozen in the copy (deepcopy keeps it)
    with _float64_default(torch), _custom_functions(torch) as custom:
        try:
            with _stderr_kept(lambda exc: hasattr(exc, "partial_fx_graph")):
                ep = torch.export.export(m64, args)
        except Exception as exc:      # torch's own refusal (data-dependent control flow...)
            raise _torch_failed("torch.export", exc) from None
    if custom:
        raise TorchImportError(list(custom.values()))
    return import_program(ep, input_names=names, loss_output=loss_output, strip=prefix,
                          strict=strict)


@contextlib.contextmanager
def _custom_functions(torch):
    """The user's ``torch.autograd.Function`` subclasses the forward applies while it is
    exported, one :class:`Problem` each (by class), and its ``Tensor.register_hook``
    calls (one Problem: torch.export drops the hooks).  torch.export records a custom
    Function's forward ops and drops its backward, so the tape would differentiate the
    forward instead: a silent wrong result for a gradient reversal, a straight-through
    estimator or a clipped gradient, so the import is refused.  So is torch.utils.checkpoint
    with use_reentrant=True, whose Function runs the forward under no_grad (the export
    keeps that, the backward that recomputes it is gone); torch's other Functions pass."""
    Function = torch.autograd.Function
    original = Function.__dict__["apply"]
    found: dict = {}

    def apply(cls, *args, **kwargs):
        reentrant = cls.__module__ == "torch.utils.checkpoint"
        if reentrant or not cls.__module__.startswith("torch."):
            _seen_at(found.setdefault(cls, Problem(
                "reentrant torch.utils.checkpoint", "(use_reentrant=True)", detail=(
                    "its forward runs under no_grad, which the export keeps and its "
                    "backward would undo; pass use_reentrant=False (the same gradient)"))
                if reentrant else Problem(
                "custom torch.autograd.Function", cls.__qualname__, detail=(
                    "torch.export keeps its forward and drops its backward, so gradtool "
                    "would differentiate the forward instead; write the gradient with "
                    "detach (a reversed gradient: y.detach() - (y - y.detach()))"))))
        return original.__func__(cls, *args, **kwargs)

    def register_hook(tensor, hook):
        if not any(f.filename == __file__ and f.name == "register_hook"
                   for f in traceback.extract_stack()[:-1]):  # not torch's dispatch again
            _seen_at(found.setdefault("register_hook", Problem(
                "gradient hook", "Tensor.register_hook", detail=(
                    "torch.export drops it, so the gradient would not be the one it makes; "
                    "write the change into the forward (a scaled gradient: y.detach() + "
                    "s * (y - y.detach()))"))))
        return original_hook(tensor, hook)

    original_hook = torch.Tensor.register_hook
    Function.apply = classmethod(apply)
    torch.Tensor.register_hook = register_hook
    try:
        yield found
    finally:
        Function.apply = original
        torch.Tensor.register_hook = original_hook


def _seen_at(problem: Problem) -> None:
    """Add the user's frame that called into the watched torch function (the innermost
    outside torch and this file) to ``problem``, once per call site: the export may
    trace a call twice."""
    frames = [f for f in traceback.extract_stack()[:-2]
              if not f.filename.startswith(_torch_dir()) and f.filename != __file__]
    where = "unknown source line"
    if frames:
        f = frames[-1]
        where = (f"{_display_path(f.filename)}:{f.lineno} ({f.name})"
                 + (f": {f.line.strip()}" if f.line else ""))
    if where not in problem.sources:
        problem.sources.append(where)
        problem.count += 1


def _backward_hooks(module) -> list:
    """One :class:`Problem` per module or parameter of ``module`` with a backward hook
    (``register_full_backward_hook``, ``register_backward_hook``,
    ``register_full_backward_pre_hook``, a parameter's ``register_hook``), located at
    the hook function's definition: torch.export drops them all, and they exist to
    change gradients."""
    import torch
    out = []

    def problem(kind, name, hooks, detail):
        out.append(Problem(kind, name, count=len(hooks), detail=detail, sources=[
            _defined_at(h) for h in hooks]))

    for name, m in module.named_modules():
        hooks = list(m._backward_hooks.values()) + list(m._backward_pre_hooks.values())
        if hooks:
            problem("backward hook on module", name or type(module).__name__, hooks,
                    "torch.export drops it; remove it, or write what it does into the "
                    "forward with detach")
    hooks = list(torch.nn.modules.module._global_backward_hooks.values())
    if hooks:
        problem("global module backward hook", "(register_module_full_backward_hook)",
                hooks, "torch.export drops it; remove it while importing")
    for name, p in module.named_parameters():
        hooks = list((getattr(p, "_backward_hooks", None) or {}).values())
        if hooks:
            problem("gradient hook on parameter", name, hooks,
                    "torch.export drops it; remove it, or apply it to the gradients "
                    "outside the model")
    return out


def _defined_at(fn) -> str:
    code = getattr(fn, "__code__", None)
    if code is None:
        return f"{getattr(fn, '__qualname__', type(fn).__name__)} (no source line)"
    return f"{_display_path(code.co_filename)}:{code.co_firstlineno} ({fn.__qualname__})"


@contextlib.contextmanager
def _stderr_kept(drop):
    """What the block writes to ``sys.stderr``, held back and written after it, except
    when it raises an exception ``drop(exc)`` accepts: torch.export prints the partial
    graph of a failed export (33 lines for one ``if h.mean() > 0:``) straight to stderr
    before raising, and the import reports that failure in one line of its own."""
    import io
    import sys
    held, real = io.StringIO(), sys.stderr
    sys.stderr = held
    try:
        yield
    except Exception as exc:
        sys.stderr = real
        if not drop(exc):
            real.write(held.getvalue())
        raise
    else:
        sys.stderr = real
        real.write(held.getvalue())
    finally:
        sys.stderr = real


@contextlib.contextmanager
def _quiet_leafspec():
    """torch 2.13's own ``run_decompositions`` deep-copies a pytree ``LeafSpec``, which
    warns (``FutureWarning: isinstance(treespec, LeafSpec) is deprecated``) from inside
    torch: nothing the user wrote or can change, so that one warning is not shown."""
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)",
                                category=FutureWarning)
        yield


@contextlib.contextmanager
def _float64_default(torch):
    """torch's default dtype float64 while the forward is traced, re-traced by
    run_decompositions and folded: the tensors it creates without a dtype are float64.
    torch's fake-tensor logger is quiet meanwhile: it logs a traceback for an op that
    fails on the example shapes, which the import reports itself, in one line; so is its
    symbolic-shapes logger, which dumps the graph before a data-dependent branch fails."""
    default = torch.get_default_dtype()
    loggers = [logging.getLogger(name) for name in (
        "torch._subclasses.fake_tensor",
        "torch.fx.experimental.symbolic_shapes")]    # a data-dependent guard's graph dump
    levels = [logger.level for logger in loggers]
    torch.set_default_dtype(torch.float64)
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        torch.set_default_dtype(default)
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _torch_failed(step: str, exc: Exception) -> TorchImportError:
    """torch's own refusal as one Problem, at the user's line where torch's message names
    one (``The following call raised this error: File "model.py", line 7 ...``).  A branch
    on a tensor's value (``if h.mean() > 0:``) says so, with its line, in place of torch's
    paragraphs of advice."""
    text = str(exc)
    where = _user_frame(text)
    if "DataDependent" in type(exc).__name__ and where:
        return TorchImportError([Problem(
            "data-dependent control flow", "(Python branching on a tensor's value)",
            sources=[where], count=1, detail=(
                "torch.export records one path through the forward, so it cannot follow an "
                "if on a tensor's value; compute both sides and pick with torch.where, or "
                "decide it outside the model"))])
    first = text.split("\n\n")[0]             # torch's advice and dumps follow
    return TorchImportError([Problem(f"{step} failed:", type(exc).__name__, count=1,
                                     sources=[where] if where else [],
                                     detail=" ".join(first.split())[:500])])


def _user_frame(text: str) -> Optional[str]:
    """``path:line (function): code`` of the last frame outside torch in a traceback
    quoted in ``text`` (torch's export errors quote the call that raised)."""
    lines = text.splitlines()
    found = None
    for i, line in enumerate(lines):
        m = _FRAME.search(line)
        if m and not m.group(1).startswith(_torch_dir()) and m.group(1) != __file__:
            code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.search(
                lines[i + 1]) else ""
            found = (f"{_display_path(m.group(1))}:{m.group(2)} ({m.group(3)})"
                     + (f": {code}" if code else ""))
    return found


def _as_f64(t):
    import torch
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        return t.detach().to(torch.float64)
    return t


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
    with _quiet_leafspec():              # both deep-copy the program
        ep = _detach_no_grad_blocks(ep, torch)
        ep = _keep_dropouts(ep, torch)
    table = torch.export.default_decompositions()
    for op in list(table):            # kept: detach (a stop-gradient, not an alias), and
        if str(op) in A.PRESERVE:     # ops whose decomposition is not the op
            del table[op]
    notes = []
    with _float64_default(torch), _quiet_leafspec():
        decomposed = _run_decompositions(ep, table, notes, torch)
        result = _Importer(decomposed, input_names, loss_output, strip).run()
        result.notes = notes
        result.out_spec = ep.call_spec.out_spec
        outs = _user_outputs(decomposed)
        result.out_dtypes = [getattr(v, "dtype", None) for v in outs]
        result.out_shapes = [tuple(v.shape) if hasattr(v, "shape") else None for v in outs]
        problems = _Problems()        # the tape's loss against torch's run of ep itself
        check_against_torch(ep, table, _eval_loss(result.tape, result.loss), loss_output,
                            problems)
    if problems:
        raise problems.error()
    return result


def _user_outputs(ep) -> list:
    """The exported value (a fake tensor: dtype, shape) of each user output, in the
    flattened order of ``out_spec`` (``None`` where there is none)."""
    from torch.export.graph_signature import OutputKind
    outs = list(ep.graph_module.graph.output_node().args[0])
    dtypes = []
    for spec, out in zip(ep.graph_signature.output_specs, outs):
        if spec.kind in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT):
            val = out.meta.get("val") if hasattr(out, "meta") else None
            dtypes.append(val)
    return dtypes


def _run_decompositions(ep, table, notes, torch):
    """``ep.run_decompositions(table)``.  Where torch's own decomposition fails (torch
    2.13 on GPT-2's attention in eval mode: "Cannot view a tensor with shape ..."), it is
    tried again keeping the ops of ``aten.RETRY_UNDECOMPOSED`` that ``ep`` calls
    (scaled_dot_product_attention), which the table records by their own entries; the
    retry is added to ``notes`` with the user's source lines.  If that fails too, the
    refusal names the line of torch's failure."""
    try:
        return ep.run_decompositions(table)
    except Exception as exc:          # noqa: BLE001 - a decomposition torch cannot trace
        first = exc
    kept = [n for n in ep.graph_module.graph.nodes if n.op == "call_function"
            and str(n.target) in A.RETRY_UNDECOMPOSED]
    if kept:
        retry = copy.copy(table)
        for op in {n.target for n in kept}:
            retry.pop(op, None)
        try:
            decomposed = ep.run_decompositions(retry)
        except Exception:             # noqa: BLE001 - the first failure is the one to tell
            pass
        else:
            ops = sorted({str(n.target) for n in kept})
            where = sorted({source_line(n) or "unknown source line" for n in kept})
            notes.append(f"torch's run_decompositions failed ({type(first).__name__}: "
                         f"{_one_line(first)[:160]}); imported keeping {', '.join(ops)} "
                         f"undecomposed (x{len(kept)}) at {where[0]}"
                         + (f" (and {len(where) - 1} more places)" if len(where) > 1 else ""))
            return decomposed
    raise _torch_failed("run_decompositions", first) from None


def _one_line(exc) -> str:
    text = str(exc).split("While executing")[0]
    return " ".join(text.split())


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


_CHANNEL_DROPOUTS = {"aten.feature_dropout.default": ("feature_dropout", False),
                     "aten.alpha_dropout.default": ("alpha_dropout", False),
                     "aten.feature_alpha_dropout.default": ("alpha_dropout", True)}


def _gradtool_dropout_ops(torch):
    """The custom ops ``gradtool::feature_dropout(x, p, train)`` and
    ``gradtool::alpha_dropout(x, p, train, channels)``, registered once: run_decompositions
    keeps a custom op, where it would turn torch's feature and alpha dropouts (composite
    ops it cannot be told to keep) into ``bernoulli``.  Run eagerly they are torch's own
    ops (a copy of the result: a custom op's output may not alias its input)."""
    ns = torch.ops.gradtool if hasattr(torch.ops, "gradtool") else None
    if ns is not None and hasattr(ns, "feature_dropout") and hasattr(ns, "alpha_dropout"):
        return ns.feature_dropout.default, ns.alpha_dropout.default

    @torch.library.custom_op("gradtool::feature_dropout", mutates_args=(),
                             schema="(Tensor x, float p, bool train) -> Tensor")
    def feature_dropout(x, p, train):
        return torch.ops.aten.feature_dropout(x, p, train).clone()

    @torch.library.custom_op("gradtool::alpha_dropout", mutates_args=(),
                             schema="(Tensor x, float p, bool train, bool channels) -> Tensor")
    def alpha_dropout(x, p, train, channels):
        op = torch.ops.aten.feature_alpha_dropout if channels else torch.ops.aten.alpha_dropout
        return op(x, p, train).clone()

    feature_dropout.register_fake(lambda x, p, train: torch.empty_like(x))
    alpha_dropout.register_fake(lambda x, p, train, channels: torch.empty_like(x))
    return torch.ops.gradtool.feature_dropout.default, torch.ops.gradtool.alpha_dropout.default


def _keep_dropouts(ep, torch):
    """torch's channel and alpha dropouts (``Dropout1d/2d/3d``, ``AlphaDropout``,
    ``FeatureAlphaDropout``) as gradtool's custom ops, in a copy of ``ep`` (``ep`` itself
    where it has none), so that they reach the mapping table whole (``nn.feature_dropout``,
    ``nn.alpha_dropout``) instead of as ``bernoulli``, which is refused."""
    def found(graph):
        return [n for n in graph.nodes if n.op == "call_function"
                and str(n.target) in _CHANNEL_DROPOUTS]

    if not found(ep.graph_module.graph):
        return ep
    feature_op, alpha_op = _gradtool_dropout_ops(torch)
    ep = copy.deepcopy(ep)
    graph = ep.graph_module.graph
    for node in found(graph):
        kind, channels = _CHANNEL_DROPOUTS[str(node.target)]
        x, p, train = (list(node.args) + [None, None, None])[:3]
        p = node.kwargs.get("p", p)
        train = node.kwargs.get("train", train)
        args = (x, float(p), bool(train)) + ((bool(channels),) if kind == "alpha_dropout"
                                            else ())
        with graph.inserting_after(node):
            new = graph.call_function(feature_op if kind == "feature_dropout" else alpha_op,
                                      args)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    ep.graph_module.recompile()
    return ep


def _detach_no_grad_blocks(ep, torch):
    """``with torch.no_grad():`` in a forward exports as a ``wrap_with_set_grad_enabled(
    False, submodule, ...)`` node, which run_decompositions inlines without a trace of the
    block: its values would then carry gradients torch never gives them (a silent wrong
    result).  Each value the block returns gets an ``aten.detach`` here, before the
    decomposition (which keeps detach), so it is recorded as the stop-gradient it is: in
    a copy of ``ep``, which is returned (``ep`` itself where it has no such block).
    (torch.export splits a ``torch.enable_grad()`` block nested inside into its own
    top-level stretch, outside the no-grad node, so its values keep their gradients.)"""
    hop = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)

    def no_grad_blocks(graph):
        return [n for n in graph.nodes if n.op == "call_function" and n.target is hop
                and n.args[0] is False]

    if not no_grad_blocks(ep.graph_module.graph):
        return ep
    ep = copy.deepcopy(ep)                        # the caller's program stays as it was
    graph = ep.graph_module.graph
    for node in no_grad_blocks(graph):
        for out in list(node.users):              # getitem of each returned value
            with graph.inserting_after(out):
                stop = graph.call_function(torch.ops.aten.detach.default, (out,))
            stop.meta = dict(out.meta)
            out.replace_all_uses_with(stop, delete_user_cb=lambda user, s=stop: user is not s)
    ep.graph_module.recompile()
    return ep


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
        self.problems = _Problems()
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
        for spec in ep.graph_signature.input_specs:
            node = placeholders[spec.arg.name]
            if spec.kind == IK.PARAMETER:
                t = state[spec.target]
                name = self.name(spec.target)
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
        if _kind(t.dtype) not in ("float", "int"):
            self.problems.add("unsupported buffer", repr(name), node,
                              f"the forward updates a {t.dtype} buffer (float and integer "
                              f"buffers only)")
            self.env[node] = _MISSING
            return
        arr = t.to(torch.float64).numpy().reshape(tuple(t.shape) or (1,))
        if _kind(t.dtype) == "int" and not (np.abs(arr) <= 2.0 ** 53).all():
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
        kind = _kind(val.dtype)
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
                if "dropout" in name or _mentions_dropout(node):
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
            elif spec.kind == OK.PARAMETER_MUTATION:
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


def _kind(dtype) -> str:
    if dtype.is_floating_point:
        return "float"
    if str(dtype) == "torch.bool":
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "int"


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


# ── the recorder environment the mapping table's entries use ───────────────

class Recorder:
    """Argument lifting and shapes for :mod:`gradtool.interop.aten`'s entries.  Every op it
    records is one a table entry asked for; it decides nothing about semantics."""

    def __init__(self, imp: _Importer):
        self.imp = imp
        self.tp = imp.tp
        self.torch = imp.torch

    # kinds of values
    def is_gvar(self, v) -> bool:
        from ..tape import GVar
        return isinstance(v, GVar)

    def is_ids(self, v) -> bool:
        return self.is_gvar(v) and self.tp.holds_ids(v.id)

    def requires_grad(self, v) -> bool:
        return self.is_gvar(v) and self.tp.requires[v.id]

    def is_complex(self, v) -> bool:
        """A complex value: a :class:`~.aten.Complex` pair, a folded complex tensor, a
        Python complex number."""
        return isinstance(v, (A.Complex, complex)) or (
            isinstance(v, self.torch.Tensor) and v.is_complex())

    def complex(self, x):
        """The :class:`~.aten.Complex` pair of ``x``: a pair as it is, a folded complex
        tensor as two f64 consts (lifted once; a complex buffer's are named
        ``<name>.real`` and ``<name>.imag`` in ``meta["torch"]["consts"]``), a Python
        complex number as two one-element consts."""
        if isinstance(x, A.Complex):
            return x
        if isinstance(x, complex):
            return A.Complex(self.f(x.real), self.f(x.imag))
        key = (id(x), "complex")
        if key not in self.imp.lifted:
            t = x.detach().resolve_conj().resolve_neg()
            pair = A.Complex(self._lift(t.real, ids=False), self._lift(t.imag, ids=False))
            self.imp.lifted[key] = (x, pair)
            name = self.imp.const_names.get(id(x))
            if name is not None:
                self.imp.consts.setdefault(f"{name}.real", pair.re)
                self.imp.consts.setdefault(f"{name}.imag", pair.im)
        return self.imp.lifted[key][1]

    def torch_dtype(self, node_or_value) -> str:
        val = node_or_value.meta.get("val") if hasattr(node_or_value, "meta") else node_or_value
        if isinstance(val, self.torch.Tensor):
            return _kind(val.dtype)
        if isinstance(val, bool):
            return "bool"
        return "int" if isinstance(val, int) else "float"

    # lifting folded constants and numbers onto the tape
    def _lift(self, t, ids: bool):
        torch = self.torch
        key = (id(t), ids)
        if key in self.imp.lifted:
            return self.imp.lifted[key][1]
        if self.is_complex(t):            # never its real part alone
            raise A.Unsupported(A.COMPLEX_ONLY)
        arr = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if ids:
            if arr.dtype.kind not in "iu":
                raise A.Unsupported("integer ids expected, got floating-point data")
            g = self.tp.const(arr.astype(np.int64), dtype="i64")
        else:
            g = self.tp.const(arr.astype(np.float64))
        self.imp.lifted[key] = (t, g)          # keep t alive: ids are reused otherwise
        name = self.imp.const_names.get(id(t))
        if name is not None and name not in self.imp.consts:
            self.imp.consts[name] = g
        return g

    def f(self, x):
        """A float (or mask) GVar for ``x``: a GVar, a folded tensor or a number.  An i64
        input slot is converted (to_f64: exact, and still integer-valued for ids), and so
        is a folded integer or bool tensor whose values are exact in float64 (lifted as
        an i64 const: ``torch.minimum(ids, torch.full_like(ids, 5))`` stays ids)."""
        if self.is_gvar(x):
            return self.tp.to_f64(x) if self.tp.holds_ids(x.id) else x
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return self.tp.const(np.array([float(x)]))
        if isinstance(x, bool):
            return self.tp.const(np.array([1.0 if x else 0.0]))
        torch = self.torch
        if isinstance(x, torch.Tensor) and _kind(x.dtype) in ("int", "bool"):
            key = (id(x), "whole")
            if key not in self.imp.lifted:
                whole = x if x.dtype == torch.int64 else x.to(torch.int64)
                if whole.numel() and int(whole.abs().max()) > 2 ** 53:
                    return self._lift(x, ids=False)     # rounded, as torch's promotion
                self.imp.lifted[key] = (x, self.tp.to_f64(self._lift(whole, ids=True)))
            return self.imp.lifted[key][1]
        return self._lift(x, ids=False)

    mask = f

    def ids(self, x):
        """Integer ids for take/take_along: an i64 slot or an integer-valued node computed
        from one (where(ne(t, -100), t, 0)), a folded integer tensor, or an int."""
        if self.is_gvar(x):
            if not (self.tp.holds_ids(x.id) or self.tp.integral[x.id]):
                raise A.Unsupported("ids computed in floating point (gradtool reads ids from "
                                    "integer data and integer-valued ops of it; a float "
                                    "tensor used as indices is refused)")
            return x
        if isinstance(x, int) and not isinstance(x, bool):
            return self.tp.const(np.array([x], dtype=np.int64), dtype="i64")
        return self._lift(x, ids=True)

    def value(self, x):
        """A GVar for a layout op: floats as they are, i64 data through to_f64 (layout ops
        read f64; the result stays integer-valued), folded tensors lifted by dtype."""
        if self.is_gvar(x):
            return self.tp.to_f64(x) if self.tp.holds_ids(x.id) else x
        torch = self.torch
        if isinstance(x, torch.Tensor) and _kind(x.dtype) == "int":
            return self.tp.to_f64(self._lift(x, ids=True))
        return self.f(x)

    def is_integral(self, v) -> bool:
        return self.is_gvar(v) and (self.tp.holds_ids(v.id) or bool(self.tp.integral[v.id]))

    def operands(self, a, b):
        """Two operands of a comparison or where.  Beside integer data (an i64 slot or an
        integer-valued node), an int or a folded integer tensor becomes an i64 const, so
        that where(ne(t, -100), t, 0) stays integer-valued (ids for a gather)."""
        if not (self.is_integral(a) or self.is_integral(b)):
            return self.f(a), self.f(b)
        torch = self.torch

        def conv(v):
            if self.is_gvar(v):
                return v
            if (isinstance(v, int) and not isinstance(v, bool)) or (
                    isinstance(v, torch.Tensor) and _kind(v.dtype) == "int"):
                return self.ids(v)
            return self.f(v)
        return conv(a), conv(b)

    def scalar_const(self, x):
        """A folded one-element tensor as a Python number; anything else as it is."""
        if isinstance(x, self.torch.Tensor) and x.numel() == 1:
            return x.item()
        return x

    def scale(self, b, alpha):
        if isinstance(b, (int, float)):
            return b * alpha
        return self.tp.muls(self.f(b), float(alpha))

    # shapes
    def tshape(self, node) -> list:
        val = node.meta["val"] if hasattr(node, "meta") else node
        return [int(d) for d in val.shape]

    def shape(self, node) -> list:
        return self.tshape(node) or [1]

    def getitems_used(self, node) -> set:
        return {u.args[1] for u in node.users if str(u.target) == "<built-in function getitem>"}

    def reshape(self, v, shape):
        shape = list(shape) or [1]
        if list(v.shape) == shape:
            return v
        return self.tp.reshape(v, shape)

    def conform(self, node, out):
        """The entry's result in the node's exported shape (0-dim tensors are [1])."""
        if isinstance(out, tuple):
            vals = node.meta.get("val")
            return tuple(self._conform1(v, o) if o is not None else None
                         for v, o in zip(vals, out))
        return self._conform1(node.meta.get("val"), out)

    def _conform1(self, val, out):
        if isinstance(out, A.Complex):
            return A.Complex(*(self._conform1(val, p) for p in out.parts))
        if not self.is_gvar(out) or not isinstance(val, self.torch.Tensor):
            return out
        want = [int(d) for d in val.shape] or [1]
        if list(out.shape) != want:
            if math.prod(out.shape) != math.prod(want):
                raise A.Unsupported(f"recorded shape {list(out.shape)} differs from the "
                                    f"exported {want} (an importer bug)")
            return self.tp.reshape(out, want)
        return out

    def axes(self, a, dim) -> list:
        n = len(a.shape)
        if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
            return list(range(n))
        dims = [dim] if isinstance(dim, int) else list(dim)
        return sorted({d % n for d in dims})

    def reduce(self, kind, a, dim, keepdim):
        """sum / mean / max over the axes ``dim`` (None or []: all), as one node."""
        axes = self.axes(a, dim)
        fn = getattr(self.tp, kind)
        if len(axes) == len(a.shape) and not keepdim:
            return fn(a)
        return fn(a, axis=axes[0] if len(axes) == 1 else tuple(axes), keepdims=bool(keepdim))

    def permute(self, v, perm):
        n = len(v.shape)
        perm = [p % n for p in perm]
        if perm == list(range(n)):
            return v
        if perm == list(range(n - 2)) + [n - 1, n - 2]:
            return self.tp.transpose(v)
        return self.tp.permute(v, perm)

    def expand(self, v, shape):
        shape = list(shape)
        return v if list(v.shape) == shape else self.tp.expand(v, shape)

    def slice_axis(self, v, dim, start, stop, step):
        shape = list(v.shape)
        if start == 0 and stop == shape[dim] and step == 1:
            return v
        if stop <= start:
            raise A.Unsupported("an empty slice (gradtool values have at least one element)")
        starts = [0] * len(shape)
        stops = list(shape)
        starts[dim], stops[dim] = start, stop
        if step == 1:
            return self.tp.slice(v, starts, stops)
        steps = [1] * len(shape)
        steps[dim] = step
        return self.tp.slice(v, starts, stops, steps=steps)


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


# ── weights back ───────────────────────────────────────────────────────────

def load_weights(module, tape_or_file) -> list:
    """Copy a tape's (or a tape file's) params into ``module`` by state_dict name, cast to
    each parameter's dtype; its state slots (batch norm's running statistics, as
    ``gradtool train`` left them) go into the buffers of their names, cast to each
    buffer's dtype (``num_batches_tracked`` back to int64, exactly).  A file without a
    ``state`` map (written before it existed) gives its buffers from the named outputs
    of the buffers' names, as before.

    ``tape_or_file``: a path, a :class:`~gradtool.tapefile.TapeFile`, a
    :class:`TorchImport`, or a Tape whose params carry the torch names.  Refuses
    (TorchImportError, nothing copied) a param of the tape the module lacks, a
    module param the tape lacks, or a shape that differs, naming each.  Returns
    the names copied.
    """
    import torch
    from ..tape import Tape
    from ..tapefile import TapeFile, load
    outputs, state = {}, {}
    if isinstance(tape_or_file, TorchImport):
        tape, outputs, state = tape_or_file.tape, tape_or_file.outputs, tape_or_file.state
    elif isinstance(tape_or_file, Tape):
        tape = tape_or_file
    elif isinstance(tape_or_file, TapeFile):
        tape, outputs, state = tape_or_file.tape, tape_or_file.outputs, tape_or_file.state
    else:
        tf = load(tape_or_file)
        tape, outputs, state = tf.tape, tf.outputs, tf.state
    values = {tape.nodes[v.id].name: tape.values[v.id] for v in tape.params()}
    named = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    bufvals = {}
    if state:                     # the state slots hold the trained buffers
        slots = {n.name: i for i, n in enumerate(tape.nodes) if n.op == "const" and n.name}
        bufvals = {k: tape.values[slots[k]] for k in state if k in buffers and k in slots}
    else:
        for k, v in (outputs or {}).items():
            if k in buffers:
                i = v if isinstance(v, int) else v.id
                bufvals[k] = tape.values[i]
    trainable = {k for k, p in named.items() if p.requires_grad}
    problems = _Problems()
    for k in values:
        if k not in named:
            problems.add("tape params not in the module:", repr(k))
        elif tuple(named[k].shape) != values[k].shape and not (
                named[k].dim() == 0 and values[k].shape == (1,)):
            problems.add("shape mismatch for", repr(k), detail=f"the module has "
                         f"{list(named[k].shape)}, the tape {list(values[k].shape)}")
    for k, arr in bufvals.items():
        if buffers[k].numel() != arr.size:
            problems.add("shape mismatch for", repr(k), detail=f"the module's buffer has "
                         f"{list(buffers[k].shape)}, the tape {list(arr.shape)}")
    for k in (k for k in named if k in trainable):     # in the module's order
        if k not in values:
            problems.add("module params not in the tape:", repr(k))
    if problems:
        raise problems.error(WeightsError)
    with torch.no_grad():
        for k, arr in values.items():
            p = named[k]
            p.copy_(torch.from_numpy(np.array(arr)).reshape(p.shape).to(p.dtype))
        for k, arr in bufvals.items():
            b = buffers[k]
            b.copy_(torch.from_numpy(np.array(arr)).reshape(b.shape).to(b.dtype))
    return list(values) + list(bufvals)


def __getattr__(name):
    """``gtt.optim``: the torch.optim subclasses stepping by gradtool's optimizer table
    (:mod:`gradtool.interop.torch_optim`), imported on first use: they subclass
    ``torch.optim.Optimizer``, and this module imports without torch."""
    if name == "optim":
        from . import torch_optim
        return torch_optim
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
