"""`gradtool emit-cuda`: a scalar tape file -> a CUDA-C gradient function."""

from __future__ import annotations

import sys

import click

from ..emit.cuda import ABIS, emit_cuda as emit_cuda_source
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


def _parse_params(spec):
    if spec is None:
        return None
    return [name.strip() for name in spec.split(",")]


@click.command("emit-cuda")
@click.argument("tape", metavar="TAPE")
@click.option("--abi", type=click.Choice(ABIS), default="gradtool", show_default=True,
              help="gradtool: double NAME(const double *p, const double *x, double *g); "
                   "swarm: __device__ void grad(long long x, double v, double* g, "
                   "const double* p) for swarm-mcp's compute_iterate.")
@click.option("--params", "params", metavar="NAME,...",
              help="The params that get gradients, in this order as p[0], p[1], ... (a name, "
                   "or node<ID>); the others are frozen at their recorded values. "
                   "Default: every param, in registration order.")
@click.option("--bind", "binds", multiple=True, metavar="NAME=EXPR",
              help="Replace the named const NAME by the C expression EXPR (repeatable); "
                   "other consts are read from x[k] (gradtool ABI) or frozen (swarm ABI).")
@click.option("--name", default=None,
              help="Name of the emitted function.  [default: gradtool_grad; swarm: grad]")
@click.option("--kernel", is_flag=True, default=None,
              help="gradtool ABI: also emit NAME_batch, a __global__ wrapper running one "
                   "example per thread.")
@click.option("--x-name", default=None,
              help="swarm ABI: name of the example-index parameter.  [default: x]")
@click.option("--v-name", default=None,
              help="swarm ABI: name of the dataset-value parameter.  [default: v]")
@click.option("--no-v", "no_v", is_flag=True, default=None,
              help="swarm ABI: the form without a dataset value, grad(long long x, "
                   "double* g, const double* p).")
@click.option("--g-add", default=None,
              help="swarm ABI: the accumulator called as G_ADD(g, j, val).  "
                   "[default: swarm_g_add]")
@click.option("-o", "--output", metavar="FILE", callback=output_file,
              help="Write the source to FILE (atomically) instead of stdout ('-': stdout).")
def emit_cuda(tape, abi, params, binds, name, kernel, x_name, v_name, no_v, g_add, output):
    """Emit TAPE's loss gradient as a self-contained CUDA-C/C99 function.

    TAPE is a tape file whose nodes are all one-element tensors ('-' reads
    stdin).  The result compiles with `cc -std=c99 -O2 -ffp-contract=off` and
    `nvcc -c`, and reproduces `gradtool backward TAPE` to the bit (--abi
    swarm: each call is one example; `gradtool backward TAPE --data DATA.npz`
    sums the examples in order).
    """
    bind_map = _parse_binds(binds)
    param_list = _parse_params(params)
    per_abi = {"gradtool": {"kernel": kernel},
               "swarm": {"x_name": x_name, "v_name": v_name, "g_add": g_add,
                         "has_v": None if no_v is None else not no_v}}
    options = {}
    for which, given in per_abi.items():
        for key, value in given.items():
            if value is None:
                continue
            if which != abi:
                flag = "--no-v" if key == "has_v" else "--" + key.replace("_", "-")
                raise EmitError(f"{flag} applies to --abi {which} only")
            options[key] = value
    tf = load_tape(tape)
    source = "<stdin>" if tape == "-" else tape
    if tf.loss is None:
        raise EmitError(f"{source}: the tape file names no loss; emit-cuda differentiates "
                        f"the file's loss")
    try:
        text = emit_cuda_source(tf.tape, tf.loss, abi=abi, binds=bind_map, params=param_list,
                                name=name, source=source, **options)
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
