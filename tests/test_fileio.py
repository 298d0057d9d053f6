"""gradtool.fileio: atomic writes keep the old file, leave no temporary file, and every
failure names the user's path (never the temporary one); the temporary files of killed
writers (a checkpoint, a kernel-cache build) are removed by the next writer."""

import ctypes
import errno
import os
import subprocess
import sys
import time

import pytest

from conftest import require_c_compiler
from gradtool import native
from gradtool.fileio import atomic_write_bytes, atomic_write_with, check_writable


def test_replaces_atomically_with_the_umask_mode(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    assert os.listdir(tmp_path) == ["f.bin"]


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"),
                                     KeyboardInterrupt(), ValueError("a bug in the writer")])
def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path, failure):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")

    def write(f):
        f.write(b"half of the new")
        raise failure

    with pytest.raises(type(failure)) as info:
        atomic_write_with(target, write)
    if isinstance(failure, OSError):
        assert info.value.filename == str(target) and info.value.errno == errno.ENOSPC
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f.bin"]


def test_unwritable_targets_are_named_before_anything_is_written(tmp_path):
    (tmp_path / "folder").mkdir()
    cases = {"": "empty file name", str(tmp_path / "no" / "f"): "no such directory",
             str(tmp_path / "folder"): "is a directory"}
    for path, why in cases.items():
        with pytest.raises(OSError) as info:
            check_writable(path)
        assert info.value.filename == path and info.value.strerror == why
        with pytest.raises(OSError):
            atomic_write_bytes(path, b"x")
    assert os.listdir(tmp_path) == ["folder"]


# ── temporary files of killed writers ─────────────────────────────────────

def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_writers_temporary_is_removed_by_the_next_write(tmp_path):
    target = tmp_path / "ckpt.msgpack"
    stray = tmp_path / f".ckpt.msgpack.{dead_pid()}.ab12cd34.tmp"
    stray.write_bytes(b"half a checkpoint")           # what SIGKILL mid-write leaves
    alive = tmp_path / f".ckpt.msgpack.{os.getpid()}.zz99yy88.tmp"
    alive.write_bytes(b"a write in progress")
    mine = tmp_path / ".ckpt.msgpack.backup.tmp"      # not a name mkstemp would make
    mine.write_bytes(b"the user's")
    other = tmp_path / f".other.{dead_pid()}.ab12cd34.tmp"
    other.write_bytes(b"another file's")
    atomic_write_bytes(target, b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [target.name, alive.name, mine.name, other.name])


def test_the_kernel_cache_removes_temporaries_of_killed_builds(tmp_path, monkeypatch):
    require_c_compiler()
    monkeypatch.setenv("GRADTOOL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    source = tmp_path / "one.c"
    source.write_text("double one(void) { return 1.0; }\n")
    dead = tmp_path / "cache" / f"gt_kernels_f64_0123.{dead_pid()}.ab12cd34.tmp.so"
    old = tmp_path / "cache" / "gt_old_4567.q1w2e3r4.tmp.so"         # no pid, an hour old
    live = tmp_path / "cache" / f"gt_other_89ab.{os.getpid()}.zz99yy88.tmp.so"
    for path in (dead, old, live):
        path.write_bytes(b"\x7fELF half")
    os.utime(old, (time.time() - 3600,) * 2)
    built = native.build("one", source, native.SAFE_FLAGS)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([built.name,
                                                                            live.name])
    assert ctypes.CDLL(str(built))
