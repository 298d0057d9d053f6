"""``.npz`` archives: a reproducible atomic writer and a bounded reader.

Writing: ``np.savez`` stamps every member with the current time (so the same
arrays never give the same bytes twice) and takes the arrays as keyword
arguments (so an array named ``file`` collides with its first parameter).
:func:`write_npz` takes a plain dict, uses a fixed timestamp and a fixed
member order, and goes through :func:`gradtool.fileio.atomic_write_with`.
The result is an ordinary npz that ``np.load`` reads.

Reading: ``np.load`` allocates whatever an array's header claims before it
reads a byte of data (a 4 KB file whose header says [10^9, 4] asks for 30
GiB), and turns a stray ``.npy``, a picture or a pickle into puzzling
messages.  :class:`NpzArchive` opens regular files only (a FIFO would hang
the reader, ``/dev/zero`` would never end), reads the zip directory (at most
:data:`MAX_DIRECTORY` bytes of it), and
reads an array's header only when the caller asks for that array
(``archive[name]``): arrays nobody asks for are never examined, whatever
they hold.  A header's claims are checked against what the archive can
really hold (the member's stored bytes, or for a deflated member deflate's
ceiling of 1032:1 on its compressed bytes), object arrays are refused
(gradtool never unpickles), and the array itself is read only when
:meth:`NpzArchive.load` asks for it -- after the caller has checked its
shape.
"""

from __future__ import annotations

import math
import os
import stat
import struct
import zipfile
from dataclasses import dataclass

import numpy as np

from .budget import human_bytes
from .errors import GradtoolError
from .fileio import NUL_IN_NAME, atomic_write_with

_EPOCH = (1980, 1, 1, 0, 0, 0)          # the earliest time a zip entry can carry
# zipfile turns every entry of the central directory into a ZipInfo (about ten times
# the entry's 46+ bytes): a bound on the directory bounds that memory
MAX_DIRECTORY = 1 << 24
NPY_MAGIC = b"\x93NUMPY"
# deflate cannot expand more than 1032:1 (a 258-byte match costs at least 2 bits)
MAX_DEFLATE_RATIO = 1032
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}


MAX_MEMBER_NAME = 0xFFFF                 # bytes: a zip header's 16-bit name length


def member_name_problem(name) -> str:
    """Why ``name`` cannot be an array name in an npz (so that ``np.load`` gives it back
    under the same key), or "" when it can."""
    if not isinstance(name, str) or not name:
        return "it is not a non-empty string"
    if "\0" in name:
        return "it contains NUL, where zip member names end"
    try:
        size = len(name.encode("utf-8")) + len(".npy")
    except UnicodeEncodeError:
        return "it is not valid Unicode text"
    if size > MAX_MEMBER_NAME:
        return f"it is {size - 4} bytes in UTF-8; a zip member name holds {MAX_MEMBER_NAME - 4}"
    return ""


def write_npz(path, arrays: dict) -> None:
    """Write ``{name: array}`` to ``path`` as an uncompressed npz, atomically.

    Every name must come back from ``np.load`` as itself (:func:`member_name_problem`);
    otherwise NpzError before anything is written."""
    for name in arrays:
        problem = member_name_problem(name)
        if problem:
            raise NpzError(f"{os.fspath(path)}: cannot store an array named {_short(name)}: "
                           f"{problem}")

    def write(f):
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as archive:
            for name, array in arrays.items():
                info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
                info.external_attr = 0o644 << 16
                with archive.open(info, "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
    atomic_write_with(path, write)


class NpzError(GradtoolError):
    """An .npz file that cannot be read as arrays of numbers, or an array name that
    cannot be written."""


def _short(name, limit: int = 40) -> str:
    text = repr(name)
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass(frozen=True)
class NpzMember:
    """One array's header: what :meth:`NpzArchive.load` will return, before reading it."""

    name: str
    shape: tuple
    dtype: np.dtype
    info: zipfile.ZipInfo

    @property
    def ndim(self) -> int:
        return len(self.shape)


_KINDS = ((stat.S_ISDIR, "is a directory, not an .npz file"),
          (stat.S_ISFIFO, "is a pipe (FIFO), not a regular file"),
          (stat.S_ISCHR, "is a character device, not a regular file"),
          (stat.S_ISBLK, "is a block device, not a regular file"),
          (stat.S_ISSOCK, "is a socket, not a regular file"))


class NpzArchive:
    """An .npz opened for reading; use as a context manager.

    ``name in archive``, ``iter(archive)`` (array names), ``archive[name]``
    (an :class:`NpzMember`: shape and dtype, from the array's header, read and
    checked on first use) and ``archive.load(name)`` (the array).  Every
    failure is an :class:`NpzError` naming the file (and the array).
    """

    def __init__(self, path):
        self.source = os.fspath(path)
        if "\0" in os.fsdecode(self.source):
            raise NpzError(f"{self.source!r}: cannot read: {NUL_IN_NAME}")
        self._file = self._open()
        try:
            self._check_directory()
            self._zip = zipfile.ZipFile(self._file)
            self._infos = {info.filename[:-len(".npy")]: info for info in self._zip.infolist()
                           if info.filename.endswith(".npy")}
        except NpzError:
            self.close()
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, NotImplementedError,
                struct.error) as exc:
            self.close()
            raise NpzError(f"{self.source}: cannot read as a .npz file ({exc})") from None
        self._members = {}

    def _check_directory(self) -> None:
        """The central directory's size, from the end-of-central-directory record (and its
        zip64 twin), within :data:`MAX_DIRECTORY` before zipfile reads it."""
        f = self._file
        size = f.seek(0, os.SEEK_END)
        tail_start = max(0, size - (22 + 0xFFFF))          # the record and a maximal comment
        f.seek(tail_start)
        tail = f.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) < at + 22:
            return                                         # zipfile says what is wrong
        entries, directory = struct.unpack("<HI", tail[at + 10:at + 16])
        locator = at - 20
        if (entries == 0xFFFF or directory == 0xFFFFFFFF) and locator >= 0 \
                and tail[locator:locator + 4] == b"PK\x06\x07":
            f.seek(struct.unpack("<Q", tail[locator + 8:locator + 16])[0])
            record = f.read(56)
            if len(record) == 56 and record[:4] == b"PK\x06\x06":
                entries, directory = struct.unpack("<QQ", record[32:48])
        if directory > MAX_DIRECTORY:
            raise NpzError(f"{self.source}: the archive's directory of {entries} entries takes "
                           f"{human_bytes(directory)}; gradtool reads at most "
                           f"{human_bytes(MAX_DIRECTORY)} of it (an .npz of training arrays "
                           f"has a few entries)")
        f.seek(0)

    def _open(self):
        src = self.source
        try:
            # O_NONBLOCK: opening a FIFO for reading must not wait for a writer
            fd = os.open(src, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                         | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise NpzError(f"{src}: no such file") from None
        except IsADirectoryError:
            raise NpzError(f"{src}: is a directory, not an .npz file") from None
        except OSError as exc:
            raise NpzError(f"{src}: cannot read: {exc.strerror or exc}") from None
        mode = os.fstat(fd).st_mode
        for test, what in _KINDS:
            if test(mode):
                os.close(fd)
                raise NpzError(f"{src}: {what}; training data must be an .npz file")
        f = os.fdopen(fd, "rb")
        try:
            if f.read(len(NPY_MAGIC)) == NPY_MAGIC:
                raise NpzError(f"{src}: a single .npy array, not an .npz archive (save one "
                               f"array per input slot with np.savez)")
            f.seek(0)
            if not zipfile.is_zipfile(f):
                raise NpzError(f"{src}: not an .npz file (an .npz is a zip archive of .npy "
                               f"arrays, as np.savez writes)")
            f.seek(0)
        except BaseException:
            f.close()
            raise
        return f

    def _read_header(self, name: str) -> NpzMember:
        src, info = self.source, self._infos[name]
        if info.compress_type == zipfile.ZIP_STORED:
            ceiling = info.compress_size
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            ceiling = info.compress_size * MAX_DEFLATE_RATIO
        else:
            raise NpzError(f"{src}: array {name!r} uses zip compression method "
                           f"{info.compress_type}; np.savez writes stored or deflated members")
        if info.file_size > ceiling:
            raise NpzError(f"{src}: array {name!r} claims {human_bytes(info.file_size)} but "
                           f"its {human_bytes(info.compress_size)} in the archive cannot hold "
                           f"that")
        try:
            with self._zip.open(info) as stream:
                version = np.lib.format.read_magic(stream)
                reader = _HEADER_READERS.get(version)
                if reader is None:
                    raise NpzError(f"{src}: array {name!r} has .npy format version "
                                   f"{version[0]}.{version[1]}; gradtool reads 1.0 and 2.0")
                shape, _fortran, dtype = reader(stream)
                header_bytes = stream.tell()
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, NotImplementedError) as exc:
            raise NpzError(f"{src}: array {name!r} cannot be read ({exc})") from None
        if dtype.hasobject:
            raise NpzError(f"{src}: array {name!r} holds Python objects (pickled data); "
                           f"gradtool reads arrays of numbers and never unpickles")
        claimed = math.prod(shape) * dtype.itemsize
        held = info.file_size - header_bytes
        if claimed > held:
            dims = ",".join(str(d) for d in shape)
            raise NpzError(f"{src}: array {name!r} claims shape [{dims}] of {dtype} "
                           f"({human_bytes(claimed)}) but the file holds "
                           f"{human_bytes(max(held, 0))} of it")
        return NpzMember(name, tuple(shape), dtype, info)

    # ── the mapping ──────────────────────────────────────────────────────────
    def __contains__(self, name) -> bool:
        return name in self._infos

    def __iter__(self):
        return iter(self._infos)

    def __getitem__(self, name) -> NpzMember:
        """The array's header, read and checked now (once); KeyError if there is none."""
        member = self._members.get(name)
        if member is None:
            member = self._members[name] = self._read_header(name)
        return member

    def load(self, name: str) -> np.ndarray:
        """Read one array (its size checked against the archive first)."""
        member = self[name]
        try:
            with self._zip.open(member.info) as stream:
                return np.lib.format.read_array(stream, allow_pickle=False)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise NpzError(f"{self.source}: array {name!r} cannot be read ({exc})") from None

    def close(self) -> None:
        if getattr(self, "_zip", None) is not None:
            self._zip.close()
        self._file.close()

    def __enter__(self) -> "NpzArchive":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
