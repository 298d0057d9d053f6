"""Shared test support: sample paths, per-op inputs from the op table, one-op tapes.

Tests that need these import them from here (never from another test module).
Inputs come from each op's table entry: its kind says what shapes and
attributes to build, its ``domain`` where its rule is smooth, so a new
elementwise op is covered by every table-driven test without touching this
file; a new *kind* of op needs one builder in :func:`op_case`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from click.testing import CliRunner

import gradtool as gt
from gradtool.cli import main
from gradtool.ops import OPS

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
SAMPLE_TAPES = sorted(SAMPLES.rglob("*.msgpack"))
DIGITS = SAMPLES / "digits_mlp.msgpack"
DIGITS_DATA = SAMPLES / "digits.npz"

TABLE_OPS = [name for name, spec in OPS.items() if spec.kind != "leaf"]


def draw(spec, rng: np.random.Generator, shape) -> np.ndarray:
    """Inputs in the op's smooth domain, away from kinks (relu at 0) and steep regions."""
    if spec.domain == "positive":
        return rng.uniform(0.5, 2.0, shape)
    x = rng.uniform(0.2, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    return x


def op_case(name: str, rng: np.random.Generator, *, scalar: bool = False):
    """(inputs, s, attrs): arrays for the op's inputs, its scalar operand, its attributes.

    ``scalar=True`` gives one-element inputs (the emitter's scope).
    """
    spec = OPS[name]
    s = float(rng.uniform(0.5, 1.5)) if spec.scalar_operand else 0.0
    if scalar:
        return [draw(spec, rng, (1,)) for _ in range(spec.arity)], s, {}
    kind = spec.kind
    if kind == "unary":
        return [draw(spec, rng, (3, 4))], s, {}
    if kind == "binary":               # a broadcast on each side
        return [draw(spec, rng, (3, 1, 4)), draw(spec, rng, (2, 1))], s, {}
    if kind in ("reduce", "max"):
        return [draw(spec, rng, (3, 4))], s, {"axis": 1, "keepdims": True}
    if kind == "matmul":
        return [draw(spec, rng, (3, 5)), draw(spec, rng, (5, 2))], s, {}
    if kind == "bmm":
        return [draw(spec, rng, (2, 3, 4)), draw(spec, rng, (2, 4, 3))], s, {}
    if kind == "transpose":
        return [draw(spec, rng, (2, 3, 4))], s, {}
    if kind == "reshape":
        return [draw(spec, rng, (3, 4))], s, {"shape": [2, 6]}
    if kind == "softmax":
        return [draw(spec, rng, (3, 4))], s, {"axis": 0}
    if kind == "slice":
        return [draw(spec, rng, (4, 5))], s, {"starts": [1, 0], "stops": [3, 4]}
    if kind == "concat":
        return [draw(spec, rng, (2, 3)), draw(spec, rng, (2, 2))], s, {"axis": 1}
    if kind == "take":                 # repeated ids: rows whose gradient sums positions
        return [draw(spec, rng, (5, 3)), np.array([[0, 3, 3, 1], [4, 0, 3, 3]])], s, {}
    if kind == "take_along":
        return [draw(spec, rng, (3, 4)), np.array([[1, 1], [3, 0], [0, 2]])], s, {"axis": 1}
    raise NotImplementedError(f"tests/support.py: no inputs for op kind {kind!r} (op {name})")


def op_tape(name: str, rng: np.random.Generator, *, scalar: bool = False):
    """A tape whose params feed ONE node of op ``name`` (ids inputs are i64 consts); the loss
    weighs its output with a random const so every output element gets its own gradient.
    -> (tape, out, loss)."""
    inputs, s, attrs = op_case(name, rng, scalar=scalar)
    tp = gt.Tape()
    leaves = [tp.const(x, name=f"in{k}", dtype="i64") if "ab"[k] in OPS[name].int_inputs
              else tp.param(x, name=f"in{k}") for k, x in enumerate(inputs)]
    out = tp.record(name, *leaves, s=s, attrs=attrs)
    if scalar:
        w = tp.const(rng.uniform(0.5, 1.5, (1,)), name="w")
        return tp, out, tp.mul(out, w)
    w = tp.const(rng.uniform(0.5, 1.5, tp.value(out).shape))
    return tp, out, tp.sum(tp.mul(out, w))


def run(*args, input=None):
    """The gradtool command line, in process: ``run("inspect", path)``."""
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def assert_one_line_error(result, status, *needles):
    """Exit ``status`` with ONE stderr line ``gradtool: ...`` holding every needle."""
    assert result.exit_code == status, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradtool: "), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
