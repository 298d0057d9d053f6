"""The package's modules import each other along the data flow only: no import cycles.

Every ``import`` and ``from ... import`` in gradtool/ counts, also those inside
functions (a lazy import is still a dependency), except under ``if TYPE_CHECKING``.
``from package import name`` is an edge to the submodule when ``name`` is one.
"""

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gradtool"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(current: str, is_package: bool, level: int, target) -> str:
    if level == 0:
        return target or ""
    base = current.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _type_checking(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(name: str) -> set:
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    out = set()
    skip = set()
    for node in ast.walk(tree):
        if _type_checking(node):
            skip |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, path.name == "__init__.py", node.level, node.module)
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in MODULES else base)
    return {m for m in out if m in MODULES and m != name}


def graph() -> dict:
    return {name: imports_of(name) for name in MODULES}


def cycles(g: dict) -> list:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def _package_edges_allowed(g: dict) -> dict:
    """A package's __init__ re-exports its submodules; a submodule importing its own
    package's __init__ would make every such pair a cycle, so that is what is checked:
    edges from a submodule to its package are kept, edges from a package to its own
    submodules are the re-exports and are dropped."""
    out = {}
    for v, ws in g.items():
        out[v] = {w for w in ws if not w.startswith(v + ".")}
    return out


def test_no_import_cycles():
    found = cycles(_package_edges_allowed(graph()))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_submodule_imports_its_own_package_init():
    g = graph()
    bad = [(v, w) for v, ws in g.items() for w in ws
           if v.startswith(w + ".") and w != "gradtool"
           and MODULES[w].name == "__init__.py"]
    assert not bad, bad


# modules that define torch classes at import (reached as gtt.optim, only with torch)
TORCH_ONLY = {"gradtool.interop.torch_optim"}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_module_imports_on_its_own(name):
    """Importing any module first, in a fresh interpreter, works (no order dependence)."""
    if name.endswith("__main__"):
        pytest.skip("the console entry point runs the CLI when imported as __main__")
    if name in TORCH_ONLY and importlib.util.find_spec("torch") is None:
        pytest.skip(f"{name} subclasses torch.optim.Optimizer: it needs torch")
    proc = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True,
                          text=True, cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_public_import_paths_keep_working():
    import gradtool as gt

    for attr in ("Tape", "GVar", "load", "save", "fd_check", "OPS", "TapeFile", "TapeFileError"):
        assert hasattr(gt, attr), attr
    for mod, attrs in {"gradtool.optim": ("SGD", "Adam"),
                       "gradtool.train": ("Trainer", "make_engine", "TrainOptions"),
                       "gradtool.tapefile": ("load", "save", "dumps", "Limits", "TapeFile"),
                       "gradtool.device": ("capture",),
                       "gradtool.emit": ("emit_cuda",)}.items():
        m = importlib.import_module(mod)
        for attr in attrs:
            assert hasattr(m, attr), f"{mod}.{attr}"


# ── layering: the generator is a build-time tool; the device layer is below the importer ──

def test_no_module_imports_the_build_time_generator():
    """``gradtool.codegen`` renders the committed files; nothing at run time imports it
    (the renderings the runtime shares with it are in gradtool/render.py)."""
    g = graph()
    assert "gradtool.codegen" in MODULES and "gradtool.render" in g["gradtool.codegen"]
    bad = sorted(v for v, ws in g.items() if "gradtool.codegen" in ws and v != "gradtool.codegen")
    assert not bad, f"import gradtool.codegen at run time: {bad}"


def test_the_device_package_imports_nothing_from_the_importer():
    g = graph()
    device = sorted(v for v in g if v == "gradtool.device" or v.startswith("gradtool.device."))
    assert "gradtool.device.fusion" in device and "gradtool.device.backends" in device
    bad = [(v, w) for v in device for w in sorted(g[v])
           if w == "gradtool.interop" or w.startswith("gradtool.interop.")]
    assert not bad, f"gradtool.device imports gradtool.interop: {bad}"


def test_the_layering_checks_see_lazy_imports(tmp_path, monkeypatch):
    """The graph counts an import inside a function (a lazy import is still a dependency):
    a device module with one would fail the check above."""
    fake = tmp_path / "fake.py"
    fake.write_text("def f():\n    from ..interop import aten\n    import gradtool.codegen\n")
    monkeypatch.setitem(MODULES, "gradtool.device.fake", fake)
    assert {"gradtool.interop.aten", "gradtool.codegen"} <= imports_of("gradtool.device.fake")
