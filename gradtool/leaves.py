"""Leaf data: user arrays converted to the tape's C-contiguous float64/float32/int64
arrays, or refused in one line (bool, complex, object, string data; float ids; empty or
too many dims).  Re-exported from :mod:`gradtool.tape`.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .errors import TapeError
from .gvar import GVar
from .limits import MAX_DIMS
from .ops import FLOAT_DTYPES, NUMPY_DTYPES
from .tape_checks import _one_line

def as_float64_array(data, what: str, copy: bool = True) -> np.ndarray:
    """A C-contiguous float64 array of ``data`` with at least one dim, or a clear error
    (a copy unless ``copy=False``, which may return ``data`` itself when it already is one).

    Real numbers only: integer and float dtypes convert; bool, complex, object
    and string data are refused (a bool mask or a complex array converted
    silently would be a wrong result, not a convenience).
    """
    if (not copy and type(data) is np.ndarray and data.dtype == np.float64
            and 0 < data.ndim <= MAX_DIMS and data.size and data.flags.c_contiguous):
        return data                   # the per-step upload's common case: nothing to do
    return _leaf_array(data, what, ids=False)


def as_ids_array(data, what: str) -> np.ndarray:
    """A C-contiguous int64 copy of integer ids with at least one dim, or a clear error.

    Integer dtypes only: float data is refused even when its values are whole
    (ids computed in floating point are a bug to surface, not to round), and so
    are bool, complex, object and string data.  Ranges are the reader's check.
    """
    return _leaf_array(data, what, ids=True)


_KIND_NAMES = {"b": "bool", "c": "complex", "O": "object", "U": "string", "S": "bytes",
               "f": "float"}


def _kind_name(dtype) -> str:
    return _KIND_NAMES.get(dtype.kind) or str(dtype)


def _leaf_array(data, what: str, ids: bool, dtype: str = "f64") -> np.ndarray:
    if isinstance(data, GVar):
        raise TapeError(f"{what}: got a GVar; leaves take array data (use tape.value(v))")
    try:
        arr = np.asarray(data)
    except Exception as exc:  # e.g. ragged nested lists
        raise TapeError(f"{what}: cannot convert to an array ({_one_line(exc)})") from None
    if ids and arr.dtype.kind not in "iu":
        hint = (": float ids are refused, even whole ones; pass integers (.astype(np.int64))"
                if arr.dtype.kind == "f" else "")
        raise TapeError(f"{what}: expected integer ids, got {_kind_name(arr.dtype)} data "
                        f"(dtype {arr.dtype}){hint}")
    if arr.dtype.kind not in "iuf":
        raise TapeError(f"{what}: expected real numbers (int or float), got "
                        f"{_kind_name(arr.dtype)} data (dtype {arr.dtype})")
    if arr.ndim > MAX_DIMS:
        raise TapeError(f"{what}: {arr.ndim} dims; a tape file allows at most {MAX_DIMS}")
    if arr.size == 0:
        raise TapeError(f"{what}: empty array (shape {list(arr.shape)}); every dim must be >= 1")
    if ids and arr.dtype.kind == "u" and int(arr.max()) > np.iinfo(np.int64).max:
        raise TapeError(f"{what}: id {int(arr.max())} does not fit in an int64")
    target = np.int64 if ids else NUMPY_DTYPES[dtype]
    try:
        with np.errstate(all="ignore"):     # f32: an f64 value past float32's range -> inf
            arr = np.array(arr, dtype=target, order="C", copy=True)
    except MemoryError:
        raise TapeError(f"{what}: out of memory copying {arr.size} elements "
                        f"({np.dtype(target).itemsize * arr.size} bytes)") from None
    return arr.reshape((1,)) if arr.ndim == 0 else arr


def _leaf_dtype(array, dtype: Optional[str], op: str) -> str:
    """A float leaf's dtype: ``dtype`` ("f64"/"f32") when given, else "f32" for float32
    data and "f64" for anything else (float64, integers, lists of numbers)."""
    if dtype is None:
        return "f32" if getattr(array, "dtype", None) == np.float32 else "f64"
    if dtype not in FLOAT_DTYPES:
        raise TapeError(f"{op} dtype must be 'f64' or 'f32', got {dtype!r}"[:200])
    return dtype
