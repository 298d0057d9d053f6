"""The import's one error: :class:`Problem` (one offending target, its count and the
user's source lines), :class:`TorchImportError`, :class:`WeightsError`, and finding the
user's source line of a graph node."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Optional

from ..errors import GradtoolError


# ── the one error ──────────────────────────────────────────────────────────

@dataclass
class Problem:
    kind: str                 # "unsupported op", "train-mode dropout", ...
    target: str               # aten.sort.default, an input's name, ...
    sources: list = field(default_factory=list)
    count: int = 0
    detail: str = ""

    def line(self) -> str:
        where = self.sources[0] if self.sources else "unknown source line"
        more = f" (and {len(self.sources) - 1} more places)" if len(self.sources) > 1 else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.kind} {self.target} (x{self.count}) at {where}{more}{detail}"


# what a module returning outputs (logits) instead of its loss is told; the command line
# says --loss NAME instead (gradtool/cli/interop.py)
NOT_A_LOSS = ("the module returns outputs, not a scalar loss: pass loss_fn= (a function "
              "of the outputs and the targets, e.g. loss_fn=F.cross_entropy), or return "
              "the loss from forward")


class TorchImportError(GradtoolError):
    """The module cannot be imported: ``problems`` lists every offending target (one
    :class:`Problem` each, with its count and the user's source lines)."""

    def __init__(self, problems: list):
        self.problems = problems
        self.lines = [p.line() for p in problems]
        n = len(problems)
        super().__init__(f"cannot import the module ({n} problem{'s' * (n != 1)}):\n  "
                         + "\n  ".join(self.lines))


class WeightsError(TorchImportError):
    """:func:`load_weights` refused: the tape's params and the module's do not match.  One
    line (a load has no source lines): each kind of mismatch with its count and the
    first few names; ``problems`` lists them all."""

    def __init__(self, problems: list):
        self.problems = problems
        self.lines = [p.line() for p in problems]
        groups: dict = {}
        for p in problems:
            groups.setdefault(p.kind, []).append(p)
        parts = []
        for kind, ps in groups.items():
            shown = [p.target + (f" ({p.detail})" if p.detail else "") for p in ps[:4]]
            more = f", and {len(ps) - 4} more" if len(ps) > 4 else ""
            parts.append(f"{kind} {', '.join(shown)}{more}")
        GradtoolError.__init__(self, "cannot load the weights into the module: "
                               + "; ".join(parts))


class Problems:
    def __init__(self):
        self.by_key: dict = {}

    def add(self, kind: str, target: str, node=None, detail: str = "") -> None:
        p = self.by_key.setdefault((kind, target), Problem(kind, target, detail=detail))
        p.count += 1
        src = source_line(node) if node is not None else None
        if src and src not in p.sources:
            p.sources.append(src)

    def __bool__(self):
        return bool(self.by_key)

    def error(self, cls=None) -> TorchImportError:
        return (cls or TorchImportError)(list(self.by_key.values()))


SOURCE_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def mentions_dropout(node) -> bool:
    """Whether a function or a line of code in ``node``'s stack trace says dropout
    (F.dropout2d's bernoulli, a user's own mask): the file paths are not read."""
    trace = node.meta.get("stack_trace") if hasattr(node, "meta") else None
    for text in (trace or "").splitlines():
        m = SOURCE_FRAME.search(text)
        words = m.group(3) if m else text
        if "dropout" in words.lower():
            return True
    return False


def source_line(node) -> Optional[str]:
    """``path:line (function): code`` of the user's frame in ``node.meta["stack_trace"]``
    (the innermost frame outside torch itself)."""
    trace = node.meta.get("stack_trace") if hasattr(node, "meta") else None
    if not trace:
        return None
    lines = trace.splitlines()
    frames = []
    for i, text in enumerate(lines):
        m = SOURCE_FRAME.search(text)
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) and not SOURCE_FRAME.search(
                lines[i + 1]) else ""
            frames.append((m.group(1), m.group(2), m.group(3), code))
    if not frames:
        return None
    inside = torch_dir()
    user = [f for f in frames if not (inside and f[0].startswith(inside))]
    path, line, func, code = (user or frames)[-1]
    return f"{display_path(path)}:{line} ({func})" + (f": {code}" if code else "")


def display_path(path: str) -> str:
    """``path`` relative to the working directory where it lies below it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def torch_dir() -> str:
    import torch
    return os.path.dirname(torch.__file__) + os.sep
