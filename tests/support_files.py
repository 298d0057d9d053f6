"""Tape files, valid and hostile: the corpus of ``test_hostile_files`` (hand-written
invalid mutations of every node field and top-level key, header bombs, truncations:
:func:`all_invalid_cases`, :func:`assert_clean_reject`) and the structure-aware
:class:`Mutator` of the fuzz test.  Tests import these through tests/support.py.
"""

from __future__ import annotations

import copy
import math

import msgpack
import numpy as np

from gradtool.ops import OPS
from gradtool.tapefile import dumps

from support_tapes import SAMPLES, all_ops_tape


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
        yield "dtype unknown", {**node, "dtype": "f16"}
        yield "dtype f32 of f64 data", {**node, "dtype": "f32"}
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
        if node.get("op") == "cast":          # its target: the other float dtype only
            yield "cast to i64", {**node, "dtype": "i64"}
            yield "cast to its input's dtype", {**node, "dtype": "f32" if node.get(
                "dtype") == "f64" else "f64"}
        else:
            yield "dtype on op", {**node, "dtype": "f64"}
        yield "a missing", {k: v for k, v in node.items() if k != "a"}
        if "value" in node:
            yield "value truncated", {**node, "value": node["value"][:-3]}
            yield "value str", {**node, "value": "x"}
        if OPS[op].scalar_operand:
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
        if OPS[op].id_inputs:
            yield "ids from a float node", {**node, "b": node["a"]}
            yield "table from the ids", {**node, "a": node["b"]}
        elif ids:
            yield "ids read as floats", {**node, "a": ids[0]}
        if op == "slice":
            yield "starts short", {**node, "starts": node["starts"][:-1]}
            yield "stops past end", {**node, "stops": [d + 100 for d in node["stops"]]}
            yield "empty slice", {**node, "stops": list(node["starts"])}
            yield "starts missing", {k: v for k, v in node.items() if k != "starts"}
            if "steps" in node:
                yield "step zero", {**node, "steps": [0] * len(node["steps"])}
                yield "steps short", {**node, "steps": node["steps"][:-1]}
        else:
            yield "starts stray", {**node, "starts": [0]}
        if op == "permute":
            yield "dims repeated", {**node, "dims": [0] * len(node["dims"])}
            yield "dims short", {**node, "dims": node["dims"][:-1]}
            yield "dims missing", {k: v for k, v in node.items() if k != "dims"}
        else:
            yield "dims stray", {**node, "dims": [0]}


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
    yield "state array", edit(state=["x"]), None
    yield "state value int", edit(state={"x": 10}), None
    yield "state value empty", edit(state={"x": ""}), None
    yield "state no leaf", edit(state={"ghost": "pred"}), None
    yield "state a param", edit(state={"W1": "pred"}), None
    yield "state unknown output", edit(state={"y": "logits"}), None
    yield "state shape mismatch", edit(state={"x": "pred"}), None
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


# ── structure-aware mutations, for the fuzz test ───────────────────────────

OP_NAMES = sorted(OPS)
NODE_KEYS = ("op", "a", "b", "s", "shape", "data", "name", "l2", "dtype", "axis", "keepdims",
             "starts", "stops", "value")
TOP_KEYS = ("format", "version", "nodes", "loss", "outputs", "state", "meta", "optimizer")


class Mutator:
    """Seeded mutations of a decoded tape file.  :meth:`mutate` returns a mutated deep
    copy; each of its 1-3 edits is chosen among targeted edits (the node fields, ids,
    shapes, attributes, data lengths, the format tag and version, loss and outputs,
    the node list's length and order) and generic ones at a random place in the
    structure (delete, retype, rename a key, nest, resize)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def pick(self, items):
        return items[int(self.rng.integers(len(items)))]

    def mutate(self, doc: dict) -> dict:
        doc = copy.deepcopy(doc)
        edits = (self.node_field, self.node_field, self.node_field, self.node_id,
                 self.node_shape, self.node_data, self.node_list, self.top, self.anywhere,
                 self.anywhere)
        if isinstance(doc.get("optimizer"), dict):        # a checkpoint: its state, mostly
            edits = (self.state,) * 10 + edits
        for _ in range(int(self.rng.integers(1, 4))):
            self.pick(edits)(doc)
        return doc

    def state(self, doc):
        """An edit inside a checkpoint's optimizer state or training position."""
        state = doc.get("optimizer")
        if not isinstance(state, dict):          # an earlier edit replaced it
            return self.anywhere(doc)
        inside = state.get("position") if isinstance(state.get("position"), dict) \
            and self.rng.integers(2) else state
        if not isinstance(inside, dict) or not inside:
            return self.anywhere(doc)
        key = self.pick(list(inside))             # insertion order: deterministic
        how = self.pick(("value", "near", "retype", "drop", "anywhere"))
        value = inside[key]
        if how == "value":
            inside[key] = self.value()
        elif how == "near" and isinstance(value, (int, float)) and not isinstance(value, bool):
            inside[key] = self.pick((value + 1, value - 1, value * 1.5, -value, value / 0.9,
                                     float("nan")))
        elif how == "retype":
            inside[key] = self.retype(value)
        elif how == "drop":
            del inside[key]
        else:
            self.anywhere(inside)

    # values
    def value(self, depth: int = 0):
        kind = self.pick(("int", "int", "float", "str", "bytes", "bool", "nil", "list",
                          "map", "deep"))
        if kind == "int":
            return int(self.pick((-2, -1, 0, 1, 2, 3, 7, 31, 33, 2 ** 31, 2 ** 40, 2 ** 63 - 1,
                                  -2 ** 63, 2 ** 64 - 1)))
        if kind == "float":
            return float(self.pick((0.0, -0.0, 1.0, 1.5, -3.25, 1e300, 5e-324, math.inf,
                                    -math.inf, math.nan)))
        if kind == "str":
            return self.pick(("", "x", "W1", "tanh", "\x00", "a\x00b", "é" * 3, "x" * 70000,
                              "gradtool-tape"))
        if kind == "bytes":
            return bytes(int(self.pick((0, 1, 7, 8, 16, 64))))
        if kind == "bool":
            return bool(self.rng.integers(2))
        if kind == "nil" or depth > 2:
            return None
        if kind == "list":
            return [self.value(depth + 1) for _ in range(int(self.rng.integers(0, 4)))]
        if kind == "map":
            return {self.pick(NODE_KEYS + ("zz",)): self.value(depth + 1)
                    for _ in range(int(self.rng.integers(0, 3)))}
        deep = 0
        for _ in range(int(self.pick((5, 31, 40)))):
            deep = [deep]
        return deep

    def retype(self, value):
        """The same content in another msgpack type (int 3 -> 3.0 -> "3" -> b"3" ...)."""
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return self.pick((float(value), str(value), [value], value != 0))
        if isinstance(value, float):
            return self.pick((int(value) if math.isfinite(value) else 0, str(value)))
        if isinstance(value, str):
            return self.pick((value.encode(), [value], len(value)))
        if isinstance(value, bytes):
            return self.pick((list(value[:8]), value.decode("latin-1"), len(value)))
        if isinstance(value, list):
            return self.pick(({str(k): v for k, v in enumerate(value)}, tuple(value) and
                              value[0], len(value)))
        if isinstance(value, dict):
            return list(value.values())
        return self.value()

    # targeted edits
    def _node(self, doc):
        nodes = doc.get("nodes")
        if isinstance(nodes, list) and nodes:
            k = int(self.rng.integers(len(nodes)))
            if isinstance(nodes[k], dict):
                return nodes, k
        return None, None

    def node_field(self, doc):
        nodes, k = self._node(doc)
        if nodes is None:
            return self.anywhere(doc)
        node, key = nodes[k], self.pick(NODE_KEYS)
        how = self.pick(("drop", "value", "retype", "op", "near"))
        if how == "drop":
            node.pop(key, None)
        elif how == "op":
            node["op"] = self.pick(OP_NAMES + ["tanhh", "", "Add", "param "])
        elif how == "retype" and key in node:
            node[key] = self.retype(node[key])
        elif how == "near" and isinstance(node.get(key), (int, float)) \
                and not isinstance(node.get(key), bool):
            node[key] = node[key] + self.pick((-1, 1, -2, 2))
        else:
            node[key] = self.value()

    def node_id(self, doc):
        nodes, k = self._node(doc)
        if nodes is None:
            return self.anywhere(doc)
        key = self.pick(("a", "b", "a", "axis"))
        nodes[k][key] = int(self.pick((-3, -1, 0, k - 1, k, k + 1, len(nodes), 2 ** 62)))

    def node_shape(self, doc):
        nodes, k = self._node(doc)
        if nodes is None:
            return self.anywhere(doc)
        node = nodes[k]
        key = self.pick(("shape", "shape", "starts", "stops"))
        dims = list(node.get(key, [1])) if isinstance(node.get(key), list) else [1]
        how = self.pick(("add", "drop", "set", "many", "swap"))
        if how == "add":
            dims.insert(int(self.rng.integers(len(dims) + 1)), int(self.pick((1, 2, 3))))
        elif how == "drop" and dims:
            dims.pop(int(self.rng.integers(len(dims))))
        elif how == "set" and dims:
            dims[int(self.rng.integers(len(dims)))] = int(self.pick((0, -1, 2, 3, 2 ** 31,
                                                                     2 ** 40, 64)))
        elif how == "many":
            dims = [1] * int(self.pick((32, 33, 40)))
        else:
            dims = dims[::-1]
        node[key] = dims

    def node_data(self, doc):
        nodes, k = self._node(doc)
        if nodes is None:
            return self.anywhere(doc)
        node = nodes[k]
        key = "data" if "data" in node else "value"
        data = node.get(key, b"")
        data = data if isinstance(data, bytes) else b""
        node[key] = self.pick((data[:-1], data[:-8], data + bytes(8), data + b"\x01",
                               bytes(len(data)), b"", data[: len(data) // 2]))

    def node_list(self, doc):
        nodes = doc.get("nodes")
        if not isinstance(nodes, list) or not nodes:
            return self.anywhere(doc)
        k = int(self.rng.integers(len(nodes)))
        how = self.pick(("dup", "drop", "swap", "truncate", "reverse", "append"))
        if how == "dup":
            nodes.insert(k, copy.deepcopy(nodes[k]))
        elif how == "drop":
            nodes.pop(k)
        elif how == "swap":
            j = int(self.rng.integers(len(nodes)))
            nodes[k], nodes[j] = nodes[j], nodes[k]
        elif how == "truncate":
            del nodes[k:]
        elif how == "reverse":
            nodes.reverse()
        else:
            nodes.append(copy.deepcopy(nodes[k]))

    def top(self, doc):
        key = self.pick(TOP_KEYS)
        how = self.pick(("drop", "value", "retype", "version", "loss", "outputs"))
        if how == "drop":
            doc.pop(key, None)
        elif how == "version":
            doc["version"] = self.pick((0, 2, -1, "1", 1.0, True, 2 ** 64 - 1))
        elif how == "loss":
            n = len(doc["nodes"]) if isinstance(doc.get("nodes"), list) else 3
            doc["loss"] = int(self.pick((-1, 0, n - 2, n, 2 ** 62)))
        elif how == "outputs":
            doc["outputs"] = {self.pick(("pred", "", "x\x00")): int(self.pick((0, -1, 999)))}
        elif how == "retype" and key in doc:
            doc[key] = self.retype(doc[key])
        else:
            doc[key] = self.value()

    # generic edits anywhere
    def _places(self, doc):
        """(container, key) pairs of every value in the document but inside bin data."""
        places, stack = [], [doc]
        while stack:
            obj = stack.pop()
            items = obj.items() if isinstance(obj, dict) else enumerate(obj)
            for key, value in items:
                places.append((obj, key))
                if isinstance(value, (dict, list)):
                    stack.append(value)
        return places

    def anywhere(self, doc):
        places = self._places(doc)
        if not places:
            return
        obj, key = self.pick(places)
        how = self.pick(("drop", "value", "retype", "nest", "rename", "binkey"))
        if how == "drop":
            del obj[key]
        elif how == "value":
            obj[key] = self.value()
        elif how == "retype":
            obj[key] = self.retype(obj[key])
        elif how == "nest":
            obj[key] = self.pick(([obj[key]], {"x": obj[key]}))
        elif isinstance(obj, dict) and how == "rename":
            obj[self.pick(NODE_KEYS + TOP_KEYS + ("zz", "Op", "shape "))] = obj.pop(key)
        elif isinstance(obj, dict):
            obj[str(key).encode()] = obj.pop(key)
        else:
            obj.insert(key, self.value())


def pack_any(doc) -> bytes:
    """msgpack bytes of a mutated document (bin keys and all)."""
    return msgpack.packb(doc, use_bin_type=True, strict_types=False)
