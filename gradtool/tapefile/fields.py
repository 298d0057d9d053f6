"""The fields of a tape file's node map: ONE table, from the op table, that every node's
checks follow.

For each key it says the value's type (its JSON Schema, and the same test as a plain
Python predicate), the ops whose nodes may carry it, and those whose nodes must.  The
schema (``python -m gradtool.codegen`` renders :func:`schema_properties` and
:func:`schema_rules` into ``schemas/tape.schema.json``), the loader's fast path
(:func:`gradtool.tapefile.checks.plain_node`, through :data:`FIELD_TESTS`) and the node
table of docs/format.md (``tests/test_tapefile_fields.py`` compares its "on" column with
:data:`NODE_FIELDS`) all come from here, so no op can accept a value another refuses
(``"value": nil`` on one op but not on another, ``"name": nil`` on a param).

msgpack nil is no field's type: a field is either absent (its default) or holds a value
of its type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from ..limits import MAX_DIMS
from ..ops import FLOAT_DTYPES, INT_DTYPE, OPS

LEAVES = tuple(n for n, s in OPS.items() if s.kind == "leaf")
OP_NODES = tuple(n for n in OPS if n not in LEAVES)
SCALAR_OPS = tuple(n for n, s in OPS.items() if s.scalar_operand)
INT_READERS = tuple(n for n, s in OPS.items() if s.int_inputs)   # ops reading integer data


def _int(x) -> bool:
    return type(x) is int


def _number(x) -> bool:
    return type(x) is float or type(x) is int


def _dims(minimum: int) -> Callable:
    def test(x) -> bool:
        return (type(x) is list and 0 < len(x) <= MAX_DIMS
                and all(type(d) is int and d >= minimum for d in x))
    return test


@dataclass(frozen=True)
class Field:
    """One key of a node map."""

    key: str
    test: Callable            # the schema's type and range test, as a predicate
    ops: tuple                # the ops whose nodes may carry it
    required: tuple           # the ops whose nodes must carry it
    schema: dict              # its JSON Schema (without the "where" rules)


def _attribute_fields() -> list:
    """The stored attributes (axis, keepdims, starts, stops, ...), from the op table."""
    owners, required, kinds = {}, {}, {}
    for name, spec in OPS.items():
        for at in spec.attrs:
            if at.stored and at.name != "dtype":     # cast's dtype: the dtype field
                owners.setdefault(at.name, []).append(name)
                required.setdefault(at.name, [])
                if at.file_required:
                    required[at.name].append(name)
                kinds[at.name] = at
    out = []
    for aname, ops in owners.items():
        at = kinds[aname]
        base = {"axis": {"type": "integer", "minimum": 0},
                "count": {"type": "integer", "minimum": 1},
                "natural": {"type": "integer", "minimum": 0, "maximum": 2 ** 63 - 1},
                "flag": {"type": "boolean"}}.get(at.kind, {"$ref": "#/$defs/indices"})
        test = {"axis": lambda x: type(x) is int and x >= 0,
                "count": lambda x: type(x) is int and x >= 1,
                "natural": lambda x: type(x) is int and 0 <= x < 2 ** 63,
                "flag": lambda x: type(x) is bool}.get(at.kind, _dims(0))
        docs = sorted({a.doc.split(";")[0] for op in ops for a in OPS[op].attrs
                       if a.name == aname})
        text = f"{'/'.join(ops)}: {' / '.join(docs)}."
        optional = [op for op in ops if op not in required[aname]]
        if optional:
            absent = {json.dumps(a.default) for op in optional for a in OPS[op].attrs
                      if a.name == aname}
            text += f" Optional on {'/'.join(optional)}: absent means {'/'.join(sorted(absent))}."
        out.append(Field(aname, test, tuple(ops), tuple(required[aname]),
                         dict(base, description=text)))
    return out


def _fields() -> list:
    every = tuple(OPS)
    return [
        Field("op", lambda x: type(x) is str and x in OPS, every, every,
              {"enum": list(OPS)}),
        Field("a", lambda x: type(x) is int and x >= -1, every, (),
              {"$ref": "#/$defs/inputId", "description": "First input; default -1 (leaves)."}),
        Field("b", lambda x: type(x) is int and x >= -1, every, (),
              {"$ref": "#/$defs/inputId", "description": "Second input (binary ops); default -1."}),
        # s is 0 on every op but the scalar ones (a rule of its own, below)
        Field("s", _number, every, (),
              {"type": "number", "description": f"The scalar operand of "
               f"{'/'.join(SCALAR_OPS)}; 0.0 (the default) otherwise."}),
        Field("shape", _dims(1), every, every,
              {"$ref": "#/$defs/dims",
               "description": "The node's value shape; for reshape, the target shape."}),
        Field("dtype", lambda x: x == "f64" or x == "f32" or x == INT_DTYPE,
              ("param", "const", "cast"), ("cast",),
              {"enum": ["f64", "f32", INT_DTYPE],
               "description": f"param/const: the element type of data; default f64. f32: "
                              f"IEEE binary32 values (4 bytes an element). {INT_DTYPE} "
                              f"(const only): integer data, read only by "
                              f"{'/'.join(INT_READERS)} "
                              f"(ids of {'/'.join(n for n, s in OPS.items() if s.id_inputs)}). "
                              f"cast (required there): its target, f32 or f64. Every other "
                              f"node's dtype follows from its inputs' (docs/ops.md)."}),
        Field("data", lambda x: type(x) is bytes, LEAVES, LEAVES,
              {"$ref": "#/$defs/leafBytes",
               "description": "The leaf's value (param/const only, required there)."}),
        Field("name", lambda x: type(x) is str and x != "", LEAVES, (),
              {"type": "string", "minLength": 1,
               "description": "Leaf name, unique in the file (param/const only)."}),
        Field("l2", lambda x: _number(x) and not x < 0, ("param",), (),
              {"type": "number", "minimum": 0,
               "description": "Weight-decay coefficient (param only); default 0.0."}),
        *_attribute_fields(),
        Field("value", lambda x: type(x) is bytes, OP_NODES, (),
              {"$ref": "#/$defs/float64Bytes",
               "description": "Optional on op nodes: the value recorded at write time "
                              "(for --verify)."}),
    ]


NODE_FIELDS = {f.key: f for f in _fields()}

# op -> {key: predicate} for the keys that op's nodes may carry
FIELD_TESTS = {op: {f.key: f.test for f in NODE_FIELDS.values() if op in f.ops} for op in OPS}
REQUIRED = {op: tuple(f.key for f in NODE_FIELDS.values() if op in f.required) for op in OPS}


def schema_properties() -> dict:
    """The node map's "properties" in the JSON Schema."""
    return {f.key: f.schema for f in NODE_FIELDS.values()}


def schema_rules() -> list:
    """The node map's "allOf": where each field may (and must) appear, from the table."""
    fields = NODE_FIELDS

    def absent(keys):
        return {"properties": {k: {"not": {}} for k in keys}}

    def cond(ops):
        return {"properties": {"op": {"const": ops[0]} if len(ops) == 1
                               else {"enum": list(ops)}}}

    leaf_only = [k for k, f in fields.items() if set(f.ops) <= set(LEAVES)]
    assert fields["data"].required == LEAVES and fields["value"].ops == OP_NODES
    assert fields["dtype"].ops == ("param", "const", "cast") and fields["l2"].ops == ("param",)
    rules = [
        {"if": {"properties": {"op": {"enum": list(LEAVES)}}},
         "then": {"required": [k for k in fields if fields[k].required == LEAVES
                               and k not in ("op", "shape")],
                  **absent(["value"])},
         "else": absent(leaf_only)},
        {"if": {"properties": {"op": {"const": "const"}}},
         "then": absent(["l2"])},
        {"if": {"properties": {"op": {"const": "param"}}},
         "then": {"properties": {"dtype": {"enum": list(FLOAT_DTYPES)}}}},
        {"if": {"properties": {"op": {"const": "cast"}}},
         "then": {"required": ["dtype"], "properties": {"dtype": {"enum": list(FLOAT_DTYPES)}}},
         "else": {"if": {"properties": {"op": {"enum": list(LEAVES)}}},
                  "else": absent(["dtype"])}},
        {"if": cond(SCALAR_OPS), "else": {"properties": {"s": {"const": 0}}}},
    ]
    # attributes the same ops carry get one rule: required where every node has them,
    # absent on every other op; an attribute some ops may omit gets the two halves apart
    groups: dict = {}
    for key, f in fields.items():
        if key in ("op", "a", "b", "s", "shape", "dtype", "data", "name", "l2", "value"):
            continue
        groups.setdefault((f.ops, f.required), []).append(key)
    for (ops, required), names in groups.items():
        if ops == required:
            rules.append({"if": cond(ops), "then": {"required": names}, "else": absent(names)})
            continue
        if required:
            rules.append({"if": cond(required), "then": {"required": names}})
        rules.append({"if": cond(ops), "else": absent(names)})
    return rules


def node_field_problem(op: str, key: str, value) -> str:
    """Why ``value`` cannot be the field ``key`` of an ``op`` node, or "" (for tests and
    messages; the loader's general path reports through the schema)."""
    f = NODE_FIELDS.get(key)
    if f is None:
        return ""                   # a key this reader does not know: ignored
    if op not in f.ops:
        return f"is not allowed on {op} nodes"
    if not f.test(value):
        return "has the wrong type or range"
    return ""


__all__ = ["Field", "NODE_FIELDS", "FIELD_TESTS", "REQUIRED", "LEAVES", "OP_NODES",
           "SCALAR_OPS", "INT_READERS", "schema_properties", "schema_rules",
           "node_field_problem"]
