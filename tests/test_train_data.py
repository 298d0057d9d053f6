"""Training data from DATA.npz, --val and the tape's meta: regular files only, within the
memory budget, and arrays that name no slot ignored (docs/training.md)."""

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import msgpack
import numpy as np
import pytest
from support import DIGITS, DIGITS_DATA, assert_one_line_error, run

def one_line(result) -> str:
    return assert_one_line_error(result, 2)


def with_meta_val(tmp_path, val) -> Path:
    doc = msgpack.unpackb(DIGITS.read_bytes())
    doc["meta"]["train"] = {**doc["meta"]["train"], "val": str(val)}
    path = tmp_path / "tape.msgpack"
    path.write_bytes(msgpack.packb(doc, use_bin_type=True))
    return path


def test_meta_val_that_is_a_device_or_a_fifo_is_one_line_not_a_hang(tmp_path):
    fifo = tmp_path / "val.npz"
    os.mkfifo(fifo)
    for val, what in ((Path("/dev/zero"), "is a character device"),
                      (fifo, "is a pipe (FIFO)")):
        tape = with_meta_val(tmp_path, val)
        # a real process with a timeout: a hang would be the failure
        result = subprocess.run([sys.executable, "-m", "gradtool", "train", str(tape),
                                 "--data", str(DIGITS_DATA)], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 2 and result.stdout == "", result.stderr
        line = result.stderr.splitlines()[-1]
        assert line == (f"gradtool: {tape}: meta 'train' 'val': {val}: {what}, not a regular "
                        f"file; training data must be an .npz file")


def test_a_fifo_as_data_is_refused_too(tmp_path):
    os.mkfifo(tmp_path / "data.npz")
    assert "is a pipe (FIFO)" in one_line(run("train", DIGITS, "--data", tmp_path / "data.npz"))


def npy(array) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(array), allow_pickle=True)
    return buf.getvalue()


def test_unrelated_arrays_in_data_are_ignored_even_object_arrays(tmp_path):
    marker = tmp_path / "unpickled"

    class Boom:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    with np.load(DIGITS_DATA) as d:
        slots = {name: d[name] for name in d.files}
    path = tmp_path / "data.npz"
    with zipfile.ZipFile(path, "w") as z:
        for name, array in slots.items():
            z.writestr(f"{name}.npy", npy(array))
        z.writestr("labels_text.npy", npy(np.array([Boom(), "seven"], dtype=object)))
        z.writestr("broken.npy", b"\x93NUMPY\x01\x00")
    clean = run("train", DIGITS, "--data", DIGITS_DATA, "--epochs", "1")
    result = run("train", DIGITS, "--data", path, "--epochs", "1")
    assert result.exit_code == 0, result.output
    def losses(text):                  # the epoch lines without their timings
        return [line.rsplit("  (", 1)[0] for line in text.splitlines()]

    assert losses(result.stdout) == losses(clean.stdout)
    assert not marker.exists()
    # an object array that DOES name a slot is refused, still without unpickling
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", npy(np.array([Boom()], dtype=object)))
        z.writestr("y.npy", npy(slots["y"]))
    assert "array 'x' holds Python objects" in one_line(run("train", DIGITS, "--data", path))
    assert not marker.exists()


def test_training_data_must_fit_the_memory_budget(tmp_path):
    line = one_line(run("--max-memory", "500K", "train", DIGITS, "--data", DIGITS_DATA))
    assert line == (f"gradtool: {DIGITS_DATA}: the input slots' arrays (x [1477,64], "
                    f"y [1477,10]) take 853.9 KiB as float64 or int64, over the memory limit of "
                    f"500.0 KiB (gradtool --max-memory SIZE raises it)")
    assert run("--max-memory", "2M", "train", DIGITS, "--data", DIGITS_DATA,
               "--steps", "1").exit_code == 0


# ── a NUL byte in a file name ─────────────────────────────────────────────────

def _with_meta_val(tmp_path, val):
    doc = msgpack.unpackb(Path(DIGITS).read_bytes())
    doc["meta"]["train"]["val"] = val
    path = tmp_path / "nul-val.msgpack"
    path.write_bytes(msgpack.packb(doc, use_bin_type=True))
    return path


def test_a_nul_in_meta_val_is_one_line_exit_2_before_any_data_is_read(tmp_path):
    path = _with_meta_val(tmp_path, "held\0out.npz")
    # the training data does not exist: the NUL is reported first, so nothing was opened
    result = run("train", path, "--data", tmp_path / "missing.npz")
    line = assert_one_line_error(result, 2, "meta 'train' key 'val' must be a file name",
                                 "without NUL bytes", "'held\\x00out.npz'")
    assert line.startswith(f"gradtool: {path}: ")


@pytest.mark.parametrize("argv", [
    ["train", DIGITS, "--data", "digits\0.npz"],
    ["train", DIGITS, "--data", DIGITS_DATA, "--val", "v\0.npz"],
    ["train", DIGITS, "--data", DIGITS_DATA, "--save", "out\0.msgpack"],
    ["train", DIGITS, "--data", DIGITS_DATA, "--log", "log\0.jsonl"],
    ["inspect", "tape\0.msgpack"],
    ["backward", DIGITS, "-o", "g\0.npz"],
    ["emit-cuda", "tape\0.msgpack", "-o", "out.cu"],
])
def test_a_nul_in_any_command_line_path_is_one_line_exit_2(tmp_path, argv):
    result = run(*argv)
    assert_one_line_error(result, 2, "NUL byte")
    assert os.listdir(tmp_path) == []


def test_library_paths_with_a_nul_are_gradtool_errors(tmp_path):
    import gradtool as gt
    from gradtool.npzio import NpzArchive, write_npz
    from gradtool.train import TrainOptions, Trainer
    tf = gt.load(DIGITS)
    calls = {
        "load": lambda: gt.load("a\0b.msgpack"),
        "save": lambda: gt.save(tf.tape, str(tmp_path / "a\0b.msgpack"), loss=tf.loss),
        "npz read": lambda: NpzArchive("d\0.npz"),
        "npz write": lambda: write_npz(str(tmp_path / "g\0.npz"), {"a": np.ones(1)}),
        "trainer data": lambda: Trainer(tf, "d\0.npz", TrainOptions()),
        "trainer val": lambda: Trainer(tf, DIGITS_DATA, TrainOptions(val="v\0.npz")),
        "trainer save": lambda: Trainer(tf, DIGITS_DATA, TrainOptions(save="s\0.msgpack")),
    }
    for what, call in calls.items():
        with pytest.raises(gt.GradtoolError, match="NUL") as info:
            call()
        assert "embedded null" not in str(info.value), what
    assert os.listdir(tmp_path) == []
