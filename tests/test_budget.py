"""The memory model of gradtool.budget against what numpy really allocates.

For every op (broadcasting, reductions and matrix products included) the peak
that ``tracemalloc`` sees while the tape is replayed and differentiated must
stay within the model's gradients plus its largest temporary: the loader's
memory budget is only a bound if this holds.
"""

import tracemalloc

import numpy as np
import pytest

from gradtool import Tape
from gradtool.budget import (BudgetError, estimate_memory, human_bytes, parse_size,
                             tape_memory)

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
