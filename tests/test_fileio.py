"""gradtool.fileio: atomic writes keep the old file, leave no temporary file, and every
failure names the user's path (never the temporary one)."""

import errno
import os

import pytest

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
