"""Atomic file writes: a reader never sees a half-written file.

The bytes go to a temporary file in the destination's own directory (so the
final rename stays on one file system), are flushed and fsynced, and the
temporary file is then renamed over the destination with os.replace, which
is atomic on POSIX and Windows.  An interrupted write leaves the old file (or
no file); the temporary ``.<name>.<pid>.<random>.tmp`` is removed on failure,
and one a killed process (SIGKILL) left behind is removed by the next write of
the same file (:func:`remove_stale_temporaries`).
"""

from __future__ import annotations

import errno
import io
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from .errors import GradtoolError


class DestinationError(GradtoolError):
    """Something to write to that is neither a path nor a binary file object."""


NUL_IN_NAME = "a file name cannot contain a NUL byte"


def nul_free(path, what: str = "") -> str:
    """``path`` as a str, or a GradtoolError (not the ValueError ``open`` raises deep in a
    read or a write) when it contains a NUL byte: no file system has such a name, and
    the message names the place the path came from (``what``: ``--val``, ``meta 'train'
    key 'val'``)."""
    text = os.fsdecode(path)
    if "\0" in text:
        raise PathError(f"{what + ' ' if what else ''}{text!r}: {NUL_IN_NAME}")
    return text


class PathError(GradtoolError):
    """A file name that cannot name a file (a NUL byte in it)."""


def is_path(dest) -> bool:
    return isinstance(dest, (str, bytes, os.PathLike))


def check_binary_writer(dest, what: str = "write") -> None:
    """Raise DestinationError unless ``dest`` is a writable binary file object: a text
    stream (``io.StringIO``, ``sys.stdout``), a file opened for reading, a closed file
    or an object without ``write`` would otherwise fail deep inside the writer, or
    after a part was written."""
    kind = type(dest).__name__
    need = "a binary file (opened 'wb', io.BytesIO) or a path is needed"
    mode = getattr(dest, "mode", None)
    if isinstance(dest, io.TextIOBase) or (isinstance(mode, str) and "b" not in mode):
        raise DestinationError(f"{what}: {kind} is a text stream; {need}")
    if not callable(getattr(dest, "write", None)):
        raise DestinationError(f"{what}: {kind} has no write method; {need}")
    if getattr(dest, "closed", False) is True:
        raise DestinationError(f"{what}: the {kind} is closed; {need}")
    writable = getattr(dest, "writable", None)
    if callable(writable):
        try:
            ok = writable()
        except (ValueError, TypeError):        # closed; or a class, not a file
            ok = False
        if not ok:
            raise DestinationError(f"{what}: the {kind} is not open for writing; {need}")


def _stream_destination(path: str) -> bool:
    """A path that names a stream rather than a file to replace: a FIFO, a device, a
    socket, or anything under /dev or /proc (``/dev/stdout`` is a link to the caller's
    stdout, which may be a plain file: renaming over the link would replace it)."""
    if os.path.abspath(path).startswith(("/dev/", "/proc/")):
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)

# what a path is, when it is not a regular file (its mode after following links)
NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a pipe (FIFO)"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"))


def not_regular(mode: int) -> Optional[str]:
    """What a file of this ``st_mode`` is ("a pipe (FIFO)", ...), or None for a regular
    file."""
    for test, what in NOT_REGULAR:
        if test(mode):
            return what
    return None if stat.S_ISREG(mode) else "not a regular file"


def check_regular_destination(path, what: str = "") -> None:
    """Raise :class:`DestinationError` now, before any work, when ``path`` names something
    a file cannot be written over: a FIFO (a write would wait for a reader forever), a
    socket, a directory or a device (``/dev/null`` would swallow a checkpoint).  Links are
    followed: a new name, or a link to a regular file (or to a new name) is fine, and
    the atomic write then keeps the link and replaces its target.  ``what`` names the
    option (``--save``) in the message."""
    text = nul_free(path, what)
    try:
        mode = os.stat(text).st_mode
    except OSError:             # a new file, or a folder problem check_writable words
        return
    kind = not_regular(mode)
    if kind is not None:
        plain = "" if kind == "a directory" else ", not a regular file"
        raise DestinationError(f"{what + ' ' if what else ''}{text}: is {kind}{plain}")


_MKSTEMP_RANDOM = r"[a-z0-9_]{8}"          # what tempfile.mkstemp puts between prefix and suffix


def temporary_prefix(name: str) -> str:
    """The prefix of this process's temporary files for ``name``: ``name.<pid>.``."""
    return f"{name}.{os.getpid()}."


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:             # someone else's process (EPERM): alive
        return True
    return True


def remove_stale_temporaries(directory, name: Optional[str], suffix: str,
                             older_than: Optional[float] = None) -> list:
    """Remove the temporary files ``<name>.<pid>.<random><suffix>`` in ``directory`` whose
    process is gone; with ``older_than`` (seconds), also any ``<name>.<random><suffix>``
    or ``<name>.<pid>.<random><suffix>`` older than that.  ``name=None``: any name.
    Returns the removed paths."""
    head = re.escape(name) if name is not None else r".+?"
    pattern = re.compile(head + r"\.(?:(\d+)\.)?" + _MKSTEMP_RANDOM + re.escape(suffix) + "$")
    removed, now = [], time.time()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None:
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            dead = match.group(1) is not None and not _process_alive(int(match.group(1)))
            old = older_than is not None and \
                now - entry.stat(follow_symlinks=False).st_mtime > older_than
            if dead or old:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:         # removed by another process already, or not ours to remove
            pass
    return removed


def atomic_write_bytes(path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write_with(path, lambda f: f.write(data))


def check_writable(path) -> None:
    """Raise an OSError naming ``path`` (not a temporary file) now if an atomic write to
    it would fail: an empty name, a missing or read-only folder, a folder in its place."""
    path = os.fspath(path)
    if not path:
        raise FileNotFoundError(errno.ENOENT, "empty file name", path)
    if "\0" in os.fsdecode(path):
        raise FileNotFoundError(errno.ENOENT, NUL_IN_NAME, path)
    if _stream_destination(path):
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(errno.ENOENT, "no such directory", path)
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory", path)
    if not os.access(directory, os.W_OK):
        raise PermissionError(errno.EACCES, f"cannot write in {directory}", path)


def atomic_write_with(path, write: Callable) -> None:
    """Call ``write(binary_file)`` on a temporary file, then rename it onto ``path``.

    A path to a stream (a FIFO, ``/dev/stdout``: see :func:`_stream_destination`) is
    written directly, as there is no file to replace; a symbolic link to a file is
    followed, so the link stays and its target is replaced."""
    if not is_path(path):
        raise DestinationError(f"write: a path (str or os.PathLike) is needed, got "
                               f"{type(path).__name__}")
    path = nul_free(path)
    if _stream_destination(path):
        with open(path, "wb") as f:
            write(f)
        return
    if os.path.islink(path):
        path = os.path.realpath(path)
    check_writable(path)
    directory = os.path.dirname(os.path.abspath(path))
    hidden = "." + os.path.basename(path)
    remove_stale_temporaries(directory, hidden, ".tmp")
    try:
        fd, tmp = tempfile.mkstemp(prefix=temporary_prefix(hidden), suffix=".tmp",
                                   dir=directory)
    except OSError as exc:        # report the user's file, not the temporary one
        raise OSError(exc.errno, exc.strerror, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; give the file the mode a plain open() would have
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.errno is not None:   # a full disk, say
            raise OSError(exc.errno, exc.strerror, path) from None
        raise
