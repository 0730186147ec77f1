"""Durations as people write them: `5m`, `30s`, `1h30m`, `250ms`, `2d`.

Every duration picasso reads from a flag or a spec (label delays, join waits, graces) goes
through parse_duration_ms, so they all take the same spellings and fail the same way. A
bare number is refused rather than read as milliseconds: `--label-wait 15` meant as
minutes would otherwise wait 15 ms and turn nearly every click into a negative without a
word.
"""

from __future__ import annotations

import argparse
import re
from fractions import Fraction

UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_TERM = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")  # "ms" before "m": the longer unit wins
_UNITS = "ms, s, m, h or d"


def parse_duration_ms(text: str) -> int:
    """Whole milliseconds of a duration such as "5m", "1.5h" or "1h30m".

    Each term is a non-negative number and a unit (ms, s, m, h, d), terms add up, and the
    total must come to whole milliseconds. Anything else is a ValueError that quotes the
    text and says what is expected.
    """
    if isinstance(text, bool) or not isinstance(text, str):
        raise ValueError(f"expected a duration with a unit ({_UNITS}), e.g. '5m', got {text!r}")
    written = text.strip()
    if not written:
        raise ValueError(f"expected a duration with a unit ({_UNITS}), e.g. '5m', got an empty string")
    if written.startswith("-"):
        raise ValueError(f"duration {text!r} is negative")
    if re.fullmatch(r"\d+(?:\.\d+)?", written):
        raise ValueError(f"duration {text!r} has no unit: write e.g. '{written}ms', '{written}s' or '{written}m'")
    if not re.fullmatch(f"(?:{_TERM.pattern})+", written):
        raise ValueError(f"bad duration {text!r}: expected terms of a number and a unit ({_UNITS}), "
                         "e.g. '5m', '30s', '1h30m'")
    total = sum(Fraction(number) * UNIT_MS[unit] for number, unit in _TERM.findall(written))
    if total.denominator != 1:
        raise ValueError(f"duration {text!r} is not a whole number of milliseconds")
    return int(total)


def duration_arg(text: str) -> int:
    """parse_duration_ms as an argparse `type`: argparse then names the flag in the error
    (argument --label-wait: duration '15' has no unit: ...)."""
    try:
        return parse_duration_ms(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
