"""How a `picasso` process ends: every exit handler runs, the interpreter's teardown does not.

After a command returns, CPython finalizes the interpreter: it tears down every module and
frees every object one by one. With torch, Beam, MLflow and their dependencies loaded that
took 1.4-2.0 s of a 6-10 s `picasso daily` run on this machine, and achieves nothing the
operating system does not do at once when the process ends.

So the command's process leaves with os._exit once everything that exit is for is done.
The handler that does so is registered with atexit before anything else, and atexit runs
handlers last-registered first, so it runs after every other one: logging's shutdown,
multiprocessing's, MLflow's, pyarrow's. Non-daemon threads are joined before atexit runs,
as at any exit. What is skipped is the teardown alone, which can lose only data a program
left in a file object it never closed; picasso writes through context managers, and
stdout and stderr are flushed here.

The handler is registered when this module is imported, first thing in the command line's
package (cli/__init__.py, before the logging module is loaded), which every entry point of
the command imports before anything else: so it is among the first registered (only what
site itself registers comes before: certifi's, a no-op for an installed package). Importing
picasso.pipelines alone registers nothing. The handler does nothing unless run_command
armed it: library callers of a command's main() (tests, notebooks) exit as Python always
does. The console script (cli/main.py's console_main, also `python -m picasso.pipelines.cli`)
and `python -m picasso.pipelines.cli.distributed` go through run_command.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from typing import NoReturn

# The status the process leaves with; None: run_command has not armed the handler.
_status: int | None = None


@atexit.register
def _leave() -> None:
    if _status is None:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe: nothing more to say
            pass
    os._exit(_status)


def _exit_status(code) -> int:
    """The status Python itself would exit with for sys.exit(code)."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1  # a message: printed, then status 1


def run_command(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> NoReturn:
    """Run a command's main and exit with its status, skipping the interpreter's teardown."""
    global _status
    # An exception main does not catch exits 1 once Python has printed its traceback, as
    # it would without this; an interrupt 130 (the shell's 128 + SIGINT).
    _status = 1
    try:
        _status = _exit_status(main(argv))
    except SystemExit as stop:
        _status = _exit_status(stop.code)
        raise
    except KeyboardInterrupt:
        _status = 130
        raise
    sys.exit(_status)
