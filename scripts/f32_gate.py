"""The float32 gate: the autoencoder trained 30 Adam steps in f32 and in f64.

    python scripts/f32_gate.py [--backend host|cuda|...|all] [--steps 30] [--json]

(``--backend``: any backend of the device registry, :mod:`gradtool.device.backends`;
``all``, the default: every registered backend this machine can run.)

The original design's f32 release (0.6.0) gated its float32 device replay on
training, not on one episode: the autoencoder sample (samples/autoencoder/),
30 Adam steps at the tape's lr over its first batches in file order, once in
float32 and once in float64 on the same backend.  The worst relative gap
must stay

* <= 1e-5 on the loss trajectory: max over steps |l32 - l64| / |l64|;
* <= 4e-4 on the final parameters: max over the parameter tensors of
  max|p32 - p64| / max|p64| (:func:`gradtool.device.engine.relative_error`).

Both are checked per-node and fused (fusion changes no bit in either
precision, so the fused gaps equal the per-node ones).  The test is
tests/test_fusion.py; the figures measured with this command are in
docs/device.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))             # this checkout's gradtool

from gradtool.device import backends  # noqa: E402
from gradtool.device.engine import capture, relative_error  # noqa: E402

LOSS_BOUND = 1e-5
PARAM_BOUND = 4e-4
STEPS = 30
SAMPLE = ROOT / "samples" / "autoencoder"


def run_autoencoder(dtype: str, fuse: bool, backend: str = "host", steps: int = STEPS):
    """``steps`` Adam episodes of the autoencoder sample: (losses array, final params)."""
    from gradtool.optim import AdamSeed as Adam
    from gradtool.tapefile import load

    tf = load(SAMPLE / "ae.msgpack")
    tp = tf.tape
    opt = Adam(float(tf.meta["train"]["lr"]))
    for p in tp.params():
        opt.add(tp, p)
    data = np.load(SAMPLE / "ae_data.npz")["x"]
    batch = tp.values[tp.input_slots()[0].id].shape[0]
    batches = data.shape[0] // batch
    rp = capture(tp, tf.loss.id, backend, dtype, optimizer=opt, fuse=fuse)
    x = tp.input_slots()[0]
    losses = []
    for s in range(steps):
        k = s % batches
        rp.set_input(x, data[k * batch:(k + 1) * batch])
        losses.append(rp.episode(train=True))
    return np.array(losses), [rp.value(p) for p in tp.params()]


def gaps(run32, run64) -> tuple:
    """(loss trajectory gap, final parameter gap) of an f32 run against an f64 run."""
    l32, l64 = run32[0], run64[0]
    with np.errstate(all="ignore"):
        loss_gap = float(np.max(np.abs(l32 - l64) / np.abs(l64)))
    param_gap = max(relative_error(a, b) for a, b in zip(run32[1], run64[1], strict=True))
    return loss_gap, param_gap


def measure(backend: str, steps: int = STEPS) -> list:
    """One row per mode (per-node, fused): the gaps and whether fusion kept every bit."""
    rows = []
    runs = {(dt, fuse): run_autoencoder(dt, fuse, backend, steps)
            for dt in ("f64", "f32") for fuse in (False, True)}
    for fuse in (False, True):
        loss_gap, param_gap = gaps(runs["f32", fuse], runs["f64", fuse])
        same = all(np.array_equal(np.concatenate([runs[dt, True][0]] + [p.ravel() for p in
                                                                        runs[dt, True][1]]),
                                  np.concatenate([runs[dt, False][0]] + [p.ravel() for p in
                                                                         runs[dt, False][1]]))
                   for dt in ("f64", "f32"))
        rows.append({"backend": backend, "fuse": fuse, "steps": steps, "loss_gap": loss_gap,
                     "param_gap": param_gap, "fused_bits_equal_per_node": same,
                     "ok": loss_gap <= LOSS_BOUND and param_gap <= PARAM_BOUND})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=[*backends.names(), "all"], default="all",
                    help="all: every registered backend this machine can run, e.g. host, "
                         "and cuda when a GPU answers (default)")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    chosen = ([n for n in backends.names() if backends.get(n).status()[0]]
              if args.backend == "all" else [args.backend])
    rows = [row for b in chosen for row in measure(b, args.steps)]
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"# f32 gate: autoencoder, {args.steps} Adam steps, f32 vs f64; bounds: loss "
              f"{LOSS_BOUND:g}, params {PARAM_BOUND:g}")
        for r in rows:
            mode = "fused" if r["fuse"] else "per-node"
            print(f"{r['backend']:<5} {mode:<9} loss gap {r['loss_gap']:.3g}  param gap "
                  f"{r['param_gap']:.3g}  {'ok' if r['ok'] else 'FAILED'}"
                  f"{'' if r['fused_bits_equal_per_node'] else '  (fused != per-node!)'}")
    return 0 if all(r["ok"] and r["fused_bits_equal_per_node"] and math.isfinite(r["loss_gap"])
                    for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
