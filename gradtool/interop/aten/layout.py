"""Layout ATen ops: views, reshapes, permutes, slices, scatters into slices, cat, stack,
pads, repeats, copies and dtype conversions (exact copies)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from ...composites.layout import spread
from .registry import Unsupported, aten


# ── layout ─────────────────────────────────────────────────────────────────

@aten("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
      "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
      "aten.squeeze.default", "aten.view_copy.default", "aten.flatten.using_ints",
      "aten.unflatten.int",
      doc="reshape to the exported shape (a no-op where the shape does not change)")
def _view(r, node, a, *args):
    return r.reshape(r.value(a), r.shape(node))


@aten("aten.clone.default", "aten.contiguous.default",
      "aten.lift_fresh_copy.default",
      doc="the same value (no node)")
def _identity(r, node, a, *args, **kwargs):
    return r.value(a)


@aten("aten.detach.default", needs=("detach",),
      doc="detach (a stop-gradient) of a value a param reaches, else the same value (the "
          "importer keeps detach out of run_decompositions, which would make it an alias)")
def _detach(r, node, a):
    v = r.value(a)
    return r.tp.detach(v) if r.requires_grad(v) else v


@aten("aten.alias.default",
      doc="the same value (a view of the whole tensor: a no-op slice; the gradient passes, "
          "as torch's alias; detach, which the decomposition would make an alias, is kept "
          "as detach)")
def _alias(r, node, a):
    return r.value(a)


@aten("aten._to_copy.default", "aten.to.dtype", needs=("trunc",),
      doc="a float-to-float copy is the same value (every float is f64); i64 data to float: "
          "to_f64; integer-valued data (ids, masks) to an integer dtype: the same value; "
          "other floats to an integer dtype: trunc (torch's conversion rounds toward zero: "
          "(torch.rand(n) * T).long() gives ids), to bool: ne(a, 0)")
def _to_copy(r, node, a, *args, dtype=None, **kwargs):
    dst = r.torch_dtype(node)
    if r.is_ids(a):
        return a if dst == "int" else r.tp.to_f64(a)
    v = r.f(a)
    if dst == "float" or dst == r.torch_dtype(node.args[0]):
        return v
    if dst == "bool":
        return v if r.torch_dtype(node.args[0]) == "bool" else r.tp.ne(v, 0.0)
    return v if r.is_integral(v) else r.tp.trunc(v)


@aten("aten.permute.default", needs=("permute",),
      doc="permute (a swap of the last two axes: transpose; the identity: no node)")
def _permute(r, node, a, dims):
    return r.permute(r.value(a), list(dims))


def _strided_sources(node):
    """For ``as_strided(x, size, stride, offset)``: the flat (row-major) index into ``x``
    of each output element, in row-major order, from the memory layout torch gives ``x``
    (its strides and storage offset), or a reason it is not a read of ``x``'s elements."""
    val = node.args[0].meta["val"]
    shape, strides = [int(d) for d in val.shape], [int(d) for d in val.stride()]
    base = int(val.storage_offset())
    size, stride = [int(d) for d in node.args[1]], [int(d) for d in node.args[2]]
    offset = base if len(node.args) < 4 or node.args[3] is None else int(node.args[3])
    def positions(start, dims, steps):     # storage position of each element, row-major
        pos = np.full(dims, start, dtype=np.int64)
        for axis, (d, st) in enumerate(zip(dims, steps)):
            pos = pos + (np.arange(d, dtype=np.int64) * st).reshape(
                [d if k == axis else 1 for k in range(len(dims))])
        return pos.reshape(-1)

    held = positions(base, shape, strides)          # x's elements, by flat index
    if len(np.unique(held)) != len(held):
        return None, "its input is itself an overlapping (expanded) view"
    order = np.argsort(held, kind="stable")
    read = positions(offset, size, stride)
    at = np.searchsorted(held[order], read)
    found = at < len(held)
    found[found] = held[order][at[found]] == read[found]
    if not found.all():
        return None, "it reads memory outside its input"
    return order[at].astype(np.int64), ""


def _as_box(sources, shape):
    """``(starts, stops, steps)`` where ``sources`` (flat indices into ``shape``) are a
    slice of each axis enumerated in row-major order, else None."""
    if not len(sources):
        return None
    coords = np.unravel_index(sources, shape)
    box = []
    for c in coords:
        values = np.unique(c)
        step = int(values[1] - values[0]) if len(values) > 1 else 1
        if step < 1 or not np.array_equal(values, np.arange(values[0], values[-1] + 1, step)):
            return None
        box.append((int(values[0]), int(values[-1]) + 1, step, len(values)))
    grid = np.ix_(*[np.arange(a, b, st) for a, b, st, _ in box])
    want = np.ravel_multi_index(grid, shape).reshape(-1)
    return box if np.array_equal(want, sources) else None


@aten("aten.as_strided.default",
      doc="where its strides are a reshape, a permute or a slice of its input's layout "
          "(torch's adaptive_avg_pool2d on a channels-last tensor): that op; any other "
          "as_strided (overlapping windows, memory outside the input) is refused")
def _as_strided(r, node, a, size, stride, storage_offset=None):
    shape = list(r.tshape(node.args[0]))
    out_shape = r.shape(node)
    sources, why = _strided_sources(node)
    if sources is None:
        raise Unsupported(f"as_strided: {why}")
    v = r.value(a)
    n = math.prod(shape)
    if len(sources) == n and np.array_equal(sources, np.arange(n)):
        return r.reshape(v, out_shape)                                  # a reshape
    if len(sources) == n and len(shape) <= 6:
        grid = np.arange(n).reshape(shape)
        for perm in itertools.permutations(range(len(shape))):
            if np.array_equal(grid.transpose(perm).reshape(-1), sources):
                return r.reshape(r.permute(v, list(perm)), out_shape)   # a permute
    box = _as_box(sources, shape)
    if box is not None:                                                 # a slice
        for axis, (start, stop, step, _) in enumerate(box):
            v = r.slice_axis(v, axis, start, stop, step)
        return r.reshape(v, out_shape)
    raise Unsupported("as_strided whose strides are not a reshape, permute or slice of "
                      "its input (overlapping windows: use unfold)")


@aten("aten.t.default", doc="transpose (of a 2-dim tensor)")
def _t(r, node, a):
    v = r.value(a)
    return v if len(v.shape) < 2 else r.tp.transpose(v)


@aten("aten.transpose.int", needs=("permute",), doc="as permute")
def _transpose(r, node, a, d0, d1):
    v = r.value(a)
    n = len(r.tshape(node))
    perm = list(range(n))
    d0, d1 = d0 % n, d1 % n
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return r.permute(v, perm)


@aten("aten.expand.default", needs=("expand",),
      doc="expand (the gradient summed back in reduce_to_shape's order)")
def _expand(r, node, a, size, implicit=False):
    return r.expand(r.f(a), r.shape(node))


@aten("aten.slice.Tensor", doc="slice (with steps where the step is > 1)")
def _slice(r, node, a, dim=0, start=None, end=None, step=1):
    v = r.value(a)
    shape = list(r.tshape(node.args[0]))
    if not shape:
        raise Unsupported("slice of a 0-dim tensor")
    dim %= len(shape)
    start, end, _ = slice(start, end, step).indices(shape[dim])
    return r.slice_axis(v, dim, start, end, step)


@aten("aten.select.int", doc="slice + reshape")
def _select(r, node, a, dim, index):
    v = r.value(a)
    shape = list(r.tshape(node.args[0]))
    dim %= len(shape)
    index %= shape[dim]
    return r.reshape(r.slice_axis(v, dim, index, index + 1, 1), r.shape(node))


@aten("aten.copy.default", needs=("expand",),
      doc="src broadcast to dst's shape (the functional form of dst.copy_(src), which "
          "in-place slice assignment decomposes to); no gradient to dst, whose values it "
          "replaces")
def _copy(r, node, dst, src, non_blocking=False):
    want, have = r.torch_dtype(node.args[0]), r.torch_dtype(node.args[1])
    if want != have and not (want == "float" and have in ("int", "bool")):
        raise Unsupported(f"a copy of {have} data into a {want} tensor")
    return r.expand(r.f(src), r.shape(node))


@aten("aten.slice_scatter.default", needs=("cat", "where"),
      doc="base with src in base[start:end:step] along dim (in-place slice assignment): "
          "step 1, cat of base's head, src and base's tail; a step, where(grid, src spread "
          "by the step, base) in between; exact copies, each gradient torch's")
def _slice_scatter(r, node, base, src, dim=0, start=None, end=None, step=1):
    shape = list(r.tshape(node))
    dim %= len(shape)
    return _scatter_into(r, r.f(base), r.f(src), shape, dim,
                         *slice(start, end, step).indices(shape[dim]))


@aten("aten.select_scatter.default", needs=("cat", "where"),
      doc="slice_scatter of src (an axis of one inserted) at index")
def _select_scatter(r, node, base, src, dim, index):
    shape = list(r.tshape(node))
    dim %= len(shape)
    index %= shape[dim]
    v = r.reshape(r.f(src), shape[:dim] + [1] + shape[dim + 1:])
    return _scatter_into(r, r.f(base), v, shape, dim, index, index + 1, 1)


def _scatter_into(r, b, v, shape, dim, start, end, step):
    """b (of ``shape``) with v in b[start:end:step] along ``dim``."""
    m = len(range(start, end, step))
    if m == 0:
        return b
    last = start + (m - 1) * step + 1         # one past the last position v fills
    if step > 1:                              # v's rows at the grid, b's in between
        grid = np.zeros([last - start] + [1] * (len(shape) - 1 - dim))
        grid[::step] = 1.0
        v = r.tp.where(r.tp.const(grid), spread(r.tp, v, dim, step),
                       r.slice_axis(b, dim, start, last, 1))
    parts = [r.slice_axis(b, dim, 0, start, 1)] if start > 0 else []
    parts.append(v)
    if last < shape[dim]:
        parts.append(r.slice_axis(b, dim, last, shape[dim], 1))
    return parts[0] if len(parts) == 1 else r.tp.cat(parts, dim)


@aten("aten.diagonal.default", needs=("permute",),
      doc="permute of dim1, dim2 to the end, reshape, a slice with step (columns + 1) "
          "from the offset: exact copies")
def _diagonal(r, node, a, offset=0, dim1=0, dim2=1):
    v = r.f(a)
    shape = list(r.tshape(node.args[0]))
    n = len(shape)
    d1, d2 = dim1 % n, dim2 % n
    rest = [d for d in range(n) if d not in (d1, d2)]
    rows, cols = shape[d1], shape[d2]
    count = min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols)
    if count <= 0:
        raise Unsupported("an empty diagonal (gradtool values have at least one element)")
    flat = r.reshape(r.permute(v, rest + [d1, d2]), [shape[d] for d in rest] + [rows * cols])
    start = offset if offset >= 0 else -offset * cols
    out = r.slice_axis(flat, len(rest), start, start + (count - 1) * (cols + 1) + 1, cols + 1)
    return r.reshape(out, r.shape(node))


@aten("aten.split_with_sizes.default", "aten.split.Tensor", doc="slices")
def _split(r, node, a, sizes, dim=0):
    v = r.value(a)
    shape = list(r.tshape(node.args[0]))
    dim %= len(shape)
    if isinstance(sizes, int):
        sizes = [min(sizes, shape[dim] - s) for s in range(0, shape[dim], sizes)]
    out, start = [], 0
    for n in sizes:
        out.append(r.slice_axis(v, dim, start, start + n, 1))
        start += n
    return tuple(out)


@aten("aten.unbind.int", doc="select of each index")
def _unbind(r, node, a, dim=0):
    v = r.value(a)
    shape = list(r.tshape(node.args[0]))
    dim %= len(shape)
    keep = shape[:dim] + shape[dim + 1:]
    return tuple(r.reshape(r.slice_axis(v, dim, i, i + 1, 1), keep or [1])
                 for i in range(shape[dim]))


@aten("aten.cat.default", needs=("cat",), doc="cat (N inputs; empty ones dropped)")
def _cat(r, node, tensors, dim=0):
    # an empty input (a KV cache's first cat starts from torch.tensor([])) is dropped
    # before anything is lifted: a [0] const is not a tape value
    vals = [r.value(t) for t, s in zip(tensors, [r.tshape(t) for t in node.args[0]])
            if 0 not in s]
    if not vals:
        raise Unsupported("cat of empty tensors only (a zero-size result)")
    ndim = len(r.tshape(node))
    dim %= ndim
    return vals[0] if len(vals) == 1 else r.tp.cat(vals, dim)


@aten("aten.stack.default", needs=("cat",), doc="unsqueeze (reshape) of each input, then cat")
def _stack(r, node, tensors, dim=0):
    shape = list(r.tshape(node.args[0][0]))
    dim %= len(shape) + 1
    parts = [r.reshape(r.f(t), shape[:dim] + [1] + shape[dim:]) for t in tensors]
    return parts[0] if len(parts) == 1 else r.tp.cat(parts, dim)


@aten("aten.flip.default", needs=("flip",),
      doc="flip (index_select by descending ids: copies)")
def _flip(r, node, a, dims):
    return r.tp.flip(r.value(a), dims)


@aten("aten.repeat.default", needs=("expand",),
      doc="reshape with a size-1 axis before each, expand, reshape (exact copies)")
def _repeat(r, node, a, repeats):
    v = r.value(a)
    shape = r.tshape(node.args[0])
    shape = [1] * (len(repeats) - len(shape)) + shape
    inter = [d for s in shape for d in (1, s)]
    target = [d for rep, s in zip(repeats, shape) for d in (rep, s)]
    v = r.expand(r.reshape(v, inter), target)
    return r.reshape(v, r.shape(node))


@aten("aten.constant_pad_nd.default", needs=("pad",),
      doc="pad (cat with const blocks of the pad value); negative widths crop (slices)")
def _pad(r, node, a, pad, value=0.0):
    v = r.f(a)
    n = len(v.shape)
    widths = [(0, 0)] * n
    for i in range(len(pad) // 2):
        widths[n - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    for axis, (lo, hi) in enumerate(widths):
        if min(lo, hi) < 0:
            start, stop = max(0, -lo), v.shape[axis] - max(0, -hi)
            if stop <= start:
                raise Unsupported("padding that crops a whole axis away")
            v = r.tp.narrow(v, axis, start, stop)
            widths[axis] = (max(0, lo), max(0, hi))
    if any(lo or hi for lo, hi in widths):
        v = r.tp.pad(v, widths, float(value))
    return v
