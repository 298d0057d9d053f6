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
