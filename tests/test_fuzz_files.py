"""A seeded structure-aware fuzz of tape files: real files decoded, mutated as data
(keys, types, sizes, nesting, ids, strings, versions, shapes, attributes, data
lengths; see support.Mutator), re-encoded with msgpack, and run through the
commands.

Every file must end in success or a gradtool error: exit status 0, 1 or 2, at most
one stderr line for a failure, never a traceback, and within limits: the commands
run under ``gradtool --max-memory 256M`` in a worker process whose address space
and CPU time are capped (RLIMIT_AS, RLIMIT_CPU), so a file the budgets failed to
bound would kill the worker instead of passing.
"""

import json
import sys
from pathlib import Path

import msgpack
import numpy as np
from click.testing import CliRunner

from gradtool.cli import main
from support import ROOT, SAMPLES, Mutator, base_files, pack_any, run_limited

SEED = 20261130
FILES = 1200                 # through the commands in one limited worker process
REAL_PROCESSES = 12          # and a sample as real `python -m gradtool` processes
WORKER_MEMORY = 1 << 30      # bytes of address space (the budget below is 256 MiB)
BUDGET = ["--max-memory", "256M"]
DATA = SAMPLES / "digits.npz"


def bases(tmp_path) -> dict:
    """Decoded real files: every sample, the all-ops tape, and a train --save checkpoint
    (so that the optimizer state and training position are fuzzed too)."""
    files = {name: msgpack.unpackb(raw) for name, raw in base_files().items()}
    for path in sorted(SAMPLES.glob("*.msgpack")) + sorted(SAMPLES.glob("*/*.msgpack")):
        files[path.stem] = msgpack.unpackb(path.read_bytes())
    checkpoint = tmp_path / "checkpoint.msgpack"
    result = CliRunner().invoke(main, ["train", str(SAMPLES / "digits_mlp.msgpack"), "--data",
                                       str(DATA), "--steps", "5", "--save", str(checkpoint)])
    assert result.exit_code == 0, result.output
    files["checkpoint"] = msgpack.unpackb(checkpoint.read_bytes())
    return files


def commands(path: Path, k: int, trainable: bool) -> list:
    """The k-th file's command: the tape commands in turn; train for the digits tapes."""
    if trainable:
        return ["train", str(path), "--data", str(DATA), "--steps", "2"]
    out = path.with_suffix(".npz")
    return [["inspect", str(path)], ["inspect", "--json", str(path)],
            ["backward", "--json", "--hex", str(path)], ["backward", "-o", str(out), str(path)],
            ["fd-check", "--max-evals", "4000", str(path)], ["emit-cuda", str(path)],
            ["replay-gpu", "--backend", "host", "--episodes", "2", "--warmup", "0", "--check",
             str(path)]][k % 7]


def corpus(tmp_path, count: int, seed: int) -> list:
    """(path, args) for ``count`` mutated files, written under tmp_path."""
    docs = bases(tmp_path)
    names = sorted(docs)
    mutator = Mutator(seed)
    jobs = []
    for k in range(count):
        name = names[k % len(names)]
        path = tmp_path / f"fuzz{k}_{name}.msgpack"
        path.write_bytes(pack_any(mutator.mutate(docs[name])))
        jobs.append((path, commands(path, k, name in ("digits_mlp", "digits_mlp_f32",
                                                      "checkpoint"))))
    return jobs


def assert_clean(status: int, stderr_lines: list, context: str) -> None:
    assert status in (0, 1, 2), context
    lines = [line for line in stderr_lines if not line.startswith("gradtool: note:")]
    if status:
        assert len(lines) >= 1 and lines[-1].startswith("gradtool: "), context
        if not context.startswith("train"):      # train prints its notes first
            assert len(lines) == 1, context
    assert "internal error" not in "\n".join(stderr_lines), context


def test_mutated_files_end_in_success_or_one_line_errors_within_limits(tmp_path):
    jobs = corpus(tmp_path, FILES, SEED)
    (tmp_path / "jobs.json").write_text(json.dumps([BUDGET + args for _, args in jobs]))
    worker = run_limited([sys.executable, str(ROOT / "tests" / "support.py"),
                          "cli-batch", str(tmp_path / "jobs.json")],
                         memory_bytes=WORKER_MEMORY, cpu_seconds=600, timeout=900)
    assert worker.returncode == 0, worker.stderr[-2000:]
    records = [json.loads(line) for line in worker.stdout.splitlines()]
    assert len(records) == FILES
    statuses = {0: 0, 1: 0, 2: 0}
    for record in records:
        context = f"{' '.join(record['args'][2:])}: {record}"
        assert record["escaped"] is None and not record["traceback"], context
        assert_clean(record["status"], record["stderr"], context)
        statuses[record["status"]] += 1
    # the corpus is neither all valid nor all rejected, and trains some checkpoints
    assert statuses[2] > FILES // 2 and statuses[0] > FILES // 50, statuses
    assert sum(r["status"] == 0 and r["args"][2] == "train" for r in records) > 10


def test_a_sample_of_mutated_files_in_real_processes(tmp_path):
    rng = np.random.default_rng(SEED)
    jobs = corpus(tmp_path, 200, SEED + 1)
    for k in rng.choice(len(jobs), REAL_PROCESSES, replace=False):
        path, args = jobs[int(k)]
        result = run_limited([sys.executable, "-m", "gradtool", *BUDGET, *args],
                             memory_bytes=WORKER_MEMORY, cpu_seconds=120, timeout=300)
        context = f"{' '.join(args)}: exit {result.returncode}, stderr {result.stderr[-600:]!r}"
        assert "Traceback" not in result.stderr, context
        assert_clean(result.returncode, result.stderr.splitlines(), context)


def test_the_loaders_fast_path_only_accepts_what_the_schema_and_the_checks_accept(tmp_path):
    """tapefile_checks.plain_node skips the schema and the general checks for ordinary
    nodes; it must return exactly what they would, for every node it accepts."""
    from gradtool.errors import GradtoolError
    from gradtool.tapefile.checks import SchemaCheck, _check_node, _validator_class, plain_node
    plain_schema = _validator_class()(SchemaCheck().node.schema)
    docs = bases(tmp_path)
    mutator = Mutator(SEED + 2)
    names = sorted(docs)
    corpus_docs = list(docs.values()) + [mutator.mutate(docs[names[k % len(names)]])
                                         for k in range(160)]
    accepted = refused = 0
    for doc in corpus_docs:
        nodes = doc.get("nodes") if isinstance(doc, dict) else None
        earlier, leaf_names = [], {}
        for i, raw in enumerate(nodes if isinstance(nodes, list) else []):
            fast = plain_node(i, raw, earlier, dict(leaf_names))
            try:
                if not plain_schema.is_valid(raw):
                    raise GradtoolError("schema")
                general = _check_node(i, raw, earlier, leaf_names, "x")
            except (GradtoolError, KeyError, TypeError):
                assert fast is None, (i, raw)
                break
            if fast is None:
                refused += 1
            else:
                assert fast == general, (i, raw)
                accepted += 1
            earlier.append(general)
    assert accepted > 2000 and refused > 20, (accepted, refused)
