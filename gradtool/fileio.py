"""Atomic file writes: a reader never sees a half-written file.

The bytes go to a temporary file in the destination's own directory (so the
final rename stays on one file system), are flushed and fsynced, and the
temporary file is then renamed over the destination with os.replace, which
is atomic on POSIX and Windows.  An interrupted write leaves the old file (or
no file) and at most a stray ``.<name>.*.tmp`` that is removed on failure.
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable


def atomic_write_bytes(path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write_with(path, lambda f: f.write(data))


def atomic_write_with(path, write: Callable) -> None:
    """Call ``write(binary_file)`` on a temporary file, then rename it onto ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                               dir=directory)
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
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
