"""The exception hierarchy: every error gradtool raises on purpose derives from GradtoolError."""


class GradtoolError(Exception):
    """Root of all gradtool exceptions."""


class ShapeError(GradtoolError):
    """An op was given inputs whose shapes it cannot combine (the tape is poisoned)."""


class TapeError(GradtoolError):
    """Misuse of a tape: a foreign or dropped GVar, a poisoned tape, a non-scalar loss."""


class DtypeError(TapeError):
    """An op was given inputs of dtypes it does not combine (f32 with f64: gradtool never
    promotes silently; ``Tape.cast`` converts)."""


class TapeFileError(GradtoolError):
    """A tape file that cannot be loaded. `where` names the file and, when known, the node."""

    def __init__(self, message, *, source=None, node=None, field=None):
        self.source = source
        self.node = node
        self.field = field
        parts = []
        if source is not None:
            parts.append(str(source))
        if node is not None:
            parts.append(f"node {node}")
        if field is not None:
            parts.append(f"field '{field}'")
        prefix = ": ".join(parts)
        super().__init__(f"{prefix}: {message}" if prefix else message)
        self.bare_message = message
