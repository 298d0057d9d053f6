"""emit-cuda: emitted C reproduces the CPU tape bit for bit.

Hundreds of random scalar graphs, edge values and bound-const cases are
emitted into ONE C program (each its own function), compiled once with gcc
-O2 -ffp-contract=off, run, and compared bit for bit with ``Tape.backward``.
The same random graphs are compiled with nvcc where it is installed.  The
oracle script runs for real on the logistic sample.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import gradtool as gt
from gradtool.cli import main as cli_main
from gradtool.emit import EmitError, EmitScopeError, emit_cuda, layout
from gradtool.emit.render import RULES, SCALAR_OPS, c_double
from gradtool.ops import OPS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import emitc_harness as H  # noqa: E402

CC = shutil.which("cc") or shutil.which("gcc")
NVCC = shutil.which("nvcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler")
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


def _one_element_tape(op):
    """A tape whose last node applies `op` to one-element inputs (so only the op is out of scope)."""
    tp = gt.Tape()
    if op == "matmul":
        a = tp.param(np.ones((1, 1)))
        out = tp.matmul(a, tp.const(np.ones((1, 1))))
    elif op == "bmm":
        out = tp.bmm(tp.param(np.ones((1, 1, 1))), tp.param(np.ones((1, 1, 1))))
    elif op == "transpose":
        out = tp.transpose(tp.param(np.ones((1, 1))))
    elif op == "reshape":
        out = tp.reshape(tp.param(np.ones(1)), [1, 1])
    elif op == "softmax":
        out = tp.softmax(tp.param(np.ones(1)))
    elif op == "slice":
        out = tp.slice(tp.param(np.ones(1)), [0], [1])
    elif op == "permute":
        out = tp.permute(tp.param(np.ones((1, 1))), [1, 0])
    elif op in ("take", "take_along"):
        out = tp.record(op, tp.param(np.ones(1)), tp.const(np.zeros(1, dtype=int), dtype="i64"))
    elif op == "scatter":
        out = tp.scatter(tp.param(np.ones(1)), tp.const(np.zeros(1, dtype=int), dtype="i64"),
                         rows=1)
    elif op == "conv2d":
        out = tp.conv2d(tp.param(np.ones((1, 1, 1, 1))), tp.param(np.ones((1, 1, 1, 1))))
    elif op in ("max_pool2d", "avg_pool2d"):
        out = tp.record(op, tp.param(np.ones((1, 1, 1, 1))),
                        attrs={"kernel": [1, 1], "stride": [1, 1]})
    elif op == "uniform":               # reads the [3] rng slot: never one-element
        out = tp.uniform(tp.rng(), shape=[1], salt=0)
    elif op == "cast":
        out = tp.cast(tp.param(np.ones(1)), "f32")
    else:
        raise AssertionError(op)
    return tp, out


# cast always involves an f32 value: emit-cuda refuses the f32 tape first (test_f32.py)
OUT_OF_SCOPE = sorted(n for n in OPS if n not in RULES
                      and n not in ("param", "const", "concat", "cast"))


@pytest.mark.parametrize("op", OUT_OF_SCOPE)
def test_ops_without_scalar_form_are_rejected_by_name(op):
    tp, out = _one_element_tape(op)
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


def reference(tp, loss, lay):
    tp.zero_grad()
    with np.errstate(all="ignore"):
        tp.backward(loss)
    return (H.to_bits(tp.values[lay.loss].item()),
            [H.to_bits(tp.grad(tp.var(i)).item()) for i in lay.params])


def run_c(work, name, program):
    """Compile one C program (gcc -O2 -ffp-contract=off, warnings as errors), run it, return
    its stdout."""
    src, exe = work / f"{name}.c", work / name
    src.write_text(program)
    proc = subprocess.run([CC, "-std=c99", "-O2", "-ffp-contract=off", "-Wall", "-Wextra",
                           "-Werror", "-o", str(exe), str(src), "-lm"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[:3000]
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


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


def _mismatches(got, refs, prefix):
    bad = []
    for fname, (tp, lay, (want_loss, want_grads)) in refs.items():
        if not fname.startswith(prefix):
            continue
        have = got[fname]
        if not H.same_bits(have["loss"], want_loss):
            bad.append(f"{fname}: loss node {lay.loss}: C {H.describe(have['loss'])} "
                       f"vs tape {H.describe(want_loss)}")
        for j, node in enumerate(lay.params):
            if not H.same_bits(have["p"][j], want_grads[j]):
                bad.append(f"{fname}: p[{j}] node {node}: C {H.describe(have['p'][j])} "
                           f"vs tape {H.describe(want_grads[j])}")
    return bad


@needs_cc
def test_random_graphs_bit_exact(compiled):
    got, refs = compiled
    assert sum(f.startswith("rnd") for f in refs) == N_RANDOM
    bad = _mismatches(got, refs, "rnd")
    assert not bad, f"{len(bad)} differences, first: {bad[:5]}"


@needs_cc
def test_edge_values_bit_exact(compiled):
    got, refs = compiled
    bad = _mismatches(got, refs, "edge")
    assert not bad, f"{len(bad)} differences, first: {bad[:5]}"
    # the edge cases really reach the special values (so the test could fail there)
    losses = [H.from_bits(got[f]["loss"]) for f in got if f.startswith("edge")]
    assert any(math.isinf(v) for v in losses) and any(math.isnan(v) for v in losses)
    assert any(v != 0.0 and abs(v) < 2.2250738585072014e-308 for v in losses)   # subnormal


@needs_cc
def test_bound_consts_bit_exact(compiled):
    got, refs = compiled
    bad = _mismatches(got, refs, "bnd")
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


CONTROL = """
/* control: the same multiply-add WITHOUT the GT_ macros, which nvcc contracts */
extern "C" __global__ void gt_test_control(const double *a, double *out)
{
    out[0] = a[0] * a[1] + a[2];
}
"""


def _ptx_functions(ptx: str) -> dict:
    """{function name: body} of every .entry/.func in a PTX file."""
    parts = re.split(r"^\s*(?:\.visible\s+|\.weak\s+)?\.(?:entry|func)\s+", ptx, flags=re.M)
    out = {}
    for part in parts[1:]:
        name = re.match(r"(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)", part).group(1)
        out[name] = part
    return out


def nvcc_functions(work, sources) -> dict:
    """{function: PTX body} of ``sources`` compiled with ``nvcc -c -arch=sm_90`` (without a
    warning), once the control (a plain multiply-add) is seen fused: the contraction check
    can fail."""
    cu = work / "all.cu"
    cu.write_text("\n".join(sources) + CONTROL)
    proc = subprocess.run([NVCC, "-c", "-arch=sm_90", "-keep", "-keep-dir", str(work),
                           "-o", str(work / "all.o"), str(cu)], capture_output=True, text=True)
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr[:3000]
    funcs = _ptx_functions(next(work.glob("*.ptx")).read_text())
    assert re.search(r"fma\.rn\.f64", funcs.pop("gt_test_control"))
    return funcs


def assert_not_contracted(funcs: dict) -> None:
    for name, body in funcs.items():
        assert not re.search(r"\bfma\.", body), f"{name}: nvcc fused a multiply-add"
        # an add/sub/mul without .rn is one ptxas may still contract (an atomic's
        # atom.global.add.f64 is not)
        assert not re.search(r"(?<![\w.])(?:add|sub|mul)\.f64\b", body), \
            f"{name}: contractable op"


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


ORACLE = ROOT / "scripts" / "emitc_oracle.sh"


def _oracle(*tapes, env=None):
    return subprocess.run(["bash", str(ORACLE), *map(str, tapes)], capture_output=True,
                          text=True, env={**os.environ, **(env or {})})


@needs_cc
def test_oracle_passes_on_the_scalar_sample_and_a_random_tape(tmp_path):
    sample = ROOT / "samples" / "logistic.msgpack"
    tapes = [sample] if sample.exists() else []
    tapes.append(_scalar_tape_file(tmp_path, seed=11, n_ops=50)[0])
    res = _oracle(*tapes, env={"NVCC": "none"})     # nvcc is covered above, and slow
    assert res.returncode == 0, res.stderr + res.stdout
    assert f"{len(tapes)} tape(s) OK" in res.stdout


def _one_ulp_off_gradtool(tmp_path, k):
    """A `gradtool` whose backward reports the k-th param's gradient one ulp off."""
    fake = tmp_path / "gradtool"
    fake.write_text(f"""#!{sys.executable}
import json, math, subprocess, sys
out = subprocess.run(["gradtool"] + sys.argv[1:], capture_output=True, text=True)
if sys.argv[1] != "backward":
    sys.stdout.write(out.stdout); sys.stderr.write(out.stderr); sys.exit(out.returncode)
ref = json.loads(out.stdout)
x = float.fromhex(ref["params"][{k}]["grad"][0])
ref["params"][{k}]["grad"][0] = math.nextafter(x, math.inf).hex()
print(json.dumps(ref))
""")
    fake.chmod(0o755)
    return str(fake)


@needs_cc
def test_oracle_exit_1_names_the_differing_parameter(tmp_path):
    path, tp, _ = _scalar_tape_file(tmp_path, seed=5)
    res = _oracle(path, env={"GRADTOOL": _one_ulp_off_gradtool(tmp_path, 0), "NVCC": "none"})
    first = tp.params()[0]
    assert res.returncode == 1, res.stderr + res.stdout
    assert f"gradient of p[0] (node {first.id}, {tp.nodes[first.id].name or '(unnamed)'}) differs" \
        in res.stderr


@needs_cc
def test_oracle_exit_2_on_bad_input(tmp_path):
    res = _oracle(tmp_path / "missing.msgpack", env={"NVCC": "none"})
    assert res.returncode == 2 and "missing.msgpack" in res.stderr
    res = _oracle()
    assert res.returncode == 2
    sample = ROOT / "samples" / "mlp_regression.msgpack"
    if sample.exists():
        res = _oracle(sample, env={"NVCC": "none"})
        assert res.returncode == 2 and "has shape" in res.stderr


# ── the swarm ABI: compute_iterate's grad(x, v, g, p) ────────────────────────

from gradtool.train.data import Dataset, gradient_sum, input_slots  # noqa: E402

N_SWARM = 120
SWARM_SIGNATURE = "__device__ void grad(long long x, double v, double* g, const double* p)"


def swarm_cases():
    """Random tapes with random param subsets (in random order), random bindings to v and
    (double)x, some without v, and the datasets each is summed over."""
    rng = np.random.default_rng(1515)
    out = []
    for k in range(N_SWARM):
        tp, loss = H.random_scalar_tape(rng, n_ops=int(rng.integers(3, 50)),
                                        n_params=int(rng.integers(1, 5)),
                                        n_consts=int(rng.integers(0, 5)), feed_data=k % 6 != 0)
        params, binds = H.random_plan(tp, rng)
        if k % 17 == 5:
            params = []                                # no params chosen: K = 0
        has_v = k % 5 != 3
        if not has_v:
            binds = {name: "(double)x" for name in binds}
        lay = layout(tp, loss, binds, params, freeze_consts=True)
        xs, vs, arrays = H.swarm_examples(tp, lay, rng, int(rng.integers(1, 13)))
        out.append((f"sw{k}", tp, loss, params, binds, has_v, lay, xs, vs, arrays))
    return out


def swarm_reference(tp, loss, lay, xs, arrays):
    """(the tape's sum over the dataset as bits per p[j], how many p[j] sums change bits
    when the examples are added in reverse order: the order the test pins down)"""
    slots = input_slots(tp) if tp.input_slots() else []
    summed = gradient_sum(tp, loss, Dataset(arrays, len(xs), "test"), slots)
    single = [gradient_sum(tp, loss, Dataset({n: a[k:k + 1] for n, a in arrays.items()}, 1,
                                             "test"), slots) for k in range(len(xs))]
    order_matters = 0
    for i in lay.params:
        backwards = 0.0
        for one in reversed(single):
            backwards = backwards + one.grads[i].item()
        order_matters += not H.same_bits(H.to_bits(backwards), H.to_bits(summed.grads[i].item()))
    return [H.to_bits(summed.grads[i].item()) for i in lay.params], order_matters


@pytest.fixture(scope="module")
def swarm_compiled(tmp_path_factory):
    """Every swarm case emitted into one C program (gcc -Wall -Wextra -Werror), run once."""
    if CC is None:
        pytest.skip("no C compiler")
    cases = swarm_cases()
    sources, runs, refs = [], [], {}
    for fname, tp, loss, params, binds, has_v, lay, xs, vs, arrays in cases:
        sources.append(emit_cuda(tp, loss, abi="swarm", params=params, binds=binds,
                                 name=fname, has_v=has_v))
        runs.append((fname, tp, lay, xs, vs, has_v))
        refs[fname] = (tp, lay, *swarm_reference(tp, loss, lay, xs, arrays))
    out = run_c(tmp_path_factory.mktemp("swarm"), "swarm", H.swarm_program(sources, runs))
    return H.parse_output(out), refs, cases


@needs_cc
def test_swarm_random_tapes_sum_bit_exact_over_their_datasets(swarm_compiled):
    got, refs, cases = swarm_compiled
    assert len(refs) == N_SWARM >= 100
    bad, finite = [], 0
    for fname, (tp, lay, want, _) in refs.items():
        have = got.get(fname, {"p": {}})["p"]
        assert sorted(have) == list(range(len(lay.params))), fname
        for j, node in enumerate(lay.params):
            finite += math.isfinite(H.from_bits(want[j]))
            if not H.same_bits(have[j], want[j]):
                bad.append(f"{fname}: p[{j}] node {node}: C {H.describe(have[j])} "
                           f"vs tape {H.describe(want[j])}")
    assert not bad, f"{len(bad)} differences, first: {bad[:5]}"
    # the plans really vary what the test covers (so each part could fail)
    subsets = sum(len(lay.params) < sum(n.op == "param" for n in tp.nodes)
                  for _, tp, _, _, _, _, lay, _, _, _ in cases)
    reordered = sum(list(lay.params) != sorted(lay.params) for *_, lay, _, _, _ in cases)
    bound = {e for *_, binds, _, _, _, _, _ in cases for e in binds.values()}
    frozen_unnamed = sum(any(tp.nodes[i].op == "const" and not tp.nodes[i].name
                             for i in lay.frozen) for _, tp, *_, lay, _, _, _ in cases)
    no_v = sum(not has_v for *_, has_v, _, _, _, _ in cases)
    multi = sum(len(xs) > 1 for *_, xs, _, _ in cases)
    assert subsets >= 30 and reordered >= 20 and frozen_unnamed >= 20 and no_v >= 15
    assert bound == {"v", "(double)x"} and multi >= 80 and finite >= 150
    # the examples change the gradients, so their order shows in the bits
    assert sum(order for *_, order in refs.values()) >= 10


def _swarm_tape():
    """w0, w1 chosen-or-not params; x0, y named consts; an unnamed 2.0; a branch of u only."""
    tp = gt.Tape()
    w0 = tp.param(np.array([0.75]), name="w0")
    w1 = tp.param(np.array([-0.5]), name="w1")
    u = tp.param(np.array([0.25]), name="u")
    x0 = tp.const(np.array([1.5]), name="x0")
    y = tp.const(np.array([1.0]), name="y")
    two = tp.const(np.array([2.0]))                        # unnamed: y / 2.0
    z = tp.add(tp.mul(w0, x0), tp.mul(w1, tp.div(y, two)))
    ub = tp.exp(tp.mul(u, u))                              # depends on u only
    loss = tp.add(tp.sigmoid(z), tp.mul(ub, y))
    return tp, loss, ub


def _backward_lines(src):
    return [line for line in src.splitlines() if re.match(r"\s+(double )?g\d+ = ", line)]


def test_swarm_signature_is_the_seeds_and_frozen_consts_are_hex_literals():
    tp, loss, _ = _swarm_tape()
    src = emit_cuda(tp, loss, abi="swarm", binds={"y": "v", "x0": "(double)x"})
    assert src.count(SWARM_SIGNATURE) == 2                 # header comment and definition
    assert re.search(r"^" + re.escape(SWARM_SIGNATURE) + r"\n\{", src, re.M)
    body = src[src.index(SWARM_SIGNATURE + "\n{"):]
    assert f"double t5 = {c_double(2.0)};  /* const (unnamed), frozen */" in body
    assert c_double(2.0) == "0x1p+1"                       # an exact hex literal
    assert "double t3 = ((double)x);  /* const x0, bound */" in body
    assert "double t4 = (v);  /* const y, bound */" in body
    assert not re.search(r"\bx\[", body)                  # no data slots
    assert not re.search(r"^\s+return\b", body, re.M)     # no loss returned
    # every bound/frozen literal is exact: the unbound named const is frozen too
    src2 = emit_cuda(tp, loss, abi="swarm", binds={"x0": "(double)x"})
    assert f"double t4 = {c_double(1.0)};  /* const y, frozen */" in src2
    for lit in re.findall(r"double t\d+ = (\(?-?0x[0-9a-f.]+p[-+]\d+\)?);", src2):
        assert float.fromhex(lit.strip("()")) in (1.5, 1.0, 2.0)
    # the gradtool ABI keeps its x[k] slots for the same consts
    assert "double t5 = x[2];  /* const (unnamed) */" in emit_cuda(tp, loss)


def test_swarm_params_choose_which_accumulator_calls_exist():
    tp, loss, _ = _swarm_tape()
    calls = lambda src: re.findall(r"^    swarm_g_add\(g, (\d+), (\w+|0\.0)\);", src, re.M)  # noqa: E731
    assert calls(emit_cuda(tp, loss, abi="swarm")) == [("0", "g0"), ("1", "g1"), ("2", "g2")]
    src = emit_cuda(tp, loss, abi="swarm", params=["u", "w0"])
    assert calls(src) == [("0", "g2"), ("1", "g0")]
    assert "double t2 = p[0];  /* param u */" in src and "double t0 = p[1];  /* param w0 */" in src
    assert f"double t1 = {c_double(-0.5)};  /* param w1, frozen */" in src
    assert calls(emit_cuda(tp, loss, abi="swarm", params=["node1"])) == [("0", "g1")]
    # a chosen param the loss does not reach still gets its call, with 0.0
    tp2 = gt.Tape()
    w = tp2.param(np.array([2.0]), name="w")
    tp2.param(np.array([5.0]), name="unused")
    src = emit_cuda(tp2, tp2.tanh(w), abi="swarm", params=["unused", "w"])
    assert calls(src) == [("0", "0.0"), ("1", "g0")]
    assert "swarm_g_add(g, 0, 0.0);  /* unused: unreached */" in src


def test_swarm_unchosen_branches_produce_no_backward_statements():
    tp, loss, ub = _swarm_tape()
    u_branch = {2, ub.id - 1, ub.id}                       # u, u*u, exp(u*u)
    assert ub.id == 11
    everything = _backward_lines(emit_cuda(tp, loss, abi="swarm"))
    slots = lambda lines: {int(m) for line in lines for m in re.findall(r"\bg(\d+)\b", line)}  # noqa: E731
    assert u_branch <= slots(everything)                   # all chosen: the branch is there
    without_u = _backward_lines(emit_cuda(tp, loss, abi="swarm", params=["w0", "w1"]))
    assert not (u_branch & slots(without_u)), without_u
    only_u = _backward_lines(emit_cuda(tp, loss, abi="swarm", params=["u"]))
    z_branch = {0, 1, 6, 8, 9, 12}                         # w0, w1, the products, z, sigmoid
    assert u_branch <= slots(only_u) and not (z_branch & slots(only_u)), only_u
    # the consts and the const-only y / 2.0 never get one
    assert not ({3, 4, 5, 7} & slots(everything))


def test_swarm_names_and_the_form_without_v_can_be_chosen():
    tp, loss, _ = _swarm_tape()
    src = emit_cuda(tp, loss, abi="swarm", binds={"x0": "(double)idx", "y": "val"}, name="fit",
                    x_name="idx", v_name="val", g_add="acc_add")
    assert "__device__ void fit(long long idx, double val, double* g, const double* p)\n{" in src
    assert "#ifndef acc_add\n__device__ void acc_add(double* g, long long j, double val);" in src
    assert "    acc_add(g, 0, g0);" in src and "swarm_g_add" not in src
    src = emit_cuda(tp, loss, abi="swarm", binds={"x0": "(double)x"}, has_v=False)
    assert "__device__ void grad(long long x, double* g, const double* p)\n{" in src
    src = emit_cuda(tp, loss, abi="swarm", has_v=False)
    assert "    (void)x;\n" in src                         # nothing reads x


@needs_cc
def test_swarm_accumulator_may_be_a_macro_or_another_function(tmp_path):
    tp, loss, _ = _swarm_tape()
    (tmp_path / "a.cu").write_text(emit_cuda(tp, loss, abi="swarm", name="fa",
                                             binds={"y": "v"}, g_add="ACC"))
    (tmp_path / "b.cu").write_text(emit_cuda(tp, loss, abi="swarm", name="fb",
                                             binds={"y": "v"}, g_add="acc_fn"))
    main_c = tmp_path / "main.c"
    main_c.write_text(r"""
#include <stdio.h>
#define ACC(g, j, val) ((g)[2 * (j)] = (val))      /* a macro: no prototype is declared */
#include "a.cu"
#include "b.cu"
void acc_fn(double* g, long long j, double val) { g[j] = GT_ADD(g[j], val); }
int main(void)
{
    const double p[] = {0x1.8p-1, -0x1p-1, 0x1p-2};
    double ga[6] = {7, 7, 7, 7, 7, 7}, gb[3] = {0, 0, 0};
    fa(0, 0x1p+0, ga, p);
    fb(0, 0x1p+0, gb, p);
    fb(0, 0x1p+0, gb, p);
    printf("%a %a %a %a %a %a %a\n", ga[0], ga[1], ga[2], ga[4], gb[0], gb[1], gb[2]);
    return 0;
}
""")
    exe = tmp_path / "main"
    subprocess.run([CC, "-std=c99", "-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror",
                    "-o", str(exe), str(main_c), "-lm"], check=True)
    vals = [float.fromhex(v) for v in subprocess.run([str(exe)], capture_output=True, text=True,
                                                     check=True).stdout.split()]
    tp.zero_grad()
    tp.backward(loss)
    g = [tp.grad(v).item() for v in tp.params()]
    assert vals[:4] == [g[0], 7.0, g[1], g[2]]
    assert vals[4:] == [g[0] + g[0], g[1] + g[1], g[2] + g[2]]


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_nvcc_compiles_every_swarm_function_without_contraction(tmp_path):
    """The emitted files as a compute_iterate worker builds them: its swarm_g_add (an atomic
    add), then one kernel per function so nvcc generates every function's code."""
    cases = swarm_cases()
    parts = []
    for fname, tp, loss, params, binds, has_v, *_ in cases:
        parts.append(emit_cuda(tp, loss, abi="swarm", params=params, binds=binds, name=fname,
                               has_v=has_v))
    parts.append("__device__ void swarm_g_add(double* g, long long j, double val)\n"
                 "{ atomicAdd(&g[j], val); }")
    for fname, _, _, _, _, has_v, *_ in cases:
        call = f"{fname}(x, in[x], g, p)" if has_v else f"{fname}(x, g, p)"
        parts.append(f'extern "C" __global__ void k_{fname}(const double *in, double *g, '
                     f"const double *p, long long n)\n"
                     f"{{ long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; "
                     f"if (x < n) {call}; }}")
    funcs = nvcc_functions(tmp_path, parts)
    assert sum(n.startswith("k_sw") for n in funcs) == N_SWARM
    assert sum(bool(re.search(r"\b(?:add|mul|div)\.rn\.f64", b)) for b in funcs.values()) \
        >= N_SWARM // 2                                 # the arithmetic is there to check
    assert_not_contracted(funcs)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_nvcc_accepts_the_emitted_logistic_file_alone(tmp_path):
    sample = ROOT / "samples" / "logistic.msgpack"
    cu = tmp_path / "grad.cu"
    res = CliRunner().invoke(cli_main, ["emit-cuda", str(sample), "--abi", "swarm",
                                        "--bind", "x0=(double)x", "--bind", "y=v",
                                        "-o", str(cu)])
    assert res.exit_code == 0, res.output
    assert SWARM_SIGNATURE + "\n{" in cu.read_text()
    proc = subprocess.run([NVCC, "-c", "-arch=sm_90", "-o", str(tmp_path / "grad.o"), str(cu)],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr[:3000]


# the CLI: options and one-line errors

def _swarm_tape_file(tmp_path):
    from gradtool.tapefile import save
    tp, loss, _ = _swarm_tape()
    path = tmp_path / "swarm.msgpack"
    save(tp, path, loss=loss)
    return path, tp, loss


def test_cli_swarm_matches_the_library(tmp_path):
    path, tp, loss = _swarm_tape_file(tmp_path)
    args = ["--params", "u,w0", "--bind", "y=v", "--name", "f", "--x-name", "i",
            "--v-name", "val", "--g-add", "acc"]
    res = CliRunner().invoke(cli_main, ["emit-cuda", str(path), "--abi", "swarm", *args[:4]])
    assert res.exit_code == 0, res.output
    assert res.stdout == emit_cuda(tp, loss, abi="swarm", params=["u", "w0"], binds={"y": "v"},
                                   source=str(path))
    res = CliRunner().invoke(cli_main, ["emit-cuda", str(path), "--abi", "swarm", *args,
                                        "--no-v", "--bind", "x0=(double)i"])
    assert res.exit_code == 0, res.output
    assert "__device__ void f(long long i, double* g, const double* p)" in res.stdout


@pytest.mark.parametrize("args,pattern", [
    (["--abi", "swarm", "--params", "w0,nosuch"], r"--params nosuch: no param named 'nosuch'"),
    (["--abi", "swarm", "--params", "w0,u,w0"], r"--params w0: param node 0 is named twice"),
    (["--abi", "swarm", "--params", "w0,node0"], r"--params node0: param node 0 is named twice"),
    (["--abi", "swarm", "--params", "x0"], r"--params x0: node 3 is a const, not a param"),
    (["--abi", "swarm", "--params", "node99"], r"--params node99: no node 99"),
    (["--params", ""], r"--params : no param named ''"),
    (["--abi", "swarm", "--bind", "nosuch=v"], r"--bind nosuch: no const named 'nosuch'"),
    (["--abi", "swarm", "--bind", "w0=v"], r"--bind w0: node 0 is a param"),
    (["--abi", "nosuch"], r"Invalid value for '--abi': 'nosuch' is not one of"),
    (["--x-name", "i"], r"--x-name applies to --abi swarm only"),
    (["--no-v"], r"--no-v applies to --abi swarm only"),
    (["--abi", "swarm", "--kernel"], r"--kernel applies to --abi gradtool only"),
    (["--abi", "swarm", "--x-name", "v"], r"v parameter name 'v' is not a usable C identifier"),
    (["--abi", "swarm", "--g-add", "p"], r"accumulator name 'p' is not a usable C identifier"),
    (["--abi", "swarm", "--name", "x"], r"function name 'x' is not a usable C identifier"),
])
def test_cli_swarm_errors_exit_2_with_one_line(tmp_path, args, pattern):
    path, _, _ = _swarm_tape_file(tmp_path)
    res = CliRunner().invoke(cli_main, ["emit-cuda", str(path)] + args)
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1 and re.search(pattern, res.stderr), \
        res.stderr


def test_cli_swarm_scope_errors_exit_2_naming_the_node(tmp_path):
    from gradtool.tapefile import save
    sample = ROOT / "samples" / "mlp_regression.msgpack"
    res = CliRunner().invoke(cli_main, ["emit-cuda", str(sample), "--abi", "swarm"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert re.search(r"node \d+ \(\w+\) has shape \[[\d,]+\]", res.stderr), res.stderr
    tp, out = _one_element_tape("softmax")
    save(tp, tmp_path / "s.msgpack", loss=out)
    res = CliRunner().invoke(cli_main, ["emit-cuda", str(tmp_path / "s.msgpack"), "--abi",
                                        "swarm"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert f"node {out.id}: op 'softmax' has no scalar C form" in res.stderr


def test_library_rejects_unknown_abis_and_options():
    tp, loss, _ = _swarm_tape()
    with pytest.raises(EmitError, match="unknown ABI 'cuda'"):
        emit_cuda(tp, loss, abi="cuda")
    with pytest.raises(EmitError, match="option 'kernel' does not apply to the swarm ABI"):
        emit_cuda(tp, loss, abi="swarm", kernel=True)
    with pytest.raises(EmitError, match="option 'has_v' does not apply to the gradtool ABI"):
        emit_cuda(tp, loss, has_v=False)
    with pytest.raises(EmitError, match="--params: expected a list"):
        emit_cuda(tp, loss, params="w0")


# --params in the gradtool ABI, and `gradtool backward --data`

@needs_cc
def test_gradtool_abi_params_subset_bit_exact(tmp_path):
    rng = np.random.default_rng(99)
    sources, runs, refs = [], [], {}
    for k in range(20):
        tp, loss = H.random_scalar_tape(rng, n_ops=30, n_params=4)
        params, _ = H.random_plan(tp, rng)
        sources.append(emit_cuda(tp, loss, params=params, name=f"sub{k}"))
        lay = layout(tp, loss, None, params)
        runs.append((f"sub{k}", tp, lay))
        refs[f"sub{k}"] = (tp, lay, reference(tp, loss, lay))
    out = run_c(tmp_path, "sub", H.harness_program(sources, runs))
    bad = _mismatches(H.parse_output(out), refs, "sub")
    assert not bad, bad[:5]
    assert sum(len(lay.params) < len(tp.params()) for tp, lay, _ in refs.values()) >= 5


def test_backward_data_sums_examples_in_order(tmp_path):
    sample = ROOT / "samples" / "logistic.msgpack"
    x0 = np.array([1.0, -2.0, 0.5, 3.0])
    y = np.array([0.0, 1.0, 1.0, 0.25])
    data = tmp_path / "d.npz"
    np.savez(data, x0=x0, x1=np.full(4, -2.0), y=y)
    res = CliRunner().invoke(cli_main, ["backward", str(sample), "--data", str(data), "--json",
                                        "--hex"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["examples"] == 4 and got["batches"] == 4
    # the same sums by hand: one plain backward per example, added in order from 0.0
    tf = gt.load(sample)
    acc, total = np.zeros(3), 0.0
    for k in range(4):
        for name, col in (("x0", x0), ("y", y)):
            tf.tape.set_value(tf.tape.var(name), [col[k]])
        tf.tape.forward()
        tf.tape.zero_grad()
        tf.tape.backward(tf.loss)
        total = total + tf.tape.values[tf.loss.id].item()
        acc = acc + np.array([tf.tape.grad(p).item() for p in tf.tape.params()])
    assert float.fromhex(got["loss"]) == total
    assert [float.fromhex(p["grad"][0]) for p in got["params"]] == acc.tolist()


def test_backward_data_errors_exit_2(tmp_path):
    sample = ROOT / "samples" / "logistic.msgpack"
    np.savez(tmp_path / "d.npz", x0=np.ones(3), y=np.ones(3))          # no x1
    res = CliRunner().invoke(cli_main, ["backward", str(sample), "--data",
                                        str(tmp_path / "d.npz")])
    assert res.exit_code == 2 and "no array 'x1'" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


# the oracle in swarm mode

@needs_cc
def test_swarm_oracle_passes_on_the_sample_and_random_plans(tmp_path):
    sample = ROOT / "samples" / "logistic.msgpack"
    res = _oracle("--swarm", "--bind", "x0=(double)x", "--bind", "y=v", sample,
                  env={"NVCC": "none"})
    assert res.returncode == 0, res.stderr + res.stdout
    assert "bit-identical to the tape (--bind x0=(double)x --bind y=v" in res.stdout
    from gradtool.tapefile import save
    paths = []
    for seed in (1, 2):
        tp, loss = H.random_scalar_tape(np.random.default_rng(seed), n_ops=30,
                                        feed_data=True)
        paths.append(tmp_path / f"r{seed}.msgpack")
        save(tp, paths[-1], loss=loss)
    res = _oracle("--swarm", "--random-plan", "-n", "16", *paths, env={"NVCC": "none"})
    assert res.returncode == 0, res.stderr + res.stdout
    assert "2 tape(s) OK" in res.stdout and res.stdout.count("--params") == 2


@needs_cc
def test_swarm_oracle_exit_1_names_the_differing_sum(tmp_path):
    sample = ROOT / "samples" / "logistic.msgpack"
    res = _oracle("--swarm", "--params", "w1,b", "--bind", "y=v", sample,
                  env={"GRADTOOL": _one_ulp_off_gradtool(tmp_path, 2), "NVCC": "none"})
    assert res.returncode == 1, res.stderr + res.stdout
    assert "gradient sum of p[1] (node 2, b) over 64 examples differs" in res.stderr


@needs_cc
def test_swarm_oracle_exit_2_on_bad_input(tmp_path):
    sample = ROOT / "samples" / "logistic.msgpack"
    res = _oracle("--swarm", "--bind", "y=2.0*v", sample, env={"NVCC": "none"})
    assert res.returncode == 2 and "the oracle evaluates only v, x" in res.stderr
    res = _oracle("--bind", "y=v", sample, env={"NVCC": "none"})
    assert res.returncode == 2 and "need --swarm" in res.stderr
    res = _oracle("--swarm", "--params", "nosuch", sample, env={"NVCC": "none"})
    assert res.returncode == 2 and "no param named 'nosuch'" in res.stderr
