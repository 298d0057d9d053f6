"""The import checked against torch's own run of the program, before anything is written.

gradtool records the program ``run_decompositions`` gives, op by op through the
mapping table.  Two things could make that tape compute something else than the
user's module, silently:

- a **torch decomposition that is not the op's definition**.  Seen in torch 2.13:
  ``aten.multilabel_margin_loss_forward``'s decomposition counts the entries after a
  target list's ``-1`` end marker as targets (its loss 1.35 where the op gives 0.80),
  so every importer of the decomposed program inherits a wrong loss;
- a gradtool mapping that is wrong for some call.

So after recording, :func:`check_against_torch` runs the exported program *before*
decomposition in torch (``torch.fx.Interpreter``, float64, on copies of the example
inputs, parameters and buffers: the program's buffers do not change) and compares its
loss with the tape's, with dropout off on both sides: torch's dropouts (and the
importer's ``gradtool::`` channel and alpha dropouts) run as the identity here and a
bernoulli, normal, rand or randint draw as its mean (randint: the middle value), a
randperm as the identity and a multinomial as the most likely category, and the
importer reads the tape's loss with the rng slot's train flag 0, where
``gradtool.nn.dropout`` gives its input exactly and the draws of ``nn.bernoulli``,
``normal``, ``rand``, ``randint``, ``randperm`` and ``multinomial`` are those values.
They differ by rounding only (gradtool's orders against torch's kernels: about 1e-15
relative per op); beyond :data:`RTOL` the import is refused,
never written.  The refusal names the culprit where it can: each op of the program
that the decomposition table rewrote is run both ways on the values it met, and the
first whose decomposition disagrees with the op is reported with its source line.

One forward in torch per import: a fraction of ``torch.export``'s own time.
"""

from __future__ import annotations

import math

RTOL = 1e-6       # the loss may differ by rounding only; a wrong op differs far more
ATOL = 1e-12      # ...and a loss that cancels to about 0 by about 0


def _differs(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) != math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a != b
    return abs(a - b) > max(RTOL * max(abs(a), abs(b)), ATOL)


def _tensors_differ(torch, got, want) -> bool:
    """Whether a decomposition's output ``got`` is not the op's ``want`` (beyond rounding)."""
    if isinstance(want, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            return True
        return any(_tensors_differ(torch, g, w) for g, w in zip(got, want))
    if not isinstance(want, torch.Tensor):
        return False
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
        return True
    return bool(_bad_elements(torch, got, want).any())


def _bad_elements(torch, got, want):
    """Where the same-shaped tensors ``got`` and ``want`` differ beyond rounding: a bool
    tensor (a NaN or an infinity against anything else, or a difference past RTOL of the
    element plus the tensor's largest finite magnitude)."""
    if not want.is_floating_point():
        return got.to(want.dtype) != want
    g, w = got.detach().to(torch.float64), want.detach().to(torch.float64)
    finite = torch.isfinite(w)
    scale = float(w[finite].abs().max()) if bool(finite.any()) else 0.0
    special = (torch.isnan(g) != torch.isnan(w)) | (
        (torch.isinf(g) & (g > 0)) != (torch.isinf(w) & (w > 0))) | (
        (torch.isinf(g) & (g < 0)) != (torch.isinf(w) & (w < 0)))
    far = finite & ((g - w).abs() > RTOL * (w.abs() + scale) + ATOL)
    return special | far


class _Recording:
    """Runs a graph module, keeping every node's value (for the culprit search)."""

    def __init__(self, torch, gm):
        import torch.fx
        values = self.values = {}

        dropouts = {torch.ops.aten.dropout.default, torch.ops.aten.native_dropout.default,
                    # in place (nn.Dropout(inplace=True): MobileNetV3's, EfficientNet's)
                    torch.ops.aten.dropout_.default, torch.ops.aten.feature_dropout_.default,
                    torch.ops.aten.alpha_dropout_.default,
                    torch.ops.aten.feature_alpha_dropout_.default}
        means = {                           # bernoulli's draws, each its mean p
            torch.ops.aten.bernoulli.p: lambda x, p=0.5, generator=None: torch.full_like(x, p),
            torch.ops.aten.bernoulli.default: lambda x, generator=None: x.clone(),
            torch.ops.aten.bernoulli_.float: lambda x, p=0.5, generator=None: x.fill_(p),
            torch.ops.aten.bernoulli_.Tensor: lambda x, p, generator=None: x.copy_(p),
            torch.ops.aten.randn.default: lambda size, **kw: torch.zeros(
                size, dtype=torch.float64),
            torch.ops.aten.randn_like.default: lambda x, **kw: torch.zeros_like(x),
        }
        for overload in ("float_float", "Tensor_float", "float_Tensor", "Tensor_Tensor"):
            means[getattr(torch.ops.aten.normal, overload)] = _normal_mean(torch)
        means.update(_uniform_means(torch))
        for name in ("feature_dropout", "alpha_dropout"):     # the importer's custom ops
            ns = getattr(torch.ops, "gradtool", None)
            if ns is not None and hasattr(ns, name):
                dropouts.add(getattr(ns, name).default)

        self.draws = set(means) | dropouts      # ops whose flag-0 value is set here
        flag0 = self.flag0 = _without_dropout_p(torch)

        def kept(v):                            # the value as the node gave it: a later
            if isinstance(v, torch.Tensor):     # in-place op (hardswish_, dropout_) must
                return v.clone()                # not change what the culprit search reads
            if isinstance(v, (tuple, list)):
                return type(v)(kept(x) for x in v)
            return v

        class Keep(torch.fx.Interpreter):
            def run_node(self, n):
                out = super().run_node(n)
                values[n] = kept(out)
                return out

            def call_function(self, target, args, kwargs):
                args, kwargs = flag0(target, args, kwargs)
                if target in means:             # a draw's mean, as the tape's flag 0
                    return means[target](*args, **kwargs)
                if target in dropouts:          # dropout off: the tape's flag-0 loss
                    x = args[0]
                    if target is not torch.ops.aten.native_dropout.default:
                        return x
                    return (x, torch.ones_like(x, dtype=torch.bool))
                return super().call_function(target, args, kwargs)

        self.interpreter = Keep(gm)


def _without_dropout_p(torch):
    """``(target, args, kwargs) -> (args, kwargs)``: an op with a dropout inside it
    (``scaled_dot_product_attention(dropout_p > 0)``, whose decomposition gradtool records
    with ``nn.dropout`` on the attention weights) called with its dropout off, as the
    tape's flag 0 computes it; any other call as it is."""
    sdpa = {torch.ops.aten.scaled_dot_product_attention.default}

    def flag0(target, args, kwargs):
        if target in sdpa:
            if len(args) > 4:
                args = tuple(args[:4]) + (0.0,) + tuple(args[5:])
            elif "dropout_p" in kwargs:
                kwargs = {**kwargs, "dropout_p": 0.0}
        return args, kwargs
    return flag0


def _normal_mean(torch):
    """torch.normal's draws replaced by their mean (the tape's flag-0 value)."""
    def mean_of(mean, std=1.0, size=None, **kw):
        shape = size if size is not None else torch.broadcast_shapes(
            *(tuple(t.shape) for t in (mean, std) if isinstance(t, torch.Tensor)))
        return torch.zeros(shape, dtype=torch.float64) + mean
    return mean_of


def _uniform_means(torch):
    """rand's, randint's, randperm's and multinomial's draws as the tape's flag 0 gives
    them: the mean (0.5; from/2 + to/2 for uniform_), the middle integer low + (high -
    low - 1) // 2, the identity permutation, the most likely category (argmax: the first
    of equal ones)."""
    aten = torch.ops.aten

    def full(shape, value, dtype=torch.float64):
        return torch.full(tuple(shape), value, dtype=dtype)

    def middle(low, high):
        return low + (high - low - 1) // 2

    return {
        aten.rand.default: lambda size, **kw: full(size, 0.5),
        aten.rand_like.default: lambda x, **kw: full(x.shape, 0.5),
        aten.uniform.default: lambda x, *bounds, **kw: full(x.shape, _midpoint(
            *(list(bounds) + [kw.get("from", 0.0), kw.get("to", 1.0)])[:2])),
        aten.randint.default: lambda high, size, **kw: full(size, middle(0, high), torch.long),
        aten.randint.low: lambda low, high, size, **kw: full(size, middle(low, high),
                                                             torch.long),
        aten.randint_like.default: lambda x, high, **kw: full(x.shape, middle(0, high),
                                                              torch.long),
        aten.randint_like.low_dtype: lambda x, low, high, **kw: full(
            x.shape, middle(low, high), torch.long),
        aten.randperm.default: lambda n, **kw: torch.arange(n, dtype=torch.long),
        aten.multinomial.default: lambda w, k, replacement=False, **kw: torch.argmax(
            w, -1, keepdim=True).expand(*w.shape[:-1], k),
        # in place, as the program before decomposition has them (x.uniform_(a, b), ...)
        aten.uniform_.default: lambda x, *bounds, **kw: x.fill_(_midpoint(
            *(list(bounds) + [kw.get("from", 0.0), kw.get("to", 1.0)])[:2])),
        aten.normal_.default: lambda x, mean=0.0, std=1.0, **kw: x.fill_(mean),
        aten.random_.to: lambda x, to, **kw: x.fill_(middle(0, to)),
    }


def _midpoint(low, high):
    return low * 0.5 + high * 0.5


def _flat_args(torch, ep):
    """Copies of the program's placeholders' values, in input_specs order, or None without
    examples.  Copies: the exported (training) IR is not functional -- ``batch_norm``
    updates its running statistics in place, ``add_`` counts ``num_batches_tracked`` --
    and the caller's program keeps its buffers (and the examples their values)."""
    import torch.utils._pytree as pytree
    from torch.export.graph_signature import InputKind
    example = getattr(ep, "example_inputs", None)
    if not example:
        return None
    args, kwargs = example
    user = [t for t in pytree.tree_leaves((args, kwargs))]
    flat, u = [], 0
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            if u >= len(user):
                return None
            flat.append(user[u])
            u += 1
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            flat.append(ep.state_dict[spec.target] if spec.target in ep.state_dict
                        else ep.constants[spec.target])
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            flat.append(ep.constants[spec.target])
        else:
            return None
    return [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in flat]


def torch_loss(ep, loss_output: int):
    """torch's value of the program's loss (its user output ``loss_output``) on the
    example inputs, and the recording of every node; None where it cannot be run."""
    import torch
    from torch.export.graph_signature import OutputKind
    flat = _flat_args(torch, ep)
    if flat is None:
        return None
    rec = _Recording(torch, ep.graph_module)
    try:
        with torch.no_grad():
            outs = rec.interpreter.run(*flat)
    except Exception:                 # noqa: BLE001 - a program torch cannot run eagerly:
        return None                   # nothing to compare with (the import stands as is)
    user = [o for spec, o in zip(ep.graph_signature.output_specs, outs)
            if spec.kind in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT)]
    if not 0 <= loss_output < len(user) or not isinstance(user[loss_output], torch.Tensor) \
            or user[loss_output].numel() != 1:
        return None
    return float(user[loss_output].to(torch.float64).reshape(())), rec


def _decomposed(torch, op, table, args, kwargs):
    """``op(*args, **kwargs)`` computed as the program's decomposition computes it: traced
    with ``table`` applied recursively (as ``run_decompositions`` applies it), then run."""
    import torch.utils._pytree as pytree
    from torch.fx.experimental.proxy_tensor import make_fx
    leaves, spec = pytree.tree_flatten((args, kwargs))
    where = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]

    def call(*tensors):
        full = list(leaves)
        for i, t in zip(where, tensors):
            full[i] = t
        a, k = pytree.tree_unflatten(full, spec)
        return op(*a, **k)

    tensors = [leaves[i] for i in where]
    # make_fx traces with the real tensors, running the op: an in-place op (hardswish_)
    # would change them before the traced program runs; each run gets its own copies
    traced = make_fx(call, decomposition_table=table)(*[t.clone() for t in tensors])
    return traced(*[t.clone() for t in tensors])


def decomposition_culprit(ep, table, rec):
    """The first node of ``ep`` whose op ``table`` decomposes into something that
    computes another value than the op on the values it met: (node, got, want)."""
    import torch
    for node in ep.graph_module.graph.nodes:
        if node.op != "call_function" or node.target not in table or node not in rec.values \
                or node.target in rec.draws:      # a draw: its flag-0 value is by definition
            continue
        args = torch.fx.node.map_arg(node.args, lambda n: rec.values[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: rec.values[n])
        args, kwargs = rec.flag0(node.target, args, kwargs)
        try:
            with torch.no_grad():
                got = _decomposed(torch, node.target, table, args, kwargs)
        except Exception:             # noqa: BLE001 - not traceable alone: not this one
            continue
        want = rec.values[node]
        if _tensors_differ(torch, got, want):
            return node, got, want
    return None


def _first_difference(torch, got, want):
    """``(got, want)`` at the first element where they differ beyond rounding (their
    first elements where none is found: a shape or dtype difference)."""
    while isinstance(want, (tuple, list)) and want and isinstance(got, (tuple, list)) \
            and len(got) == len(want):
        pair = next(((g, w) for g, w in zip(got, want) if _tensors_differ(torch, g, w)),
                    (got[0], want[0]))
        got, want = pair
    if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) \
            and got.shape == want.shape and want.numel():
        bad = _bad_elements(torch, got, want).reshape(-1).nonzero()
        if len(bad):
            i = int(bad[0])
            return got.reshape(-1)[i], want.reshape(-1)[i]
    return got, want


def _first_value(torch, v) -> str:
    while isinstance(v, (tuple, list)) and v:
        v = v[0]
    if isinstance(v, torch.Tensor):
        return repr(float(v.reshape(-1)[0])) if v.numel() else "[]"
    return repr(v)


def check_against_torch(ep, table, tape_loss: float, loss_output: int, problems) -> None:
    """Add one problem to ``problems`` (an importer's ``Problems``) if the tape's loss
    is not torch's for the program ``ep`` (before decomposition by ``table``)."""
    import torch
    ran = torch_loss(ep, loss_output)
    if ran is None:
        return
    want, rec = ran
    if not _differs(tape_loss, want):
        return
    found = decomposition_culprit(ep, table, rec)
    if found is not None:
        node, got, ref = found
        got, ref = _first_difference(torch, got, ref)
        problems.add("wrong decomposition of", str(node.target), node,
                     f"torch's decomposition gives {_first_value(torch, got)} where the op "
                     f"itself gives {_first_value(torch, ref)} (the loss {tape_loss!r} "
                     f"against {want!r}); gradtool does not import a program whose value "
                     f"is not the module's: rewrite this call, or report it")
        return
    problems.add("imported loss differs from torch's", f"({tape_loss!r} against {want!r})",
                 None, "the tape would not compute the module's loss; nothing is written "
                       "(a gradtool bug: please report it with the module)")
