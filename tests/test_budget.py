"""The memory model of gradtool.budget against what numpy really allocates.

For every op (broadcasting, reductions and matrix products included) the peak
that ``tracemalloc`` sees while the tape is replayed and differentiated must
stay within the model's gradients plus its largest temporary: the loader's
memory budget is only a bound if this holds.
"""

import re
import tracemalloc

import msgpack
import numpy as np
import pytest

from gradtool import Tape
from gradtool.budget import (BudgetError, estimate_memory, human_bytes, parse_size,
                             tape_memory)
from gradtool.errors import TapeFileError
from gradtool.tapefile import Limits, load, save
from support import assert_one_line_error, run

M = 256


def _cases():
    r = np.random.default_rng(0)

    def leaf(shape, offset=0.5):
        return r.random(shape) + offset

    cases = {}
    for op in ("add", "sub", "mul", "div"):
        cases[f"{op} same"] = lambda tp, op=op: getattr(tp, op)(tp.param(leaf((M, M))),
                                                                tp.param(leaf((M, M))))
        cases[f"{op} broadcast"] = lambda tp, op=op: getattr(tp, op)(tp.param(leaf((M, 1))),
                                                                     tp.param(leaf((1, M))))
        cases[f"{op} one side"] = lambda tp, op=op: getattr(tp, op)(tp.param(leaf((M, M))),
                                                                    tp.const(leaf((M,))))
    for op in ("neg", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "sum", "mean",
               "transpose"):
        cases[op] = lambda tp, op=op: getattr(tp, op)(tp.param(leaf((M, M))))
    cases["adds"] = lambda tp: tp.adds(tp.param(leaf((M, M))), 2.0)
    cases["muls"] = lambda tp: tp.muls(tp.param(leaf((M, M))), 2.0)
    cases["reshape"] = lambda tp: tp.reshape(tp.param(leaf((M, M))), [M * M])
    cases["softmax 0"] = lambda tp: tp.softmax(tp.param(leaf((M, M))), 0)
    cases["softmax 1"] = lambda tp: tp.softmax(tp.param(leaf((M, M))), 1)
    cases["slice"] = lambda tp: tp.slice(tp.param(leaf((M, M))), [1, 0], [M, M // 2])
    cases["concat"] = lambda tp: tp.concat(tp.param(leaf((M, M))), tp.param(leaf((M, 3))), 1)
    cases["matmul"] = lambda tp: tp.matmul(tp.param(leaf((M, 16))), tp.param(leaf((16, M))))
    cases["matmul long k"] = lambda tp: tp.matmul(tp.param(leaf((8, M * 8))),
                                                  tp.param(leaf((M * 8, 8))))
    cases["bmm"] = lambda tp: tp.bmm(tp.param(leaf((3, M // 2, 16))),
                                     tp.param(leaf((3, 16, M // 2))))
    # the ops for models: axis reductions, max, |x|, maximum, log_softmax, gathers by ids,
    # a broadcast batch
    for op in ("sum", "mean", "max"):
        cases[f"{op} axis 0"] = lambda tp, op=op: getattr(tp, op)(tp.param(leaf((M, M))), axis=0)
        cases[f"{op} axis 1 keepdims"] = lambda tp, op=op: getattr(tp, op)(
            tp.param(leaf((M, M))), axis=1, keepdims=True)
    cases["max all"] = lambda tp: tp.max(tp.param(leaf((M, M))))
    cases["abs"] = lambda tp: tp.abs(tp.param(leaf((M, M), -0.5)))
    cases["maximum broadcast"] = lambda tp: tp.maximum(tp.param(leaf((M, 1))),
                                                       tp.param(leaf((1, M))))
    cases["log_softmax"] = lambda tp: tp.log_softmax(tp.param(leaf((M, M))), axis=1)
    ids = r.integers(0, M, (M, 4))
    cases["take"] = lambda tp: tp.take(tp.param(leaf((M, M))), tp.const(ids, dtype="i64"))
    cases["take_along"] = lambda tp: tp.take_along(tp.param(leaf((M, M))),
                                                   tp.const(ids, dtype="i64"), axis=1)
    cases["scatter"] = lambda tp: tp.scatter(tp.param(leaf((M, 4, M))),
                                             tp.const(ids, dtype="i64"), rows=M)
    cases["bmm broadcast"] = lambda tp: tp.bmm(tp.param(leaf((4, M // 2, 16))),
                                               tp.param(leaf((1, 16, M // 2))))
    # conv2d and the pools hold im2col columns and padded copies (budget.node_temporary)
    cases["conv2d"] = lambda tp: tp.conv2d(tp.param(leaf((4, 6, 24, 24))),
                                           tp.param(leaf((8, 3, 5, 5))), stride=[1, 1],
                                           padding=[2, 2], dilation=[1, 1], groups=2)
    cases["max_pool2d"] = lambda tp: tp.max_pool2d(tp.param(leaf((4, 6, 32, 32))),
                                                   kernel=[3, 3], stride=[2, 2],
                                                   padding=[1, 1], dilation=[1, 1],
                                                   ceil_mode=True)
    cases["avg_pool2d"] = lambda tp: tp.avg_pool2d(tp.param(leaf((4, 6, 32, 32))),
                                                   kernel=[3, 3], stride=[2, 2],
                                                   padding=[1, 1])
    cases["mlp"] = lambda tp: tp.mse(tp.tanh(tp.const(leaf((M, 32))) @ tp.param(leaf((32, M)))
                                             + tp.param(leaf((M,)))), tp.const(leaf((M, M))))
    return cases


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_replay_and_backward_stay_within_the_model(name):
    tracemalloc.start()          # before recording: the values must be traced too
    try:
        tp = Tape()
        out = CASES[name](tp)
        loss = tp.sum(out) if tp.value(out).size > 1 else out
        est = tape_memory(tp, loss.id)
        tp.forward()
        tp.backward(loss)        # warm up (native libraries, caches)
        tp.zero_grad()
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        tp.forward()
        tp.backward(loss)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    slack = 16 * 1024            # Python objects: nodes' bookkeeping, views, small arrays
    allowed = 8 * (est.grads + est.temporary)
    assert peak <= allowed + slack, f"{name}: measured {peak} bytes over the values, model {allowed}"
    # and the model is not vacuous: it is within a small factor of what was measured
    assert allowed <= 3 * peak, f"{name}: model {allowed}, measured {peak}"


def test_gradients_are_counted_only_where_backward_reaches():
    # const -> neg -> sum: nothing requires grad, so only the loss gets a gradient
    ops, a, b = ["const", "neg", "sum"], [-1, 0, 1], [-1, -1, -1]
    est = estimate_memory(ops, a, b, [1000, 1000, 1], [0, 1000, 1000], loss=2)
    assert est.values == 2001 and est.grads == 1 and est.backward_work == 0
    est = estimate_memory(["param"] + ops[1:], a, b, [1000, 1000, 1], [0, 1000, 1000], loss=2)
    assert est.grads == 2001 and est.backward_work == 2000
    assert est.temporary == 4 * 1000 and est.temporary_node == 2


def test_sizes_parse_in_binary_units():
    assert parse_size("2G") == 2 << 30 and parse_size("512MiB") == 512 << 20
    assert parse_size("1.5k") == 1536 and parse_size(" 4096 ") == 4096
    for bad in ("", "two", "-1G", "0", "1Q", "1e999", "9" * 400):
        with pytest.raises(BudgetError):
            parse_size(bad)
    assert human_bytes(1023) == "1023 bytes" and human_bytes(3 << 29) == "1.5 GiB"


# ── the budgets where they apply ───────────────────────────────────────────

def leaf(shape, op="param", name=None) -> dict:
    node = {"op": op, "a": -1, "b": -1, "s": 0.0, "shape": list(shape),
            "data": np.ones(shape).astype("<f8").tobytes()}
    return {**node, "name": name} if name else node


def broadcast_bomb(tmp_path, op="param", n=8192):
    """The issue's reproducer: [8192,1] * [1,8192], then sum: a 131 KB file whose values
    fit the element budget (2^26 + 2^14 of 2^27) but whose backward needs over 2 GiB."""
    doc = {"format": "gradtool-tape", "version": 1, "nodes": [
        leaf([n, 1], op), leaf([1, n], op),
        {"op": "mul", "a": 0, "b": 1, "s": 0.0, "shape": [n, n]},
        {"op": "sum", "a": 2, "b": -1, "s": 0.0, "shape": [1]}]}
    path = tmp_path / "bomb.msgpack"
    path.write_bytes(msgpack.packb(doc, use_bin_type=True))
    return path


@pytest.mark.parametrize("command", [["inspect"], ["backward"], ["fd-check"],
                                     ["replay-gpu", "--backend", "host"], ["emit-cuda"]])
def test_a_small_file_whose_backward_needs_gigabytes_is_refused_at_load(tmp_path, command):
    path = broadcast_bomb(tmp_path)
    assert path.stat().st_size < 140_000
    line = assert_one_line_error(run(*command, path), 2)
    assert line.startswith(f"gradtool: {path}: node 3: replay and backward would need about "
                           f"3.0 GiB (values 512.1 MiB, gradients 512.1 MiB, the largest "
                           f"temporary 2.0 GiB)")
    assert "over this reader's memory limit of 2.0 GiB" in line and "[8192,8192]" in line
    assert "--max-memory" in line


def test_the_loader_budget_counts_gradients_only_where_backward_goes(tmp_path):
    # [512,1] * [1,512]: with params 12.6 MB (values, gradients, 4x temporaries); with
    # consts backward stops at the loss: values and forward's 2x temporaries, 6.3 MB
    limits = Limits(max_memory=8 << 20)
    with pytest.raises(TapeFileError, match=r"about 12\.0 MiB \(values 2\.0 MiB, gradients "
                                            r"2\.0 MiB, the largest temporary 8\.0 MiB\)"):
        load(broadcast_bomb(tmp_path, "param", 512), limits=limits)
    load(broadcast_bomb(tmp_path, "const", 512), limits=limits)
    est = tape_memory(_two_leaf_tape(), 3)
    assert est.grads == 1 + 6 + 2 + 3


def _two_leaf_tape():
    tp = Tape()
    a, b = tp.param(np.ones((2, 1))), tp.param(np.ones((1, 3)))
    tp.sum(tp.mul(a, b))
    return tp


def test_max_memory_is_one_option_for_loading_and_its_errors_are_one_line(tmp_path):
    tp = Tape()
    tp.sum(tp.tanh(tp.param(np.ones((64, 64)), name="w")))
    path = tmp_path / "t.msgpack"
    save(tp, path)
    assert run("inspect", path).exit_code == 0
    line = assert_one_line_error(run("--max-memory", "100K", "inspect", path), 2)
    assert "about 256.0 KiB" in line and "memory limit of 100.0 KiB" in line
    assert run("--max-memory", "1M", "backward", path).exit_code == 0
    for bad in ("lots", "0", "-5M"):
        assert_one_line_error(run("--max-memory", bad, "inspect", path), 2, "--max-memory")
    with pytest.raises(TapeFileError, match="memory limit of 1.0 KiB"):
        load(path, limits=Limits(max_memory=1024))


def test_a_device_program_over_the_budget_is_refused_before_anything_is_allocated():
    from gradtool.device.engine import capture
    from gradtool.device.program import CaptureError
    from gradtool.optim import Adam
    tp = Tape()
    w = tp.param(np.ones((128, 128)), name="w")
    loss = tp.sum(tp.tanh(w))
    opt = Adam(1e-3)
    opt.add(tp, w)
    with pytest.raises(CaptureError) as info:
        capture(tp, loss, "host", optimizer=opt, max_bytes=400_000)
    # Adam's m and v (2 x 128 KiB) and the control buffer: 4 flags + the entry's scalars
    from gradtool.device.optimizer import CTL_SIZE
    state = f"{(2 * 128 * 128 * 8 + CTL_SIZE * 8) / 1024:.1f}"
    assert re.match(r"the device program needs 768\.\d KiB \(values 256\.0 KiB, gradients "
                    rf"256\.0 KiB, optimizer state and scratch {re.escape(state)} KiB, launch "
                    r"metadata \d+ bytes\), over the memory limit of 390\.6 KiB", str(info.value))
    capture(tp, loss, "host", optimizer=opt, max_bytes=800_000)


def _walks_node_by_node(ops, a, b, loss):
    """The model's two walks written as plain loops (estimate_memory takes them with
    pointer jumping): which nodes require grad, which ones the backward walk reaches."""
    n = len(ops)
    requires = [False] * n
    for i in range(n):
        if a[i] < 0:
            requires[i] = ops[i] == "param"
        else:
            requires[i] = requires[a[i]] or (b[i] >= 0 and requires[b[i]])
    reached = [False] * n
    reached[loss] = True
    for i in range(loss, -1, -1):
        if reached[i] and requires[i] and a[i] >= 0:
            for x in (a[i], b[i]):
                if x >= 0 and requires[x]:
                    reached[x] = True
    return requires, reached


def test_the_walks_taken_in_bulk_match_the_node_by_node_walks():
    rng = np.random.default_rng(23)
    for trial in range(400):
        n = int(rng.integers(1, 60))
        ops, a, b = [], [], []
        for i in range(n):
            kind = rng.random()
            if i == 0 or kind < 0.15:
                ops.append("param" if rng.random() < 0.5 else "const")
                a.append(-1)
                b.append(-1)
            elif kind < 0.7:               # unary: chains, and values read twice
                ops.append("neg")
                a.append(i - 1 if rng.random() < 0.6 else int(rng.integers(i)))
                b.append(-1)
            else:
                ops.append("add")
                a.append(int(rng.integers(i)))
                b.append(int(rng.integers(i)))
        loss = int(rng.integers(n))
        sizes = [int(rng.integers(1, 50)) for _ in range(n)]
        works = [0 if a[i] < 0 else int(rng.integers(1, 90)) for i in range(n)]
        requires, reached = _walks_node_by_node(ops, a, b, loss)
        est = estimate_memory(ops, a, b, sizes, works, loss)
        assert est.values == sum(sizes)
        assert est.grads == sum(s for s, r in zip(sizes, reached) if r), trial
        sides = [0 if not (reached[i] and requires[i] and a[i] >= 0) or i > loss else
                 requires[a[i]] + (b[i] >= 0 and requires[b[i]]) for i in range(n)]
        assert est.backward_work == sum(s * w for s, w in zip(sides, works)), trial
