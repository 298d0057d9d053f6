"""The torch.export step and its preparation: the user's autograd Functions and backward
hooks refused, float64 as torch's default dtype, dropout kept as gradtool's custom ops,
``run_decompositions`` with the table's preserved ops (and its retry), no_grad blocks
detached; torch's own failures as one line."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import traceback
from typing import Optional

from . import aten as A
from .problems import (SOURCE_FRAME, Problem, TorchImportError, display_path, torch_dir,
                       source_line)


@contextlib.contextmanager
def custom_functions(torch):
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
        # (the non-reentrant form applies torch's own _NoopSaveInputs there, torch 2.9)
        reentrant = (cls.__module__ == "torch.utils.checkpoint"
                     and cls.__name__ == "CheckpointFunction")
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


# the importer's own files (this one, torch.py): never the user's source line
IMPORTER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _seen_at(problem: Problem) -> None:
    """Add the user's frame that called into the watched torch function (the innermost
    outside torch and the importer) to ``problem``, once per call site: the export may
    trace a call twice."""
    frames = [f for f in traceback.extract_stack()[:-2]
              if not f.filename.startswith(torch_dir())
              and not os.path.abspath(f.filename).startswith(IMPORTER_DIR)]
    where = "unknown source line"
    if frames:
        f = frames[-1]
        where = (f"{display_path(f.filename)}:{f.lineno} ({f.name})"
                 + (f": {f.line.strip()}" if f.line else ""))
    if where not in problem.sources:
        problem.sources.append(where)
        problem.count += 1


def backward_hooks(module) -> list:
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
    return f"{display_path(code.co_filename)}:{code.co_firstlineno} ({fn.__qualname__})"


@contextlib.contextmanager
def stderr_kept(drop):
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
def quiet_leafspec():
    """torch 2.13's own ``run_decompositions`` deep-copies a pytree ``LeafSpec``, which
    warns (``FutureWarning: isinstance(treespec, LeafSpec) is deprecated``) from inside
    torch: nothing the user wrote or can change, so that one warning is not shown."""
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)",
                                category=FutureWarning)
        yield


@contextlib.contextmanager
def float64_default(torch):
    """torch's default dtype float64 while the forward is traced, re-traced by
    run_decompositions and folded: the tensors it creates without a dtype are float64.
    torch's fake-tensor logger is quiet meanwhile: it logs a traceback for an op that
    fails on the example shapes, which the import reports itself, in one line; so are its
    symbolic-shapes logger, which dumps the graph before a data-dependent branch fails,
    and (torch 2.6) export's tracer, which logs the same failure again."""
    default = torch.get_default_dtype()
    loggers = [logging.getLogger(name) for name in (
        "torch._subclasses.fake_tensor",
        "torch.fx.experimental.symbolic_shapes",     # a data-dependent guard's graph dump
        "torch.export._trace")]                      # torch 2.6: the failure, logged twice
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


def torch_failed(step: str, exc: Exception) -> TorchImportError:
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
        m = SOURCE_FRAME.search(line)
        if m and not m.group(1).startswith(torch_dir()) \
                and not os.path.abspath(m.group(1)).startswith(IMPORTER_DIR):
            code = lines[i + 1].strip() if i + 1 < len(lines) and not SOURCE_FRAME.search(
                lines[i + 1]) else ""
            found = (f"{display_path(m.group(1))}:{m.group(2)} ({m.group(3)})"
                     + (f": {code}" if code else ""))
    return found


def as_f64(t):
    import torch
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        return t.detach().to(torch.float64)
    return t


def user_outputs(ep) -> list:
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


def run_decompositions(ep, table, notes, torch):
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
    raise torch_failed("run_decompositions", first) from None


def _one_line(exc) -> str:
    text = str(exc).split("While executing")[0]
    return " ".join(text.split())


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


def keep_dropouts(ep, torch):
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


def detach_no_grad_blocks(ep, torch):
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
