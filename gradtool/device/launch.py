"""One kernel launch of a captured program, and the capture error.

A launch is a kernel name of ``kernels.cu`` and its int64 metadata block,
whose fields the op table declares by name (:data:`gradtool.ops.KERNELS`)
and :func:`launch` packs by name (:func:`gradtool.ops.pack`).  Both the
program builder and the device optimizer make launches; neither imports
the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GradtoolError
from ..ops import pack


class CaptureError(GradtoolError):
    """The tape cannot be replayed on the device (the message names the node)."""


@dataclass(frozen=True)
class Launch:
    kernel: str                   # a kernel name of kernels.cu
    meta: tuple                   # its int64 metadata block; meta[0] = thread indices
    node: int = -1                # the tape node it belongs to (-1: bookkeeping)
    what: str = ""                # for messages and listings

    @property
    def work(self) -> int:
        return int(self.meta[0])


def launch(kernel: str, threads: int, node: int = -1, what: str = "", /, **fields) -> Launch:
    """A launch of ``kernel`` over ``threads`` thread indices, its fields packed by name."""
    return Launch(kernel, pack(kernel, threads, **fields), node, what)


__all__ = ["CaptureError", "Launch", "launch"]
