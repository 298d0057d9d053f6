"""What every subcommand shares: error reporting, exit codes, tape-file arguments.

Exit status: 0 success; 1 a check that ran and failed (fd-check, --verify,
--check, a non-finite training loss); 2 unusable input or usage.  Every
failure is ONE line on stderr, ``gradtool: <file>: node <id>: <problem>``;
``gradtool --debug`` shows the Python traceback instead.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from ..errors import GradtoolError

EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2


def load_tape(path: str):
    """TAPE as given on the command line: a path, or ``-`` for standard input."""
    from ..tapefile import load
    if path == "-":
        return load(sys.stdin.buffer, name="<stdin>")
    return load(path)


class CheckFailed(GradtoolError):
    """A check ran to completion and its verdict is failure (exit status 1)."""


def fail(message: str, status: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print one diagnostic line on stderr and exit."""
    click.echo(f"gradtool: {message}", err=True)
    sys.exit(status)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


class GradtoolGroup(click.Group):
    """A click group that turns every exception into one stderr line and an exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            # click prints Usage/Try/Error on four lines; keep the one-line rule
            sub = exc.ctx is not None and exc.ctx.parent is not None
            where = f"{exc.ctx.info_name}: " if sub else ""
            fail(one_line(where + exc.format_message()), EXIT_BAD_INPUT)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except SystemExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - the one place errors become exit codes
            debug = bool(ctx.params.get("debug"))
            if debug:
                raise
            if isinstance(exc, KeyboardInterrupt):
                fail("interrupted", 130)
            if isinstance(exc, CheckFailed):
                fail(one_line(exc), EXIT_CHECK_FAILED)
            if isinstance(exc, GradtoolError):
                fail(one_line(exc), EXIT_BAD_INPUT)
            if isinstance(exc, OSError):
                where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
                fail(one_line(f"{where}{exc.strerror or exc}"), EXIT_BAD_INPUT)
            if isinstance(exc, MemoryError):
                fail("out of memory", EXIT_BAD_INPUT)
            fail(one_line(f"internal error: {type(exc).__name__}: {exc} "
                          f"(rerun with --debug for the traceback)"), EXIT_CHECK_FAILED)
