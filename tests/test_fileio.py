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


# ── destinations that are not a file to replace, or not a binary file at all ───────────

def _tiny_tape():
    import numpy as np
    import gradtool as gt
    tp = gt.Tape()
    tp.sum(tp.param(np.ones(2), name="w"))
    return tp


@pytest.mark.parametrize("dest", ["text", "stdout", "no write", "closed", "read-only"])
def test_save_to_anything_but_a_binary_file_or_a_path_is_a_gradtool_error(tmp_path, dest):
    import io
    import gradtool as gt
    from gradtool.fileio import DestinationError
    closed = open(tmp_path / "closed.bin", "wb")
    closed.close()
    (tmp_path / "r.bin").write_bytes(b"")
    reader = open(tmp_path / "r.bin", "rb")
    target = {"text": io.StringIO(), "stdout": sys.stdout, "no write": object(),
              "closed": closed, "read-only": reader}[dest]
    with pytest.raises(gt.GradtoolError, match="a binary file .* or a path is needed") as info:
        gt.save(_tiny_tape(), target)
    assert isinstance(info.value, DestinationError)
    reader.close()
    assert (tmp_path / "r.bin").read_bytes() == b""
    buf = io.BytesIO()
    gt.save(_tiny_tape(), buf)
    assert gt.load(io.BytesIO(buf.getvalue())).tape.nodes[0].name == "w"


def test_writers_refuse_a_file_object_where_a_path_is_needed(tmp_path):
    import io
    import gradtool as gt
    from gradtool.npzio import write_npz
    for call in (lambda: write_npz(io.BytesIO(), {"a": [1.0]}),
                 lambda: atomic_write_bytes(io.StringIO(), b"x"),
                 lambda: atomic_write_bytes(str(tmp_path / "a\0b"), b"x")):
        with pytest.raises(gt.GradtoolError, match="a path .* is needed|NUL"):
            call()
    assert os.listdir(tmp_path) == []


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    import threading
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    atomic_write_bytes(fifo, b"through the pipe")
    reader.join(10)
    assert got == [b"through the pipe"]
    assert fifo.is_fifo() and os.listdir(tmp_path) == ["fifo"]


def test_a_link_stays_a_link_and_its_target_is_replaced(tmp_path):
    (tmp_path / "real.bin").write_bytes(b"old")
    os.symlink("real.bin", tmp_path / "link.bin")
    atomic_write_bytes(tmp_path / "link.bin", b"new")
    assert os.path.islink(tmp_path / "link.bin")
    assert (tmp_path / "real.bin").read_bytes() == b"new"


@pytest.mark.parametrize("argv", [["emit-cuda", "logistic.msgpack", "-o", "/dev/stdout"],
                                  ["backward", "logistic.msgpack", "-o", "/dev/stdout"]])
def test_dash_o_dev_stdout_writes_to_stdout_and_leaves_the_link(tmp_path, argv):
    from pathlib import Path
    samples = Path(__file__).resolve().parent.parent / "samples"
    out = tmp_path / "captured"
    with open(out, "wb") as f:
        done = subprocess.run([sys.executable, "-m", "gradtool", *argv], cwd=samples,
                              stdout=f, stderr=subprocess.PIPE, timeout=120)
    assert done.returncode == 0, done.stderr
    data = out.read_bytes()
    assert (b"gradtool_grad" in data) if argv[0] == "emit-cuda" else (b"PK\x03\x04" in data)
    assert os.path.islink("/dev/stdout")
