"""emit-cuda: emitted C reproduces the CPU tape bit for bit.

Hundreds of random scalar graphs, edge values and bound-const cases are
emitted into ONE C program (each its own function), compiled once with gcc
-O2 -ffp-contract=off, run, and compared bit for bit with ``Tape.backward``.
The same random graphs are compiled with nvcc where it is installed.  The
oracle script runs for real on the logistic sample.  The swarm ABI's tests are
tests/test_emit_swarm.py, the helpers both use tests/support_emit.py.
"""

from __future__ import annotations

import math
import re
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner

import gradtool as gt
from gradtool.cli import main as cli_main
from gradtool.emit import EmitError, EmitScopeError, emit_cuda, layout
from gradtool.emit.render import RULES, SCALAR_OPS, c_double
from gradtool.ops import OPS
from support import (CC, NVCC, H, ROOT, assert_not_contracted, mismatches, needs_cc,
                     nvcc_functions, one_element_tape, one_ulp_off_gradtool, reference,
                     run_c, run_oracle)

N_RANDOM = 220


# ── the op table and the scope ───────────────────────────────────────────────

SCALAR_TABLE_OPS = {"add", "sub", "mul", "div", "abs", "maximum", "sum", "mean", "max",
                    "log_softmax"}


def test_every_elementwise_op_and_the_one_element_reductions_have_a_rendering():
    wanted = {n for n, spec in OPS.items() if spec.elementwise} | SCALAR_TABLE_OPS
    assert wanted <= set(RULES), sorted(wanted - set(RULES))
    assert set(RULES) <= set(OPS)
    assert len(SCALAR_OPS) == 19 + 10 + 9 + 7 + 3 + 1  # 19, then issue 20's erf ... clamp_max,
    # then eq ne lt le gt ge keep keep_not to_f64, then detach floor ceil trunc round fmods
    # mods, then erfc atan atan2, then pow


# cast always involves an f32 value: emit-cuda refuses the f32 tape first (test_f32.py)
OUT_OF_SCOPE = sorted(n for n in OPS if n not in RULES
                      and n not in ("param", "const", "concat", "cast"))


@pytest.mark.parametrize("op", OUT_OF_SCOPE)
def test_ops_without_scalar_form_are_rejected_by_name(op):
    tp, out = one_element_tape(op)
    want = (rf"node {out.id}: op '{op}' has no scalar C form" if op != "uniform"
            else r"node 0 \(const\) has shape \[3\]")      # the rng slot, first
    with pytest.raises(EmitScopeError, match=want):
        emit_cuda(tp, out)


def test_every_op_is_either_rendered_or_rejected():
    # concat cannot produce one element; every other op is covered above
    assert set(OPS) == set(RULES) | set(OUT_OF_SCOPE) | {"param", "const", "concat", "cast"}


def test_first_non_scalar_node_is_named_with_its_shape():
    tp = gt.Tape()
    w = tp.param(np.ones(1), name="w")
    v = tp.const(np.ones((2, 3)), name="v")
    loss = tp.sum(tp.mul(w, v))
    with pytest.raises(EmitScopeError, match=r"node 1 \(const\) has shape \[2,3\]"):
        emit_cuda(tp, loss)


def test_bad_names_and_binds_are_rejected():
    tp = gt.Tape()
    w = tp.param(np.ones(1), name="w")
    x = tp.const(np.ones(1), name="x")
    loss = tp.mul(w, x)
    for bad in ("", "1abc", "double", "gt_exp", "p", "t3", "a-b"):
        with pytest.raises(EmitError, match="not a usable C identifier"):
            emit_cuda(tp, loss, name=bad)
    with pytest.raises(EmitError, match="node 0 is a param"):
        emit_cuda(tp, loss, binds={"w": "1.0"})
    with pytest.raises(EmitError, match="no const named 'y'"):
        emit_cuda(tp, loss, binds={"y": "1.0"})
    for expr in ("", "a; b", "(v[i]", "v /* x */", "f(\n)", "v[i]]"):
        with pytest.raises(EmitError, match="--bind x"):
            emit_cuda(tp, loss, binds={"x": expr})


def test_c_double_literals_are_exact():
    for x in (1.5, -0.0, 0.0, 5e-324, -1e308, 0.1, 2.0 ** -1074 * 3):
        text = c_double(x)
        assert float.fromhex(text.strip("()")) == x
        assert math.copysign(1, float.fromhex(text.strip("()"))) == math.copysign(1, x)
    assert c_double(math.inf) == "gtm_from_bits(0x7ff0000000000000ULL)"
    assert c_double(-math.inf) == "gtm_from_bits(0xfff0000000000000ULL)"


# ── the cases compiled together ──────────────────────────────────────────────


def random_cases():
    rng = np.random.default_rng(20240501)
    out = []
    for k in range(N_RANDOM):
        tp, loss = H.random_scalar_tape(rng, n_ops=int(rng.integers(3, 60)),
                                        n_params=int(rng.integers(1, 5)),
                                        n_consts=int(rng.integers(0, 4)))
        out.append((f"rnd{k}", tp, loss))
    return out


INF, NAN = math.inf, math.nan
EDGE_VALUES = {
    "exp": [709.78, 709.782712893384, 709.7827128933841, 710.0, 1000.0, -745.1, -745.2,
            -746.0, -708.5, -1000.0, 0.0, -0.0, 1e-300, 5e-324, 2.0 ** -28, 0.34, 1.04,
            INF, -INF, NAN],
    "log": [5e-324, 1e-310, 2.2250738585072014e-308, 1e-300, 1e-20, 0.0, -0.0, 1.0,
            1.0 + 2.0 ** -52, 1.0 - 2.0 ** -53, 0.9999, 1.00001, 1e308, INF, -1.0, NAN],
    "tanh": [0.0, -0.0, 1e-300, 2.0 ** -56, 2.0 ** -28, 1e-5, 0.5, 0.99, 1.0, 1.5, 21.9,
             22.0, 30.0, -30.0, 1e308, -INF, NAN],
    "sigmoid": [0.0, -0.0, 40.0, -40.0, 36.7, -37.0, 745.0, -745.0, 800.0, -800.0, 1e-300],
    "sqrt": [0.0, -0.0, 5e-324, 1e-310, 2.0, 4.0, 1e308, INF, -1.0],
    "relu": [0.0, -0.0, 5e-324, -5e-324, 3.0, -3.0, NAN, INF, -INF],
    "neg": [0.0, -0.0, INF],
    "sum": [0.0, -0.0, NAN, INF],
    "mean": [0.0, -0.0, NAN, -INF],
    "abs": [0.0, -0.0, 5e-324, -5e-324, -3.0, INF, -INF, NAN],
    "max": [0.0, -0.0, NAN, -INF],
    "log_softmax": [0.0, -0.0, 1e308, -1e308, INF, -INF, NAN],
}


def edge_cases():
    out = []

    def add(label, tp, loss):
        out.append((f"edge{len(out)}_{label}", tp, loss))

    for op, values in EDGE_VALUES.items():
        for v in values:
            tp = gt.Tape()
            w = tp.param(np.array([v]), name="w")
            add(op, tp, tp.muls(getattr(tp, op)(w), 1.5))     # g = 1.5 into the op
            tp = gt.Tape()
            w = tp.param(np.array([v]), name="w")
            add(op, tp, getattr(tp, op)(w))                   # the op is the loss
    for s in (INF, -INF, NAN, -0.0, 5e-324, 1e308):
        for op in ("adds", "muls"):
            tp = gt.Tape()
            w = tp.param(np.array([1e308]), name="w")
            add(op, tp, getattr(tp, op)(getattr(tp, op)(w, s), 2.0))
    tiny = [5e-324, -5e-324, 1e-310, 1e-300, 0.0, -0.0]
    for b in tiny:
        for a in (1.0, 1e300, -2.0, 0.0):
            tp = gt.Tape()
            wa, wb = tp.param(np.array([a]), name="a"), tp.param(np.array([b]), name="b")
            add("div", tp, tp.div(wa, wb))
    for a, b in ((0.0, -0.0), (-0.0, 0.0), (2.0, 2.0), (NAN, 1.0), (1.0, NAN), (INF, -INF),
                 (-INF, 5e-324)):                 # maximum: ties, NaN on either side
        tp = gt.Tape()
        wa, wb = tp.param(np.array([a]), name="a"), tp.param(np.array([b]), name="b")
        add("maximum", tp, tp.muls(tp.maximum(wa, wb), -1.5))
    for a, b in ((1e200, 1e200), (1e-200, 1e-200), (-0.0, -0.0), (3.0, -0.0)):
        tp = gt.Tape()
        wa, wb = tp.param(np.array([a]), name="a"), tp.param(np.array([b]), name="b")
        add("mul", tp, tp.add(tp.mul(wa, wb), tp.mul(wa, wa)))     # x*x fan-out
        tp = gt.Tape()
        wa, wb = tp.param(np.array([a]), name="a"), tp.param(np.array([b]), name="b")
        add("sub", tp, tp.sub(tp.sub(wa, wb), tp.sub(wa, wa)))
    # other one-element shapes: [1,1] leaves broadcast against [1] (the identity)
    tp = gt.Tape()
    w = tp.param(np.array([[0.3]]), name="w")
    v = tp.param(np.array([-1.25]), name="v")
    c = tp.const(np.array([[[2.0]]]), name="c")
    add("shapes", tp, tp.mean(tp.mul(tp.sigmoid(tp.add(w, v)), tp.div(c, w))))
    # the loss is a parameter; the loss does not depend on any parameter; a lone param
    tp = gt.Tape()
    w = tp.param(np.array([2.0]), name="w")
    add("lossparam", tp, w)
    tp = gt.Tape()
    w = tp.param(np.array([2.0]), name="w")
    c = tp.const(np.array([3.0]), name="c")
    add("constloss", tp, tp.exp(tp.muls(c, 0.5)))
    tp = gt.Tape()
    w = tp.param(np.array([2.0]), name="w")
    tp.param(np.array([5.0]), name="unused")
    add("unreached", tp, tp.tanh(w))
    return out


def bind_cases():
    """Named consts replaced by expressions reading a global the program defines."""
    rng = np.random.default_rng(7)
    out, bound_values = [], []
    for k in range(12):
        tp, loss = H.random_scalar_tape(rng, n_ops=30, n_params=2, n_consts=4)
        named = [n.name for n in tp.nodes if n.op == "const" and n.name]
        binds = {}
        for name in named[: 1 + k % 2]:
            i = tp.var(name).id
            binds[name] = f"gt_test_bound[{len(bound_values)}]"
            bound_values.append(tp.values[i].item())
        out.append((f"bnd{k}", tp, loss, binds))
    return out, bound_values


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Every case emitted into one C program, compiled once, run once."""
    if CC is None:
        pytest.skip("no C compiler")
    cases = [(f, tp, loss, None) for f, tp, loss in random_cases() + edge_cases()]
    bcases, bound_values = bind_cases()
    cases += bcases
    sources = ["static const double gt_test_bound[] = {"
               + ", ".join(c_double(v) for v in bound_values) + "};"]
    runs, refs = [], {}
    for k, (fname, tp, loss, binds) in enumerate(cases):
        sources.append(emit_cuda(tp, loss, binds=binds, name=fname, kernel=k % 2 == 0))
        lay = layout(tp, loss, binds)
        runs.append((fname, tp, lay))
        refs[fname] = (tp, lay, reference(tp, loss, lay))
    out = run_c(tmp_path_factory.mktemp("emitc"), "all", H.harness_program(sources, runs))
    return H.parse_output(out), refs


@needs_cc
def test_random_graphs_bit_exact(compiled):
    got, refs = compiled
    assert sum(f.startswith("rnd") for f in refs) == N_RANDOM
    bad = mismatches(got, refs, "rnd")
    assert not bad, f"{len(bad)} differences, first: {bad[:5]}"


@needs_cc
def test_edge_values_bit_exact(compiled):
    got, refs = compiled
    bad = mismatches(got, refs, "edge")
    assert not bad, f"{len(bad)} differences, first: {bad[:5]}"
    # the edge cases really reach the special values (so the test could fail there)
    losses = [H.from_bits(got[f]["loss"]) for f in got if f.startswith("edge")]
    assert any(math.isinf(v) for v in losses) and any(math.isnan(v) for v in losses)
    assert any(v != 0.0 and abs(v) < 2.2250738585072014e-308 for v in losses)   # subnormal


@needs_cc
def test_bound_consts_bit_exact(compiled):
    got, refs = compiled
    bad = mismatches(got, refs, "bnd")
    assert not bad, f"{len(bad)} differences, first: {bad[:5]}"


def test_random_graphs_cover_every_scalar_op_fanout_and_const_branches():
    seen, fanout, const_only, unreached_leaf, unnamed_const = set(), 0, 0, 0, 0
    for _, tp, loss in random_cases():
        anc = {loss.id}
        for i in range(loss.id, -1, -1):
            n = tp.nodes[i]
            if i in anc and n.a >= 0:
                anc |= {n.a} | ({n.b} if n.b >= 0 else set())
        for i in anc:
            n = tp.nodes[i]
            seen.add(n.op)
            fanout += n.a >= 0 and n.a == n.b
            const_only += n.a >= 0 and not tp.requires[i]
            unnamed_const += n.op == "const" and not n.name
        unreached_leaf += any(n.op == "param" and i not in anc for i, n in enumerate(tp.nodes))
    assert set(SCALAR_OPS) <= seen, sorted(set(SCALAR_OPS) - seen)
    assert fanout >= 50 and const_only >= 50 and unreached_leaf >= 10 and unnamed_const >= 50


def test_const_only_branches_emit_no_backward_code():
    tp = gt.Tape()
    w = tp.param(np.array([0.5]), name="w")
    c = tp.const(np.array([2.0]), name="c")
    k = tp.exp(tp.muls(c, 3.0))                  # const-only branch: nodes 2, 3
    loss = tp.mul(w, k)
    src = emit_cuda(tp, loss)
    assert "double t3 = gt_exp(t2);" in src
    assert re.search(r"\bg[23]\b", src) is None  # no gradient slot for the const branch
    assert "double g0 = GT_ADD(0.0, GT_MUL(g4, t3));" in src
    assert "GT_G_ADD(g, 0, g0);" in src


@needs_cc
def test_gt_g_add_accumulates_by_default_and_can_be_predefined(tmp_path):
    tp = gt.Tape()
    w = tp.param(np.array([0.75]), name="w")
    u = tp.param(np.array([-1.5]), name="u")
    loss = tp.tanh(tp.mul(w, u))
    tp.backward(loss)
    src = emit_cuda(tp, loss, name="f")
    (tmp_path / "f.cu").write_text(src)
    main_c = tmp_path / "main.c"
    main_c.write_text(r"""
#include <stdio.h>
#define GT_G_ADD(g, j, v) ((g)[2 * (j) + 1] = (v))   /* a caller's own layout */
#include "f.cu"
int main(void)
{
    const double p[] = {0x1.8p-1, -0x1.8p+0};
    double g[4] = {7.0, 0.0, 7.0, 0.0};
    f(p, 0, g);
    printf("%a %a %a %a\n", g[0], g[1], g[2], g[3]);
    return 0;
}
""")
    exe = tmp_path / "main"
    subprocess.run([CC, "-std=c99", "-O2", "-ffp-contract=off", "-o", str(exe), str(main_c),
                    "-lm"], check=True)
    vals = [float.fromhex(v) for v in subprocess.run([str(exe)], capture_output=True,
                                                     text=True, check=True).stdout.split()]
    assert vals == [7.0, tp.grad(w).item(), 7.0, tp.grad(u).item()]
    assert "GT_G_ADD(g, j, v) ((g)[j] = GT_ADD((g)[j], (v)))" in src   # the default: g[j] += v


# ── nvcc ─────────────────────────────────────────────────────────────────────


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_nvcc_compiles_every_random_graph_without_contraction(tmp_path):
    sources = [emit_cuda(tp, loss, name=f, kernel=True) for f, tp, loss in random_cases()]
    emitted = nvcc_functions(tmp_path, sources)
    assert sum(n.endswith("_batch") for n in emitted) == N_RANDOM
    assert_not_contracted(emitted)


# ── the command line and the oracle ──────────────────────────────────────────


def _scalar_tape_file(tmp_path, seed=3, n_ops=40):
    from gradtool.tapefile import save
    tp, loss = H.random_scalar_tape(np.random.default_rng(seed), n_ops=n_ops)
    path = tmp_path / f"random{seed}.msgpack"
    save(tp, path, loss=loss)
    return path, tp, loss


def test_cli_emits_the_library_output(tmp_path):
    path, tp, loss = _scalar_tape_file(tmp_path)
    runner = CliRunner()
    res = runner.invoke(cli_main, ["emit-cuda", str(path), "--name", "f", "--kernel"])
    assert res.exit_code == 0, res.output
    want = emit_cuda(tp, loss, name="f", kernel=True, source=str(path))
    assert res.stdout == want
    out = tmp_path / "f.cu"
    res = runner.invoke(cli_main, ["emit-cuda", "-", "--name", "f", "--kernel", "-o", str(out)],
                        input=path.read_bytes())
    assert res.exit_code == 0 and res.stdout == ""
    assert out.read_text() == want.replace(f"Source: {path}", "Source: <stdin>")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cli_bind(tmp_path):
    from gradtool.tapefile import save
    tp = gt.Tape()
    w = tp.param(np.array([0.5]), name="w")
    v = tp.const(np.array([3.0]), name="v")
    k = tp.const(np.array([2.0]))
    loss = tp.div(tp.mul(w, v), k)
    save(tp, tmp_path / "t.msgpack", loss=loss)
    res = CliRunner().invoke(cli_main, ["emit-cuda", str(tmp_path / "t.msgpack"),
                                        "--bind", "v=(double)v[i]"])
    assert res.exit_code == 0, res.output
    assert "    double t1 = ((double)v[i]);  /* const v, bound */" in res.stdout
    assert "    double t2 = x[0];  /* const (unnamed) */" in res.stdout   # x[k] stays compact
    assert "#define GRADTOOL_GRAD_N_DATA 1" in res.stdout


@pytest.mark.parametrize("args,pattern", [
    (["--bind", "nosuch=1.0"], r"--bind nosuch: no const named 'nosuch'"),
    (["--bind", "novalue"], r"expected NAME=EXPR"),
    (["--name", "int"], r"not a usable C identifier"),
])
def test_cli_bad_options_exit_2_with_one_line(tmp_path, args, pattern):
    path, _, _ = _scalar_tape_file(tmp_path)
    res = CliRunner().invoke(cli_main, ["emit-cuda", str(path)] + args)
    assert res.exit_code == 2
    assert len(res.stderr.strip().splitlines()) == 1 and re.search(pattern, res.stderr)


def test_cli_non_scalar_tape_exit_2_naming_node(tmp_path):
    sample = ROOT / "samples" / "mlp_regression.msgpack"
    if not sample.exists():
        pytest.skip("samples/mlp_regression.msgpack not built")
    res = CliRunner().invoke(cli_main, ["emit-cuda", str(sample)])
    assert res.exit_code == 2
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1
    assert re.search(r"mlp_regression\.msgpack: node \d+ \(\w+\) has shape \[[\d,]+\]", line), line


def test_cli_unreadable_tape_exit_2(tmp_path):
    res = CliRunner().invoke(cli_main, ["emit-cuda", str(tmp_path / "missing.msgpack")])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1


@needs_cc
def test_oracle_passes_on_the_scalar_sample_and_a_random_tape(tmp_path):
    sample = ROOT / "samples" / "logistic.msgpack"
    tapes = [sample] if sample.exists() else []
    tapes.append(_scalar_tape_file(tmp_path, seed=11, n_ops=50)[0])
    res = run_oracle(*tapes, env={"NVCC": "none"})     # nvcc is covered above, and slow
    assert res.returncode == 0, res.stderr + res.stdout
    assert f"{len(tapes)} tape(s) OK" in res.stdout


@needs_cc
def test_oracle_exit_1_names_the_differing_parameter(tmp_path):
    path, tp, _ = _scalar_tape_file(tmp_path, seed=5)
    res = run_oracle(path, env={"GRADTOOL": one_ulp_off_gradtool(tmp_path, 0), "NVCC": "none"})
    first = tp.params()[0]
    assert res.returncode == 1, res.stderr + res.stdout
    assert f"gradient of p[0] (node {first.id}, {tp.nodes[first.id].name or '(unnamed)'}) differs" \
        in res.stderr


@needs_cc
def test_oracle_exit_2_on_bad_input(tmp_path):
    res = run_oracle(tmp_path / "missing.msgpack", env={"NVCC": "none"})
    assert res.returncode == 2 and "missing.msgpack" in res.stderr
    res = run_oracle()
    assert res.returncode == 2
    sample = ROOT / "samples" / "mlp_regression.msgpack"
    if sample.exists():
        res = run_oracle(sample, env={"NVCC": "none"})
        assert res.returncode == 2 and "has shape" in res.stderr
