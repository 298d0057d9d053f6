"""The device replay engine: a captured tape episode run by compiled kernels.

One kernel source, ``gradtool/csrc/kernels.cu``, holds every forward and
backward kernel, the broadcast reduction and the optimizer updates.  It runs
on the backends of one registry (:mod:`gradtool.device.backends`): ``cuda``
(PyCUDA, per-node launches or one CUDA graph per episode) and ``host`` (the
same file compiled by the system C compiler and driven through ctypes, one
call per episode).  Both give the CPU tape's bits, for f64 and f32 tapes (an f32
tape's program runs in float32, numerics32's orders); ``rounded_tape`` makes the f32
copy of an f64 tape.  See docs/device.md.

    from gradtool.device import capture
    rp = capture(tape, loss, backend="host")
    rp.forward(); rp.backward()
    rp.loss(), rp.grad(w)
"""

from . import backends
from .backends import Backend, register
from .engine import BACKENDS, DeviceEngine, DeviceReplay, capture, resolve_backend
from .program import CaptureError, rounded_tape, tape_dtype

__all__ = ["capture", "DeviceReplay", "DeviceEngine", "resolve_backend", "CaptureError",
           "BACKENDS", "backends", "Backend", "register", "rounded_tape", "tape_dtype"]
