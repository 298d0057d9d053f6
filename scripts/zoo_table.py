"""Measure docs/torch.md's table of real models: each model of tests/zoo_models.py
(torchvision and transformers, tiny configs, random init) imported in eval and in train
mode, with its import time (import_module: export, decomposition, recording and the
check against torch), its node count and its status.

    PYTHONPATH=. python scripts/zoo_table.py      # needs pip install -e '.[zoo]'
"""
from __future__ import annotations

import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))


def main() -> None:
    warnings.filterwarnings("ignore")
    import zoo_models as Z
    from gradtool.errors import GradtoolError
    from gradtool.interop.torch import import_module
    print("| model | mode | import (s) | nodes | params | status |")
    print("|---|---|---|---|---|---|")
    for name, build in Z.MODELS.items():
        for mode in ("eval", "train"):
            module, inputs, loss_fn, loss_inputs = build()
            getattr(module, mode)()
            start = time.perf_counter()
            try:
                r = import_module(module, inputs, loss_fn, loss_inputs, dtype="f64")
            except GradtoolError as exc:
                print(f"| {name} | {mode} | - | - | - | refused: "
                      f"{str(exc).splitlines()[-1].strip()[:80]} |", flush=True)
                continue
            took = time.perf_counter() - start
            n = sum(r.tape.values[v.id].size for v in r.params.values())
            status = "imports" + (" (SDPA kept undecomposed)" if r.notes else "")
            print(f"| {name} | {mode} | {took:.1f} | {len(r.tape.nodes)} | {n} | {status} |",
                  flush=True)


if __name__ == "__main__":
    main()
