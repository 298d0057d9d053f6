"""Compile C sources with the system compiler, cache the libraries, load them with ctypes.

Two users: the CPU reference's matrix products and optimizer step
(``csrc/gt_cpu.c``, optional: without a compiler numerics.py and optim.py fall
back to numpy with the same bits) and the device engine's host backend
(``csrc/kernels.cu`` compiled as C).  Both include the one matmul kernel,
``csrc/gt_matmul.h``, and the one optimizer element rule, ``csrc/gt_optim.h``.

Flags never change a result: ``-ffp-contract=off`` (the compiler never contracts a
multiply and an add into an FMA: the inner products' FMAs are written out, as
intrinsics or ``fma()``), no ``-ffast-math``; ``-march=native`` only widens SIMD and
lets the matmul kernel use the CPU's FMA instructions, and since it makes the library
machine-specific the machine's CPU flags join the cache key (so a build is the
run-time dispatch: an AVX-512 machine, an AVX2+FMA one and one without FMA each get
their own library).  ``GRADTOOL_NO_FMA=1`` adds ``-DGT_NO_FMA -fno-builtin-fma
-fno-builtin-fmaf`` to every build (:func:`fma_policy_flags`): the inner products call
the C library's correctly rounded ``fma()`` instead, what a CPU without FMA runs; same
bits, slowly.
``-pthread``: the matmul kernel splits large products over threads, as many
as :func:`num_threads` says (``GRADTOOL_NUM_THREADS``, default the usable
cores); every thread count gives the same bits.
Libraries are cached under ``$GRADTOOL_CACHE`` (default ``~/.cache/gradtool``,
or a temp folder when that is not writable), named by a hash of every source
and header text, the flags, the compiler's version and the machine, and
renamed into place atomically, so concurrent processes never load half a file.
A build writes ``<library>.<pid>.<random>.tmp.so`` first; one killed half-way
(SIGKILL, a power cut) leaves that file behind, and the next build of that library
removes it once its process is gone (:func:`sweep_temporaries`, which every cache
folder's builds call).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from .errors import GradtoolError
from .fileio import remove_stale_temporaries, temporary_prefix

CSRC = Path(__file__).resolve().parent / "csrc"
SAFE_FLAGS = ("-O3", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC", "-pthread")
FORBIDDEN_FLAGS = ("-ffast-math", "-Ofast", "-ffp-contract=fast", "-funsafe-math-optimizations")
NATIVE_ARCH = "-march=native"


class NativeUnavailable(GradtoolError):
    """No C compiler, or compiling failed."""


def cache_dir() -> Path:
    """``$GRADTOOL_CACHE``, else ``~/.cache/gradtool``, else (not writable) a temp folder."""
    root = os.environ.get("GRADTOOL_CACHE")
    if root:
        return Path(root)
    home = Path.home() / ".cache" / "gradtool"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK):
            return home
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"gradtool-cache-{os.getuid()}"


def compiler() -> str:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise NativeUnavailable(f"no C compiler: {cc!r} is not on PATH (set CC or install gcc/clang)")
    return cc


def compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_tag() -> str:
    """What -march=native depends on: the architecture and the CPU's feature flags."""
    tag = platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features", "model name")):
                    tag += "|" + line.strip()
                    if line.startswith("flags"):
                        break
    except OSError:
        tag += "|" + platform.processor()
    return tag


def native_arch_wanted() -> bool:
    """``GRADTOOL_HOST_NATIVE=0`` leaves -march=native out."""
    return os.environ.get("GRADTOOL_HOST_NATIVE", "1") != "0"


NO_FMA_ENV = "GRADTOOL_NO_FMA"
NO_FMA_FLAGS = ("-DGT_NO_FMA", "-fno-builtin-fma", "-fno-builtin-fmaf")


def fma_policy_flags() -> tuple:
    """``GRADTOOL_NO_FMA=1``: the flags that keep FMA instructions out of the kernels'
    inner products (each multiply-add a call to libm's ``fma()``); else none."""
    return NO_FMA_FLAGS if os.environ.get(NO_FMA_ENV, "0") not in ("", "0") else ()


def _with_policy(flags) -> list:
    flags = list(flags)
    return flags + [f for f in fma_policy_flags() if f not in flags]


def library_path(stem: str, source: Path, flags, key_files=()) -> Path:
    """Where the cached library for these sources, flags, compiler and machine lives."""
    flags = _with_policy(flags)
    if any(f in FORBIDDEN_FLAGS for f in flags):
        raise NativeUnavailable(f"refusing result-changing flags in {flags}")
    key = hashlib.sha256()
    for path in (source, *key_files):
        key.update(Path(path).read_bytes())
    key.update(" ".join(flags).encode())
    key.update(compiler_version(compiler()).encode())
    if NATIVE_ARCH in flags:
        key.update(machine_tag().encode())
    return cache_dir() / f"{stem}_{key.hexdigest()[:20]}.so"


TEMP_SUFFIX = ".tmp.so"
BUILD_TIMEOUT = 600.0         # seconds a compiler run may take


def sweep_temporaries(folder, suffix: str) -> list:
    """Remove from a cache folder (gradtool's own) the temporary files ``*<suffix>`` that a
    build killed half-way left (SIGKILL, a power cut): those whose writer's pid (in the
    name, :func:`cache_temporary`) is gone, and any older than a build can take (a name
    without a pid, from before pids were put in).  Every cache calls this at its next
    build: the libraries here, the fused sources (:mod:`gradtool.device.fusion`).
    Returns the removed paths."""
    return remove_stale_temporaries(folder, None, suffix, older_than=2 * BUILD_TIMEOUT)


def cache_temporary(folder, stem: str, suffix: str) -> tuple:
    """``(fd, path)`` of a new temporary file ``<stem>.<pid>.<random><suffix>`` in ``folder``,
    to be renamed onto the cached file when complete; the pid lets
    :func:`sweep_temporaries` tell a live writer's file from a dead one's."""
    return tempfile.mkstemp(prefix=temporary_prefix(stem), suffix=suffix, dir=folder)


def cached_bytes(folder, name: str, produce) -> tuple:
    """``(bytes, found)``: the file ``folder/name`` of a cache, else ``produce()``'s bytes,
    written there through :func:`cache_temporary` and an atomic rename (after sweeping
    the folder's temporaries of dead writers), so a build killed at any moment leaves
    either the whole file or none.  A folder that cannot be written leaves the result
    uncached.  Used for the CUDA cubins (:mod:`gradtool.device.cuda`)."""
    path = Path(folder) / name
    try:
        return path.read_bytes(), True
    except OSError:
        pass
    data = produce()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_temporaries(path.parent, ".tmp")
        fd, tmp = cache_temporary(path.parent, name, ".tmp")
    except OSError:               # a read-only cache: use the result uncached
        return data, False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return data, False


def build(stem: str, source: Path, flags, key_files=(), include_dirs=(CSRC,)) -> Path:
    """Compile ``source`` into a cached shared library (once) and return its path."""
    path = library_path(stem, source, flags, key_files)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_temporaries(path.parent, TEMP_SUFFIX)
    fd, tmp = cache_temporary(path.parent, path.stem, TEMP_SUFFIX)
    os.close(fd)
    cmd = [compiler(), *_with_policy(flags), *[f"-I{d}" for d in include_dirs], str(source),
           "-o", tmp, "-lm"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        if proc.returncode != 0:
            detail = " ".join((proc.stderr or proc.stdout).split())[:400]
            raise NativeUnavailable(f"compiling {source} failed: {detail}")
        os.replace(tmp, path)                   # atomic: readers see all of it or nothing
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def build_best(stem: str, source: Path, flags, key_files=(), native_arch=None) -> Path:
    """:func:`build` with -march=native when wanted, retrying without it if the compiler refuses.

    ``native_arch`` None: as :func:`native_arch_wanted` says."""
    if native_arch_wanted() if native_arch is None else native_arch:
        try:
            return build(stem, source, [*flags, NATIVE_ARCH], key_files)
        except NativeUnavailable:
            pass
    return build(stem, source, flags, key_files)


PYTHON_ENTRY_ENV = "GRADTOOL_PYTHON_ENTRY"


def python_flags() -> tuple:
    """The flags that add csrc/gt_cpu.c's gt_mm_py, the matrix product called through
    ``ctypes.PyDLL`` with the numpy arrays themselves (about 1 us a call instead of
    ctypes' 7): ``-DGT_PYTHON``, the running interpreter's include folder and its ABI
    tag (so that each interpreter gets its own cached library).  () when that folder
    has no ``Python.h`` (the library then has the plain ctypes entries only, which
    give the same bits), on an interpreter other than CPython, or under
    ``GRADTOOL_PYTHON_ENTRY=0``."""
    if os.environ.get(PYTHON_ENTRY_ENV, "1") == "0" or sys.implementation.name != "cpython":
        return ()
    include = sysconfig.get_paths().get("include")
    if not include or not (Path(include) / "Python.h").is_file():
        return ()
    abi = sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag or "python"
    return ("-DGT_PYTHON", f"-I{include}", f"-DGT_PY_ABI={abi}")


_loaded: dict = {}


def load(stem: str, source: Path, flags=SAFE_FLAGS, key_files=(), native_arch=None) -> ctypes.CDLL:
    """Build (or reuse) and load a library once per process."""
    native_arch = native_arch_wanted() if native_arch is None else native_arch
    key = (stem, str(source), tuple(flags), native_arch)
    if key not in _loaded:
        _loaded[key] = ctypes.CDLL(str(build_best(stem, source, flags, key_files, native_arch)))
    return _loaded[key]


def enabled() -> bool:
    """``GRADTOOL_NATIVE=0`` makes the CPU reference use numpy only."""
    return os.environ.get("GRADTOOL_NATIVE", "1") != "0"


# ── threads ────────────────────────────────────────────────────────────────

THREADS_ENV = "GRADTOOL_NUM_THREADS"
MAX_THREADS = 256                     # GT_MM_MAX_THREADS in csrc/gt_matmul.h
_threads_override: list = []          # [n] after set_num_threads(n)
_threaded: list = []                  # loaded libraries exporting gt_mm_set_threads


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def num_threads() -> int:
    """Threads per matrix product: :func:`set_num_threads`, else ``GRADTOOL_NUM_THREADS``,
    else :func:`usable_cores`.  The count never changes a result, only the speed."""
    if _threads_override:
        return _threads_override[0]
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return min(usable_cores(), MAX_THREADS)
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_THREADS:
        raise GradtoolError(f"{THREADS_ENV} must be a whole number from 1 to {MAX_THREADS}, "
                            f"got {raw!r}")
    return n


def set_num_threads(n=None) -> None:
    """Use ``n`` threads per product from now on, in every loaded library (None: back to
    ``GRADTOOL_NUM_THREADS`` or the default)."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)
                          or not 1 <= n <= MAX_THREADS):
        raise GradtoolError(f"thread count must be a whole number from 1 to {MAX_THREADS}, "
                            f"got {n!r}")
    _threads_override[:] = [] if n is None else [n]
    count = num_threads()
    for lib in _threaded:
        lib.gt_mm_set_threads(count)


def register_threaded(lib) -> None:
    """A loaded library that includes csrc/gt_matmul.h: give it the thread count now and
    on every :func:`set_num_threads`."""
    lib.gt_mm_set_threads.restype = None
    lib.gt_mm_set_threads.argtypes = [ctypes.c_int]
    lib.gt_mm_set_threads(num_threads())
    if lib not in _threaded:
        _threaded.append(lib)


# ── the allocator ──────────────────────────────────────────────────────────

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3      # glibc's mallopt parameters
_allocator_tuned: list = []


def keep_freed_memory() -> bool:
    """Let glibc's malloc reuse freed blocks instead of returning them to the kernel.

    A training step allocates and frees the same numpy temporaries every
    step.  By default glibc maps blocks of 128 KiB and more freshly (mmap)
    and trims the top of the heap when 256 KiB are free, so the next step's
    arrays page-fault again, page by page: on the MLP 784-256-10 step that
    was about a quarter of the CPU engine's time.  This raises the mmap
    threshold to 32 MiB (glibc's maximum) and the trim threshold to 128 MiB:
    freed memory stays in the process for the next step.  Results cannot
    change.  Called once by the CPU training engine; a no-op (False) where
    the C library is not glibc.
    """
    if not _allocator_tuned:
        ok = False
        try:
            if (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
                libc = ctypes.CDLL(None)
                ok = (libc.mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1
                      and libc.mallopt(M_TRIM_THRESHOLD, 128 << 20) == 1)
        except (AttributeError, OSError, ValueError):
            ok = False
        _allocator_tuned.append(ok)
    return _allocator_tuned[0]
