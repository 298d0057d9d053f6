"""The tape file format v1: round trips, an independent writer, the schema, the limits."""

import io
from pathlib import Path

import jsonschema
import msgpack
import numpy as np
import pytest

from conftest import assert_bits_equal
from gradtool.errors import TapeError, TapeFileError
from gradtool.ops import OPS
from gradtool.tape import Tape
from gradtool.tapefile import FORMAT, VERSION, Limits, dumps, load, save
from gradtool.tapefile.checks import schema
from support import all_ops_tape, mlp_tape, numpy_mlp_backprop, write_independent_mlp

ROOT = Path(__file__).resolve().parent.parent


# ── tapes used by several tests ────────────────────────────────────────────


def assert_same_tape(t1: Tape, t2: Tape):
    assert len(t1.nodes) == len(t2.nodes)
    for i, (n1, n2) in enumerate(zip(t1.nodes, t2.nodes, strict=True)):
        assert (n1.op, n1.a, n1.b, n1.name, n1.aux) == (n2.op, n2.a, n2.b, n2.name, n2.aux), i
        assert_bits_equal(np.array([n1.s, n1.l2]), np.array([n2.s, n2.l2]), f"node {i} s/l2")
        assert_bits_equal(t2.values[i], t1.values[i], f"node {i} value")
    assert t1.requires == t2.requires


# ── round trips ────────────────────────────────────────────────────────────

def test_round_trip_all_ops_identical_bytes_and_bits():
    tp, loss, outputs = all_ops_tape()
    assert {n.op for n in tp.nodes} == set(OPS), "the tape must exercise every op"
    meta = {"producer": "test", "nested": {"list": [1, 2.5, None, True, b"\x00"]}}
    first = dumps(tp, loss=loss, outputs=outputs, meta=meta, values=True)
    assert dumps(tp, loss=loss, outputs=outputs, meta=meta, values=True) == first
    tf = load(first)
    assert_same_tape(tp, tf.tape)
    assert tf.loss.id == loss.id
    assert {k: v.id for k, v in tf.outputs.items()} == {k: v.id for k, v in outputs.items()}
    assert tf.meta == meta and tf.optimizer is None and tf.source == "<bytes>"
    assert tf.dumps(values=True) == first
    second = tf.dumps()
    assert load(second).dumps() == second


def test_round_trip_aux_is_exactly_what_recording_produces():
    tp, _, _ = all_ops_tape()
    tf = load(dumps(tp))
    aux = [(n.op, n.aux) for n in tf.tape.nodes if n.aux or n.op in ("sum", "mean")]
    # an optional attribute at its default (no axis, keepdims False) is absent
    assert aux == [("reshape", {"shape": [1, 2, 2]}), ("reshape", {"shape": [1, 2, 2]}),
                   ("softmax", {"axis": 2}), ("slice", {"starts": [0, 0, 0], "stops": [1, 2, 1]}),
                   ("concat", {"axis": 2}), ("sum", None), ("mean", None),
                   ("max", {"axis": 1, "keepdims": True}), ("log_softmax", {"axis": 2}),
                   ("take_along", {"axis": 2}), ("sum", {"axis": 0}),
                   ("reshape", {"shape": [1, 2, 3]}), ("mean", {"axis": 0}),
                   ("mean", {"axis": 2, "keepdims": True}), ("sum", None),
                   ("permute", {"dims": [2, 0, 1]}),
                   ("slice", {"starts": [0, 0, 0], "stops": [3, 2, 2], "steps": [2, 1, 2]}),
                   ("sum", None),
                   # the masks and integer data block
                   ("reshape", {"shape": [2, 1]}), ("log_softmax", {"axis": 1}),
                   ("take_along", {"axis": 1}), ("reshape", {"shape": [2, 1]}),
                   ("sum", None), ("sum", None), ("sum", None), ("sum", None),
                   ("sum", None),
                   ("reshape", {"shape": [1, 2, 2, 3]}),
                   ("conv2d", {"stride": [1, 1], "padding": [1, 0], "dilation": [1, 1],
                               "groups": 2}),
                   ("max_pool2d", {"kernel": [2, 2], "stride": [1, 1], "padding": [1, 1],
                                   "dilation": [1, 1], "ceil_mode": True}),
                   ("avg_pool2d", {"kernel": [2, 2], "stride": [2, 2], "padding": [0, 0],
                                   "ceil_mode": True, "count_include_pad": False}),
                   ("mean", None), ("mean", None), ("scatter", {"rows": 3}), ("sum", None),
                   ("slice", {"starts": [2], "stops": [3]}),
                   ("uniform", {"shape": [2, 2, 3], "salt": 0}), ("sum", None),
                   ("cast", {"dtype": "f32"}), ("sum", None), ("cast", {"dtype": "f64"})]
    assert [n.aux for n in tf.tape.nodes] == [n.aux for n in tp.nodes]
    flags = ("keepdims", "ceil_mode", "count_include_pad")
    assert all(type(x) is (bool if k in flags else str if k == "dtype" else int)
               for _, d in aux if d
               for k, v in d.items() for x in (v if isinstance(v, list) else [v]))


def test_loaded_tape_backward_matches_the_original_bitwise(rng):
    tp, loss, _ = mlp_tape(rng)
    tp.backward(loss)
    tf = load(dumps(tp, loss=loss))
    tf.tape.backward(tf.loss)
    for p, q in zip(tp.params(), tf.tape.params(), strict=True):
        assert_bits_equal(tf.tape.grad(q), tp.grad(p), f"grad of node {p.id}")


def test_recorded_values_are_stored_for_op_nodes_only():
    tp, loss, _ = all_ops_tape()
    tf = load(dumps(tp, values=True))
    assert sorted(tf.recorded) == [i for i, n in enumerate(tp.nodes) if n.a >= 0]
    for i, v in tf.recorded.items():
        assert_bits_equal(v, tp.values[i], f"recorded node {i}")
    assert load(dumps(tp)).recorded == {}


def test_save_to_path_file_object_and_method(tmp_path, rng):
    tp, loss, outputs = mlp_tape(rng)
    expected = dumps(tp, loss=loss, outputs=outputs, optimizer={"kind": "adam", "t": 3})
    save(tp, tmp_path / "a.msgpack", loss=loss, outputs=outputs,
         optimizer={"kind": "adam", "t": 3})
    save(tp, str(tmp_path / "b.msgpack"), loss=loss, outputs=outputs,
            optimizer={"kind": "adam", "t": 3})
    buf = io.BytesIO()
    save(tp, buf, loss=loss, outputs=outputs, optimizer={"kind": "adam", "t": 3})
    assert (tmp_path / "a.msgpack").read_bytes() == expected
    assert (tmp_path / "b.msgpack").read_bytes() == expected
    assert buf.getvalue() == expected
    assert [p.name for p in tmp_path.iterdir()] != [] and not list(tmp_path.glob(".*.tmp"))
    tf = load(tmp_path / "a.msgpack")
    assert tf.source == str(tmp_path / "a.msgpack") and tf.optimizer == {"kind": "adam", "t": 3}
    with open(tmp_path / "a.msgpack", "rb") as f:
        assert load(f).source == "<stdin>"
    assert load(expected, name="mine").source == "mine"


def test_loss_defaults_to_the_last_node_and_must_have_one_element(rng):
    tp, loss, outputs = mlp_tape(rng)
    doc = msgpack.unpackb(dumps(tp))
    assert doc["loss"] == len(tp.nodes) - 1
    with pytest.raises(TapeError, match="one element"):
        dumps(tp, loss=outputs["pred"])
    with pytest.raises(TapeError, match="not a node"):
        dumps(tp, loss=len(tp.nodes))
    with pytest.raises(TapeError, match="another tape"):
        dumps(tp, outputs={"x": Tape().param([1.0])})


def test_writer_refuses_poisoned_empty_and_unpackable_input():
    tp = Tape(raise_on_error=False)
    tp.add(tp.param(np.ones(2)), tp.param(np.ones(3)))
    with pytest.raises(TapeError, match="poisoned"):
        dumps(tp)
    with pytest.raises(TapeError, match="empty"):
        dumps(Tape())
    good = Tape()
    good.sum(good.param([1.0]))
    with pytest.raises(TapeError, match="msgpack"):
        dumps(good, meta={"x": object()})
    with pytest.raises(TapeError, match="string keys"):
        dumps(good, meta={1: 2})


def test_writer_layout_is_the_documented_one():
    tp = Tape()
    w = tp.param([1.5, -2.0], name="w", l2=0.5)
    tp.sum(tp.muls(w, 3.0))
    doc = msgpack.unpackb(dumps(tp, values=True))
    assert list(doc) == ["format", "version", "nodes", "loss", "numerics"]
    assert doc["format"] == FORMAT == "gradtool-tape" and doc["version"] == VERSION == 1
    assert doc["numerics"] == 2                    # written with stored values only
    assert list(msgpack.unpackb(dumps(tp))) == ["format", "version", "nodes", "loss"]
    leaf, muls, total = doc["nodes"]
    assert list(leaf) == ["op", "a", "b", "s", "shape", "name", "l2", "data"]
    assert leaf["data"] == np.array([1.5, -2.0], dtype="<f8").tobytes()
    assert muls == {"op": "muls", "a": 0, "b": -1, "s": 3.0, "shape": [2],
                    "value": np.array([4.5, -6.0], dtype="<f8").tobytes()}
    assert total["shape"] == [1]


# ── an independent writer: plain msgpack + numpy, per docs/format.md ───────


def test_independent_writer_loads_and_gradients_match_numpy(tmp_path, rng):
    arrays = write_independent_mlp(tmp_path / "ind.msgpack", rng)
    tf = load(tmp_path / "ind.msgpack")
    assert tf.loss.id == 13 and tf.outputs["pred"].id == 10
    assert [n.name for n in tf.tape.nodes[:6]] == ["x", "y", "W1", "b1", "W2", None]
    assert tf.tape.input_slots()[0].id == 0
    tf.tape.backward(tf.loss)
    loss, grads = numpy_mlp_backprop(*arrays)
    np.testing.assert_allclose(tf.tape.values[13][0], loss, rtol=1e-12)
    for i, g in grads.items():
        np.testing.assert_allclose(tf.tape.grad(tf.tape.var(i)), g, rtol=1e-12, atol=1e-15)


# ── the schema ─────────────────────────────────────────────────────────────

def test_schema_is_valid_2020_12_and_accepts_written_files(rng):
    jsonschema.Draft202012Validator.check_schema(schema())
    plain = jsonschema.Draft202012Validator(schema())      # no gradtool extensions
    tp, loss, outputs = all_ops_tape()
    for data in (dumps(tp, loss=loss, outputs=outputs, values=True),
                 dumps(*mlp_tape(rng)[:1], meta={"a": 1})):
        plain.validate(msgpack.unpackb(data))
    listed = schema()["$defs"]["node"]["properties"]["op"]["enum"]
    assert listed == list(OPS)


def test_schema_errors_name_node_and_field(rng):
    tp, _, _ = mlp_tape(rng)
    doc = msgpack.unpackb(dumps(tp))
    doc["nodes"][3]["shape"] = [5, "x"]
    with pytest.raises(TapeFileError) as err:
        load(msgpack.packb(doc), name="f.msgpack")
    assert str(err.value) == \
        "f.msgpack: node 3: field 'shape[1]': expected an integer, got a string"
    assert (err.value.source, err.value.node, err.value.field) == ("f.msgpack", 3, "shape[1]")


def test_integral_float_ids_are_rejected(rng):
    tp, _, _ = mlp_tape(rng)
    doc = msgpack.unpackb(dumps(tp))
    doc["nodes"][7]["a"] = float(doc["nodes"][7]["a"])
    with pytest.raises(TapeFileError, match="node 7: field 'a': expected an integer, got a float"):
        load(msgpack.packb(doc))


# ── limits: checked before anything is allocated ──────────────────────────

def test_element_budget_names_the_node(rng):
    tp, _, _ = mlp_tape(rng)
    data = dumps(tp)
    total = sum(v.size for v in tp.values)
    load(data, max_elements=total)
    with pytest.raises(TapeFileError,
                       match=r"node \d+: field 'shape': .* over this reader's limit"):
        load(data, max_elements=total - 1)


def test_container_and_size_limits():
    tp = Tape()
    tp.sum(tp.param([1.0]))
    data = dumps(tp, meta={"many": [{} for _ in range(50)]})
    load(data)
    with pytest.raises(TapeFileError, match="maps and arrays"):
        load(data, limits=Limits(max_containers=20))
    with pytest.raises(TapeFileError, match="limit"):
        load(data, limits=Limits(max_bytes=len(data) - 1))
    with pytest.raises(TapeFileError, match="limit"):
        load(io.BytesIO(data), limits=Limits(max_bytes=len(data) - 1))
    with pytest.raises(TapeFileError, match="nested deeper"):
        load(dumps(tp, meta={"a": {"b": {"c": [[1]]}}}), limits=Limits(max_depth=5))


def test_unreadable_path_is_a_tape_file_error(tmp_path):
    with pytest.raises(TapeFileError, match="missing.msgpack: cannot read"):
        load(tmp_path / "missing.msgpack")
    with pytest.raises(TapeFileError, match="cannot read"):
        load(tmp_path)


def test_the_five_line_decoding_example_in_the_docs_runs(capsys, monkeypatch):
    import re
    text = (ROOT / "docs" / "format.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) == 5
    monkeypatch.chdir(ROOT)
    exec(code, {})
    printed = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    documented = re.search(r"prints\n\n```\n(.*?)```", text, re.S).group(1).splitlines()
    assert printed == documented
