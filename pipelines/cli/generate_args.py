"""The flags of `picasso generate` (synthetic partitions, or impression and click streams)
and `picasso plan`; their runs are generate.py's. Torch-free, as every module that builds
the parser (cli/main.py)."""

from __future__ import annotations

import argparse

from picasso.connectors.synthetic.event_config import DELAY_DISTRIBUTIONS
from picasso.durations import duration_arg
from picasso.pipelines.cli.spec_arg import add_spec_arg
from picasso.train_choices import SPARSE_OPTIMIZERS

DEMO_DATE = "2026-11-01"
# The event streams' knobs, by dest: each given without --events is an error (generate.py).
EVENT_FLAGS = {"impression_rate": "--impression-rate", "label_delay": "--label-delay",
               "label_delay_mean": "--label-delay-mean", "duplicate_labels": "--duplicate-labels"}


def add_generate_args(parser: argparse.ArgumentParser) -> None:
    """The planted data's shape: `generate`'s and `demo`'s."""
    parser.add_argument("--rows", type=int, default=200_000, help="rows per day")
    parser.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent of the ids")
    parser.add_argument("--seed", type=int, default=0, help="fixes the planted model")
    parser.add_argument("--format", choices=["parquet", "jsonl", "tsv"], default="parquet")
    parser.add_argument("--rows-per-file", type=int, default=100_000)


def _add_event_args(parser: argparse.ArgumentParser) -> None:
    """`generate --events`: an impression stream and a delayed-click stream instead of
    labelled rows. The knobs default to None so that one given without --events is an error
    rather than silently ignored."""
    events = parser.add_argument_group("event streams (--events)")
    events.add_argument("--events", action="store_true",
                        help="write impression and click events (OUT/impressions, OUT/labels, OUT/truth) "
                             "instead of labelled rows; --rows counts impressions")
    events.add_argument("--impression-rate", type=float, default=None, metavar="PER_S",
                        help="impressions per second of event time (default: the day's rows spread over 24 h)")
    events.add_argument("--label-delay", choices=DELAY_DISTRIBUTIONS, default=None,
                        help="how click delays are distributed (default: exponential)")
    events.add_argument("--label-delay-mean", type=duration_arg, default=None, metavar="DURATION",
                        help="mean click delay, e.g. 5m, 30s, 1h (default: 5m)")
    events.add_argument("--duplicate-labels", type=float, default=None, metavar="FRACTION",
                        help="fraction of clicks sent twice, a few seconds apart (default: 0.02)")


def add_generate_command(commands) -> argparse.ArgumentParser:
    generate = commands.add_parser("generate", help="write synthetic day partitions in a spec's schema")
    add_spec_arg(generate, also=" (default: criteo; churn with --churn)")
    generate.add_argument("--out", required=True, help="root of the date=YYYY-MM-DD partitions")
    generate.add_argument("--start-date", default=DEMO_DATE)
    generate.add_argument("--days", type=int, default=1)
    generate.add_argument("--hourly", action="store_true",
                          help="hourly partitions, date=D/hour=HH, 24 a day; --rows is then rows per hour")
    generate.add_argument("--churn", action="store_true",
                          help="rows from the churn model (picasso.connectors.synthetic.churn): new item ids all the time, old "
                               "ones fading, one stream across the partitions; the spec needs its one-hot 'item' "
                               "field (hashed or dynamic)")
    add_generate_args(generate)
    _add_event_args(generate)
    return generate


def add_plan_command(commands) -> argparse.ArgumentParser:
    plan = commands.add_parser("plan", help="print the packing plan of a spec: groups, rows and bytes")
    add_spec_arg(plan, default="criteo")
    plan.add_argument("--sparse-optimizer", choices=SPARSE_OPTIMIZERS, default="adagrad",
                      help="the default sparse optimizer (it sizes the optimizer state)")
    return plan
