"""The ``gradtool`` command's entry point (also ``python -m gradtool``).

Importing the command line takes a few hundred milliseconds (numpy, click, the
commands).  A Ctrl-C in that time, while click parses the arguments, or while the
process is on its way out, would end in a Python traceback (or "Exception ignored
in ..."); here it ends like one during a command: ``gradtool: interrupted`` on
stderr, exit status 130.

:func:`interrupted_outside_a_command` becomes the SIGINT handler as this module is
imported (the console script and ``python -m gradtool`` import it before calling
:func:`run`, which installs it again): it writes that line and ends the process at once.  Only while a command
runs does SIGINT raise KeyboardInterrupt as usual (the command cleans up on the
way out: an atomic write removes its temporary file, ``train`` saves), see
``gradtool.cli.common.GradtoolGroup``.  This module imports nothing heavy before
the handler is in place, and ``import gradtool`` itself is instant (the package's
``__init__``).  What is left is the interpreter's own start-up (``site`` and its
``.pth`` files run before any of gradtool's code), which no program can answer.
"""

import os
import signal
import sys


def interrupted_outside_a_command(signum, frame):
    try:
        os.write(2, b"gradtool: interrupted\n")
    finally:
        os._exit(130)


interrupted_outside_a_command.gradtool_start_up = True    # see cli.common.command_interrupts


def install_start_up_handler() -> None:
    try:
        signal.signal(signal.SIGINT, interrupted_outside_a_command)
    except (ValueError, OSError):         # not the main thread: leave Python's handler
        pass


# at import: the console script's "from gradtool.__main__ import run" is followed by
# run(), and a signal between the two would otherwise be Python's KeyboardInterrupt
install_start_up_handler()


def run() -> None:
    install_start_up_handler()
    try:
        from gradtool.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("gradtool: interrupted\n")
        sys.exit(130)
    main()


if __name__ == "__main__":
    run()
