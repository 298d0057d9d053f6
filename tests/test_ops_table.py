"""Every op of the table, through every layer: parametrized over gradtool.ops.OPS.

A new op is covered here by its table entry alone:
* the numpy reference vs the host backend (all three kernel variants), bit for bit;
* the emitter vs the tape, bit for bit, for every op with a scalar form;
* finite differences against backward;
* the file round trip (identical bytes, identical value bits);
* hostile files: wrong arity, missing and foreign attributes, a stray scalar operand.
"""

import shutil

import msgpack
import numpy as np
import pytest

import gradtool as gt
from conftest import assert_bits_equal, require_c_compiler
from gradtool.ops import OPS
from gradtool.tapefile import dumps, load
from support import OPTIONAL_CASES, TABLE_OPS, assert_emitted_c_equals_tape, op_tape

SCALAR_TABLE_OPS = [n for n in TABLE_OPS if OPS[n].rules is not None]


def _rng(name):
    return np.random.default_rng(sum(map(ord, name)))


@pytest.mark.parametrize("variant", ["tiled", "per-thread", "per-thread-reversed"])
@pytest.mark.parametrize("name", TABLE_OPS)
def test_numpy_reference_equals_host_backend(name, variant):
    require_c_compiler()
    from gradtool.device import capture

    tp, out, loss = op_tape(name, _rng(name))
    tp.backward(loss)
    replay = capture(tp, loss, "host", host_kernels=variant)
    replay.forward()
    replay.backward()
    assert_bits_equal(replay.value(out), tp.value(out), f"{name} forward ({variant})")
    for p in tp.params():
        assert_bits_equal(replay.grad(p), tp.grad(p), f"{name} grad of {p.id} ({variant})")


OPTIONAL = [(name, k) for name, cases in OPTIONAL_CASES.items() for k in range(len(cases))]


@pytest.mark.parametrize("variant", ["tiled", "per-thread", "per-thread-reversed"])
@pytest.mark.parametrize("name, k", OPTIONAL)
def test_optional_attributes_numpy_reference_equals_host_backend(name, k, variant):
    require_c_compiler()
    from gradtool.device import capture

    attrs = OPTIONAL_CASES[name][k]
    tp, out, loss = op_tape(name, _rng(name), attrs=attrs)
    tp.backward(loss)
    replay = capture(tp, loss, "host", host_kernels=variant)
    replay.forward()
    replay.backward()
    assert_bits_equal(replay.value(out), tp.value(out), f"{name} {attrs} ({variant})")
    for p in tp.params():
        assert_bits_equal(replay.grad(p), tp.grad(p), f"{name} {attrs} grad ({variant})")
    raw = dumps(tp, loss=loss, outputs={"out": out}, values=True)
    back = load(raw)
    assert dumps(back.tape, loss=back.loss, outputs=back.outputs, values=True) == raw


@pytest.mark.parametrize("name", TABLE_OPS)
def test_fd_check(name):
    tp, _, loss = op_tape(name, _rng(name))
    report = gt.fd_check(tp, loss, eps=1e-6, rtol=1e-5, atol=1e-7)
    assert report.passed, [p for p in report.params if not p.passed]


@pytest.mark.parametrize("name", TABLE_OPS)
def test_file_round_trip(name):
    tp, out, loss = op_tape(name, _rng(name))
    raw = dumps(tp, loss=loss, outputs={"out": out}, values=True)
    back = load(raw)
    assert dumps(back.tape, loss=back.loss, outputs=back.outputs, values=True) == raw
    assert_bits_equal(back.tape.value(back.outputs["out"]), tp.value(out), name)
    assert back.tape.nodes[out.id].aux == tp.nodes[out.id].aux


def _hostile(name):
    """(description, mutated node, expected field) for one op's node in a valid file."""
    spec = OPS[name]
    tp, out, loss = op_tape(name, _rng(name))
    doc = msgpack.unpackb(dumps(tp, loss=loss))
    node = doc["nodes"][out.id]
    cases = []
    if spec.arity == 1:
        cases.append(("a second input", dict(node, b=0), "b"))
    else:
        cases.append(("a missing second input", dict(node, b=-1), "b"))
    for at in spec.attrs:
        if at.file_required:
            cases.append((f"no {at.name}", {k: v for k, v in node.items() if k != at.name},
                          at.name))
    foreign = {"axis": 0, "keepdims": True, "starts": [0], "stops": [1], "steps": [1],
               "dims": [0]}
    for key, value in foreign.items():
        if key not in {at.name for at in spec.attrs}:
            cases.append((f"a foreign {key}", dict(node, **{key: value}), key))
    if not spec.scalar_operand:
        cases.append(("a stray s", dict(node, s=1.5), "s"))
    return doc, out.id, cases


@pytest.mark.parametrize("name", TABLE_OPS)
def test_hostile_arity_and_attributes_name_the_node_and_field(name):
    doc, i, cases = _hostile(name)
    for what, node, field in cases:
        bad = dict(doc, nodes=doc["nodes"][:i] + [node] + doc["nodes"][i + 1:])
        with pytest.raises(gt.TapeFileError) as err:
            load(msgpack.packb(bad), name="h.msgpack")
        assert err.value.node == i, f"{name}, {what}: {err.value}"
        assert err.value.field is not None and err.value.field.startswith(field), \
            f"{name}, {what}: {err.value}"


CC = shutil.which("cc") or shutil.which("gcc")


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_emitter_equals_tape_for_every_scalar_op(tmp_path):
    cases = []
    for name in SCALAR_TABLE_OPS:
        for k in range(4):
            tp, _, loss = op_tape(name, np.random.default_rng(k), scalar=True)
            cases.append((f"op_{name}_{k}", tp, loss))
    assert_emitted_c_equals_tape(tmp_path, cases, CC)
