"""The ATen mapping table as a package (gradtool/interop/aten/): one module per family,
one entry per overload (no entry decides what to compute by the op's name), and the
table importable, with its docs table, without torch."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import gradtool.interop.aten as A

FAMILIES = {"elementwise", "reductions", "layout", "indexing", "nn", "conv", "attention",
            "random", "complex"}


def test_every_entry_lives_in_a_family_module():
    modules = {e.fn.__module__.rsplit(".", 1)[1] for e in [*A.ATEN.values(),
                                                          *A.COMPLEX.values()]}
    assert modules <= FAMILIES, modules - FAMILIES
    assert {"elementwise", "layout", "random", "complex", "conv"} <= modules


def test_no_entry_branches_on_the_ops_name():
    """An op whose overloads compute different things has one entry each (issue 41):
    no entry reads ``str(node.target)``."""
    bad = sorted({name for name, e in [*A.ATEN.items(), *A.COMPLEX.items()]
                  if "str(node.target)" in inspect.getsource(e.fn)})
    assert not bad, bad


def test_the_table_and_its_docs_import_without_torch():
    code = ('import sys; sys.modules["torch"] = None\n'
            'import gradtool.interop.aten as A\n'
            'assert "aten.sinh.default" in A.ATEN and "aten.log10.default" in A.ATEN\n'
            'assert "| `aten.argmin.default` |" in A.docs_table()\n'
            'print(len(A.ATEN))')
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout) == len(A.ATEN)
