"""Gathers and scatters: embedding, index_select, gather, index, index_add,
scatter_add, scatter_reduce, index_put."""

from __future__ import annotations

import math

import numpy as np

from .registry import Unsupported, aten


# ── gathers ────────────────────────────────────────────────────────────────

@aten("aten.embedding.default",
      doc="take (rows of the weight by i64 ids); with padding_idx p, where(ids == p, "
          "detach(rows), rows): the same values, and row p gets no gradient, as in torch")
def _embedding(r, node, weight, ids, padding_idx=-1, scale_grad=False, sparse=False):
    if scale_grad:
        raise Unsupported("embedding with scale_grad_by_freq")
    pos = r.ids(ids)
    rows = r.tp.take(r.f(weight), pos)
    if padding_idx is None or padding_idx < 0 or not r.requires_grad(rows):
        return rows
    pad = r.reshape(r.tp.eq(pos, float(padding_idx)), list(pos.shape) + [1])
    return r.tp.where(pad, r.tp.detach(rows), rows)


@aten("aten._embedding_bag.default", needs=("cat",),
      doc="nn.EmbeddingBag (sum, mean, max) with bag boundaries fixed at export (a folded "
          "offsets tensor, as a 2-d input gives): take, then per bag the sum, mean or max "
          "over its rows (one reduction over a [bags, length, dim] reshape when the bags "
          "are equally long); per-sample weights and padding_idx are refused")
def _embedding_bag(r, node, weight, ids, offsets, scale_grad=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    torch = r.torch
    if scale_grad:
        raise Unsupported("embedding_bag with scale_grad_by_freq")
    if per_sample_weights is not None:
        raise Unsupported("embedding_bag with per_sample_weights")
    if padding_idx is not None and padding_idx >= 0:
        raise Unsupported("embedding_bag with padding_idx")
    if not isinstance(offsets, torch.Tensor):
        raise Unsupported("embedding_bag whose offsets are an input or computed (gradtool "
                          "fixes the bag boundaries at export)")
    n = r.tshape(node.args[1])[0]
    bounds = [int(o) for o in offsets.tolist()] + ([] if include_last_offset else [n])
    if any(b < 0 or b > n for b in bounds) or bounds != sorted(bounds) or len(bounds) < 2:
        raise Unsupported(f"embedding_bag offsets {bounds[:8]} are not ascending in [0, {n}]")
    tp = r.tp
    rows = tp.take(r.f(weight), r.ids(ids))                               # [n, D]
    d = rows.shape[1]
    reduce = {0: tp.sum, 1: tp.mean, 2: tp.max}[int(mode)]
    sizes = [e - s for s, e in zip(bounds, bounds[1:])]
    if min(sizes) > 0 and len(set(sizes)) == 1 and bounds[0] == 0 and bounds[-1] == n:
        out = reduce(r.reshape(rows, [len(sizes), sizes[0], d]), axis=1)
    else:
        bags = [reduce(r.slice_axis(rows, 0, s, e, 1), axis=0, keepdims=True) if e > s
                else tp.const(np.zeros((1, d))) for s, e in zip(bounds, bounds[1:])]
        out = bags[0] if len(bags) == 1 else tp.cat(bags, 0)
    return (out, None, None, None)


@aten("aten.index_select.default", needs=("index_select",), doc="index_select")
def _index_select(r, node, a, dim, ids):
    v = r.f(a)
    return r.tp.index_select(v, dim % len(v.shape), r.ids(ids))


@aten("aten.gather.default", doc="take_along")
def _gather(r, node, a, dim, ids, sparse_grad=False):
    v = r.f(a)
    return r.tp.take_along(v, r.ids(ids), axis=dim % len(v.shape))


@aten("aten.index.Tensor", needs=("permute",),
      doc="one index tensor: take along its axis (ids of any shape); several (x[rows, "
          "labels], broadcasting): take by the first, then take_along by each next, the "
          "result's dims placed as torch places them")
def _index(r, node, a, indices):
    given = [(i, t) for i, t in enumerate(indices) if t is not None]
    if any(r.torch_dtype(node.args[1][i]) == "bool" for i, _ in given):
        raise Unsupported("boolean-mask indexing (a data-dependent shape)")
    if len(given) > 1:
        return _index_several(r, node, r.f(a), given)
    axis, ids = given[0]
    v = r.f(a)
    n = len(v.shape)
    if axis == 0:
        return r.tp.take(v, r.ids(ids))
    perm = [axis] + [i for i in range(n) if i != axis]
    out = r.tp.take(r.permute(v, perm), r.ids(ids))
    k = len(out.shape) - (n - 1)           # the ids' dims, now in front
    rest = list(range(k, len(out.shape)))
    back = rest[:axis] + list(range(k)) + rest[axis:]
    return r.permute(out, back)


def _index_several(r, node, v, given):
    """x[i1, ..., im] with index tensors on dims P (broadcast together to bshape): the
    indexed dims permuted to the front, ``take`` by i1 (each expanded to bshape), then
    per next index ``take_along`` of the dim after bshape; torch's result has bshape
    where the first indexed dim was when P are adjacent, in front otherwise."""
    tp, torch = r.tp, r.torch
    n = len(v.shape)
    dims = [i for i, _ in given]
    others = [d for d in range(n) if d not in dims]
    shapes = [tuple(r.tshape(node.args[1][i])) for i in dims]
    bshape = list(np.broadcast_shapes(*shapes)) or [1]

    def ids(i, t):
        if isinstance(t, torch.Tensor):             # a folded index: negatives counted back
            t = torch.remainder(t, v.shape[i])
        g = r.ids(t)
        g = tp.to_f64(g) if tp.holds_ids(g.id) else g
        g = r.reshape(g, [1] * (len(bshape) - len(g.shape)) + list(g.shape))
        return r.expand(g, bshape)

    t = tp.take(r.permute(v, dims + others), ids(*given[0]))    # bshape + dims[1:] + others
    lead = len(bshape)
    for i, g in given[1:]:
        tail = list(t.shape[lead + 1:])
        pick = r.expand(r.reshape(ids(i, g), bshape + [1] * (1 + len(tail))),
                        bshape + [1] + tail)
        t = r.reshape(tp.take_along(t, pick, axis=lead), bshape + tail)
    if dims == list(range(dims[0], dims[0] + len(dims))) and dims[0] > 0:
        before = list(range(lead, lead + dims[0]))               # the others before P
        rest = [d for d in range(len(t.shape)) if d not in before]
        t = r.permute(t, before + rest)
    return r.reshape(t, r.shape(node))


# ── scatter-adds (GNN message passing: index_add, scatter_add, index_put(accumulate)) ──
#
# Each records Tape.index_add (base + scatter of src's entries by the ids, gradtool's
# order: base + (0.0 + src[p0] + src[p1] + ...), within rounding of torch's sequential
# base[v] += src[p]); into a folded base of +0.0 (torch.zeros(...).index_add(...)) just
# the scatter, which is torch's sum to the bit.

def _zero_base(r, base) -> bool:
    """A folded tensor of +0.0 only: adding it changes no bit of a scatter's sum."""
    torch = r.torch
    return (isinstance(base, torch.Tensor) and bool((base == 0).all())
            and not bool(torch.signbit(base).any()))


def _scatter_dims(r, v, d, ids, rows):
    """v (pre + ids.shape + post, the ids' dims from d) scattered by ids into ``rows``
    entries at dim d: pre + [rows] + post."""
    n, k = len(v.shape), len(ids.shape)
    front = list(range(d, d + k)) + list(range(d)) + list(range(d + k, n))
    summed = r.tp.scatter(r.permute(v, front), ids, rows=rows)
    return r.permute(summed, list(range(1, d + 1)) + [0] + list(range(d + 1, n - k + 1)))


def _add_rows(r, node, base, dim, ids, src, alpha=1):
    """base + src's entries of ``dim`` summed by 1-d ``ids`` (torch.index_add)."""
    shape = r.shape(node)
    dim %= len(shape)
    ids = r.ids(ids)
    if _zero_base(r, base):
        v = r.f(src) if alpha == 1 else r.scale(src, alpha)
        return _scatter_dims(r, v, dim, ids, shape[dim])
    return r.tp.index_add(r.f(base), dim, ids, r.f(src), alpha=float(alpha))


@aten("aten.index_add.default", needs=("index_add", "scatter"),
      doc="Tape.index_add: base + scatter of src's entries along dim by the ids (alpha: "
          "muls first); into a folded base of zeros the scatter alone (torch's sum to the "
          "bit). The importer keeps index_add out of run_decompositions (which makes it "
          "index_put)")
def _index_add(r, node, base, dim, ids, src, alpha=1):
    return _add_rows(r, node, base, dim, ids, src, alpha)


def _one_index(r, node, index, dim):
    """The 1-d ids of a scatter_add index that only varies along ``dim`` (PyG's and
    torch_scatter's ``idx.view(-1, 1).expand_as(src)``), else None."""
    torch = r.torch
    shape = r.tshape(node.args[2])
    if isinstance(index, torch.Tensor):             # folded: compare with its first line
        lines = index.movedim(dim, 0).reshape(shape[dim], -1)
        if not bool((lines == lines[:, :1]).all()):
            return None
        return lines[:, 0].contiguous()
    source = node.args[2]
    if any(n != 1 for k, n in enumerate(shape) if k != dim):   # is it an expand of a line?
        if str(source.target) != "aten.expand.default":
            return None
        source = source.args[0]
        inner = r.tshape(source)
        if len(inner) != len(shape) or any(n != 1 for k, n in enumerate(inner) if k != dim):
            return None
        index = r.imp.env[source]
    line = source                       # back through views to the ids leaf, if any: its
    while True:                         # uploaded index beats scanning computed ids
        value = r.imp.env.get(line)
        if r.is_ids(value) and list(value.shape) == [shape[dim]]:
            return value
        if str(getattr(line, "target", "")) not in _VIEWS or math.prod(
                r.tshape(line.args[0])) != shape[dim]:
            return r.reshape(r.value(r.ids(index)), [shape[dim]])    # i64: to_f64 first
        line = line.args[0]


_VIEWS = {"aten.view.default", "aten.reshape.default", "aten._unsafe_view.default",
          "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
          "aten.squeeze.default", "aten.flatten.using_ints"}


# Any other index (one varying along other dims than dim, or covering part of the output;
# index_put's several index tensors) names the output's entries one by one: each position's
# linear id into the output laid out with the indexed dims first, one scatter by those ids
# into [size], reshaped and permuted back.  A folded index's ids are computed at import by
# torch itself (gather / index of a table of the ids: torch's range checks, negatives and
# broadcasting); a computed index's are integer-valued ops of it, index * stride added to
# a folded table of the rest.  Laid out so, a leading-dim id out of range makes an id out
# of [0, size), which the scatter refuses at replay as torch raises; index_put's other
# computed index tensors are checked by masks (a bad one turns its ids to -1).

def _positions(r, shape, lead):
    """A folded tensor of ``shape``: each entry's linear id in the layout with the dims
    ``lead`` first (the others after them, in order); and that layout (a permutation)."""
    perm = list(lead) + [k for k in range(len(shape)) if k not in lead]
    laid = r.torch.arange(math.prod(shape)).reshape([shape[k] for k in perm])
    return laid.permute([perm.index(k) for k in range(len(shape))]), perm


def _folded_ids(r, op, fn):
    """fn() (torch picking the linear ids of a folded index), refused where torch
    refuses that index."""
    try:
        return fn()
    except (RuntimeError, IndexError) as exc:
        raise Unsupported(f"{op} by a folded index torch refuses "
                          f"({str(exc).strip().splitlines()[0]})") from None


def _plus_index(r, lin, i, stride):
    """lin + i * stride: i an integer-valued GVar, lin one or a folded integer tensor;
    integer-valued."""
    if stride != 1:
        i = r.tp.mul(i, r.value(r.torch.tensor([stride])))
    return r.tp.add(r.value(lin), i)


def _scatter_ids(r, node, dim, index):
    """A scatter_add index's linear ids (shaped like it) into the output laid out with
    ``dim`` first, and that layout."""
    torch = r.torch
    shape, ishape = r.shape(node), r.shape(node.args[2])
    pos, perm = _positions(r, shape, [dim])
    if isinstance(index, torch.Tensor):
        lin = _folded_ids(r, "scatter_add",
                          lambda: pos.gather(dim, index.long().reshape(ishape)))
        return r.ids(lin), perm
    offsets = pos.gather(dim, torch.zeros(ishape, dtype=torch.int64))
    return _plus_index(r, offsets, r.value(r.ids(index)), math.prod(shape) // shape[dim]), perm


def _index_put_ids(r, node, indices):
    """index_put's linear ids of several index tensors (None: a full slice) into base laid
    out with the indexed dims first, shaped like the indexed part (torch's advanced
    indexing: the index tensors broadcast, in their place where adjacent, else first); and
    that layout.  Folded index tensors count negatives back; computed ones must lie in
    [0, n), as index_put's one-index path reads them."""
    torch, tp = r.torch, r.tp
    shape = r.shape(node)
    given = [k for k, t in enumerate(indices) if t is not None]
    pos, perm = _positions(r, shape, given)
    ishapes = {k: r.tshape(node.args[1][k]) for k in given}
    computed = [k for k in given if not isinstance(indices[k], torch.Tensor)]
    table = [None if t is None else t.long() if k not in computed       # computed: at 0
             else torch.zeros(ishapes[k], dtype=torch.int64) for k, t in enumerate(indices)]
    lin = _folded_ids(r, "index_put", lambda: torch.ops.aten.index(pos, table))
    if not computed:
        return r.ids(lin), perm
    bshape = list(torch.broadcast_shapes(*[torch.Size(s) for s in ishapes.values()]))
    at = given[0] if given == list(range(given[0], given[-1] + 1)) else 0
    after = lin.dim() - at - len(bshape)            # the sliced dims after the broadcast
    bad = None
    for k in computed:
        lead = [1] * (at + len(bshape) - len(ishapes[k]))
        i = r.reshape(r.value(r.ids(indices[k])), lead + ishapes[k] + [1] * after)
        if k != perm[0]:                            # the scatter checks the leading one
            out = tp.logical_or(tp.lt(i, r.f(0.0)), tp.ge(i, r.f(float(shape[k]))))
            bad = out if bad is None else tp.logical_or(bad, out)
        lin = _plus_index(r, lin, i, math.prod(shape[j] for j in perm[perm.index(k) + 1:]))
    return (lin if bad is None else tp.where(bad, -1, lin)), perm


def _scatter_flat(r, shape, perm, v, lin):
    """v (shaped like the linear ids ``lin`` of the layout ``perm``) summed by them into
    a tensor of ``shape``."""
    flat = r.tp.scatter(v, lin, rows=math.prod(shape))
    laid = r.reshape(flat, [shape[k] for k in perm])
    return r.permute(laid, [perm.index(k) for k in range(len(shape))])


def _broadcast(r, v, target):
    """v broadcast to ``target`` (torch's rules: leading dims added)."""
    v = r.f(v)
    return r.expand(r.reshape(v, [1] * (len(target) - len(v.shape)) + list(v.shape)), target)


def _scatter_add_rows(r, node, base, dim, index, src, reduce="sum", include_self=True):
    """torch.scatter_add, and scatter_reduce's 'sum' and 'mean': base's entries with src's
    summed into them by the index (mean: divided by their counts, base's included where
    include_self; without it, the entries the index names are src's alone)."""
    torch, tp = r.torch, r.tp
    shape, src_shape = r.shape(node), r.shape(node.args[3])
    ishape = r.shape(node.args[2])
    dim %= len(shape)
    v = r.f(src)
    for k, n in enumerate(ishape):                 # torch reads src where index reaches
        if src_shape[k] != n:
            v = r.slice_axis(v, k, 0, n, 1)
    covers = bool(r.tshape(node.args[2])) and all(
        ishape[k] == shape[k] for k in range(len(shape)) if k != dim)
    ids = _one_index(r, node, index, dim) if covers else None
    if ids is not None:
        ids = r.ids(ids)
        if reduce == "sum" and include_self:
            return _add_rows(r, node, base, dim, ids, v)
        place = lambda t: _scatter_dims(r, t, dim, ids, shape[dim])   # noqa: E731
    else:
        lin, perm = _scatter_ids(r, node, dim, index)
        place = lambda t: _scatter_flat(r, shape, perm, t, lin)       # noqa: E731
    summed, zero = place(v), _zero_base(r, base)
    if reduce == "sum" and (include_self or zero):
        return summed if zero else tp.add(r.f(base), summed)
    folded = isinstance(index, torch.Tensor)
    if folded:                                      # the counts: folded, or scattered ones
        count = torch.zeros(shape, dtype=torch.float64).scatter_add(
            dim, index.long().reshape(ishape), torch.ones(ishape, dtype=torch.float64))
    else:
        count = place(r.f(torch.ones(ishape, dtype=torch.float64)))
    if reduce == "mean":
        if include_self:
            return tp.div(summed if zero else tp.add(r.f(base), summed),
                          r.f(count + 1) if folded else tp.adds(count, 1.0))
        summed = tp.div(summed, r.f(count.clamp(min=1)) if folded
                        else tp.maximum(count, r.f(1.0)))
        if zero:
            return summed
    hit = r.f((count > 0).double()) if folded else tp.gt(count, r.f(0.0))
    return tp.where(hit, summed, r.f(base))      # the entries the index names: src's alone


@aten("aten.scatter_add.default", needs=("index_add", "scatter"),
      doc="index_add where the index only varies along dim (a 1-d index expanded along "
          "the others, PyG's and torch_scatter's pattern, or a folded index constant "
          "along them); any other index: one scatter by linear ids into the output laid "
          "out with dim first (a folded index's computed by torch at import; a computed "
          "one's index * stride + a folded table of the other dims' offsets), reshaped, "
          "permuted back and added to base")
def _scatter_add(r, node, base, dim, index, src):
    return _scatter_add_rows(r, node, base, dim, index, src)


@aten("aten.scatter_reduce.two", needs=("index_add", "scatter", "where"),
      doc="reduce='sum' with include_self=True: as scatter_add; include_self=False: where "
          "the index names an entry (count > 0, the counts a scatter of ones, folded for a "
          "folded index) the sum, else base. reduce='mean': the sum (base's included "
          "where include_self) / (count + 1) with include_self, else / max(count, 1) "
          "where count > 0 and base elsewhere (torch's definition); amax, amin and prod "
          "are refused")
def _scatter_reduce(r, node, base, dim, index, src, reduce, include_self=True):
    if reduce not in ("sum", "mean"):
        raise Unsupported(f"scatter_reduce with reduce={reduce!r} (only 'sum' and 'mean' "
                          "import)")
    if reduce == "mean" and r.torch_dtype(node) != "float":
        raise Unsupported("scatter_reduce with reduce='mean' of integer data (torch floors "
                          "the quotient)")
    return _scatter_add_rows(r, node, base, dim, index, src, reduce, include_self)


@aten("aten.index_put.default", needs=("index_add", "scatter", "where"),
      doc="accumulate=True (x.index_put_(indices, v, accumulate=True); not x[ids] += v, "
          "which exports as an assignment): values broadcast to the indexed shape; one "
          "index tensor: scatter of them by the ids (folded ids: negatives counted back) "
          "added to base; several (None: full slices): one scatter by linear ids into base "
          "laid out with the indexed dims first (folded ones computed by torch at import; "
          "computed ones index * stride added up, each not leading checked by masks) "
          "added to base; an assignment (accumulate=False) or a boolean mask is refused")
def _index_put(r, node, base, indices, values, accumulate=False):
    given = [(k, t) for k, t in enumerate(indices) if t is not None]
    if not accumulate:
        raise Unsupported("index_put without accumulate (an assignment by index, x[ids] = v: "
                          "the last of repeated ids wins)")
    if any(r.torch_dtype(node.args[1][k]) == "bool" for k, _ in given):
        raise Unsupported("index_put by a boolean mask (a data-dependent shape)")
    shape = r.shape(node)
    if len(given) == 1:
        d, ids = given[0]
        if isinstance(ids, r.torch.Tensor):
            ids = r.torch.remainder(ids, shape[d])
        ids = r.ids(ids)
        v = _broadcast(r, values, shape[:d] + list(ids.shape) + shape[d + 1:])
        summed = _scatter_dims(r, v, d, ids, shape[d])
    else:
        lin, perm = _index_put_ids(r, node, indices)
        summed = _scatter_flat(r, shape, perm, _broadcast(r, values, list(lin.shape)), lin)
    return summed if _zero_base(r, base) else r.tp.add(r.f(base), summed)
