"""Writing ``.npz`` archives reproducibly and atomically.

``np.savez`` stamps every member with the current time (so the same arrays
never give the same bytes twice) and takes the arrays as keyword arguments
(so an array named ``file`` collides with its first parameter).  This writer
takes a plain dict, uses a fixed timestamp and a fixed member order, and
goes through :func:`gradtool.fileio.atomic_write_with`.  The result is an
ordinary npz that ``np.load`` reads.
"""

from __future__ import annotations

import zipfile

import numpy as np

from .fileio import atomic_write_with

_EPOCH = (1980, 1, 1, 0, 0, 0)          # the earliest time a zip entry can carry


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
