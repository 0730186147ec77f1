"""The dead-letter flags of `picasso stream` (its cycles and its endless job): they build
the run's DeadLetterPolicy (connectors/dead_letters/policy.py), which the run passes down
whole. A new flag for the policy goes here."""

from __future__ import annotations

import argparse

from picasso.connectors.dead_letters.policy import DeadLetterPolicy

_DEFAULTS = DeadLetterPolicy()


def add_dead_letter_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dead-letter-topic", default=_DEFAULTS.topic,
                        help=f"where bad messages go, as they arrived, with why (default {_DEFAULTS.topic})")


def dead_letter_policy(args) -> DeadLetterPolicy:
    return DeadLetterPolicy(topic=args.dead_letter_topic)
