"""Reading a tape file without trusting it: bounded reading, the checks, the replay."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
from typing import Optional

from ..errors import TapeError, TapeFileError
from ..fileio import NUL_IN_NAME
from .checks import Limits, check, decode
from .replay import TapeFile, replay
from .scan import scan

_DEFAULT = Limits()


def load(src, *, name: Optional[str] = None, max_elements: int = _DEFAULT.max_elements,
         limits: Optional[Limits] = None) -> TapeFile:
    """Read and validate a tape file, then replay it into a fresh Tape.

    src: a path, bytes, or a binary file object.  name: what error messages
    call the file (default: the path, or ``<stdin>`` for a file object).
    max_elements bounds the total element count of all nodes; ``limits``
    (a :class:`Limits`) sets every bound at once.  Raises TapeFileError,
    whose message reads ``FILE: node N: field 'x': problem``.
    """
    limits = limits or _DEFAULT
    if max_elements != _DEFAULT.max_elements:
        limits = dataclasses.replace(limits, max_elements=max_elements)
    raw, source = _read(src, name, limits)
    with gc_paused():
        return replay(check_bytes(raw, source, limits), source)


def check_bytes(raw: bytes, source: str, limits: Limits):
    """The checked file of ``raw``: decoded by :func:`gradtool.tapefile.scan.scan` where it
    can (a tape of mostly plain nodes), else by :func:`~.checks.decode`; the checks and
    their messages are the same either way."""
    found = scan(raw, source, limits)
    if found is None:
        return check(decode(raw, source, limits), source, limits)
    return check(found[0], source, limits, found[1])


@contextlib.contextmanager
def gc_paused():
    """Python's cycle collector off for a while: a tape of a million nodes is millions of
    new containers, and the collector would walk them all again and again (it frees
    nothing here: decoded files and tapes hold no reference cycles).

    At the end, what the pause left in the young generations (a million Nodes) moves to
    the oldest one as it is (``gc.freeze()`` then ``gc.unfreeze()``: two list splices),
    unless something else holds objects frozen: else the first allocation after the
    pause would start a young collection walking all of it (0.2 s for a million Nodes),
    and a middle one would walk it again soon after.  Every object stays collectable;
    the next full collection looks at them, as at any old object."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        if was_enabled:
            gc.enable()


def _read(src, name: Optional[str], limits: Limits) -> tuple:
    if isinstance(src, (bytes, bytearray, memoryview)):
        raw, source = bytes(src), name or "<bytes>"
    elif isinstance(src, (str, os.PathLike)):
        source = name or os.fspath(src)
        if "\0" in os.fsdecode(src):
            raise TapeFileError(f"cannot read: {NUL_IN_NAME}", source=repr(source)[1:-1])
        try:
            with open(src, "rb") as f:
                raw = _read_bounded(f, source, limits)
        except OSError as exc:
            raise TapeFileError(f"cannot read: {exc.strerror or exc}", source=source) from None
    elif hasattr(src, "read"):
        source = name or "<stdin>"
        try:
            raw = _read_bounded(src, source, limits)
        except OSError as exc:
            raise TapeFileError(f"cannot read: {exc.strerror or exc}", source=source) from None
    else:
        raise TapeError(f"load: expected a path, bytes or a binary file, got {type(src).__name__}")
    if len(raw) > limits.max_bytes:
        raise TapeFileError(f"{len(raw)} bytes, over this reader's limit of {limits.max_bytes}",
                            source=source)
    return raw, source


_CHUNK = 1 << 24


def _read_bounded(f, source: str, limits: Limits) -> bytes:
    """Never more than the limit plus one byte, in chunks: ``f.read(limit + 1)`` would
    ask for a buffer of the limit's size (1 GiB) whatever the file holds."""
    chunks, total = [], 0
    while total <= limits.max_bytes:
        chunk = f.read(min(_CHUNK, limits.max_bytes + 1 - total))
        if isinstance(chunk, str):
            raise TapeFileError("opened in text mode; tape files are binary", source=source)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limits.max_bytes:
        raise TapeFileError(f"larger than this reader's limit of {limits.max_bytes} bytes",
                            source=source)
    return b"".join(chunks)




__all__ = ["load", "check_bytes", "gc_paused"]
