"""`gradtool inspect | backward | fd-check TAPE`: thin commands over a loaded tape file.

Each command loads TAPE (a path, or ``-`` for stdin) with
:func:`gradtool.tapefile.load`, which validates everything and replays the
forward pass, then calls one library function and formats the result.
Floats in JSON go through Python's repr, so they round-trip exactly;
``--hex`` writes ``float.hex`` strings instead.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Optional

import click
import numpy as np

from .. import rowtext
from ..describe import (Columns, first_mismatch, node_entry, plain_node, shortest, summary_head,
                        summary_json_parts, to_dot)
from ..errors import GradtoolError
from ..gradcheck import FD_WORK_BUDGET, fd_cost, require_float64, sample_within
from ..gradcheck import fd_check as run_fd_check
from ..numerics import NUMERICS_CONTRACTS, NUMERICS_VERSION
from ..ops import OPS, format_shape
from ..tapefile import TapeFile
from .common import (CheckFailed, echo_rows, load_tape, memory_budget,
                     output_file_not_stdout, without_gc_pauses)

TAPE_HELP = "TAPE is a gradtool tape file (msgpack, format v1), or - for standard input."


def _emit_json(obj) -> None:
    click.echo(json.dumps(obj))


def _table(rows, header) -> list:
    """Left-aligned text columns (numbers right-aligned) as lines."""
    rows = [[c if type(c) is str else str(c) for c in row] for row in rows]
    columns = [[h] for h in header]
    if rows:
        columns = [[h, *column] for h, column in zip(header, zip(*rows))]
    fmt = "  " + "  ".join(
        "{:%s%d}" % (">" if len(col) > 1 and all(map(_is_num, col[1:])) else "<",
                     max(map(len, col)))
        for col in columns)
    return [fmt.format(*row).rstrip() for row in [header, *rows]]


def _is_num(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _node_label(tf: TapeFile, i: int) -> str:
    node = tf.tape.nodes[i]
    return f"{i} ({node.name})" if node.name else str(i)


# ── inspect ────────────────────────────────────────────────────────────────

@click.command("inspect", epilog=TAPE_HELP)
@click.argument("tape", metavar="TAPE")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: nodes, op histogram, params, inputs, outputs, loss.")
@click.option("--dot", is_flag=True,
              help="Print the graph as Graphviz DOT (params, consts and ops drawn "
                   "differently; the loss marked).")
@without_gc_pauses
def inspect(tape: str, as_json: bool, dot: bool) -> None:
    """Describe a tape file: nodes, op histogram, params, input slots, outputs, loss."""
    if as_json and dot:
        raise GradtoolError("--json and --dot cannot be combined; pick one")
    tf = load_tape(tape)
    if dot:
        click.echo(to_dot(tf), nl=False)
    elif as_json:
        head, *rows = summary_json_parts(tf)
        echo_rows(head.decode("ascii"), [*rows, b"\n"])
    else:
        echo_rows(*_inspect_text(tf))


def _inspect_text(tf: TapeFile) -> tuple:
    """What ``inspect`` prints: (the lines before the node table, as text; the table, as
    UTF-8 bytes to join), every line ending with a newline."""
    cols = Columns.of(tf)
    s = summary_head(tf, cols)
    ops = s["ops"]
    n_leaf = ops.get("param", 0) + ops.get("const", 0)
    lines = [f"{s['file']}: gradtool-tape v{s['version']}, {s['node_count']} nodes "
             f"({ops.get('param', 0)} params, {ops.get('const', 0)} consts, "
             f"{s['node_count'] - n_leaf} ops)",
             f"loss: node {s['loss']['id']} ({s['loss']['op']}) = {s['loss']['value']!r}",
             "ops: " + ", ".join(f"{k} {v}" for k, v in ops.items() if k not in ("param", "const"))]
    lines += [f"meta {key}: {_short(value)}" for key, value in s["meta"].items()]
    total = sum(p["elements"] for p in s["params"])
    lines.append(f"params ({len(s['params'])}, {total} elements):")
    lines += _table([[p["id"], p["name"] or "-", format_shape(p["shape"]), p["elements"], repr(p["l2"])]
                     for p in s["params"]], ["id", "name", "shape", "elements", "l2"])
    lines.append(f"inputs (named consts, {len(s['inputs'])}):")
    lines += _table([[c["id"], c["name"], format_shape(c["shape"]), c["dtype"]]
                     for c in s["inputs"]], ["id", "name", "shape", "dtype"])
    if "state" in s:
        lines.append(f"state (named consts each step's output replaces, {len(s['state'])}):")
        lines += _table([[c["id"], c["name"], format_shape(c["shape"]), c["output"]]
                         for c in s["state"]], ["id", "name", "shape", "output"])
    lines.append(f"outputs ({len(s['outputs'])}):")
    lines += _table([[o["name"], o["id"], o["op"], format_shape(o["shape"])] for o in s["outputs"]],
                    ["name", "id", "op", "shape"])
    lines.append("nodes:")
    return "\n".join(lines) + "\n", _node_text(tf, cols)


_NODE_HEADER = ["id", "op", "inputs", "shape", "detail"]


def _node_table(tf: TapeFile) -> list:
    """``_table`` of the node rows (id, op, inputs, shape, detail), as lines."""
    return b"".join(_node_text(tf)).decode("utf-8").split("\n")[:-1]


def _node_text(tf: TapeFile, cols: Optional[Columns] = None) -> list:
    """The lines of :func:`_node_table`, each ending with a newline, as UTF-8 bytes to
    join; made by columns for a tape of a million nodes: whether a column is numeric and how
    wide decided on its distinct cells, the rows from the columns' texts
    (:mod:`gradtool.rowtext`) but for the nodes with a detail, which are written one by
    one."""
    tape = tf.tape
    nodes, n = tape.nodes, len(tape.nodes)
    cols = Columns.of(tf) if cols is None else cols
    if not cols.ints:
        rows = _table([[str(i), nd.op, _inputs(nd.a, nd.b), format_shape(v.shape),
                        "" if plain_node(nd) else _detail(node_entry(tape, i))]
                       for i, (nd, v) in enumerate(zip(nodes, tape.values))], _NODE_HEADER)
        return [("\n".join(rows) + "\n").encode("utf-8")]
    ops, a, b = cols.ops, cols.a, cols.b
    # the inputs cell: "a,b", "a" or "-", as fields, and its length
    has_b = b >= 0
    dash = ~has_b & (a < 0)
    a_text, b_text = rowtext.integers(a), rowtext.integers(b)
    inputs_length = np.where(dash, 1, a_text.length + has_b * (1 + b_text.length))
    shape_text = [format_shape(shape) for shape in cols.shapes]
    details = {}
    for i in cols.special:
        if not plain_node(nodes[i]):
            details[i] = _detail(node_entry(tape, i))
    detail_cells = set(details.values()) | ({""} if len(details) < n else set())
    op_cells = cols.op_names
    unary = bool(np.all(~has_b & ~dash))           # every inputs cell is str(a)
    numeric = [True,                               # str of an int
               all(map(_is_num, op_cells)),
               unary,                              # "-" and "a,b" are not numbers
               all(map(_is_num, shape_text)),
               all(map(_is_num, detail_cells))]
    widths = [len(str(n - 1)), max(map(len, op_cells)), int(inputs_length.max()),
              max(map(len, shape_text)), max(map(len, detail_cells))]
    widths = [max(len(h), w) for h, w in zip(_NODE_HEADER, widths)]
    cell = [f"%{'' if num else '-'}{w}s" for num, w in zip(numeric, widths)]
    template = "  " + "  ".join(cell)
    header = (template % tuple(_NODE_HEADER)).rstrip()
    others = {i: (template % (str(i), ops[i], _inputs(int(a[i]), int(b[i])),
                              shape_text[cols.shape_code[i]], details.get(i, ""))
                  ).rstrip().encode("utf-8")
              for i in cols.special}
    # a row without a detail: its shape cell is the last, its padding cut off as rstrip does
    fields = [rowtext.integers(np.arange(n), width=2 + widths[0]),
              rowtext.lookup(["  " + cell[1] % op + "  " for op in op_cells], cols.op_code)]
    if unary:
        fields.append(rowtext.integers(a, width=widths[2]))
    else:
        fields += [rowtext.when(a_text, ~dash), rowtext.when(rowtext.const("-"), dash),
                   rowtext.when(rowtext.const(","), has_b), rowtext.when(b_text, has_b),
                   rowtext.pad(widths[2] - inputs_length)]
    fields.append(rowtext.lookup([("  " + cell[3] % text).rstrip() for text in shape_text],
                                 cols.shape_code))
    return [(header + "\n").encode("utf-8"), *rowtext.render(n, fields, "\n", others), b"\n"]


def _short(value, limit: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _inputs(a: int, b: int) -> str:
    return f"{a},{b}" if b >= 0 else str(a) if a >= 0 else "-"


# the scalar operand, the dtype, then every attribute a file node stores, in table order
_DETAIL_KEYS = ("s", "dtype", *dict.fromkeys(at.name for spec in OPS.values()
                                             for at in spec.attrs if at.stored))


def _detail(n: dict) -> str:
    parts = []
    if "name" in n:
        parts.append(repr(n["name"]))
    if n.get("l2"):
        parts.append(f"l2={n['l2']!r}")
    for key in _DETAIL_KEYS:
        if key in n:
            parts.append(f"{key}={n[key]!r}")
    return " ".join(parts)


def verify_recorded(tf: TapeFile) -> int:
    """--verify: every recorded op value equals the replay to the bit, else CheckFailed."""
    if not tf.recorded:
        raise GradtoolError(f"{tf.source}: --verify: the file records no values "
                            f"(write it with values=True)")
    mismatch = first_mismatch(tf)
    if mismatch is not None and tf.numerics != NUMERICS_VERSION:
        old = NUMERICS_CONTRACTS.get(tf.numerics, "a contract this gradtool does not know")
        raise CheckFailed(
            f"{tf.source}: --verify: the recorded values were computed under numerics "
            f"version {tf.numerics} ({old}); this gradtool computes version "
            f"{NUMERICS_VERSION} ({NUMERICS_CONTRACTS[NUMERICS_VERSION]}): re-save the file "
            f"with values=True to verify it (first difference at node {mismatch.node})")
    if mismatch is not None:
        raise CheckFailed(f"{tf.source}: {mismatch.describe()}")
    return len(tf.recorded)


# ── backward ───────────────────────────────────────────────────────────────

@click.command("backward", epilog=TAPE_HELP)
@click.argument("tape", metavar="TAPE")
@click.option("--json", "as_json", is_flag=True,
              help='Print one JSON object: {"loss": x, "params": [{"id", "name", "shape", '
                   '"grad": [flat, row-major]}, ...]} in tape order; floats round-trip exactly.')
@click.option("--hex", "as_hex", is_flag=True,
              help="Write every float as a C99 hex string (float.hex), for bit comparisons.")
@click.option("-o", "--output", metavar="FILE", callback=output_file_not_stdout,
              help="Also write the gradients to this .npz, keyed by param name (or node<ID>).")
@click.option("--verify", is_flag=True,
              help="First compare every value recorded in the file bit for bit with the "
                   "replay; exit 1 naming the first node that differs.")
@click.option("--data", "data_path", metavar="DATA.npz",
              help="Sum over a dataset instead: one array per input slot (as for train); "
                   "replay each batch in order and add its loss and gradients into running "
                   "sums starting at 0.0 (the order of one swarm_g_add per example).")
@without_gc_pauses
def backward(tape: str, as_json: bool, as_hex: bool, output: str, verify: bool,
             data_path: str) -> None:
    """Replay the forward pass from the leaves, run backward, print the loss and every
    parameter's gradient (with --data: their sums over the dataset's examples)."""
    tf = load_tape(tape)
    verified = verify_recorded(tf) if verify else None
    t = tf.tape
    summed = None
    if data_path is not None:
        from ..train.data import gradient_sum, input_slots, load_dataset
        slots = input_slots(t, tf.state)
        summed = gradient_sum(t, tf.loss, load_dataset(data_path, slots, memory_budget()),
                              slots)
        loss = summed.loss
        grads = [(p.id, t.nodes[p.id].name, summed.grads[p.id]) for p in t.params()]
    else:
        t.zero_grad()
        t.backward(tf.loss)
        lossv = t.values[tf.loss.id]
        loss = float(lossv.reshape(-1)[0]) if as_hex else shortest(lossv)[0]
        grads = [(p.id, t.nodes[p.id].name, np.array(t.grad(p))) for p in t.params()]
    if output is not None:
        from ..npzio import write_npz
        write_npz(output, _npz_arrays(tf, grads))
    num = float.hex if as_hex else (lambda x: x)
    if as_json:
        # float32 gradients: their shortest exact decimals (describe.shortest), or with
        # --hex the hex text of each float32 value (widened exactly)
        counts = {} if summed is None else {"batches": summed.batches,
                                            "examples": summed.examples}
        _emit_json({"loss": num(loss), **counts,
                    "params": [{"id": i, "name": name, "shape": list(g.shape),
                                "grad": [num(x) for x in (g.reshape(-1).tolist() if as_hex
                                                          else shortest(g))]}
                               for i, name, g in grads]})
        return
    exact = float.hex if as_hex else repr
    show = float.hex if as_hex else (lambda x: f"{x:.6g}")
    what = "loss" if summed is None else f"sum of {summed.batches} batch losses"
    lines = [f"{what} = {exact(loss)}  (node {tf.loss.id}, {t.nodes[tf.loss.id].op})"]
    if verified is not None:
        lines.append(f"verify: {verified} recorded values match the replay bit for bit")
    rows = []
    for i, name, g in grads:
        flat = shortest(g) if not as_hex else g.reshape(-1).tolist()
        first = ", ".join(show(x) for x in flat[:4]) + (", ..." if len(flat) > 4 else "")
        norm = math.sqrt(math.fsum(x * x for x in flat))
        rows.append([i, name or "-", format_shape(g.shape), f"{norm:.6g}", first])
    lines += _table(rows, ["id", "name", "shape", "|grad|", "first values"]) if rows \
        else ["(no params)"]
    click.echo("\n".join(lines))


def _npz_arrays(tf: TapeFile, grads) -> dict:
    """{npz key: gradient}: the param's name, or ``node<ID>`` for an unnamed param and for
    a name no npz can hold (NUL, over 65,531 bytes; a note on stderr says so).  Two
    params that would share a key are refused before anything is written."""
    from ..npzio import member_name_problem
    arrays, owner, notes = {}, {}, []
    for i, name, g in grads:
        key = name or f"node{i}"
        problem = member_name_problem(key)
        if problem:
            key = f"node{i}"
            notes.append(f"gradtool: note: param {i}'s name cannot be an npz key ({problem}); "
                         f"its gradient is stored as {key!r}")
        if key in arrays:
            raise GradtoolError(f"{tf.source}: node {i}: cannot write the npz: this param would "
                                f"be stored as {key!r}, which param {owner[key]} already uses")
        arrays[key], owner[key] = g, i
    for note in notes:
        click.echo(note, err=True)
    return arrays


# ── fd-check ───────────────────────────────────────────────────────────────

@click.command("fd-check", epilog=TAPE_HELP)
@click.argument("tape", metavar="TAPE")
@click.option("--eps", type=float, default=1e-6, show_default=True,
              help="Central-difference step added to and subtracted from each element.")
@click.option("--rtol", type=float, default=1e-5, show_default=True,
              help="Relative tolerance: pass when |an - num| <= atol + rtol * max(|an|, |num|).")
@click.option("--atol", type=float, default=1e-6, show_default=True,
              help="Absolute tolerance (see --rtol).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object with the per-parameter errors and verdicts.")
@click.option("--params", "only", metavar="NAME,...",
              help="Check only these params: leaf names, or node ids for unnamed ones "
                   "(7 or node7).")
@click.option("--sample", type=click.IntRange(min=1), metavar="N",
              help="Check N elements of each param (all of a smaller one), drawn with "
                   "--seed.  Default: every element, or, when that is over the budget, "
                   "the largest N within it (the output says so).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the --sample draw (per param: numpy default_rng((seed, id))).")
@click.option("--max-evals", type=click.IntRange(min=1), metavar="N",
              help="Allow up to N loss evaluations (two per parameter element checked) "
                   "whatever they cost, and check every element unless --sample is given; "
                   f"without it the estimated work must stay within {FD_WORK_BUDGET:.3g} "
                   f"operations.")
@without_gc_pauses
def fd_check(tape: str, eps: float, rtol: float, atol: float, as_json: bool, only: str,
             sample, seed: int, max_evals: int) -> None:
    """Check backward against central finite differences for every parameter element
    (or a sample); exit 0 when all pass, 1 when any fails.  An element whose difference
    changes between eps and eps/10 is near a kink (relu, max): it is listed as
    non-smooth and does not count.  The cost is estimated first: a check over the
    budget is sampled, or refused (exit 2) before it starts."""
    for opt, val in (("--eps", eps), ("--rtol", rtol), ("--atol", atol)):
        if not (math.isfinite(val) and val >= 0) or (opt == "--eps" and val == 0):
            raise GradtoolError(f"{opt} must be a finite number "
                                f"{'> 0' if opt == '--eps' else '>= 0'}, got {val!r}")
    tf = load_tape(tape)
    require_float64(tf.tape, f"{tf.source}: fd-check")
    chosen = _params_option(tf, only)
    auto = None
    if sample is None and max_evals is None:
        auto = sample_within(tf.tape, chosen)          # None: every element fits
        if auto:
            sample = auto
    _check_fd_budget(tf, fd_cost(tf.tape, chosen), fd_cost(tf.tape, chosen, sample),
                     max_evals, sample)
    with FDProgress(tf) as progress:
        report = run_fd_check(tf.tape, tf.loss, eps=eps, rtol=rtol, atol=atol, params=chosen,
                              progress=progress.update, sample=sample, seed=seed)
    params = [{"id": p.id, "name": p.name, "shape": list(p.shape),
               "checked": p.checked, "sampled": p.sampled,
               "max_abs_err": p.max_abs_err, "max_rel_err": p.max_rel_err,
               "worst_index": list(p.worst_index), "analytic": p.analytic,
               "numeric": p.numeric, "passed": p.passed,
               "nonsmooth": [{"index": list(n.index), "analytic": n.analytic,
                              "numeric": n.numeric, "numeric_small": n.numeric_small}
                             for n in p.nonsmooth]} for p in report.params]
    failed = [p for p in report.params if not p.passed]
    nonsmooth = sum(len(p.nonsmooth) for p in report.params)
    if as_json:
        _emit_json({"loss": report.loss, "eps": eps, "rtol": rtol, "atol": atol,
                    "sample": sample, "sample_auto": bool(auto), "seed": seed,
                    "passed": not failed, "nonsmooth": nonsmooth, "params": params})
    else:
        click.echo("\n".join(_fd_lines(report, params, failed, nonsmooth, auto, seed)))
    if failed:
        p = failed[0]
        label = f"param {p.id} ({p.name})" if p.name else f"param {p.id}"
        raise CheckFailed(f"{tf.source}: node {p.id}: fd-check failed for {len(failed)} of "
                          f"{len(params)} params; first {label} at index "
                          f"{list(p.worst_index)}: analytic {p.analytic!r}, "
                          f"numeric {p.numeric!r}")


NONSMOOTH_SHOWN = 20          # non-smooth elements listed in the text report


def _fd_lines(report, params, failed, nonsmooth, auto, seed) -> list:
    eps = report.eps
    lines = [f"loss = {report.loss!r}  eps={eps!r} rtol={report.rtol!r} atol={report.atol!r}"]
    if report.sample is not None:
        why = (" (every element would be over the budget; --max-evals N checks them all)"
               if auto else "")
        lines.append(f"sampled: {report.sample} elements per param, seed {seed}{why}")
    lines += _table([[p["id"], p["name"] or "-", format_shape(p["shape"]), p["checked"],
                      f"{p['max_abs_err']:.3g}", f"{p['max_rel_err']:.3g}",
                      (f"FAIL at {p['worst_index']}: analytic {p['analytic']!r}, "
                       f"numeric {p['numeric']!r}") if not p["passed"] else
                      f"ok ({len(p['nonsmooth'])} non-smooth)" if p["nonsmooth"] else "ok"]
                     for p in params],
                    ["id", "name", "shape", "checked", "max abs err", "max rel err", "verdict"])
    if nonsmooth:
        lines.append(f"non-smooth (the difference changes between eps={eps!r} and "
                     f"eps/10: a kink within eps; not counted): {nonsmooth}")
        shown = [(p, n) for p in params for n in p["nonsmooth"]][:NONSMOOTH_SHOWN]
        for p, n in shown:
            lines.append(f"  {p['name'] or 'node%d' % p['id']} {n['index']}: analytic "
                         f"{n['analytic']!r}, numeric {n['numeric']!r} at eps, "
                         f"{n['numeric_small']!r} at eps/10")
        if nonsmooth > len(shown):
            lines.append(f"  ... and {nonsmooth - len(shown)} more (--json lists them all)")
    lines.append(f"{len(failed)} of {len(params)} params FAIL" if failed
                 else f"all {len(params)} params pass")
    return lines


def _params_option(tf: TapeFile, only):
    """--params NAME,...: GVars of the named params (names, or ids as 7 / node7)."""
    if only is None:
        return None
    params = {p.id: p for p in tf.tape.params()}
    by_name = {tf.tape.nodes[i].name: p for i, p in params.items() if tf.tape.nodes[i].name}
    chosen = []
    for item in (part.strip() for part in only.split(",")):
        ref = item[4:] if item.startswith("node") and item[4:].isdigit() else item
        p = by_name.get(item) or (params.get(int(ref)) if ref.isdigit() else None)
        if p is None:
            known = ", ".join(tf.tape.nodes[i].name or f"node{i}" for i in params) or "none"
            raise GradtoolError(f"{tf.source}: --params: no param {item!r} (params: {known})")
        chosen.append(p)
    return chosen


def _check_fd_budget(tf: TapeFile, full, cost, max_evals, sample) -> None:
    """Refuse, before it starts, a check over --max-evals or (without it) the work budget
    (``full``: every element's cost, ``cost``: this check's, sampled or not)."""
    if max_evals is not None:
        if cost.evals <= max_evals:
            return
        over = f"over --max-evals {max_evals}"
    elif cost.work <= FD_WORK_BUDGET:
        return
    else:
        afford = int(FD_WORK_BUDGET / cost.work_per_eval)
        over = (f"over the budget of {FD_WORK_BUDGET:.3g} operations (about {afford:,} "
                f"evaluations of this tape)")
    what = (f"{sample} of each param's elements" if sample is not None and
            cost.elements < full.elements else
            f"{cost.params} param{'s' * (cost.params != 1)}, {cost.elements:,} elements")
    raise GradtoolError(
        f"{tf.source}: fd-check would take {cost.evals:,} loss evaluations (2 per element of "
        f"{what}) of about {cost.work_per_eval:.3g} operations each, {over}; check fewer "
        f"params with --params NAME,..., fewer elements with --sample N, or allow it with "
        f"--max-evals {cost.evals}")


class FDProgress:
    """fd-check's progress line on stderr, only when stderr is a terminal (at most ten
    updates a second; erased at the end)."""

    def __init__(self, tf: TapeFile):
        self.tf = tf
        self.tty = sys.stderr.isatty()
        self.shown = 0.0

    def __enter__(self) -> "FDProgress":
        return self

    def update(self, done: int, total: int, param_id: int) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if now - self.shown < 0.1 and done != total:
            return
        self.shown = now
        name = self.tf.tape.nodes[param_id].name or f"node{param_id}"
        sys.stderr.write(f"\r\033[Kfd-check: param {name}: {done:,}/{total:,} evaluations "
                         f"({100 * done // max(total, 1)}%)")
        sys.stderr.flush()

    def __exit__(self, *exc) -> None:
        if self.tty and self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


commands = [inspect, backward, fd_check]
