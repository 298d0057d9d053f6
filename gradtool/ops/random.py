"""The table's counter-based random numbers: ``uniform``.

``uniform(ctr, shape=[...], salt=k)``: element i (row-major) of the [*shape] output is
``numerics.uniform``'s value for (salt, step = ctr[0], shard = ctr[1], i): the splitmix64
finalizer chained over the four integers, ``(h >> 11) * 2^-53``, a multiple of 2^-53 in
[0, 1).  Integer arithmetic only, so numpy, the host C build and CUDA give the same bits
by construction (``numerics``: "The counter-based generator").  ``ctr`` is a [3] float64
const leaf: the tape's rng slot (``Tape.rng``, reserved name ``gradtool.rng``), whose
ctr[2] (the train flag) this op does not read.  A counter that is not a whole number in
[0, 2^53) gives NaN everywhere; such values are refused wherever a leaf is set (the
recorder, ``set_value``, the loader, the device's ``set_input``), so a tape never runs
with one.  No gradient: the node never requires grad and the backward walk stops there.
"""

from __future__ import annotations

from .. import numerics as nx
from ..errors import ShapeError
from .spec import Attr, OpSpec, _register, format_shape, kernel

RNG_SHAPE = (3,)                # (step, shard, train flag)

kernel("k_uniform", "out:w ctr:r salt:i",
       "out[i] = (mix(mix(mix(mix(salt) ^ step) ^ shard) ^ i) >> 11) * 2^-53, step = ctr[0], "
       "shard = ctr[1] (numerics.uniform; NaN everywhere for a counter that is not a whole "
       "number in [0, 2^53))")


def _uniform_shape(sa, _sb, attrs):
    if tuple(sa) != RNG_SHAPE:
        raise ShapeError(f"uniform reads a [3] counter (step, shard, train flag: the rng "
                         f"slot), got {format_shape(sa)}")
    target = tuple(attrs["shape"])
    if not target or any(d < 1 for d in target):
        raise ShapeError(f"uniform shape {format_shape(target)} must have dims >= 1")
    return target


def _uniform_f(a, b, s, at):
    return nx.uniform(tuple(at["shape"]), at["salt"], a[0], a[1])


_register(OpSpec("uniform", "uniform", 1, "counter-based uniform numbers in [0, 1): element "
                 "i is (mix(mix(mix(mix(salt) ^ ctr[0]) ^ ctr[1]) ^ i) >> 11) * 2^-53, "
                 "splitmix64's mix (numerics.uniform); ctr is the [3] rng slot", _uniform_shape,
                 _uniform_f, None, kernels=("k_uniform",), grad_inputs=(), rng_input=True,
                 attrs=(Attr("shape", "shape", "the output's shape"),
                        Attr("salt", "natural", "which stream: an integer in [0, 2^63)",
                             default=0))))


# ── the rng slot ───────────────────────────────────────────────────────────

RNG_NAME = "gradtool.rng"       # the reserved name of a tape's one rng slot
RNG_RECORDED = (0.0, 0.0, 1.0)  # its value when recorded: step 0, shard 0, train flag 1


def bad_rng(values, shape=None, dtype="f64", limit: int = nx.COUNTER_LIMIT) -> str:
    """'' when ``values`` (or a const of ``shape``/``dtype``) can be the rng slot: a [3]
    float64 whose step and shard (values[0], values[1]) are whole numbers in [0, 2^53)
    (in [0, ``limit``): a float32 device arena holds them exactly below 2^24); else what
    is wrong, for a one-line message."""
    shape = tuple(values.shape) if shape is None else tuple(shape)
    if dtype != "f64" or shape != RNG_SHAPE:
        return (f"the rng slot {RNG_NAME!r} must be a float64 const of shape [3] (step, "
                f"shard, train flag), got {'an integer ' if dtype != 'f64' else ''}"
                f"{format_shape(shape)}")
    if values is not None:
        for k, what in ((0, "step"), (1, "shard")):
            v = float(values[k])
            if not (nx.uniform_counters_ok(v, 0.0) and v < limit):
                bound = "2^53" if limit == nx.COUNTER_LIMIT else str(limit)
                return (f"the rng slot {RNG_NAME!r}: its {what} (entry {k}) must be a whole "
                        f"number in [0, {bound}), got {v!r}")
    return ""
