"""Gate 2 of reading a tape file (:mod:`gradtool.tapefile.checks`): the format tag and
version, then the JSON Schema (``gradtool/schemas/tape.schema.json``) through the
``jsonschema`` library, its first violation a :class:`TapeFileError` naming the node
and field.

A node whose :func:`skeleton` matches one already found valid is not validated again
(:class:`SchemaCheck`), and the document's own fields are checked without jsonschema
where plainly valid (:func:`plain_top`).  Re-exported from
:mod:`gradtool.tapefile.checks`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Optional

from ..errors import TapeFileError
from .decode import FORMAT, VERSION, Limits, check_structure, kind, show

_EXPECTED = {"object": "a map", "array": "an array", "string": "a string",
             "integer": "an integer", "number": "a number", "boolean": "a boolean"}


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

    def top_error(self, doc):
        """The first violation of the document without its nodes, or None."""
        return next(self.top.iter_errors(doc), None)

    def node_error(self, node, source: str = "", limits: Optional["Limits"] = None):
        """The first schema violation in one node, or None.  A node not known valid by
        its skeleton is first walked by :func:`check_structure` (TapeFileError)."""
        key = skeleton(node)
        if key is not None and key in self.valid_skeletons:
            return None
        check_structure(node, source, limits or Limits(), depth=3)
        err = next(self.node.iter_errors(node), None)
        if err is None and key is not None and len(self.valid_skeletons) < self.MEMO_LIMIT:
            self.valid_skeletons.add(key)
        return err

    def first_error(self, doc) -> tuple:
        """(jsonschema error, node index or None), or (None, None) when the document is valid."""
        err = self.top_error(doc)
        if err is not None:
            return err, None
        for i, node in enumerate(doc["nodes"]):
            err = self.node_error(node)
            if err is not None:
                return err, i
        return None, None


_INT_CLASS = {-1: ("i", -1), 0: ("i", 0), 1: ("i", 1)}


def _scalar_class(x):
    """A scalar's class against the schema's thresholds; None for a container."""
    t = type(x)
    if t is int:    # the schema compares ints with -1, 0 and 1 only
        return _INT_CLASS.get(x) or (("i", 1) if x > 1 else ("i", -2))
    if t is float:  # ... and floats with 0
        return ("f", "nan" if x != x else 1 if x > 0 else 0 if x == 0 else -1)
    if t is str:    # minLength 1 is the only string rule below the node level
        return ("s", bool(x))
    if t is bytes:
        return ("b",)
    if x is None or t is bool:
        return ("v", x)
    return None


def skeleton(node):
    """What the schema's verdict on one node depends on: its keys, its exact op and
    dtype (the schema's string enums), and each value's type and class against the
    schema's thresholds.

    None (do not memoize; validate in full) for anything but a map whose values are
    scalars or flat arrays of at most 33 scalars: a node holding a nested container is
    walked by :func:`check_structure` every time.  (A bin key makes a skeleton too, but
    never a valid one: the structure walk refuses it.)"""
    if type(node) is not dict:
        return None
    classes = []
    for value in node.values():
        t = type(value)
        if t is int:
            cls = _INT_CLASS.get(value) or (("i", 1) if value > 1 else ("i", -2))
        elif t is list:
            if len(value) > 33:     # no node field accepts more than 32 items
                return None
            cls = ("l",)
            for item in value:
                item_cls = _scalar_class(item)
                if item_cls is None:
                    return None
                cls += (item_cls,)
        elif t is str:              # the schema checks strings for being non-empty only
            cls = ("s", bool(value))   # (but the op and dtype enums: whole, below)
        else:
            cls = _scalar_class(value)
            if cls is None:
                return None
        classes.append(cls)
    op, dtype = node.get("op"), node.get("dtype")
    return (tuple(node), tuple(classes), op if type(op) is str else None,
            dtype if type(dtype) is str else None)


@lru_cache(maxsize=1)
def schema_check() -> SchemaCheck:
    return SchemaCheck()


def _node_id(x) -> bool:
    return type(x) is int and x >= 0


# The schema's tests of the document's own fields (without the nodes' items: those are
# plain_node's and the schema's), for plain_top; tests/test_tapefile.py checks the keys
# against the schema's and the verdicts against jsonschema's on mutated documents.
_TOP_REQUIRED = ("format", "version", "nodes")


_TOP_TESTS = {
    "format": lambda x: type(x) is str and x == FORMAT,
    "version": lambda x: type(x) is int and x == VERSION,
    "nodes": lambda x: type(x) is list and len(x) >= 1,
    "loss": _node_id,
    "outputs": lambda x: type(x) is dict and all(map(_node_id, x.values())),
    "state": lambda x: type(x) is dict and all(type(v) is str and v != "" for v in x.values()),
    "meta": lambda x: type(x) is dict,
    "optimizer": lambda x: type(x) is dict,
    "numerics": lambda x: type(x) is int and x >= 1,
}


def plain_top(doc) -> bool:
    """Whether the document without its nodes' items is plainly valid: True only where
    the schema says so (then jsonschema, 0.2 s to import and build, is not needed for a
    file whose nodes are all plain), False where it may not (then it decides)."""
    return (type(doc) is dict and all(key in doc for key in _TOP_REQUIRED)
            and all(test(doc[key]) for key, test in _TOP_TESTS.items() if key in doc))


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
        known = [repr(v) for v in expected]
        message = (f"unknown dtype {show(instance)} (this reader knows "
                   f"{', '.join(known[:-1])} and {known[-1]})")
    elif validator in ("enum", "const"):
        allowed = expected if validator == "enum" else [expected]
        message = f"must be {' or '.join(show(v) for v in allowed)}, got {show(instance)}"
    elif validator == "not":
        op = doc["nodes"][node].get("op") if node is not None else None
        message = f"is not allowed on {show(op)} nodes" if op is not None else "is not allowed"
    elif validator == "minimum":
        message = f"must be >= {expected}, got {show(instance)}"
    elif validator == "maximum":
        message = f"must be <= {expected}, got {show(instance)}"
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
