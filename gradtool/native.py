"""Compile small C sources with the system compiler, cache them, load them with ctypes.

Used to accelerate the CPU reference's serial matrix products without
changing their order (``csrc/serial_matmul.c``).  Nothing here is required:
without a C compiler (or with ``GRADTOOL_NATIVE=0``) every caller falls back
to its numpy formulation, which gives the same bits, only slower.

Shared libraries are cached under ``$GRADTOOL_CACHE`` (default
``~/.cache/gradtool``), keyed by a hash of the sources, the flags, the
compiler's version and the machine, and written atomically so concurrent
processes never load a half-written file.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

CSRC = Path(__file__).with_name("csrc")
# Optimization flags that cannot change results: no -ffast-math, no FMA contraction.
SAFE_FLAGS = ("-std=c99", "-O3", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared")

_loaded: dict = {}


class NativeUnavailable(RuntimeError):
    """No C compiler, or compiling failed: callers fall back to numpy."""


def cache_dir() -> Path:
    root = os.environ.get("GRADTOOL_CACHE") or os.path.join(Path.home(), ".cache", "gradtool")
    return Path(root)


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise NativeUnavailable("no C compiler (cc) on PATH")
    return cc


def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True,
                              timeout=30).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def build(name: str, source_text: str, flags=SAFE_FLAGS, include_dirs=()) -> Path:
    """Compile ``source_text`` into a cached shared library and return its path."""
    cc = compiler()
    key_parts = [source_text, " ".join(flags), _compiler_version(cc), platform.machine(),
                 platform.system()]
    for d in include_dirs:
        for header in sorted(Path(d).glob("*.h")):
            key_parts.append(header.read_text())
    digest = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()[:20]
    out_dir = cache_dir()
    target = out_dir / f"{name}-{digest}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        src = Path(tmp) / f"{name}.c"
        src.write_text(source_text)
        built = Path(tmp) / f"{name}.so"
        cmd = [cc, *flags, *[f"-I{d}" for d in include_dirs], "-o", str(built), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise NativeUnavailable(f"{' '.join(cmd)} failed:\n{proc.stderr}")
        os.replace(built, target)
    return target


def load(name: str, source_text: str, flags=SAFE_FLAGS, include_dirs=()) -> ctypes.CDLL:
    """Build (or reuse) and load a library once per process."""
    key = (name, source_text, tuple(flags), tuple(str(d) for d in include_dirs))
    if key not in _loaded:
        _loaded[key] = ctypes.CDLL(str(build(name, source_text, flags, include_dirs)))
    return _loaded[key]


def enabled() -> bool:
    return os.environ.get("GRADTOOL_NATIVE", "1") != "0"
