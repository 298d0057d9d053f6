"""What every subcommand shares: error reporting, exit codes, tape-file arguments.

Exit status: 0 success; 1 a check that ran and failed (fd-check, --verify,
--check, a non-finite training loss); 2 unusable input or usage.  Every
failure is ONE line on stderr, ``gradtool: <file>: node <id>: <problem>``;
``gradtool --debug`` shows the Python traceback instead.
"""

from __future__ import annotations

import codecs
import errno
import functools
import os
import select
import signal
import sys
import threading
import traceback
from typing import NoReturn

import click

from ..errors import GradtoolError

EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2


def without_gc_pauses(command):
    """Run a command with Python's cycle collector paused (see
    :func:`gradtool.tapefile.read.gc_paused`): a tape of a million nodes is millions of objects
    that a collection would walk again and again, freeing nothing."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        from ..tapefile.read import gc_paused
        with gc_paused():
            return command(*args, **kwargs)
    return run


def memory_option(ctx, param, value):
    """click callback for ``gradtool --max-memory SIZE``."""
    if value is None:
        return None
    from ..budget import parse_size
    try:
        return parse_size(value)
    except GradtoolError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def memory_budget() -> int:
    """``gradtool --max-memory``, or the default budget (:mod:`gradtool.budget`)."""
    ctx = click.get_current_context(silent=True)
    from ..budget import DEFAULT_MEMORY
    value = ctx.find_root().params.get("max_memory") if ctx is not None else None
    return value or DEFAULT_MEMORY


def load_tape(path: str):
    """TAPE as given on the command line: a path, or ``-`` for standard input; loaded
    within the ``--max-memory`` budget."""
    from ..tapefile import Limits, load
    limits = Limits(max_memory=memory_budget())
    if path == "-":
        if sys.stdin is None:
            raise GradtoolError("<stdin>: cannot read: standard input is closed")
        return load(sys.stdin.buffer, name="<stdin>", limits=limits)
    return load(path, limits=limits)


def echo_rows(text: str, rows: list) -> None:
    """``click.echo(text + rows, nl=False)`` (``rows``: UTF-8 bytes, table rows without an
    escape sequence), the same bytes at a fraction of the time for 70 MB of rows: ``text``
    through click (which takes ANSI codes out off a terminal and encodes), then the rows
    straight to the binary stream under it when stdout is a file or a pipe encoding
    UTF-8, else through click too."""
    click.echo(text, nl=False)
    stream = sys.stdout
    buffer = getattr(stream, "buffer", None)
    if buffer is None or stream.isatty() or _codec(getattr(stream, "encoding", None)) != "utf-8":
        click.echo(b"".join(rows).decode("utf-8"), nl=False)
        return
    stream.flush()
    for part in rows:
        _write_all(buffer, part)
    buffer.flush()


def _write_all(buffer, data: bytes) -> None:
    """All of ``data``: an unbuffered stdout (``python -u``, PYTHONUNBUFFERED) is a raw
    file whose write may take only part (a signal, the reader gone: the next write says
    why)."""
    view = memoryview(data)
    while view.nbytes:
        written = buffer.write(view)
        if written is None:                # a non-blocking stdout, full: wait for room
            select.select([], [buffer.fileno()], [])
            continue
        view = view[written:]


def _codec(encoding) -> str:
    try:
        return codecs.lookup(encoding).name
    except (LookupError, TypeError):
        return ""


class ClosedStdout:
    """Stands in for ``sys.stdout`` when the process started with it closed (``>&-``):
    the first write fails with one clear error instead of an AttributeError, or output
    silently going nowhere."""

    def _closed(self, *args, **kwargs):
        raise OSError(errno.EBADF, "cannot write: standard output is closed", "<stdout>")

    write = fileno = _closed

    def flush(self) -> None:       # nothing was written (the interpreter flushes at exit)
        pass

    def isatty(self) -> bool:
        return False

    @property
    def buffer(self):
        self._closed()


def silence_stdout() -> None:
    """Send the rest of stdout to /dev/null: after its reader is gone, nothing more is
    wanted there, and the interpreter's final flush must not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        sys.stdout = open(os.devnull, "w")   # noqa: SIM115 - lives until exit


class CheckFailed(GradtoolError):
    """A check ran to completion and its verdict is failure (exit status 1)."""


def output_file(ctx, param, value):
    """click callback for an option naming a file to write (``--save``, ``-o``,
    ``--plot``), run as the command line is parsed, before anything is read or trained:
    an empty name is a usage error (it used to be skipped silently, so nothing was
    written and nothing said), and so is a FIFO, a socket, a directory or a device
    (:func:`gradtool.fileio.check_regular_destination`; a write onto a FIFO waited for a
    reader forever).  ``-`` (standard output, where a command takes it) passes."""
    value = stream_file(ctx, param, value)
    if value is not None and value != "-":
        from ..fileio import check_regular_destination
        check_regular_destination(value, _flag(param))
    return value


def stream_file(ctx, param, value):
    """click callback for an option naming a file written as a stream (``--log``): an
    empty name is a usage error; a FIFO or ``/dev/stderr`` is written into."""
    if value is not None and not value.strip():
        raise click.BadParameter("an empty file name", ctx=ctx, param=param)
    return value


def _flag(param) -> str:
    """The option as a user spells it: its long name (``--save``, ``--output``)."""
    names = [*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())]
    return max(names, key=len) if names else ""


def output_file_not_stdout(ctx, param, value):
    """:func:`output_file` for a file written next to the stdout report: no ``-``."""
    if value == "-":
        raise click.BadParameter("'-' would mix a binary file into the report on stdout; "
                                 "give a file name", ctx=ctx, param=param)
    return output_file(ctx, param, value)


def fail(message: str, status: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print one diagnostic line on stderr and exit."""
    click.echo(f"gradtool: {message}", err=True)
    sys.exit(status)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program is, so that cleanups run on the way
    out (an atomic write removes its temporary file) instead of the process vanishing."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame):
    raise Terminated(signum)


TERMINATION_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP")
                            if hasattr(signal, name))


_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())   # click >= 8.2
_NO_SUCH_COMMAND = getattr(click.exceptions, "NoSuchCommand", ())


FINALIZER_RETRY_SECONDS = 0.01


def interrupt_outside_finalizers(signum, frame):
    """SIGINT while a command runs: KeyboardInterrupt where the program is, as Python's
    default handler raises it.  Where that is inside a finalizer (a ``__del__``:
    ``subprocess.Popen.__del__`` and ``zipfile.ZipFile.__del__`` run during train's
    start-up; a weakref callback: importlib's module-lock ``cb``), Python cannot raise it:
    it hands it to ``sys.unraisablehook`` ("Exception ignored in ...") and runs on, and the
    Ctrl-C would be lost.  :class:`command_interrupts` installs :func:`_resend_lost`
    there, which sends the same signal again :data:`FINALIZER_RETRY_SECONDS` later, to land
    outside the finalizer."""
    raise KeyboardInterrupt


def _resend_lost(previous):
    """A ``sys.unraisablehook``: a KeyboardInterrupt that a finalizer swallowed is sent
    again shortly (nothing printed); anything else goes to ``previous``."""
    def hook(unraisable):
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type,
                                                          KeyboardInterrupt):
            retry = threading.Timer(FINALIZER_RETRY_SECONDS, os.kill,
                                    (os.getpid(), signal.SIGINT))
            retry.daemon = True
            retry.start()
            return
        previous(unraisable)
    return hook


class command_interrupts:
    """While a command runs, SIGINT raises KeyboardInterrupt (so the command's cleanups
    run; never inside a finalizer: :func:`interrupt_outside_finalizers`), where the entry point (``gradtool.__main__.run``) had installed its start-up
    handler (one line, exit 130, at once); the start-up handler is back afterwards, for
    the reporting and the way out.  Under any other handler (a library caller's,
    CliRunner) nothing changes."""

    def __enter__(self):
        self.old = None
        if threading.current_thread() is threading.main_thread():
            handler = signal.getsignal(signal.SIGINT)
            if getattr(handler, "gradtool_start_up", False):
                self.old = handler
                self.old_hook = sys.unraisablehook
                sys.unraisablehook = _resend_lost(self.old_hook)
                signal.signal(signal.SIGINT, interrupt_outside_finalizers)
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
            sys.unraisablehook = self.old_hook
        return False


class GradtoolGroup(click.Group):
    """A click group that turns every exception into one stderr line and an exit code.

    ``lazy_commands`` maps a command's name to the module that defines it (in its list
    ``commands``), imported when the command is first looked up."""

    lazy_commands: dict = {}

    def list_commands(self, ctx) -> list:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx, name: str):
        module = self.lazy_commands.get(name)
        if name not in self.commands and module is not None:
            import importlib
            try:
                mod = importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name != module:
                    raise
                return None       # that command family is not part of this build yet
            for command in mod.commands:
                self.add_command(command)
        return super().get_command(ctx, name)

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except _NO_SUCH_COMMAND as exc:   # click suggests from the commands imported so far
            raise _NO_SUCH_COMMAND(exc.command_name, message=exc.message,
                                   possibilities=self.list_commands(ctx), ctx=ctx) from None

    def make_context(self, info_name, args, parent=None, **extra):
        # the group's own options (--max-memory, an unknown option) are parsed here,
        # before invoke: keep the one-line rule for their errors too
        for arg in args:
            # no shell can pass a NUL (argv entries are C strings), but main(args=[...]) can;
            # every file name comes in here, so this is before anything is read
            if isinstance(arg, str) and "\0" in arg:
                fail(f"argument {arg!r}: a NUL byte cannot be part of an argument "
                     f"(a file name cannot contain one)", EXIT_BAD_INPUT)
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
            # the command's module now, under the start-up handler: numpy's import, within
            # a command, would turn a Ctrl-C into an ImportError and a traceback
            protected = (ctx._protected_args if hasattr(ctx, "_protected_args")   # click >= 8.2
                         else ctx.protected_args)
            rest = [*protected, *ctx.args]
            if rest and not ctx.resilient_parsing:
                self.get_command(ctx, rest[0])
            return ctx
        except click.UsageError as exc:
            if isinstance(exc, _NO_ARGS_IS_HELP):     # a bare `gradtool`: click's help
                raise
            fail(one_line(exc.format_message()), EXIT_BAD_INPUT)
        except KeyboardInterrupt:                      # not click's "Aborted!" (exit 1)
            fail("interrupted", 130)

    def invoke(self, ctx):
        if sys.stdout is None:
            sys.stdout = ClosedStdout()
        old = {}
        if threading.current_thread() is threading.main_thread():
            old = {sig: signal.signal(sig, _raise_terminated) for sig in TERMINATION_SIGNALS}
        try:
            return self._invoke_reporting_errors(ctx)
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def _invoke_reporting_errors(self, ctx):
        try:
            with command_interrupts():
                return super().invoke(ctx)
        except click.UsageError as exc:
            # click prints Usage/Try/Error on four lines; keep the one-line rule
            from ..train.distributed import launcher_rank
            if launcher_rank():
                sys.exit(EXIT_BAD_INPUT)      # under mpiexec: rank 0 says it, once
            sub = exc.ctx is not None and exc.ctx.parent is not None
            where = f"{exc.ctx.info_name}: " if sub else ""
            fail(one_line(where + exc.format_message()), EXIT_BAD_INPUT)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except SystemExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - the one place errors become exit codes
            if ctx.params.get("debug"):
                # the traceback, then the same line and exit status as without --debug
                traceback.print_exception(exc)
            if isinstance(exc, Terminated):
                fail(f"terminated by {signal.Signals(exc.signum).name}", 128 + exc.signum)
            if isinstance(exc, KeyboardInterrupt):
                fail("interrupted", 130)
            if isinstance(exc, BrokenPipeError):
                # the reader went away (`| head -1`): nothing to report; exit as a C tool
                # killed by SIGPIPE would, so `set -o pipefail` sees the same status
                silence_stdout()
                sys.exit(128 + getattr(signal, "SIGPIPE", 13))
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
