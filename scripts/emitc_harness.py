#!/usr/bin/env python3
"""Helpers of the emit-cuda oracle (scripts/emitc_oracle.sh) and its tests.

    emitc_harness.py harness TAPE GRAD_CU        C main() for one emitted file -> stdout
    emitc_harness.py compare TAPE C_OUT REF_JSON  exit 0 if every bit agrees, 1 naming
                                                  the first difference, 2 on bad input
    emitc_harness.py random-tapes DIR [-n N] [--seed S] [--ops K] [--swarm]
                                                  write N random scalar tapes, print paths
                                                  (--swarm: named consts that change
                                                  the gradients, for swarm datasets)

The swarm ABI (`emitc_oracle.sh --swarm`):

    emitc_harness.py swarm-plan TAPE [--seed S]   a random --params subset and --bind
                                                  choice for TAPE, one argument a line
    emitc_harness.py swarm-data TAPE DRIVER_IN DATA_NPZ [-n N] [--seed S] [EMIT OPTIONS]
                                                  a dataset of N (x, v) pairs: the C
                                                  driver's input and the same examples
                                                  as the tape's input slots
    emitc_harness.py swarm-compare TAPE C_OUT REF_JSON [EMIT OPTIONS]
                                                  the driver's sums vs `gradtool backward
                                                  --data --json --hex`, every bit

The harness evaluates the emitted function at the tape's recorded leaf
values (written as exact hex-float literals) and prints the loss and every
gradient as raw IEEE-754 bits, one per line:

    <function> loss <16 hex digits>
    <function> p <j> <16 hex digits>

Bits compare exactly, except that any NaN equals any NaN: NaN payloads and
signs are not part of the promise (a GPU's default NaN differs from x86's).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
from typing import NoReturn

import numpy as np

from gradtool.emit import layout
from gradtool.emit.render import SCALAR_OPS, c_double
from gradtool.ops import OPS
from gradtool.tape import Tape

# ── the harness ──────────────────────────────────────────────────────────────


def harness_cases(cases) -> str:
    """Statements of main() evaluating each (function, tape, layout) case."""
    out = []
    for fname, tape, lay in cases:
        # an f32 tape's function takes floats (its values are exact as double literals)
        ty = "float" if tape.values[lay.loss].dtype == np.float32 else "double"
        p = ", ".join(c_double(float(tape.values[i].item())) for i in lay.params) or "0.0"
        x = ", ".join(c_double(float(tape.values[i].item())) for i in lay.data) or "0.0"
        out += [
            "    {",
            f"        const {ty} p[] = {{{p}}};",
            f"        const {ty} x[] = {{{x}}};",
            f"        {ty} g[{max(len(lay.params), 1)}] = {{0.0}};",
            f"        {ty} loss = {fname}(p, x, g);",
            f'        gt_print("{fname}", "loss", -1, loss);',
            f"        for (int j = 0; j < {len(lay.params)}; ++j) gt_print(\"{fname}\", \"p\", j, g[j]);",
            "    }",
        ]
    return "\n".join(out)


HARNESS_HEAD = r"""
#include <stdio.h>
#include <string.h>

static void gt_print(const char *fn, const char *what, int j, double v)
{
    unsigned long long u;
    memcpy(&u, &v, sizeof u);
    if (j < 0) printf("%s %s %016llx\n", fn, what, u);
    else printf("%s %s %d %016llx\n", fn, what, j, u);
}
"""


def harness_program(body_sources, cases) -> str:
    """A whole C program: the emitted sources (text or #include lines), then main()."""
    return "\n".join(list(body_sources) + [HARNESS_HEAD, "int main(void)", "{",
                                            harness_cases(cases), "    return 0;", "}", ""])


def parse_output(text: str) -> dict:
    """{function: {"loss": bits, "p": {j: bits}}} from the harness's stdout."""
    results = {}
    for line in text.splitlines():
        parts = line.split()
        entry = results.setdefault(parts[0], {"loss": None, "p": {}})
        if parts[1] == "loss":
            entry["loss"] = int(parts[2], 16)
        else:
            entry["p"][int(parts[2])] = int(parts[3], 16)
    return results


def to_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", float(x)))[0]


def from_bits(u: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", u))[0]


def same_bits(a: int, b: int) -> bool:
    """Identical bit patterns, or both NaN (payloads are not promised)."""
    return a == b or (math.isnan(from_bits(a)) and math.isnan(from_bits(b)))


def describe(u: int) -> str:
    return f"{from_bits(u).hex()} (0x{u:016x})"


# ── random scalar tapes ──────────────────────────────────────────────────────


def random_scalar_tape(rng: np.random.Generator, n_ops: int = 40, n_params: int = 3,
                       n_consts: int = 3, connect: bool = False, feed_data: bool = False):
    """A random scalar tape (every node [1]) and its loss, eagerly recorded.

    Inputs are picked knowing their values, so log/sqrt see positive numbers,
    division sees denominators away from 0 and exp stays finite: the edge
    values are tested on purpose elsewhere, and here NaN/inf would hide
    everything downstream.  Binary ops sometimes read one node twice
    (fan-out: x*x, x-x), some ops read only constants (branches that get no
    backward code), and leaves are registered in a shuffled order.  With
    ``connect`` every op node no other node reads is added into the loss, so
    the whole graph is the loss's ancestry (the benchmark's setting).  With
    ``feed_data`` (the swarm tests) the first const is always named, and every
    named const also enters the loss as ``c * h`` or ``tanh(c * h)`` with h a
    node that depends on a param, so that feeding examples into the named
    consts changes the params' gradients from one example to the next.
    """
    tp = Tape()
    kinds = ["param"] * n_params + ["const"] * n_consts
    rng.shuffle(kinds)
    pool = []
    for k, kind in enumerate(kinds):
        value = np.array([float(rng.uniform(-2.0, 2.0))])
        if kind == "param":
            pool.append(tp.param(value, name=f"w{k}"))
        else:
            named = rng.random() < 0.6 or (feed_data and not tp.input_slots())
            pool.append(tp.const(value, name=f"x{k}" if named else None))

    def val(v):
        return tp.values[v.id].item()

    def pick(ok=lambda x: abs(x) < 100.0, const_only=False):
        def fits(v):
            return ok(val(v)) and (not const_only or not tp.requires[v.id])
        for _ in range(24):                    # mostly recent nodes: deep chains
            k = len(pool) - 1 - int(rng.integers(min(6, len(pool)))) if rng.random() < 0.6 \
                else int(rng.integers(len(pool)))
            if fits(pool[k]):
                return pool[k]
        cands = [v for v in pool[-200:] if fits(v)]
        return cands[int(rng.integers(len(cands)))] if cands else None

    def scalar():
        return float(rng.choice([rng.normal(), rng.uniform(-3, 3), 0.5, -1.0, 2.0, 0.0, 1e-3]))

    unary_domain = {"log": lambda x: 1e-3 < x < 1e6, "sqrt": lambda x: 1e-3 < x < 1e6,
                    "exp": lambda x: abs(x) < 20.0, "expm1": lambda x: abs(x) < 20.0,
                    "log1p": lambda x: -0.9 < x < 1e6, "rsqrt": lambda x: 1e-3 < x < 1e6,
                    "pows": lambda x: 1e-2 < x < 10.0}
    for _ in range(n_ops):
        op = str(rng.choice(SCALAR_OPS))
        const_only = rng.random() < 0.15
        if OPS[op].arity == 2:
            a = pick(const_only=const_only) or pick() or pool[-1]
            if rng.random() < 0.2:
                b = a                          # fan-out into both inputs
            elif op == "div":
                b = pick(lambda x: 0.05 < abs(x) < 100.0, const_only) or pick(
                    lambda x: 0.05 < abs(x) < 100.0)
            else:
                b = pick(const_only=const_only) or pick()
            if b is None or (op == "div" and abs(val(b)) <= 0.05):
                op, b = "mul", a
            out = getattr(tp, op)(a, b)
        else:
            ok = unary_domain.get(op, lambda x: abs(x) < 100.0)
            a = pick(ok, const_only) or pick(ok)
            if a is None:                      # no valid input: make one
                base = pick()
                a = tp.adds(tp.mul(base, base), 0.5)
                pool.append(a)
            if OPS[op].scalar_operand:
                out = getattr(tp, op)(a, scalar())
            else:
                out = getattr(tp, op)(a)
        pool.append(out)
        if rng.random() < 0.05:                # a leaf registered mid-graph
            pool.append(tp.param(np.array([float(rng.uniform(-1, 1))]), name=None)
                        if rng.random() < 0.5 else tp.const(np.array([float(rng.normal())])))
    loss = pool[-1]
    if connect:                                # every dangling node feeds the loss
        read = {i for n in tp.nodes for i in (n.a, n.b) if i >= 0}
        for v in pool[:-1]:
            if v.id not in read and tp.nodes[v.id].a >= 0:
                loss = tp.add(loss, v)
    else:
        for _ in range(int(rng.integers(0, 3))):
            loss = tp.add(loss, pick() or pool[-1])
    if feed_data:
        deps = [v for v in pool if tp.requires[v.id]]
        for c in tp.input_slots() if deps else []:
            term = tp.mul(c, deps[int(rng.integers(len(deps)))])
            loss = tp.add(loss, tp.tanh(term) if rng.random() < 0.5 else term)
    if rng.random() < 0.5:
        loss = tp.mean(loss) if rng.random() < 0.5 else tp.sum(loss)
    return tp, loss


# ── the swarm ABI ────────────────────────────────────────────────────────────

# the bind expressions the oracle can evaluate in Python as C does
BIND_FORMS = {"v": "v", "x": "x", "(double)x": "x", "(double)(x)": "x"}


def bind_form(name: str, expr: str) -> str:
    """'v' or 'x': which per-example value the C expression ``expr`` is."""
    form = BIND_FORMS.get("".join(expr.split()))
    if form is None:
        raise ValueError(f"--bind {name}={expr}: the oracle evaluates only "
                         f"{', '.join(BIND_FORMS)}")
    return form


def random_plan(tape, rng):
    """(params, binds): a random non-empty subset of the params in random order (names, or
    node<ID> for unnamed ones), and each named const bound to v or (double)x or left frozen
    (at least one bound, where there is one, so that the examples differ)."""
    params = [i for i, n in enumerate(tape.nodes) if n.op == "param"]
    rng.shuffle(params)
    chosen = params[: int(rng.integers(1, len(params) + 1))] if params else []
    specs = [tape.nodes[i].name or f"node{i}" for i in chosen]
    slots = [tape.nodes[v.id].name for v in tape.input_slots()]
    bound = [name for name in slots if rng.random() < 0.6]
    if slots and not bound:
        bound = [slots[int(rng.integers(len(slots)))]]
    binds = {name: "v" if rng.random() < 0.7 else "(double)x" for name in bound}
    return specs, binds


def swarm_examples(tape, lay, rng, n: int):
    """(xs, vs, arrays): n examples (x, v) and the same examples as input-slot arrays.

    x is a small integer (swarm's x is an index; any long long works), v varies
    within 1/8 of the recorded value of the first leaf bound to v, so that the
    examples stay near the recorded point and its domains (log, sqrt).  A slot
    bound to v or x takes that value; every other slot keeps its recorded value
    (it is frozen in the emitted code).
    """
    forms = {i: bind_form(tape.nodes[i].name, e) for i, e in lay.binds.items()}
    v_leaves = [i for i in sorted(forms) if forms[i] == "v"]
    center = tape.values[v_leaves[0]].item() if v_leaves else 1.0
    spread = rng.uniform(-0.125, 0.125, n)
    vs = center * (1.0 + spread) if center != 0.0 else spread
    xs = rng.integers(-2, 3, n)
    arrays = {}
    for v in tape.input_slots():
        form = forms.get(v.id)
        if form == "v":
            arrays[tape.nodes[v.id].name] = vs.astype(np.float64)
        elif form == "x":
            arrays[tape.nodes[v.id].name] = xs.astype(np.float64)
        else:
            arrays[tape.nodes[v.id].name] = np.full(n, tape.values[v.id].item())
    return xs, vs, arrays


def driver_input(tape, lay, xs, vs) -> str:
    """scripts/swarm_driver.c's input: K, p[j] bits, N, then x and v bits per example."""
    lines = [str(len(lay.params))]
    lines += [f"{to_bits(tape.values[i].item()):016x}" for i in lay.params]
    lines.append(str(len(xs)))
    lines += [f"{int(x)} {to_bits(v):016x}" for x, v in zip(xs, vs)]
    return "\n".join(lines) + "\n"


SWARM_ACCUMULATOR = """
void swarm_g_add(double* g, long long j, double val)
{
    g[j] = GT_ADD(g[j], val);
}
"""


def swarm_program(sources, cases) -> str:
    """One C program running many swarm functions over their datasets.

    cases: (function, tape, layout, xs, vs, has_v) each; the program defines
    swarm_g_add once and prints each function's sums as ``<function> p <j> <bits>``.
    """
    body = []
    for fname, tape, lay, xs, vs, has_v in cases:
        k = len(lay.params)
        p = ", ".join(c_double(tape.values[i].item()) for i in lay.params) or "0.0"
        call = f"{fname}(xs[i], vs[i], g, p)" if has_v else f"{fname}(xs[i], g, p)"
        body += [
            "    {",
            f"        const double p[] = {{{p}}};",
            f"        const long long xs[] = {{{', '.join(f'{int(x)}LL' for x in xs)}}};",
            f"        const double vs[] = {{{', '.join(c_double(v) for v in vs)}}};",
            f"        double g[{max(k, 1)}] = {{0.0}};",
            "        (void)vs;" if not has_v else "",
            f"        for (int i = 0; i < {len(xs)}; ++i) {call};",
            f'        for (int j = 0; j < {k}; ++j) gt_print("{fname}", "p", j, g[j]);',
            "    }",
        ]
    return "\n".join(list(sources) + [SWARM_ACCUMULATOR, HARNESS_HEAD, "int main(void)", "{",
                                       *[line for line in body if line], "    return 0;", "}",
                                       ""])


# ── commands ─────────────────────────────────────────────────────────────────


def _bad(message: str) -> NoReturn:
    print(f"emitc_harness: {message}", file=sys.stderr)
    sys.exit(2)


def _load(path):
    from gradtool.errors import GradtoolError
    from gradtool.tapefile import load
    try:
        tf = load(path)
    except (GradtoolError, OSError) as exc:
        _bad(f"{path}: {exc}")
    if tf.loss is None:
        _bad(f"{path}: the tape file names no loss")
    return tf


def cmd_harness(args) -> int:
    tf = _load(args.tape)
    lay = layout(tf.tape, tf.loss)
    include = f'#include "{os.path.abspath(args.grad_cu)}"'
    sys.stdout.write(harness_program([include], [(args.name, tf.tape, lay)]))
    return 0


def cmd_compare(args) -> int:
    tf = _load(args.tape)
    lay = layout(tf.tape, tf.loss)
    try:
        with open(args.c_out) as f:
            got = parse_output(f.read()).get(args.name)
        with open(args.ref_json) as f:
            ref = json.load(f)
        ref_loss = to_bits(float.fromhex(ref["loss"]))
        ref_grads = {int(p["id"]): p for p in ref["params"]}
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        _bad(f"{args.tape}: unreadable harness output or reference: {exc}")
    if got is None:
        _bad(f"{args.tape}: the harness printed nothing for {args.name}")
    where = f"{args.tape}"
    if not same_bits(got["loss"], ref_loss):
        print(f"emitc_oracle: {where}: loss (node {lay.loss}) differs: C {describe(got['loss'])}"
              f" vs tape {describe(ref_loss)}", file=sys.stderr)
        return 1
    for j, node in enumerate(lay.params):
        if node not in ref_grads:
            _bad(f"{where}: the reference has no gradient for param node {node}")
        want = to_bits(float.fromhex(ref_grads[node]["grad"][0]))
        have = got["p"].get(j)
        if have is None or not same_bits(have, want):
            label = tf.tape.nodes[node].name or "(unnamed)"
            shown = describe(have) if have is not None else "nothing"
            print(f"emitc_oracle: {where}: gradient of p[{j}] (node {node}, {label}) differs: "
                  f"C {shown} vs tape {describe(want)}", file=sys.stderr)
            return 1
    return 0


def _swarm_layout(tf, args):
    from gradtool.errors import GradtoolError
    binds = {}
    for item in args.bind:
        name, sep, expr = item.partition("=")
        if not sep:
            _bad(f"--bind {item!r}: expected NAME=EXPR")
        binds[name] = expr
    params = None if args.params is None else [n.strip() for n in args.params.split(",")]
    try:
        return layout(tf.tape, tf.loss, binds, params, freeze_consts=True)
    except GradtoolError as exc:
        _bad(f"{args.tape}: {exc}")


def cmd_swarm_plan(args) -> int:
    tf = _load(args.tape)
    params, binds = random_plan(tf.tape, np.random.default_rng(args.seed))
    out = ["--params", ",".join(params)] if params else []
    for name, expr in binds.items():
        out += ["--bind", f"{name}={expr}"]
    print("\n".join(out))
    return 0


def cmd_swarm_data(args) -> int:
    from gradtool.npzio import write_npz
    tf = _load(args.tape)
    lay = _swarm_layout(tf, args)
    try:
        xs, vs, arrays = swarm_examples(tf.tape, lay, np.random.default_rng(args.seed), args.n)
    except ValueError as exc:
        _bad(f"{args.tape}: {exc}")
    if not arrays:
        _bad(f"{args.tape}: the tape has no named const (input slot) to feed examples into")
    with open(args.driver_in, "w") as f:
        f.write(driver_input(tf.tape, lay, xs, vs))
    write_npz(args.data_npz, arrays)
    return 0


def cmd_swarm_compare(args) -> int:
    tf = _load(args.tape)
    lay = _swarm_layout(tf, args)
    try:
        with open(args.c_out) as f:
            got = {int(j): int(bits, 16) for _, j, bits in (line.split() for line in f)}
        with open(args.ref_json) as f:
            ref = json.load(f)
        ref_grads = {int(p["id"]): to_bits(float.fromhex(p["grad"][0])) for p in ref["params"]}
        examples = int(ref["examples"])
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        _bad(f"{args.tape}: unreadable driver output or reference: {exc}")
    if sorted(got) != list(range(len(lay.params))):
        print(f"emitc_oracle: {args.tape}: the driver printed slots {sorted(got)}, expected "
              f"0..{len(lay.params) - 1}", file=sys.stderr)
        return 1
    for j, node in enumerate(lay.params):
        if not same_bits(got[j], ref_grads[node]):
            label = tf.tape.nodes[node].name or "(unnamed)"
            print(f"emitc_oracle: {args.tape}: gradient sum of p[{j}] (node {node}, {label}) "
                  f"over {examples} examples differs: C {describe(got[j])} vs tape "
                  f"{describe(ref_grads[node])}", file=sys.stderr)
            return 1
    return 0


def cmd_random_tapes(args) -> int:
    from gradtool.tapefile import save
    os.makedirs(args.dir, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    for k in range(args.n):
        tp, loss = random_scalar_tape(rng, n_ops=args.ops, feed_data=args.swarm)
        path = os.path.join(args.dir, f"random_{args.seed}_{k:03d}.msgpack")
        save(tp, path, loss=loss, meta={"generator": "emitc_harness random-tapes",
                                        "seed": args.seed, "index": k})
        print(path)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("harness", help="C main() for one emitted file")
    h.add_argument("tape")
    h.add_argument("grad_cu")
    h.add_argument("--name", default="gradtool_grad")
    c = sub.add_parser("compare", help="compare harness output with `gradtool backward --json --hex`")
    c.add_argument("tape")
    c.add_argument("c_out")
    c.add_argument("ref_json")
    c.add_argument("--name", default="gradtool_grad")
    r = sub.add_parser("random-tapes", help="write random scalar tapes")
    r.add_argument("dir")
    r.add_argument("-n", type=int, default=20)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--ops", type=int, default=40)
    r.add_argument("--swarm", action="store_true",
                   help="named consts that feed the params' gradients (see feed_data)")
    sp = sub.add_parser("swarm-plan", help="random --params/--bind arguments for a tape")
    sp.add_argument("tape")
    sp.add_argument("--seed", type=int, default=0)

    def emit_options(parser):
        parser.add_argument("--params")
        parser.add_argument("--bind", action="append", default=[])
        parser.add_argument("--no-v", action="store_true")
    sd = sub.add_parser("swarm-data", help="a dataset for the swarm driver and the tape")
    sd.add_argument("tape")
    sd.add_argument("driver_in")
    sd.add_argument("data_npz")
    sd.add_argument("-n", type=int, default=64)
    sd.add_argument("--seed", type=int, default=0)
    emit_options(sd)
    sc = sub.add_parser("swarm-compare", help="compare the driver's sums with the tape's")
    sc.add_argument("tape")
    sc.add_argument("c_out")
    sc.add_argument("ref_json")
    emit_options(sc)
    args = ap.parse_args(argv)
    return {"harness": cmd_harness, "compare": cmd_compare, "random-tapes": cmd_random_tapes,
            "swarm-plan": cmd_swarm_plan, "swarm-data": cmd_swarm_data,
            "swarm-compare": cmd_swarm_compare}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
