"""Every kernel cache removes the temporary files of a build killed half-way (a real
SIGKILL of a real build) at its next build: the compiled libraries'
``<library>.<pid>.<random>.tmp.so`` (gradtool.native) and the fused sources'
``fused/gtf_<digest>.<pid>.<random>.tmp`` (gradtool.device.host), one sweep
(``native.sweep_temporaries``) for both."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import require_c_compiler
from gradtool import native

ROOT = Path(__file__).resolve().parent.parent

# a compiler that signals it started, then takes a minute: the moment to kill the build
SLOW_CC = """#!/bin/sh
case "$*" in *--version*) exec {cc} "$@";; esac
: > "$GT_TEST_MARKER"
sleep 60
exec {cc} "$@"
"""

# a fused-kernel library source as host_library loads it (the two entries it looks up)
FUSED_SOURCE = """#include <stddef.h>
void *gtf_kernel_at(long long i) {{ (void)i; return NULL; }}
int gtf_real_bytes(void) {{ return {n}; }}
"""

# every child's start: ``held``, an os.replace that signals it was reached and then takes a
# minute (the moment to kill a writer between its temporary's write and its rename)
CHILD_PRELUDE = """import os, sys, time


def held(*args):
    open(os.environ["GT_TEST_MARKER"], "w").close()
    time.sleep(60)
"""

CHILDREN = {
    # the library cache: the compiler is slow, the kill lands while it runs
    "library": """
        from pathlib import Path
        from gradtool import native
        native.build("killed", Path(sys.argv[1]), native.SAFE_FLAGS)
    """,
    # the fused cache, killed while compiling the fused source
    "fused compile": """
        from gradtool.device import host as fusion_host
        fusion_host.host_library(open(sys.argv[1]).read(), "f64")
    """,
    # the fused cache, killed between writing the source's temporary and its rename
    "fused source": """
        from gradtool.device import host as fusion_host
        os.replace = held
        fusion_host.host_library(open(sys.argv[1]).read(), "f64")
    """,
    # the cubin cache (gradtool.device.cuda._cubin): the same writer, no GPU needed to
    # kill it between the temporary's write and its rename
    "cubin": """
        from gradtool import native
        os.replace = held
        native.cached_bytes(native.cache_dir() / "cuda", "gt_f64_killed.cubin",
                            lambda: b"\\x7fELF a cubin")
    """,
}


def _cache_files(cache: Path) -> list:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())


def _kill_a_build(tmp_path, cache: Path, which: str) -> int:
    """Run a build of ``which`` cache in a child process, SIGKILL it (and its compiler)
    half-way, and return its pid."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    wrapper = tmp_path / "slow-cc"
    wrapper.write_text(SLOW_CC.format(cc=cc))
    wrapper.chmod(0o755)
    marker = tmp_path / "started"
    source = tmp_path / "killed.c"
    source.write_text(FUSED_SOURCE.format(n=8) + "/* killed */\n")
    script = CHILD_PRELUDE + textwrap.dedent(CHILDREN[which])
    env = {**os.environ, "GRADTOOL_CACHE": str(cache), "CC": str(wrapper),
           "GT_TEST_MARKER": str(marker), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", script, str(source)], env=env,
                            start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the build never reached the compiler"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)       # the child and its compiler
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return proc.pid


@pytest.mark.parametrize("which", list(CHILDREN))
def test_a_build_killed_half_way_leaves_no_stray_after_the_next_build(tmp_path, which,
                                                                      monkeypatch):
    require_c_compiler()
    cache = tmp_path / "cache"
    pid = _kill_a_build(tmp_path, cache, which)
    strays = [name for name in _cache_files(cache) if f".{pid}." in name]
    assert strays, f"the killed build left nothing to sweep: {_cache_files(cache)}"
    suffix = ".tmp" if which in ("fused source", "cubin") else ".tmp.so"
    assert all(name.endswith(suffix) for name in strays), strays
    # the next build, of another source, with the real compiler
    monkeypatch.setenv("GRADTOOL_CACHE", str(cache))
    next_source = tmp_path / "next.c"
    next_source.write_text(FUSED_SOURCE.format(n=8) + f"/* next after {which} */\n")
    if which == "cubin":
        data, found = native.cached_bytes(cache / "cuda", "gt_f64_next.cubin",
                                          lambda: b"next cubin")
        assert (data, found) == (b"next cubin", False)
        assert native.cached_bytes(cache / "cuda", "gt_f64_next.cubin",
                                   lambda: b"not called") == (b"next cubin", True)
    elif which == "library":
        built = native.build("next", next_source, native.SAFE_FLAGS)
        assert built.exists()
    else:
        from gradtool.device import host as fusion_host
        lib, info = fusion_host.host_library(next_source.read_text(), "f64")
        assert lib.gtf_real_bytes() == 8 and info["cached"] is False
    left = _cache_files(cache)
    assert not [name for name in left if f".{pid}." in name], left
    assert not [name for name in left if name.endswith(".tmp") or ".tmp." in name], left


def test_a_live_writers_temporary_is_left_alone(tmp_path):
    """The sweep removes a dead writer's file only: this process is alive, so its
    temporary (a build in progress) stays."""
    fd, live = native.cache_temporary(tmp_path, "gtf_0123", ".tmp")
    os.close(fd)
    assert f".{os.getpid()}." in os.path.basename(live)
    assert native.sweep_temporaries(tmp_path, ".tmp") == []
    assert os.path.exists(live)
