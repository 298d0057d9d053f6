"""The importer's messages a new user meets (issue 40): each is one clear line.

Real torch.export, the real command line (in process, and as a subprocess where torch
writes to the process's own stderr), the real training loop.  Skipped without torch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from gradtool.interop.torch import (TorchImportError, WeightsError,  # noqa: E402
                                    import_module, load_weights)
from support import assert_one_line_error, run                  # noqa: E402

MODELS = textwrap.dedent('''
    import torch, torch.nn as nn, torch.nn.functional as F

    class Logits(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 4)

        def forward(self, x):
            return self.fc(x)

    def logits():
        return Logits(), (torch.randn(8, 6),)

    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 4)

        def forward(self, x):
            h = self.fc(x)
            if h.mean() > 0:
                h = h * 2
            return h.sum()

    def datadep():
        return DataDependent(), (torch.randn(8, 6),)

    class Inverse(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return torch.linalg.inv(self.fc(x)).sum()

    def inverse():
        return Inverse(), (torch.randn(4, 4),)

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 4)

        def forward(self, x, labels):
            return F.cross_entropy(self.fc(x), labels)

    def classifier():
        return Classifier(), (torch.randn(8, 6), torch.randint(0, 4, (8,)))
''')


@pytest.fixture
def models(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    return path


def _line_of(path, code: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if code in text)


def test_a_model_returning_logits_is_told_loss_fn_in_python_and_loss_on_the_cli(models,
                                                                                tmp_path):
    sys.path.insert(0, str(models.parent))
    try:
        import models as m
    finally:
        sys.path.pop(0)
    model, inputs = m.logits()
    with pytest.raises(TorchImportError) as info:
        import_module(model, inputs, dtype="f64")
    assert len(info.value.lines) == 1
    assert "pass loss_fn=" in info.value.lines[0] and "--loss" not in info.value.lines[0]
    out = run("import-torch", f"{models}:logits", "-o", tmp_path / "m.msgpack")
    line = assert_one_line_error(out, 2, "non-scalar loss", "--loss NAME",
                                 f"models.py:{_line_of(models, 'return self.fc(x)')}")
    assert "loss_fn=" not in line


def test_data_dependent_control_flow_is_one_line_with_the_users_line(models, tmp_path):
    """torch prints the partial graph (about 30 lines) to the process's stderr itself,
    so this runs the command as a process."""
    proc = subprocess.run([sys.executable, "-m", "gradtool", "import-torch",
                           f"{models}:datadep", "-o", str(tmp_path / "m.msgpack")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradtool: "), proc.stderr
    line = _line_of(models, "if h.mean() > 0:")
    for needle in ("data-dependent control flow", f"models.py:{line} (forward): "
                   "if h.mean() > 0:", "torch.where"):
        assert needle in lines[0], (needle, lines[0])
    assert "unknown source line" not in lines[0]


def test_the_refusal_of_linalg_inv_names_the_aten_op_once(models, tmp_path):
    out = run("import-torch", f"{models}:inverse", "-o", tmp_path / "m.msgpack")
    assert_one_line_error(out, 2, "unsupported op aten.linalg_inv_ex",
                          f"models.py:{_line_of(models, 'torch.linalg.inv')} (forward)")
    assert "TOKEN" not in out.stderr and "with_effects" not in out.stderr


def test_load_weights_into_the_wrong_module_says_it_is_a_load():
    class A(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.fc2(self.fc1(x)).sum()

    class B(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(3, 4), nn.Linear(4, 2), nn.Linear(2, 2)
            self.fc1 = nn.Linear(3, 5)

    result = import_module(A(), (torch.randn(2, 3),), dtype="f64")
    with pytest.raises(WeightsError) as info:
        load_weights(B(), result)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("cannot load the weights into the module: ")
    for needle in ("shape mismatch for 'fc1.weight' (the module has [5, 3], the tape [4, 3])",
                   "tape params not in the module: 'fc2.weight', 'fc2.bias'",
                   "module params not in the tape: 'a.weight', 'a.bias', 'b.weight', "
                   "'b.bias', and 2 more"):
        assert needle in text, (needle, text)
    assert "import" not in text and "unknown source line" not in text
    assert isinstance(info.value, TorchImportError) and len(info.value.problems) == 10


@pytest.mark.parametrize("backend", ["cpu", "host"])
def test_an_id_out_of_range_names_the_input_slot_and_the_example(models, tmp_path, backend):
    if backend == "host":
        from conftest import require_c_compiler
        require_c_compiler()
    out = run("import-torch", f"{models}:classifier", "-o", tmp_path / "m.msgpack")
    assert out.exit_code == 0, out.stderr
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 64)
    labels[37] = 9
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((64, 6)), labels=labels)
    out = run("train", tmp_path / "m.msgpack", "--data", tmp_path / "d.npz", "--epochs", "1",
              "--backend", backend)
    assert out.exit_code == 2, (out.stdout, out.stderr)
    *progress, last = out.stderr.splitlines()
    assert not any("node" in line for line in progress), out.stderr
    assert last.startswith("gradtool: labels: example 37 of the training data: node "), last
    assert "(take_along)" in last and "id 9" in last and "outside [0, 4)" in last


def test_import_module_prints_no_leafspec_warning():
    model = nn.Sequential(nn.Linear(3, 2), nn.Dropout2d(0.1))   # the deep-copied programs
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            import_module(model, (torch.randn(4, 3, 2),), dtype="f64")
        except TorchImportError:
            pass                                    # (a non-scalar loss: not the point)
        import_module(nn.Linear(3, 1), (torch.randn(4, 3),), loss_fn=lambda out: out.sum(), dtype="f64")
    leaf = [str(w.message) for w in seen if "LeafSpec" in str(w.message)]
    assert not leaf, leaf
