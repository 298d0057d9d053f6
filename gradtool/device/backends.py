"""The device backends: what one must provide, and the one registry that names them.

A backend instantiates a captured :class:`~gradtool.device.program.Program` (the
arena layout, the int64 launch metadata and the launch list of one episode) on
some machine and runs its phases.  Everything above it -- :class:`DeviceReplay`
(input uploads, id checks, the optimizer's host half, reading back),
:class:`DeviceEngine` (training), ``gradtool replay-gpu``, ``gradtool train
--backend`` and the f32 gate -- talks to a backend only through the
:class:`Backend` protocol below, and finds it only through this registry:

    register("host", "gradtool.device.host:HostBackend.create", auto=1, about=...)
    get("host").create(program, Options())        # -> a Backend
    names()                                       # ('host', 'cuda'), in registration order
    choices()                                     # names() + ('auto',): what the CLI offers
    resolve("auto")                               # -> ('cuda', 'auto: ...') or ('host', ...)

A new backend is one module (a class keeping :class:`Backend`, and a factory
``create(program, options)``) plus one :func:`register` line at the end of this
file; the CLI choices, ``auto`` and the training engines follow from the
registry (docs/device.md, "Adding a backend").  The factory and the availability
check may be given as ``"module:attr"`` strings, imported on first use, so that
reading the names (the CLI does at import) loads no backend and no driver.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Union, runtime_checkable

import numpy as np

from ..errors import GradtoolError

AUTO = "auto"


@dataclass(frozen=True)
class Options:
    """What :func:`gradtool.device.capture` passes every backend factory; a backend reads
    the fields it knows and ignores the rest.

    ``graph``: cuda: replay a phase range as one CUDA graph (else launch by launch).
    ``host_kernels``: host: ``"tiled"``, ``"per-thread"`` (the GPU's loop bodies) or
    ``"per-thread-reversed"`` (the race detector); see :func:`gradtool.device.capture`.
    """

    graph: bool = True
    host_kernels: str = "tiled"


@runtime_checkable
class Backend(Protocol):
    """A :class:`Program` instantiated on one device.

    Offsets are arena element offsets as the program laid them out
    (``program.val_off``, ``grad_off``, ``ctl_off``, ``err_off``); values cross the
    boundary as float64 whatever the arena's dtype (``program.dtype``: ``f64`` or
    ``f32``), and the backend converts.  A float32 backend lands float64 uploads in
    a staging area past the arena and converts them on the device with the
    ``k_from_f64`` kernel (:class:`gradtool.device.staging.Staging` computes where).

    Required:

    * ``name``: the registry name it was created under (reports print it);
    * ``program``: the :class:`Program` it runs;
    * ``graph``: ``True``/``False`` whether it replays a phase range as one recorded
      graph (CUDA's ``--graph/--no-graph``), ``None`` where it has no such choice;
    * ``fusion_build``: ``None``, or for a program with fused kernels
      (``program.fusion``) ``{"seconds": build or load time, "cached": bool or None}``;
    * ``run(first, last)``: enqueue the launches of the phases ``first`` .. ``last``
      (in :data:`gradtool.device.program.PHASES` order: forward, backward, optimizer)
      in table order; ``program.flatten(index)`` gives the metadata, the launch table
      and each phase's range.  It may return before they finish;
    * ``write(off, data)``: float64 ``data`` into the arena at ``off``, ordered after
      every launch already enqueued and before every later one;
    * ``read(off, n)`` -> float64 array, and ``scalar(off)`` -> float: wait for the
      enqueued work, then read;
    * ``set_scalars(off, values)``: a few values (the optimizer's per-step control
      scalars, ``ctl[4:]``) rounded to the arena's dtype, stream-ordered like ``write``;
    * ``synchronize()``: wait for everything enqueued;
    * ``nbytes``: the device memory it holds (arena and metadata);
    * ``describe()``: one line naming the device and dtype, for reports.

    Optional: ``host_arena``, the arena as a writable numpy array in this process's
    memory (the host backend's), which a caller may read and write in place between
    runs, in the arena's own dtype, instead of through ``write`` and ``read`` (the
    own-loop wrapper's per-parameter copies: ``gtt.wrap``).  A backend
    whose arena lives elsewhere does not have it.

    In float64 the kernels must give the CPU tape's bits: run ``kernels.cu`` (or the
    fused source, ``program.fusion.source``) with IEEE double operations, no
    contraction, and each launch's threads in any order (the kernels do not depend
    on it; the host's ``per-thread-reversed`` build checks that).
    """

    name: str
    program: object
    graph: Optional[bool]
    fusion_build: Optional[dict]

    def run(self, first: str, last: str) -> None: ...

    def write(self, off: int, data: np.ndarray) -> None: ...

    def read(self, off: int, n: int) -> np.ndarray: ...

    def scalar(self, off: int) -> float: ...

    def set_scalars(self, off: int, values) -> None: ...

    def synchronize(self) -> None: ...

    @property
    def nbytes(self) -> int: ...

    def describe(self) -> str: ...


Factory = Callable[..., Backend]           # (program, options: Options) -> Backend
Status = Callable[[], tuple]               # () -> (usable: bool, why: str)


def _always() -> tuple:
    return True, "no requirements beyond gradtool's own"


def _load(ref: str):
    """``"package.module:attr.attr"`` -> the object (imported now)."""
    module, _, path = ref.partition(":")
    obj = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class Entry:
    """One registered backend: its name, factory, availability check and ``auto`` rank."""

    name: str
    factory: Union[str, Factory]
    available: Union[str, Status] = _always
    auto: int = 0                          # > 0: `auto` may pick it, the highest first
    about: str = ""                        # one line for help texts
    select_device: Union[str, Callable[[int], None], None] = None
    zero_fills: str = "ahead"              # how its programs zero the gradients (below)
    reshape_views: bool = False            # reshapes share their input's memory (below)

    def select(self, local_rank: int) -> None:
        """Under MPI, before anything opens a device: let rank ``local_rank`` (its index
        among the ranks on this machine) pick its device; nothing for a backend without a
        ``select_device`` hook."""
        if self.select_device is not None:
            hook = (_load(self.select_device) if isinstance(self.select_device, str)
                    else self.select_device)
            hook(local_rank)

    def status(self) -> tuple:
        """(usable, why): whether this machine can run the backend now."""
        check = _load(self.available) if isinstance(self.available, str) else self.available
        return check()

    def create(self, program, options: Optional[Options] = None) -> Backend:
        """The backend instantiated for ``program`` (``options``: :class:`Options`)."""
        make = _load(self.factory) if isinstance(self.factory, str) else self.factory
        backend = make(program, options if options is not None else Options())
        backend.name = self.name
        return backend


_REGISTRY: dict = {}


def register(name: str, factory: Union[str, Factory], *, available: Union[str, Status] = None,
             auto: int = 0, about: str = "", select_device=None, zero_fills: str = "ahead",
             reshape_views: bool = False, replace: bool = False) -> Entry:
    """Register a backend under ``name``.

    ``factory(program, options)`` returns a :class:`Backend` for a captured
    :class:`Program` and an :class:`Options`; ``available()`` returns ``(usable, why)``
    (default: always usable); ``select_device(local_rank)``, optional, picks a
    machine-local rank's device under MPI before any is opened (:meth:`Entry.select`).
    Each may be a ``"module:attr"`` string, imported on first use.  ``auto`` > 0 lets
    ``auto`` pick this backend when it is usable, the highest rank first.
    ``zero_fills`` (:func:`gradtool.device.program.capture_program`'s ``fills``): how the
    programs it runs zero the gradients that accumulate, ``"ahead"`` (one fill of all
    of them as the backward starts: one launch) or ``"each"`` (each just before its
    first contribution, still in the cache when that kernel adds into it: the host's
    choice); the same bits either way.  ``reshape_views`` (``capture_program``'s
    ``views``): a reshape of a computed value shares its memory instead of copying it
    (the host's choice).  Registering a taken name raises unless ``replace``.
    """
    if zero_fills not in ("ahead", "each"):
        raise GradtoolError(f"backend {name!r}: zero_fills must be 'ahead' or 'each', "
                            f"got {zero_fills!r}"[:200])
    if not isinstance(name, str) or not name.isidentifier() or name == AUTO:
        raise GradtoolError(f"backend name {name!r}: a Python identifier other than {AUTO!r}")
    if name in _REGISTRY and not replace:
        raise GradtoolError(f"a backend named {name!r} is already registered")
    if not (isinstance(factory, str) or callable(factory)):
        raise GradtoolError(f"backend {name!r}: the factory must be callable or 'module:attr'")
    entry = Entry(name, factory, available if available is not None else _always, int(auto),
                  about, select_device, zero_fills, bool(reshape_views))
    _REGISTRY[name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove a registered backend (e.g. a test's)."""
    if _REGISTRY.pop(name, None) is None:
        raise GradtoolError(f"no backend named {name!r} is registered")


def names() -> tuple:
    """The registered backend names, in registration order."""
    return tuple(_REGISTRY)


def choices() -> tuple:
    """What a ``--backend`` option of a device command offers: every name, then ``auto``."""
    return (*_REGISTRY, AUTO)


def get(name: str) -> Entry:
    """The registered :class:`Entry` called ``name`` (not ``auto``: see :func:`resolve`)."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise GradtoolError(f"unknown backend {name!r} "
                            f"(choose from {', '.join(choices())})") from None


def resolve(name: str) -> tuple:
    """(backend actually used, why) for a requested name or ``auto``.

    A named backend that is not usable here is an error naming why; ``auto`` takes
    the usable backend of highest ``auto`` rank (registration order among equals)
    and says which ones it passed over.
    """
    if name != AUTO:
        entry = get(name)
        ok, why = entry.status()
        if not ok:
            raise GradtoolError(f"the {name} backend is unavailable: {why}")
        return name, "requested"
    ranked = sorted((e for e in _REGISTRY.values() if e.auto > 0), key=lambda e: -e.auto)
    passed = []
    for entry in ranked:
        ok, why = entry.status()
        if ok:
            return entry.name, "auto: " + ("; ".join(passed) if passed else why)
        passed.append(f"no {entry.name} ({why})")
    raise GradtoolError("auto: no usable device backend (" + "; ".join(passed or ["none"]) + ")")


def select_devices(name: str, local_rank: int) -> None:
    """Under MPI: the device selection of backend ``name`` for this rank; for ``auto``,
    that of every backend ``auto`` may pick (before it has picked one).  An unknown name
    selects nothing (creating the engine then says it is unknown)."""
    entries = ([e for e in _REGISTRY.values() if e.auto > 0] if name == AUTO
               else [_REGISTRY[name]] if name in _REGISTRY else [])
    for entry in entries:
        entry.select(local_rank)


# ── the backends: one line each ───────────────────────────────────────────

register("host", "gradtool.device.host:HostBackend.create", auto=1, zero_fills="each",
         reshape_views=True,
         about="the kernels compiled by the system C compiler, run through ctypes")
register("cuda", "gradtool.device.cuda:CudaBackend.create",
         available="gradtool.device.cuda:cuda_status", auto=2,
         select_device="gradtool.device.cuda:select_device", about="PyCUDA and an NVIDIA GPU")


__all__ = ["Backend", "Options", "Entry", "register", "unregister", "names", "choices",
           "get", "resolve", "select_devices", "AUTO"]
