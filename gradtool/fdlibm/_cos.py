"""cos: fdlibm 5.3 ``s_cos.c`` (C twin ``gt_cos`` in gradtool/csrc/gt_math.h), on the
kernels and the reduction of ``_sin``/``_rem_pio2``."""

from __future__ import annotations

import numpy as np

from ._sin import _trig


def cos(x) -> np.ndarray:
    """Cosine: fdlibm 5.3 ``s_cos.c``; error < 1 ulp (measured max 0.803 ulp on
    tests/test_fdlibm_more.py's inputs); C twin ``gt_cos``.  Bit for bit
    fdlibm's (and Java StrictMath's) for every input, NaNs aside.

    Method (ix = high word of |x|)::

      ix <= 0x3fe921fb (|x| <~ pi/4):  __kernel_cos(x, 0)   (1 below 2^-27)
      ix >= 0x7ff00000 (inf, NaN):      NaN (0x7ff8000000000000)
      otherwise n, y0, y1 = rem_pio2(x), then by n & 3:
          0: __kernel_cos(y0, y1)      1: -__kernel_sin(y0, y1, 1)
          2: -__kernel_cos(y0, y1)     3: __kernel_sin(y0, y1, 1)
    """
    return _trig(x, True)


_cos_ref = cos   # one path, as sin's
