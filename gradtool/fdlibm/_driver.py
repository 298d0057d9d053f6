"""The blocked driver every function runs on.

``_run`` applies a function's kernel ``_<name>_block`` to blocks of
``_BLOCK`` elements in scratch buffers that are 64-byte aligned
(``_aligned_empty``, ``_Scratch``) and kept per thread between calls
(``_take_scratch``, ``_return_scratch``), then recomputes the lanes the
kernel reported with the function's reference path ``_<name>_ref``.
``_patch`` is how a kernel settles its flagged lanes (early returns written
on the spot, the rest reported), and ``_masked`` is the shape of every
``_<name>_ref``: early returns first, then the core on the remaining lanes.

Nothing here computes on the values themselves; the arithmetic is in the
kernels and in ``_common``.
"""

from __future__ import annotations

import threading

import numpy as np

from ._common import _F64

# numpy evaluates one operation over a whole array at a time, so every
# operation of a kernel is one pass over a block held in the caches.  Each
# block also costs ~25 us of fixed call overhead (~45 ufunc calls), hence
# large blocks; measured here, 2^16 elements is the fastest: from ~72k on,
# the ~9 live rows of a block no longer fit in the caches and passes slow
# down abruptly.
_BLOCK = 1 << 16


def _aligned_empty(shape, dtype) -> np.ndarray:
    """np.empty(shape, dtype) starting on a 64-byte boundary.  numpy's
    allocator only guarantees 16 bytes; scratch rows at 16 mod 32 bytes made
    every kernel ~8% slower (measured: log 7.9 instead of 7.3 ns per
    element, tanh 21.4 instead of 19.8), SIMD loads then straddling cache
    lines, so timings changed with whatever the allocator handed out."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class _Scratch:
    """Block buffers: 11 float64 rows (kernels view some as uint64/int64),
    4 bool rows, and the memory of float rows 7-10 as one (n, 4) array
    (for expm1's table rows; a kernel uses either those rows or this).
    ``views(n)`` gives the first n elements (rows) of each."""

    def __init__(self, n: int):
        self.n = n
        m = -(-n // 64) * 64                    # every row starts on a cache line
        f = _aligned_empty((11, m), _F64)
        self.full = ([a[:n] for a in f], [a[:n] for a in _aligned_empty((4, m), np.bool_)],
                     f[7:].reshape(-1)[:4 * n].reshape(n, 4))

    def views(self, n: int):
        if n == self.n:
            return self.full
        rows, bools, quad = self.full
        return ([a[:n] for a in rows], [a[:n] for a in bools],
                quad.reshape(-1)[:4 * n].reshape(n, 4))


# The scratch (~6 MB for a full block) is kept per thread between calls:
# allocating it afresh costs page faults, up to ~4 ns per element of a 10^6
# call depending on the allocator's state (measured: log took 8 to 11 ns per
# element with fresh scratch, a steady ~7.5 with reused scratch).
_tls = threading.local()


def _take_scratch(n: int) -> _Scratch:
    """This thread's scratch if it is large enough, else a new one; while a
    call uses it the slot is empty, so a nested call cannot share it."""
    s = getattr(_tls, "scratch", None)
    _tls.scratch = None
    return s if s is not None and s.n >= n else _Scratch(n)


def _return_scratch(s: _Scratch) -> None:
    kept = getattr(_tls, "scratch", None)
    if kept is None or kept.n < s.n:
        _tls.scratch = s


def _run(x, kernel, ref) -> np.ndarray:
    """Apply ``kernel`` block by block; lanes it reports are redone by ``ref``
    in one call at the end (the reference path is slow per call, not per lane)."""
    x = np.asarray(x, dtype=_F64)
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.shape, _F64)
    n = flat.size
    if n:
        scratch = _take_scratch(min(n, _BLOCK))
        redo = []
        try:
            with np.errstate(all="ignore"):  # kernels compute garbage in flagged lanes
                for start in range(0, n, _BLOCK):
                    stop = min(start + _BLOCK, n)
                    idx = kernel(flat[start:stop], out[start:stop], scratch.views(stop - start))
                    if idx is not None and idx.size:
                        redo.append(idx + start)
        finally:
            _return_scratch(scratch)
        if redo:
            idx = np.concatenate(redo)
            out[idx] = ref(flat[idx])
    return out.reshape(x.shape)


def _run_branches(x, fn) -> np.ndarray:
    """``fn`` (a function evaluating a 1-d block, the branch-by-branch functions erf, sin,
    cos and log1p) over blocks of ``_BLOCK`` elements, so that its temporaries stay in
    the caches; the result has x's shape.  Each element's value does not depend on the
    block it is in."""
    x = np.asarray(x, dtype=_F64)
    flat = np.ascontiguousarray(x).reshape(-1)
    if flat.size <= _BLOCK:
        return fn(flat).reshape(x.shape)
    out = np.empty(flat.shape, _F64)
    for start in range(0, flat.size, _BLOCK):
        out[start:start + _BLOCK] = fn(flat[start:start + _BLOCK])
    return out.reshape(x.shape)


def _by_branch(flat, branches, at_inf: float, at_minus_inf: float) -> np.ndarray:
    """The branch-by-branch evaluation of a 1-d block: each element takes the first of
    ``branches`` (pairs ``(mask, f)``, in fdlibm's order) whose mask holds there, ``f``
    applied to those elements at once; the elements no mask holds are inf (``at_inf``),
    -inf (``at_minus_inf``) and NaN (the canonical NaN)."""
    from ._common import NAN
    out = np.empty(flat.shape, _F64)
    done = np.zeros(flat.shape, bool)
    for mask, f in branches:
        i = np.flatnonzero(mask & ~done)
        if i.size:
            out[i] = f(flat[i])
        done |= mask
    i = np.flatnonzero(~done)
    if i.size:
        v = flat[i]
        out[i] = np.where(v == np.inf, at_inf, np.where(v == -np.inf, at_minus_inf, NAN))
    return out


def _patch(x, out, flagged, bad, special):
    """Settle the kernel's flagged lanes: early-return cases (specials, tiny,
    huge) are written here; lanes that need fdlibm's full computation are
    returned (block-relative indices) for the driver to redo with the ref."""
    if not flagged:
        return None
    i = np.flatnonzero(bad)
    if i.size == 0:
        return None
    y, rest = special(x[i])
    out[i] = y
    return i[rest]


def _masked(x, special, core) -> np.ndarray:
    """The shape of every ``_<name>_ref``: fdlibm's early returns first
    (``special(x)`` gives (y, rest), y final where rest is False), then
    ``core`` on the remaining lanes only, so it never sees a special value."""
    x = np.array(x, dtype=_F64).reshape(-1)
    with np.errstate(all="ignore"):
        y, rest = special(x)
        if rest.any():
            y[rest] = core(x[rest])
    return y
