"""Emitted C and CUDA against the tape (test_emit.py, test_emit_swarm.py,
test_device_f32.py): the C compiler and nvcc where installed, the tape's own loss and
gradient bits for an emitted function (:func:`reference`), one C program compiled and
run (:func:`run_c`), the functions whose bits differ (:func:`mismatches`), nvcc's PTX
functions and the contraction check (:func:`nvcc_functions`,
:func:`assert_not_contracted`), the oracle script (:func:`run_oracle`) and a `gradtool`
one ulp off to fail it, and a one-element tape of any op (:func:`one_element_tape`).
Tests import these through tests/support.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import gradtool as gt

from support_tapes import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import emitc_harness as H  # noqa: E402

__all__ = ["CC", "NVCC", "needs_cc", "H", "one_element_tape", "reference", "run_c",
           "mismatches", "CONTROL", "ptx_functions", "nvcc_functions",
           "assert_not_contracted", "ORACLE", "run_oracle", "one_ulp_off_gradtool"]

CC = shutil.which("cc") or shutil.which("gcc")
NVCC = shutil.which("nvcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler")


def one_element_tape(op):
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


def mismatches(got, refs, prefix):
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


CONTROL = """
/* control: the same multiply-add WITHOUT the GT_ macros, which nvcc contracts */
extern "C" __global__ void gt_test_control(const double *a, double *out)
{
    out[0] = a[0] * a[1] + a[2];
}
"""


def ptx_functions(ptx: str) -> dict:
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
    funcs = ptx_functions(next(work.glob("*.ptx")).read_text())
    assert re.search(r"fma\.rn\.f64", funcs.pop("gt_test_control"))
    return funcs


def assert_not_contracted(funcs: dict) -> None:
    for name, body in funcs.items():
        assert not re.search(r"\bfma\.", body), f"{name}: nvcc fused a multiply-add"
        # an add/sub/mul without .rn is one ptxas may still contract (an atomic's
        # atom.global.add.f64 is not)
        assert not re.search(r"(?<![\w.])(?:add|sub|mul)\.f64\b", body), \
            f"{name}: contractable op"


ORACLE = ROOT / "scripts" / "emitc_oracle.sh"


def run_oracle(*tapes, env=None):
    return subprocess.run(["bash", str(ORACLE), *map(str, tapes)], capture_output=True,
                          text=True, env={**os.environ, **(env or {})})


def one_ulp_off_gradtool(tmp_path, k):
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
