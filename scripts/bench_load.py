"""Loading at the node limit: a chain of 2^20 ``neg`` nodes (the most nodes a file may
have, each as small as a node gets), through the commands that load it.

    python scripts/bench_load.py [--nodes N] [--runs R] [--checkout DIR] [--baseline REV]
                                 [--commands load,inspect-json,inspect,backward]
                                 [--sources none|ids|floor|compare]

Prints, for loading alone (``gradtool.load`` in a fresh process), ``gradtool inspect
--json``, ``inspect`` and ``backward`` run as fresh processes, the median wall time and
CPU time of R runs, then the in-process stages of ``gradtool.tapefile.load`` (decode,
check, replay; CPU time).  ``--baseline REV`` (default ``HEAD~1`` style revisions, e.g.
``1d644f5``) also runs every command against that commit of gradtool (extracted with
``git archive`` into a temporary folder), the runs of the two interleaved, and prints
the two side by side.  ``--checkout DIR`` runs the commands against another checkout
instead of this one.
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


SOURCES = ("none", "ids", "floor", "compare")


def chain(nodes: int, sources: str = "none") -> bytes:
    """``nodes`` nodes: a param, then a chain of ``neg``.  ``sources`` puts whole numbers
    in it (which the loader's columns must leave out of their runs): ``ids``, token ids
    (an i64 const) read by a ``take`` at the start; ``floor``, ``compare``, a ``floor`` or
    a ``gt`` every 1024 nodes, each made fractional again by ``adds 0.25``."""
    doc = {"format": "gradtool-tape", "version": 1, "nodes": [
        {"op": "param", "a": -1, "b": -1, "s": 0.0, "shape": [1], "name": "x",
         "data": np.ones(1).astype("<f8").tobytes()}]}
    out = doc["nodes"]
    if sources == "ids":
        out.append({"op": "const", "a": -1, "b": -1, "s": 0.0, "shape": [1], "name": "ids",
                    "dtype": "i64", "data": np.zeros(1).astype("<i8").tobytes()})
        out.append({"op": "take", "a": 0, "b": 1, "s": 0.0, "shape": [1]})
    while len(out) < nodes:
        i = len(out) - 1
        if sources in ("floor", "compare") and len(out) % 1024 == 0 and len(out) + 2 < nodes:
            source = ({"op": "floor", "a": i, "b": -1} if sources == "floor"
                      else {"op": "gt", "a": i, "b": 0})
            out.append({**source, "s": 0.0, "shape": [1]})
            out.append({"op": "adds", "a": i + 1, "b": -1, "s": 0.25, "shape": [1]})
            continue
        out.append({"op": "neg", "a": i, "b": -1, "s": 0.0, "shape": [1]})
    return msgpack.packb(doc, use_bin_type=True)


LOAD_ONLY = "import sys, gradtool; gradtool.load(sys.argv[1])"


def timed(args, checkout: Path) -> tuple:
    """(wall seconds, CPU seconds of the child) of one run; ``args[0] == "load"``: loading
    alone."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    code = LOAD_ONLY if args[0] == "load" else "from gradtool.cli import main; main()"
    args = args[1:] if args[0] == "load" else args
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # in the checkout's folder: `python -c` puts the current folder first on sys.path
    subprocess.run([sys.executable, "-c", code, *args],
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
    from gradtool.tapefile import scan as tapefile_scan
    raw = path.read_bytes()
    limits = tapefile_checks.Limits()
    out = {}
    with tapefile_read.gc_paused():
        clock = time.process_time
        t = clock()
        found = tapefile_scan.scan(raw, str(path), limits)
        if found is None:
            found = tapefile_checks.decode(raw, str(path), limits), None
        out["decode"] = clock() - t
        t = clock()
        checked = tapefile_checks.check(*found[:1], str(path), limits, found[1])
        out["check"] = clock() - t
        t = clock()
        tapefile_replay.replay(checked, str(path))
        out["replay"] = clock() - t
    return out


def extract(rev: str, into: Path) -> Path:
    """Commit ``rev`` of this repository as plain files under ``into`` (git archive)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1 << 20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--checkout", type=Path, default=ROOT)
    ap.add_argument("--baseline", metavar="REV", default=None,
                    help="also time this commit (e.g. 1d644f5), side by side")
    ap.add_argument("--commands", default="load,inspect-json,inspect,backward",
                    help="which commands to time, comma-separated (default: all four)")
    ap.add_argument("--sources", choices=SOURCES, default="none",
                    help="whole numbers in the chain (see chain()): none, ids, floor, compare")
    opts = ap.parse_args()
    known = {"load": ["load"], "inspect-json": ["inspect", "--json"],
             "inspect": ["inspect"], "backward": ["backward"]}
    unknown = set(opts.commands.split(",")) - set(known)
    if unknown:
        ap.error(f"unknown command(s) {sorted(unknown)}; pick from {sorted(known)}")
    commands = [known[c] for c in opts.commands.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chain.msgpack"
        path.write_bytes(chain(opts.nodes, opts.sources))
        trees = {"this": opts.checkout}
        if opts.baseline:
            base = Path(tmp) / "baseline"
            base.mkdir()
            trees[opts.baseline] = extract(opts.baseline, base)
        print(f"{opts.nodes} nodes ({opts.sources} whole-number sources), "
              f"{path.stat().st_size / 1e6:.1f} MB; gradtool from "
              f"{opts.checkout}" + (f" and commit {opts.baseline}" if opts.baseline else "")
              + f"; median of {opts.runs} runs, wall / CPU seconds")
        print("  " + " " * 24 + "".join(f"{name:>24s}" for name in trees))
        for command in commands:
            runs = {name: [] for name in trees}
            for _ in range(opts.runs):           # interleaved: the same noise for both
                for name, tree in trees.items():
                    runs[name].append(timed([*command, str(path)], tree))
            cells = []
            for name in trees:
                wall = statistics.median(r[0] for r in runs[name])
                cpu = statistics.median(r[1] for r in runs[name])
                cells.append(f"{wall:9.2f} s / {cpu:6.2f} s")
            label = "load (gradtool.load)" if command == ["load"] else "gradtool " + " ".join(command)
            print(f"  {label:24s}" + "".join(f"{c:>24s}" for c in cells))
        if opts.checkout == ROOT:
            print("  load stages (CPU, this tree): " + ", ".join(
                f"{k} {v:.2f} s" for k, v in stages(path).items()))


if __name__ == "__main__":
    main()
