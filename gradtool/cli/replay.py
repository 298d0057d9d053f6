"""`gradtool replay-gpu TAPE`: capture a tape on a device backend, time its episodes, check it.

Thin over :mod:`gradtool.device.engine`: the command loads the file, captures
it (optionally with a device optimizer), optionally checks one episode
against the CPU tape, then times N episodes and prints the figures.
"""

from __future__ import annotations

import json
import math

import click

from ..device import backends
from ..device.engine import capture, check_gradients, check_step, fusion_plan, time_episodes
from ..device.program import rounded_tape, tape_dtype
from ..errors import GradtoolError
from ..optim import make_optimizer, optimizer_from_state
from .choices import RegistryChoice
from ..optim import table as optim_table
from .common import CheckFailed, load_tape, memory_budget
from .tapes import TAPE_HELP


def _seconds(x: float) -> str:
    if x < 1e-3:
        return f"{x * 1e6:.1f} us"
    if x < 1.0:
        return f"{x * 1e3:.3f} ms"
    return f"{x:.3f} s"


def _ulps(x) -> str:
    return f"{int(x)}" if math.isfinite(x) else str(x)


def _json_num(x):
    return x if not isinstance(x, float) or math.isfinite(x) else str(x)


@click.command("replay-gpu", epilog=TAPE_HELP)
@click.argument("tape", metavar="TAPE")
@click.option("--backend", type=RegistryChoice(backends.choices), default="auto",
              show_default=True,
              help="A registered device backend -- cuda (PyCUDA and a GPU), host (the same "
                   "kernels compiled by the system C compiler) -- or auto (cuda when "
                   "available, else host).")
@click.option("--dtype", type=click.Choice(["f64", "f32"]), default=None,
              help="Element type on the device (default: the tape's own; an f32 tape replays "
                   "as f32). f32 on an f64 tape converts it to an f32 tape first (params, "
                   "consts and data rounded to float32 once): the replay is then bit-equal "
                   "to the CPU reference of that f32 tape.")
@click.option("--episodes", type=click.IntRange(min=1), default=100, show_default=True,
              help="Timed episodes.")
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True,
              help="Untimed episodes first (the cuda backend records its graph here).")
@click.option("--graph/--no-graph", default=True, show_default=True,
              help="cuda: replay an episode as one CUDA graph, or launch kernel by kernel "
                   "(identical bits). The host backend always runs an episode as one call.")
@click.option("--train", "train", type=click.Choice(list(optim_table.NAMES)),
              help="Include a device optimizer step over every param in each episode "
                   "(an optimizer of the table, torch's default hyperparameters).")
@click.option("--lr", type=click.FloatRange(min=0), default=None,
              help="Learning rate for --train (default 0.001).")
@click.option("--check", is_flag=True,
              help="First compare the loss and every param gradient (and with --train one "
                   "optimizer step) with the CPU tape (with --dtype f32 on an f64 tape: its "
                   "f32 copy's), bit for bit, in either dtype. Exit 1 on a mismatch.")
@click.option("--fuse", is_flag=True,
              help="Run the episode as the few fused kernels generated for this tape "
                   "(compiled once per tape, cached; identical bits).")
@click.option("--plan", is_flag=True,
              help="Print the fusion plan (which nodes go into which fused kernel) and exit; "
                   "nothing is compiled or run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def replay_gpu(tape, backend, dtype, episodes, warmup, graph, train, lr, check, fuse, plan,
               as_json):
    """Replay TAPE's episode (forward, backward[, optimizer]) on a device and time it."""
    if lr is not None and not train:
        raise GradtoolError("--lr needs --train " + "|".join(optim_table.NAMES))
    tf = load_tape(tape)
    tp, loss_id = tf.tape, tf.loss.id
    try:
        own = tape_dtype(tp)
        if dtype is not None and dtype != own:
            tp = rounded_tape(tp, dtype)        # f64 -> f32: leaves rounded once, recomputed
    except GradtoolError as exc:
        raise GradtoolError(f"{tf.source}: {exc}") from None
    converted = dtype is not None and dtype != own
    dtype = tape_dtype(tp)
    opt = cpu_opt = None
    if train:
        opt = make_optimizer(train, 1e-3 if lr is None else lr)
        for p in tp.params():
            opt.add(tp, p)
        if check:
            cpu_opt = optimizer_from_state(tp, opt.state_dict())
    if plan:
        try:
            program = fusion_plan(tp, loss_id, optimizer=opt)
        except GradtoolError as exc:
            raise GradtoolError(f"{tf.source}: {exc}") from None
        if as_json:
            click.echo(json.dumps({"file": tf.source, "train": train,
                                   **program.fusion.to_json(program)}))
        else:
            click.echo(f"{tf.source}: {len(tp.nodes)} nodes" +
                       (f", with the {train} step" if train else ", no optimizer (--train adds it)"))
            click.echo("\n".join(program.fusion.describe(program)))
        return
    try:
        replay = capture(tp, loss_id, backend, optimizer=opt, graph=graph, fuse=fuse,
                         max_bytes=memory_budget())
    except GradtoolError as exc:
        raise GradtoolError(f"{tf.source}: {exc}") from None

    items = []
    if check:
        items = check_gradients(replay, tp, loss_id)
        if train:
            items += check_step(replay, tp, cpu_opt)
    timing = time_episodes(replay, episodes, warmup, bool(train))

    prog = replay.program
    unfused = replay.unfused_counts
    build = replay.dev.fusion_build
    report = {
        "file": tf.source, "backend": replay.backend, "backend_reason": replay.backend_reason,
        "device": replay.dev.describe(), "dtype": dtype, "converted": converted,
        "graph": replay.dev.graph,
        "train": train, "lr": (opt.lr if opt else None), "nodes": len(tp.nodes),
        "fuse": fuse,
        "launches": {"forward": len(prog.launches["forward"]),
                     "backward": len(prog.launches["backward"]),
                     "optimizer": len(prog.launches["optimizer"]) if train else 0,
                     "episode": replay.launches(bool(train))},
        "launches_unfused": {"forward": unfused["forward"], "backward": unfused["backward"],
                             "optimizer": unfused["optimizer"] if train else 0,
                             "episode": unfused["forward"] + unfused["backward"] +
                             (unfused["optimizer"] if train else 0)},
        "fused_kernels": len(prog.fusion.kernels) if prog.fusion else 0,
        "compile_seconds": build["seconds"] if build else None,
        "compile_cached": build["cached"] if build else None,
        "device_bytes": replay.nbytes, **{k: _json_num(v) for k, v in timing.items()},
        "check": None,
    }
    failed = [it for it in items if not it["ok"]]
    if check:
        report["check"] = {"ok": not failed, "bound": None,
                           "max_ulps": _json_num(max(it["ulps"] for it in items)),
                           "max_rel": _json_num(max(it["rel"] for it in items)),
                           "items": [{k: _json_num(v) for k, v in it.items()} for it in items]}
    if as_json:
        click.echo(json.dumps(report))
    else:
        click.echo("\n".join(_text(report)))
    if failed:
        worst = failed[0]
        raise CheckFailed(f"{tf.source}: --check failed for {len(failed)} of {len(items)} "
                          f"comparisons; first: {worst['what']} differs by {_ulps(worst['ulps'])} ulp "
                          f"(relative {worst['rel']:.3g})")


def _text(r: dict) -> list:
    graph = {True: "graph", False: "per-node launches", None: "one call per episode"}
    lines = [f"{r['file']}: backend {r['backend']} ({r['backend_reason']}), {r['device']}, "
             f"{graph[r['graph']]}"]
    la = r["launches"]
    lines.append(f"  {r['nodes']} nodes; {la['episode']} launches per episode (forward "
                 f"{la['forward']}, backward {la['backward']}, optimizer {la['optimizer']}); "
                 f"device memory {r['device_bytes']:,} bytes")
    if r["fuse"]:
        cached = {True: "from the cache", False: "compiled", None: "compiled or cached"}
        how = ("nothing fused" if not r["fused_kernels"] else
               f"{r['fused_kernels']} fused kernels, {cached[r['compile_cached']]} in "
               f"{r['compile_seconds']:.2f} s")
        lines.append(f"  fused: {la['episode']} launches per episode instead of "
                     f"{r['launches_unfused']['episode']} ({how})")
    what = f"forward + backward + {r['train']} step (lr {r['lr']:g})" if r["train"] else \
        "forward + backward"
    lines.append(f"  episode ({what}): median {_seconds(r['median'])}, p10 "
                 f"{_seconds(r['p10'])}, p90 {_seconds(r['p90'])} over {r['episodes']} episodes "
                 f"after {r['warmup']} warmup; {float(r['episodes_per_second']):,.1f} episodes/s")
    if r["train"]:
        lines.append(f"  loss {r['loss_first']!r} (first timed episode), {r['loss_last']!r} "
                     f"(last)")
    else:
        lines.append(f"  loss {r['loss_last']!r}")
    c = r["check"]
    if c is not None:
        n = len(c["items"])
        verdict = "identical to the bit" if c["ok"] else "NOT identical"
        whose = "the f32 copy's CPU reference" if r.get("converted") else "the CPU tape"
        lines.append(f"  check: {verdict} to {whose} over {n} comparisons "
                     f"(max ulp difference {_ulps(float(c['max_ulps']))})")
        for it in c["items"]:
            if not it["ok"]:
                lines.append(f"    {it['what']}: {_ulps(float(it['ulps']))} ulp, relative "
                             f"{float(it['rel']):.3g}")
    return lines


commands = [replay_gpu]
