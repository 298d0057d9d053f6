"""The exception hierarchy: every error gradtool raises on purpose derives from GradtoolError."""


class GradtoolError(Exception):
    """Root of all gradtool exceptions."""


class ShapeError(GradtoolError):
    """An op was given inputs whose shapes it cannot combine (the tape is poisoned)."""


class TapeError(GradtoolError):
    """Misuse of a tape: a foreign or dropped GVar, a poisoned tape, a non-scalar loss."""


class OptimizerError(GradtoolError):
    """A bad optimizer setting, registration or saved state (gradtool.optim)."""


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


class IdsError(GradtoolError):
    """A take/take_along met an id computed on the tape that is not a whole number in
    range.  ``node`` reads the ids, which ``ids_node`` computes; ``bound`` is the table's
    row count; ``index`` the first bad id's flat position in them and ``value`` the id.
    :func:`gradtool.tape.ids_culprit` traces it back to an input slot's example."""

    def __init__(self, message, *, node, ids_node, bound, index, value):
        super().__init__(message)
        self.node, self.ids_node, self.bound = node, ids_node, bound
        self.index, self.value = index, value


class WrapError(GradtoolError):
    """Misuse of ``gtt.wrap`` or of the wrapped module (a wrong argument, a bad input);
    also importable as ``gradtool.interop.wrap.WrapError``."""
