"""How a reporting command ends (every command but the distributed ones, which print
their own lines): progress on stderr, a summary table, with --json one JSON object as the
last line of stdout, and an exit status a scheduler can act on.

  0  done
  1  stopped: the command gave up on an error no retry mends (STOPPED_EXIT)
  2  bad input, or an MLflow that cannot be reached: a message, not a traceback
  3  done, but versions wait in WORKDIR/publish for MLflow (PENDING_EXIT): a retry publishes them

An error of status 2 is one line; `picasso --debug` prints its traceback before it (and
the library's log of it: cli/noise.py).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from picasso.serving.publishing.local_store import HalfMadeStoreError
from picasso.pipelines.cli.cache_args import cache_config
from picasso.spec import SpecError

console = Console(stderr=True)
STOPPED_EXIT = 1
BAD_INPUT_EXIT = 2
PENDING_EXIT = 3
BAD_INPUT = (SpecError, FileNotFoundError, ValueError, HalfMadeStoreError)


@dataclass
class CommandResult:
    output: dict  # what --json prints (with "seconds" added)
    pending: bool = False  # a version MLflow did not take waits in the outbox
    stopped: str | None = None  # why the command gave up; None: it did not


def reported(command: Callable[..., CommandResult]) -> Callable[..., int]:
    """The command as a command's run (cli/command_runs.py): it runs under picasso's logging
    and ends as the module docstring says."""

    def run(args) -> int:
        _configure_logging()
        started = time.perf_counter()
        try:
            if hasattr(args, "cache_capacity"):
                cache_config(args)  # a bad cache option fails here, before any work
            result = command(args)
        except Exception as err:  # noqa: BLE001 - bad input and an unreachable MLflow: a message
            if not is_bad_input(err):
                raise
            if getattr(args, "debug", False):
                traceback.print_exc(file=sys.stderr)
            console.print(f"[red]error:[/red] {err}", soft_wrap=True)  # one line, however long
            if args.json:
                print(json.dumps({"error": str(err)}))
            return BAD_INPUT_EXIT
        result.output["seconds"] = round(time.perf_counter() - started, 2)
        if args.json:
            print(json.dumps(finite(result.output)))
        if result.stopped:
            # Not 0, and not 3 either, since rerunning as it is would fail the same way.
            console.print(f"[red]{args.command} stopped:[/red] {result.stopped}", soft_wrap=True)  # one line
            return STOPPED_EXIT
        if result.pending:
            # Not 0: a scheduler sees it and retries, and the retry publishes what is pending.
            console.print("[yellow]publish pending:[/yellow] MLflow did not take every version; they wait in "
                          "WORKDIR/publish/pending and go out with the next run or `picasso publish-pending`")
            return PENDING_EXIT
        return 0

    return run


def is_bad_input(err: BaseException) -> bool:
    """Whether a command ends on this error with one line and status 2."""
    return isinstance(err, BAD_INPUT) or type(err).__module__.startswith("mlflow")


def _configure_logging() -> None:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # MLflow sets its loggers' level itself when it is imported, which a command does only
    # once it publishes (after this): at WARNING, as the libraries below.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    # Warnings and errors in logging's default form, as every command has said them since
    # Beam's import set the root logger up so (cli/noise.py) before this ran: Beam is now
    # imported later, or not at all.
    logging.basicConfig()
    for noisy in ("apache_beam", "mlflow", "alembic", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def summary(title: str, values: dict) -> None:
    table = Table(title=title, show_header=False)
    for key, value in values.items():
        if isinstance(value, float):
            value = f"{value:.4f}"
        table.add_row(key, str(value))
    console.print(table)


def print_warnings(result) -> None:
    """The run-health gate's warnings on a partition (a DailyResult), one line each."""
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {result.date}: {warning}", highlight=False, soft_wrap=True)


def finite(value):
    """The value with every float that is not finite as None (JSON has no NaN), nested too."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value
