"""The command line, in process and as real processes: :func:`run` (click's runner),
:func:`assert_one_line_error`, :func:`run_limited` (a command under memory and CPU
limits), :func:`stderr_through_a_terminal`, the fuzz test's limited worker
(:func:`cli_batch`: ``python tests/support.py cli-batch JOBS.json``), and
:func:`train_under_mpiexec` (``gradtool train`` on MPI ranks).  Tests import these
through tests/support.py.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from gradtool.cli import main

from support_tapes import ROOT


def run(*args, input=None):
    """The gradtool command line, in process: ``run("inspect", path)``."""
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def assert_one_line_error(result, status, *needles):
    """Exit ``status`` with ONE stderr line ``gradtool: ...`` holding every needle."""
    assert result.exit_code == status, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradtool: "), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ── running under limits ───────────────────────────────────────────────────

def limit_resources(memory_bytes: int, cpu_seconds: int):
    """A preexec_fn: cap the child's address space and CPU time."""
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    return apply


def run_limited(args, *, memory_bytes: int = 1 << 30, cpu_seconds: int = 60, timeout=120,
                **kwargs):
    """``subprocess.run`` with the memory and CPU caps and a wall-clock timeout."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env,
                          preexec_fn=limit_resources(memory_bytes, cpu_seconds), **kwargs)


GRADTOOL = [sys.executable, "-c", "from gradtool.cli import main; main()"]


def stderr_through_a_terminal(args, timeout=120) -> tuple:
    """Run ``args`` with stderr on a pseudo-terminal; (exit status, what it wrote there)."""
    import pty
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=timeout)
    proc.stdout.close()
    os.close(master)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


# ── a batch of CLI runs in one limited worker process ─────────────────────

def cli_batch(jobs_path: str) -> None:
    """Worker: for each ``[args...]`` in the JSON list at ``jobs_path``, run the gradtool
    command in this process (click's CliRunner) and print one JSON line: the exit
    status, stderr's lines, whether a traceback or an internal error showed, and the
    exception if one escaped."""
    import json

    from click.testing import CliRunner

    from gradtool.cli import main
    runner = CliRunner()
    with open(jobs_path) as f:
        jobs = json.load(f)
    for args in jobs:
        result = runner.invoke(main, args)
        escaped = result.exception
        if isinstance(escaped, SystemExit):
            escaped = None
        print(json.dumps({"args": args, "status": result.exit_code,
                          "stderr": result.stderr.splitlines(),
                          "traceback": "Traceback" in result.stderr + result.stdout,
                          "escaped": None if escaped is None else repr(escaped)}), flush=True)


def mpiexec_path():
    """The mpiexec beside this Python (the mpich wheel's) or on PATH; None without it or
    without mpi4py."""
    import importlib.util
    import shutil
    if importlib.util.find_spec("mpi4py") is None:
        return None
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def train_under_mpiexec(tape, args, save: Path, ranks: int = 2) -> bytes:
    """``mpiexec -n RANKS gradtool train TAPE ARGS --save SAVE`` with this checkout first on
    the path, one BLAS thread a rank and no launcher variables inherited from a caller;
    the bytes it saved.  Skips the test without mpi4py or mpiexec."""
    import pytest
    from gradtool.train.distributed import LAUNCHER_RANK_VARS
    mpiexec = mpiexec_path()
    if mpiexec is None:
        pytest.skip("no mpi4py/mpiexec (pip install -e '.[mpi]'): the in-process runs were "
                    "compared")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    for var in LAUNCHER_RANK_VARS + ("GRADTOOL_MPI_WORKER",):
        env.pop(var, None)
    cmd = [mpiexec, "-n", str(ranks), sys.executable, "-c",
           "from gradtool.cli import main; main()", "train", str(tape), *map(str, args),
           "--save", str(save)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return Path(save).read_bytes()
