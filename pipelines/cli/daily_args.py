"""The flags of `picasso daily` (one partition, or a range of them) and `picasso demo`;
their runs are daily.py's (and a range's, backfill.py's). Torch-, Beam- and MLflow-free,
as every module that builds the parser (cli/main.py)."""

from __future__ import annotations

import argparse
import os

from picasso.connectors.partitions import MISSING_POLICIES
from picasso.pipelines.cli.beam_options import add_pipeline_command
from picasso.pipelines.cli.cache_args import add_cache_args
from picasso.pipelines.cli.generate_args import add_generate_args
from picasso.pipelines.cli.health_args import add_health_args
from picasso.pipelines.cli.publish_args import add_publish_args
from picasso.pipelines.cli.spec_arg import add_spec_arg
from picasso.pipelines.cli.train_args import add_model_args


def _add_daily_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", required=True, help="checkpoints, dead letters and run results go here")
    parser.add_argument(
        "--mlflow-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI"),
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///WORKDIR/mlflow.db)",
    )
    parser.add_argument("--experiment", default="picasso")
    parser.add_argument("--model-name", default="picasso-ctr")
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--holdout", type=float, default=0.1, help="fraction of the day held out for evaluation")
    add_model_args(parser)
    add_cache_args(parser)
    parser.add_argument("--unknown-fields", choices=["ignore", "reject"], default="ignore")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (cuda when present)")
    parser.add_argument("--runner", default="FnApiRunner", help="Beam runner (FnApiRunner, DirectRunner, ...)")
    parser.add_argument("--warm-start", choices=["latest", "champion", "none"], default="latest",
                        help="start from the latest checkpoint, the champion version's checkpoint, or scratch")
    parser.add_argument("--force", action="store_true", help="run a date again although it is done")
    add_publish_args(parser)
    add_health_args(parser)


def add_daily_command(commands) -> argparse.ArgumentParser:
    daily = add_pipeline_command(commands, "daily", help="train on one partition, or a range of them, and publish "
                                                        "a model version of each")
    add_spec_arg(daily, default="criteo")
    daily.add_argument("--data", required=True, help="root of the date=YYYY-MM-DD[/hour=HH] partitions")
    add_range_args(daily)
    daily.add_argument("--eval-date", default=None,
                       help="evaluate on this day (e.g. the next one) instead of a holdout slice of --date "
                            "(a range: --eval-next)")
    _add_daily_args(daily)
    return daily


def add_demo_command(commands) -> argparse.ArgumentParser:
    demo = add_pipeline_command(commands, "demo", help="generate a small day, then run daily on embedded defaults")
    add_spec_arg(demo, default="criteo")
    add_generate_args(demo)
    _add_daily_args(demo)
    return demo


def add_range_args(daily: argparse.ArgumentParser) -> None:
    """--date or --dates, --hours, and what a range does (its run: backfill.py)."""
    which = daily.add_mutually_exclusive_group(required=True)
    which.add_argument("--date", help="one partition: YYYY-MM-DD, or YYYY-MM-DDTHH for an hourly one")
    which.add_argument("--dates", metavar="START..END",
                       help="a range of partitions, in one process: 2026-11-01..2026-11-30, or with hours "
                            "2026-11-01T00..2026-11-01T23")
    daily.add_argument("--hours", metavar="H..H", default=None,
                       help="split each date into these hourly partitions (date=D/hour=HH), e.g. 0..23")
    daily.add_argument("--missing", choices=MISSING_POLICIES, default="fail",
                       help="in a range, a partition with no files stops it (fail, the default) or is skipped "
                            "with a warning (skip: data with days of no events)")
    daily.add_argument("--publish-every", type=int, default=1, metavar="N",
                       help="in a range, make a version every N partitions and at the last; the others are "
                            "checkpointed and evaluated (default: every partition)")
    daily.add_argument("--eval-next", action="store_true",
                       help="in a range, train on all of each partition and score its version on the next one "
                            "(the last on the partition after the range, which must have files) instead of a "
                            "holdout slice")
