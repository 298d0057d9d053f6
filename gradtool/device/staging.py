"""Where a float32 program's float64 uploads land: shared by every backend.

Values cross the backend boundary as float64 (:class:`gradtool.device.backends.Backend`).
A float64 arena takes them as they are; a float32 one gets them through a staging
area past the program's arena, converted on the device by ``k_from_f64`` (no host
pass over the data).  :class:`Staging` says where that area is and how big.
"""

from __future__ import annotations

import numpy as np

from .program import Program


class Staging:
    """Where a float32 program's float64 uploads land before k_from_f64 converts them on
    the device: ``chunk`` float64 values at the even arena offset ``off`` past the
    program's arena (``chunk`` 0: a float64 program, which copies directly).  Uploads
    larger than the area go through it piece by piece."""

    LIMIT = 1 << 20                       # float64 values (8 MiB)

    def __init__(self, program: Program):
        self.off = program.size + (program.size & 1)
        self.chunk = 0
        if program.dtype != "f64":
            biggest = max([np.asarray(d).size for _, d in program.init] + [1])
            self.chunk = min(biggest, self.LIMIT)
        # in elements of the program's dtype (two float32 per float64)
        self.end = self.off + 2 * self.chunk if self.chunk else max(program.size, 1)

    def pieces(self, n: int):
        for start in range(0, n, self.chunk):
            yield start, min(self.chunk, n - start)


__all__ = ["Staging"]
