"""' (did you mean --workdir?)': the hint after an unknown flag, on every `picasso` command.

Both refusals of an unknown flag give it: picasso's own parser (parser.py) and, on a
pipeline command, the check of what Beam takes (beam_options.py). Here, below both, so that
neither imports the other for it.
"""

from __future__ import annotations

import argparse
import difflib


def did_you_mean(unknown: list[str], *parsers: argparse.ArgumentParser) -> str:
    """' (did you mean --workdir?)' for the first unknown option close to a flag of the
    first parser (or else of the next); '' when none is."""
    for arg in unknown:
        if not arg.startswith("--"):
            continue
        name = arg.split("=", 1)[0]
        for parser in parsers:
            close = difflib.get_close_matches(name, option_strings(parser), n=1)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    # argparse has no public list of a parser's flags; _actions is what its help is made of.
    return [flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")]
