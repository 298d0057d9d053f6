"""`gradtool import-torch SPEC -o model.msgpack`: a PyTorch module into a tape file.

SPEC is ``path/model.py:build``: a Python file and a function in it that returns
``(module, example_inputs)`` (a tuple of tensors, float32 as users have them) or
``(module, example_inputs, loss_inputs)``.  Thin over
:func:`gradtool.interop.torch.import_module`; torch is imported only when the
command runs, so the command line's start-up stays fast.

Failures: one line per problem (``gradtool: SPEC: unsupported op aten.sort.default
(x1) at model.py:12 (forward): ...``) on stderr, exit status 2, no file written.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from pathlib import Path

import click

from ..errors import GradtoolError
from .common import EXIT_BAD_INPUT, output_file_not_stdout


class SpecError(GradtoolError):
    """SPEC does not name a loadable Python file and function."""


def load_spec(spec: str):
    """(the function SPEC names, the file's module)."""
    path, sep, func = spec.rpartition(":")
    if not sep or not path or not func:
        raise SpecError(f"{spec}: expected FILE.py:FUNCTION (e.g. model.py:build)")
    file = Path(path)
    if not file.is_file():
        raise SpecError(f"{spec}: no such file {path!r}")
    name = f"gradtool_spec_{abs(hash(str(file.resolve())))}"
    mod_spec = importlib.util.spec_from_file_location(name, file)
    if mod_spec is None or mod_spec.loader is None:
        raise SpecError(f"{spec}: {path} is not a Python file")
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module
    folder = str(file.resolve().parent)
    sys.path.insert(0, folder)
    try:
        mod_spec.loader.exec_module(module)
    except Exception as exc:             # noqa: BLE001 - the user's file: say what failed
        raise SpecError(f"{spec}: running {path} failed: {type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:300]}") from None
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    fn = getattr(module, func, None)
    if not callable(fn):
        raise SpecError(f"{spec}: {path} has no function {func!r}")
    return fn, module


@click.command("import-torch")
@click.argument("spec", metavar="SPEC")
@click.option("-o", "--output", "output", required=True, metavar="FILE",
              callback=output_file_not_stdout, help="The tape file to write (atomically).")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON summary: params, inputs, op histogram, unsupported.")
@click.option("--loss", "loss_name", metavar="NAME",
              help="A function in SPEC's file, loss(outputs, *loss_inputs), giving the loss "
                   "(default: the module's scalar output).")
@click.option("--loss-output", type=int, default=0, show_default=True, metavar="I",
              help="Which of the module's outputs is the loss (the others become named "
                   "outputs output<i>).")
@click.option("--dtype", type=click.Choice(["f32", "f64", "module"]), default=None,
              help="The tape's float dtype: f64 (the module's torch float64 run), f32 (its "
                   "float32 run), or module (the module's own dtype; float16/bfloat16 "
                   "refused). Default: the module's own float dtype (float32 -> f32, float64 -> f64).")
def import_torch(spec: str, output: str, as_json: bool, loss_name, loss_output: int,
                 dtype) -> None:
    """Import a PyTorch module (SPEC = model.py:build) into a tape file via torch.export."""
    try:
        import torch  # noqa: F401 - the optional dependency, only now
    except ImportError:
        raise GradtoolError("import-torch needs PyTorch: pip install 'gradtool[torch]'") \
            from None
    from ..interop.torch import DEFAULT_DTYPE, TorchImportError, import_module
    from ..interop.zoo import prepare_torchvision
    prepare_torchvision()            # the user's `import torchvision` beside a CPU torch
    build, module = load_spec(spec)
    loss_fn = None
    if loss_name:
        loss_fn = getattr(module, loss_name, None)
        if not callable(loss_fn):
            raise SpecError(f"{spec}: --loss {loss_name}: no such function in the file")
    try:
        built = build()
    except Exception as exc:             # noqa: BLE001 - the user's code
        raise SpecError(f"{spec}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}") \
            from None
    if not isinstance(built, tuple) or len(built) not in (2, 3):
        raise SpecError(f"{spec}: build() must return (module, example_inputs) or "
                        f"(module, example_inputs, loss_inputs), got {type(built).__name__}")
    model, inputs = built[0], built[1]
    loss_inputs = built[2] if len(built) == 3 else ()
    if len(built) == 3 and loss_fn is None:
        raise SpecError(f"{spec}: build() returned loss inputs but no --loss function is named")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = import_module(model, inputs, loss_fn, loss_inputs,
                                   loss_output=loss_output, dtype=dtype or DEFAULT_DTYPE)
    except TorchImportError as exc:
        for p in exc.problems:
            if p.kind == "non-scalar loss" and loss_fn is None:
                p.detail = ("the module returns outputs, not a scalar loss: name a loss "
                            "function of this file with --loss NAME (NAME(outputs, "
                            "*loss_inputs), build() then returning the loss inputs "
                            "third), or return the loss from forward")
        if as_json:
            click.echo(json.dumps({"unsupported": [
                {"kind": p.kind, "target": p.target, "count": p.count, "sources": p.sources,
                 "detail": p.detail} for p in exc.problems]}))
        for p in exc.problems:
            click.echo(f"gradtool: {spec}: {p.line()}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    result.save(output)
    for note in result.notes:
        click.echo(f"gradtool: {spec}: note: {note}", err=True)
    if as_json:
        click.echo(json.dumps(result.summary()))
    else:
        s = result.summary()
        click.echo(f"wrote {output}: {len(s['params'])} params ({s['param_count']} values), "
                   f"inputs {', '.join(s['inputs']) or '-'}, {s['nodes']} nodes"
                   + (f", state {', '.join(s['state'])}" if s["state"] else ""))


commands = [import_torch]
