"""`gradtool inspect | backward | fd-check`: output formats, exit codes, one-line errors."""

import json
import re
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest

from conftest import assert_bits_equal
from gradtool.errors import GradtoolError
from gradtool.cli.tapes import commands
from gradtool.tape import Tape
from gradtool.tapefile import dumps, load, save
from support import assert_one_line_error, run
from support import all_ops_tape
from support import mlp_tape, numpy_mlp_backprop, write_independent_mlp

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


@pytest.fixture
def mlp_file(tmp_path, rng):
    tp, loss, outputs = mlp_tape(rng)
    path = tmp_path / "mlp.msgpack"
    save(tp, path, loss=loss, outputs=outputs, values=True)
    return path


# ── backward ───────────────────────────────────────────────────────────────

def test_backward_json_in_a_real_process_matches_independent_autodiff(tmp_path, rng):
    path = tmp_path / "ind.msgpack"
    arrays = write_independent_mlp(path, rng)
    proc = subprocess.run(
        [sys.executable, "-c", "from gradtool.cli import main; main()", "backward", "--json",
         str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = json.loads(proc.stdout)
    assert list(out) == ["loss", "params"]
    loss, grads = numpy_mlp_backprop(*arrays)
    assert out["loss"] == pytest.approx(loss, rel=1e-12)
    assert [p["id"] for p in out["params"]] == [2, 3, 4, 5]
    assert [p["name"] for p in out["params"]] == ["W1", "b1", "W2", None]
    for p in out["params"]:
        assert list(p) == ["id", "name", "shape", "grad"]
        assert p["shape"] == list(grads[p["id"]].shape)
        np.testing.assert_allclose(p["grad"], grads[p["id"]].reshape(-1), rtol=1e-12, atol=1e-15)


def test_backward_json_floats_round_trip_and_hex_is_the_same_bits(mlp_file):
    tf = load(mlp_file)
    tf.tape.backward(tf.loss)
    dec = json.loads(run("backward", "--json", mlp_file).stdout)
    hexed = json.loads(run("backward", "--json", "--hex", mlp_file).stdout)
    assert_bits_equal(np.array([dec["loss"]]), tf.tape.values[tf.loss.id])
    assert hexed["loss"] == float(tf.tape.values[tf.loss.id][0]).hex()
    for p, h in zip(dec["params"], hexed["params"], strict=True):
        expected = tf.tape.grad(tf.tape.var(p["id"])).reshape(-1)
        assert_bits_equal(np.array(p["grad"]), expected, f"param {p['id']}")
        assert h["grad"] == [float(x).hex() for x in expected]
        assert {k: v for k, v in h.items() if k != "grad"} == \
            {k: v for k, v in p.items() if k != "grad"}


def test_backward_table_and_stdin(mlp_file):
    result = run("backward", "-", input=mlp_file.read_bytes())
    assert result.exit_code == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith("loss = ")
    assert any(" W1 " in line and "[3,5]" in line for line in lines)
    assert any("node" not in line and "[2]" in line and " - " in line for line in lines)


def test_backward_npz_keys_and_bits(mlp_file, tmp_path):
    out = tmp_path / "grads.npz"
    result = run("backward", "-o", out, mlp_file)
    assert result.exit_code == 0, result.stderr
    tf = load(mlp_file)
    tf.tape.backward(tf.loss)
    with np.load(out) as npz:
        assert sorted(npz.files) == ["W1", "W2", "b1", "node3"]
        for p in tf.tape.params():
            key = tf.tape.nodes[p.id].name or f"node{p.id}"
            assert_bits_equal(npz[key], tf.tape.grad(p), key)
    first = out.read_bytes()
    run("backward", "-o", out, mlp_file)
    assert out.read_bytes() == first, "the npz is reproducible byte for byte"


def test_backward_verify_passes_then_fails_on_a_tampered_value(mlp_file, tmp_path):
    result = run("backward", "--verify", mlp_file)
    assert result.exit_code == 0 and "match the replay bit for bit" in result.stdout
    doc = msgpack.unpackb(mlp_file.read_bytes())
    victim = next(i for i, n in enumerate(doc["nodes"]) if n["op"] == "tanh")
    value = bytearray(doc["nodes"][victim]["value"])
    value[8] ^= 1                      # the last mantissa bit of element 1
    doc["nodes"][victim]["value"] = bytes(value)
    bad = tmp_path / "tampered.msgpack"
    bad.write_bytes(msgpack.packb(doc))
    result = run("backward", "--verify", "--json", bad)
    line = assert_one_line_error(result, 1, str(bad), f"node {victim} (tanh)", "flat index 1")
    assert result.stdout == "", "no gradients are printed when verification fails"
    assert "1 of 40 elements" in line


def old_contract_matmul(a, b):
    """numerics version 1's inner product: s = 0.0; s = s + a[i,k]*b[k,j], two roundings."""
    acc = np.zeros((a.shape[0], b.shape[1]))
    for k in range(a.shape[1]):
        acc = acc + a[:, k:k + 1] * b[k]
    return acc


def test_backward_verify_names_a_file_recorded_under_the_old_contract(tmp_path, rng):
    """A file whose stored values came from numerics version 1 (no "numerics" field, the
    products separately rounded) still loads; --verify says which contract, in one line."""
    tp = Tape()
    x = tp.const(rng.standard_normal((16, 40)), name="x")
    w = tp.param(rng.standard_normal((40, 8)), name="w")
    y = tp.matmul(x, w)
    loss = tp.sum(tp.relu(y))
    doc = msgpack.unpackb(dumps(tp, loss=loss, values=True))
    assert doc.pop("numerics") == 2
    old = old_contract_matmul(tp.value(x), tp.value(w))
    assert (old != tp.value(y)).any(), "the two contracts agree on this product"
    doc["nodes"][y.id]["value"] = old.astype("<f8").tobytes()
    for later in range(y.id + 1, len(doc["nodes"])):   # what version 1 computed after it
        doc["nodes"][later].pop("value", None)
    path = tmp_path / "old.msgpack"
    path.write_bytes(msgpack.packb(doc, use_bin_type=True))
    tf = load(path)
    assert tf.numerics == 1 and y.id in tf.recorded
    line = assert_one_line_error(run("backward", "--verify", path), 1,
                                 "numerics version 1", "version 2", "FMA chain",
                                 f"node {y.id}")
    assert "mismatch" not in line
    doc["numerics"] = 2                                # the same values claimed as version 2
    path.write_bytes(msgpack.packb(doc, use_bin_type=True))
    line = assert_one_line_error(run("backward", "--verify", path), 1, f"node {y.id}")
    assert "numerics version" not in line


def test_backward_verify_without_recorded_values_is_exit_2(tmp_path, rng):
    tp, loss, _ = mlp_tape(rng)
    save(tp, tmp_path / "novalues.msgpack", loss=loss)
    assert_one_line_error(run("backward", "--verify", tmp_path / "novalues.msgpack"), 2,
                          "novalues.msgpack", "records no values")


def test_npz_key_collision_is_reported(tmp_path):
    tp = Tape()
    a = tp.param([1.0])                      # unnamed node 0 -> "node0"
    b = tp.param([2.0], name="node0")
    tp.sum(tp.add(a, b))
    save(tp, tmp_path / "c.msgpack")
    assert_one_line_error(run("backward", "-o", tmp_path / "g.npz", tmp_path / "c.msgpack"), 2,
                          "'node0'")
    assert not (tmp_path / "g.npz").exists()


# ── inspect ────────────────────────────────────────────────────────────────

def test_inspect_json(mlp_file):
    result = run("inspect", "--json", mlp_file)
    assert result.exit_code == 0 and result.stderr == ""
    s = json.loads(result.stdout)
    assert s["file"] == str(mlp_file) and s["version"] == 1 and s["node_count"] == 14
    assert s["ops"] == {"add": 2, "const": 2, "matmul": 2, "mean": 1, "mul": 1, "param": 4,
                        "sub": 1, "tanh": 1}
    assert [(p["name"], p["shape"], p["elements"], p["l2"]) for p in s["params"]] == [
        ("W1", [3, 5], 15, 1e-4), ("b1", [5], 5, 0.0), ("W2", [5, 2], 10, 1e-4),
        (None, [2], 2, 0.0)]
    assert [(c["name"], c["shape"]) for c in s["inputs"]] == [("x", [8, 3]), ("y", [8, 2])]
    assert s["outputs"] == [{"name": "pred", "id": 10, "op": "add", "shape": [8, 2]}]
    assert s["loss"]["id"] == 13 and s["loss"]["op"] == "mean"
    assert len(s["nodes"]) == 14 and s["nodes"][6] == {"id": 6, "op": "matmul", "a": 4, "b": 0,
                                                        "shape": [8, 5]}


def test_inspect_text_lists_params_inputs_outputs_and_loss(mlp_file):
    out = run("inspect", mlp_file).stdout
    assert "14 nodes (4 params, 2 consts, 8 ops)" in out
    assert "loss: node 13 (mean)" in out
    for needle in ("W1", "[3,5]", "0.0001", "pred", "matmul 2", "x"):
        assert needle in out


def test_inspect_dot_marks_kinds_and_loss(tmp_path):
    tp, loss, outputs = all_ops_tape()
    path = tmp_path / "all.msgpack"
    save(tp, path, loss=loss, outputs=outputs)
    dot = run("inspect", "--dot", path).stdout
    assert dot.startswith("digraph tape {") and dot.rstrip().endswith("}")
    node_lines = [l for l in dot.splitlines() if re.match(r"\s*n\d+ \[", l)]
    edges = [l for l in dot.splitlines() if "->" in l]
    assert len(node_lines) == len(tp.nodes)
    assert len(edges) == sum((n.a >= 0) + (n.b >= 0) for n in tp.nodes)
    assert sum("doubleoctagon" in l for l in node_lines) == 1
    assert f"n{loss.id} [" in next(l for l in node_lines if "doubleoctagon" in l)
    assert sum("#fde2b8" in l for l in node_lines) == 2          # params
    assert sum("dashed" in l for l in node_lines) == sum(n.op == "const" for n in tp.nodes)
    assert "output bmm" in dot


def test_inspect_json_and_dot_together_is_a_usage_error(mlp_file):
    assert_one_line_error(run("inspect", "--json", "--dot", mlp_file), 2, "--json and --dot")


# ── fd-check ───────────────────────────────────────────────────────────────

def test_fd_check_passes_a_smooth_graph(mlp_file):
    result = run("fd-check", mlp_file)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "all 4 params pass" in result.stdout and result.stderr == ""


def test_fd_check_lists_a_relu_kink_as_non_smooth(tmp_path):
    """relu at exactly 0: the gradient (0) is one of the one-sided slopes, not a derivative;
    the central difference is 0.5 at every step, the one-sided ones 0 and 1: listed as
    non-smooth with its figures, not a failure (issue 42; it used to fail)."""
    tp = Tape()
    x = tp.param(np.zeros(3), name="x")
    tp.sum(tp.relu(x))
    save(tp, tmp_path / "kink.msgpack")
    result = run("fd-check", "--json", tmp_path / "kink.msgpack")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["passed"] is True and report["nonsmooth"] == 3
    assert report["params"][0]["nonsmooth"] == [
        {"index": [i], "analytic": 0.0, "numeric": 0.5, "numeric_small": 0.5} for i in range(3)]
    text = run("fd-check", tmp_path / "kink.msgpack").stdout
    assert "ok (3 non-smooth)" in text and "x [2]: analytic 0.0, numeric 0.5 at eps" in text


def test_fd_check_still_fails_a_wrong_gradient_next_to_a_kink(tmp_path):
    """A relu at 0 (non-smooth) beside a tanh whose gradient is planted 1% off (a
    smooth point): the tanh's param fails, the relu's is listed."""
    from dataclasses import replace
    from gradtool.ops import OPS
    tp = Tape()
    x = tp.param(np.zeros(3), name="x")
    w = tp.param(np.array([0.3, -0.7, 1.1]), name="w")
    tp.add(tp.sum(tp.relu(x)), tp.sum(tp.tanh(w)))
    save(tp, tmp_path / "mixed.msgpack")
    assert run("fd-check", tmp_path / "mixed.msgpack").exit_code == 0
    spec = OPS["tanh"]
    off = replace(spec, backward=lambda *args: tuple(
        None if c is None else c * 1.01 for c in spec.backward(*args)))
    OPS["tanh"] = off
    try:
        result = run("fd-check", "--json", tmp_path / "mixed.msgpack")
    finally:
        OPS["tanh"] = spec
    assert_one_line_error(result, 1, "node 1", "(w)", "fd-check failed for 1 of 2 params")
    report = json.loads(result.stdout)
    x_report, w_report = report["params"]
    assert x_report["passed"] and len(x_report["nonsmooth"]) == 3
    assert not w_report["passed"] and w_report["nonsmooth"] == []


def test_fd_check_json_reports_every_param(mlp_file):
    result = run("fd-check", "--json", "--eps", "1e-5", mlp_file)
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["passed"] is True and report["eps"] == 1e-5
    assert [p["id"] for p in report["params"]] == [0, 1, 2, 3]
    assert all(p["max_abs_err"] < 1e-6 for p in report["params"])


@pytest.mark.parametrize("args", [["--eps", "0"], ["--eps", "nan"], ["--rtol", "-1"],
                                  ["--atol", "inf"]])
def test_fd_check_rejects_bad_tolerances(mlp_file, args):
    assert_one_line_error(run("fd-check", *args, mlp_file), 2, args[0])


# ── shared behaviour ───────────────────────────────────────────────────────

@pytest.mark.parametrize("command", ["inspect", "backward", "fd-check"])
def test_missing_file_is_one_line_exit_2(tmp_path, command):
    assert_one_line_error(run(command, tmp_path / "nope.msgpack"), 2, "nope.msgpack",
                          "No such file")


@pytest.mark.parametrize("command", ["inspect", "backward", "fd-check"])
def test_garbage_on_stdin_names_stdin(command):
    assert_one_line_error(run(command, "-", input=b"\x81\xa6format"), 2, "<stdin>", "truncated")


def test_every_option_has_help():
    for command in commands:
        assert command.help
        for param in command.params:
            if param.param_type_name == "option":
                assert param.help, f"{command.name} {param.opts}"


@pytest.mark.parametrize("name", ["logistic", "mlp_regression", "attention"])
def test_samples_verify_and_fd_check(name):
    for path in [SAMPLES / f"{name}.msgpack"]:
        assert run("backward", "--verify", path).exit_code == 0, path
        assert run("fd-check", path).exit_code == 0, path


def test_non_finite_values_are_data_not_errors(tmp_path):
    tp = Tape()
    w = tp.param([-1.0, 0.0, 2.0], name="w")
    with np.errstate(all="ignore"):
        loss = tp.sum(tp.mul(tp.log(w), w))             # nan, -inf*0 = nan, finite
    save(tp, tmp_path / "nan.msgpack", loss=loss, values=True)
    for args in (["inspect"], ["backward", "--verify"], ["backward", "--json", "--hex"]):
        result = run(*args, tmp_path / "nan.msgpack")
        assert result.exit_code == 0 and result.stderr == "", (args, result.stderr)
    out = json.loads(run("backward", "--json", tmp_path / "nan.msgpack").stdout)
    assert np.isnan(out["loss"])
    result = run("fd-check", tmp_path / "nan.msgpack")
    assert_one_line_error(result, 1, "fd-check failed")


# ── fd-check's budget, --params, --max-evals, progress ────────────────────

def big_param_file(tmp_path):
    """The issue's reproducer: a 1 MB file with a [256,256] param, whose full check is
    131,584 loss evaluations of a [256,256] matmul each (over a minute here)."""
    rng = np.random.default_rng(0)
    tp = Tape()
    w = tp.param(rng.standard_normal((256, 256)), name="W")
    x = tp.const(rng.standard_normal((256, 256)), name="x")
    b = tp.param(rng.standard_normal(256), name="b")
    tp.mean(tp.tanh(x @ w + b))
    path = tmp_path / "big.msgpack"
    save(tp, path)
    assert 1_000_000 < path.stat().st_size < 1_100_000
    return path


def test_fd_check_estimates_its_cost_and_refuses_beyond_the_budget(tmp_path):
    path = big_param_file(tmp_path)
    # every element asked for (a sample larger than any param); by default the check
    # is sampled instead (test_fd_check_whole_models_sampled_within_the_budget)
    line = assert_one_line_error(run("fd-check", "--sample", "65536", path), 2, str(path),
                                 "131,584 loss evaluations", "2 params, 65,792 elements",
                                 "over the budget of", "--params NAME,...",
                                 "--max-evals 131584")
    assert re.search(r"of about [0-9.e+]+ operations each", line)
    # a subset within the budget runs
    result = run("fd-check", "--json", "--params", "b", path)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [p["name"] for p in report["params"]] == ["b"] and report["passed"]
    # --max-evals is a hard cap, whatever the work
    assert_one_line_error(run("fd-check", "--params", "b", "--max-evals", "511", path), 2,
                          "512 loss evaluations", "over --max-evals 511")
    assert run("fd-check", "--params", "b", "--max-evals", "512", path).exit_code == 0


def test_fd_check_params_take_names_and_node_ids(tmp_path, rng):
    tp = Tape()
    a = tp.param(rng.standard_normal(3), name="a")
    b = tp.param(rng.standard_normal(3))                   # unnamed: node 1
    tp.sum(tp.tanh(tp.mul(a, b)))
    path = tmp_path / "t.msgpack"
    save(tp, path)
    for spec, ids in (("a", [0]), ("1", [1]), ("node1", [1]), ("node1, a", [0, 1])):
        result = run("fd-check", "--json", "--params", spec, path)
        assert result.exit_code == 0, result.output
        assert [p["id"] for p in json.loads(result.stdout)["params"]] == ids
    assert_one_line_error(run("fd-check", "--params", "z", path), 2,
                          "--params: no param 'z' (params: a, node1)")


def test_fd_check_shows_progress_only_on_a_terminal(tmp_path):
    from support import GRADTOOL, stderr_through_a_terminal
    path = SAMPLES / "mlp_regression.msgpack"
    status, text = stderr_through_a_terminal([*GRADTOOL, "fd-check", str(path)])
    assert status == 0, text
    # at most ten updates a second, and always the last one
    assert "\rfd-check: param b2: 194/194 evaluations (100%)" in text.replace("\x1b[K", "")
    assert text.endswith("\r\x1b[K")                # erased at the end
    plain = subprocess.run([*GRADTOOL, "fd-check", str(path)], capture_output=True, text=True,
                           timeout=120)
    assert plain.returncode == 0 and plain.stderr == ""


def test_fd_check_library_subset_and_progress(rng):
    from gradtool.gradcheck import fd_check, fd_cost
    tp = Tape()
    a = tp.param(rng.standard_normal((2, 3)), name="a")
    b = tp.param(rng.standard_normal(3), name="b")
    loss = tp.sum(tp.tanh(tp.mul(a, b)))
    calls = []
    report = fd_check(tp, loss, params=["b"], progress=lambda *c: calls.append(c))
    assert [p.name for p in report.params] == ["b"] and report.passed
    assert calls == [(2, 6, 1), (4, 6, 1), (6, 6, 1)]
    assert [p.id for p in fd_check(tp, loss, params=[b, a]).params] == [0, 1]   # tape order
    cost = fd_cost(tp, [b])
    assert (cost.params, cost.elements, cost.evals) == (1, 3, 6) and cost.work > 0
    assert fd_cost(tp).evals == 18
    for bad in (["zz"], [loss], [Tape().param([1.0])], [3]):
        with pytest.raises(GradtoolError):
            fd_check(tp, loss, params=bad)


def test_fd_check_library_sample_seed_and_budget(rng):
    from gradtool.gradcheck import fd_check, fd_cost, sample_indices, sample_within
    tp = Tape()
    a = tp.param(rng.standard_normal((4, 5)), name="a")
    b = tp.param(rng.standard_normal(3), name="b")
    loss = tp.add(tp.sum(tp.tanh(a)), tp.sum(tp.mul(b, b)))
    report = fd_check(tp, loss, sample=4, seed=7)
    assert report.passed and report.sample == 4 and report.seed == 7
    assert [(p.checked, p.sampled) for p in report.params] == [(4, True), (3, False)]
    picked = sample_indices(20, 4, 7, a.id)
    assert list(picked) == sorted(set(picked.tolist())) and picked.size == 4
    assert list(picked) == list(sample_indices(20, 4, 7, a.id))          # seeded
    assert list(sample_indices(3, 4, 7, b.id)) == [0, 1, 2]               # all of a small one
    assert fd_cost(tp, sample=4).evals == 2 * (4 + 3)
    full = fd_cost(tp)
    assert sample_within(tp, budget=full.work) is None                    # all fits
    n = sample_within(tp, budget=full.work - 1)
    assert 1 <= n < 20 and fd_cost(tp, sample=n).work <= full.work - 1 < fd_cost(
        tp, sample=n + 1).work
    assert sample_within(tp, budget=1) == 0
    for bad in ({"sample": 0}, {"sample": 2.5}, {"sample": True}, {"seed": -1}):
        with pytest.raises(GradtoolError, match="sample|seed"):
            fd_check(tp, loss, **bad)


# ── backward -o: names an npz cannot hold ─────────────────────────────────

def test_backward_npz_never_loses_a_gradient_to_an_unstorable_name(tmp_path):
    tp = Tape()
    a = tp.param([1.0], name="w\x00one")        # zip member names end at NUL: both "w"
    b = tp.param([2.0], name="w\x00two")
    c = tp.param([3.0], name="x" * 70_000)      # over a zip name's 65,535 bytes
    d = tp.param([4.0], name="ok/é")
    tp.sum(tp.add(tp.add(a, b), tp.add(c, d)))
    save(tp, tmp_path / "t.msgpack")
    result = run("backward", "-o", tmp_path / "g.npz", tmp_path / "t.msgpack")
    assert result.exit_code == 0, result.output
    notes = result.stderr.splitlines()
    assert len(notes) == 3 and all(n.startswith("gradtool: note: param ") for n in notes)
    assert "contains NUL" in notes[0] and "stored as 'node0'" in notes[0]
    assert "70000 bytes in UTF-8" in notes[2] and "'node2'" in notes[2]
    with np.load(tmp_path / "g.npz") as z:
        assert sorted(z.files) == ["node0", "node1", "node2", "ok/é"]
        assert all(z[k].tolist() == [1.0] for k in z.files)


def test_backward_npz_refuses_two_params_that_would_share_a_key(tmp_path):
    tp = Tape()
    a = tp.param([1.0], name="a\x00")           # stored as node0 ...
    b = tp.param([2.0], name="node0")          # ... which is this param's name
    tp.sum(tp.add(a, b))
    save(tp, tmp_path / "c.msgpack")
    line = assert_one_line_error(run("backward", "-o", tmp_path / "g.npz",
                                     tmp_path / "c.msgpack"), 2)
    assert ": node 1: cannot write the npz: this param would be stored as 'node0', which " \
           "param 0 already uses" in line
    assert not (tmp_path / "g.npz").exists()


# ── inspect --json at the node limit: the text is json.dumps(summary) ───────────

def test_summary_json_is_json_dumps_of_the_summary_for_every_sample_and_op(tmp_path):
    from gradtool.describe import summary, summary_json
    from support import SAMPLE_TAPES
    from gradtool.tapefile.write import dumps
    tp, loss, outputs = all_ops_tape()
    files = [load(dumps(tp, loss=loss, outputs=outputs))] + [load(p) for p in SAMPLE_TAPES]
    chain = Tape()
    x = chain.param(np.ones((2, 1)), name="x")
    for _ in range(5):
        x = chain.neg(x)
    files.append(load(dumps(chain, loss=chain.sum(x))))
    files.append(load(_dumps_long()))       # most nodes of one kind: a template
    for tf in files:
        assert summary_json(tf) == json.dumps(summary(tf)), tf.source
    result = run("inspect", "--json", SAMPLE_TAPES[0])
    assert json.loads(result.stdout) == summary(load(SAMPLE_TAPES[0]))


def test_inspects_node_table_is_the_row_by_row_table_for_every_sample_and_op():
    from gradtool.cli.tapes import _NODE_HEADER, _detail, _inputs, _node_table, _table
    from gradtool.describe import node_entry, plain_node
    from gradtool.ops import format_shape
    from support import SAMPLE_TAPES
    from gradtool.tapefile.write import dumps
    tp, loss, outputs = all_ops_tape()
    files = [load(dumps(tp, loss=loss, outputs=outputs))] + [load(p) for p in SAMPLE_TAPES]
    chain = Tape()
    x = chain.param(np.ones((2, 1)), name="x")
    for _ in range(12):                    # ids of two digits: a wider right-aligned column
        x = chain.neg(x)
    files.append(load(dumps(chain, loss=chain.sum(x))))
    files.append(load(_dumps_long()))
    for tf in files:
        rows = [[str(i), n.op, _inputs(n.a, n.b), format_shape(v.shape),
                 "" if plain_node(n) else _detail(node_entry(tf.tape, i))]
                for i, (n, v) in enumerate(zip(tf.tape.nodes, tf.tape.values))]
        assert _node_table(tf) == _table(rows, _NODE_HEADER), tf.source


def long_tape():
    """(tape, loss): 5000 nodes, most of them one op on one shape reading the node before
    (the rows inspect writes from one template), broken by other ops, shapes, scalars, a
    named const and a binary op."""
    tp = Tape()
    x = tp.param(np.ones((2, 3)), name="x")
    y = tp.const(np.full((3,), 0.5), name="y%s")
    z = tp.tanh(y)
    for k in range(5000):
        if k % 97 == 0:
            x = tp.muls(x, 0.5)
        elif k % 89 == 0:
            x = tp.add(x, z)
        elif k % 83 == 0:
            z = tp.neg(z)
        else:
            x = tp.neg(x)
    return tp, tp.sum(x)


def _dumps_long() -> bytes:
    from gradtool.tapefile.write import dumps
    tp, loss = long_tape()
    return dumps(tp, loss=loss)


def mixed_tape():
    """(tape, loss): 12,000 nodes where no kind of row is most of them: unary and binary
    ops on several shapes, scalar ops, names with % and non-ASCII letters (the rows
    written one by one between the rows written by columns), params with l2."""
    tp = Tape()
    x = tp.param(np.ones((2, 3)), name="x%d é", l2=0.5)
    y = tp.const(np.full((3,), 0.5), name="y 100%")
    w = tp.param(np.ones((3, 1)), name="w")
    h = tp.tanh(y)
    for k in range(3000):
        kind = k % 7
        if kind == 0:
            x = tp.add(x, h)                    # inputs "a,b"
        elif kind == 1:
            x = tp.muls(x, 0.5 + k)             # a detail: s=...
        elif kind == 2:
            h = tp.neg(h)                       # another shape
        elif kind == 3:
            x = tp.mul(tp.tanh(x), x)
        elif kind == 4:
            v = tp.sum(tp.matmul(x, w))         # a shape of one element
            h = tp.add(h, tp.muls(h, 0.0))
        else:
            x = tp.neg(x)
    return tp, tp.add(tp.sum(x), v)


def test_the_node_rows_by_columns_are_the_rows_one_by_one_on_a_mixed_tape(tmp_path):
    from gradtool.cli.tapes import _NODE_HEADER, _detail, _inputs, _node_table, _table
    from gradtool.describe import Columns, node_entry, plain_node, summary, summary_json
    from gradtool.ops import format_shape
    tp, loss = mixed_tape()
    save(tp, tmp_path / "mixed.msgpack", loss=loss)
    tf = load(tmp_path / "mixed.msgpack")
    rows = [[str(i), n.op, _inputs(n.a, n.b), format_shape(v.shape),
             "" if plain_node(n) else _detail(node_entry(tf.tape, i))]
            for i, (n, v) in enumerate(zip(tf.tape.nodes, tf.tape.values))]
    table = _table(rows, _NODE_HEADER)
    assert _node_table(tf) == table
    assert summary_json(tf) == json.dumps(summary(tf))
    # the command prints the same text and JSON, byte for byte
    result = subprocess.run([sys.executable, "-m", "gradtool", "inspect",
                             tmp_path / "mixed.msgpack"], capture_output=True, timeout=120)
    assert result.stdout.endswith(("\n".join(["nodes:", *table]) + "\n").encode())
    result = subprocess.run([sys.executable, "-m", "gradtool", "inspect", "--json",
                             tmp_path / "mixed.msgpack"], capture_output=True, timeout=120)
    assert result.stdout == (json.dumps(summary(tf)) + "\n").encode()
    # a tape whose input ids are not all ints: every row the general way, the same text
    # (node 4, an add, is outside the loader's runs, so the nodes are read)
    assert tf.tape.nodes[4].op == "add"
    tf.tape.nodes[4].a = np.int64(tf.tape.nodes[4].a)
    assert not Columns.of(tf).ints and _node_table(tf) == table


def test_inspect_writes_the_same_bytes_through_the_binary_stream_and_through_click(tmp_path):
    # the node table goes straight to stdout's binary stream (buffered, or raw under
    # PYTHONUNBUFFERED), or through click where stdout does not encode UTF-8: the same
    # text, the ANSI codes of a name taken out off a terminal as click does
    import os
    tp = Tape()
    x = tp.param(np.ones(2), name="x \x1b[31mred\x1b[0m é")
    for _ in range(5000):
        x = tp.neg(x)
    save(tp, tmp_path / "t.msgpack", loss=tp.sum(x))
    outputs = {}
    for env in ({}, {"PYTHONUNBUFFERED": "1"}, {"PYTHONIOENCODING": "latin-1"}):
        for mode in ([], ["--json"]):
            result = subprocess.run([sys.executable, "-m", "gradtool", "inspect", *mode,
                                     tmp_path / "t.msgpack"], capture_output=True,
                                    timeout=120, env={**os.environ, **env})
            assert result.returncode == 0 and result.stderr == b"", result.stderr
            outputs[tuple(env), tuple(mode)] = result.stdout
    text = outputs[(), ()]
    assert b"\x1b" not in text and "x red é".encode() in text and text.endswith(b"[1]\n")
    assert outputs[("PYTHONUNBUFFERED",), ()] == text
    assert outputs[("PYTHONIOENCODING",), ()] == text.decode().encode("latin-1")
    assert len({outputs[k] for k in outputs if k[1]}) == 1       # JSON is ASCII
