"""The argument parser of every `picasso` command: no abbreviations, and an unknown flag
said before a missing one.

- No abbreviations: `--day` must not be taken for --days, nor `--vers` for --version, on
  one command when another refuses them (and a Beam option must never be taken for an
  abbreviation of a picasso flag).
- An unknown flag is the error, with the flag it is closest to: `--workdr x` is a typo of
  the required --workdir, and argparse's own "the following arguments are required:
  --workdir" would hide that. (The hint: did_you_mean.py.)
- What a command does not know: on a pipeline command, Beam's options (beam_options.py);
  on every other, an error.
"""

from __future__ import annotations

import argparse
import sys

from picasso.pipelines.cli.did_you_mean import did_you_mean

# argparse's messages for a flag, or one of a group of flags, that is missing.
_REQUIRED = ("the following arguments are required", "one of the arguments")


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, as the module docstring says. Subcommands are made of the same
    class (add_subparsers uses the parser's own)."""

    takes_beam_options = False  # a pipeline command's: beam_options.add_pipeline_command sets it

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._given: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        namespace, leftovers = super().parse_known_args(args, namespace)
        if leftovers and self._subparsers is None:  # a command's own leftovers: its parser says what they are
            namespace.beam_args = self.take_leftovers(leftovers)
            leftovers = []
        return namespace, leftovers

    def take_leftovers(self, leftovers: list[str]) -> tuple[str, ...]:
        """What the command passes on of what it does not know; an error for anything else."""
        if self.takes_beam_options:
            from picasso.pipelines.cli.beam_options import split_beam_args

            return split_beam_args(leftovers, self)
        self.error(f"unrecognized arguments: {' '.join(leftovers)}{did_you_mean(leftovers, self)}")

    def error(self, message: str):
        if message.startswith(_REQUIRED):
            self._unknown_flags_first()
        super().error(message)

    def _unknown_flags_first(self) -> None:
        """Parse what was given again with nothing required: its leftovers are the flags the
        command does not know, and they are the error when there are any."""
        required = [held for held in (*self._actions, *self._mutually_exclusive_groups) if held.required]
        for held in required:
            held.required = False
        try:
            _, leftovers = super().parse_known_args(self._given, argparse.Namespace())
        finally:
            for held in required:
                held.required = True
        if leftovers:
            self.take_leftovers(leftovers)  # raises, unless Beam takes them all

