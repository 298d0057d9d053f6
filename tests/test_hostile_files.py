"""Hostile tape files: every one ends in exit status 2 and ONE stderr line naming the file
(and the node at fault), never a traceback, a hang or a huge allocation.

The corpus is built by mutating valid files: field edits and wrong types on
every node of an all-ops tape and of the samples, top-level edits,
truncations at many offsets, header bombs (lying lengths, broadcasts and
matmuls that would create or cost far too much), non-msgpack input, and
random byte flips.  Each case is run through the real click command in
process (CliRunner), cycling through inspect, backward and fd-check.
"""

import copy
from pathlib import Path

import msgpack
import numpy as np
from click.testing import CliRunner

from gradtool.cli import main
from gradtool.ops import OPS
from gradtool.tapefile import dumps
from gradtool.tapefile_checks import SchemaCheck, _validator_class, skeleton
from test_tapefile import all_ops_tape

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
COMMANDS = (["inspect"], ["backward", "--json"], ["fd-check"])


def base_files() -> dict:
    tp, loss, outputs = all_ops_tape()
    files = {"allops": dumps(tp, loss=loss, outputs=outputs, values=True)}
    for name in ("logistic", "mlp_regression", "attention"):
        files[name] = (SAMPLES / f"{name}.msgpack").read_bytes()
    return files


def pack(doc) -> bytes:
    return msgpack.packb(doc, use_bin_type=True)


def leaf_bytes(shape) -> dict:
    return {"op": "const", "a": -1, "b": -1, "s": 0.0, "shape": list(shape),
            "data": np.zeros(shape).astype("<f8").tobytes()}


def tape_doc(nodes, **top) -> dict:
    return {"format": "gradtool-tape", "version": 1, "nodes": nodes, **top}


# ── node-level mutations ───────────────────────────────────────────────────

def node_mutations(node: dict, i: int, doc: dict):
    """(label, new node or a function of the doc) pairs; every one invalid at node i."""
    op = node["op"]
    leaf = op in ("param", "const")
    shape = node["shape"]
    yield "op unknown", {**node, "op": "frobnicate"}
    yield "op int", {**node, "op": 3}
    yield "op missing", {k: v for k, v in node.items() if k != "op"}
    yield "shape missing", {k: v for k, v in node.items() if k != "shape"}
    yield "shape str", {**node, "shape": "[1]"}
    yield "shape empty", {**node, "shape": []}
    yield "shape zero", {**node, "shape": [0] + shape[1:]}
    yield "shape negative", {**node, "shape": [-3] + shape[1:]}
    yield "shape float", {**node, "shape": [float(d) for d in shape]}
    yield "shape extra dim", {**node, "shape": shape + [2]}
    yield "shape doubled", {**node, "shape": [shape[0] * 2] + shape[1:]}
    yield "shape huge", {**node, "shape": [2 ** 40, 2 ** 40]}
    yield "shape 64-bit", {**node, "shape": [2 ** 64 - 1]}
    yield "shape rank 40", {**node, "shape": [1] * 40}
    yield "node int", 5
    yield "node array", [node["op"], shape]
    yield "a self", {**node, "a": i}
    yield "a forward", {**node, "a": i + 1}
    yield "a -2", {**node, "a": -2}
    yield "a float", {**node, "a": float(node.get("a", -1))}
    yield "a str", {**node, "a": "0"}
    yield "b bool", {**node, "b": True}
    yield "b forward", {**node, "b": i + 7}
    yield "s str", {**node, "s": "1.5"}
    yield "unknown op of another arity", {**node, "op": "concat" if OPS_ARITY[op] != 2 else "neg"}
    if leaf:
        data = node["data"]
        yield "a on leaf", {**node, "a": 0}
        yield "data truncated", {**node, "data": data[:-1]}
        yield "data one short", {**node, "data": data[:-8]}
        yield "data extra", {**node, "data": data + bytes(8)}
        yield "data empty", {**node, "data": b""}
        yield "data str", {**node, "data": "abc"}
        yield "data list", {**node, "data": [1.0] * (len(data) // 8)}
        yield "data missing", {k: v for k, v in node.items() if k != "data"}
        yield "value on leaf", {**node, "value": data}
        yield "axis on leaf", {**node, "axis": 0}
        yield "s on leaf", {**node, "s": 2.0}
        yield "dtype unknown", {**node, "dtype": "f32"}
        yield "dtype int", {**node, "dtype": 8}
        yield "name empty", {**node, "name": ""}
        yield "name int", {**node, "name": 7}
        yield "name bin", {**node, "name": b"w"}
        if op == "param":
            yield "l2 negative", {**node, "l2": -1e-4}
            yield "l2 nan", {**node, "l2": float("nan")}
            yield "l2 inf", {**node, "l2": float("inf")}
            yield "l2 str", {**node, "l2": "1e-4"}
            yield "dtype on param", {**node, "dtype": "i64"}
        else:
            yield "l2 on const", {**node, "l2": 0.0}
        earlier = [n.get("name") for n in doc["nodes"][:i] if isinstance(n, dict)]
        earlier = [n for n in earlier if n]
        if earlier:
            yield "duplicate name", {**node, "name": earlier[0]}
    else:
        yield "data on op", {**node, "data": bytes(8)}
        yield "name on op", {**node, "name": "z"}
        yield "l2 on op", {**node, "l2": 0.0}
        yield "dtype on op", {**node, "dtype": "f64"}
        yield "a missing", {k: v for k, v in node.items() if k != "a"}
        if "value" in node:
            yield "value truncated", {**node, "value": node["value"][:-3]}
            yield "value str", {**node, "value": "x"}
        if op in ("adds", "muls"):
            yield "s missing type", {**node, "s": None}
        else:
            yield "s nonzero", {**node, "s": 1.5}
        if OPS_ARITY[op] == 1:
            yield "b on unary", {**node, "b": 0}
        else:
            yield "b missing", {k: v for k, v in node.items() if k != "b"}
        attrs = {at.name: at for at in OPS[op].attrs}
        if "axis" in attrs:
            yield "axis too big", {**node, "axis": 99}
            yield "axis negative", {**node, "axis": -1}
            yield "axis float", {**node, "axis": 1.0}
            if attrs["axis"].file_required:
                yield "axis missing", {k: v for k, v in node.items() if k != "axis"}
        else:
            yield "axis stray", {**node, "axis": 0}
        if "keepdims" in attrs:
            yield "keepdims int", {**node, "keepdims": 1}
            yield "keepdims str", {**node, "keepdims": "yes"}
        else:
            yield "keepdims stray", {**node, "keepdims": False}
        ids = [k for k, n in enumerate(doc["nodes"][:i])
               if isinstance(n, dict) and n.get("dtype") == "i64"]
        if OPS[op].int_inputs:
            yield "ids from a float node", {**node, "b": node["a"]}
            yield "table from the ids", {**node, "a": node["b"]}
        elif ids:
            yield "ids read as floats", {**node, "a": ids[0]}
        if op == "slice":
            yield "starts short", {**node, "starts": node["starts"][:-1]}
            yield "stops past end", {**node, "stops": [d + 100 for d in node["stops"]]}
            yield "empty slice", {**node, "stops": list(node["starts"])}
            yield "starts missing", {k: v for k, v in node.items() if k != "starts"}
        else:
            yield "starts stray", {**node, "starts": [0]}


OPS_ARITY = {name: spec.arity for name, spec in OPS.items()}


def nodes_to_mutate(name: str, doc: dict) -> list:
    """Every node of the all-ops tape; the first node of each op in the samples."""
    if name == "allops":
        return list(range(len(doc["nodes"])))
    first = {}
    for i, n in enumerate(doc["nodes"]):
        first.setdefault((n["op"], "name" in n), i)
    return sorted(first.values())


def node_cases(bases: dict):
    for name, raw in bases.items():
        doc = msgpack.unpackb(raw)
        for i in nodes_to_mutate(name, doc):
            for label, new in node_mutations(doc["nodes"][i], i, doc):
                mutated = copy.copy(doc)
                mutated["nodes"] = list(doc["nodes"])
                mutated["nodes"][i] = new
                yield f"{name} node {i} {label}", pack(mutated), i


# ── document-level mutations ───────────────────────────────────────────────

def top_cases(bases: dict):
    raw = bases["mlp_regression"]
    doc = msgpack.unpackb(raw)
    n = len(doc["nodes"])
    pred = doc["outputs"]["pred"]

    def edit(**changes):
        out = {**doc, **changes}
        return pack({k: v for k, v in out.items() if v is not DROP})

    yield "format wrong", edit(format="gradtool-tap"), None
    yield "format bin", edit(format=b"gradtool-tape"), None
    yield "format missing", edit(format=DROP), None
    yield "version 2", edit(version=2), None
    yield "version 0", edit(version=0), None
    yield "version str", edit(version="1"), None
    yield "version float", edit(version=1.0), None
    yield "version bool", edit(version=True), None
    yield "version missing", edit(version=DROP), None
    yield "nodes missing", edit(nodes=DROP), None
    yield "nodes empty", edit(nodes=[]), None
    yield "nodes map", edit(nodes={}), None
    yield "nodes str", edit(nodes="nodes"), None
    yield "loss out of range", edit(loss=n), None
    yield "loss huge", edit(loss=2 ** 64 - 1), None
    yield "loss negative", edit(loss=-1), None
    yield "loss str", edit(loss="13"), None
    yield "loss float", edit(loss=float(n - 1)), None
    yield "loss not scalar", edit(loss=pred), pred
    yield "outputs array", edit(outputs=[pred]), None
    yield "outputs out of range", edit(outputs={"pred": n + 5}), None
    yield "outputs negative", edit(outputs={"pred": -1}), None
    yield "outputs str", edit(outputs={"pred": "10"}), None
    yield "meta int", edit(meta=5), None
    yield "meta array", edit(meta=[1]), None
    yield "optimizer str", edit(optimizer="adam"), None
    deep = {}
    for _ in range(100):
        deep = {"d": deep}
    yield "meta deep nesting", edit(meta=deep), None
    for top in ([], 5, "gradtool-tape", None, b"bin", True, 1.5, [doc]):
        yield f"top level {type(top).__name__}", pack(top), None
    yield "empty file", b"", None
    yield "text", b"hello, world\n", None
    yield "json text", b'{"format": "gradtool-tape", "version": 1, "nodes": []}', None
    yield "gzip magic", b"\x1f\x8b\x08\x00" + bytes(20), None
    yield "extra data", raw + b"\x00", None
    yield "two documents", raw + raw, None
    yield "invalid type byte", b"\xc1", None
    yield "bad utf-8 key", b"\x81\xa2\xff\xfe\x01", None
    yield "int map key", b"\x81\x01\x02", None
    yield "bin map key", pack({b"format": "gradtool-tape"}), None
    yield "ext type", pack({**doc, "meta": {"t": msgpack.ExtType(5, b"xx")}}), None
    yield "timestamp", pack({**doc, "meta": {"t": msgpack.Timestamp(1, 0)}}), None
    yield "array header bomb", b"\x81\xa5nodes\xdd\xff\xff\xff\xff", None
    yield "map header bomb", b"\xdf\xff\xff\xff\xff", None
    yield "bin header bomb", b"\x81\xa4data\xc6\xff\xff\xff\xff\x00", None
    yield "str header bomb", b"\x81\xdb\xff\xff\xff\xff", None
    yield "nested array headers", b"\xdd\x00\x10\x00\x00" * 900, None
    yield "deep msgpack nesting", b"\x91" * 5000 + b"\x00", None


DROP = object()


def bomb_cases():
    # A leaf claiming 2^62 elements with 8 bytes of data: rejected before np.frombuffer.
    yield "leaf claims 2^62 elements", pack(tape_doc([
        {**leaf_bytes([1]), "shape": [2 ** 31, 2 ** 31]}])), 0
    # [1000,1] + [1,1000] -> 10^6, reshaped, + [1,20000] -> 2*10^10 elements (160 GB).
    yield "broadcast bomb", pack(tape_doc([
        leaf_bytes([1000, 1]), leaf_bytes([1, 1000]),
        {"op": "add", "a": 0, "b": 1, "s": 0.0, "shape": [1000, 1000]},
        {"op": "reshape", "a": 2, "b": -1, "s": 0.0, "shape": [1000000, 1]},
        leaf_bytes([1, 20000]),
        {"op": "add", "a": 3, "b": 4, "s": 0.0, "shape": [1000000, 20000]},
        {"op": "sum", "a": 5, "b": -1, "s": 0.0, "shape": [1]}])), 5
    # [4096,4096] built by broadcast (within the element budget), then squared by
    # matmul: 6.9*10^10 multiply-adds, i.e. a hang, from a 65 KB file.
    yield "matmul work bomb", pack(tape_doc([
        leaf_bytes([4096, 1]), leaf_bytes([1, 4096]),
        {"op": "add", "a": 0, "b": 1, "s": 0.0, "shape": [4096, 4096]},
        {"op": "matmul", "a": 2, "b": 2, "s": 0.0, "shape": [4096, 4096]},
        {"op": "sum", "a": 3, "b": -1, "s": 0.0, "shape": [1]}])), 3
    # bmm the same way.
    yield "bmm work bomb", pack(tape_doc([
        leaf_bytes([1, 4096, 1]), leaf_bytes([1, 1, 4096]),
        {"op": "add", "a": 0, "b": 1, "s": 0.0, "shape": [1, 4096, 4096]},
        {"op": "bmm", "a": 2, "b": 2, "s": 0.0, "shape": [1, 4096, 4096]},
        {"op": "sum", "a": 3, "b": -1, "s": 0.0, "shape": [1]}])), 3


def truncation_cases(bases: dict):
    for name, raw in bases.items():
        for cut in sorted(set(np.linspace(0, len(raw) - 1, 50).astype(int).tolist())):
            yield f"{name} truncated at {cut}", raw[:cut], None


def all_invalid_cases():
    bases = base_files()
    cases = list(node_cases(bases)) + list(top_cases(bases)) + list(bomb_cases()) \
        + list(truncation_cases(bases))
    # A bin map key inside the node list.
    doc = msgpack.unpackb(bases["logistic"])
    bad_node = {**doc["nodes"][0]}
    bad_node[b"x"] = bad_node.pop("op")
    cases.append(("bin key in a node", pack({**doc, "nodes": [bad_node] + doc["nodes"][1:]}),
                  None))
    return cases


# ── running ────────────────────────────────────────────────────────────────

def assert_clean_reject(result, label, fname, node):
    context = f"{label}: exit {result.exit_code}, stdout {result.stdout[:200]!r}, " \
              f"stderr {result.stderr[:300]!r}, exception {result.exception!r}"
    assert result.exit_code == 2, context
    assert result.exception is None or isinstance(result.exception, SystemExit), context
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), context
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, context
    assert result.stdout == "", context
    assert lines[0].startswith(f"gradtool: {fname}: "), context
    if node is not None:
        assert f": node {node}: " in lines[0], context


def test_invalid_files_exit_2_with_one_line_naming_file_and_node(tmp_path):
    cases = all_invalid_cases()
    assert len(cases) > 1000
    runner = CliRunner()
    seen_labels = set()
    for k, (label, data, node) in enumerate(cases):
        path = tmp_path / f"case{k}.msgpack"
        path.write_bytes(data)
        result = runner.invoke(main, COMMANDS[k % 3] + [str(path)])
        assert_clean_reject(result, label, str(path), node)
        seen_labels.add(label.split(" ", 1)[-1])
    assert len(seen_labels) > 100


def test_invalid_files_on_stdin_name_stdin():
    runner = CliRunner()
    for k, (label, data, node) in enumerate(all_invalid_cases()[::97]):
        result = runner.invoke(main, COMMANDS[k % 3] + ["-"], input=data)
        assert_clean_reject(result, label, "<stdin>", node)


def test_random_byte_flips_never_crash(tmp_path):
    """A flipped byte may leave a valid file (e.g. inside leaf data): then the command
    succeeds.  Otherwise it must be a clean exit 2 naming the file."""
    tp, loss, outputs = all_ops_tape()
    bases = [dumps(tp, loss=loss, outputs=outputs), base_files()["logistic"]]
    rng = np.random.default_rng(2024)
    runner = CliRunner()
    rejected = 0
    for k in range(400):
        data = bytearray(bases[k % 2])
        pos = int(rng.integers(len(data)))
        data[pos] ^= int(rng.integers(1, 256))
        path = tmp_path / f"flip{k}.msgpack"
        path.write_bytes(bytes(data))
        result = runner.invoke(main, ["inspect", str(path)])
        if result.exit_code == 0:
            assert result.stderr == "" and result.stdout, f"flip {k} at {pos}"
        else:
            assert_clean_reject(result, f"flip {k} at {pos}", str(path), None)
            rejected += 1
    assert rejected > 200, f"only {rejected} of 400 flips were rejected"


def test_memoized_schema_check_only_skips_nodes_plain_jsonschema_accepts():
    """The skeleton memo must never change the schema's verdict: every node whose
    skeleton is in the memo of valid skeletons is valid by plain jsonschema."""
    plain = _validator_class()(SchemaCheck().node.schema)
    memo = SchemaCheck()
    tp, loss, outputs = all_ops_tape()
    for raw in [dumps(tp, loss=loss, outputs=outputs, values=True), *base_files().values()]:
        assert memo.first_error(msgpack.unpackb(raw)) == (None, None)
    assert len(memo.valid_skeletons) > 30
    seen, skipped = set(), 0
    for label, data, _ in all_invalid_cases():
        try:
            doc = msgpack.unpackb(data, strict_map_key=False)
        except Exception:
            continue
        nodes = doc.get("nodes") if isinstance(doc, dict) else None
        for node in nodes if isinstance(nodes, list) else []:
            key = repr(node)        # by content: an id() is reused once a doc is freed
            if key in seen:
                continue
            seen.add(key)
            if skeleton(node) in memo.valid_skeletons:
                assert plain.is_valid(node), (label, node)
                skipped += 1
    assert skipped > 50
