"""`picasso generate` (synthetic partitions with a planted ground-truth model, or its
impression and click streams) and `picasso plan` (a spec's packing plan)."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from picasso.connectors.partitions import with_hours
from picasso.durations import duration_arg
from picasso.packing import PackingPlan
from picasso.pipelines.cli.output import CommandResult, console, reported, summary
from picasso.pipelines.cli.spec_arg import add_spec_arg
from picasso.pipelines.runs.generate import dates_from, generate_days, generate_event_days, whole_day_rate
from picasso.spec import SPARSE_OPTIMIZERS
from picasso.spec_refs import load_spec
from picasso.connectors.synthetic.planted import SyntheticConfig
from picasso.connectors.synthetic.churn import ChurnConfig
from picasso.connectors.synthetic.event_config import DELAY_DISTRIBUTIONS, EventStreamConfig

DEMO_DATE = "2026-11-01"
_EVENT_FLAGS = {"impression_rate": "--impression-rate", "label_delay": "--label-delay",
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
    generate.set_defaults(run=reported(_generate_command))
    return generate


def add_plan_command(commands) -> argparse.ArgumentParser:
    plan = commands.add_parser("plan", help="print the packing plan of a spec: groups, rows and bytes")
    add_spec_arg(plan, default="criteo")
    plan.add_argument("--sparse-optimizer", choices=SPARSE_OPTIMIZERS, default="adagrad",
                      help="the default sparse optimizer (it sizes the optimizer state)")
    plan.set_defaults(run=reported(_plan_command))
    return plan


def _generate_command(args) -> CommandResult:
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
        summary("generated events", {d.date: _event_summary(d) for d in days})
    else:
        given = [flag for name, flag in _EVENT_FLAGS.items() if getattr(args, name) is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: only with --events")
        days = generate_rows(args, args.out, dates)
        summary("generated", {d.date: f"{d.rows} rows, CTR {d.ctr:.3f}, ceiling AUC {d.auc_ceiling:.4f}"
                              for d in days})
    return CommandResult({"out": args.out, "days": [asdict(day) for day in days]})


def generate_rows(args, out: str, dates: list[str]) -> list:
    """Labelled rows: from the planted model, or with --churn (`generate` only) the churn
    model's."""
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


def _plan_command(args) -> CommandResult:
    spec = load_spec(args.spec)
    packing = PackingPlan.from_spec(spec)
    crosses = f" and {len(spec.crosses)} crosses" if spec.crosses else ""
    table = Table(title=f"packing plan of {spec.name}: {len(spec.sparse)} sparse fields{crosses} in "
                        f"{len(packing.groups)} tables")
    for column in ("group", "dim", "part", "optimizer", "fields", "rows", "table MB", "optimizer state MB"):
        table.add_column(column)
    groups = []
    for g in packing.groups:
        optimizer = g.optimizer or args.sparse_optimizer
        # part: the model's parts the group feeds (a cross's may be one alone: packing).
        groups.append({"name": g.name, "embedding_dim": g.embedding_dim, "part": g.part, "optimizer": optimizer,
                       "fields": list(g.fields), "rows": g.num_rows, "table_bytes": g.table_bytes(),
                       "slot_bytes": g.slot_bytes(optimizer)})
        table.add_row(g.name, str(g.embedding_dim), g.part, optimizer, str(g.num_fields), f"{g.num_rows:,}",
                      f"{g.table_bytes() / 2**20:,.1f}", f"{g.slot_bytes(optimizer) / 2**20:,.1f}")
    Console().print(table)
    return CommandResult({"spec": spec.name, "groups": groups,
                          "total_bytes": sum(g["table_bytes"] + g["slot_bytes"] for g in groups)})
