"""The `picasso` command line: generate, plan, daily, demo, stream, produce, apply-delta,
publish-pending, and the distributed ps, gba-worker and sync-worker.

Every command is a subparser whose `run` (set_defaults) takes the parsed flags and returns
the exit status; main dispatches to it and to nothing else. The reporting commands end as
cli/output.py says (a summary, --json, exit statuses); the distributed ones print their own
lines (cli/distributed.py).
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from picasso.pipelines.cli.beam_options import split_beam_args
from picasso.pipelines.cli.daily import add_daily_command, add_demo_command
from picasso.pipelines.cli.distributed import add_ps_commands
from picasso.pipelines.cli.generate import add_generate_command, add_plan_command
from picasso.pipelines.cli.process_exit import run_command
from picasso.pipelines.cli.publish import add_publish_commands
from picasso.pipelines.cli.stream import add_produce_parser, add_stream_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="picasso", description=__doc__.splitlines()[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    reporting = [add_generate_command(commands), add_daily_command(commands), add_demo_command(commands),
                 add_plan_command(commands), *add_publish_commands(commands)]
    for command in reporting:
        command.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_stream_parser(commands)  # with their own --json
    add_produce_parser(commands)
    add_ps_commands(commands)  # ps, gba-worker, sync-worker
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """picasso's flags; on a pipeline command (daily, demo, stream) the options Beam knows
    come as args.beam_args, and any other leftover is an error, as on every other command."""
    parser = build_parser()
    args, leftovers = parser.parse_known_args(argv)
    pipeline_parser = getattr(args, "pipeline_parser", None)
    if pipeline_parser is not None:
        args.beam_args = split_beam_args(leftovers, pipeline_parser)
    elif leftovers:
        parser.error(f"unrecognized arguments: {' '.join(leftovers)}")  # parse_args's own message
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return args.run(args)


def console_main() -> NoReturn:
    """The `picasso` console script."""
    run_command(main)
