"""Beam's options on picasso's pipeline commands (daily, demo, stream).

A pipeline command takes picasso's own flags and, besides them, any option Beam's
PipelineOptions knows (--direct_num_workers, --project, --flink_master, ...): those are
handed to the pipeline as given. An option neither knows is an error, so a typo in a
picasso flag fails at once instead of being passed to Beam, which would drop it with a
warning. Beam is imported only to check leftovers (its 0.7 s of start-up): a command line
without any, and every --help, never loads it here.
"""

from __future__ import annotations

import argparse
import functools

from picasso.pipelines.cli.did_you_mean import did_you_mean

BEAM_EPILOG = ("Options this command does not know are handed to Beam's PipelineOptions (e.g. "
               "--direct_num_workers=2, --project, --region, --temp_location, --flink_master, "
               "--environment_type, --setup_file, --s3_endpoint_url); an option neither picasso nor Beam "
               "knows is an error.")


def add_pipeline_command(commands, name: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand that runs a Beam pipeline: its leftovers go through split_beam_args."""
    # A CommandParser (cli/parser.py): no abbreviations, and its leftovers come here.
    parser = commands.add_parser(name, epilog=BEAM_EPILOG, **kwargs)
    parser.takes_beam_options = True
    parser.set_defaults(beam_args=())  # until split_beam_args says what they are
    return parser


def split_beam_args(leftovers: list[str], parser: argparse.ArgumentParser) -> tuple[str, ...]:
    """What parser.parse_known_args left over, when Beam knows all of it; else parser.error.

    The leftovers come back unchanged and in order (`--flag value` stays two tokens): Beam
    parses them again itself."""
    if not leftovers:  # the common case, without the cost of importing Beam
        return ()
    beam = _beam_parser()
    try:
        _, unknown = beam.parse_known_args(leftovers)
    except _BeamArgumentError as err:  # a Beam option with a bad or missing value
        parser.error(f"Beam option: {err}")
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{did_you_mean(unknown, parser, beam)}")
    return tuple(leftovers)


class _BeamArgumentError(Exception):
    pass


@functools.cache
def _beam_parser() -> argparse.ArgumentParser:
    """Every option of every registered PipelineOptions subclass, as PipelineOptions builds
    them (its get_all_options), built once a command has leftovers."""
    # Beam, imported here: a pipeline command's parser (and its --help) is built without it.
    import apache_beam  # noqa: F401 - registers the options classes of the runners and IOs
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    class Parser(_BeamArgumentParser):  # Beam's: some options are ValueProvider arguments
        def error(self, message):  # argparse would exit: let picasso's parser say it
            raise _BeamArgumentError(message)

    parser = Parser(allow_abbrev=False, add_help=False)
    # Keyed by name, as Beam does: a class defined twice (e.g. in a main session) counts once.
    for options_class in {str(cls): cls for cls in _options_classes(PipelineOptions)}.values():
        options_class._add_argparse_args(parser)  # noqa: SLF001 - the hook Beam itself calls
    return parser


def _options_classes(base: type):
    """The subclasses of base, all the way down, that add options of their own (a class that
    only inherits its parent's would add them a second time)."""
    for cls in base.__subclasses__():
        if "_add_argparse_args" in cls.__dict__:
            yield cls
        yield from _options_classes(cls)
