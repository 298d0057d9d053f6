"""What keeping cross entropy's ignore_index mask on the tape costs: one forward + backward.

    python scripts/bench_masks.py [--rows 4096] [--classes 100] [--repeats 7] [--steps 20]

Three losses over the same logits ([rows, classes] from x @ w + b, x [rows, 64]):
  masked   torch.export's decomposition of F.cross_entropy(ignore_index=-100), recorded
           through the Tape: ne -> where -> reshape -> take_along(log_softmax) -> neg ->
           where -> sum / to_f64(sum(mask)) (tests/test_masks.py's ce_tape), targets an i64
           input slot with 20% of them -100;
  plain    gradtool.nn.softmax_cross_entropy on the same rows without the mask (every
           target kept): the gather alone, for reference;
  torch    F.cross_entropy(x @ w + b, target, ignore_index=-100) in float64, eager.
gradtool rows run on the CPU engine (numpy reference) and the host device backend.  Each
figure is the median over --repeats of the mean step time over --steps steps.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gradtool as gt  # noqa: E402


def tapes(rows, classes, rng):
    x = rng.normal(size=(rows, 64))
    w0 = rng.normal(size=(64, classes)) * 0.1
    target = rng.integers(0, classes, rows)
    target[rng.random(rows) < 0.2] = -100
    out = {}
    for kind in ("masked", "plain"):
        tp = gt.Tape()
        xv = tp.const(x, name="x")
        w = tp.param(w0, name="w")
        b = tp.param(np.zeros((1, classes)), name="b")
        logits = tp.add(tp.matmul(xv, w), b)
        if kind == "masked":
            t = tp.const(target, name="target", dtype="i64")
            valid = tp.ne(t, -100)
            ids = tp.reshape(tp.where(valid, t, 0), [rows, 1])
            nll = tp.neg(tp.reshape(tp.take_along(tp.log_softmax(logits, axis=1), ids,
                                                  axis=1), [rows]))
            loss = tp.div(tp.sum(tp.where(valid, nll, 0.0)), tp.to_f64(tp.sum(valid)))
        else:
            ids = tp.const(np.maximum(target, 0)[:, None], name="target", dtype="i64")
            loss = gt.nn.softmax_cross_entropy(logits, ids, axis=1)
        out[kind] = (tp, loss)
    return out, (x, w0, target)


def timed(step, steps, repeats):
    step()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        runs.append((time.perf_counter() - t0) / steps)
    return statistics.median(runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    built, (x, w0, target) = tapes(args.rows, args.classes, rng)
    rows = []
    for kind, (tp, loss) in built.items():
        def cpu(tp=tp, loss=loss):
            tp.forward()
            tp.zero_grad()
            tp.backward(loss)
        rows.append((f"{kind} cpu", timed(cpu, args.steps, args.repeats)))
        try:
            from gradtool.device import capture
            rp = capture(tp, loss, "host")
        except Exception as exc:  # no C compiler
            print(f"host skipped: {exc}", file=sys.stderr)
            continue
        rows.append((f"{kind} host", timed(lambda rp=rp: rp.episode(train=False),
                                           args.steps, args.repeats)))
    try:
        import torch
        import torch.nn.functional as F
        tx, tt = torch.tensor(x), torch.tensor(target)
        tw = torch.tensor(w0).requires_grad_()
        tb = torch.zeros((1, args.classes), dtype=torch.float64).requires_grad_()

        def eager():
            tw.grad = tb.grad = None
            F.cross_entropy(tx @ tw + tb, tt, ignore_index=-100).backward()
        rows.append(("torch eager f64", timed(eager, args.steps, args.repeats)))
    except ImportError:
        pass
    print(f"cross entropy, {args.rows} rows x {args.classes} classes, forward + backward "
          f"(median of {args.repeats} x {args.steps} steps)")
    for name, sec in rows:
        print(f"  {name:<18} {sec * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
