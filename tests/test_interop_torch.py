"""What the PyTorch importer refuses, and its command line (``gradtool import-torch``).

Ops without an entry, a dropout's mask read, random ops outside the table, a mutated
user input, a non-scalar loss: one error, one line per problem naming the op, its count
and its source line (the first test's line names this file: its model stays here).  The
command line: one line on stderr and exit 2 for a model or a spec it cannot import,
nothing written; a tape and a JSON summary otherwise; it starts without importing torch.
Train-mode dropout imports (as the rng slot's uniform draws) and trains to the same bytes
on every engine.  The other importer tests are tests/test_import_*.py, their shared
models and checks tests/torch_cases.py.  Skipped cleanly without torch.
"""

from __future__ import annotations

import copy
import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import gradtool as gt                                          # noqa: E402
from gradtool.interop import aten as A                         # noqa: E402
from gradtool.interop.torch import TorchImportError, import_module  # noqa: E402
from support import run                                        # noqa: E402
from torch_cases import assert_trains_to_the_same_bytes        # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)


class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = torch.lgamma(self.fc(x) + x)
        z = torch.digamma(y)
        w = torch.lgamma(z * z)
        return (w * w).sum()


SPEC_FILE = '''
import torch, torch.nn as nn

class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = torch.lgamma(self.fc(x) + x)
        z = torch.digamma(y)
        w = torch.lgamma(z * z)
        return (w * w).sum()

class Nonzero(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = self.fc(x)
        idx = torch.nonzero(y > 0)
        return y[idx[:, 0]].sum()

def unsupported():
    return Unsupported(), (torch.randn(2, 3),)

def nonzero():
    return Nonzero(), (torch.randn(4, 3),)

class Fine(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, input):
        return self.fc(input).square().mean()

def fine():
    torch.manual_seed(0)
    return Fine(), (torch.randn(2, 3),)

def mse(out, target):
    return ((out - target) ** 2).mean()

def with_targets():
    torch.manual_seed(0)
    return nn.Linear(3, 2), (torch.randn(4, 3),), (torch.randn(4, 2),)
'''


def test_unsupported_ops_one_error_listing_each_with_count_and_line():
    with pytest.raises(TorchImportError) as info:
        import_module(Unsupported(), (torch.randn(2, 3),), dtype="f64")
    lines = info.value.lines
    assert len(lines) == 2
    assert lines[0].startswith("unsupported op aten.lgamma.default (x2) at ")
    assert "test_interop_torch.py" in lines[0] and "torch.lgamma(self.fc(x) + x)" in lines[0]
    assert "and 1 more places" in lines[0]
    assert lines[1].startswith("unsupported op aten.digamma.default (x1) at ")


def test_cli_a_model_that_fails_on_its_example_shapes_is_one_line(tmp_path, capfd):
    """torch's fake-tensor logger prints a traceback when an op fails on the example
    shapes; the import keeps it quiet and reports the failure in one line, exit 2."""
    spec = tmp_path / "model.py"
    spec.write_text("import torch\n\ndef build():\n"
                    "    return torch.nn.Linear(2, 1), (torch.randn(3, 5),)\n")
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "gradtool", "import-torch", f"{spec}:build",
                           "-o", str(tmp_path / "m.msgpack"), "--dtype", "f64"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradtool: "), proc.stderr
    assert "torch.export failed: RuntimeError" in lines[0] and "[3, 5]" in lines[0]
    assert not (tmp_path / "m.msgpack").exists()


def test_cli_unsupported_op_exit_2_one_line_per_op_no_file(tmp_path):
    spec = tmp_path / "model.py"
    spec.write_text(SPEC_FILE)
    out_file = tmp_path / "m.msgpack"
    res = run("import-torch", f"{spec}:unsupported", "-o", out_file)
    assert res.exit_code == 2, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 2, res.stderr
    assert "aten.lgamma.default (x2)" in lines[0] and "model.py:10 (forward)" in lines[0]
    assert "aten.digamma.default (x1)" in lines[1] and "model.py:11 (forward)" in lines[1]
    assert all(line.startswith("gradtool: ") for line in lines)
    assert "Traceback" not in res.stderr
    assert not out_file.exists()
    assert list(tmp_path.iterdir()) == [spec]        # no temporary left behind either


def test_cli_nonzero_is_refused_with_its_line(tmp_path):
    spec = tmp_path / "model.py"
    spec.write_text(SPEC_FILE)
    out_file = tmp_path / "m.msgpack"
    res = run("import-torch", f"{spec}:nonzero", "-o", out_file, "--json")
    assert res.exit_code == 2, res.output
    lines = res.stderr.splitlines()
    assert any("aten.nonzero.default" in line and "model.py:22" in line for line in lines), \
        res.stderr
    assert all(line.startswith("gradtool: ") for line in lines)
    report = json.loads(res.stdout)
    assert any(p["target"] == "aten.nonzero.default" for p in report["unsupported"])
    assert not out_file.exists()


def test_cli_writes_a_tape_and_a_json_summary(tmp_path):
    spec = tmp_path / "model.py"
    spec.write_text(SPEC_FILE)
    out_file = tmp_path / "m.msgpack"
    res = run("import-torch", f"{spec}:fine", "-o", out_file, "--json", "--dtype", "f64")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["params"] == {"fc.weight": [1, 3], "fc.bias": [1]}
    assert summary["inputs"] == {"input": {"shape": [2, 3], "dtype": "f64"}}
    assert summary["unsupported"] == []
    assert summary["aten_ops"]["aten.addmm.default"] == 1
    tf = gt.load(out_file)
    assert [tf.tape.nodes[p.id].name for p in tf.tape.params()] == ["fc.weight", "fc.bias"]


def test_cli_bad_spec_is_one_line(tmp_path):
    res = run("import-torch", f"{tmp_path}/nope.py:build", "-o", tmp_path / "m.msgpack")
    assert res.exit_code == 2
    assert len(res.stderr.splitlines()) == 1 and "no such file" in res.stderr


class TrainDropout(nn.Module):
    def __init__(self, p=0.3):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.drop = nn.Dropout(p)
        self.out = nn.Linear(8, 3)

    def forward(self, x, y):
        h = self.drop(torch.tanh(self.fc(x)))
        return F.mse_loss(F.dropout(self.out(h), 0.1, training=self.training), y)


def test_train_mode_dropout_imports_and_matches_torch_eval_with_the_flag_off(tmp_path):
    torch.manual_seed(3)
    m = TrainDropout().train()
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    result = import_module(m, (x, y), dtype="f64")                 # the import check passed inside
    assert result.histogram["aten.native_dropout.default"] == 2
    tape = result.tape
    uniforms = [n for n in tape.nodes if n.op == "uniform"]
    assert [n.aux["salt"] for n in uniforms] == [0, 1]
    assert list(result.params) == ["fc.weight", "fc.bias", "out.weight", "out.bias"]
    assert sorted(v.id for v in tape.input_slots()) == sorted(v.id for v in result.inputs.values())
    with torch.no_grad():
        want = float(copy.deepcopy(m).double().eval()(x.double(), y.double()))
    r = tape.rng()
    tape.set_value(r, [0.0, 0.0, 0.0])
    tape.forward()
    got = float(tape.values[result.loss.id][0])
    assert abs(got - want) <= 1e-12 * abs(want)
    tape.set_value(r, [0.0, 0.0, 1.0])                # train mode: another (dropped) loss
    tape.forward()
    assert float(tape.values[result.loss.id][0]) != got
    # eval mode still imports as the identity: no uniform at all
    plain = import_module(copy.deepcopy(m).eval(), (x, y), dtype="f64")
    assert not any(n.op == "uniform" for n in plain.tape.nodes)
    # and the imported tape trains under gradtool train, every engine the same bytes
    rng = np.random.default_rng(4)
    assert_trains_to_the_same_bytes(result, tmp_path, x=rng.standard_normal((32, 6)),
                                    y=rng.standard_normal((32, 3)))


class ReadsTheMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y, mask = torch.ops.aten.native_dropout(self.fc(x), 0.5, True)
        return (y * mask).sum()


class Poisson(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return (self.fc(x) * torch.poisson(torch.ones(2, 3))).sum()


def test_a_read_mask_and_other_random_ops_stay_refused_in_one_line():
    with pytest.raises(TorchImportError) as info:
        import_module(ReadsTheMask(), (torch.randn(2, 3),), dtype="f64")
    assert len(info.value.lines) == 1, info.value.lines
    assert "native_dropout" in info.value.lines[0] and "a dropout's mask" in info.value.lines[0]
    with pytest.raises(TorchImportError) as info:
        import_module(Poisson(), (torch.randn(2, 3),), dtype="f64")
    assert len(info.value.lines) == 1, info.value.lines
    assert info.value.lines[0].startswith("random op aten.poisson.default (x1) at ")


class DrawsTargets(nn.Module):
    """Random ops outside the table's list: Tensor.geometric_ and Tensor.exponential_
    (aten.geometric.default, aten.exponential.default); their inputs are constants, so
    before the nondeterministic_seeded tag was read such ops were folded: one draw frozen
    into the tape, silently (torch.randint(lo, hi, shape), aten.randint.low, was found so
    by the import check; it now imports as gradtool.nn.randint)."""

    def __init__(self, which):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.which = which

    def forward(self, x):
        y = self.fc(x)
        if self.which == "geometric":
            return (y * torch.empty(x.shape[0], 4).geometric_(0.5)).sum()
        return (y * torch.empty(x.shape[0], 4).exponential_()).sum()


@pytest.mark.parametrize("which, op", [("geometric", "aten.geometric.default"),
                                       ("exponential", "aten.exponential.default")])
def test_every_seeded_random_op_is_refused_not_folded(which, op):
    with pytest.raises(TorchImportError) as info:
        import_module(DrawsTargets(which), (torch.randn(5, 3),), dtype="f64")
    (line,) = info.value.lines
    assert line.startswith(f"random op {op} (x1) at "), line


class Mutates(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        x.mul_(2.0)
        return self.fc(x).sum()


def test_mutating_a_user_input_is_refused():
    with pytest.raises(TorchImportError, match="in-place mutation of user input"):
        import_module(Mutates(), (torch.randn(2, 3),), dtype="f64")


class NotScalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(x)


def test_non_scalar_loss_is_refused():
    with pytest.raises(TorchImportError) as info:
        import_module(NotScalar(), (torch.randn(2, 3),), dtype="f64")
    assert info.value.lines[0].startswith("non-scalar loss of shape [2, 3]")


def test_every_table_entry_is_documented_and_the_table_is_generated():
    from gradtool import codegen
    text = (codegen.ROOT / "docs" / "torch.md").read_text(encoding="utf-8")
    for name in A.ATEN:
        assert f"`{name}`" in text, name


def test_the_command_line_starts_without_importing_torch():
    import subprocess
    import sys
    code = "import sys, gradtool.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_cli_loss_function_names_its_targets(tmp_path):
    spec = tmp_path / "model.py"
    spec.write_text(SPEC_FILE)
    out_file = tmp_path / "m.msgpack"
    res = run("import-torch", f"{spec}:with_targets", "--loss", "mse", "-o", out_file, "--json",
              "--dtype", "f64")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert list(summary["inputs"]) == ["input", "target"]
    assert list(summary["params"]) == ["weight", "bias"]
    res = run("import-torch", f"{spec}:with_targets", "-o", out_file)
    assert res.exit_code == 2 and "no --loss function" in res.stderr
