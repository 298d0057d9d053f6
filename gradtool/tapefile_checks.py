"""Reading a tape file without trusting it: bounded decoding, the schema, the semantic checks.

Three gates, in order, each before anything the file claims is allocated:

1. :func:`decode` — msgpack with hard limits on string/bin/array/map lengths,
   no extension types, string map keys only, a cap on the number of
   containers, then a nesting-depth and value-type walk.  Nothing is ever
   executed (msgpack is data only; there is no pickle anywhere).
2. :func:`check` — the format tag and version, then the JSON Schema
   (``gradtool/schemas/tape.schema.json``) through the ``jsonschema``
   library, the first violation becoming a :class:`TapeFileError` that names
   the node and field.
3. The semantic rules the schema cannot state: input ids smaller than the
   node's own id and matching the op's arity, every op's shape recomputed
   from its inputs' stated shapes with :func:`gradtool.ops.infer_shape`
   (no arithmetic) and compared with the stated one, ``data``/``value``
   lengths equal to 8 bytes per element, integer ids (``dtype`` i64) read
   only by an op's ids input, which reads nothing else, every id in range,
   unique leaf names, finite l2, a one-element float loss, output ids in
   range, and budgets on the total number
   of elements and on the arithmetic the replay would do — so a 200-byte
   file that broadcasts two leaves into a 10^10-element array is rejected
   here, naming the node, instead of exhausting memory in numpy.

The result, :class:`CheckedFile`, is plain validated data; turning it into a
Tape (which computes values) is :mod:`gradtool.tapefile`'s job.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Optional

import msgpack
import numpy as np

from .errors import ShapeError, TapeFileError
from .limits import MAX_DEPTH, MAX_MAP_LEN, MAX_NAME_BYTES
from .ops import INT_DTYPE, LEAF_OPS, OPS, bad_id, format_shape, infer_shape

FORMAT = "gradtool-tape"
VERSION = 1


@dataclass(frozen=True)
class Limits:
    """What a loader is willing to allocate or compute for one file.

    The defaults admit any realistic tape (a billion-byte file, 2^27 float64
    elements = 1 GiB of values) and reject lies: claims beyond them fail
    before allocation, with the node named.
    """

    max_bytes: int = 1 << 30          # the file itself
    max_nodes: int = 1 << 20
    max_elements: int = 1 << 27       # sum of every node's element count
    max_work: int = 1 << 32           # multiply-adds and element visits of one forward replay
    max_depth: int = MAX_DEPTH        # msgpack container nesting (the format itself needs 4)
    max_str_len: int = MAX_NAME_BYTES
    max_map_len: int = MAX_MAP_LEN
    max_containers: int = 1 << 22     # maps + arrays in the whole file


@dataclass
class CheckedNode:
    op: str
    a: int
    b: int
    s: float
    shape: tuple
    attrs: Optional[dict]             # exactly the aux dict recording produces
    name: Optional[str] = None
    l2: float = 0.0
    data: Optional[bytes] = None      # leaves: little-endian float64 (int64 for dtype i64)
    value: Optional[bytes] = None     # op nodes: the recorded value, if the writer stored it
    dtype: str = "f64"                # "i64": a const of integer ids


@dataclass
class CheckedFile:
    nodes: list
    loss: int
    outputs: dict
    meta: dict
    optimizer: Optional[dict]


def show(x, limit: int = 60) -> str:
    """A short repr for messages: a hostile file may hold megabyte strings."""
    text = repr(x)
    return text if len(text) <= limit else text[:limit - 3] + "..."


_KIND = {dict: "a map", list: "an array", str: "a string", bytes: "bin", int: "an integer",
         float: "a float", bool: "a boolean", type(None): "nil"}
_EXPECTED = {"object": "a map", "array": "an array", "string": "a string",
             "integer": "an integer", "number": "a number", "boolean": "a boolean"}


def kind(x) -> str:
    return _KIND.get(type(x), type(x).__name__)


# ── gate 1: bounded msgpack decoding ───────────────────────────────────────

class _TooManyContainers(Exception):
    pass


def decode(raw: bytes, source: str, limits: Limits):
    """msgpack bytes -> Python objects, within ``limits``; TapeFileError otherwise."""
    if not raw:
        raise TapeFileError("the file is empty (expected a msgpack map)", source=source)
    containers = 0

    def count(obj):
        # Called once per decoded map/array: stops a file made of millions of
        # one-byte empty containers (each a 56-64 byte Python object) early.
        nonlocal containers
        containers += 1
        if containers > limits.max_containers:
            raise _TooManyContainers
        return obj

    try:
        doc = msgpack.unpackb(
            raw, raw=False, strict_map_key=True, use_list=True,
            object_hook=count, list_hook=count,
            max_str_len=limits.max_str_len, max_bin_len=len(raw),
            max_array_len=max(limits.max_nodes, 64), max_map_len=limits.max_map_len,
            max_ext_len=0)
    except _TooManyContainers:
        raise TapeFileError(f"more than {limits.max_containers} msgpack maps and arrays; "
                            f"not a plausible tape", source=source) from None
    except msgpack.ExtraData as exc:
        if isinstance(exc.unpacked, dict):
            message = f"{len(exc.extra)} byte(s) of extra data after the tape map"
        else:
            message = (f"not a gradtool tape file: it starts with {kind(exc.unpacked)}, "
                       f"not a msgpack map")
        raise TapeFileError(message, source=source) from None
    except UnicodeDecodeError:
        raise TapeFileError("a msgpack string is not valid UTF-8", source=source) from None
    except msgpack.StackError:
        raise TapeFileError("msgpack containers nested too deeply", source=source) from None
    except msgpack.FormatError:
        raise TapeFileError("not msgpack: invalid type byte", source=source) from None
    except (ValueError, TypeError) as exc:
        raise TapeFileError(_describe_unpack_error(exc, len(raw)), source=source) from None
    _check_structure(doc, source, limits)
    return doc


def _describe_unpack_error(exc: Exception, size: int) -> str:
    text = str(exc)
    if "incomplete input" in text:
        return f"truncated: the msgpack data ends early ({size} bytes)"
    if "max_ext_len" in text:
        return "msgpack extension types are not part of the tape format"
    if "exceeds max_" in text:       # e.g. "4294967295 exceeds max_array_len(1048576)"
        claimed, _, rest = text.partition(" exceeds ")
        what = rest.split("(")[0].replace("max_", "").replace("_len", "")
        return f"a msgpack {what} claims length {claimed}, over this reader's limit"
    if "map key" in text or "unhashable" in text:
        return "msgpack map keys must be strings"
    return f"not valid msgpack ({show(text)})"


_LEAF_TYPES = (str, bytes, int, float, bool, type(None))


def _check_structure(doc, source: str, limits: Limits) -> None:
    """Nesting depth, value types and string keys, walked without recursion."""
    stack = [(doc, 1)]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, (dict, list)):
            if depth > limits.max_depth:
                raise TapeFileError(f"msgpack containers nested deeper than {limits.max_depth} "
                                    f"levels", source=source)
            if isinstance(obj, dict):
                for key in obj:
                    if not isinstance(key, str):
                        raise TapeFileError("msgpack map keys must be strings, found bin",
                                            source=source)
                items = obj.values()
            else:
                items = obj
            stack.extend((item, depth + 1) for item in items if not isinstance(item, _LEAF_TYPES))
        elif not isinstance(obj, _LEAF_TYPES):
            raise TapeFileError(f"unsupported msgpack value ({type(obj).__name__})", source=source)


# ── gate 2: format, version, schema ────────────────────────────────────────

@lru_cache(maxsize=1)
def schema() -> dict:
    """The JSON Schema of the decoded structure (the package's copy)."""
    text = resources.files("gradtool").joinpath("schemas/tape.schema.json").read_text("utf-8")
    return json.loads(text)


@lru_cache(maxsize=1)
def _validator_class():
    from jsonschema import Draft202012Validator, ValidationError, validators

    def is_strict_int(_checker, x):
        # JSON Schema counts 1.0 as an integer; in a msgpack file an id or a
        # dim written as a float is a writer bug, so it is rejected.
        return isinstance(x, int) and not isinstance(x, bool)

    def msgpack_type(_validator, expected, instance, _schema):
        if expected == "bin" and not isinstance(instance, bytes):
            yield ValidationError(f"expected bin (msgpack bin type), got {kind(instance)}")

    return validators.extend(
        Draft202012Validator,
        validators={"msgpackType": msgpack_type},
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", is_strict_int))


class SchemaCheck:
    """The schema applied as two validators: the document without its node list, then
    each node.  jsonschema costs ~0.3 ms per node, so a node whose *skeleton* (see
    :func:`skeleton`) matches one already found valid is not validated again: the
    schema's verdict on a node depends only on its skeleton.  Invalid nodes are
    always validated in full, so error messages come from jsonschema itself.
    """

    MEMO_LIMIT = 4096

    def __init__(self):
        root = schema()
        top = json.loads(json.dumps(root))
        del top["properties"]["nodes"]["items"]
        node = {"$schema": root["$schema"], "$defs": root["$defs"], "$ref": "#/$defs/node"}
        cls = _validator_class()
        self.top, self.node = cls(top), cls(node)
        self.valid_skeletons = set()

    def first_error(self, doc) -> tuple:
        """(jsonschema error, node index or None), or (None, None) when the document is valid."""
        err = next(self.top.iter_errors(doc), None)
        if err is not None:
            return err, None
        for i, node in enumerate(doc["nodes"]):
            key = skeleton(node)
            if key is not None and key in self.valid_skeletons:
                continue
            err = next(self.node.iter_errors(node), None)
            if err is not None:
                return err, i
            if key is not None and len(self.valid_skeletons) < self.MEMO_LIMIT:
                self.valid_skeletons.add(key)
        return None, None


def _scalar_class(x):
    t = type(x)
    if x is None or t is bool:
        return ("v", x)
    if t is int:   # the schema compares ints with -1, 0 and 1 only
        return ("i", 1 if x >= 1 else 0 if x == 0 else -1 if x == -1 else -2)
    if t is float:  # ... and floats with 0
        return ("f", "nan" if x != x else 1 if x > 0 else 0 if x == 0 else -1)
    if t is str:   # minLength 1 is the only string rule below the node level
        return ("s", bool(x))
    if t is bytes:
        return ("b",)
    if t is dict:  # no node field accepts a map, whatever it holds
        return ("d",)
    if t is list:  # no node field accepts more than 32 items
        if len(x) > 33:
            return ("L",)
        return ("l",) + tuple(_scalar_class(v) if type(v) not in (list, dict) else ("c",)
                              for v in x)
    return None


def skeleton(node):
    """What the schema's verdict on one node depends on: its keys, its exact op and
    dtype (the schema's string enums), and each value's type and class against the
    schema's thresholds.  None: do not memoize."""
    if type(node) is not dict:
        return None
    parts = []
    for key, value in node.items():
        if type(key) is not str:
            return None
        if key in ("op", "dtype"):
            parts.append((key, value if type(value) is str else _scalar_class(value)))
        else:
            cls = _scalar_class(value)
            if cls is None:
                return None
            parts.append((key, cls))
    return tuple(sorted(parts, key=lambda kv: kv[0]))


@lru_cache(maxsize=1)
def schema_check() -> SchemaCheck:
    return SchemaCheck()


def _check_header(doc, source: str) -> None:
    if not isinstance(doc, dict):
        raise TapeFileError(f"not a gradtool tape file: the top level is {kind(doc)}, "
                            f"not a map", source=source)
    if "format" not in doc:
        raise TapeFileError("is missing: not a gradtool tape file", source=source, field="format")
    if doc["format"] != FORMAT:
        raise TapeFileError(f"not a gradtool tape file: format is {show(doc['format'])}, "
                            f"expected {FORMAT!r}", source=source, field="format")
    if "version" not in doc:
        raise TapeFileError("is missing", source=source, field="version")
    version = doc["version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise TapeFileError(f"expected an integer, got {kind(version)}", source=source,
                            field="version")
    if version != VERSION:
        raise TapeFileError(f"format version {version} is not supported "
                            f"(this reader knows version {VERSION})", source=source,
                            field="version")


def _schema_error(err, node, doc, source: str) -> TapeFileError:
    path = list(err.absolute_path)
    validator, expected, instance = err.validator, err.validator_value, err.instance
    if validator == "required":
        missing = next(p for p in expected if p not in instance)
        path, message = path + [missing], "is missing"
    elif validator == "type":
        names = expected if isinstance(expected, list) else [expected]
        message = (f"expected {' or '.join(_EXPECTED.get(n, n) for n in names)}, "
                   f"got {kind(instance)}")
    elif validator == "enum" and path == ["op"]:
        message = f"unknown op {show(instance)}"
    elif validator == "enum" and path == ["dtype"]:
        message = (f"unknown dtype {show(instance)} (this reader knows "
                   f"{' and '.join(repr(v) for v in expected)})")
    elif validator in ("enum", "const"):
        allowed = expected if validator == "enum" else [expected]
        message = f"must be {' or '.join(show(v) for v in allowed)}, got {show(instance)}"
    elif validator == "not":
        op = doc["nodes"][node].get("op") if node is not None else None
        message = f"is not allowed on {show(op)} nodes" if op is not None else "is not allowed"
    elif validator == "minimum":
        message = f"must be >= {expected}, got {show(instance)}"
    elif validator == "minItems":
        message = "must not be empty" if expected == 1 else f"needs at least {expected} items"
    elif validator == "maxItems":
        message = f"has {len(instance)} items; at most {expected} are allowed"
    elif validator == "minLength":
        message = "must not be empty"
    elif validator == "msgpackType":
        message = err.message
    else:
        message = show(err.message, 120)
    if not path:
        field = None
    else:
        field = str(path[0]) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                                       for p in path[1:])
    return TapeFileError(message, source=source, node=node, field=field)


# ── gate 3: semantic checks ────────────────────────────────────────────────

def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def check(doc, source: str, limits: Limits) -> CheckedFile:
    """Validate a decoded document completely; CheckedFile or TapeFileError."""
    _check_header(doc, source)
    first, node_index = schema_check().first_error(doc)
    if first is not None:
        raise _schema_error(first, node_index, doc, source)
    raw_nodes = doc["nodes"]
    if len(raw_nodes) > limits.max_nodes:
        raise TapeFileError(f"{len(raw_nodes)} nodes, over this reader's limit of "
                            f"{limits.max_nodes}", source=source, field="nodes")
    nodes, names = [], {}
    elements_total = work_total = 0
    for i, raw in enumerate(raw_nodes):
        node = _check_node(i, raw, nodes, names, source)
        elements = _prod(node.shape)
        elements_total += elements
        if elements_total > limits.max_elements:
            raise TapeFileError(
                f"shape {format_shape(node.shape)} brings the tape to {elements_total} elements, "
                f"over this reader's limit of {limits.max_elements}", source=source, node=i,
                field="shape")
        work_total += _work(node, nodes)
        if work_total > limits.max_work:
            raise TapeFileError(
                f"replaying the tape up to this {node.op} would take about {work_total} "
                f"operations, over this reader's limit of {limits.max_work}", source=source,
                node=i)
        nodes.append(node)
    loss = doc.get("loss", len(nodes) - 1)
    if loss >= len(nodes):
        raise TapeFileError(f"is node {loss}, but the tape has only {len(nodes)} nodes",
                            source=source, field="loss")
    if _prod(nodes[loss].shape) != 1:
        raise TapeFileError(f"is the loss, but a loss must have one element and this "
                            f"{nodes[loss].op} has shape {format_shape(nodes[loss].shape)}",
                            source=source, node=loss)
    if nodes[loss].dtype == INT_DTYPE:
        raise TapeFileError("is the loss, but it holds integer ids", source=source, node=loss)
    outputs = doc.get("outputs", {})
    for name, ref in outputs.items():
        if ref >= len(nodes):
            raise TapeFileError(f"is node {ref}, but the tape has only {len(nodes)} nodes",
                                source=source, field=f"outputs.{name}")
    return CheckedFile(nodes=nodes, loss=loss, outputs=dict(outputs), meta=doc.get("meta", {}),
                       optimizer=doc.get("optimizer"))


def _check_node(i: int, raw: dict, earlier: list, names: dict, source: str) -> CheckedNode:
    def bad(message, field=None):
        return TapeFileError(message, source=source, node=i, field=field)

    op = raw["op"]
    spec = OPS[op]
    a, b = raw.get("a", -1), raw.get("b", -1)
    for field, ref, used in (("a", a, spec.arity >= 1), ("b", b, spec.arity >= 2)):
        if not used:
            if ref != -1:
                raise bad(f"{op} takes {spec.arity} input{'s' * (spec.arity != 1)}, so '{field}' "
                          f"must be -1, got {ref}", field)
        elif ref < 0:
            raise bad(f"{op} needs an input here, got -1", field)
        elif ref == i:
            raise bad("the node refers to itself; inputs must be earlier nodes", field)
        elif ref > i:
            raise bad(f"refers to node {ref}, which comes later; inputs must be earlier nodes",
                      field)
    shape = tuple(raw["shape"])
    s = float(raw.get("s", 0.0))
    if op in LEAF_OPS:
        data = raw["data"]
        need = 8 * _prod(shape)
        if len(data) != need:
            raise bad(f"holds {len(data)} bytes, but shape {format_shape(shape)} needs {need} "
                      f"(8 per element)", "data")
        name = raw.get("name")
        if name is not None:
            if name in names:
                raise bad(f"{show(name)} is already the name of node {names[name]}", "name")
            names[name] = i
        l2 = float(raw.get("l2", 0.0))
        if not math.isfinite(l2):
            raise bad(f"must be finite, got {l2}", "l2")
        return CheckedNode(op, -1, -1, 0.0, shape, None, name=name, l2=l2, data=data,
                           dtype=raw.get("dtype", "f64"))

    for field, ref in (("a", a), ("b", b)):
        if ref >= 0 and (field in spec.int_inputs) != (earlier[ref].dtype == INT_DTYPE):
            raise bad(f"node {ref} holds integer ids (dtype {INT_DTYPE}), which only the ids "
                      f"input of take and take_along reads" if earlier[ref].dtype == INT_DTYPE
                      else f"{op} reads integer ids here, but node {ref} is not a const with "
                           f"dtype {INT_DTYPE}", field)
    attrs = _attrs(op, raw)
    sa = earlier[a].shape
    sb = earlier[b].shape if b >= 0 else None
    try:
        inferred = infer_shape(op, sa, sb, attrs)
    except ShapeError as exc:
        inputs = f"node {a} {format_shape(sa)}" + (f", node {b} {format_shape(sb)}" if b >= 0 else "")
        text = str(exc) if str(exc).startswith(op) else f"{op}: {exc}"
        raise bad(f"{text} (inputs {inputs})") from None
    if inferred != shape:
        raise bad(f"states {format_shape(shape)}, but {op} of its inputs gives "
                  f"{format_shape(inferred)}", "shape")
    if spec.int_inputs:
        ids = np.frombuffer(earlier[b].data, dtype="<i8")
        problem = bad_id(ids.reshape(earlier[b].shape), spec.index_bound(sa, attrs))
        if problem:
            raise bad(f"node {b}: {problem} for {op}'s input a {format_shape(sa)}", "b")
    value = raw.get("value")
    if value is not None and len(value) != 8 * _prod(shape):
        raise bad(f"holds {len(value)} bytes, but shape {format_shape(shape)} needs "
                  f"{8 * _prod(shape)}", "value")
    return CheckedNode(op, a, b, s, shape, attrs, value=value)


def _attrs(op: str, raw: dict) -> Optional[dict]:
    """The node's aux dict, built exactly as the Tape's recording methods build it (an
    optional attribute absent or at its default is left out)."""
    aux = {}
    for at in OPS[op].attrs:
        if not at.stored:
            aux[at.name] = list(raw["shape"])
        elif at.name in raw and not (at.optional and raw[at.name] == at.default
                                     and type(raw[at.name]) is type(at.default)):
            aux[at.name] = list(raw[at.name]) if at.kind == "indices" else raw[at.name]
    return aux or None


def _work(node: CheckedNode, earlier: list) -> int:
    """Rough operation count of computing this node: inner products for matmul/bmm."""
    if node.a < 0:
        return 0
    sa = earlier[node.a].shape
    if node.op == "matmul":
        return sa[0] * sa[1] * node.shape[1]
    if node.op == "bmm":
        return node.shape[0] * sa[1] * sa[2] * node.shape[2]
    sb = earlier[node.b].shape if node.b >= 0 else ()
    return max(_prod(node.shape), _prod(sa), _prod(sb))
