"""Layout ops and reductions: permute, slice steps, multi-axis sum/mean/max, and the
composites of gradtool/layout.py (expand, select, squeeze, unsqueeze, cat, split,
index_select, repeat_interleave, flatten, variance, flip, cumsum, cumprod, prod) and
gradtool.nn's composites of them (native_layer_norm, conv_transpose2d/1d,
adaptive_avg_pool2d, adaptive_max_pool2d, upsample_bilinear2d, group_norm).

Checked against PyTorch float64 (values within 1e-12, gradients within 1e-11
relative; layout values bit for bit), against the documented serial orders bit for
bit, on every host kernel variant bit for bit, through files (same bytes; files
without the new attributes unchanged), and on hostile attributes.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal, require_c_compiler
from gradtool import nn
from gradtool.tapefile import dumps, load


def _rel(ours, theirs) -> float:
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    scale = max(float(np.max(np.abs(theirs))), 1e-300)
    return float(np.max(np.abs(ours - theirs))) / scale


def _cases():
    """label -> (input shapes, gradtool builder, torch builder, exact): builders take the
    list of inputs (GVars / torch leaves) and return one output; ``exact``: the values
    are copies, so they must equal torch's bit for bit.  Without torch the torch
    builders are never called (their tests skip) and the gradtool ones run."""
    try:
        import torch
    except ImportError:                 # torch is an optional extra
        torch = None
    ids = [2, 0, 2, 1]
    return {
        "permute": ([(2, 3, 4, 5)], lambda tp, v: tp.permute(v[0], [2, 0, 3, 1]),
                    lambda v: v[0].permute(2, 0, 3, 1), True),
        "permute negative": ([(2, 3, 4)], lambda tp, v: tp.permute(v[0], [-1, 0, 1]),
                             lambda v: v[0].permute(-1, 0, 1), True),
        "expand": ([(3, 1, 4)], lambda tp, v: tp.expand(v[0], [2, 3, 5, 4]),
                   lambda v: v[0].expand(2, 3, 5, 4), True),
        "expand -1": ([(3, 1, 4)], lambda tp, v: tp.expand(v[0], [2, -1, 5, -1]),
                      lambda v: v[0].expand(2, -1, 5, -1), True),
        "slice steps": ([(7, 6)], lambda tp, v: tp.slice(v[0], [1, 0], [6, 5], [2, 3]),
                        lambda v: v[0][1:6:2, 0:5:3], True),
        "slice steps 3-d": ([(5, 4, 6)],
                            lambda tp, v: tp.slice(v[0], [0, 1, 2], [5, 4, 6], [4, 1, 3]),
                            lambda v: v[0][0:5:4, 1:4, 2:6:3], True),
        "sum (0,2)": ([(3, 4, 5)], lambda tp, v: tp.sum(v[0], (0, 2)),
                      lambda v: v[0].sum((0, 2)), False),
        "sum (2,0) keepdims": ([(3, 4, 5)], lambda tp, v: tp.sum(v[0], (2, 0), keepdims=True),
                               lambda v: v[0].sum((2, 0), keepdim=True), False),
        "sum (1,2) adjacent": ([(2, 3, 4, 5)], lambda tp, v: tp.sum(v[0], (1, 2)),
                               lambda v: v[0].sum((1, 2)), False),
        "sum every axis": ([(3, 4)], lambda tp, v: tp.sum(v[0], (0, 1), keepdims=True),
                           lambda v: v[0].sum((0, 1), keepdim=True), False),
        "mean (-1,0)": ([(3, 4, 5)], lambda tp, v: tp.mean(v[0], (-1, 0)),
                        lambda v: v[0].mean((-1, 0)), False),
        "mean (0,2,3) keepdims": ([(2, 3, 4, 5)],
                                  lambda tp, v: tp.mean(v[0], (0, 2, 3), keepdims=True),
                                  lambda v: v[0].mean((0, 2, 3), keepdim=True), False),
        "max (0,2) = amax": ([(3, 4, 5)], lambda tp, v: tp.max(v[0], (0, 2)),
                             lambda v: torch.amax(v[0], (0, 2)), True),
        "max (1,2) keepdims": ([(3, 4, 5)], lambda tp, v: tp.max(v[0], [1, 2], keepdims=True),
                               lambda v: torch.amax(v[0], (1, 2), keepdim=True), True),
        "variance": ([(4, 6)], lambda tp, v: tp.variance(v[0], 1),
                     lambda v: torch.var(v[0], 1), False),
        "variance (0,2) c0 keepdims": ([(3, 4, 5)],
                                       lambda tp, v: tp.variance(v[0], (0, 2), correction=0,
                                                                 keepdims=True),
                                       lambda v: torch.var(v[0], (0, 2), correction=0,
                                                           keepdim=True), False),
        "variance all": ([(3, 4)], lambda tp, v: tp.variance(v[0]),
                         lambda v: torch.var(v[0]).reshape(1), False),
        "std (0,2)": ([(3, 4, 5)], lambda tp, v: tp.std(v[0], (0, 2)),
                      lambda v: torch.std(v[0], (0, 2)), False),
        "amin (1,2)": ([(3, 4, 5)], lambda tp, v: tp.amin(v[0], (1, 2), keepdims=True),
                       lambda v: torch.amin(v[0], (1, 2), keepdim=True), True),
        "amin 1": ([(3, 4)], lambda tp, v: tp.amin(v[0], 1),
                   lambda v: torch.amin(v[0], 1), True),
        "select": ([(3, 4, 5)], lambda tp, v: tp.select(v[0], 1, -2),
                   lambda v: v[0].select(1, -2), True),
        "squeeze": ([(3, 1, 4, 1)], lambda tp, v: tp.squeeze(v[0], (1, 2)),
                    lambda v: v[0].squeeze((1, 2)), True),
        "squeeze all": ([(3, 1, 4, 1)], lambda tp, v: tp.squeeze(v[0]),
                        lambda v: v[0].squeeze(), True),
        "unsqueeze": ([(3, 4)], lambda tp, v: tp.unsqueeze(v[0], -1),
                      lambda v: v[0].unsqueeze(-1), True),
        "flatten": ([(2, 3, 4, 5)], lambda tp, v: tp.flatten(v[0], 1, 2),
                    lambda v: v[0].flatten(1, 2), True),
        "cat 3": ([(2, 3), (2, 1), (2, 4)], lambda tp, v: tp.cat(v, 1),
                  lambda v: torch.cat(v, 1), True),
        "cat 5": ([(1, 3), (2, 3), (1, 3), (3, 3), (1, 3)], lambda tp, v: tp.cat(v, -2),
                  lambda v: torch.cat(v, -2), True),
        "split": ([(7, 3)], lambda tp, v: tp.cat([tp.muls(p, float(k + 1)) for k, p in
                                                  enumerate(tp.split(v[0], 3, 0))], 0),
                  lambda v: torch.cat([p * float(k + 1) for k, p in
                                       enumerate(torch.split(v[0], 3, 0))], 0), True),
        "split sizes": ([(2, 9)],
                        lambda tp, v: tp.cat([tp.muls(p, float(k + 1)) for k, p in
                                              enumerate(tp.split(v[0], [2, 3, 4], 1))], 1),
                        lambda v: torch.cat([p * float(k + 1) for k, p in
                                             enumerate(torch.split(v[0], [2, 3, 4], 1))], 1),
                        True),
        "index_select": ([(2, 3, 4)], lambda tp, v: tp.index_select(v[0], 1, ids),
                         lambda v: torch.index_select(v[0], 1, torch.tensor(ids)), True),
        "index_select 0": ([(3, 4)], lambda tp, v: tp.index_select(v[0], 0, ids),
                           lambda v: torch.index_select(v[0], 0, torch.tensor(ids)), True),
        "repeat_interleave": ([(2, 3, 4)], lambda tp, v: tp.repeat_interleave(v[0], 3, 1),
                              lambda v: v[0].repeat_interleave(3, 1), True),
        "swapaxes": ([(2, 3, 4)], lambda tp, v: tp.swapaxes(v[0], 0, -1),
                     lambda v: v[0].transpose(0, -1), True),
        "stack": ([(2, 3), (2, 3), (2, 3)], lambda tp, v: tp.stack(v, 1),
                  lambda v: torch.stack(v, 1), True),
        "stack last": ([(2, 3), (2, 3)], lambda tp, v: tp.stack(v, -1),
                       lambda v: torch.stack(v, -1), True),
        "pad": ([(2, 3, 4)], lambda tp, v: tp.pad(v[0], [(0, 0), (1, 2), (3, 0)], 0.5),
                lambda v: torch.nn.functional.pad(v[0], (3, 0, 1, 2), value=0.5), True),
        "flip": ([(3, 4, 5)], lambda tp, v: tp.flip(v[0], (0, -1)),
                 lambda v: v[0].flip((0, -1)), True),
        "cumsum": ([(3, 6, 2)], lambda tp, v: tp.cumsum(v[0], 1),
                   lambda v: torch.cumsum(v[0], 1), True),
        "cumprod": ([(3, 6, 2)], lambda tp, v: tp.cumprod(v[0], 1),
                    lambda v: torch.cumprod(v[0], 1), True),
        "prod 0": ([(4, 3, 2)], lambda tp, v: tp.prod(v[0], 0),
                   lambda v: torch.prod(v[0], 0), True),
        "prod -1 keepdims": ([(3, 5)], lambda tp, v: tp.prod(v[0], -1, keepdims=True),
                             lambda v: torch.prod(v[0], -1, keepdim=True), True),
        "prod all": ([(3, 4)], lambda tp, v: tp.prod(v[0]),
                     lambda v: torch.prod(v[0]).reshape(1), False),
        "conv_transpose2d": ([(2, 4, 5, 4), (4, 3, 3, 3), (6,)],
                             lambda tp, v: nn.conv_transpose2d(v[0], v[1], v[2], stride=2,
                                                               padding=1, output_padding=1,
                                                               groups=2),
                             lambda v: torch.nn.functional.conv_transpose2d(
                                 v[0], v[1], v[2], stride=2, padding=1, output_padding=1,
                                 groups=2), False),
        "conv_transpose2d dilated": ([(1, 2, 4, 3), (2, 3, 3, 2)],
                                     lambda tp, v: nn.conv_transpose2d(
                                         v[0], v[1], stride=(3, 1), padding=(2, 1),
                                         dilation=(1, 2)),
                                     lambda v: torch.nn.functional.conv_transpose2d(
                                         v[0], v[1], stride=(3, 1), padding=(2, 1),
                                         dilation=(1, 2)), False),
        "conv_transpose1d": ([(2, 3, 5), (3, 4, 3), (4,)],
                             lambda tp, v: nn.conv_transpose1d(v[0], v[1], v[2], stride=2,
                                                               padding=1, output_padding=1),
                             lambda v: torch.nn.functional.conv_transpose1d(
                                 v[0], v[1], v[2], stride=2, padding=1, output_padding=1),
                             False),
        "adaptive_avg_pool2d 3x2": ([(2, 3, 7, 5)],
                                    lambda tp, v: nn.adaptive_avg_pool2d(v[0], (3, 2)),
                                    lambda v: torch.nn.functional.adaptive_avg_pool2d(
                                        v[0], (3, 2)), False),
        "adaptive_avg_pool2d divides": ([(2, 3, 6, 4)],
                                        lambda tp, v: nn.adaptive_avg_pool2d(v[0], (3, None)),
                                        lambda v: torch.nn.functional.adaptive_avg_pool2d(
                                            v[0], (3, None)), False),
        "adaptive_max_pool2d 3x2": ([(2, 3, 7, 5)],
                                    lambda tp, v: nn.adaptive_max_pool2d(v[0], (3, 2)),
                                    lambda v: torch.nn.functional.adaptive_max_pool2d(
                                        v[0], (3, 2)), True),
        "adaptive_max_pool2d divides": ([(2, 3, 6, 4)],
                                        lambda tp, v: nn.adaptive_max_pool2d(v[0], 2),
                                        lambda v: torch.nn.functional.adaptive_max_pool2d(
                                            v[0], 2), True),
        "upsample_bilinear2d": ([(2, 3, 4, 5)],
                                lambda tp, v: nn.upsample_bilinear2d(v[0], (6, 11),
                                                                     scale_factor=(1.7, 2.3)),
                                lambda v: torch.nn.functional.interpolate(
                                    v[0], scale_factor=(1.7, 2.3), mode="bilinear"), False),
        "upsample_bilinear2d corners": ([(2, 3, 4, 5)],
                                        lambda tp, v: nn.upsample_bilinear2d(v[0], (5, 3), True),
                                        lambda v: torch.nn.functional.interpolate(
                                            v[0], (5, 3), mode="bilinear", align_corners=True),
                                        False),
        "group_norm": ([(2, 6, 3, 4), (6,), (6,)],
                       lambda tp, v: nn.group_norm(v[0], 3, v[1], v[2]),
                       lambda v: torch.nn.functional.group_norm(v[0], 3, v[1], v[2]), False),
        "group_norm 1-d": ([(3, 4, 5)], lambda tp, v: nn.group_norm(v[0], 2, eps=1e-3),
                           lambda v: torch.nn.functional.group_norm(v[0], 2, eps=1e-3),
                           False),
        "native_layer_norm 1": ([(4, 6), (6,), (6,)],
                                lambda tp, v: nn.native_layer_norm(v[0], 1, v[1], v[2])[0],
                                lambda v: torch.native_layer_norm(v[0], (6,), v[1], v[2],
                                                                  1e-5)[0], False),
        "native_layer_norm 2 mean": ([(3, 4, 5)],
                                     lambda tp, v: nn.native_layer_norm(v[0], 2)[1],
                                     lambda v: v[0].mean((1, 2), keepdim=True), False),
        "native_layer_norm 2 rstd": ([(3, 4, 5)],
                                     lambda tp, v: nn.native_layer_norm(v[0], 2)[2],
                                     lambda v: torch.rsqrt(torch.var(v[0], (1, 2),
                                                                     correction=0,
                                                                     keepdim=True) + 1e-5),
                                     False),
    }


LABELS = ["permute", "permute negative", "expand", "expand -1", "slice steps",
          "slice steps 3-d", "sum (0,2)", "sum (2,0) keepdims", "sum (1,2) adjacent",
          "sum every axis", "mean (-1,0)", "mean (0,2,3) keepdims", "max (0,2) = amax",
          "max (1,2) keepdims", "std (0,2)", "amin (1,2)", "amin 1", "variance", "variance (0,2) c0 keepdims", "variance all",
          "select", "squeeze", "squeeze all", "unsqueeze", "flatten", "cat 3", "cat 5", "split",
          "split sizes", "index_select", "index_select 0", "repeat_interleave", "swapaxes",
          "stack", "stack last", "pad", "flip", "cumsum", "cumprod", "prod 0",
          "prod -1 keepdims", "prod all", "conv_transpose2d",
          "conv_transpose2d dilated", "conv_transpose1d", "adaptive_avg_pool2d 3x2",
          "adaptive_avg_pool2d divides", "adaptive_max_pool2d 3x2",
          "adaptive_max_pool2d divides", "upsample_bilinear2d", "upsample_bilinear2d corners",
          "group_norm", "group_norm 1-d",
          "native_layer_norm 1", "native_layer_norm 2 mean", "native_layer_norm 2 rstd"]


def _inputs(label, shapes):
    rng = np.random.default_rng(sum(map(ord, label)))
    return [rng.standard_normal(s) * 2.0 + 0.5 for s in shapes]


def _build(label):
    """(tape, inputs as params, out, loss = sum(out * w)), and the weights w."""
    shapes, ours, _, _ = _cases()[label]
    xs = _inputs(label, shapes)
    tp = gt.Tape()
    leaves = [tp.param(x) for x in xs]
    out = ours(tp, leaves)
    w = np.random.default_rng(7).uniform(0.5, 1.5, tp.value(out).shape)
    loss = tp.sum(tp.mul(out, tp.const(w)))
    return tp, leaves, out, loss, xs, w


def test_the_cases_are_all_listed():
    pytest.importorskip("torch")
    assert sorted(LABELS) == sorted(_cases())


@pytest.mark.parametrize("label", LABELS)
def test_against_pytorch_float64(label):
    torch = pytest.importorskip("torch")
    _, _, theirs, exact = _cases()[label]
    tp, leaves, out, loss, xs, w = _build(label)
    tp.backward(loss)
    tl = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in xs]
    ty = theirs(tl)
    (ty * torch.tensor(w)).sum().backward()
    want = ty.detach().numpy()
    if exact:
        assert_bits_equal(tp.value(out), want, label)
    else:
        assert _rel(tp.value(out), want) <= 1e-12, label
    for leaf, t in zip(leaves, tl):
        g = t.grad.numpy() if t.grad is not None else np.zeros(t.shape)
        assert _rel(tp.grad(leaf), g) <= 1e-11, label


@pytest.mark.parametrize("variant, fuse", [("tiled", False), ("per-thread", False),
                                           ("per-thread-reversed", False),
                                           ("per-thread-reversed", True)])
def test_every_case_on_the_host_backend_bit_for_bit(variant, fuse):
    require_c_compiler()
    pytest.importorskip("torch")
    from gradtool.device import capture

    for label in LABELS:
        tp, leaves, out, loss, _, _ = _build(label)
        tp.backward(loss)
        replay = capture(tp, loss, "host", host_kernels=variant, fuse=fuse)
        replay.forward()
        replay.backward()
        assert_bits_equal(replay.value(out), tp.value(out), f"{label} ({variant})")
        for leaf in leaves:
            assert_bits_equal(replay.grad(leaf), tp.grad(leaf), f"{label} grad ({variant})")


def _serial(values) -> float:
    acc = 0.0
    for v in values:
        acc = acc + float(v)
    return acc


def test_amin_is_the_first_minimum_and_gets_the_gradient():
    x = np.array([[2.0, -1.0, -1.0, np.nan], [0.0, -0.0, 3.0, -0.0]])
    tp = gt.Tape()
    a = tp.param(x)
    r = tp.amin(a, 1)
    tp.backward(tp.sum(r))
    assert_bits_equal(tp.value(r), np.array([np.nan, 0.0]), "value")   # +0.0 comes first
    want = np.zeros(x.shape)
    want[0, 3] = want[1, 0] = 1.0
    assert_bits_equal(tp.grad(a), want, "grad")


def test_native_layer_norm_statistics_are_torchs():
    torch = pytest.importorskip("torch")
    x = _inputs("stats", [(3, 4, 5)])[0]
    tp = gt.Tape()
    y, mean, rstd = nn.native_layer_norm(tp.param(x), 2, eps=1e-5)
    ty, tmean, trstd = torch.native_layer_norm(torch.tensor(x), (4, 5), None, None, 1e-5)
    for ours, theirs in ((y, ty), (mean, tmean), (rstd, trstd)):
        assert _rel(tp.value(ours), theirs.numpy()) <= 1e-12
    # over one axis, y is nn.layer_norm's nodes exactly
    tp2 = gt.Tape()
    assert_bits_equal(tp2.value(nn.layer_norm(tp2.param(x))),
                      tp.value(nn.native_layer_norm(tp.param(x))[0]), "layer_norm")


def test_multi_axis_sum_and_mean_are_row_major_serial_from_zero():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5, 2)) * np.exp(rng.uniform(-20, 20, (3, 4, 5, 2)))
    tp = gt.Tape()
    a = tp.param(x)
    s, m = tp.sum(a, (3, 0, 2)), tp.mean(a, (0, 2, 3))
    want_s = np.array([_serial(x[:, j, :, :].reshape(-1)) for j in range(4)])
    assert_bits_equal(tp.value(s), want_s, "sum")
    assert_bits_equal(tp.value(m), want_s / 30.0, "mean")
    # every axis: the whole reduction's node, not a composite
    assert tp.nodes[tp.sum(a, (0, 1, 2, 3)).id].aux is None


def test_multi_axis_max_first_max_gets_the_gradient():
    x = np.array([[[1.0, 3.0], [3.0, -1.0]], [[0.0, -0.0], [-0.0, 0.0]]])
    tp = gt.Tape()
    a = tp.param(x)
    r = tp.max(a, (1, 2))
    tp.backward(tp.sum(r))
    assert_bits_equal(tp.value(r), np.array([3.0, 0.0]), "value")
    # the first maximal element in row-major order over the reduced coordinates
    # (torch's amax would split each tie evenly)
    want = np.zeros(x.shape)
    want[0, 0, 1] = want[1, 0, 0] = 1.0
    assert_bits_equal(tp.grad(a), want, "grad")


def test_single_axis_and_whole_reductions_and_plain_slices_write_the_same_nodes():
    tp = gt.Tape()
    a = tp.param(np.arange(12.0).reshape(3, 4))
    assert tp.nodes[tp.sum(a, (1,)).id].aux == tp.nodes[tp.sum(a, 1).id].aux == {"axis": 1}
    assert tp.nodes[tp.mean(a, [-1], keepdims=True).id].aux == {"axis": 1, "keepdims": True}
    assert tp.nodes[tp.max(a).id].aux is None
    assert tp.nodes[tp.slice(a, [0, 1], [2, 3]).id].aux == {"starts": [0, 1], "stops": [2, 3]}
    doc = msgpack.unpackb(dumps(tp, loss=tp.sum(a)))
    assert all("steps" not in n and "dims" not in n for n in doc["nodes"])


@pytest.mark.parametrize("label", ["permute", "slice steps", "sum (0,2)", "max (1,2) keepdims",
                                   "expand", "index_select", "cat 5"])
def test_file_round_trip(label):
    tp, _, out, loss, _, _ = _build(label)
    raw = dumps(tp, loss=loss, outputs={"out": out}, values=True)
    back = load(raw)
    assert dumps(back.tape, loss=back.loss, outputs=back.outputs, values=True) == raw
    assert_bits_equal(back.tape.value(back.outputs["out"]), tp.value(out), label)


def _node_file(op, attrs, shape_in, shape_out):
    tp = gt.Tape()
    a = tp.param(np.zeros(shape_in))
    doc = msgpack.unpackb(dumps(tp, loss=tp.sum(a)))
    node = {"op": op, "a": 0, "b": -1, "s": 0.0, "shape": list(shape_out), **attrs}
    doc["nodes"] = [doc["nodes"][0], node]
    doc.pop("loss", None)
    return msgpack.packb(doc)


@pytest.mark.parametrize("op, attrs, sin, sout, needle", [
    ("permute", {"dims": [0, 0, 1]}, (2, 3, 4), (2, 2, 3), "not a permutation"),
    ("permute", {"dims": [1, 0]}, (2, 3, 4), (3, 2), "not a permutation"),
    ("permute", {"dims": [0, 3, 1]}, (2, 3, 4), (2, 3, 3), "not a permutation"),
    ("permute", {"dims": [0, -1, 1]}, (2, 3, 4), (2, 4, 3), "dims"),
    ("permute", {"dims": 1}, (2, 3), (3, 2), "dims"),
    ("permute", {}, (2, 3), (3, 2), "dims"),
    ("slice", {"starts": [0, 0], "stops": [2, 3], "steps": [0, 1]}, (2, 3), (2, 3),
     "steps [0, 1] must be >= 1"),
    ("slice", {"starts": [0, 0], "stops": [2, 3], "steps": [1]}, (2, 3), (2, 3), "step"),
    ("slice", {"starts": [0, 0], "stops": [2, 3], "steps": [-1, 1]}, (2, 3), (2, 3), "steps"),
    ("slice", {"starts": [0, 0], "stops": [2, 3], "steps": [2, 2]}, (2, 3), (2, 3),
     "states [2,3], but slice of its inputs gives [1,2]"),
    ("sum", {"axis": [0, 1]}, (2, 3), (1,), "axis"),
])
def test_hostile_attributes_in_files(op, attrs, sin, sout, needle):
    with pytest.raises(gt.TapeFileError) as err:
        load(_node_file(op, attrs, sin, sout), name="h.msgpack")
    assert err.value.node == 1, str(err.value)
    assert needle in str(err.value), str(err.value)
    assert "h.msgpack" in str(err.value)


def test_misuse_raises_gradtool_errors_naming_the_method():
    tp = gt.Tape()
    a = tp.param(np.zeros((2, 3, 4)))
    bad = [(lambda: tp.sum(a, (1, 1)), "sum: axis 1 appears more than once"),
           (lambda: tp.max(a, (0, -3)), "max: axis 0 appears more than once"),
           (lambda: tp.mean(a, ()), "mean: axis=() names no axis"),
           (lambda: tp.sum(a, (0, 5)), "sum: axis 5 is out of range"),
           (lambda: tp.sum(a, "x"), "sum"),
           (lambda: tp.variance(a, (2, 2)), "variance: axis 2 appears more than once"),
           (lambda: tp.permute(a, [0, 1, 1]), "not a permutation"),
           (lambda: tp.permute(a, [0, 1]), "not a permutation"),
           (lambda: tp.slice(a, [0, 0, 0], [2, 3, 4], [1, 0, 1]), "steps [1, 0, 1] must be"),
           (lambda: tp.expand(a, [2, 5, 4]), "expand: cannot expand [2,3,4] to [2,5,4]"),
           (lambda: tp.expand(a, [3, 4]), "to fewer dims"),
           (lambda: tp.select(a, 1, 3), "select: index 3 is out of range"),
           (lambda: tp.split(a, [1, 1], 1), "add up to 3"),
           (lambda: tp.split(a, 0, 1), "split: a piece size must be >= 1"),
           (lambda: tp.cat([]), "cat: needs at least one input"),
           (lambda: tp.unsqueeze(a, 4), "unsqueeze: axis 4 is out of range"),
           (lambda: tp.flatten(a, 2, 1), "flatten: start axis 2 comes after end axis 1"),
           (lambda: tp.repeat_interleave(a, 0, 1), "repeats must be an int >= 1"),
           (lambda: tp.index_select(a, 1, [[0]]), "index_select: ids must be 1-d"),
           (lambda: tp.index_select(a, 1, [3]), "id 3"),
           (lambda: tp.var(a, 1), "tp.variance(a, axis, correction, keepdims)"),
           (lambda: tp.swapaxes(a, 0, 3), "swapaxes: axis 3 is out of range"),
           (lambda: tp.stack([]), "stack: needs at least one input"),
           (lambda: tp.pad(a, [(0, 1)]), "pad: widths must be one"),
           (lambda: tp.pad(a, [(0, -1), (0, 0), (0, 0)]), "pad: widths must be one"),
           (lambda: tp.flip(a, 3), "flip: axis 3 is out of range"),
           (lambda: tp.cumsum(a, -4), "cumsum: axis -4 is out of range"),
           (lambda: tp.cumprod(a, 3), "cumprod: axis 3 is out of range"),
           (lambda: tp.prod(a, -4), "prod: axis -4 is out of range"),
           (lambda: tp.prod("a"), "prod")]
    for f, needle in bad:
        tp.ok, tp.error = True, None
        with pytest.raises(gt.GradtoolError) as err:
            f()
        assert needle in str(err.value), (needle, str(err.value))


def _ops(label):
    tp, leaves, out, *_ = _build(label)
    return [n.op for n in tp.nodes[len(leaves):out.id + 1]]


def test_composites_record_the_documented_ops():
    pytest.importorskip("torch")
    assert _ops("sum (0,2)") == ["permute", "reshape", "sum"]
    assert _ops("sum (1,2) adjacent") == ["reshape", "sum"]           # no permute
    assert _ops("sum (2,0) keepdims") == ["permute", "reshape", "sum", "reshape"]
    assert _ops("sum every axis") == ["sum"]                          # the whole reduction
    assert _ops("expand") == ["const", "add"]
    assert _ops("index_select") == ["const", "permute", "take", "permute"]
    assert _ops("index_select 0") == ["const", "take"]
    assert _ops("repeat_interleave") == ["reshape", "const", "add", "reshape"]
    assert _ops("select") == ["slice", "reshape"]
    assert _ops("cat 5").count("concat") == 4
    assert _ops("variance") == ["mean", "sub", "mul", "sum", "const", "div"]
    assert _ops("flip") == ["const", "take", "const", "permute", "take", "permute"]
    assert _ops("cumsum").count("add") == 5 and _ops("cumsum").count("concat") == 5
    assert _ops("cumprod").count("mul") == 5 and _ops("cumprod").count("concat") == 5
    assert _ops("prod 0") == ["slice", "slice", "mul", "slice", "mul", "slice", "mul",
                              "reshape"]
    assert _ops("adaptive_max_pool2d divides") == ["max_pool2d"]


def test_fd_check_through_the_composites():
    for label in ["permute", "slice steps", "sum (0,2)", "mean (0,2,3) keepdims", "expand",
                  "variance (0,2) c0 keepdims", "index_select", "repeat_interleave",
                  "cumsum", "cumprod", "prod all", "conv_transpose2d",
                  "adaptive_avg_pool2d 3x2", "adaptive_max_pool2d 3x2", "group_norm"]:
        tp, _, _, loss, _, _ = _build(label)
        report = gt.fd_check(tp, loss, eps=1e-6, rtol=1e-5, atol=1e-7)
        assert report.passed, label


# ── sort and topk ─────────────────────────────────────────────────────────────

def _sort_rows():
    """Rows with ties, signed zeros, infinities and NaNs, and random rows."""
    rng = np.random.default_rng(21)
    x = rng.normal(size=(5, 9))
    x[0, [1, 4, 7]] = 0.25                          # a three-way tie
    x[1, 2], x[1, 6] = -0.0, 0.0                    # equal, in index order
    x[2, [0, 5]] = np.nan                           # NaNs: the largest
    x[3, [3, 8]] = np.inf, -np.inf
    x[4] = np.arange(9.0)[::-1]                     # already descending
    return x


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("axis", [0, 1])
def test_sort_is_torchs_stable_sort_values_ids_and_gradient(axis, descending):
    torch = pytest.importorskip("torch")
    x = _sort_rows()
    tp = gt.Tape()
    p = tp.param(x)
    values, ids = tp.sort(p, axis=axis, descending=descending)
    tx = torch.tensor(x, requires_grad=True)
    tv, ti = torch.sort(tx, dim=axis, descending=descending, stable=True)
    assert np.array_equal(tp.value(ids), ti.numpy())
    assert_bits_equal(np.nan_to_num(tp.value(values)), np.nan_to_num(tv.detach().numpy()))
    w = np.random.default_rng(3).uniform(0.5, 1.5, x.shape)
    tp.backward(tp.sum(tp.mul(values, tp.const(w))))
    (tv * torch.tensor(w)).sum().backward()
    assert_bits_equal(tp.grad(p), tx.grad.numpy())     # each entry gets its own w: copies


def test_topk_values_and_gradient_match_torch_and_every_backend():
    torch = pytest.importorskip("torch")
    from support import VARIANTS, host_matches
    rng = np.random.default_rng(22)
    x = rng.normal(size=(3, 4, 7))                      # no ties: torch's ids are defined
    tp = gt.Tape()
    p = tp.param(x)
    top, ids = tp.topk(p, 3, axis=2)
    low, _ = tp.topk(p, 2, axis=1, largest=False)
    tx = torch.tensor(x, requires_grad=True)
    t_top, t_ids = torch.topk(tx, 3, dim=2)
    t_low = torch.topk(tx, 2, dim=1, largest=False).values
    assert np.array_equal(tp.value(ids), t_ids.numpy())
    assert_bits_equal(tp.value(top), t_top.detach().numpy())
    assert_bits_equal(tp.value(low), t_low.detach().numpy())
    w1, w2 = rng.uniform(0.5, 1.5, (3, 4, 3)), rng.uniform(0.5, 1.5, (3, 2, 7))
    loss = tp.add(tp.sum(tp.mul(top, tp.const(w1))), tp.sum(tp.mul(low, tp.const(w2))))
    tp.backward(loss)
    ((t_top * torch.tensor(w1)).sum() + (t_low * torch.tensor(w2)).sum()).backward()
    assert_bits_equal(tp.grad(p), tx.grad.numpy())
    assert gt.fd_check(tp, loss).passed
    for variant in VARIANTS:
        host_matches(tp, loss, variant)


def test_sort_and_topk_refuse_bad_k_and_rows_too_long_to_compare_pairwise():
    def fresh(shape=(2, 5)):
        return gt.Tape().param(np.zeros(shape))       # each error on a tape of its own

    x = fresh()
    with pytest.raises(gt.GradtoolError, match=r"^topk: k must be an int in \[1, 5\], got 6"):
        x.tape.topk(x, 6)
    x = fresh()
    with pytest.raises(gt.GradtoolError, match=r"^topk: k must be an int in \[1, 5\], got 2.0"):
        x.tape.topk(x, 2.0)
    x = fresh()
    with pytest.raises(gt.GradtoolError, match="^sort: descending must be True or False"):
        x.tape.sort(x, descending="yes")
    big = fresh((4, 2048))
    with pytest.raises(gt.GradtoolError, match=r"^sort: rows of 2048 entries compared pairwise: "
                                               r"4 x 2048 x 2048 elements exceed the limit"):
        big.tape.sort(big)


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cummax_and_cummin_are_torchs_values_and_tie_gradients(name):
    """Ties give the later entry the gradient, as torch's indices; exact copies."""
    torch = pytest.importorskip("torch")
    x = np.array([[1.0, 3.0, 3.0, 2.0, 3.0, -0.5, 4.0],
                  [2.0, 1.0, 1.0, 3.0, -0.0, 0.0, 1.0]])
    tp = gt.Tape()
    p = tp.param(x)
    y = getattr(tp, name)(p, 1)
    w = np.random.default_rng(2).uniform(0.5, 1.5, x.shape)
    tp.backward(tp.sum(tp.mul(y, tp.const(w))))
    tx = torch.tensor(x, requires_grad=True)
    ty = getattr(torch, name)(tx, 1).values
    (ty * torch.tensor(w)).sum().backward()
    assert_bits_equal(tp.value(y), ty.detach().numpy())
    assert_bits_equal(tp.grad(p), tx.grad.numpy())
