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
messages.  :class:`NpzArchive` reads the zip directory and each array's
header only, checks every claim against what the archive can really hold
(the member's stored bytes, or for a deflated member deflate's ceiling of
1032:1 on its compressed bytes), refuses object arrays (gradtool never
unpickles), and reads an array only when :meth:`NpzArchive.load` asks for
it -- after the caller has checked its shape.
"""

from __future__ import annotations

import math
import os
import zipfile
from dataclasses import dataclass

import numpy as np

from .errors import GradtoolError
from .fileio import atomic_write_with

_EPOCH = (1980, 1, 1, 0, 0, 0)          # the earliest time a zip entry can carry
NPY_MAGIC = b"\x93NUMPY"
# deflate cannot expand more than 1032:1 (a 258-byte match costs at least 2 bits)
MAX_DEFLATE_RATIO = 1032
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}


def write_npz(path, arrays: dict) -> None:
    """Write ``{name: array}`` to ``path`` as an uncompressed npz, atomically."""
    def write(f):
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as archive:
            for name, array in arrays.items():
                info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
                info.external_attr = 0o644 << 16
                with archive.open(info, "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
    atomic_write_with(path, write)


class NpzError(GradtoolError):
    """An .npz file that cannot be read as arrays of numbers."""


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


def _human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


class NpzArchive:
    """An .npz opened for reading; use as a context manager.

    ``name in archive``, ``iter(archive)`` (array names), ``archive[name]``
    (an :class:`NpzMember`: shape and dtype) and ``archive.load(name)`` (the
    array).  Every failure is an :class:`NpzError` naming the file.
    """

    def __init__(self, path):
        self.source = os.fspath(path)
        self._file = self._open()
        try:
            self._zip = zipfile.ZipFile(self._file)
            self.members = {}
            for info in self._zip.infolist():
                if info.filename.endswith(".npy"):
                    member = self._read_header(info)
                    self.members[member.name] = member
        except NpzError:
            self.close()
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, NotImplementedError) as exc:
            self.close()
            raise NpzError(f"{self.source}: cannot read as a .npz file ({exc})") from None

    def _open(self):
        src = self.source
        try:
            f = open(src, "rb")
        except FileNotFoundError:
            raise NpzError(f"{src}: no such file") from None
        except IsADirectoryError:
            raise NpzError(f"{src}: is a directory, not an .npz file") from None
        except OSError as exc:
            raise NpzError(f"{src}: cannot read: {exc.strerror or exc}") from None
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

    def _read_header(self, info: zipfile.ZipInfo) -> NpzMember:
        src, name = self.source, info.filename[:-len(".npy")]
        if info.compress_type == zipfile.ZIP_STORED:
            ceiling = info.compress_size
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            ceiling = info.compress_size * MAX_DEFLATE_RATIO
        else:
            raise NpzError(f"{src}: array {name!r} uses zip compression method "
                           f"{info.compress_type}; np.savez writes stored or deflated members")
        if info.file_size > ceiling:
            raise NpzError(f"{src}: array {name!r} claims {_human(info.file_size)} but its "
                           f"{_human(info.compress_size)} in the archive cannot hold that")
        with self._zip.open(info) as stream:
            version = np.lib.format.read_magic(stream)
            reader = _HEADER_READERS.get(version)
            if reader is None:
                raise NpzError(f"{src}: array {name!r} has .npy format version "
                               f"{version[0]}.{version[1]}; gradtool reads 1.0 and 2.0")
            shape, _fortran, dtype = reader(stream)
            header_bytes = stream.tell()
        if dtype.hasobject:
            raise NpzError(f"{src}: array {name!r} holds Python objects (pickled data); "
                           f"gradtool reads arrays of numbers and never unpickles")
        claimed = math.prod(shape) * dtype.itemsize
        held = info.file_size - header_bytes
        if claimed > held:
            dims = ",".join(str(d) for d in shape)
            raise NpzError(f"{src}: array {name!r} claims shape [{dims}] of {dtype} "
                           f"({_human(claimed)}) but the file holds {_human(max(held, 0))} of it")
        return NpzMember(name, tuple(shape), dtype, info)

    # ── the mapping ──────────────────────────────────────────────────────────
    def __contains__(self, name) -> bool:
        return name in self.members

    def __iter__(self):
        return iter(self.members)

    def __getitem__(self, name) -> NpzMember:
        return self.members[name]

    def load(self, name: str) -> np.ndarray:
        """Read one array (its size already checked against the archive)."""
        try:
            with self._zip.open(self.members[name].info) as stream:
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
