"""One table of node fields (gradtool/tapefile/fields.py) drives every node's checks: the
schema is rendered from it, the loader's fast path tests each field with it, and the node
table of docs/format.md lists the same fields on the same ops.  And integer data always
has a reader: an i64 const that no op's integer input reads is refused."""

import re
from pathlib import Path

import msgpack
import numpy as np
import pytest

import gradtool as gt
from gradtool.ops import OPS
from gradtool.tapefile.checks import SchemaCheck, _validator_class, plain_node
from gradtool.tapefile.fields import (INT_READERS, LEAVES, NODE_FIELDS, OP_NODES,
                                      schema_properties)
from support import all_ops_tape, tape_doc
from gradtool.tapefile.write import dumps

ROOT = Path(__file__).resolve().parents[1]


def all_ops_doc() -> dict:
    tp, loss, outputs = all_ops_tape()
    return msgpack.unpackb(dumps(tp, loss=loss, outputs=outputs, values=True))


def first_node_of_each_op(doc) -> dict:
    first = {}
    for i, node in enumerate(doc["nodes"]):
        first.setdefault(node["op"], i)
    return first


def test_the_all_ops_tape_covers_every_op():
    assert set(first_node_of_each_op(all_ops_doc())) == set(OPS)


CASES = [(op, key) for op in OPS for key in NODE_FIELDS if key != "op"]


@pytest.mark.parametrize("op,key", CASES)
def test_nil_in_any_field_of_any_op_is_refused_naming_node_and_field(op, key):
    doc = all_ops_doc()
    i = first_node_of_each_op(doc)[op]
    doc["nodes"][i][key] = None
    with pytest.raises(gt.TapeFileError) as info:
        gt.load(msgpack.packb(doc, use_bin_type=True), name="f")
    message = str(info.value)
    assert message.startswith(f"f: node {i}: field '{key}': "), message
    # where the field is allowed: its type, named; elsewhere its type or its place
    allowed = op in NODE_FIELDS[key].ops
    assert message.endswith("got nil") or (key == "dtype" and "unknown dtype None" in message) \
        or not allowed and message.endswith(f"is not allowed on '{op}' nodes"), message


@pytest.mark.parametrize("op", sorted(OPS))
def test_the_fast_path_accepts_a_field_exactly_where_the_table_and_the_schema_do(op):
    doc = all_ops_doc()
    i = first_node_of_each_op(doc)[op]
    nodes = doc["nodes"]
    checked = gt.load(msgpack.packb(doc, use_bin_type=True))   # the earlier nodes, as checked
    from gradtool.tapefile.checks import check, decode, Limits
    earlier = check(decode(msgpack.packb(doc, use_bin_type=True), "x", Limits()), "x",
                    Limits()).nodes[:i]
    assert checked.tape.nodes[i].op == op
    node_schema = _validator_class()(SchemaCheck().node.schema)
    samples = {key: [None, "", "x", 0, -1, 2, 0.5, -0.5, True, b"", [], [1], [0]]
               for key in NODE_FIELDS}
    for key, values in samples.items():
        if key in ("op", "a", "b", "shape", "s"):
            continue
        for value in values:
            raw = dict(nodes[i], **{key: value})
            allowed = op in NODE_FIELDS[key].ops and NODE_FIELDS[key].test(value)
            assert node_schema.is_valid(raw) == allowed or not allowed and not \
                node_schema.is_valid(raw), (op, key, value)
            if plain_node(i, raw, earlier, {}) is not None:
                assert allowed and node_schema.is_valid(raw), (op, key, value)


def test_the_schema_is_rendered_from_the_table():
    import json
    shipped = json.loads((ROOT / "gradtool" / "schemas" / "tape.schema.json").read_text())
    assert shipped["$defs"]["node"]["properties"] == schema_properties()
    assert set(shipped["$defs"]["node"]["properties"]) == set(NODE_FIELDS)


def _format_md_node_rows() -> dict:
    text = (ROOT / "docs" / "format.md").read_text()
    section = text.split("## Node maps", 1)[1].split("\n### ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        for key in re.findall(r"`([a-z0-9_]+)`", cells[0]):
            rows[key] = (cells[1], cells[2])
    return rows


def test_docs_format_md_lists_every_field_on_the_ops_of_the_table():
    rows = _format_md_node_rows()
    assert set(rows) == set(NODE_FIELDS), set(rows) ^ set(NODE_FIELDS)
    for key, field in NODE_FIELDS.items():
        kind, on = rows[key]
        if on.startswith("all"):
            named = set(OPS)
        elif on.startswith("op nodes"):
            named = set(OP_NODES)
        else:
            named = set(re.findall(r"`([a-z_0-9]+)`", on)) & set(OPS)
        assert named == set(field.ops), (key, on, field.ops)
    assert rows["value"][0] == "bin" and rows["data"][0] == "bin"
    assert rows["name"][0] == "str, non-empty"
    assert "nil" in (ROOT / "docs" / "format.md").read_text().split("## Node maps")[1]


# ── integer data always has a reader ─────────────────────────────────────────

def _leaf(shape, ids=False, **extra):
    data = (np.zeros(shape, dtype="<i8") if ids else np.ones(shape)).astype(
        "<i8" if ids else "<f8").tobytes()
    node = {"op": "const", "a": -1, "b": -1, "s": 0.0, "shape": list(shape), "data": data}
    if ids:
        node["dtype"] = "i64"
    node.update(extra)
    return node


def _sum(a):
    return {"op": "sum", "a": a, "b": -1, "s": 0.0, "shape": [1]}


def test_an_i64_const_nothing_reads_is_refused_naming_it():
    doc = tape_doc([_leaf([2, 3]), _leaf([2], ids=True), _sum(0)])
    with pytest.raises(gt.TapeFileError) as info:
        gt.load(msgpack.packb(doc, use_bin_type=True), name="f")
    message = str(info.value)
    assert message.startswith("f: node 1: field 'dtype': holds integer ids (dtype i64), but "
                              "no op reads them"), message
    for op in INT_READERS:
        assert op in message


def test_an_i64_const_read_by_an_integer_input_loads_and_an_unread_second_one_does_not():
    take = {"op": "take", "a": 0, "b": 1, "s": 0.0, "shape": [2, 3]}
    doc = tape_doc([_leaf([2, 3]), _leaf([2], ids=True), take, _sum(2)])
    assert gt.load(msgpack.packb(doc, use_bin_type=True)).tape.holds_ids(1)
    doc["nodes"].insert(2, _leaf([1], ids=True, name="spare"))
    doc["nodes"][3]["a"], doc["nodes"][4]["a"] = 0, 3
    with pytest.raises(gt.TapeFileError, match="node 2: field 'dtype': holds integer ids"):
        gt.load(msgpack.packb(doc, use_bin_type=True))


def test_save_refuses_a_tape_whose_i64_const_nothing_reads():
    tp = gt.Tape()
    x = tp.param(np.ones(3))
    tp.const(np.array([0, 1]), dtype="i64")
    loss = tp.sum(x)
    with pytest.raises(gt.GradtoolError, match="cannot save: .*no op reads them"):
        dumps(tp, loss=loss)


def test_the_readers_of_integer_data_come_from_the_op_table():
    assert INT_READERS == tuple(n for n, s in OPS.items() if s.int_inputs)
    assert set(INT_READERS) >= {"take", "take_along"} and not set(INT_READERS) & set(LEAVES)
