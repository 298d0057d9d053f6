"""Gate 1 of reading a tape file (:mod:`gradtool.tapefile.checks`): the reader's
:class:`Limits` and bounded msgpack decoding.

:func:`decode` turns the bytes into Python objects with hard limits on string, bin,
array and map lengths, no extension types, string map keys only and a cap on the
number of containers; :func:`check_structure` then walks the nesting depth and value
types (of everything but the node maps, which gate 3 walks one by one unless plainly
flat).  Nothing is ever executed: msgpack is data only.  Re-exported from
:mod:`gradtool.tapefile.checks`.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from ..budget import DEFAULT_MEMORY
from ..errors import TapeFileError
from ..limits import MAX_DEPTH, MAX_MAP_LEN, MAX_NAME_BYTES

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
    max_work: int = 1 << 32           # element operations of one replay plus one backward
    max_memory: int = DEFAULT_MEMORY  # bytes of values, gradients and temporaries (budget.py)
    max_depth: int = MAX_DEPTH        # msgpack container nesting (the format itself needs 4)
    max_str_len: int = MAX_NAME_BYTES
    max_map_len: int = MAX_MAP_LEN
    max_containers: int = 1 << 22     # maps + arrays in the whole file


def show(x, limit: int = 60) -> str:
    """A short repr for messages: a hostile file may hold megabyte strings."""
    text = repr(x)
    return text if len(text) <= limit else text[:limit - 3] + "..."


_KIND = {dict: "a map", list: "an array", str: "a string", bytes: "bin", int: "an integer",
         float: "a float", bool: "a boolean", type(None): "nil"}


def kind(x) -> str:
    return _KIND.get(type(x), type(x).__name__)


class _TooManyContainers(Exception):
    pass


_NOT_CONTAINER_BYTES = bytes(x for x in range(256)
                             if not (0x80 <= x < 0xa0 or 0xdc <= x < 0xe0))


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

    # Each map or array starts with one of the bytes 0x80-0x9f or 0xdc-0xdf, so their
    # number in the file bounds the containers: a file with fewer than the limit (any
    # tape near the node limit) is decoded without a callback per container.
    hooks = {"object_hook": count, "list_hook": count}
    if len(raw) > limits.max_containers:
        # the file without every other byte value: a copy of its container bytes only
        if len(raw.translate(None, _NOT_CONTAINER_BYTES)) <= limits.max_containers:
            hooks = {}
    else:
        hooks = {}                    # fewer bytes than the limit: fewer containers too
    try:
        doc = msgpack.unpackb(
            raw, raw=False, strict_map_key=True, use_list=True, **hooks,
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
    check_structure(doc, source, limits, skip_nodes=True)
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


def check_structure(obj, source: str, limits: Limits, depth: int = 1,
                    skip_nodes: bool = False) -> None:
    """Nesting depth, value types and string keys, walked without recursion; ``depth`` is
    ``obj``'s own level.  ``skip_nodes``: leave the maps in the top-level ``nodes`` array to
    :func:`check`, which walks each one that is not plainly flat (see :func:`skeleton`)."""
    nodes = obj.get("nodes") if skip_nodes and type(obj) is dict else None
    stack = [(obj, depth)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            if level > limits.max_depth:
                raise TapeFileError(f"msgpack containers nested deeper than {limits.max_depth} "
                                    f"levels", source=source)
            if isinstance(item, dict):
                for key in item:
                    if not isinstance(key, str):
                        raise TapeFileError("msgpack map keys must be strings, found bin",
                                            source=source)
                items = item.values()
            elif item is nodes:
                items = [x for x in item if type(x) is not dict]
            else:
                items = item
            stack.extend((x, level + 1) for x in items if not isinstance(x, _LEAF_TYPES))
        elif not isinstance(item, _LEAF_TYPES):
            raise TapeFileError(f"unsupported msgpack value ({type(item).__name__})", source=source)
