"""conv2d, max_pool2d, avg_pool2d and batch norm against torch float64, and the orders
numerics.py documents (the compiled matmul path against its numpy twin, bit for bit).

Values within 1e-12 relative, gradients within 1e-11 (relative to the largest
magnitude of the torch result).  The device backends are covered bit for bit by
the table-driven tests (tests/test_ops_table.py) and the cases below replayed on
the host backend in all three kernel variants.
"""

import numpy as np
import pytest

try:
    import torch
    import torch.nn.functional as F
except ImportError:                     # torch is an optional extra: its oracles skip
    torch = F = None

import gradtool as gt
from conftest import assert_bits_equal, bits, require_c_compiler
from gradtool import nn
from gradtool import cpulib, numerics as nx

VALUE_RTOL, GRAD_RTOL = 1e-12, 1e-11

# (name, x shape, w shape, stride, padding, dilation, groups, bias)
CONV_CASES = [
    ("plain 3x3", (2, 3, 8, 7), (4, 3, 3, 3), 1, 0, 1, 1, True),
    ("groups 2", (2, 4, 7, 6), (6, 2, 3, 2), 1, 1, 1, 2, False),
    ("depthwise", (2, 5, 6, 6), (5, 1, 3, 3), 1, 1, 1, 5, True),
    ("depthwise x2", (1, 3, 6, 5), (6, 1, 2, 2), 2, 0, 1, 3, False),
    ("stride 2x3", (2, 2, 9, 11), (3, 2, 3, 3), (2, 3), (1, 2), 1, 1, True),
    ("dilation", (2, 2, 9, 8), (3, 2, 3, 2), 1, (2, 1), (2, 3), 1, False),
    ("odd sizes", (3, 3, 13, 7), (5, 3, 5, 3), (3, 2), (2, 1), 1, 1, True),
    ("1x1", (2, 6, 4, 5), (3, 6, 1, 1), 1, 0, 1, 1, True),
    ("1x1 stride 2", (2, 4, 5, 5), (2, 4, 1, 1), 2, 0, 1, 1, False),
    ("batch 1", (1, 2, 6, 6), (4, 2, 3, 3), 1, 1, 1, 1, True),
    ("kernel = input", (2, 2, 4, 3), (3, 2, 4, 3), 1, 0, 1, 1, False),
    ("everything", (2, 6, 11, 10), (4, 3, 3, 2), (2, 1), (1, 2), (2, 2), 2, True),
]

# (name, x shape, kernel, stride, padding, dilation, ceil_mode)
MAX_POOL_CASES = [
    ("2x2", (2, 3, 8, 8), 2, 2, 0, 1, False),
    ("3x3 overlapping", (2, 2, 9, 7), 3, 1, 1, 1, False),
    ("ceil_mode", (2, 2, 7, 9), 3, 2, 1, 1, True),
    ("padding and stride", (1, 3, 10, 9), (3, 2), (2, 1), (1, 1), 1, False),
    ("dilation", (2, 2, 9, 10), 2, 2, 1, (2, 3), True),
]

# (name, x shape, kernel, stride, padding, ceil_mode, count_include_pad)
AVG_POOL_CASES = [
    ("2x2", (2, 3, 8, 8), 2, 2, 0, False, True),
    ("3x3 pad include", (2, 2, 9, 7), 3, 1, 1, False, True),
    ("3x3 pad exclude", (2, 2, 9, 7), 3, 1, 1, False, False),
    ("ceil include", (2, 2, 7, 9), 3, 2, 1, True, True),
    ("ceil exclude", (2, 2, 7, 9), 3, 2, 1, True, False),
    ("ceil no pad", (1, 3, 8, 10), (3, 2), (2, 3), 0, True, True),
]


def _pair(v):
    return [v, v] if isinstance(v, int) else list(v)


def _close(got, want, rtol, what):
    scale = max(float(np.max(np.abs(want))), 1e-300)
    err = float(np.max(np.abs(got - want)))
    assert err <= rtol * scale, f"{what}: max error {err:.3g} > {rtol} x {scale:.3g}"


def _needs_torch() -> None:
    if torch is None:
        pytest.skip("torch is not installed (pip install -e '.[torch]'): its oracle skips")


def _torch_run(fn, arrays):
    _needs_torch()
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = fn(*ts)
    wts = torch.tensor(np.random.default_rng(7).uniform(0.5, 1.5, tuple(y.shape)))
    (y * wts).sum().backward()
    return y.detach().numpy(), [t.grad.numpy() for t in ts], wts.numpy()


def _gt_run(fn, arrays, wts):
    tp = gt.Tape()
    ps = [tp.param(a) for a in arrays]
    y = fn(tp, *ps)
    loss = tp.sum(tp.mul(y, tp.const(wts)))
    tp.backward(loss)
    return tp, y, loss, ps


def _check_against_torch(gt_fn, torch_fn, arrays, what):
    ty, tgrads, wts = _torch_run(torch_fn, arrays)
    tp, y, loss, ps = _gt_run(gt_fn, arrays, wts)
    _close(tp.value(y), ty, VALUE_RTOL, f"{what} value")
    for p, tg in zip(ps, tgrads):
        _close(tp.grad(p), tg, GRAD_RTOL, f"{what} grad {p.id}")
    return tp, y, loss


def _conv_arrays(case, rng):
    _, xs, ws, *_rest, bias = case
    arrays = [rng.standard_normal(xs), rng.standard_normal(ws)]
    if bias:
        arrays.append(rng.standard_normal(ws[0]))
    return arrays


def _conv_fns(case):
    _, _, _, stride, padding, dilation, groups, bias = case

    def gt_fn(tp, x, w, b=None):
        return nn.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation,
                         groups=groups)

    def torch_fn(x, w, b=None):
        return F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation,
                        groups=groups)
    return gt_fn, torch_fn


@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv2d_matches_torch(case):
    rng = np.random.default_rng(len(case[0]))
    gt_fn, torch_fn = _conv_fns(case)
    _check_against_torch(gt_fn, torch_fn, _conv_arrays(case, rng), case[0])


def _max_pool_fns(case):
    _, _, k, s, p, d, ceil = case
    return (lambda tp, x: nn.max_pool2d(x, k, s, p, d, ceil_mode=ceil),
            lambda x: F.max_pool2d(x, k, s, p, d, ceil_mode=ceil))


@pytest.mark.parametrize("case", MAX_POOL_CASES, ids=[c[0] for c in MAX_POOL_CASES])
def test_max_pool2d_matches_torch(case):
    x = np.random.default_rng(3).standard_normal(case[1])
    _check_against_torch(*_max_pool_fns(case), [x], case[0])


@pytest.mark.parametrize("case", MAX_POOL_CASES, ids=[c[0] for c in MAX_POOL_CASES])
def test_max_pool2d_ties_go_to_the_first_maximum(case):
    """Rounded inputs: most windows hold equal maxima; torch also gives the first one."""
    x = np.round(np.random.default_rng(4).uniform(0, 2, case[1]))
    tp, y, _ = _check_against_torch(*_max_pool_fns(case), [x], case[0] + " ties")


def test_max_pool2d_nan_wins_and_takes_the_gradient():
    x = np.array([[[[1.0, np.nan, 5.0, np.nan]]]])
    tp = gt.Tape()
    p = tp.param(x)
    y = nn.max_pool2d(p, (1, 4), (1, 4))
    tp.backward(tp.sum(y))
    assert np.isnan(tp.value(y)).all()
    assert_bits_equal(tp.grad(p), np.array([[[[0.0, 1.0, 0.0, 0.0]]]]), "first NaN")


@pytest.mark.parametrize("case", AVG_POOL_CASES, ids=[c[0] for c in AVG_POOL_CASES])
def test_avg_pool2d_matches_torch(case):
    _, xs, k, s, p, ceil, incl = case
    x = np.random.default_rng(5).standard_normal(xs)
    _check_against_torch(
        lambda tp, v: nn.avg_pool2d(v, k, s, p, ceil_mode=ceil, count_include_pad=incl),
        lambda v: F.avg_pool2d(v, k, s, p, ceil_mode=ceil, count_include_pad=incl),
        [x], case[0])


def test_adaptive_avg_pool_to_one_is_the_mean_over_h_and_w():
    x = np.random.default_rng(6).standard_normal((3, 4, 5, 6))
    _check_against_torch(lambda tp, v: nn.global_avg_pool2d(v),
                         lambda v: F.adaptive_avg_pool2d(v, 1), [x], "adaptive 1x1")


def test_conv1d_through_conv2d():
    rng = np.random.default_rng(8)
    x, w, b = rng.standard_normal((2, 3, 17)), rng.standard_normal((4, 3, 5)), \
        rng.standard_normal(4)
    _check_against_torch(lambda tp, *v: nn.conv1d(*v, stride=2, padding=3, dilation=2),
                         lambda *v: F.conv1d(*v, stride=2, padding=3, dilation=2),
                         [x, w, b], "conv1d")


# ── the orders: compiled matmul kernel vs numpy twin, and the documented loops ─────

def _naive_conv(x, w, stride, padding, dilation, groups):
    """The documented order in plain Python loops: the matmul's inner-product contract
    (numerics.fma: s = fma(w, x, s) from +0.0) over (c, i, j) ascending."""
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    oh = nx.conv_out_size(h, kh, stride[0], padding[0], dilation[0])
    ow = nx.conv_out_size(wd, kw, stride[1], padding[1], dilation[1])
    out = np.empty((n, oc, oh, ow))
    ocg = oc // groups
    for b in range(n):
        for o in range(oc):
            g = o // ocg
            for y in range(oh):
                for z in range(ow):
                    s = 0.0
                    for ci in range(cg):
                        for i in range(kh):
                            for j in range(kw):
                                hh = y * stride[0] - padding[0] + i * dilation[0]
                                ww = z * stride[1] - padding[1] + j * dilation[1]
                                v = x[b, g * cg + ci, hh, ww] if 0 <= hh < h and 0 <= ww < wd \
                                    else 0.0
                                s = float(nx.fma(w[o, ci, i, j], v, s))
                    out[b, o, y, z] = s
    return out


def test_conv2d_forward_is_the_documented_loop_to_the_bit():
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal((2, 4, 6, 5)), rng.standard_normal((4, 2, 3, 2))
    geo = dict(stride=(2, 1), padding=(1, 1), dilation=(1, 2), groups=2)
    assert_bits_equal(nx.conv2d(x, w, **geo), _naive_conv(x, w, **geo), "conv2d order")


@pytest.mark.parametrize("case", CONV_CASES[:6], ids=[c[0] for c in CONV_CASES[:6]])
def test_compiled_and_numpy_paths_agree_to_the_bit(case, monkeypatch):
    """numerics.bmm runs the compiled matmul kernel; without it, bmm_numpy: same bits."""
    require_c_compiler()
    rng = np.random.default_rng(11)
    x, w = rng.standard_normal(case[1]), rng.standard_normal(case[2])
    g = None
    geo = dict(stride=tuple(_pair(case[3])), padding=tuple(_pair(case[4])),
               dilation=tuple(_pair(case[5])), groups=case[6])
    compiled = nx.conv2d(x, w, **geo)
    g = rng.standard_normal(compiled.shape)
    compiled_b = nx.conv2d_backward(g, x, w, **geo, need_x=True, need_w=True)
    monkeypatch.setattr(cpulib, "_DEFAULT", [None])
    plain = nx.conv2d(x, w, **geo)
    plain_b = nx.conv2d_backward(g, x, w, **geo, need_x=True, need_w=True)
    assert_bits_equal(compiled, plain, "forward")
    assert_bits_equal(compiled_b[0], plain_b[0], "dx")
    assert_bits_equal(compiled_b[1], plain_b[1], "dw")


def _wide(rng, shape):
    """Values over 60 binades, some exact zeros of both signs: summed in any other order
    than the documented one, the chains below round differently."""
    v = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, shape))
    flat = v.reshape(-1)
    flat[::11] = 0.0
    flat[::13] = -0.0
    return v


def _naive_conv_grads(g, x, w, stride, padding, dilation, groups):
    """numerics.conv2d_backward's documented orders in plain Python loops: dw[o, c, i, j]
    the FMA chain over (n, oh, ow) ascending from +0.0 (padding reads +0.0); dx each
    element 0.0 + term + ... over (i, j) ascending, each term the FMA chain over the
    group's output channels ascending from +0.0."""
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    ocg = oc // groups
    oh, ow = g.shape[2:]
    (sh, sw), (ph, pw), (dh, dw_) = stride, padding, dilation

    def xv(b, ch, y, z, i, j):
        hh, ww = y * sh - ph + i * dh, z * sw - pw + j * dw_
        return x[b, ch, hh, ww] if 0 <= hh < h and 0 <= ww < wd else 0.0
    dw = np.empty(w.shape)
    for o in range(oc):
        for ci in range(cg):
            for i in range(kh):
                for j in range(kw):
                    s = 0.0
                    for b in range(n):
                        for y in range(oh):
                            for z in range(ow):
                                s = float(nx.fma(g[b, o, y, z], xv(b, o // ocg * cg + ci, y, z,
                                                                   i, j), s))
                    dw[o, ci, i, j] = s
    dx = np.empty(x.shape)
    for b in range(n):
        for ch in range(c):
            grp, ci = divmod(ch, cg)
            for hh in range(h):
                for ww in range(wd):
                    s = 0.0
                    for i in range(kh):
                        for j in range(kw):
                            ty, tz = hh + ph - i * dh, ww + pw - j * dw_
                            if ty % sh or tz % sw or not (0 <= ty // sh < oh and
                                                          0 <= tz // sw < ow):
                                continue
                            t = 0.0
                            for o in range(grp * ocg, (grp + 1) * ocg):
                                t = float(nx.fma(w[o, ci, i, j], g[b, o, ty // sh, tz // sw], t))
                            s = s + t
                    dx[b, ch, hh, ww] = s
    return dx, dw


@pytest.mark.parametrize("numpy_path", [False, True], ids=["compiled", "numpy"])
def test_conv2d_gradients_are_the_documented_loops_to_the_bit(numpy_path, monkeypatch):
    """The compiled per-sample products (csrc/gt_conv.h: dw's chains carried from sample
    to sample) and the whole-batch numpy twin both give the documented orders' bits, on
    values where another order would not (checked: the reversed chain differs)."""
    if not numpy_path:
        require_c_compiler()
    else:
        monkeypatch.setattr(cpulib, "_DEFAULT", [None])
    rng = np.random.default_rng(21)
    x, w = _wide(rng, (3, 4, 7, 6)), _wide(rng, (4, 2, 3, 2))
    geo = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    y = nx.conv2d(x, w, **geo)
    assert_bits_equal(y, _naive_conv(x, w, **geo), "forward")
    g = _wide(rng, y.shape)
    dx, dw = nx.conv2d_backward(g, x, w, **geo, need_x=True, need_w=True)
    want_dx, want_dw = _naive_conv_grads(g, x, w, **geo)
    assert_bits_equal(dx, want_dx, "dx order")
    assert_bits_equal(dw, want_dw, "dw order")
    flipped = _naive_conv_grads(g[::-1].copy(), x[::-1].copy(), w, **geo)[1]
    assert not np.array_equal(bits(flipped), bits(want_dw)), "the data do not tell orders apart"


@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_per_sample_products_match_the_whole_batch_products(case):
    """numerics.conv2d / conv2d_backward (compiled, sample by sample) against
    conv2d_numpy / conv2d_backward_numpy (im2col of the batch, the compiled bmm), on
    wide-range values, every case, one thread and two."""
    require_c_compiler()
    from gradtool import native
    rng = np.random.default_rng(22)
    x, w = _wide(rng, case[1]), _wide(rng, case[2])
    geo = dict(stride=tuple(_pair(case[3])), padding=tuple(_pair(case[4])),
               dilation=tuple(_pair(case[5])), groups=case[6])
    want = nx.conv2d_numpy(x, w, **geo)
    g = _wide(rng, want.shape)
    want_b = nx.conv2d_backward_numpy(g, x, w, **geo, need_x=True, need_w=True)
    try:
        for threads in (1, 2):
            native.set_num_threads(threads)
            assert_bits_equal(nx.conv2d(x, w, **geo), want, f"forward, {threads} threads")
            got = nx.conv2d_backward(g, x, w, **geo, need_x=True, need_w=True)
            assert_bits_equal(got[0], want_b[0], f"dx, {threads} threads")
            assert_bits_equal(got[1], want_b[1], f"dw, {threads} threads")
    finally:
        native.set_num_threads(None)


def test_out_of_memory_fallbacks_give_the_same_bits(monkeypatch):
    """Built with -DGT_CONV_NO_BUFFERS every buffer allocation of csrc/gt_conv.h fails:
    the products then run their element-by-element loops (gt_mm_naive_conv) and the
    pools hand back to numpy; the bits are those of the default build."""
    require_c_compiler()
    lib = nx.cpu_library(extra_flags=("-DGT_CONV_NO_BUFFERS",))
    assert lib is not None
    rng = np.random.default_rng(24)
    case = CONV_CASES[-1]
    x, w = _wide(rng, case[1]), _wide(rng, case[2])
    geo = dict(stride=tuple(_pair(case[3])), padding=tuple(_pair(case[4])),
               dilation=tuple(_pair(case[5])), groups=case[6])
    y = nx.conv2d(x, w, **geo)
    g = _wide(rng, y.shape)
    dx, dw = nx.conv2d_backward(g, x, w, **geo, need_x=True, need_w=True)
    pool = ((3, 3), (1, 1), (1, 1), (1, 1), False)
    py = nx.max_pool2d(x, *pool)
    pdx = nx.max_pool2d_backward(py, x, *pool)
    monkeypatch.setattr(cpulib, "_DEFAULT", [lib])
    assert_bits_equal(nx.conv2d(x, w, **geo), y, "forward")
    got = nx.conv2d_backward(g, x, w, **geo, need_x=True, need_w=True)
    assert_bits_equal(got[0], dx, "dx")
    assert_bits_equal(got[1], dw, "dw")
    assert_bits_equal(nx.max_pool2d(x, *pool), py, "max pool")
    assert_bits_equal(nx.max_pool2d_backward(py, x, *pool), pdx, "max pool backward")


# more geometries for the compiled pools' paths: windows that never overlap (stride 3,
# with padding: edge windows partly outside), stride 1 without padding, LeNet's 2x2
POOL_PATHS = MAX_POOL_CASES + [
    ("disjoint 3x3 stride 3 padded", (2, 3, 11, 10), 3, 3, 1, 1, True),
    ("stride 1 no padding", (1, 2, 7, 9), (2, 3), 1, 0, 1, False),
    ("lenet 2x2", (4, 6, 24, 24), 2, 2, 0, 1, False),
]


@pytest.mark.parametrize("case", POOL_PATHS, ids=[c[0] for c in POOL_PATHS])
def test_compiled_max_pool_matches_the_numpy_loops(case, monkeypatch):
    """numerics.max_pool2d and its backward, compiled (csrc/gt_conv.h), against the numpy
    loops: ties, NaNs, signed zeros and -0.0 gradients, to the bit."""
    require_c_compiler()
    _, xs, k, s, p, d, ceil = case
    k, s, p, d = (tuple(_pair(v)) for v in (k, s, p, d))
    rng = np.random.default_rng(23)
    x = np.round(rng.standard_normal(xs) * 2) / 2          # many ties
    x.reshape(-1)[::17] = np.nan
    x.reshape(-1)[::19] = -0.0
    y = nx.max_pool2d(x, k, s, p, d, ceil)
    g = rng.standard_normal(y.shape)
    g.reshape(-1)[::5] = -0.0
    dx = nx.max_pool2d_backward(g, x, k, s, p, d, ceil)
    monkeypatch.setattr(cpulib, "_DEFAULT", [None])
    assert_bits_equal(y, nx.max_pool2d(x, k, s, p, d, ceil), f"{case[0]} forward")
    assert_bits_equal(dx, nx.max_pool2d_backward(g, x, k, s, p, d, ceil), f"{case[0]} backward")


# ── every case on the host backend, all three kernel variants ─────────────────────

def _host_cases():
    rng = np.random.default_rng(12)
    for case in CONV_CASES:
        yield case[0], _conv_fns(case)[0], _conv_arrays(case, rng)
    for case in MAX_POOL_CASES:
        yield "max " + case[0], _max_pool_fns(case)[0], [rng.standard_normal(case[1])]
    for case in AVG_POOL_CASES:
        _, xs, k, s, p, ceil, incl = case
        yield ("avg " + case[0],
               lambda tp, v, k=k, s=s, p=p, ceil=ceil, incl=incl: nn.avg_pool2d(
                   v, k, s, p, ceil_mode=ceil, count_include_pad=incl),
               [rng.standard_normal(xs)])


HOST_CASES = list(_host_cases())


@pytest.mark.parametrize("variant", ["tiled", "per-thread", "per-thread-reversed", "cuda"])
@pytest.mark.parametrize("case", HOST_CASES, ids=[c[0] for c in HOST_CASES])
def test_host_backend_is_bit_identical(case, variant):
    """Every case on the host backend's three kernel builds, and (on a GPU) on CUDA."""
    from gradtool.device import capture
    if variant == "cuda":
        from gradtool.device.cuda import cuda_status
        ok, why = cuda_status()
        if not ok:
            pytest.skip(f"no CUDA backend here: {why}")
    else:
        require_c_compiler()

    _, fn, arrays = case
    tp = gt.Tape()
    ps = [tp.param(a) for a in arrays]
    y = fn(tp, *ps)
    wts = np.random.default_rng(1).uniform(0.5, 1.5, tp.value(y).shape)
    loss = tp.sum(tp.mul(y, tp.const(wts)))
    tp.backward(loss)
    replay = (capture(tp, loss, "cuda") if variant == "cuda"
              else capture(tp, loss, "host", host_kernels=variant))
    replay.forward()
    replay.backward()
    assert_bits_equal(replay.value(y), tp.value(y), f"{case[0]} forward ({variant})")
    for p in ps:
        assert_bits_equal(replay.grad(p), tp.grad(p), f"{case[0]} grad ({variant})")


# ── batch norm, both modes ────────────────────────────────────────────────────────

@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_eval_matches_torch(affine):
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 4, 5, 6))
    rm, rv = rng.standard_normal(4), rng.uniform(0.5, 2.0, 4)
    wb = [rng.standard_normal(4), rng.standard_normal(4)] if affine else []

    def gt_fn(tp, v, *p):
        return nn.batch_norm2d(v, *(p or (None, None)), tp.const(rm), tp.const(rv), eps=1e-3)

    def torch_fn(v, *p):
        return F.batch_norm(v, torch.tensor(rm), torch.tensor(rv), *(p or (None, None)),
                            training=False, eps=1e-3)
    _check_against_torch(gt_fn, torch_fn, [x, *wb], "batch norm eval")


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_train_matches_torch_with_running_statistics(affine):
    _needs_torch()
    rng = np.random.default_rng(14)
    x = rng.standard_normal((4, 3, 5, 4)) * 2.0 + 0.5
    rm, rv = rng.standard_normal(3), rng.uniform(0.5, 2.0, 3)
    wb = [rng.standard_normal(3), rng.standard_normal(3)] if affine else []
    trm, trv = torch.tensor(rm), torch.tensor(rv)
    new = {}

    def gt_fn(tp, v, *p):
        y, new["mean"], new["var"] = nn.batch_norm2d_train(
            v, *(p or (None, None)), tp.const(rm), tp.const(rv), momentum=0.3)
        return y

    def torch_fn(v, *p):
        return F.batch_norm(v, trm, trv, *(p or (None, None)), training=True, momentum=0.3)
    tp, _, _ = _check_against_torch(gt_fn, torch_fn, [x, *wb], "batch norm train")
    _close(tp.value(new["mean"]), trm.numpy(), VALUE_RTOL, "running mean")
    _close(tp.value(new["var"]), trv.numpy(), VALUE_RTOL, "running var")


def test_batch_norm_train_fd_check_and_host_replay():
    require_c_compiler()
    from gradtool.device import capture

    rng = np.random.default_rng(15)
    tp = gt.Tape()
    x = tp.param(rng.standard_normal((3, 2, 3, 3)))
    w, b = tp.param(rng.uniform(0.5, 1.5, 2)), tp.param(rng.standard_normal(2))
    y, _, _ = nn.batch_norm2d_train(x, w, b)
    loss = tp.sum(tp.mul(y, tp.const(rng.uniform(0.5, 1.5, (3, 2, 3, 3)))))
    tp.backward(loss)
    replay = capture(tp, loss, "host")
    replay.forward()
    replay.backward()
    for p in (x, w, b):
        assert_bits_equal(replay.grad(p), tp.grad(p), f"grad {p.id}")
    assert gt.fd_check(tp, loss, eps=1e-6, rtol=1e-5, atol=1e-7).passed


def test_a_file_whose_conv_padding_needs_gigabytes_is_refused_at_load(monkeypatch):
    """A tiny output can hide a huge padded input and im2col columns (numpy's conv2d,
    GRADTOOL_NATIVE=0: the compiled one reads padding in place and needs neither): the
    loader's budget counts them (budget.node_temporary) before anything is allocated."""
    import msgpack
    monkeypatch.setenv("GRADTOOL_NATIVE", "0")

    from gradtool.tapefile import dumps, load
    tp = gt.Tape()
    y = tp.conv2d(tp.param(np.ones((1, 1, 1, 1))), tp.param(np.ones((1, 1, 1, 1))))
    loss = tp.sum(y)
    doc = msgpack.unpackb(dumps(tp, loss=loss))
    doc["nodes"][y.id].update(padding=[100000, 100000], stride=[300000, 300000])
    with pytest.raises(gt.TapeFileError) as err:
        load(msgpack.packb(doc), name="pad.msgpack")
    assert err.value.node == y.id and "memory" in str(err.value)


# ── 3-d: conv3d, max_pool3d, avg_pool3d as 2-d ops per output depth ──────────

def _oracle3d(build, torch_build, x, *params):
    """Value and gradients (of sum(y * w) with random w) of ours and torch float64's."""
    _needs_torch()
    rng = np.random.default_rng(5)
    tp = gt.Tape()
    leaves = [tp.param(a) for a in (x, *params)]
    y = build(*leaves)
    w = rng.uniform(0.5, 1.5, tp.value(y).shape)
    tp.backward(tp.sum(tp.mul(y, tp.const(w))))
    tl = [torch.tensor(a, requires_grad=True) for a in (x, *params)]
    ty = torch_build(*tl)
    (ty * torch.tensor(w)).sum().backward()
    assert tp.value(y).shape == tuple(ty.shape)
    assert np.abs(tp.value(y) - ty.detach().numpy()).max() <= 1e-12 * np.abs(ty.detach().numpy()).max()
    for leaf, t in zip(leaves, tl, strict=True):
        assert np.linalg.norm(tp.grad(leaf) - t.grad.numpy()) <= 1e-12 * np.linalg.norm(t.grad.numpy())
    return tp, y


@pytest.mark.parametrize("kw", [dict(), dict(stride=(2, 1, 2), padding=(1, 1, 0),
                                             dilation=(2, 1, 1), groups=2)])
def test_conv3d_matches_torch_and_the_host_backend(kw):
    from support import host_matches
    rng = np.random.default_rng(6)
    x, b = rng.normal(size=(2, 4, 7, 6, 5)), rng.normal(size=6)
    w = rng.normal(size=(6, 4 // kw.get("groups", 1), 3, 2, 3))
    tp, y = _oracle3d(lambda a, v, c: nn.conv3d(a, v, c, **kw),
                      lambda a, v, c: F.conv3d(a, v, c, **kw), x, w, b)
    host_matches(tp, tp.sum(y))


@pytest.mark.parametrize("kw", [dict(kernel=2), dict(kernel=(3, 2, 2), stride=(2, 1, 2),
                                                     padding=(1, 1, 0), dilation=(1, 2, 1),
                                                     ceil_mode=True)])
def test_max_pool3d_matches_torch(kw):
    x = np.random.default_rng(7).normal(size=(2, 3, 7, 6, 5))
    k = kw.pop("kernel")
    _oracle3d(lambda a: nn.max_pool3d(a, k, **kw), lambda a: F.max_pool3d(a, k, **kw), x)


@pytest.mark.parametrize("kw", [dict(kernel=2), dict(kernel=(3, 3, 2), stride=(2, 1, 2),
                                                     padding=(1, 1, 0), count_include_pad=False),
                                dict(kernel=(3, 1, 1), stride=1, padding=(1, 0, 0))])
def test_avg_pool3d_matches_torch(kw):
    x = np.random.default_rng(8).normal(size=(2, 3, 7, 6, 5))
    k = kw.pop("kernel")
    _oracle3d(lambda a: nn.avg_pool3d(a, k, **kw), lambda a: F.avg_pool3d(a, k, **kw), x)


def test_3d_layers_refuse_bad_shapes_in_one_line():
    tp = gt.Tape()
    x = tp.param(np.zeros((2, 3, 4, 4)))
    with pytest.raises(gt.TapeError, match=r"nn.max_pool3d: expected x \[N, C, D, H, W\]"):
        nn.max_pool3d(x, 2)
    v = tp.param(np.zeros((1, 1, 2, 4, 4)))
    with pytest.raises(gt.TapeError, match="nn.conv3d: the depth window"):
        nn.conv3d(v, tp.param(np.zeros((1, 1, 3, 1, 1))))
    with pytest.raises(gt.TapeError, match="nn.avg_pool3d kernel: expected an int or three ints"):
        nn.avg_pool3d(v, (2, 2))
    with pytest.raises(gt.TapeError, match=r"nn.conv3d: expected w \[OC, C/groups, KD, KH, KW\]"):
        nn.conv3d(v, tp.param(np.zeros((1, 1, 3, 3))))
    with pytest.raises(gt.TapeError, match="nn.max_pool3d: the depth's kernel, stride and "
                                           "dilation must be >= 1"):
        nn.max_pool3d(v, 2, stride=0)
