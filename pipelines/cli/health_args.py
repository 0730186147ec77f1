"""The run-health gate's flags (pipelines/runs/run_health.py), shared by every command that
publishes: daily (and demo, and a range), stream and the endless job."""

from __future__ import annotations

import argparse

from picasso.pipelines.runs.run_health import HealthLimits

_DEFAULTS = HealthLimits()


def add_health_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-dead-letter-share", type=float, default=_DEFAULTS.max_dead_letter_share, metavar="SHARE",
        help="refuse to publish (and to mark a partition done) when more than this share of the rows read are "
             f"dead letters (default {_DEFAULTS.max_dead_letter_share:g})")
    parser.add_argument(
        "--max-missing-share", type=float, default=_DEFAULTS.max_missing_share, metavar="SHARE",
        help="warn when a field of the spec is absent (null or missing) in more than this share of the rows "
             f"(default {_DEFAULTS.max_missing_share:g})")
    parser.add_argument(
        "--max-loss", type=float, default=_DEFAULTS.max_loss, metavar="NATS",
        help="refuse a training or evaluation log loss above this many nats a sample: a model that diverged "
             f"(default {_DEFAULTS.max_loss:g}; a constant guess scores at most 0.69)")


def health_limits(args) -> HealthLimits:
    return HealthLimits(max_dead_letter_share=args.max_dead_letter_share, max_missing_share=args.max_missing_share,
                        max_loss=args.max_loss)
