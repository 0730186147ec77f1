"""The `picasso` command line: generate, plan, daily, demo, stream, produce, apply-delta,
publish-pending, promote, the distributed ps, gba-worker and sync-worker, serve (a server
that follows a model's champion), and broker (a local Kafka for trying things).

Every command is a subparser whose `run` (set_defaults) takes the parsed flags and returns
the exit status; main dispatches to it and to nothing else. The reporting commands end as
cli/output.py says (a summary, --json, exit statuses); the distributed ones print their own
lines (cli/distributed.py).

The parser is built of the commands' flags alone, which import neither torch, Beam nor
MLflow; each command's run (cli/command_runs.py) imports what it runs with once it runs, so
`picasso --version` and every --help answer at once, and no command waits for the
libraries of another.

What every command needs set up is done where it starts: its exit handler is registered
before this module's imports load anything (cli/__init__.py, process_exit.py), and main
serves picasso's URLs through Beam's filesystems (Beam imported when a URL is first
touched: connectors/beam_urls.py), whichever command it is.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from picasso.connectors.beam_urls import serve_urls_through_beam
from picasso.pipelines.cli import noise
from picasso.pipelines.cli.broker import add_broker_command
from picasso.pipelines.cli.command_runs import RUNS
from picasso.pipelines.cli.daily_args import add_daily_command, add_demo_command
from picasso.pipelines.cli.distributed_args import add_ps_commands
from picasso.pipelines.cli.generate_args import add_generate_command, add_plan_command
from picasso.pipelines.cli.parser import CommandParser
from picasso.pipelines.cli.process_exit import run_command
from picasso.pipelines.cli.publish_args import add_publish_commands, add_versions_command
from picasso.pipelines.cli.serve import add_serve_command
from picasso.pipelines.cli.stream_args import add_produce_parser, add_stream_parser


DEBUG_HELP = "on an error, its traceback and the library logs that come with it, not only one line"


def build_parser() -> argparse.ArgumentParser:
    # The whole first paragraph: its first line alone stops mid-list.
    parser = CommandParser(prog="picasso", description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--version", action=_Version, help="print picasso's version and exit")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    commands = parser.add_subparsers(dest="command", required=True)
    reporting = [add_generate_command(commands), add_daily_command(commands), add_demo_command(commands),
                 add_plan_command(commands), *add_publish_commands(commands), add_versions_command(commands)]
    for command in reporting:
        command.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_stream_parser(commands)  # with their own --json
    add_produce_parser(commands)
    add_ps_commands(commands)  # ps, gba-worker, sync-worker
    add_broker_command(commands)
    add_serve_command(commands)
    for name, command in commands.choices.items():
        command.set_defaults(run=RUNS[name])
        # After the command too, where it is easier to add to a command line; SUPPRESS:
        # not given there, it leaves the value given before the command.
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


class _Version(argparse.Action):
    """--version: the installed distribution's, read only when asked for."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("picasso-stage")
        except PackageNotFoundError:  # the sources without an install
            found = "unknown (not installed)"
        print(f"picasso {found}")  # on stdout, as argparse's own version action
        parser.exit()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """picasso's flags; on a pipeline command (daily, demo, stream) the options Beam knows
    come as args.beam_args, and any other leftover is an error, as on every other command
    (cli/parser.py)."""
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    serve_urls_through_beam()  # every folder a command takes may be a URL (picasso.storage)
    args = parse_args(argv)
    noise.show_debug(args.debug)
    try:
        return args.run(args)
    except SystemExit as stop:
        # The distributed commands end on an error with SystemExit("error: ...") raised
        # from the error itself: --debug shows where it came from.
        if args.debug and isinstance(stop.code, str) and stop.__context__ is not None:
            noise.print_traceback(stop.__context__)
        raise


def console_main() -> NoReturn:
    """The `picasso` console script."""
    run_command(main)
