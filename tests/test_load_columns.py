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


def test_an_i64_const_or_a_node_not_a_map_turns_the_columns_off(monkeypatch):
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


@pytest.mark.parametrize("limit", ["max_elements", "max_work"])
def test_a_budget_crossed_inside_a_run_names_the_same_node(limit, monkeypatch):
    raw = msgpack.packb(long_doc(), use_bin_type=True)
    for cap in (2000, 3001, 4444):
        limits = checks.Limits(**{limit: cap})
        got = []
        for run_min, scan_min in ((checks._RUN_MIN, 1 << 62), (1 << 62, 1 << 62),
                                  (checks._RUN_MIN, 32)):
            with monkeypatch.context() as m:
                m.setattr(checks, "_RUN_MIN", run_min)
                m.setattr(scan, "SCAN_MIN", scan_min)
                with pytest.raises(TapeFileError) as err:
                    gradtool.load(raw, name="f", limits=limits)
            got.append(str(err.value))
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
