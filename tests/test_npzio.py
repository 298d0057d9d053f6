"""gradtool.npzio: the reproducible writer and the bounded reader of .npz files.

The reader must never allocate what a header merely claims: every hostile
file below is built so that np.load would try to allocate gigabytes (or
unpickle, or fail with a misleading message), and each must end in one
NpzError naming the file and the array, before any array data is read.
"""

import io
import os
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import assert_bits_equal
from gradtool.cli import main
from gradtool.npzio import MAX_DEFLATE_RATIO, NpzArchive, NpzError, write_npz

DIGITS = "samples/digits_mlp.msgpack"


def npy_bytes(array) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(array), allow_pickle=True)
    return buf.getvalue()


def lying_npy(shape, body: bytes) -> bytes:
    """An .npy whose header claims ``shape`` of float64, followed by ``body`` only."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "<f8", "fortran_order": False, "shape": tuple(shape)})
    return buf.getvalue() + body


def zip_of(path, members: dict, compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name, data in members.items():
            z.writestr(name, data)


def test_round_trip_stored_and_deflated(tmp_path, rng):
    arrays = {"x": rng.standard_normal((5, 3)), "y": np.arange(4, dtype=np.int32),
              "file": np.zeros((0, 2))}
    write_npz(tmp_path / "a.npz", arrays)
    np.savez_compressed(tmp_path / "b.npz", **{k: v for k, v in arrays.items() if k != "file"})
    for name in ("a.npz", "b.npz"):
        with NpzArchive(tmp_path / name) as archive:
            for key in archive:
                assert archive[key].shape == arrays[key].shape
                assert archive[key].dtype == arrays[key].dtype
                assert_bits_equal(archive.load(key), arrays[key], key)
    write_npz(tmp_path / "c.npz", arrays)           # reproducible: the same bytes again
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "c.npz").read_bytes()


def assert_npz_error(path, *fragments):
    """Opening the archive, or asking for its arrays, fails with one NpzError."""
    with pytest.raises(NpzError) as info:
        with NpzArchive(path) as archive:
            for name in archive:
                archive[name]
    message = str(info.value)
    assert message.startswith(str(path)), message
    for fragment in fragments:
        assert fragment in message, message


def test_a_header_claiming_more_than_the_file_holds(tmp_path):
    # 30 GiB claimed, 64 bytes held: np.load would allocate the 30 GiB first
    zip_of(tmp_path / "claim.npz", {"x.npy": lying_npy((10**9, 4), b"\0" * 64)})
    assert_npz_error(tmp_path / "claim.npz", "'x'", "[1000000000,4]", "29.8 GiB", "64 bytes")
    # one element short is also refused
    zip_of(tmp_path / "short.npz", {"x.npy": lying_npy((3,), b"\0" * 23)})
    assert_npz_error(tmp_path / "short.npz", "'x'", "[3]")


def test_a_deflated_member_claiming_more_than_deflate_can_expand(tmp_path):
    zip_of(tmp_path / "d.npz", {"x.npy": npy_bytes(np.zeros(100))}, zipfile.ZIP_DEFLATED)
    data = bytearray((tmp_path / "d.npz").read_bytes())
    with zipfile.ZipFile(tmp_path / "d.npz") as z:
        compressed = z.infolist()[0].compress_size
    claim = compressed * MAX_DEFLATE_RATIO + 1
    # the uncompressed size in the local header (offset 22) and the central directory (24)
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = data.index(signature) + offset
        data[at:at + 4] = struct.pack("<I", claim)
    (tmp_path / "d.npz").write_bytes(bytes(data))
    assert_npz_error(tmp_path / "d.npz", "'x'", "cannot hold")


def test_object_arrays_are_refused_not_unpickled(tmp_path):
    zip_of(tmp_path / "obj.npz", {"x.npy": npy_bytes(np.array([{"a": 1}, None], dtype=object))})
    assert_npz_error(tmp_path / "obj.npz", "'x'", "Python objects", "never unpickles")


def test_files_that_are_not_npz_archives(tmp_path):
    np.save(tmp_path / "plain.npy", np.zeros((3, 64)))
    assert_npz_error(tmp_path / "plain.npy", "single .npy array", "np.savez")
    (tmp_path / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    assert_npz_error(tmp_path / "picture.png", "not an .npz file")
    (tmp_path / "empty.npz").write_bytes(b"")
    assert_npz_error(tmp_path / "empty.npz", "not an .npz file")
    assert_npz_error(tmp_path / "missing.npz", "no such file")
    (tmp_path / "folder.npz").mkdir()
    assert_npz_error(tmp_path / "folder.npz", "is a directory")


def test_train_reports_a_lying_header_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    x = lying_npy((10**9, 64), b"\0" * 64)
    zip_of(tmp_path / "claim.npz", {"x.npy": x, "y.npy": npy_bytes(np.zeros((40, 10)))})
    result = CliRunner().invoke(main, ["train", DIGITS, "--data", str(tmp_path / "claim.npz")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "claim.npz: array 'x' claims shape [1000000000,64]" in lines[0]


# ── what is opened, and what is looked at ─────────────────────────────────

def test_only_regular_files_are_opened_and_a_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "pipe.npz"
    os.mkfifo(fifo)                            # no writer: a plain open() would block
    assert_npz_error(fifo, "is a pipe (FIFO), not a regular file")
    assert_npz_error(Path("/dev/zero"), "is a character device, not a regular file")


def test_arrays_nobody_asks_for_are_never_examined_or_unpickled(tmp_path):
    marker = tmp_path / "unpickled"

    class Boom:                                # unpickling this would create the marker
        def __reduce__(self):
            return (open, (str(marker), "w"))

    zip_of(tmp_path / "d.npz", {"x.npy": npy_bytes(np.arange(4.0)),
                                "junk.npy": npy_bytes(np.array([Boom()], dtype=object)),
                                "broken.npy": b"\x93NUMPY garbage",
                                "notes.txt": b"not an array"})
    with NpzArchive(tmp_path / "d.npz") as archive:
        assert sorted(archive) == ["broken", "junk", "x"]
        assert_bits_equal(archive.load("x"), np.arange(4.0), "x")
        with pytest.raises(NpzError, match="'junk' holds Python objects"):
            archive["junk"]
        with pytest.raises(NpzError, match="array 'broken' has .npy format version"):
            archive.load("broken")
    assert not marker.exists()


def test_write_npz_refuses_names_np_load_would_not_give_back(tmp_path):
    for name, why in (("a\x00b", "contains NUL"), ("x" * 65532, "65532 bytes in UTF-8"),
                      ("", "not a non-empty string"), (7, "not a non-empty string"),
                      ("\udc80", "not valid Unicode")):
        with pytest.raises(NpzError, match=why):
            write_npz(tmp_path / "g.npz", {name: np.zeros(1)})
    assert not (tmp_path / "g.npz").exists()
    write_npz(tmp_path / "g.npz", {"x" * 65531: np.zeros(1), "a/b é": np.ones(2)})
    with np.load(tmp_path / "g.npz") as z:
        assert sorted(z.files) == ["a/b é", "x" * 65531]


def test_a_directory_of_too_many_entries_is_refused_before_zipfile_reads_it(tmp_path,
                                                                             monkeypatch):
    import gradtool.npzio as npzio
    monkeypatch.setattr(npzio, "MAX_DIRECTORY", 1 << 20)
    for count in (30_000, 70_000):             # 70,000 entries need the zip64 record
        path = tmp_path / f"many{count}.npz"
        with zipfile.ZipFile(path, "w") as z:
            for i in range(count):
                z.writestr(f"a{i}.npy", b"")
        assert_npz_error(path, f"directory of {count} entries takes", "at most 1.0 MiB")
    monkeypatch.setattr(npzio, "MAX_DIRECTORY", 4 << 20)
    with NpzArchive(tmp_path / "many70000.npz") as archive:
        assert len(list(archive)) == 70_000
