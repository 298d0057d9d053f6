"""The ``gradtool`` command's entry point (also ``python -m gradtool``).

Importing the command line takes a few hundred milliseconds (numpy, click, the
commands).  A Ctrl-C in that time would end in a Python traceback; here it ends
like one during a command: ``gradtool: interrupted`` on stderr, exit status 130.
This module imports nothing heavy before :func:`run` catches the interrupt, and
``import gradtool`` itself is instant (see the package's ``__init__``).
"""

import sys


def run() -> None:
    try:
        from gradtool.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("gradtool: interrupted\n")
        sys.exit(130)
    main()


if __name__ == "__main__":
    run()
