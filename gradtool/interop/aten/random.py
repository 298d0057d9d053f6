"""Dropout and random draws: gradtool.nn's counter-based draws over the tape's rng slot."""

from __future__ import annotations

from ... import nn
from .registry import Unsupported, aten, is_num


def dropout_of(r, x, p, train, record=None):
    """``record(x, p)`` (default gradtool.nn.dropout) in train mode (the tape's rng slot
    decides per step), x itself in eval mode."""
    v = r.value(x)
    if train is None or not train:
        return v
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
        raise Unsupported(f"dropout probability {p!r} (a number in [0, 1] only)")
    return (record or nn.dropout)(r.f(x), float(p))


@aten("aten.native_dropout.default", needs=("nn.dropout",),
      doc="gradtool.nn.dropout in train mode (counter-based masks: the rng slot; the mask "
          "output is not recorded), the same value in eval mode")
def _native_dropout(r, node, x, p, train):
    return (dropout_of(r, x, p, train), None)


@aten("aten.dropout.default", needs=("nn.dropout",),
      doc="gradtool.nn.dropout in train mode, the same value (no node) in eval mode")
def _dropout(r, node, x, p, train):
    return dropout_of(r, x, p, train)


def _custom_dropout(record):
    """The entry of one of the importer's custom dropout ops (torch's, which
    run_decompositions would make bernoulli): ``record(x, p, channels)`` in train mode, the
    same value in eval mode."""
    def entry(r, node, x, p, train, channels=False):
        return dropout_of(r, x, p, train, lambda v, q: record(v, q, bool(channels)))
    return entry


aten("gradtool.feature_dropout.default", needs=("nn.feature_dropout",),
     doc="torch's feature_dropout, which the importer turns into this custom op before "
         "run_decompositions (which would make it bernoulli): gradtool.nn.feature_dropout "
         "(Dropout1d/2d/3d: one draw per sample and channel) in train mode, the same value "
         "in eval mode")(_custom_dropout(lambda v, q, channels: nn.feature_dropout(v, q)))
aten("gradtool.alpha_dropout.default", needs=("nn.alpha_dropout",),
     doc="torch's alpha_dropout and feature_alpha_dropout, which the importer turns into "
         "this custom op before run_decompositions: gradtool.nn.alpha_dropout "
         "(AlphaDropout, FeatureAlphaDropout: channels) in train mode, the same value in "
         "eval mode")(_custom_dropout(
             lambda v, q, channels: nn.alpha_dropout(v, q, channels=channels)))


@aten("aten.bernoulli.p", "aten.bernoulli.default", needs=("nn.bernoulli",),
      doc="gradtool.nn.bernoulli: lt(uniform, p) over the rng slot (counter-based draws, no "
          "gradient); with the train flag 0 (validation) the mean p, so x * mask / p is x "
          "(stochastic depth, DropPath); bernoulli.default (probabilities a tensor) kept "
          "out of run_decompositions, which would draw it with rand")
def _bernoulli(r, node, x, p=None, generator=None):
    if p is None:                                   # bernoulli(probs)
        return nn.bernoulli(r.f(x))
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
        raise Unsupported(f"bernoulli with p {p!r} (a number in [0, 1] only)")
    return nn.bernoulli(float(p), shape=r.shape(node), tape=r.tp)


_NORMAL_DOC = ("gradtool.nn.normal (Box-Muller on uniform over the rng slot: counter-based, "
               "the same bits on every backend; no gradient)")


@aten("aten.randn.default", "aten.randn_like.default", needs=("nn.normal",),
      doc=_NORMAL_DOC + "; with the train flag 0 (validation) each draw is +0.0")
def _randn(r, node, *args, **kwargs):
    return nn.normal(r.shape(node), tape=r.tp)


@aten("aten.normal.float_float", "aten.normal.Tensor_float", "aten.normal.float_Tensor",
      "aten.normal.Tensor_Tensor", needs=("nn.normal",),
      doc=_NORMAL_DOC + ", times std plus mean; with the train flag 0 (validation) each "
          "draw is its mean")
def _normal(r, node, *args, **kwargs):
    return _scaled_normal(r, node, args, kwargs)


@aten("aten.normal_functional.default", needs=("nn.normal",),
      doc="x.normal_(mean, std): as aten.normal")
def _normal_functional(r, node, x, *args, **kwargs):
    return _scaled_normal(r, node, args, kwargs)


def _scaled_normal(r, node, args, kwargs):
    """nn.normal of the node's shape times std plus mean (numbers: muls and adds)."""
    z = nn.normal(r.shape(node), tape=r.tp)
    mean, std = (list(args) + [kwargs.get("mean", 0.0), kwargs.get("std", 1.0)])[:2]
    tp = r.tp
    scaled = tp.muls(z, float(std)) if is_num(std) else tp.mul(z, r.f(std))
    return tp.adds(scaled, float(mean)) if is_num(mean) else tp.add(scaled, r.f(mean))


@aten("aten.rand.default", "aten.rand_like.default", needs=("nn.rand",),
      doc="gradtool.nn.rand (the uniform op over the rng slot: counter-based, the same bits "
          "on every backend; no gradient); with the train flag 0 (validation) each draw is "
          "its mean (0.5)")
def _rand(r, node, *args, **kwargs):
    return nn.rand(r.shape(node), tape=r.tp, low=0.0, high=1.0)


@aten("aten.uniform.default", needs=("nn.rand",),
      doc="x.uniform_(from, to): gradtool.nn.rand scaled to [from, to); with the train flag "
          "0 (validation) each draw is its mean")
def _uniform(r, node, x, *args, **kwargs):
    low, high = (list(args) + [kwargs.get("from", 0.0), kwargs.get("to", 1.0)])[:2]
    return nn.rand(r.shape(node), tape=r.tp, low=low, high=high)


_RANDINT_DOC = ("gradtool.nn.randint: floor(uniform * (high - low)) + low over the rng "
                "slot, integer-valued (ids: a diffusion model's timesteps); with the train "
                "flag 0 (validation) each draw is the middle value low + (high - low - 1) "
                "// 2")


@aten("aten.randint.default", "aten.randint.low", needs=("nn.randint",), doc=_RANDINT_DOC)
def _randint(r, node, *args, **kwargs):
    return _randint_of(r, node, args, kwargs)


@aten("aten.randint_like.default", "aten.randint_like.low_dtype", "aten.random.to",
      needs=("nn.randint",), doc="as aten.randint, of x's shape (x.random_(to) too)")
def _randint_like(r, node, x, *args, **kwargs):
    return _randint_of(r, node, args, kwargs)


def _randint_of(r, node, taken, kwargs):
    """nn.randint over [low, high) from the numbers among ``taken`` (a size is a list)."""
    numbers = [a for a in taken if not isinstance(a, (list, tuple))]   # size: a list
    low, high = kwargs.get("low", 0), kwargs.get("high", kwargs.get("to"))
    if len(numbers) == 2:
        low, high = numbers
    elif numbers:
        high = numbers[0]
    if any(isinstance(v, bool) or not isinstance(v, int) or abs(v) > 2 ** 53
           for v in (low, high)) or not 0 < high - low <= 2 ** 53:
        raise Unsupported(f"randint over [{low!r}, {high!r}) (gradtool draws integers in "
                          f"[low, high) with low < high <= low + 2^53, both within +-2^53)")
    return nn.randint(low, high, r.shape(node), tape=r.tp)


@aten("aten.multinomial.default", needs=("nn.multinomial",),
      doc="gradtool.nn.multinomial: the inverse CDF of the weights over the rng slot "
          "(cumsum, one uniform per draw, a count of comparisons), integer-valued ids; "
          "without replacement one sample per row; an invalid row gives NaN ids; with the "
          "train flag 0 (validation) every draw is the row's most likely category")
def _multinomial(r, node, w, num_samples, replacement=False, generator=None):
    if not replacement and num_samples > 1:
        raise Unsupported(f"multinomial of {num_samples} samples without replacement "
                          f"(gradtool draws one per row, or any number with replacement)")
    return nn.multinomial(r.f(w), int(num_samples), bool(replacement))


@aten("aten.randperm.default", needs=("nn.randperm", "sort"),
      doc="gradtool.nn.randperm: the ids that sort a uniform draw over the rng slot "
          "(Tape.sort, n x n comparisons), integer-valued; with the train flag 0 "
          "(validation) the identity 0 .. n-1")
def _randperm(r, node, n, *args, **kwargs):
    return nn.randperm(int(n), tape=r.tp)
