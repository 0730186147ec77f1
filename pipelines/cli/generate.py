"""`picasso generate` (synthetic partitions with a planted ground-truth model, or its
impression and click streams) and `picasso plan` (a spec's packing plan): their runs
(their flags: generate_args.py)."""

from __future__ import annotations

from dataclasses import asdict

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from picasso.connectors.partitions import with_hours
from picasso.packing import PackingPlan
from picasso.pipelines.cli.generate_args import EVENT_FLAGS
from picasso.pipelines.cli.output import CommandResult, console, reported, summary
from picasso.pipelines.runs.generate import dates_from, generate_days, generate_event_days, whole_day_rate
from picasso.spec_refs import load_spec
from picasso.connectors.synthetic.planted import SyntheticConfig
from picasso.connectors.synthetic.churn import ChurnConfig
from picasso.connectors.synthetic.event_config import EventStreamConfig


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
        given = [flag for name, flag in EVENT_FLAGS.items() if getattr(args, name) is not None]
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


# The commands' runs (cli/command_runs.py calls them): each ends as cli/output.py says.
generate_command = reported(_generate_command)
plan_command = reported(_plan_command)
