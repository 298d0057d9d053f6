"""Atomic file writes: a reader never sees a half-written file.

The bytes go to a temporary file in the destination's own directory (so the
final rename stays on one file system), are flushed and fsynced, and the
temporary file is then renamed over the destination with os.replace, which
is atomic on POSIX and Windows.  An interrupted write leaves the old file (or
no file) and at most a stray ``.<name>.*.tmp`` that is removed on failure.
"""

from __future__ import annotations

import errno
import os
import tempfile
from typing import Callable


def atomic_write_bytes(path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write_with(path, lambda f: f.write(data))


def check_writable(path) -> None:
    """Raise an OSError naming ``path`` (not a temporary file) now if an atomic write to
    it would fail: an empty name, a missing or read-only folder, a folder in its place."""
    path = os.fspath(path)
    if not path:
        raise FileNotFoundError(errno.ENOENT, "empty file name", path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(errno.ENOENT, "no such directory", path)
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory", path)
    if not os.access(directory, os.W_OK):
        raise PermissionError(errno.EACCES, f"cannot write in {directory}", path)


def atomic_write_with(path, write: Callable) -> None:
    """Call ``write(binary_file)`` on a temporary file, then rename it onto ``path``."""
    path = os.fspath(path)
    check_writable(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
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
