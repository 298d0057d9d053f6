"""What a tape file can hold: the format's limits, shared by the recorder and the loader.

The loader (:mod:`gradtool.tapefile.checks`) enforces these on every file it
reads; the recorder (:mod:`gradtool.tape`) enforces the per-node ones as it
records, and saving checks the whole file, so whatever ``save`` writes,
``load`` reads.  The JSON Schema states ``MAX_DIMS`` too (``maxItems``), and a
test keeps the two equal.
"""

MAX_DIMS = 32               # dims of a shape; starts/stops of a slice
MAX_NAME_BYTES = 1 << 20    # UTF-8 bytes of any string (leaf and output names, meta)
MAX_DEPTH = 32              # msgpack container nesting of the whole file (the format uses 4)
MAX_MAP_LEN = 1 << 16       # entries of one map (outputs, meta, ...)

__all__ = ["MAX_DIMS", "MAX_NAME_BYTES", "MAX_DEPTH", "MAX_MAP_LEN"]
