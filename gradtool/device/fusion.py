"""Fused episodes: a few generated kernels per captured program, bit-identical to it.

:func:`fuse` takes a captured :class:`~gradtool.device.program.Program` (the
per-node launch list) and groups its launches into fused kernels whose
CUDA-C source it generates (:func:`render`), once per tape.  Every fused
element runs the per-node kernel's own per-thread body (``csrc/gt_bodies.h``,
the code ``kernels.cu`` expands in its loops), with the same metadata values
as compile-time constants and, for elementwise ops, the op table's rule
rendered exactly as ``gt_ops.h`` renders it (:func:`gradtool.render.elementwise_rule`).
So a fused element performs the per-node kernel's sequence of roundings; what
changes is only which block and thread computes it, and the order of
independent work.

The fusion classes (docs/device.md):

* **row space**: a maximal run of consecutive row-local op nodes with the
  same row count R = shape[0]: elementwise ops whose inputs are either
  row-space (same rank, same R: read row by row) or *whole* (broadcast over
  the rows, e.g. a bias, and computed before the run), and a matmul of a
  row-space activation by a whole operand (a leaf weight).  Forward: one
  kernel, a block per row, threads striding the row's elements, one phase
  per node with a barrier where a phase reads what another thread wrote.
  Backward: a *row kernel* (every contribution into a row-space gradient,
  last node first, exactly the per-node order) and a *param kernel* (every
  contribution into a whole operand's gradient: one thread per gradient
  element, serial over the rows inside the per-node body, each target's
  contributions in the per-node order).  Moving the whole-target
  contributions after the row-space ones is legal: they read only values
  and gradients that are final by then, and nothing in the run reads them.
* **serial space**: a run of nodes with one-element outputs (sum, mean, and
  elementwise ops on one-element values: the loss chain).  One single-block
  kernel; backward seeds the loss in the same kernel.
* **optimizer**: the guard and the clip norm in one single-block kernel, every
  parameter update in one kernel (a thread per parameter element).

Anything else (bmm, softmax, transpose, permute, reshape, slice, concat, broadcasts
of computed values inside a run) keeps its per-node launches, in place.  A
fused kernel is only made from two or more launches, so a program that
fuses nothing is returned unchanged.

On a GPU a block kernel runs R blocks (grid-stride over rows) of ``threads``
threads with ``__syncthreads()`` at each barrier.  The host build runs each
barrier-separated *segment* as a loop over the block's threads (in order,
or last to first with -DGT_REVERSE_THREADS, row groups reversed too), so a
missing barrier shows up on the host as other bits (tests/test_fusion.py
drops one on purpose).  It runs four rows side by side, and a flat kernel's
elements in fours, so that a matmul's FMA chains interleave (gt_fused.h).
Each backend builds the source itself (the host's: :func:`gradtool.device.host.host_library`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from ..render import elementwise_rule, field_declaration
from ..errors import GradtoolError
from ..expr import c_double
from ..ops import OPS, contract, f64_from_bits
from .launch import Launch
from .program import row_major_strides

MAX_THREADS = 256          # threads per block of a block kernel
MAX_ROW_WIDTH = 8192       # elements per row (per block) a block kernel takes on
MIN_THREADS = 32
HEADERS = ("gt_fused.h", "gt_real.h", "gt_real32.h", "gt_bodies.h", "gt_math.h", "gt_ops.h",
           "host_prelude.h", "gt_optim.h", "gt_optim_table.h")


# ── launches and kernels ──────────────────────────────────────────────────

@dataclass(frozen=True)
class FusedLaunch(Launch):
    """A launch of a generated kernel.  ``block`` > 0: a block kernel, ``meta[0]`` rows
    (one block each, at most the CUDA grid limit) of ``block`` threads; 0: an ordinary
    grid-stride kernel over ``meta[0]`` thread indices."""

    block: int = 0


@dataclass
class Phase:
    """One per-node launch inside a block kernel: its elements r*per_row + c of row r."""

    launch: Launch
    per_row: int
    barrier: bool = False          # a barrier before this phase


@dataclass
class Segment:
    """The launches of one gradient target inside a flat kernel: element j of the
    target runs every launch's body for index j, in order."""

    size: int
    launches: list
    label: str


@dataclass
class FusedKernel:
    name: str
    phase: str                     # forward / backward / optimizer
    kind: str                      # rows / serial / params / updates
    rows: int = 1
    threads: int = 0
    phases: list = field(default_factory=list)     # block kernels
    segments: list = field(default_factory=list)   # flat kernels
    skip_update: Optional[Launch] = None           # updates: the guard check's ctl

    @property
    def members(self) -> list:
        if self.phases:
            return [p.launch for p in self.phases]
        return [la for s in self.segments for la in s.launches]

    @property
    def barriers(self) -> int:
        return sum(1 for p in self.phases if p.barrier)

    def launch(self) -> FusedLaunch:
        # M = [rows or indices, walk]: the walk (0 in order, 1 reversed) is the host's
        if self.phases:
            return FusedLaunch(self.name, (self.rows, 0), -1, self.kind, self.threads)
        total = sum(s.size for s in self.segments)
        return FusedLaunch(self.name, (total, 0), -1, self.kind, 0)


@dataclass
class FusionPlan:
    """What :func:`fuse` did: the fused kernels in launch order, their source, and the
    per-node launch counts per phase they replace."""

    kernels: list
    unfused: dict                  # phase -> launches of the per-node program
    source: str = ""
    digest: str = ""

    def describe(self, program) -> list:
        """The plan as text lines: every launch of the fused episode and what it runs."""
        by_name = {k.name: k for k in self.kernels}
        lines = []
        total = program.count()
        before = sum(self.unfused.values())
        lines.append(f"fusion plan: {before} launches per episode -> {total} "
                     f"({len(self.kernels)} fused kernels)")
        for ph, launches in program.launches.items():
            for la in launches:
                k = by_name.get(la.kernel)
                if k is None:
                    where = f"node {la.node}" if la.node >= 0 else "engine"
                    lines.append(f"  {ph:<9} {la.kernel:<12} per-node: {where} {la.what}")
                    continue
                shape = (f"{_n(k.rows, 'row')} x {k.threads} threads, "
                         f"{_n(len(k.phases), 'phase')}, {_n(k.barriers, 'barrier')}"
                         if k.phases else
                         f"{la.work} threads, {_n(len(k.segments), 'target')}")
                lines.append(f"  {ph:<9} {k.name:<12} {k.kind} ({shape}):")
                lines.append("      " + _members_text(k))
        return lines

    def to_json(self, program) -> dict:
        out = []
        by_name = {k.name: k for k in self.kernels}
        for ph, launches in program.launches.items():
            for la in launches:
                k = by_name.get(la.kernel)
                if k is None:
                    out.append({"phase": ph, "kernel": la.kernel, "fused": False,
                                "node": la.node, "what": la.what})
                else:
                    out.append({"phase": ph, "kernel": k.name, "fused": True, "kind": k.kind,
                                "rows": k.rows, "threads": k.threads or None,
                                "barriers": k.barriers,
                                "members": [{"node": m.node, "what": m.what, "kernel": m.kernel}
                                            for m in k.members]})
        return {"launches_unfused": dict(self.unfused),
                "launches_fused": program.count(), "kernels": out}


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _members_text(k: FusedKernel) -> str:
    parts = []
    for m in k.members:
        who = f"{m.node}" if m.node >= 0 else "-"
        parts.append(f"{who}:{m.what}")
    return ", ".join(parts)


# ── metadata ──────────────────────────────────────────────────────────────

def unpack(launch: Launch) -> dict:
    """A launch's metadata block by field name (the inverse of :func:`gradtool.ops.pack`);
    ``"threads"`` is M[0]."""
    spec = contract(launch.kernel)
    meta = list(launch.meta)
    out, pos = {"threads": int(meta[0])}, 1
    for name, kind in spec.fields:
        if kind.startswith("i["):
            n = out[kind[2:-1]]
            out[name] = [int(v) for v in meta[pos:pos + n]]
            pos += n
        else:
            out[name] = int(meta[pos])
            pos += 1
    return out


# which fields a kernel reads / writes at the phase's own index (aligned) or elsewhere
def _accesses(launch: Launch) -> list:
    """(arena offset, writes, aligned) for every buffer a launch's body touches; aligned:
    element e of the buffer is touched only by the body for index e."""
    f = unpack(launch)
    k = launch.kernel
    fam = contract(k).name
    if fam == "UNARY_FWD":
        return [(f["out"], True, True), (f["a"], False, True)]
    if fam == "UNARY_BWD":
        return [(f["ga"], True, True), (f["g"], False, True), (f["a"], False, True),
                (f["t"], False, True)]
    if fam == "BINARY_FWD":
        plain = row_major_strides(f["dims"])
        return [(f["out"], True, True), (f["a"], False, f["sa"] == plain),
                (f["b"], False, f["sb"] == plain)]
    if fam == "BINARY_BWD":
        plain = row_major_strides(f["kd"])
        flat = f["nb"] == 0
        return [(f["ga"], True, True), (f["g"], False, flat and f["kg"] == plain),
                (f["t"], False, flat and f["kg"] == plain),
                (f["a"], False, flat and f["ka"] == plain),
                (f["b"], False, flat and f["kb"] == plain)]
    if k == "k_matmul":
        return [(f["c"], True, True), (f["a"], False, False), (f["b"], False, False)]
    if k == "k_sum":
        return [(f["out"], True, True), (f["a"], False, False)]
    if k == "k_sum_bwd":
        return [(f["ga"], True, True), (f["g"], False, False)]
    if k == "k_fill":
        return [(f["dst"], True, True)]
    if k == "k_guard":
        return [(f["ctl"], True, False), (f["loss"], False, False)]
    if k == "k_clip_norm":
        return [(f["ctl"], True, False)] + [(o, False, False) for o in f["offs"]]
    raise GradtoolError(f"the fusion pass has no body for kernel {k}")


BLOCK_KERNELS = ("k_matmul", "k_sum", "k_sum_bwd", "k_fill", "k_guard", "k_clip_norm")
FAMILIES = ("UNARY_FWD", "UNARY_BWD", "BINARY_FWD", "BINARY_BWD")


def fusable_kernel(name: str) -> bool:
    """Whether a kernel has a per-thread body the fused kernels can expand."""
    try:
        fam = contract(name).name
    except KeyError:
        return False
    return fam in FAMILIES or name in BLOCK_KERNELS or name == "k_opt"


# ── grouping ──────────────────────────────────────────────────────────────

@dataclass
class _Group:
    kind: str                      # rows / serial
    rows: int
    nodes: list = field(default_factory=list)
    whole: set = field(default_factory=set)    # operands read whole (broadcast over rows)
    rowwise: set = field(default_factory=set)  # operands read row by row (members included)
    role: dict = field(default_factory=dict)   # (node, input) -> "row" | "whole"


def _size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _classify(tape, shapes, i) -> Optional[str]:
    node = tape.nodes[i]
    spec = OPS[node.op]
    out = shapes[i]
    inputs = [x for x in (node.a, node.b) if x >= 0]
    if _size(out) == 1 and (spec.kind == "reduce" or (
            spec.elementwise and all(_size(shapes[x]) == 1 for x in inputs))):
        # a sum's backward broadcast runs on one block: not over a huge input
        return "serial" if _size(shapes[node.a]) <= MAX_ROW_WIDTH else None
    if spec.kind in ("unary", "binary", "matmul") and len(out) >= 1:
        rows = out[0]
        widths = [_size(shapes[x]) // rows for x in [i] + inputs if shapes[x][0] == rows]
        # one block per row: very wide rows keep the per-node kernels' full grids
        return "rows" if max(widths) <= MAX_ROW_WIDTH else None
    return None


def _roles(tape, shapes, i) -> list:
    """[(input id, 'row' | 'whole')] of a row-space node."""
    node = tape.nodes[i]
    out = shapes[i]
    if OPS[node.op].kind == "matmul":
        return [(node.a, "row"), (node.b, "whole")]
    roles = []
    for x in (node.a, node.b):
        if x < 0:
            continue
        sx = shapes[x]
        row = len(sx) == len(out) and sx[0] == out[0]
        roles.append((x, "row" if row else "whole"))
    return roles


def _joins(g: _Group, i: int, roles: list) -> bool:
    """Whether row-space node i can join group g (same rows, inputs read consistently)."""
    members = set(g.nodes)
    whole, rowwise = set(g.whole), set(g.rowwise)
    for x, role in roles:
        if role == "whole":
            if x in members or x in rowwise:
                return False
            whole.add(x)
        else:
            if x in whole:
                return False
            rowwise.add(x)
    return True


def _groups(tape, shapes) -> list:
    groups, cur = [], None
    for i, node in enumerate(tape.nodes):
        if node.a < 0:
            continue                                   # leaves: no launches
        kind = _classify(tape, shapes, i)
        if kind == "serial":
            if cur is None or cur.kind != "serial":
                cur = _Group("serial", 1)
                groups.append(cur)
            cur.nodes.append(i)
            continue
        if kind != "rows":
            cur = None
            continue
        roles = _roles(tape, shapes, i)
        rows = shapes[i][0]
        if cur is None or cur.kind != "rows" or cur.rows != rows or not _joins(cur, i, roles):
            cur = _Group("rows", rows)
            if not _joins(cur, i, roles):              # e.g. w @ w: w read both ways
                cur = None
                continue
            groups.append(cur)
        cur.nodes.append(i)
        for x, role in roles:
            (cur.whole if role == "whole" else cur.rowwise).add(x)
            cur.role[i, x] = role
        cur.rowwise.add(i)
    return groups


# ── the pass ──────────────────────────────────────────────────────────────

def _written(launch: Launch) -> int:
    """The arena offset a launch writes (its first 'w' field)."""
    f = unpack(launch)
    for name, kind in contract(launch.kernel).fields:
        if kind == "w":
            return f[name]
    raise GradtoolError(f"kernel {launch.kernel} writes nothing")


def fuse(tape, program, *, max_threads: int = MAX_THREADS):
    """The fused version of ``program`` (captured from ``tape``): a new Program whose
    ``fusion`` is the :class:`FusionPlan`, or ``program`` itself (``fusion`` set, no
    kernels) when nothing fuses."""
    shapes = program.shapes
    groups = _groups(tape, shapes)
    group_of = {i: g for g in groups for i in g.nodes}
    grad_node = {off: i for i, off in enumerate(program.grad_off) if off >= 0}
    kernels: list = []

    def block(phase, kind, rows, launches) -> list:
        """A block kernel of these launches (>= 2 of them), else the launches themselves."""
        if len(launches) < 2 or not all(fusable_kernel(la.kernel) for la in launches):
            return list(launches)
        k = FusedKernel(f"gtf_{len(kernels)}", phase, kind, rows)
        _add_phases(k, launches, max_threads)
        kernels.append(k)
        return [k.launch()]

    def flat(phase, kind, segments, skip=None) -> list:
        launches = [la for s in segments for la in s.launches]
        if len(launches) < 2 or not all(fusable_kernel(la.kernel) for la in launches):
            return launches
        k = FusedKernel(f"gtf_{len(kernels)}", phase, kind, segments=segments, skip_update=skip)
        kernels.append(k)
        return [k.launch()]

    # forward: each group's launches are consecutive (groups are runs of op nodes)
    forward, run, run_group = [], [], None

    def flush_forward():
        nonlocal run, run_group
        if run:
            g = run_group
            forward.extend(block("forward", "serial" if g.kind == "serial" else "rows",
                                 g.rows, run))
        run, run_group = [], None

    for la in program.launches["forward"]:
        g = group_of.get(la.node)
        if g is not run_group:
            flush_forward()
        if g is None:
            forward.append(la)
        else:
            run.append(la)
            run_group = g
    flush_forward()

    # backward: [zero fill, seed, per-node launches from the loss down]
    bwd = list(program.launches["backward"])
    n_head = 0
    while n_head < len(bwd) and bwd[n_head].what in ("zero gradients", "seed loss"):
        n_head += 1
    seed = [la for la in bwd[:n_head] if la.what == "seed loss"]
    backward = [la for la in bwd[:n_head] if la.what != "seed loss"]
    body = bwd[n_head:]
    runs = []
    for la in body:
        g = group_of.get(la.node)
        if runs and runs[-1][0] is g and g is not None:
            runs[-1][1].append(la)
        else:
            runs.append((g, [la]))
    # the seed joins the loss's single-block kernel when the loss's run comes first
    loss_group = group_of.get(program.loss)
    for g, launches in runs:
        if seed and g is not None and g is loss_group and (g.kind == "serial" or g.rows == 1):
            launches = seed + launches
        else:
            backward += seed
        seed = []
        if g is None:
            backward += launches
            continue
        if g.kind == "serial" or g.rows == 1:
            # one block: every contribution in the per-node order
            backward += block("backward", "serial" if g.kind == "serial" else "rows", 1,
                              launches)
            continue
        row, whole = [], {}
        for la in launches:
            target = grad_node[_written(la)]
            role = g.role.get((la.node, target))
            if role is None:
                raise GradtoolError(f"fusion: node {la.node} writes the gradient of node "
                                    f"{target}, which is not one of its inputs")
            if role == "row":
                row.append(la)
            else:
                whole.setdefault(target, []).append(la)
        backward += block("backward", "rows", g.rows, row)
        segments = [Segment(_size(shapes[t]), ls, f"grad {t}" + _name(tape, t))
                    for t, ls in whole.items()]
        backward += flat("backward", "params", segments)
    backward += seed

    # optimizer: guard and clip norm in one single-block kernel, every update in one kernel
    opt = list(program.launches["optimizer"])
    serial = [la for la in opt if la.kernel in ("k_guard", "k_clip_norm")]
    updates = [la for la in opt if la.kernel == "k_opt"]
    if opt != serial + updates:
        raise GradtoolError("fusion: the optimizer launches are not guard, clip norm, updates")
    optimizer = block("optimizer", "serial", 1, serial)
    optimizer += flat("optimizer", "updates",
                      [Segment(la.work, [la], f"param {la.node}" + _name(tape, la.node))
                       for la in updates], skip=updates[0] if updates else None)

    unfused = {ph: len(program.launches[ph]) for ph in program.launches}
    plan = FusionPlan(kernels, unfused)
    if not kernels:
        return replace(program, fusion=plan)
    plan.source = render(plan)
    plan.digest = hashlib.sha256(plan.source.encode()).hexdigest()
    return replace(program, fusion=plan,
                   launches={"forward": forward, "backward": backward, "optimizer": optimizer})


def _name(tape, i) -> str:
    name = tape.nodes[i].name if 0 <= i < len(tape.nodes) else None
    return f" ({name})" if name else ""


def _add_phases(k: FusedKernel, launches: list, max_threads: int) -> None:
    """Phases with the barriers they need, and the block size."""
    widest = 1
    since = []                     # (offset, writes, aligned, per_row) since the last barrier
    for la in launches:
        work = la.work
        if work % k.rows:
            raise GradtoolError(f"fusion: launch {la.what} of node {la.node} has {work} "
                                f"indices, not a multiple of {k.rows} rows")
        per_row = work // k.rows
        widest = max(widest, per_row)
        acc = _accesses(la)
        hazard = False
        for off, writes, aligned in acc:
            for off2, writes2, aligned2, per_row2 in since:
                if off2 != off or not (writes or writes2):
                    continue
                same_thread = (per_row == 1 and per_row2 == 1) or (
                    aligned and aligned2 and per_row == per_row2)
                if not same_thread:
                    hazard = True
        phase = Phase(la, per_row, barrier=hazard)
        if hazard:
            since = []
        since += [(off, w, al, per_row) for off, w, al in acc]
        k.phases.append(phase)
    threads = MIN_THREADS
    while threads < widest and threads < max_threads:
        threads *= 2
    k.threads = threads


# ── the source ────────────────────────────────────────────────────────────

def _decls(launch: Launch) -> list:
    """C declarations of a launch's fields, with its metadata values as constants."""
    spec = contract(launch.kernel)
    f = unpack(launch)
    lines = []
    for name, kind in spec.fields:
        v = f[name]
        if not kind.startswith("i["):
            value = f"(gt_real){c_double(f64_from_bits(v))}" if kind == "f" else f"{v}LL"
            lines.append(field_declaration(name, kind, value))
        elif v:
            lines.append(f"const long long {name}[{len(v)}] = {{{', '.join(f'{x}LL' for x in v)}}};")
        else:
            lines.append(f"const long long *const {name} = 0;")
    lines.append(" ".join(f"(void){name};" for name, _ in spec.fields))
    return lines


def _prologue(launch: Launch) -> str:
    """The C text one launch runs once before its elements ("" for most)."""
    return "GT_PRE_BINARY_BWD" if contract(launch.kernel).name == "BINARY_BWD" else ""


def _body(launch: Launch, index: str) -> str:
    """The C text of one launch's element ``index``."""
    fam = contract(launch.kernel).name
    if fam in FAMILIES:
        _, expr = elementwise_rule(launch.kernel)
        return f"GT_BODY_{fam}({index}, {expr})"
    return f"GT_BODY_{launch.kernel}({index})"


def _elements_text(la: Launch, first: str, step: str, count: str, indent: str) -> list:
    """One launch's body for the ``count`` elements ``first + w * step`` of a group
    (gt_fused.h: the block's row on the GPU, a few rows or indices side by side on the
    host); a matmul's chains through GT_MATMUL_GROUP, interleaved on the host."""
    if la.kernel == "k_matmul":
        return [f"{indent}GT_MATMUL_GROUP({first}, {step}, {count})"]
    return [f"{indent}GT_IN_GROUP(gt_w, {count}) {{",
            f"{indent}    const long long gt_i = {first} + gt_w * {step}; (void)gt_i;",
            f"{indent}    {_body(la, 'gt_i')}",
            f"{indent}}}"]


def _phase_text(p: Phase, k: FusedKernel, indent: str) -> list:
    la = p.launch
    pre = _prologue(la)
    lines = [f"{indent}{{   /* {_label(la)} */"]
    lines += [f"{indent}    {d}" for d in _decls(la)]
    if pre:
        lines.append(f"{indent}    {pre}")
    lines.append(f"{indent}    for (long long gt_c = gt_t; gt_c < {p.per_row}LL; "
                 f"gt_c += {k.threads}) {{")
    lines += _elements_text(la, f"gt_r0 * {p.per_row}LL + gt_c", f"{p.per_row}LL", "gt_nr",
                            indent + "        ")
    lines.append(f"{indent}    }}")
    lines.append(f"{indent}}}")
    return lines


def _label(la: Launch) -> str:
    return (f"node {la.node}: " if la.node >= 0 else "") + la.what.replace("*/", "* /")


def _block_text(k: FusedKernel, drop_barriers=()) -> list:
    lines = [f"/* {k.phase} {k.kind}: {k.rows} rows x {k.threads} threads, "
             f"{len(k.phases)} phases, {k.barriers} barriers */",
             f"GT_KERNEL {k.name}(gt_real *W, const long long *M)", "{", "    (void)M;",
             f"    GT_ROW_GROUPS(gt_r0, gt_nr, {k.rows}LL) {{"]
    seen = 0
    open_segment = False
    for p in k.phases:
        if p.barrier:
            seen += 1
            if (k.name, seen) not in drop_barriers and open_segment:
                lines += ["        }", "        GT_BARRIER"]
                open_segment = False
        if not open_segment:
            lines.append(f"        GT_THREADS(gt_t, {k.threads}) {{")
            open_segment = True
        lines += _phase_text(p, k, "            ")
    lines += ["        }", "    }", "}", ""]
    return lines


def _flat_text(k: FusedKernel) -> list:
    total = sum(s.size for s in k.segments)
    lines = [f"/* {k.phase} {k.kind}: {total} threads over {len(k.segments)} targets */",
             f"GT_KERNEL {k.name}(gt_real *W, const long long *M)", "{", "    (void)M;"]
    if k.skip_update is not None:
        ctl = unpack(k.skip_update)["ctl"]
        lines += ["    {", f"        const gt_real *GT_RESTRICT ctl = W + {ctl}LL;",
                  "        GT_SKIP_UPDATE", "    }"]
    lines.append(f"    GT_FLAT_SEGMENTS(gt_z, gt_s, {total}LL, {len(k.segments)}) {{")
    start = 0
    for n, s in enumerate(k.segments):
        lines.append(f"        GT_SEGMENT(gt_z, gt_s, gt_j0, gt_nj, {n}, {start}LL, {s.size}LL) {{"
                     f"   /* {s.label} */")
        for la in s.launches:
            lines.append(f"            {{   /* {_label(la)} */")
            lines += [f"                {d}" for d in _decls(la)]
            pre = _prologue(la)
            if pre:
                lines.append(f"                {pre}")
            lines += _elements_text(la, "gt_j0", "1LL", "gt_nj", "                ")
            lines.append("            }")
        lines.append("        }")
        start += s.size
    lines += ["    }", "}", ""]
    return lines


def render(plan: FusionPlan, drop_barriers=()) -> str:
    """The fused kernels' source: CUDA-C that also compiles as C (gt_fused.h).

    ``drop_barriers``: (kernel name, n) pairs whose n-th barrier (from 1) is left
    out -- a deliberately racy kernel, for the tests of the race detector."""
    out = ["/* GENERATED by gradtool/device/fusion.py: fused kernels of one captured tape.",
           " * Every element runs a per-node kernel's body (gt_bodies.h) with that",
           " * launch's metadata as constants. */",
           '#include "gt_fused.h"', ""]
    for k in plan.kernels:
        out += _block_text(k, drop_barriers) if k.phases else _flat_text(k)
    names = ", ".join(k.name for k in plan.kernels)
    out += ["#ifndef __CUDACC__",
            f"static const gt_fused_fn gtf_table[] = {{ {names} }};",
            "GT_EXPORT gt_fused_fn gtf_kernel_at(long long i) { return gtf_table[i]; }",
            "GT_EXPORT int gtf_real_bytes(void) { return (int)sizeof(gt_real); }",
            f"GT_EXPORT int gtf_count(void) {{ return {len(plan.kernels)}; }}",
            "#endif", ""]
    return "\n".join(out)


__all__ = ["fuse", "render", "FusionPlan", "FusedKernel", "FusedLaunch",
           "unpack"]
