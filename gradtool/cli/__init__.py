"""The `gradtool` command line: thin click commands over the library.

Each subcommand lives in its own module and only parses arguments and
formats results; the work is done by library calls.  Data goes to stdout,
diagnostics to stderr (see :mod:`gradtool.cli.common` for exit codes).
"""

from __future__ import annotations

import click

from .. import __version__
from .common import GradtoolGroup, memory_option


@click.group(cls=GradtoolGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gradtool")
@click.option("--debug", is_flag=True, help="Show Python tracebacks instead of one-line errors.")
@click.option("--max-memory", metavar="SIZE", callback=memory_option,
              help="Memory budget (e.g. 4G, 512M; default 2G) for a tape's values, gradients "
                   "and largest temporary, a device program, and training data.")
def main(debug: bool, max_memory) -> None:
    """gradtool: gradients identical to the bit on the CPU, in C and on CUDA GPUs."""


# Each command family's module, imported when one of its commands runs (or when --help
# lists them all), so that `gradtool inspect` does not import training, the emitter, the
# device programs and the importer; each module exposes `commands`, a list of click
# commands (tests/test_cli_robustness.py checks that this table names them all).
COMMAND_MODULES = {
    "inspect": "tapes", "backward": "tapes", "fd-check": "tapes",
    "train": "train",
    "emit-cuda": "emit",
    "replay-gpu": "replay",
    "import-torch": "interop",
}
main.lazy_commands = {name: f"{__name__}.{module}" for name, module in COMMAND_MODULES.items()}
