"""emit-cuda's swarm ABI: compute_iterate's ``grad(x, v, g, p)``.

Random tapes with random parameter subsets and bindings to v and (double)x, each
summed over its dataset in C and compared bit for bit with gradtool's gradient sum;
the signature, the frozen consts as hex literals, which accumulator calls exist, the
names and the accumulator's form; nvcc without contraction; the command line and
the oracle script in swarm mode.  The helpers are tests/support_emit.py.
"""

from __future__ import annotations

import json
import math
import re
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner

import gradtool as gt
from gradtool.cli import main as cli_main
from gradtool.emit import EmitError, emit_cuda, layout
from gradtool.emit.render import c_double
from gradtool.train.data import Dataset, gradient_sum, input_slots
from support import (CC, NVCC, H, ROOT, assert_not_contracted, mismatches, needs_cc,
                     nvcc_functions, one_element_tape, one_ulp_off_gradtool, reference,
                     run_c, run_oracle)

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
    tp, out = one_element_tape("softmax")
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
    bad = mismatches(H.parse_output(out), refs, "sub")
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
    res = run_oracle("--swarm", "--bind", "x0=(double)x", "--bind", "y=v", sample,
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
    res = run_oracle("--swarm", "--random-plan", "-n", "16", *paths, env={"NVCC": "none"})
    assert res.returncode == 0, res.stderr + res.stdout
    assert "2 tape(s) OK" in res.stdout and res.stdout.count("--params") == 2


@needs_cc
def test_swarm_oracle_exit_1_names_the_differing_sum(tmp_path):
    sample = ROOT / "samples" / "logistic.msgpack"
    res = run_oracle("--swarm", "--params", "w1,b", "--bind", "y=v", sample,
                  env={"GRADTOOL": one_ulp_off_gradtool(tmp_path, 2), "NVCC": "none"})
    assert res.returncode == 1, res.stderr + res.stdout
    assert "gradient sum of p[1] (node 2, b) over 64 examples differs" in res.stderr


@needs_cc
def test_swarm_oracle_exit_2_on_bad_input(tmp_path):
    sample = ROOT / "samples" / "logistic.msgpack"
    res = run_oracle("--swarm", "--bind", "y=2.0*v", sample, env={"NVCC": "none"})
    assert res.returncode == 2 and "the oracle evaluates only v, x" in res.stderr
    res = run_oracle("--bind", "y=v", sample, env={"NVCC": "none"})
    assert res.returncode == 2 and "need --swarm" in res.stderr
    res = run_oracle("--swarm", "--params", "nosuch", sample, env={"NVCC": "none"})
    assert res.returncode == 2 and "no param named 'nosuch'" in res.stderr
