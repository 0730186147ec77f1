"""The `picasso` command line: generate, daily, demo, plan, stream, produce, apply-delta,
publish-pending.

Each command shows progress on stderr and ends with a summary; with --json, the last
line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
from dataclasses import asdict

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import Progress
from rich.table import Table

from picasso import storage
from picasso.connectors.local_store import HalfMadeStoreError
from picasso.durations import duration_arg
from picasso.connectors.partitions import with_hours
from picasso.pipelines.cli.backfill import add_range_args, range_partitions, run_daily_range
from picasso.pipelines.cli.beam_options import add_pipeline_command, split_beam_args
from picasso.pipelines.cli.cache_args import add_cache_args, cache_config, interleave_setting
from picasso.pipelines.cli.distributed import COMMANDS as DISTRIBUTED_COMMANDS
from picasso.pipelines.cli.distributed import add_ps_commands
from picasso.pipelines.cli.publish import (add_publish_args, add_publish_commands, publish_policy, run_apply_delta,
                                           run_publish_pending)
from picasso.pipelines.cli.train_args import add_model_args, model_settings
from picasso.spec import SPARSE_OPTIMIZERS, SpecError, load_spec
from picasso.synthetic_events import DELAY_DISTRIBUTIONS

console = Console(stderr=True)
DEMO_DATE = "2026-11-01"
PENDING_EXIT = 3
STOPPED_EXIT = 1


def _add_generate_args(parser: argparse.ArgumentParser) -> None:
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


_EVENT_FLAGS = {"impression_rate": "--impression-rate", "label_delay": "--label-delay",
                "label_delay_mean": "--label-delay-mean", "duplicate_labels": "--duplicate-labels"}


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="picasso", description=__doc__.splitlines()[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="write synthetic day partitions in a spec's schema")
    generate.add_argument("--spec", default=None,
                          help="YAML file, or built-in: criteo, criteo:N, churn (default: criteo; churn with --churn)")
    generate.add_argument("--out", required=True, help="root of the date=YYYY-MM-DD partitions")
    generate.add_argument("--start-date", default=DEMO_DATE)
    generate.add_argument("--days", type=int, default=1)
    generate.add_argument("--hourly", action="store_true",
                          help="hourly partitions, date=D/hour=HH, 24 a day; --rows is then rows per hour")
    generate.add_argument("--churn", action="store_true",
                          help="rows from the churn model (picasso.synthetic_churn): new item ids all the time, old "
                               "ones fading, one stream across the partitions; the spec needs its one-hot 'item' "
                               "field (hashed or dynamic)")
    _add_generate_args(generate)
    _add_event_args(generate)

    daily = add_pipeline_command(commands, "daily", help="train on one partition, or a range of them, and publish "
                                                        "a model version of each")
    daily.add_argument("--spec", default="criteo")
    daily.add_argument("--data", required=True, help="root of the date=YYYY-MM-DD[/hour=HH] partitions")
    add_range_args(daily)
    daily.add_argument("--eval-date", default=None,
                       help="evaluate on this day (e.g. the next one) instead of a holdout slice of --date")
    _add_daily_args(daily)

    demo = add_pipeline_command(commands, "demo", help="generate a small day, then run daily on embedded defaults")
    demo.add_argument("--spec", default="criteo")
    _add_generate_args(demo)
    _add_daily_args(demo)

    plan = commands.add_parser("plan", help="print the packing plan of a spec: groups, rows and bytes")
    plan.add_argument("--spec", default="criteo", help="YAML file, or built-in: criteo, criteo:N")
    plan.add_argument("--sparse-optimizer", choices=SPARSE_OPTIMIZERS, default="adagrad",
                      help="the default sparse optimizer (it sizes the optimizer state)")

    publishing = add_publish_commands(commands)
    for command in (generate, daily, demo, plan, *publishing):
        command.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    _add_kafka_commands(commands)
    add_ps_commands(commands)  # ps, gba-worker, sync-worker: they run themselves (args.run)
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


def _add_kafka_commands(commands) -> None:
    """`stream` and `produce`: their arguments live in picasso.pipelines.stream_cli."""
    from picasso.pipelines.cli.stream import add_produce_parser, add_stream_parser

    add_stream_parser(commands)
    add_produce_parser(commands)


def _kafka_command(args) -> dict:
    from picasso.pipelines.cli.stream import run_produce_command, run_stream_command

    if args.command == "stream":
        output = run_stream_command(args, console)
        _summary("stream", {k: v for k, v in output.items() if k not in ("ledger", "versions")})
    else:
        output = run_produce_command(args, console)
        _summary(f"produced into {output['topic']}", output)
    return output


def _plan(args) -> dict:
    from picasso.packing import PackingPlan

    spec = load_spec(args.spec)
    packing = PackingPlan.from_spec(spec)
    table = Table(title=f"packing plan of {spec.name}: {len(spec.sparse)} sparse fields in {len(packing.groups)} tables")
    for column in ("group", "dim", "optimizer", "fields", "rows", "table MB", "optimizer state MB"):
        table.add_column(column)
    groups = []
    for g in packing.groups:
        optimizer = g.optimizer or args.sparse_optimizer
        groups.append({"name": g.name, "embedding_dim": g.embedding_dim, "optimizer": optimizer, "fields": list(g.fields),
                       "rows": g.num_rows, "table_bytes": g.table_bytes(), "slot_bytes": g.slot_bytes(optimizer)})
        table.add_row(g.name, str(g.embedding_dim), optimizer, str(g.num_fields), f"{g.num_rows:,}",
                      f"{g.table_bytes() / 2**20:,.1f}", f"{g.slot_bytes(optimizer) / 2**20:,.1f}")
    Console().print(table)
    return {"spec": spec.name, "groups": groups, "total_bytes": sum(g["table_bytes"] + g["slot_bytes"] for g in groups)}


def _generate(args, out: str, dates: list[str]) -> list:
    """Labelled rows: from the planted model, or with --churn (`generate` only) the churn
    model's."""
    from picasso.pipelines.runs.generate import generate_days
    from picasso.synthetic import SyntheticConfig
    from picasso.synthetic_churn import ChurnConfig

    spec = load_spec(args.spec)
    churn = ChurnConfig(alpha=args.alpha, seed=args.seed) if getattr(args, "churn", False) else None
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"generating {len(dates)} day(s) of {spec.name}", total=args.rows * len(dates))
        return generate_days(
            spec, out, dates, args.rows, args.format, args.rows_per_file,
            SyntheticConfig(alpha=args.alpha, seed=args.seed),
            on_part=lambda rows: progress.advance(task, rows), churn=churn,
        )


def _generate_events(args, dates: list[str]) -> list:
    from picasso.pipelines.runs.generate import generate_event_days, whole_day_rate
    from picasso.synthetic import SyntheticConfig
    from picasso.synthetic_events import EventStreamConfig

    defaults = EventStreamConfig()
    events = EventStreamConfig(
        impressions_per_s=whole_day_rate(args.rows) if args.impression_rate is None else args.impression_rate,
        label_delay=args.label_delay or defaults.label_delay,
        label_delay_mean_ms=defaults.label_delay_mean_ms if args.label_delay_mean is None else args.label_delay_mean,
        duplicate_fraction=defaults.duplicate_fraction if args.duplicate_labels is None else args.duplicate_labels,
    )
    spec = load_spec(args.spec)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"generating {len(dates)} day(s) of {spec.name} events", total=args.rows * len(dates))
        return generate_event_days(
            spec, args.out, dates, args.rows, args.format, args.rows_per_file,
            SyntheticConfig(alpha=args.alpha, seed=args.seed), events,
            on_part=lambda rows: progress.advance(task, rows),
        )


def _event_summary(day) -> str:
    return (f"{day.impressions} impressions, {day.clicks} clicks (+{day.label_events - day.clicks} duplicates), "
            f"CTR {day.ctr:.3f}, ceiling AUC {day.auc_ceiling:.4f}, mean delay {day.mean_delay_ms / 1000:.0f}s, "
            f"{day.late_share:.1%} later than {day.wait_ms // 60_000}m")


def daily_config(args, data: str, date: str):
    """The DailyConfig the flags describe. It makes WORKDIR and opens its MLflow target
    (a default SQLite store is made complete there), and trains nothing."""
    from picasso.connectors.decoders import DecodeOptions
    from picasso.connectors.mlflow_registry import MLflowTarget
    from picasso.pipelines.runs.daily import DailyConfig
    from picasso.trainer import TrainConfig

    workdir = storage.make_folder(args.workdir)
    target = MLflowTarget.for_workdir(workdir, args.mlflow_uri, args.experiment, args.model_name)
    return DailyConfig(
        data_root=data,
        date=date,
        workdir=workdir,
        spec=load_spec(args.spec),
        mlflow=target,
        train=TrainConfig(
            **model_settings(args),
            device=args.device,
            cache=cache_config(args),
            interleave=interleave_setting(args),
        ),
        decode=DecodeOptions(unknown_fields=args.unknown_fields),
        batch_size=args.batch_size,
        holdout_fraction=args.holdout,
        eval_date=getattr(args, "eval_date", None) or None,  # "" (the MLproject default): a holdout slice
        warm_start=args.warm_start,
        force=args.force,
        policy=publish_policy(args),
        runner=args.runner,
        beam_args=args.beam_args,
    )


def _daily(args, data: str, date: str):
    from picasso.pipelines.runs.daily import run_daily

    config = daily_config(args, data, date)
    with console.status(f"daily run for {date}: read, decode, pack, train, evaluate, publish"):
        return run_daily(config), config.mlflow


def _summary(title: str, values: dict) -> None:
    table = Table(title=title, show_header=False)
    for key, value in values.items():
        if isinstance(value, float):
            value = f"{value:.4f}"
        table.add_row(key, str(value))
    console.print(table)


def _finite(value):
    """The value with every float that is not finite as None (JSON has no NaN), nested too."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command in DISTRIBUTED_COMMANDS:  # they have their own output and exit codes
        return args.run(args)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler(console=console, show_path=False)])
    for noisy in ("apache_beam", "mlflow", "alembic", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    started = time.perf_counter()
    pending = False  # a publish MLflow could not take: it waits in WORKDIR/publish
    try:
        if hasattr(args, "cache_capacity"):
            cache_config(args)  # a bad cache option fails here, before any work
        if args.command == "generate":
            from picasso.pipelines.runs.generate import dates_from

            dates = dates_from(args.start_date, args.days)
            args.spec = args.spec or ("churn" if args.churn else "criteo")
            if args.churn and args.events:
                raise ValueError("--churn writes labelled rows; event streams (--events) come from the planted model")
            if args.hourly:
                if args.events:
                    raise ValueError("--hourly writes labelled rows; event streams (--events) are written by date")
                dates = with_hours(dates, "0..23")
            if args.events:
                days = _generate_events(args, dates)
                _summary("generated events", {d.date: _event_summary(d) for d in days})
            else:
                given = [flag for name, flag in _EVENT_FLAGS.items() if getattr(args, name) is not None]
                if given:
                    raise ValueError(f"{', '.join(given)}: only with --events")
                days = _generate(args, args.out, dates)
                _summary("generated", {d.date: f"{d.rows} rows, CTR {d.ctr:.3f}, ceiling AUC {d.auc_ceiling:.4f}"
                                       for d in days})
            output = {"out": args.out, "days": [asdict(day) for day in days]}
        elif args.command == "plan":
            output = _plan(args)
        elif args.command in ("stream", "produce"):
            output = _kafka_command(args)
            pending = bool(output.get("pending"))  # a stream that ended with versions in the outbox
        elif args.command == "apply-delta":
            output = run_apply_delta(args)
            _summary("apply-delta: rebuilt bit for bit", output)
        elif args.command == "publish-pending":
            output = run_publish_pending(args)
            _summary("publish-pending", output)
            pending = bool(output["pending"])
        elif args.command == "daily" and (partitions := range_partitions(args)) is not None:
            from picasso.pipelines.runs.backfill import RangeStopped

            try:
                output = run_daily_range(args, partitions, daily_config(args, args.data, partitions[0]), console)
            except RangeStopped as stopped:
                console.print(f"[red]range stopped:[/red] {stopped}")
                if args.json:
                    print(json.dumps(_finite({"error": str(stopped), "failed": stopped.partition,
                                              "partitions": [asdict(r) for r in stopped.results]})))
                return STOPPED_EXIT
            pending = any(p["status"] == "pending" for p in output["partitions"])
        else:
            if args.command == "demo":
                data = storage.join(args.workdir, "data")
                days = _generate(args, data, [DEMO_DATE])
                result, target = _daily(args, data, DEMO_DATE)
                if result.auc_ceiling is None:
                    result = result.__class__(**{**asdict(result), "auc_ceiling": days[0].auc_ceiling})
            else:
                result, target = _daily(args, args.data, args.date)
            output = {**asdict(result), "tracking_uri": target.tracking_uri}
            _summary(f"daily {result.date}" + (" (done before: nothing trained)" if result.skipped else ""),
                     {k: v for k, v in output.items() if k != "counters"})
            pending = result.status != "published"
    except Exception as err:  # noqa: BLE001 - bad input and an unreachable MLflow: a message, not a traceback
        if not isinstance(err, (SpecError, FileNotFoundError, ValueError, HalfMadeStoreError)) \
                and not type(err).__module__.startswith("mlflow"):
            raise
        console.print(f"[red]error:[/red] {err}")
        if args.json:
            print(json.dumps({"error": str(err)}))
        return 2
    output["seconds"] = round(time.perf_counter() - started, 2)
    if args.json:
        print(json.dumps(_finite(output)))
    if output.get("stopped"):
        # The stream gave up on an error no retry mends (pipelines/runs/cycle_failures.py): not
        # 0, and not 3 either, since rerunning as it is would fail the same way.
        console.print(f"[red]stream stopped:[/red] {output['stopped']}")
        return STOPPED_EXIT
    if pending:
        # Not 0: a scheduler sees it and retries, and the retry publishes what is pending.
        console.print("[yellow]publish pending:[/yellow] MLflow did not take every version; they wait in "
                      "WORKDIR/publish/pending and go out with the next run or `picasso publish-pending`")
        return PENDING_EXIT
    return 0

