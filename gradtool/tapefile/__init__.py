"""Tape files, format v1: write a Tape as one msgpack map, read one back.

The format (``docs/format.md``; schema ``gradtool/schemas/tape.schema.json``) is an
interchange contract: any program that writes one msgpack map with the keys
below produces a file gradtool loads.

    {"format": "gradtool-tape", "version": 1,
     "nodes": [{"op", "a", "b", "s", "shape", "data"|"value", "name", "l2", "dtype",
                "axis", "keepdims", "starts", "stops", "steps", "dims"}, ...],
     "loss": id, "outputs": {name: id}, "state": {slot name: output name},
     "meta": {...}, "optimizer": {...}}

Writing is byte-for-byte reproducible: keys in a fixed order, floats as
float64, no timestamps.  Reading never trusts the file: every check in
:mod:`gradtool.tapefile.checks` passes before any value is allocated, and
then op values are recomputed from the leaves with the op table's forward
rules and appended as the Tape's recording methods append them, so a loaded
tape is exactly the tape recording would have produced (requires flags,
names, l2, aux dicts and all; ``tests/test_tapefile.py`` compares them).

The package follows the data: :mod:`~gradtool.tapefile.write` (Tape -> bytes),
:mod:`~gradtool.tapefile.checks` (bytes -> validated structure: bounded
decoding, the schema, the semantic rules and budgets; :mod:`~gradtool.tapefile.scan`
reads a long tape's plain nodes from the bytes as columns instead of maps, and
:mod:`~gradtool.tapefile.runs` keeps their runs as columns),
:mod:`~gradtool.tapefile.replay` (validated structure -> Tape; the runs stay on the
TapeFile for ``inspect``, :meth:`TapeFile.loaded_runs`) and
:mod:`~gradtool.tapefile.read` (``load``: the three in order).
"""

from .checks import FORMAT, VERSION, Limits
from .read import load
from .replay import TapeFile
from .write import dumps, save

__all__ = ["FORMAT", "VERSION", "Limits", "TapeFile", "save", "dumps", "load"]
