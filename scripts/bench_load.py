"""Loading at the node limit: a chain of 2^20 ``neg`` nodes (the most nodes a file may
have, each as small as a node gets), through the commands that load it.

    python scripts/bench_load.py [--nodes N] [--runs R] [--checkout DIR]

Prints, for ``gradtool inspect``, ``inspect --json`` and ``backward`` run as fresh
processes, the median wall time and CPU time of R runs, then the in-process stages of
``gradtool.tapefile.load`` (decode, check, replay; CPU time).  ``--checkout DIR`` runs
the same commands against another checkout of gradtool (e.g. an older commit, made
with ``git worktree add``), for a side-by-side comparison on the same machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def chain(nodes: int) -> bytes:
    doc = {"format": "gradtool-tape", "version": 1, "nodes": [
        {"op": "param", "a": -1, "b": -1, "s": 0.0, "shape": [1], "name": "x",
         "data": np.ones(1).astype("<f8").tobytes()}]}
    doc["nodes"] += [{"op": "neg", "a": i, "b": -1, "s": 0.0, "shape": [1]}
                     for i in range(nodes - 1)]
    return msgpack.packb(doc, use_bin_type=True)


def timed(args, checkout: Path) -> tuple:
    """(wall seconds, CPU seconds of the child) of one run."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # in the checkout's folder: `python -c` puts the current folder first on sys.path
    subprocess.run([sys.executable, "-c", "from gradtool.cli import main; main()", *args],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True,
                   cwd=checkout)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def stages(path: Path) -> dict:
    sys.path.insert(0, str(ROOT))
    from gradtool.tapefile import checks as tapefile_checks
    from gradtool.tapefile import read as tapefile_read
    from gradtool.tapefile import replay as tapefile_replay
    raw = path.read_bytes()
    limits = tapefile_checks.Limits()
    out = {}
    with tapefile_read.gc_paused():
        clock = time.process_time
        t = clock()
        doc = tapefile_checks.decode(raw, str(path), limits)
        out["decode"] = clock() - t
        t = clock()
        checked = tapefile_checks.check(doc, str(path), limits)
        out["check"] = clock() - t
        t = clock()
        tapefile_replay.replay(checked, str(path))
        out["replay"] = clock() - t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1 << 20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--checkout", type=Path, default=ROOT)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chain.msgpack"
        path.write_bytes(chain(opts.nodes))
        print(f"{opts.nodes} nodes, {path.stat().st_size / 1e6:.1f} MB; gradtool from "
              f"{opts.checkout}; median of {opts.runs} runs")
        for command in (["inspect"], ["inspect", "--json"], ["backward"]):
            runs = [timed([*command, str(path)], opts.checkout) for _ in range(opts.runs)]
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            print(f"  gradtool {' '.join(command):15s} {wall:6.2f} s wall  {cpu:6.2f} s CPU")
        if opts.checkout == ROOT:
            print("  load stages (CPU): " + ", ".join(f"{k} {v:.2f} s"
                                                    for k, v in stages(path).items()))


if __name__ == "__main__":
    main()
