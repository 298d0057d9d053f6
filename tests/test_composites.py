"""gradtool.composites: every public composite is callable from a ``gt.Tape`` without torch,
forward and backward; and ``gradtool.nn`` / ``gradtool.layout`` keep every name they had.

The first check runs in a fresh interpreter with torch made unimportable
(``sys.modules["torch"] = None`` before gradtool is imported): each composite the
families list in ``__all__`` is called by its recipe below on small valid inputs, every
float output goes into a loss (times a param of its shape, so that draws no param reaches
are checked as well), ``backward`` runs, and ``fd_check`` compares the gradient of every
param with central differences.  A family's composite without a recipe fails the test,
so a new composite is covered by adding one line here.  The values themselves are
compared with torch float64 in tests/test_nn.py, test_layout.py, test_dropout.py and
test_conv.py.
"""

import importlib
import json
import os
import pkgutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

# the modules of gradtool.composites that are not families of composites
NOT_FAMILIES = {"methods"}          # the Tape-method table (name -> composite)


def families() -> dict:
    """{family name: module} of gradtool.composites (its modules not named with a
    leading underscore, but the method table)."""
    import gradtool.composites as comp
    names = sorted(m.name for m in pkgutil.iter_modules(comp.__path__)
                   if not m.name.startswith("_") and m.name not in NOT_FAMILIES)
    return {n: importlib.import_module(f"gradtool.composites.{n}") for n in names}


def composites() -> dict:
    """{"family.name": function} of every public composite."""
    return {f"{fam}.{name}": getattr(mod, name)
            for fam, mod in families().items() for name in getattr(mod, "__all__", ())}


# ── the recipes: (fn, tp, P, C, I) -> outputs ──────────────────────────────
# P(*shape): a param of standard normal values; C(*shape, low=, high=): a const of uniform
# values; I(values): an i64 const.  Small valid inputs; random values keep max, sort and
# floor away from their ties.

RECIPES = {
    # dense
    "dense.linear": lambda fn, tp, P, C, I: (fn(P(2, 3), P(3, 4), P(4)),
                                             fn(P(2, 2, 3), P(3, 4))),
    "dense.silu": lambda fn, tp, P, C, I: fn(P(2, 3)),
    "dense.gelu": lambda fn, tp, P, C, I: (fn(P(2, 3)), fn(P(2, 3), approximate="tanh")),
    # norms
    "norms.rms_norm": lambda fn, tp, P, C, I: fn(P(2, 4), P(4)),
    "norms.layer_norm": lambda fn, tp, P, C, I: fn(P(2, 4), P(4), P(4)),
    "norms.native_layer_norm": lambda fn, tp, P, C, I: fn(P(2, 3, 4), 2, P(3, 4), P(3, 4)),
    "norms.group_norm": lambda fn, tp, P, C, I: fn(P(2, 4, 3), 2, P(4), P(4)),
    "norms.batch_norm2d": lambda fn, tp, P, C, I: fn(P(2, 3, 2, 2), P(3), P(3), C(3),
                                                     C(3, low=0.5, high=2.0)),
    "norms.batch_norm2d_train": lambda fn, tp, P, C, I: fn(P(2, 3, 2, 2), P(3), P(3), C(3),
                                                           C(3, low=0.5, high=2.0)),
    # losses
    "losses.softmax_cross_entropy": lambda fn, tp, P, C, I: fn(P(3, 4), I([[1], [0], [3]])),
    "losses.mse": lambda fn, tp, P, C, I: fn(P(2, 3), C(2, 3)),
    # random: the draws over the tape's rng slot (train flag 1 on a new tape)
    "random.rng_slot": lambda fn, tp, P, C, I: fn(tp),
    "random.dropout": lambda fn, tp, P, C, I: fn(P(4, 5), 0.3),
    "random.feature_dropout": lambda fn, tp, P, C, I: fn(P(2, 3, 4), 0.5),
    "random.alpha_dropout": lambda fn, tp, P, C, I: (fn(P(4, 5), 0.2),
                                                     fn(P(2, 3, 2), 0.4, channels=True)),
    "random.bernoulli": lambda fn, tp, P, C, I: (fn(0.3, [4, 5], tape=tp), fn(C(3, 4))),
    "random.normal": lambda fn, tp, P, C, I: fn([3, 4], tp),
    "random.rand": lambda fn, tp, P, C, I: (fn([3, 4], tp), fn([2, 2], tp, -1.0, 2.0)),
    "random.randint": lambda fn, tp, P, C, I: fn(-2, 5, [3, 4], tp),
    "random.randperm": lambda fn, tp, P, C, I: fn(6, tp),
    "random.multinomial": lambda fn, tp, P, C, I: (fn(C(2, 5, low=0.1, high=1.0)),
                                                   fn(C(3, low=0.1), 4, replacement=True)),
    # conv
    "conv.conv1d": lambda fn, tp, P, C, I: fn(P(1, 2, 5), P(3, 2, 2), P(3), padding=1),
    "conv.conv2d": lambda fn, tp, P, C, I: fn(P(1, 2, 4, 4), P(4, 1, 2, 2), P(4), stride=2,
                                              padding=1, groups=2),
    "conv.conv3d": lambda fn, tp, P, C, I: fn(P(1, 2, 3, 3, 3), P(2, 2, 2, 2, 2), P(2),
                                              padding=1),
    "conv.conv_transpose1d": lambda fn, tp, P, C, I: fn(P(1, 2, 3), P(2, 3, 2), P(3),
                                                        stride=2),
    "conv.conv_transpose2d": lambda fn, tp, P, C, I: fn(P(1, 2, 3, 3), P(2, 3, 2, 2), P(3),
                                                        stride=2, padding=1,
                                                        output_padding=1),
    "conv.conv_transpose3d": lambda fn, tp, P, C, I: fn(P(1, 2, 2, 2, 2), P(2, 2, 2, 2, 2),
                                                        P(2), stride=2),
    # pool
    "pool.max_pool2d": lambda fn, tp, P, C, I: fn(P(1, 2, 4, 4), 2),
    "pool.avg_pool2d": lambda fn, tp, P, C, I: fn(P(1, 2, 5, 5), 3, stride=2, padding=1),
    "pool.max_pool3d": lambda fn, tp, P, C, I: fn(P(1, 1, 4, 4, 4), 2),
    "pool.avg_pool3d": lambda fn, tp, P, C, I: fn(P(1, 1, 4, 4, 4), 2, padding=1),
    "pool.global_avg_pool2d": lambda fn, tp, P, C, I: fn(P(1, 2, 3, 3)),
    "pool.adaptive_avg_pool2d": lambda fn, tp, P, C, I: (fn(P(1, 2, 5, 5), 3),
                                                         fn(P(1, 2, 4, 4), 2)),
    "pool.adaptive_max_pool2d": lambda fn, tp, P, C, I: (fn(P(1, 2, 5, 5), 3),
                                                         fn(P(1, 2, 4, 4), 2)),
    "pool.adaptive_avg_pool3d": lambda fn, tp, P, C, I: fn(P(1, 1, 3, 4, 5), 2),
    "pool.adaptive_max_pool3d": lambda fn, tp, P, C, I: fn(P(1, 1, 3, 4, 5), 2),
    # resample
    "resample.grid_sample": lambda fn, tp, P, C, I: fn(
        P(1, 2, 3, 4), tp.param(np.random.default_rng(5).uniform(-0.9, 0.9, (1, 2, 3, 2)))),
    "resample.upsample_bilinear2d": lambda fn, tp, P, C, I: (fn(P(1, 2, 3, 3), [5, 4]),
                                                             fn(P(1, 1, 3, 3), [6, 6],
                                                                align_corners=True)),
    # layout (tape first; each but spread and reshape_to is also a Tape method)
    "layout.spread": lambda fn, tp, P, C, I: fn(tp, P(2, 3), 1, 3),
    "layout.expand": lambda fn, tp, P, C, I: fn(tp, P(3, 1), [2, 3, 4]),
    "layout.reshape_to": lambda fn, tp, P, C, I: fn(tp, P(2, 3), [3, 2], "reshape_to"),
    "layout.unsqueeze": lambda fn, tp, P, C, I: fn(tp, P(2, 3), 1),
    "layout.squeeze": lambda fn, tp, P, C, I: fn(tp, P(2, 1, 3)),
    "layout.flatten": lambda fn, tp, P, C, I: fn(tp, P(2, 3, 4), 1),
    "layout.select": lambda fn, tp, P, C, I: fn(tp, P(3, 4), 1, -2),
    "layout.narrow": lambda fn, tp, P, C, I: fn(tp, P(3, 5), 1, 1, 5, 2),
    "layout.split": lambda fn, tp, P, C, I: fn(tp, P(5, 2), 2),
    "layout.cat": lambda fn, tp, P, C, I: fn(tp, [P(2, 3), P(1, 3), P(3, 3)], 0),
    "layout.stack": lambda fn, tp, P, C, I: fn(tp, [P(2, 3), P(2, 3)], 1),
    "layout.swapaxes": lambda fn, tp, P, C, I: fn(tp, P(2, 3, 4), 0, 2),
    "layout.pad": lambda fn, tp, P, C, I: fn(tp, P(2, 3), [(1, 0), (0, 2)], 1.5),
    "layout.index_select": lambda fn, tp, P, C, I: (fn(tp, P(4, 3), 0, [3, 1, 1]),
                                                    fn(tp, P(2, 4), 1, I([0, 3]))),
    "layout.index_add": lambda fn, tp, P, C, I: fn(tp, P(4, 3), 1, [2, 0], P(4, 2), 0.5),
    "layout.flip": lambda fn, tp, P, C, I: fn(tp, P(3, 4), (0, 1)),
    "layout.repeat_interleave": lambda fn, tp, P, C, I: fn(tp, P(2, 3), 2, 1),
    # reductions
    "reductions.reduce_axes": lambda fn, tp, P, C, I: tuple(
        fn(tp, op, P(2, 3, 4), (0, 2)) for op in ("sum", "mean", "max")),
    "reductions.variance": lambda fn, tp, P, C, I: fn(tp, P(3, 4), 1),
    "reductions.std": lambda fn, tp, P, C, I: fn(tp, P(3, 4), (0, 1), correction=0),
    "reductions.amin": lambda fn, tp, P, C, I: fn(tp, P(3, 4), 0, keepdims=True),
    "reductions.prod": lambda fn, tp, P, C, I: (fn(tp, P(3, 4), 1), fn(tp, P(2, 2))),
    "reductions.cumsum": lambda fn, tp, P, C, I: fn(tp, P(3, 4), 1),
    "reductions.cumprod": lambda fn, tp, P, C, I: fn(tp, P(3, 4), 0),
    "reductions.cummax": lambda fn, tp, P, C, I: fn(tp, P(3, 4), 1),
    "reductions.cummin": lambda fn, tp, P, C, I: fn(tp, P(3, 4), -1),
    "reductions.logcumsumexp": lambda fn, tp, P, C, I: fn(tp, P(3, 4), 1),
    # math (the importer's elementwise math; domains by a shift or a squash of P)
    "math.exp2": lambda fn, tp, P, C, I: fn(P(2, 3)),
    "math.log2": lambda fn, tp, P, C, I: fn(tp.adds(tp.abs(P(2, 3)), 0.5)),
    "math.log10": lambda fn, tp, P, C, I: fn(tp.adds(tp.abs(P(2, 3)), 0.5)),
    "math.tan": lambda fn, tp, P, C, I: fn(tp.muls(tp.tanh(P(2, 3)), 1.2)),
    "math.sinh": lambda fn, tp, P, C, I: fn(P(2, 3)),
    "math.cosh": lambda fn, tp, P, C, I: fn(P(2, 3)),
    "math.asinh": lambda fn, tp, P, C, I: fn(P(2, 3)),
    "math.acosh": lambda fn, tp, P, C, I: fn(tp.adds(tp.abs(P(2, 3)), 1.5)),
    "math.atanh": lambda fn, tp, P, C, I: fn(tp.muls(tp.tanh(P(2, 3)), 0.9)),
    "math.hypot": lambda fn, tp, P, C, I: fn(P(2, 3), P(3)),
    # distances
    "distances.norms": lambda fn, tp, P, C, I: (fn(P(3, 4), 2.0), fn(P(3, 4), 1.0)),
    "distances.cdist": lambda fn, tp, P, C, I: (fn(P(3, 2), P(4, 2)),
                                                fn(P(2, 3, 2), P(2, 4, 2), 1.0)),
    "distances.pdist": lambda fn, tp, P, C, I: fn(P(4, 3)),
    # sorting
    "sorting.topk": lambda fn, tp, P, C, I: fn(tp, P(3, 5), 2),
    "sorting.sort": lambda fn, tp, P, C, I: fn(tp, P(3, 5), 1, descending=True),
}


def _flat(out) -> list:
    if isinstance(out, (tuple, list)):
        return [v for x in out for v in _flat(x)]
    return [] if out is None else [out]


def run_one(name: str, fn) -> dict:
    """Record ``name``'s recipe on a new tape, a loss of every float output times a param
    of its shape, backward, and fd_check of every param (a sample of 5 elements each)."""
    import gradtool as gt

    rng = np.random.default_rng(zlib.crc32(name.encode()))
    tp = gt.Tape()

    def P(*shape):
        return tp.param(rng.standard_normal(shape))

    def C(*shape, low=-1.0, high=1.0):
        return tp.const(rng.uniform(low, high, shape))

    def I(values):
        return tp.const(np.array(values, dtype=np.int64), dtype="i64")

    before = len(tp.nodes)
    outs = _flat(RECIPES[name](fn, tp, P, C, I))
    ops = sum(1 for n in tp.nodes[before:] if n.a >= 0)       # nodes other than leaves
    facts = {"outputs": [], "ops": ops}
    loss, weights = None, []
    for o in outs:
        value = tp.value(o)
        facts["outputs"].append({"shape": list(value.shape), "dtype": o.dtype,
                                 "finite": bool(np.all(np.isfinite(value)))})
        if o.dtype == "i64":
            continue
        q = tp.param(rng.uniform(0.5, 1.5, value.shape))
        weights.append((q, value))
        term = tp.sum(tp.mul(o, q))
        loss = term if loss is None else tp.add(loss, term)
    tp.backward(loss)
    # the weight q of each output gets that output's values as its gradient, exactly
    facts["weights_get_the_outputs"] = all(np.array_equal(tp.grad(q), v) for q, v in weights)
    report = gt.fd_check(tp, loss, sample=5)
    facts["fd"] = [{"param": p.id, "passed": p.passed, "checked": p.checked,
                    "max_abs_err": p.max_abs_err, "nonsmooth": len(p.nonsmooth)}
                   for p in report.params]
    facts["params"] = len(report.params) - len(weights)     # the composite's own inputs
    return facts


def run_all() -> dict:
    """Every composite's facts (or its error), with what the interpreter saw of torch."""
    import traceback

    found = composites()
    results = {}
    for name, fn in sorted(found.items()):
        if name not in RECIPES:
            results[name] = {"error": "no recipe in tests/test_composites.py"}
            continue
        try:
            results[name] = run_one(name, fn)
        except Exception:
            results[name] = {"error": traceback.format_exc()[-1500:]}
    try:
        import torch  # noqa: F401
        blocked = False
    except ImportError:
        blocked = True
    return {"composites": sorted(found), "results": results, "torch_blocked": blocked,
            "torch_modules": sorted(m for m in sys.modules
                                    if m == "torch" and sys.modules[m] is not None
                                    or m.startswith("torch."))}


CHILD = """
import json, sys
sys.modules["torch"] = None          # torch unimportable: `import torch` raises ImportError
sys.path.insert(0, {tests!r})
import test_composites
print(json.dumps(test_composites.run_all()))
"""


@pytest.fixture(scope="module")
def without_torch():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in
                                         env.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run([sys.executable, "-c", CHILD.format(tests=str(ROOT / "tests"))],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_child_ran_without_torch(without_torch):
    assert without_torch["torch_blocked"]
    assert without_torch["torch_modules"] == []
    # the child enumerated the same composites this interpreter does
    assert without_torch["composites"] == sorted(composites())


def test_every_family_lists_its_composites_and_each_has_a_recipe():
    fams = families()
    assert {"dense", "norms", "losses", "random", "conv", "pool", "resample", "layout",
            "reductions", "sorting"} <= set(fams)
    for fam, mod in fams.items():
        assert getattr(mod, "__all__", None), f"gradtool.composites.{fam} has no __all__"
        for name in mod.__all__:
            assert callable(getattr(mod, name)), f"{fam}.{name}"
    found = set(composites())
    assert not found - set(RECIPES), f"composites without a recipe: {sorted(found - set(RECIPES))}"
    assert not set(RECIPES) - found, f"recipes of no composite: {sorted(set(RECIPES) - found)}"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_composite_forward_and_backward_without_torch(without_torch, name):
    facts = without_torch["results"].get(name)
    assert facts is not None, f"{name} was not run"
    assert "error" not in facts, facts.get("error")
    assert facts["outputs"], f"{name} returned nothing"
    for o in facts["outputs"]:
        assert o["finite"], f"{name}: an output {o} is not finite"
    assert facts["weights_get_the_outputs"]
    for p in facts["fd"]:
        assert p["passed"], f"{name}: param {p['param']} fails fd_check: {p}"
        assert p["checked"] >= 1
    if name != "random.rng_slot":            # the rng slot is the tape's own const
        assert facts["ops"] >= 1, f"{name} recorded no op"


def test_draws_and_ids_have_their_dtypes(without_torch):
    res = without_torch["results"]
    # integer-valued float draws (usable as ids) and the i64 ids sort and topk return
    assert [o["dtype"] for o in res["random.randint"]["outputs"]] == ["f64"]
    assert [o["shape"] for o in res["sorting.topk"]["outputs"]] == [[3, 2], [3, 2]]
    assert res["random.randperm"]["outputs"][0]["shape"] == [6]
    # the differentiable composites had inputs for fd_check to perturb
    for name in ("conv.conv3d", "conv.conv_transpose2d", "pool.max_pool3d", "norms.group_norm",
                 "resample.grid_sample", "reductions.logcumsumexp", "sorting.sort"):
        assert res[name]["params"] >= 1, name


# ── the old import paths ───────────────────────────────────────────────────
# The public names of gradtool/nn.py and gradtool/layout.py before they became re-exports
# of gradtool.composites (git show <before>:gradtool/nn.py, layout.py): hard-coded, so a
# name dropped from either fails here.

NN_NAMES = [
    "GELU_C", "GELU_K", "SQRT1_2", "ALPHA_SELU", "TWO_PI",
    "linear", "rms_norm", "layer_norm", "native_layer_norm", "silu", "gelu",
    "rng_slot", "dropout", "feature_dropout", "bernoulli", "normal", "rand", "randint",
    "randperm", "multinomial", "alpha_dropout", "softmax_cross_entropy", "mse",
    "conv2d", "conv1d", "conv_transpose2d", "conv_transpose3d", "conv_transpose1d",
    "max_pool2d", "avg_pool2d", "conv3d", "max_pool3d", "avg_pool3d", "global_avg_pool2d",
    "adaptive_avg_pool2d", "adaptive_max_pool2d", "adaptive_avg_pool3d",
    "adaptive_max_pool3d", "grid_sample", "upsample_bilinear2d", "group_norm",
    "batch_norm2d", "batch_norm2d_train",
]
LAYOUT_NAMES = [
    "reduce_axes", "reduction_method", "variance", "std", "amin", "expand", "reshape_to",
    "unsqueeze", "squeeze", "flatten", "select", "narrow", "split", "cat", "index_select",
    "index_add", "flip", "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "prod",
    "repeat_interleave", "PAIRWISE_LIMIT", "topk", "sort", "swapaxes", "stack", "pad",
    "METHODS",
]
LAYOUT_METHODS = [
    "expand", "unsqueeze", "squeeze", "flatten", "select", "narrow", "split", "cat", "stack",
    "swapaxes", "pad", "index_select", "index_add", "repeat_interleave", "flip", "cumsum",
    "cumprod", "cummax", "cummin", "logcumsumexp", "prod", "topk", "sort", "variance", "std",
    "amin",
]


def test_gradtool_nn_keeps_every_name():
    import gradtool as gt
    from gradtool import nn

    assert gt.nn is nn
    # __all__ is every old name but the constants, in its old order
    assert sorted(nn.__all__) == sorted(n for n in NN_NAMES if not n.isupper())
    assert nn.__all__[:6] == ["linear", "rms_norm", "layer_norm", "native_layer_norm",
                             "silu", "gelu"] and nn.__all__[-1] == "dropout"
    homes = composites()
    for name in NN_NAMES:
        assert hasattr(nn, name), f"gradtool.nn.{name}"
        value = getattr(nn, name)
        if callable(value):          # the composite itself, not a copy
            assert value.__module__.startswith("gradtool.composites."), name
            fam = value.__module__.rsplit(".", 1)[1]
            assert homes[f"{fam}.{name}"] is value
    assert nn.TWO_PI == 2.0 * np.pi and nn.ALPHA_SELU == 1.7580993408473766
    assert nn.SQRT1_2 == float.fromhex("0x1.6a09e667f3bcdp-1")
    assert nn.GELU_C == np.sqrt(2.0 / np.pi) and nn.GELU_K == 0.044715


def test_gradtool_layout_keeps_every_name_and_the_tape_its_methods():
    import gradtool.layout as layout
    from gradtool import Tape
    from gradtool.composites import methods

    assert layout.__all__ == ["METHODS", "reduction_method"]
    for name in LAYOUT_NAMES:
        assert hasattr(layout, name), f"gradtool.layout.{name}"
    assert layout.METHODS is methods.METHODS
    assert sorted(layout.METHODS) == sorted(LAYOUT_METHODS)
    for name in LAYOUT_METHODS:
        fn = layout.METHODS[name]
        assert getattr(layout, name) is fn
        method = getattr(Tape, name)
        assert method.__qualname__ == f"Tape.{name}" and method.__doc__ == fn.__doc__
    assert layout.PAIRWISE_LIMIT == 1 << 22
    # sum/mean/max take a tuple of axes through reduction_method
    tp = Tape()
    x = tp.param(np.arange(24.0).reshape(2, 3, 4))
    assert np.array_equal(tp.value(tp.sum(x, (0, 2))), np.arange(24.0).reshape(2, 3, 4)
                          .sum(axis=(0, 2)))


def test_spread_is_public_in_the_layout_family():
    """The importer's scatter uses the layout family's spread (it was nn._spread)."""
    import gradtool as gt
    from gradtool.composites import layout

    assert "_spread" not in dir(layout) and "spread" in layout.__all__
    tp = gt.Tape()
    x = tp.param(np.array([[1.0, 2.0, 3.0]]))
    y = layout.spread(tp, x, 1, 3)
    assert np.array_equal(tp.value(y), [[1.0, 0, 0, 2.0, 0, 0, 3.0]])
    tp.backward(tp.sum(tp.mul(y, tp.const(np.arange(7.0).reshape(1, 7)))))
    assert np.array_equal(tp.grad(x), [[0.0, 3.0, 6.0]])
