"""Decoding a tape at the node limit without a Python object per plain node.

:func:`gradtool.tapefile.checks.decode` hands the whole file to msgpack, which builds
a dict per node (1.5 s for a million of them) that the checks then read column by
column.  :func:`scan` recognises, with numpy over the file's bytes, the nodes written
in the one encoding gradtool's writer gives a plain unary node:

    fixmap(5) "op": <a run op's name> "a": <uint> "b": -1 "s": <float64 | fixint>
              "shape": fixarray(1..15) of <uint >= 1>

(the keys in this order; ints in any of msgpack's unsigned forms up to 32 bits), and
returns their fields as columns; every other node, and the rest of the document, is
decoded by msgpack with the same limits as :func:`~.checks.decode`.  Such an encoding
is self-delimiting and decodes to exactly one map, so a node at a node boundary that
matches it is the map msgpack would build; the walk over the node array only starts a
match at the end of the previous node, so bytes that look like a node inside another
node's data are never taken for one.

:func:`scan` returns None, and the caller decodes the whole file with
:func:`~.checks.decode`, whenever anything is not plainly fine (a decoding error, a
duplicate top-level key, limits tighter than such a node needs, too many containers,
few plain nodes): the fast path never raises, so every message stays the one the
general path gives.
"""

from __future__ import annotations

import io
from bisect import bisect_left
from dataclasses import dataclass
from typing import Optional

import msgpack
import numpy as np

from .checks import _NOT_CONTAINER_BYTES, PLAIN, Limits, check_structure
from .runs import _RUN_OPS

SCAN_MIN = 1 << 14                # fewer nodes: decode as usual
_TAIL = 256                       # more than a plain node's encoding reads (< 160 bytes)
_SHAPE_KEY = bytes([0xa5]) + b"shape"


@dataclass
class Scanned:
    """The plain nodes :func:`scan` found: ``index`` (their node ids, increasing), per
    node its op code (an index into ``ops``), a, s, shape id (an index into
    ``shapes``, the distinct shapes as lists of ints, or None where a dim is not
    >= 1), and the byte range ``start:end`` of its encoding (to decode it by msgpack
    where the general path needs the map)."""

    index: np.ndarray
    code: np.ndarray
    a: np.ndarray
    s: np.ndarray
    shape_id: np.ndarray
    shapes: list
    start: np.ndarray
    end: np.ndarray
    ops: list
    others: list                  # the other nodes, decoded, in order
    raw: bytes

    def node_map(self, i: int) -> dict:
        """Node ``i``'s map, decoded by msgpack from its bytes (node i is a plain one)."""
        row = int(np.searchsorted(self.index, i))
        return msgpack.unpackb(self.raw[int(self.start[row]):int(self.end[row])], raw=False,
                               strict_map_key=True)


def _unpack_kwargs(raw_len: int, limits: Limits) -> dict:
    # the same bounds as checks.decode
    return dict(raw=False, strict_map_key=True, use_list=True,
                max_str_len=limits.max_str_len, max_bin_len=raw_len,
                max_array_len=max(limits.max_nodes, 64), max_map_len=limits.max_map_len,
                max_ext_len=0)


def scan(raw: bytes, source: str, limits: Limits):
    """(document, :class:`Scanned`) with :data:`PLAIN` in the node list where a plain
    node is, or None: decode the file with :func:`~.checks.decode`."""
    try:
        return _scan(raw, source, limits)
    except Exception:             # anything unexpected: the general path decides
        return None


def _scan(raw: bytes, source: str, limits: Limits):
    size = len(raw)
    if (type(raw) is not bytes or size < 32 * SCAN_MIN or limits.max_depth < 4
            or limits.max_map_len < 5 or limits.max_str_len < 16
            or max(limits.max_nodes, 64) < 15):
        return None
    if size > limits.max_containers and \
            len(raw.translate(None, _NOT_CONTAINER_BYTES)) > limits.max_containers:
        return None               # checks.decode counts them and names the problem
    kwargs = _unpack_kwargs(size, limits)
    stream = io.BytesIO(raw)

    def unpacker(at: int):
        stream.seek(at)
        return msgpack.Unpacker(stream, max_buffer_size=max(size, 1 << 20), **kwargs)

    top = unpacker(0)
    count = top.read_map_header()
    if count > limits.max_map_len:
        return None
    doc, at, scanned = {}, 0, None
    for _ in range(count):
        key = top.unpack()
        if type(key) is not str or key in doc:
            return None
        if key != "nodes":
            doc[key] = top.unpack()
            continue
        length = top.read_array_header()
        if length > max(limits.max_nodes, 64) or length < SCAN_MIN:
            return None
        begin = at + top.tell()
        found = _nodes(raw, begin, length, unpacker)
        if found is None:
            return None
        doc[key], scanned, end = found
        at, top = end, unpacker(end)
    if at + top.tell() != size or scanned is None:
        return None               # extra data (or no node list): the general path says so
    rest = dict(doc)
    rest["nodes"] = [x for x in scanned.others if type(x) is not dict]
    check_structure(rest, source, limits, skip_nodes=True)
    return doc, scanned


def _nodes(raw: bytes, begin: int, length: int, unpacker):
    """(node list, Scanned, end offset) of the node array whose first node starts at
    ``begin``, or None."""
    if raw.count(b"\xa1b\xff\xa1s", begin) < length // 2:
        return None               # few nodes with b -1: mostly other nodes (a quick count)
    cand = _candidates(raw, begin, 2 * length + 1024)
    if cand is None:
        return None               # the bytes of a node's start everywhere: not worth it
    starts, ends = cand["start"], cand["end"]
    if len(starts) < length // 2:
        return None               # mostly other nodes: one msgpack call decodes faster
    # a block: candidates each starting where the previous one ends
    breaks = np.flatnonzero(ends[:-1] != starts[1:]).tolist() + [len(starts) - 1]
    start_list = starts           # a list once there are other nodes (bisect on a list)
    nodes = [None] * length
    index_parts, cand_parts = [], []
    pos, i, others = begin, 0, []
    stretch = None                # the Unpacker of a stretch of other nodes
    while i < length:
        j = bisect_left(start_list, pos)
        if j < len(starts) and start_list[j] == pos:
            k = breaks[bisect_left(breaks, j)]          # the block's last candidate
            m = min(k - j + 1, length - i)
            index_parts.append(np.arange(i, i + m))
            cand_parts.append(np.arange(j, j + m))
            nodes[i:i + m] = [PLAIN] * m
            i += m
            pos = int(ends[j + m - 1])
            stretch = None
            continue
        if start_list is starts:
            start_list = starts.tolist()
        if stretch is None:
            stretch, stretch_at = unpacker(pos), pos
        node = nodes[i] = stretch.unpack()
        others.append(node)
        pos = stretch_at + stretch.tell()
        i += 1
        if len(others) > length // 2:
            return None
    chosen = np.concatenate(cand_parts)
    shape_key = cand["shape_key"][chosen]
    long_keys = cand["shape_key2"][chosen]
    if long_keys.any():
        keys = np.stack([shape_key, long_keys], axis=1).view("V16").ravel()
    else:
        keys = shape_key
    if len(keys) and (keys == keys[0]).all():        # mostly: one shape
        first, shape_id = np.zeros(1, dtype=np.int64), np.zeros(len(keys), dtype=np.int64)
    else:
        _, first, shape_id = np.unique(keys, return_index=True, return_inverse=True)
    shape_start, shape_end = cand["shape_start"][chosen], ends[chosen]
    shapes = []
    for k in first.tolist():
        dims = msgpack.unpackb(raw[int(shape_start[k]):int(shape_end[k])])
        shapes.append(dims if min(dims) >= 1 else None)
    scanned = Scanned(index=np.concatenate(index_parts), code=cand["code"][chosen],
                      a=cand["a"][chosen], s=cand["s"][chosen],
                      shape_id=shape_id.reshape(-1).astype(np.int64), shapes=shapes,
                      start=starts[chosen], end=ends[chosen], ops=list(_RUN_OPS),
                      others=others, raw=raw)
    return nodes, scanned, pos


_NAME_KEYS = {}
for _code, _name in enumerate(_RUN_OPS):
    _b = _name.encode()
    assert len(_b) <= 9
    _NAME_KEYS[int.from_bytes(_b[:8].ljust(8, b"\0"), "little")] = (_code, len(_b),
                                                                  _b[8] if len(_b) > 8 else 0)
_KEYS_SORTED = np.array(sorted(_NAME_KEYS), dtype=np.uint64)
_KEY_CODE = np.array([_NAME_KEYS[k][0] for k in sorted(_NAME_KEYS)], dtype=np.int64)
_KEY_LEN = np.array([_NAME_KEYS[k][1] for k in sorted(_NAME_KEYS)], dtype=np.int64)
_KEY_NINTH = np.array([_NAME_KEYS[k][2] for k in sorted(_NAME_KEYS)], dtype=np.int64)


# per count 0..8: a mask of a word's low ``count`` bytes
_LOW_BYTES = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)
# per type byte: how many big-endian bytes follow in msgpack's unsigned forms (positive
# fixint: none; uint 8/16/32), -1 for any other type byte
_UINT_BYTES = np.full(256, -1, dtype=np.int64)
_UINT_BYTES[:0x80] = 0
_UINT_BYTES[0xcc], _UINT_BYTES[0xcd], _UINT_BYTES[0xce] = 1, 2, 4


def _word(text: bytes) -> tuple:
    """(value, mask) of up to 8 bytes as a little-endian word, to compare with."""
    return np.uint64(int.from_bytes(text, "little")), np.uint64((1 << (8 * len(text))) - 1)


def _views(buf: np.ndarray) -> tuple:
    """The 8 bytes and the 4 bytes at each position of ``buf`` (as far as they are
    inside it) as one little-endian word (unaligned views, stride 1)."""
    words = np.ndarray(shape=(len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))
    quads = np.ndarray(shape=(len(buf) - 3,), dtype="<u4", buffer=buf, strides=(1,))
    return words, quads


_NODE_START = int.from_bytes(b"\x85\xa2op", "little")
_CHUNK = 1 << 20


def _starts(quads: np.ndarray, begin: int, end: int, most: int) -> Optional[np.ndarray]:
    """The positions ``begin <= p < end`` where a map of 5 starts with the key "op", or
    None where there are more than ``most`` (booleans for a chunk of the file at a time,
    then positions only)."""
    parts, count = [], 0
    for at in range(begin, end, _CHUNK):
        found = np.flatnonzero(quads[at:min(at + _CHUNK, end)] == _NODE_START)
        count += len(found)
        if count > most:
            return None
        parts.append(found + at)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _uint(buf: np.ndarray, quads: np.ndarray, pos: np.ndarray):
    """msgpack unsigned ints at ``pos`` (positive fixint, uint 8/16/32): (value, bytes,
    ok)."""
    t = buf[pos]
    follow = _UINT_BYTES[t]
    if not follow.any():                        # all positive fixints
        return t.astype(np.int64), np.ones(len(pos), dtype=np.int64), follow == 0
    # the 4 bytes after the type byte as a big-endian number, less its unused low bytes
    big = quads[pos + 1].byteswap().astype(np.int64)
    value = np.where(follow == 0, t, big >> (32 - 8 * np.maximum(follow, 1)))
    return value, follow + 1, follow >= 0


def _candidates(raw: bytes, begin: int, most: int) -> Optional[dict]:
    """Every position at or after ``begin`` where a plain node's encoding (the module
    doc) starts, with its fields and end, in increasing order of position (but in the
    file's last ``_TAIL`` bytes: the nodes there are decoded by msgpack); None where more
    than ``most`` positions start like a node (a map of 5 whose first key is "op")."""
    buf = np.frombuffer(raw, dtype=np.uint8)
    words, quads = _views(buf)
    p = _starts(quads, begin, len(raw) - _TAIL, most)   # every read below stays inside
    if p is None:
        return None
    # a block of candidates at a time: the temporaries stay in the cache
    parts = [_fields(buf, words, quads, p[at:at + _BLOCK])
             for at in range(0, len(p), _BLOCK)] or [_fields(buf, words, quads, p)]
    if len(parts) == 1:
        return parts[0]
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}


_BLOCK = 1 << 15


def _fields(buf: np.ndarray, words: np.ndarray, quads: np.ndarray, p: np.ndarray) -> dict:
    """The candidates at ``p`` that are a plain node's encoding, and their fields."""
    # every field read at every candidate, its offsets bounded (so inside the file), and
    # the candidates that fail any test dropped once at the end
    name_len = buf[p + 4].astype(np.int64) - 0xa0
    ok = (name_len >= 1) & (name_len <= 9)
    name_len = np.where(ok, name_len, 1)
    key = words[p + 5] & _LOW_BYTES[np.minimum(name_len, 8)]
    slot = np.minimum(np.searchsorted(_KEYS_SORTED, key), len(_KEYS_SORTED) - 1)
    ninth = np.where(name_len > 8, buf[p + 13], 0)
    ok &= (_KEYS_SORTED[slot] == key) & (_KEY_LEN[slot] == name_len) & (_KEY_NINTH[slot] == ninth)
    code = _KEY_CODE[slot]
    q = p + 5 + name_len
    key_a, mask_a = _word(b"\xa1a")
    ok &= (quads[q] & np.uint32(mask_a)) == np.uint32(key_a)
    a, width, good = _uint(buf, quads, q + 2)
    ok &= good
    q = q + 2 + np.maximum(width, 1)
    key_bs, mask_bs = _word(b"\xa1b\xff\xa1s")
    ok &= (words[q] & mask_bs) == key_bs
    q = q + 5
    t = buf[q]
    is_float = t == 0xcb
    ok &= is_float | (t < 0x80)
    s = np.where(is_float, words[q + 1].byteswap().view(np.float64), t)  # big-endian float64
    q = q + np.where(is_float, 9, 1)
    key_shape, mask_shape = _word(_SHAPE_KEY)
    ok &= (words[q] & mask_shape) == key_shape
    shape_start = q + 6
    header = buf[shape_start].astype(np.int64)
    ok &= (header >= 0x91) & (header <= 0x9f)
    dims = np.where(ok, header - 0x90, 0)
    q = shape_start + 1
    for k in range(int(dims.max(initial=0))):
        more = dims > k
        _, width, good = _uint(buf, quads, q)
        ok &= ~more | good
        q = q + np.where(more & good, width, 0)
    shape_len = q - shape_start
    ok &= shape_len <= 16
    sel = np.flatnonzero(ok)
    if len(sel) == len(p):          # mostly: every candidate
        sel = slice(None)
    shape_start, shape_len = shape_start[sel], shape_len[sel]
    return {"start": p[sel], "end": q[sel], "code": code[sel], "a": a[sel], "s": s[sel],
            "shape_start": shape_start,
            "shape_key": words[shape_start] & _LOW_BYTES[np.minimum(shape_len, 8)],
            "shape_key2": words[shape_start + 8] & _LOW_BYTES[np.maximum(shape_len - 8, 0)]}


__all__ = ["scan", "Scanned", "PLAIN"]
