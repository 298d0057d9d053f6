"""The files generated from the op table are up to date, and the table is self-consistent."""

import subprocess
import sys

import pytest

from gradtool import codegen, expr as E
from gradtool.ops import KERNELS, OPS, contract, kernel_names


@pytest.mark.parametrize("path", list(codegen.outputs()), ids=lambda p: p.name)
def test_committed_file_matches_the_table(path):
    expected = codegen.outputs()[path]
    assert path.exists(), f"{path} is missing: run python -m gradtool.codegen"
    assert path.read_text(encoding="utf-8") == expected, \
        f"{path} is stale: run python -m gradtool.codegen"


def test_check_mode_reports_a_stale_file(tmp_path, monkeypatch):
    assert codegen.main(["--check"]) == 0
    stale = tmp_path / "gt_ops.h"
    stale.write_text("/* edited by hand */\n")
    monkeypatch.setattr(codegen, "HEADER_PATH", stale)
    monkeypatch.setattr(codegen, "outputs",
                        lambda: {stale: codegen.header()})
    assert codegen.main(["--check"]) == 1


def test_the_cli_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "gradtool.codegen", "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("name", [n for n, s in OPS.items() if s.elementwise])
def test_elementwise_rules_use_only_the_vocabulary(name):
    spec = OPS[name]
    allowed = {"x", "s"} | ({"y"} if spec.kind == "binary" else set())
    assert set(E.symbols(spec.fwd)) <= allowed
    assert len(spec.bwd) == spec.arity
    for c in spec.bwd:
        assert set(E.symbols(c)) <= allowed | {"g", "t"}
        assert E.operations(c) <= set(E.ARITH) | set(E.FUNCS) | set(E.COMPARE) | {"neg",
                                                                                  "select"}


def test_every_kernel_an_op_uses_has_a_contract():
    for spec in OPS.values():
        for k in kernel_names(spec):
            assert contract(k).fields, k
    used = {k for spec in OPS.values() for k in kernel_names(spec)}
    engine = {"k_fill", "k_from_f64", "k_guard", "k_clip_norm", "k_opt"}
    assert set(KERNELS) == (used - {k for s in OPS.values() if s.elementwise
                                    for k in kernel_names(s)}) | engine


def test_no_dead_fields_in_opspec():
    """Every OpSpec field is read somewhere in gradtool (the table has no decoration)."""
    import dataclasses
    from pathlib import Path

    table = Path(codegen.PACKAGE) / "ops"
    src = "".join(p.read_text() for p in Path(codegen.PACKAGE).rglob("*.py")
                  if p.parent != table)
    ops_src = "".join(p.read_text() for p in table.glob("*.py"))
    for f in dataclasses.fields(OPS["add"]):
        reads = src.count(f".{f.name}") + ops_src.count(f"self.{f.name}") + \
            ops_src.count(f"spec.{f.name}")
        assert reads > 0, f"OpSpec.{f.name} is never read"
