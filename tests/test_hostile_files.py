"""Hostile tape files: every one ends in exit status 2 and ONE stderr line naming the file
(and the node at fault), never a traceback, a hang or a huge allocation.

The corpus is built by mutating valid files: field edits and wrong types on
every node of an all-ops tape and of the samples, top-level edits,
truncations at many offsets, header bombs (lying lengths, broadcasts and
matmuls that would create or cost far too much), non-msgpack input, and
random byte flips.  Each case is run through the real click command in
process (CliRunner), cycling through inspect, backward and fd-check.
"""

import msgpack
import numpy as np
from click.testing import CliRunner

from gradtool.cli import main
from gradtool.tapefile import dumps
from gradtool.tapefile.checks import SchemaCheck, _validator_class, skeleton
from support import (COMMANDS, all_invalid_cases, all_ops_tape, assert_clean_reject,
                             base_files)


def test_invalid_files_exit_2_with_one_line_naming_file_and_node(tmp_path):
    cases = all_invalid_cases()
    assert len(cases) > 1000
    runner = CliRunner()
    seen_labels = set()
    for k, (label, data, node) in enumerate(cases):
        path = tmp_path / f"case{k}.msgpack"
        path.write_bytes(data)
        result = runner.invoke(main, COMMANDS[k % 3] + [str(path)])
        assert_clean_reject(result, label, str(path), node)
        seen_labels.add(label.split(" ", 1)[-1])
    assert len(seen_labels) > 100


def test_invalid_files_on_stdin_name_stdin():
    runner = CliRunner()
    for k, (label, data, node) in enumerate(all_invalid_cases()[::97]):
        result = runner.invoke(main, COMMANDS[k % 3] + ["-"], input=data)
        assert_clean_reject(result, label, "<stdin>", node)


def test_random_byte_flips_never_crash(tmp_path):
    """A flipped byte may leave a valid file (e.g. inside leaf data): then the command
    succeeds.  Otherwise it must be a clean exit 2 naming the file."""
    tp, loss, outputs = all_ops_tape()
    bases = [dumps(tp, loss=loss, outputs=outputs), base_files()["logistic"]]
    rng = np.random.default_rng(2024)
    runner = CliRunner()
    rejected = 0
    for k in range(400):
        data = bytearray(bases[k % 2])
        pos = int(rng.integers(len(data)))
        data[pos] ^= int(rng.integers(1, 256))
        path = tmp_path / f"flip{k}.msgpack"
        path.write_bytes(bytes(data))
        result = runner.invoke(main, ["inspect", str(path)])
        if result.exit_code == 0:
            assert result.stderr == "" and result.stdout, f"flip {k} at {pos}"
        else:
            assert_clean_reject(result, f"flip {k} at {pos}", str(path), None)
            rejected += 1
    assert rejected > 200, f"only {rejected} of 400 flips were rejected"


def test_memoized_schema_check_only_skips_nodes_plain_jsonschema_accepts():
    """The skeleton memo must never change the schema's verdict: every node whose
    skeleton is in the memo of valid skeletons is valid by plain jsonschema."""
    plain = _validator_class()(SchemaCheck().node.schema)
    memo = SchemaCheck()
    tp, loss, outputs = all_ops_tape()
    for raw in [dumps(tp, loss=loss, outputs=outputs, values=True), *base_files().values()]:
        assert memo.first_error(msgpack.unpackb(raw)) == (None, None)
    assert len(memo.valid_skeletons) > 30
    seen, skipped = set(), 0
    for label, data, _ in all_invalid_cases():
        try:
            doc = msgpack.unpackb(data, strict_map_key=False)
        except Exception:
            continue
        nodes = doc.get("nodes") if isinstance(doc, dict) else None
        for node in nodes if isinstance(nodes, list) else []:
            key = repr(node)        # by content: an id() is reused once a doc is freed
            if key in seen:
                continue
            seen.add(key)
            if skeleton(node) in memo.valid_skeletons:
                assert plain.is_valid(node), (label, node)
                skipped += 1
    assert skipped > 50
