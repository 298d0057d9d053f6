"""exp, expm1, log, tanh, erf, erfc, sin, cos, log1p, atan and atan2 without libm: Sun's
fdlibm 5.3 (and a compensated tanh on top of its expm1) in numpy.

Why this package exists
-----------------------
``np.exp`` and friends call the platform's vector libm, whose last bit differs
between numpy builds, CPUs (SIMD width) and operating systems.  gradtool
promises the same bits everywhere, so its transcendentals are computed from
IEEE-754 basic operations only, in an order written down here and mirrored
operation for operation by the C/CUDA header ``gradtool/csrc/gt_math.h``.

exp, expm1 and log are fdlibm 5.3's ``e_exp.c``, ``s_expm1.c`` and
``e_log.c`` (Copyright (C) 1993-2004 Sun Microsystems, Inc.  Permission to
use, copy, modify, and distribute this software is freely granted, provided
that this notice is preserved.).  For every non-NaN input their results are
bit-identical to fdlibm, hence to Java's ``StrictMath``, which is specified to
return fdlibm's results.  tanh is not fdlibm's ``s_tanh.c`` (up to 2.16 ulp
off): it is t/(t + 2) with t = expm1(2|x|) as a double-double, built from
fdlibm expm1's reduction and polynomial and compensated arithmetic (see
``tanh``).

Rules
-----
* Only correctly rounded binary64 ``+ - * /`` (one ufunc call each; numpy's
  elementwise ufuncs never fuse a multiply-add), comparisons, ``np.trunc``
  (exact), and exact bit manipulation through ``.view(np.uint64)``: adding k
  to the exponent field multiplies by 2^k.  Never ``np.exp``/``np.log``/...,
  never ``math.*``.  Rounding to an integer is fdlibm's
  ``(int)(invln2*x + (x<0 ? -0.5 : 0.5))``: C's cast truncates, which is
  ``np.trunc`` of the same double here.
* Every NaN result is the canonical quiet NaN ``0x7ff8000000000000`` (fdlibm
  returns ``x+x`` or ``(x-x)/0``, whose payload and sign are processor
  specific); this is the only deliberate difference from fdlibm's exp,
  expm1 and log.
* All four functions take any array-like, compute in float64 and return a
  new float64 ndarray of the same shape (0-d for a scalar).

Accuracy (fdlibm's error analysis, checked against 50-digit mpmath in
tests/test_fdlibm.py and on 10^6 further points): exp, expm1 and log are
within 1 ulp of the exact result (measured max 0.87 ulp), so at most one
double away from the correctly rounded result.  tanh: measured max 0.596
ulp of the exact value (1.4e8 points), also at most one double away.

How the vectorisation keeps the bits
------------------------------------
Each function exists twice in numpy, both tested against the C:

* ``_<name>_ref`` is the literal transcription of the C function: every
  fdlibm branch is a boolean mask (``_<name>_special`` holds the early
  returns, ``_<name>_core`` the rest; ``_masked`` runs the one, then the
  other).  It is slow (~100 ns per element) and only sees the rare lanes.
* the kernel ``_<name>_block`` evaluates the main branch over blocks of
  65536 elements in preallocated buffers, one ufunc call per operation.
  Where fdlibm has a separate formula for a sub-case that provably yields the
  very same double as the general formula (exp's k == 0 and |k| == 1 cases,
  for instance), the kernel uses the general one; each such argument is
  written next to the code.  Lanes outside the kernel's domain are detected
  with a few reductions/compares; early-return cases (NaN, inf, overflow,
  tiny arguments) are settled on the spot and the few remaining lanes are
  recomputed by ``_<name>_ref``.

The steps that exp, expm1 and tanh share, fdlibm's general ln2 argument
reduction and expm1's polynomial, are written once for each path
(``_reduce``, ``_expm1_poly``; the kernels' ``_reduce_block``,
``_expm1_poly_block``), as in the C (``gtm_reduce``, ``gtm_expm1_poly``).

Where things are
----------------
Each module imports only from those listed above it (no cycles):

* ``_common.py``: the constants used by several functions (LN2_HI, LN2_LO,
  INVLN2, O_THRESHOLD, U_THRESHOLD, NAN, INF, MAGIC, bit masks), ``_hex``,
  the kernels' shared operands (``_c``, ``_K_*``) and helpers
  (``_poly_block``, ``_sparse_nonzero``, ``_half_with_sign_of``,
  ``_hiword_bound``, ``_add_exponent``, ``_add_exponent_block``) and the
  ln2 reduction (``_reduce``, ``_reduce_block``).
* ``_driver.py``: the blocked driver ``_run`` (``_BLOCK``, the per-thread
  scratch buffers), ``_patch`` and ``_masked``.
* ``_exp.py``: ``exp`` with its ``_exp_special``/``_exp_ref``/``_exp_core``
  and kernel ``_exp_block``; P1..P5, TWOM1000; exp's reduction with its
  k = +-1 branch (``_exp_reduction``) and the band W (``_W_LO``,
  ``_W_LEN``), which expm1 reuses.
* ``_expm1.py``: ``expm1`` with its reference path, kernel and tables;
  Q1..Q5 and the polynomial ``_expm1_poly``/``_expm1_poly_block``, which
  tanh reuses.
* ``_log.py``: ``log`` with its reference path and kernel; TWO54, LG1..LG7,
  THIRD and the hfsq band bounds ``_BAND_F1``/``_BAND_F2``.
* ``_tanh.py``: ``tanh`` with its reference path and kernel; SPLIT and
  Veltkamp's split (``_split``, ``_split_block``).
* ``_erf.py``, ``_log1p.py``: fdlibm's ``s_erf.c`` (on ``exp``) and
  ``s_log1p.c`` (on log's polynomial); ``_rem_pio2.py``: the pi/2 reduction
  (``e_rem_pio2.c`` and ``k_rem_pio2.c``); ``_sin.py``: the kernels
  ``k_sin.c``/``k_cos.c`` and ``sin``; ``_cos.py``: ``cos``.  These four have
  no separate block kernel: they split the lanes by fdlibm's branch and
  evaluate each branch's formula one ufunc call per operation (the large
  reduction one element at a time, in Python floats), so their ``_<name>_ref``
  is the function itself.  Each is within 1 ulp; sin, cos and log1p are bit for
  bit fdlibm's (tests/test_fdlibm_more.py checks them against Java StrictMath).
* ``_erfc.py``: fdlibm's own erfc (``s_erf.c``, on erf's polynomials, which
  ``_erf`` keeps as ``_erf_y``, ``_erf_pq``, ``_erf_r``); ``_atan.py``:
  ``s_atan.c``; ``_atan2.py``: ``e_atan2.c`` on ``_atan``, two arguments
  broadcast like numpy.  Split by branch like erf.  atan is within 1 ulp;
  fdlibm's erfc (up to ~3 ulp) and atan2 (up to ~1.5 ulp) are not, and are
  kept as fdlibm's: atan and atan2 are bit for bit Java StrictMath's
  (tests/test_fdlibm_erfc_atan.py, with the measured figures).

The module names start with an underscore: the public API is the four
functions re-exported here (a submodule named ``exp`` would also clash with
the function ``gradtool.fdlibm.exp``).

Nothing depends on the numpy build, the CPU's SIMD width or the libm: each
ufunc computes each element with one correctly rounded IEEE operation.
"""

from __future__ import annotations

from ._exp import exp
from ._expm1 import expm1
from ._log import log
from ._tanh import tanh
from ._cos import cos
from ._erf import erf
from ._log1p import log1p
from ._sin import sin
from ._erfc import erfc
from ._atan import atan
from ._atan2 import atan2

__all__ = ["exp", "expm1", "log", "tanh", "erf", "log1p", "sin", "cos", "erfc", "atan", "atan2"]
