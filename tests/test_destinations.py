"""A file a command writes (``--save``, ``--plot``, every ``-o``) must be a regular file or
a new name: a FIFO (the write waited for a reader forever), a socket, a directory or a
device is refused in one line, exit 2, before anything is read or trained, and nothing
is left behind.  Links are followed (a link to a regular file is fine, the link stays).

Each refusal runs in a real process with a timeout: a hang is the failure."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gradtool.errors import GradtoolError

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
DIGITS, DIGITS_DATA = SAMPLES / "digits_mlp.msgpack", SAMPLES / "digits.npz"

COMMANDS = {
    "train --save": ["train", str(DIGITS), "--data", str(DIGITS_DATA), "--epochs", "1",
                     "--save"],
    "train --plot": ["train", str(DIGITS), "--data", str(DIGITS_DATA), "--epochs", "1",
                     "--plot"],
    "backward -o": ["backward", str(SAMPLES / "logistic.msgpack"), "-o"],
    "emit-cuda -o": ["emit-cuda", str(SAMPLES / "logistic.msgpack"), "-o"],
    # the check comes before the spec is even read: no torch needed
    "import-torch -o": ["import-torch", "model.py:build", "-o"],
}

KINDS = {"fifo": "is a pipe (FIFO)", "socket": "is a socket", "directory": "is a directory",
         "/dev/null": "is a character device", "link to a fifo": "is a pipe (FIFO)"}


@pytest.fixture
def place():
    """A short folder (a unix socket's path is limited to about 100 bytes)."""
    folder = tempfile.mkdtemp(prefix="gt-dest-", dir="/tmp")
    yield Path(folder)
    shutil.rmtree(folder)


def make(place: Path, kind: str):
    """(the path to give, the open socket to close afterwards or None)."""
    if kind == "/dev/null":
        return Path("/dev/null"), None
    target = place / "out"
    if kind in ("fifo", "link to a fifo"):
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(target))
        return target, sock
    if kind == "link to a fifo":
        os.symlink("out", place / "link")
        return place / "link", None
    return target, None


def refused(argv, path, needle, cwd) -> str:
    before = sorted(os.listdir(cwd))
    proc = subprocess.run([sys.executable, "-m", "gradtool", *argv, str(path)], cwd=cwd,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stderr)
    assert len(lines) == 1, proc.stderr
    flag = argv[-1] if argv[-1].startswith("--") else "--output"
    plain = "" if needle == "is a directory" else ", not a regular file"
    assert lines[0] == f"gradtool: {flag} {path}: {needle}{plain}"
    assert sorted(os.listdir(cwd)) == before          # nothing left behind
    return lines[0]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_writer_refuses_a_fifo_at_once(place, command):
    path, _ = make(place, "fifo")
    refused(COMMANDS[command], path, KINDS["fifo"], place)
    assert path.is_fifo()


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "fifo"])
@pytest.mark.parametrize("command", ["train --save", "backward -o"])
def test_a_socket_a_directory_a_device_or_a_link_to_a_fifo_is_refused(place, command, kind):
    path, sock = make(place, kind)
    try:
        refused(COMMANDS[command], path, KINDS[kind], place)
    finally:
        if sock is not None:
            sock.close()


def test_a_link_to_a_file_and_a_new_name_are_written(place):
    (place / "real.msgpack").write_bytes(b"old")
    os.symlink("real.msgpack", place / "link.msgpack")
    for out in ("link.msgpack", "new.msgpack"):
        proc = subprocess.run([sys.executable, "-m", "gradtool", "train", str(DIGITS),
                               "--data", str(DIGITS_DATA), "--steps", "1", "--save", out],
                              cwd=place, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.returncode == 0, proc.stderr
    assert os.path.islink(place / "link.msgpack")
    assert (place / "real.msgpack").read_bytes()[:1] != b"o"       # replaced by a tape
    assert sorted(os.listdir(place)) == ["link.msgpack", "new.msgpack", "real.msgpack"]


def test_the_library_refuses_a_fifo_checkpoint_before_training(place):
    from gradtool.tapefile import load
    from gradtool.train import TrainOptions, train
    path, _ = make(place, "fifo")
    with pytest.raises(GradtoolError, match=r"--save .*out: is a pipe \(FIFO\), not a regular"):
        train(load(DIGITS), DIGITS_DATA, TrainOptions(steps=1, save=str(path)))
