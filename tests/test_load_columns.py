"""The loader's columnar path (tapefile.checks._plain_runs: runs of plain unary nodes
checked with numpy, replayed in a tight loop; tapefile.scan: their maps never built)
against the node-by-node path, on real files long enough to take it (the fuzz tests'
files are shorter than _RUN_MIN).

Every file, valid or mutated, must give the same thing both ways: the same error
message, or tapes equal node by node, bit for bit.
"""

import copy

import msgpack
import numpy as np
import pytest

import gradtool
from gradtool.errors import TapeFileError
from gradtool.tapefile import checks, scan
from support import Mutator

NODES = 1500
SEED = 20261202
MUTATIONS = 160


def long_doc(seed: int = 0) -> dict:
    """Two params, then runs of unary ops (some with a scalar operand, some on a
    broadcast shape) broken by binary ones and a sum, then a one-element loss."""
    rng = np.random.default_rng(seed)
    nodes = [
        {"op": "param", "a": -1, "b": -1, "s": 0.0, "shape": [3], "name": "x",
         "data": rng.standard_normal(3).astype("<f8").tobytes()},
        {"op": "param", "a": -1, "b": -1, "s": 0.0, "shape": [2, 3], "name": "w",
         "data": rng.standard_normal(6).astype("<f8").tobytes()},
        {"op": "const", "a": -1, "b": -1, "s": 0.0, "shape": [3],
         "data": rng.standard_normal(3).astype("<f8").tobytes()}]
    last = {(3,): 0, (2, 3): 1}
    unary = [("neg", 0.0), ("tanh", 0.0), ("sigmoid", 0.0), ("adds", 0.25), ("muls", 0.5),
             ("relu", 0.0), ("abs", 0.0)]
    while len(nodes) < NODES - 2:
        i = len(nodes)
        shape = (3,) if rng.integers(3) else (2, 3)
        if rng.integers(40) == 0:          # a binary node breaks the run
            nodes.append({"op": "add", "a": last[(2, 3)], "b": last[(3,)], "s": 0.0,
                          "shape": [2, 3]})
            last[(2, 3)] = i
            continue
        op, s = unary[int(rng.integers(len(unary)))]
        nodes.append({"op": op, "a": last[shape], "b": -1, "s": s, "shape": list(shape)})
        last[shape] = i
    n = len(nodes)
    nodes.append({"op": "add", "a": last[(2, 3)], "b": last[(3,)], "s": 0.0,
                  "shape": [2, 3]})
    nodes.append({"op": "sum", "a": n, "b": -1, "s": 0.0, "shape": [1]})
    return {"format": "gradtool-tape", "version": 1, "nodes": nodes}


def outcome(raw: bytes):
    """An error's message, or the loaded tape as comparable plain data."""
    try:
        tf = gradtool.load(raw, name="f")
    except TapeFileError as exc:
        return ("error", str(exc))
    tape = tf.tape
    return ("ok", [(n.op, n.a, n.b, type(n.s), repr(n.s), n.aux, n.name, n.l2)
                   for n in tape.nodes],
            [(v.dtype.str, v.shape, v.tobytes()) for v in tape.values], list(tape.requires),
            list(tape.integral), list(tape.serials), len(tape.grads), sorted(tf.recorded),
            tf.loss.id)


def both_ways(raw: bytes, monkeypatch) -> tuple:
    """(columnar outcome, node-by-node outcome); the columnar one the same whether the file
    is decoded by msgpack or by tapefile.scan (checked here)."""
    with monkeypatch.context() as m:
        m.setattr(scan, "SCAN_MIN", 1 << 62)
        columns = outcome(raw)
        m.setattr(checks, "_RUN_MIN", 1 << 62)
        nodes = outcome(raw)
    with monkeypatch.context() as m:
        m.setattr(scan, "SCAN_MIN", 32)      # the scan takes files this short too
        scanned = outcome(raw)
    assert scanned == columns
    return columns, nodes


def test_a_long_valid_file_takes_the_columnar_path_and_loads_identically(monkeypatch):
    doc = long_doc()
    raw = msgpack.packb(doc, use_bin_type=True)
    checked = checks.check(checks.decode(raw, "f", checks.Limits()), "f", checks.Limits())
    assert sum(stop - start for start, stop in checked.runs) > NODES // 2
    columns, nodes = both_ways(raw, monkeypatch)
    assert columns[0] == "ok" and columns == nodes


TARGETED = [
    ("a", -1), ("a", 10**6), ("a", True), ("a", 2.0), ("a", (1 << 64) - 1), ("b", 0), ("b", None),
    ("s", float("nan")), ("s", 1.5), ("s", True), ("s", (1 << 64) - 1), ("s", -(1 << 63)),
    ("shape", [True, 3]), ("shape", [3.0]), ("shape", []), ("shape", [0]), ("shape", [4]),
    ("shape", [[3]]), ("shape", None), ("op", "exp"), ("op", "nope"), ("op", ["neg"]),
    ("op", "sum"), ("value", b"\0" * 24), ("value", b"\0" * 8), ("extra", 1),
    ("dtype", "i64"), ("name", "x"), ("data", b""),
]


@pytest.mark.parametrize("field,value", TARGETED, ids=[f"{f}={v!r}"[:40] for f, v in TARGETED])
def test_one_bad_field_inside_a_run_gives_the_node_by_node_outcome(field, value, monkeypatch):
    doc = long_doc()
    rng = np.random.default_rng(hash((field, repr(value))) % (1 << 32))
    for _ in range(3):                     # anywhere in the runs, near the start or the end
        k = int(rng.integers(3, NODES - 2))
        bad = copy.deepcopy(doc)
        bad["nodes"][k][field] = value
        columns, nodes = both_ways(msgpack.packb(bad, use_bin_type=True), monkeypatch)
        assert columns == nodes, (k, field, value)


def test_an_unread_i64_const_or_a_node_not_a_map_gives_the_node_by_node_outcome(monkeypatch):
    doc = long_doc()
    doc["nodes"].insert(3, {"op": "const", "a": -1, "b": -1, "s": 0.0, "shape": [2],
                            "dtype": "i64", "data": np.arange(2).astype("<i8").tobytes()})
    for node in doc["nodes"][4:]:          # the ids moved up by one
        node["a"] += node["a"] >= 3
        node["b"] += node["b"] >= 3
    columns, nodes = both_ways(msgpack.packb(doc, use_bin_type=True), monkeypatch)
    assert columns == nodes and columns[0] == "error" and "no op reads them" in columns[1]
    doc = long_doc()
    doc["nodes"][700] = [1, 2]
    columns, nodes = both_ways(msgpack.packb(doc, use_bin_type=True), monkeypatch)
    assert columns == nodes and columns[0] == "error"


def whole_numbers_doc(seed: int = 1) -> tuple:
    """A long file with whole-number sources among the runs: token ids (an i64 const read
    by take), comparisons, floor and round of floats; chains of ops that keep whole
    numbers whole (neg, adds and muls by whole numbers, clamp) or do not (adds 0.25),
    ids computed by them read by take and take_along.  Returns (bytes, the recording
    Tape's integral flags)."""
    rng = np.random.default_rng(seed)
    tp = gradtool.Tape()
    x = tp.param(rng.standard_normal(3), name="x")
    table = tp.param(rng.standard_normal((4, 3)), name="table")
    ids = tp.const(np.array([0, 3, 1]), dtype="i64", name="ids")
    h, parts = x, []
    while len(tp.nodes) < NODES:
        for _ in range(int(rng.integers(20, 60))):          # a run of float unary ops
            h = tp.tanh(h) if rng.integers(2) else tp.neg(h)
        k = int(rng.integers(4))
        if k == 0:                                          # i64 ids through a take
            picked = tp.take(table, ids)                    # [3, 3]
            parts.append(tp.sum(picked))
        elif k == 1:                                        # a mask, kept whole by a chain
            m = tp.neg(tp.muls(tp.adds(tp.gt(h, tp.const(np.zeros(1))), 2.0), 3.0))
            parts.append(tp.sum(tp.mul(tp.tanh(m), h)))
        else:                                               # ids from floor or round
            r = (tp.floor if k == 2 else tp.round)(tp.muls(tp.sigmoid(h), 3.5))
            r = tp.clamp(tp.adds(r, -1.0), lo=0.0, hi=3.0)  # whole: 0 .. 3
            row = tp.take(table, r)                         # [3, 3]
            along = tp.take_along(table, tp.reshape(r, [1, 3]), axis=0)
            parts.append(tp.add(tp.sum(row), tp.sum(tp.adds(along, 0.25))))
            h = tp.add(h, tp.tanh(tp.adds(r, 0.25)))        # no longer whole
    loss = parts[0]
    for p in parts[1:]:
        loss = tp.add(loss, p)
    return gradtool.tapefile.dumps(tp, loss=loss), list(tp.integral)


def test_whole_number_sources_keep_the_columns_and_load_identically(monkeypatch):
    """Runs are taken in a file with integer data, comparisons and rounding ops (those
    turned the columns off before), whole-number chains inside them too, so their nodes'
    integral flags are the node-by-node ones and the recording Tape's, and the
    tape (values, integral flags, requires) is the same both ways."""
    raw, recorded = whole_numbers_doc()
    checked = checks.check(checks.decode(raw, "f", checks.Limits()), "f", checks.Limits())
    assert sum(stop - start for start, stop in checked.runs) > NODES // 2
    columns, nodes = both_ways(raw, monkeypatch)
    assert columns[0] == "ok" and columns == nodes
    assert columns[4] == recorded
    assert sum(recorded) > 100                # whole chains besides the sources


def _errors_on_every_path(raw: bytes, limits, monkeypatch) -> list:
    """The message of loading ``raw`` under ``limits`` by runs (msgpack decoding), node by
    node, and by runs from the byte scan."""
    got = []
    for run_min, scan_min in ((checks._RUN_MIN, 1 << 62), (1 << 62, 1 << 62),
                              (checks._RUN_MIN, 32)):
        with monkeypatch.context() as m:
            m.setattr(checks, "_RUN_MIN", run_min)
            m.setattr(scan, "SCAN_MIN", scan_min)
            with pytest.raises(TapeFileError) as err:
                gradtool.load(raw, name="f", limits=limits)
        got.append(str(err.value))
    return got


@pytest.mark.parametrize("limit", ["max_elements", "max_work"])
def test_a_budget_crossed_inside_a_run_names_the_same_node(limit, monkeypatch):
    raw = msgpack.packb(long_doc(), use_bin_type=True)
    for cap in (2000, 3001, 4444):
        limits = checks.Limits(**{limit: cap})
        got = _errors_on_every_path(raw, limits, monkeypatch)
        assert got[0] == got[1] == got[2] and "over this reader's limit" in got[0]


def test_mutated_long_files_give_the_node_by_node_outcome(monkeypatch):
    doc = long_doc(1)
    mutator = Mutator(SEED)
    errors = 0
    for _ in range(MUTATIONS):
        bad = mutator.mutate(doc)
        try:
            raw = msgpack.packb(bad, use_bin_type=True)
        except (TypeError, ValueError, OverflowError):
            continue
        columns, nodes = both_ways(raw, monkeypatch)
        assert columns == nodes
        errors += columns[0] == "error"
    assert errors > MUTATIONS // 4          # the mutations do reach the checks


def scanned_way(raw: bytes, monkeypatch):
    """(outcome through tapefile.scan, through msgpack decoding, whether the scan took it)."""
    with monkeypatch.context() as m:
        m.setattr(scan, "SCAN_MIN", 32)
        took = scan.scan(raw, "f", checks.Limits()) is not None
        scanned = outcome(raw)
    with monkeypatch.context() as m:
        m.setattr(scan, "SCAN_MIN", 1 << 62)
        decoded = outcome(raw)
    return scanned, decoded, took


def test_the_scan_takes_a_long_valid_file_and_loads_it_identically(monkeypatch):
    raw = msgpack.packb(long_doc(), use_bin_type=True)
    scanned, decoded, took = scanned_way(raw, monkeypatch)
    assert took and scanned[0] == "ok" and scanned == decoded


def test_bytes_that_look_like_a_node_inside_data_or_other_encodings(monkeypatch):
    doc = long_doc()
    fake = msgpack.packb({"op": "neg", "a": 0, "b": -1, "s": 0.0, "shape": [3]})
    doc["nodes"][0]["data"] = (fake + bytes(24))[:24]       # a node's bytes inside a param
    doc["meta"] = {"junk": fake * 3}                        # and after the node list
    raw = msgpack.packb(doc, use_bin_type=True)
    scanned, decoded, took = scanned_way(raw, monkeypatch)
    assert took and scanned[0] == "ok" and scanned == decoded
    # the same nodes in other msgpack encodings (ints as uint16/32, s as an int, a
    # float32 s, a signed int): decoded by msgpack, or matched, never misread
    body = msgpack.packb(doc, use_bin_type=True)
    for old, new in ((b"\xa1a\x05", b"\xa1a\xcd\x00\x05"), (b"\xa1a\x06", b"\xa1a\xce\x00\x00\x00\x06"),
                     (b"\xa1s\xcb" + bytes(8), b"\xa1s\x00"), (b"\xa1a\x07", b"\xa1a\xd0\x07"),
                     (b"\xa1s\xcb" + bytes(8), b"\xa1s\xca" + bytes(4)),
                     (b"\x91\x03", b"\x91\xcc\x03")):
        raw = body.replace(old, new, 7)
        scanned, decoded, took = scanned_way(raw, monkeypatch)
        assert scanned == decoded, (old, new)


def test_broken_bytes_give_the_messages_of_msgpack_decoding(monkeypatch):
    doc = long_doc()
    raw = msgpack.packb(doc, use_bin_type=True)
    rng = np.random.default_rng(SEED)
    cases = [raw + b"\x00", raw[:-1], raw[:len(raw) // 2],
             raw.replace(b"\xa5nodes", b"\xa5nodez", 1),
             raw.replace(b"\xa7version\x01", b"\xa5nodes\x90", 1)]   # "nodes" twice
    for _ in range(120):                   # random bytes replaced
        mutated = bytearray(raw)
        for _ in range(int(rng.integers(1, 4))):
            mutated[int(rng.integers(len(raw)))] = int(rng.integers(256))
        cases.append(bytes(mutated))
    errors = 0
    for case in cases:
        scanned, decoded, _ = scanned_way(case, monkeypatch)
        assert scanned == decoded
        errors += scanned[0] == "error"
    assert errors > 5


SPECIAL = [float("nan"), -float("inf"), float("inf"), -0.0, 0.0, 5e-324, -5e-324, 1e308,
           -1e308, 2.2250738585072014e-308, 0.5, -0.5, 1.0, -3.75, 40.0, 710.5, -745.2, 1e-20]


def compiled_run_doc(shapes, seed=3):
    """Runs the compiled replay takes (long stretches of one shape each): every op it
    knows read straight from a param full of special values (an input before the
    stretch), and long chains, each node reading the one before it, of ops that keep
    values bounded; a param and three such stretches per shape, one shape after another."""
    from gradtool.ops import OPS
    from gradtool.tapefile.replay import run_library
    rng = np.random.default_rng(seed)
    known = sorted(set(run_library()[1]) & set(checks._RUN_OPS))
    bounded = [op for op in ("neg", "tanh", "sigmoid", "sin", "cos", "erf", "abs", "relu",
                             "muls", "adds", "clamp_min", "clamp_max") if op in known]

    def scalar(op):
        return float(rng.choice([0.5, 2.0, -1.5, 3.0, -0.25])) if OPS[op].scalar_operand \
            else 0.0
    nodes = []
    for shape in shapes:
        size = int(np.prod(shape))
        data = np.resize(np.array(SPECIAL), size)
        x = len(nodes)
        nodes.append({"op": "param", "a": -1, "b": -1, "s": 0.0, "shape": list(shape),
                      "name": f"x{x}", "data": np.asarray(data, dtype="<f8").tobytes()})
        for _ in range(3):
            for op in known:
                nodes.append({"op": op, "a": x, "b": -1, "s": scalar(op),
                              "shape": list(shape)})
            for _ in range(400 // len(shapes)):
                op = bounded[int(rng.integers(len(bounded)))]
                nodes.append({"op": op, "a": len(nodes) - 1, "b": -1, "s": scalar(op),
                              "shape": list(shape)})
    nodes.append({"op": "sum", "a": len(nodes) - 1, "b": -1, "s": 0.0, "shape": [1]})
    return {"format": "gradtool-tape", "version": 1, "nodes": nodes}


@pytest.mark.parametrize("shapes", [[(18,)], [(3, 7)], [(1,)], [(2, 1, 5)], [(4,), (2, 9)]])
def test_the_compiled_replay_of_runs_gives_the_numpy_rules_bits(shapes, monkeypatch):
    from gradtool.tapefile import replay
    if replay.run_library() is None:
        pytest.skip("no C compiler (or GRADTOOL_NATIVE=0): runs replay by the numpy rules")
    raw = msgpack.packb(compiled_run_doc(shapes), use_bin_type=True)
    calls = []
    real = replay._run_compiled
    with monkeypatch.context() as m:
        m.setattr(replay, "_run_compiled", lambda *a: calls.append(1) or real(*a))
        compiled = outcome(raw)
    assert compiled[0] == "ok" and len(calls) == len(shapes)   # the compiled path ran
    with monkeypatch.context() as m:
        m.setattr(replay, "COMPILED_RUN_MIN", 1 << 62)
        numpy_rules = outcome(raw)
    assert compiled == numpy_rules
    tf = gradtool.load(raw, name="f")
    values = tf.tape.values
    params = [i for i, n in enumerate(tf.tape.nodes) if n.op == "param"]
    assert all(type(v) is np.ndarray and v.shape in shapes for v in values[:-1])
    assert not any(np.shares_memory(values[p], v) for p in params for v in values[p + 1:])


# ── the rest of the node-limit work: the document's own fields without jsonschema, the
# runs' requires, the replay without the compiled rules, the checks that read a node of a
# run (loss, outputs, states, the memory budget), the collector after a load ──────────

TOP_VALUES = [None, True, False, 0, 1, 2, -1, 1.0, 0.0, "", "x", "gradtool-tape", b"x", [],
              [1], {}, {"a": 0}, {"a": -1}, {"a": True}, {"a": 1.0}, {"a": "y"}, {"a": ""},
              {"a": None}, {"a": [0]}]


def test_plain_top_accepts_only_what_the_schema_accepts():
    from gradtool.tapefile.checks import _TOP_REQUIRED, _TOP_TESTS, plain_top, schema_check
    root = checks.schema()
    assert set(_TOP_TESTS) == set(root["properties"]) and list(_TOP_REQUIRED) == root["required"]
    doc = long_doc()
    doc.update(loss=len(doc["nodes"]) - 1, outputs={"y": 5}, state={}, meta={"m": 1},
               optimizer={}, numerics=1)
    assert plain_top(doc) and schema_check().top_error(doc) is None
    plain = 0
    for key in [*_TOP_TESTS, "other"]:
        for value in TOP_VALUES:
            bad = dict(doc, **{key: value})
            valid = schema_check().top_error(bad) is None
            assert not plain_top(bad) or valid, (key, value)
            plain += plain_top(bad)
        bad = dict(doc)
        bad.pop(key, None)
        assert not plain_top(bad) or schema_check().top_error(bad) is None, key
    assert plain > len(_TOP_TESTS)               # the fast verdict is taken where it can be


def test_a_file_of_plain_nodes_loads_without_importing_jsonschema(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    path = tmp_path / "long.msgpack"
    path.write_bytes(msgpack.packb(chain_doc(), use_bin_type=True))
    code = ("import sys, gradtool; tf = gradtool.load(sys.argv[1]); "
            "print(len(tf.tape.nodes), 'jsonschema' in sys.modules)")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(root), "PATH": ""},
                         cwd=tmp_path).stdout.split()
    assert out == [str(len(chain_doc()["nodes"])), "False"]


def test_run_requires_is_the_node_by_node_rule():
    from gradtool.tapefile.replay import run_requires
    rng = np.random.default_rng(SEED)
    for trial in range(300):
        m = int(rng.integers(1, 60))
        before = int(rng.integers(1, 5))        # nodes before the run
        reqs = rng.integers(2, size=before).astype(bool).tolist()
        grad_a = rng.random(m) < [0.5, 0.9, 1.0][trial % 3]
        ids = []
        for k in range(m):                     # mostly the node before, else any earlier one
            ids.append(before + k - 1 if rng.random() < 0.7 and k else
                       int(rng.integers(before + k)))
        requires = list(reqs)
        for k, a in enumerate(ids):
            requires.append(bool(grad_a[k]) and requires[a])
        ids = np.array(ids)
        local = ids - before
        outside = np.flatnonzero(local < 0)
        outside_req = np.array([reqs[a] for a in ids[outside]], dtype=bool)
        got = run_requires(grad_a, local, outside, outside_req).tolist()
        assert got == requires[before:], trial


def test_runs_replay_the_same_without_the_compiled_rules(monkeypatch):
    from gradtool.tapefile import replay
    for raw in (msgpack.packb(long_doc(), use_bin_type=True),
                msgpack.packb(compiled_run_doc([(3,), (2, 2)]), use_bin_type=True)):
        compiled = outcome(raw)
        with monkeypatch.context() as m:
            m.setattr(replay, "run_library", lambda: None)      # no compiler, NATIVE=0
            plain = outcome(raw)
        assert compiled[0] == "ok" and compiled == plain


def chain_doc(n: int = 1600) -> dict:
    """A param, a named const and a chain of unary nodes of shape [1] after them; the loss,
    the outputs and the state's output inside the chain."""
    nodes = [{"op": "param", "a": -1, "b": -1, "s": 0.0, "shape": [1], "name": "x",
              "data": np.array([0.5]).astype("<f8").tobytes()},
             {"op": "const", "a": -1, "b": -1, "s": 0.0, "shape": [1], "name": "st",
              "data": np.array([2.0]).astype("<f8").tobytes()}]
    ops = [("neg", 0.0), ("tanh", 0.0), ("adds", 0.5), ("muls", -1.5), ("sigmoid", 0.0)]
    for i in range(2, n):
        op, s = ops[i % len(ops)]
        nodes.append({"op": op, "a": i - 1 if i > 2 else 0, "b": -1, "s": s, "shape": [1]})
    return {"format": "gradtool-tape", "version": 1, "nodes": nodes, "loss": n // 2,
            "outputs": {"mid": n // 3, "end": n - 1}, "state": {"st": "mid"}}


def test_loss_outputs_and_states_inside_a_run(monkeypatch):
    doc = chain_doc()
    columns, nodes = both_ways(msgpack.packb(doc, use_bin_type=True), monkeypatch)
    assert columns[0] == "ok" and columns == nodes
    tf = gradtool.load(msgpack.packb(doc, use_bin_type=True))
    assert tf.loss.id == len(doc["nodes"]) // 2 and tf.state == {"st": "mid"}
    for key, value in (("loss", 5), ("loss", 2000), ("outputs", {"mid": 1700}),
                       ("state", {"st": "end"}), ("state", {"x": "mid"})):
        bad = dict(doc, **{key: value})
        columns, nodes = both_ways(msgpack.packb(bad, use_bin_type=True), monkeypatch)
        assert columns == nodes, (key, value)
    wide = chain_doc()                       # a loss of 3 elements inside the run
    for node in wide["nodes"]:
        node["shape"] = [3]
        if node["op"] in ("param", "const"):
            node["data"] = np.ones(3).astype("<f8").tobytes()
    columns, nodes = both_ways(msgpack.packb(wide, use_bin_type=True), monkeypatch)
    assert columns == nodes and columns[0] == "error" and "one element" in columns[1]


def test_the_memory_budget_names_the_same_node_both_ways(monkeypatch):
    from gradtool.budget import tape_memory
    raw = msgpack.packb(chain_doc(), use_bin_type=True)    # the temporary: the loss's,
    tf = gradtool.load(raw)                                 # inside a run
    need = tape_memory(tf.tape, tf.loss.id).bytes
    for cap in (2000, need // 2, need - 1):
        limits = checks.Limits(max_memory=cap)
        got = _errors_on_every_path(raw, limits, monkeypatch)
        assert got[0] == got[1] == got[2] and "memory limit" in got[0], got
        op = tf.tape.nodes[tf.loss.id].op
        assert f"node {tf.loss.id}:" in got[0] and f"this {op}'s" in got[0]


def test_gc_paused_leaves_its_objects_old_and_collectable():
    import gc
    import weakref
    from gradtool.tapefile.read import gc_paused

    class Cycle:
        pass
    was = gc.isenabled()
    gc.enable()
    try:
        with gc_paused():
            assert not gc.isenabled()
            keep = [[k] for k in range(50000)]
            ring = Cycle()
            ring.me = ring
            probe = weakref.ref(ring)
            del ring
            young_walks = gc.get_stats()[0]["collections"]
        assert gc.get_stats()[0]["collections"] == young_walks   # none came at once
        assert gc.isenabled() and any(x is keep[7] for x in gc.get_objects(generation=2))
        assert probe() is not None
        gc.collect()
        assert probe() is None                              # the cycle is collected
        gc.freeze()                                         # someone else's freeze
        frozen = gc.get_freeze_count()
        with gc_paused():
            more = [[k] for k in range(1000)]
        # Their frozen objects stay frozen (a frozen object may still die by its count, so
        # the count may fall, never rise or reach zero) and ours stay in the generations.
        assert 0 < gc.get_freeze_count() <= frozen
        assert any(x is more[7] for x in gc.get_objects())
        gc.unfreeze()
    finally:
        if not was:
            gc.disable()


def test_the_scan_in_small_blocks_of_candidates_gives_the_same_tape(monkeypatch):
    raw = msgpack.packb(long_doc(), use_bin_type=True)
    whole = scanned_way(raw, monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(scan, "_BLOCK", 7)               # a block boundary every few nodes
        m.setattr(scan, "_CHUNK", 1000)            # and a chunk of node starts too
        blocks = scanned_way(raw, monkeypatch)
    assert whole[2] and blocks[2] and blocks[0] == whole[0] == whole[1]


# ── the loader's runs, kept for inspect (describe.Columns) ─────────────────

def specials_raw(count: int = 1600) -> bytes:
    """A recorded tape: runs of unary ops on two shapes, adds and muls inside them (nodes
    inspect details), broken by named params, ops with attributes (reshape, sum over an
    axis, softmax) and binary ops."""
    from gradtool.tapefile import dumps
    from gradtool.tape import Tape
    tp = Tape()
    x = tp.param(np.ones((2, 3)), name="x", l2=0.25)
    c = tp.const(np.full(3, 0.5), name="c")
    for k in range(count):
        kind = k % 211
        if kind == 50:
            x = tp.add(x, c)
        elif kind == 90:
            x = tp.reshape(tp.reshape(x, (3, 2)), (2, 3))
        elif kind == 120:
            x = tp.add(x, tp.sum(x, axis=1, keepdims=True))
        elif kind == 150:
            x = tp.mul(x, tp.param(np.full((2, 3), 0.5), name=f"p{k}"))
        elif kind == 170:
            c = tp.softmax(tp.tanh(c), axis=0)
        elif k % 13 == 0:
            x = tp.muls(x, 0.5)
        elif k % 17 == 0:
            c = tp.adds(c, -1.0)
        else:
            x = tp.tanh(x) if k % 2 else tp.neg(x)
    return dumps(tp, loss=tp.sum(tp.add(x, c)))


def column_fields(cols) -> dict:
    """Every field of a describe.Columns, arrays as (dtype, values)."""
    return {k: (v.dtype.str, v.tolist()) if isinstance(v, np.ndarray) else v
            for k, v in vars(cols).items()}


@pytest.mark.parametrize("scan_min", [32, 1 << 62], ids=["scanned", "decoded"])
def test_the_columns_inspect_takes_from_the_loader_are_the_nodes_columns(scan_min,
                                                                        monkeypatch):
    from gradtool.describe import Columns
    monkeypatch.setattr(scan, "SCAN_MIN", scan_min)
    wide = chain_doc(2000)                   # a run of shape [2, 3] from node 2 on
    for node in wide["nodes"]:
        node["shape"] = [2, 3]
        if node["op"] in ("param", "const"):
            node["data"] = np.ones(6).astype("<f8").tobytes()
    wide["nodes"].append({"op": "sum", "a": 1999, "b": -1, "s": 0.0, "shape": [1]})
    wide["loss"] = 2000
    raws = [msgpack.packb(long_doc(seed), use_bin_type=True) for seed in (0, 1)]
    raws += [msgpack.packb(doc, use_bin_type=True) for doc in (chain_doc(), chain_doc(1 << 15), wide)]
    raws.append(specials_raw())
    for raw in raws:
        tf = gradtool.load(raw)
        assert tf.loaded_runs() is not None
        loaded, nodes = Columns.of(tf), Columns(tf.tape)
        assert loaded.ints and column_fields(loaded) == column_fields(nodes)
        assert len(loaded.special) < loaded.n      # the runs' plain nodes are not special
    assert {"adds", "muls", "sum", "reshape", "softmax", "param"} <= set(loaded.ops)


def test_a_file_without_runs_keeps_none():
    from gradtool.tapefile import dumps
    from gradtool.tape import Tape
    tp = Tape()
    x = tp.param(np.ones(2), name="x")
    for _ in range(5):                         # under checks._RUN_MIN nodes
        x = tp.neg(x)
    assert gradtool.load(dumps(tp, loss=tp.sum(x))).loaded_runs() is None
    tp = Tape()
    x, c = tp.param(np.ones(2), name="x"), tp.const(np.ones(2))
    for _ in range(1200):                      # binary ops only: no run
        x = tp.add(x, c)
    tf = gradtool.load(dumps(tp, loss=tp.sum(x)))
    assert tf.loaded_runs() is None and len(tf.tape.nodes) > checks._RUN_MIN


def test_inspect_reads_the_nodes_once_the_loaded_tape_changed(monkeypatch):
    from gradtool.cli.tapes import _node_table
    from gradtool.describe import Columns
    raw = specials_raw()

    def changed(change):
        tf = gradtool.load(raw)
        tape, runs = tf.tape, tf.loaded_runs()
        start, stop = max(runs.runs, key=lambda run: run[1] - run[0])
        assert stop - start > 8
        change(tf, tape, stop - 4)           # a mark inside a run
        return tf

    def record(tf, tape, mark):               # one node more
        tape.exp(tape.var(mark))

    def reset(tf, tape, mark):                 # fewer nodes
        tape.reset_to(mark)

    def reset_and_record(tf, tape, mark):      # as many nodes, other ops
        n = len(tape.nodes)
        tape.reset_to(mark)
        y = tape.var(mark - 1)
        while len(tape.nodes) < n:
            y = tape.exp(y)

    def other_tape(tf, tape, mark):
        tf.tape = gradtool.load(specials_raw(1500)).tape

    for change in (record, reset, reset_and_record, other_tape):
        tf = changed(change)
        assert tf.loaded_runs() is None, change.__name__
        assert column_fields(Columns.of(tf)) == column_fields(Columns(tf.tape))
    tf = changed(reset_and_record)
    assert Columns.of(tf).ops[-1] == "exp" and "exp" in _node_table(tf)[-1]

    def set_leaves(tf, tape, mark):            # the same shapes: the runs still hold
        tape.set_value(tape.var("x"), np.full((2, 3), 2.0))
        tape.forward()

    tf = changed(set_leaves)
    assert tf.loaded_runs() is not None
    assert column_fields(Columns.of(tf)) == column_fields(Columns(tf.tape))
