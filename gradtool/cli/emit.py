"""`gradtool emit-cuda`: a scalar tape file -> a CUDA-C gradient function."""

from __future__ import annotations

import sys

import click

from ..emit.cuda import emit_cuda as emit_cuda_source
from ..emit.render import EmitError
from ..fileio import atomic_write_bytes
from .common import load_tape, output_file


def _parse_binds(items) -> dict:
    binds = {}
    for item in items:
        name, sep, expr = item.partition("=")
        if not sep or not name:
            raise EmitError(f"--bind {item!r}: expected NAME=EXPR, e.g. --bind x='(double)v[i]'")
        if name in binds:
            raise EmitError(f"--bind {name}: bound twice")
        binds[name] = expr
    return binds


@click.command("emit-cuda")
@click.argument("tape", metavar="TAPE")
@click.option("--bind", "binds", multiple=True, metavar="NAME=EXPR",
              help="Replace the named const NAME by the C expression EXPR (repeatable); "
                   "other consts are read from x[k].")
@click.option("--name", default="gradtool_grad", show_default=True,
              help="Name of the emitted function.")
@click.option("--kernel", is_flag=True,
              help="Also emit NAME_batch, a __global__ wrapper running one example per thread.")
@click.option("-o", "--output", metavar="FILE", callback=output_file,
              help="Write the source to FILE (atomically) instead of stdout ('-': stdout).")
def emit_cuda(tape, binds, name, kernel, output):
    """Emit TAPE's loss gradient as a self-contained CUDA-C/C99 function.

    TAPE is a tape file whose nodes are all one-element tensors ('-' reads
    stdin).  The result compiles with `cc -std=c99 -O2 -ffp-contract=off` and
    `nvcc -c`, and reproduces `gradtool backward TAPE` to the bit.
    """
    bind_map = _parse_binds(binds)
    tf = load_tape(tape)
    source = "<stdin>" if tape == "-" else tape
    if tf.loss is None:
        raise EmitError(f"{source}: the tape file names no loss; emit-cuda differentiates "
                        f"the file's loss")
    try:
        text = emit_cuda_source(tf.tape, tf.loss, binds=bind_map, name=name, kernel=kernel,
                                source=source)
    except EmitError as exc:
        raise EmitError(f"{source}: {exc}") from None
    if output is not None and output != "-":
        try:
            atomic_write_bytes(output, text.encode("utf-8"))
        except OSError as exc:
            raise EmitError(f"{output}: cannot write: {exc.strerror or exc}") from None
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


commands = [emit_cuda]
