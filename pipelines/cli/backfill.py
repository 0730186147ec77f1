"""`picasso daily` over a range of partitions: its progress and its summary (its flags:
daily_args.py).

`--dates START..END` (days, or hours: 2026-11-01T00..2026-11-01T23), or `--date D`
with `--hours H..H`, runs pipelines/runs/backfill.py's run_range: one process, one line of
progress per partition (done out of total, rows/s, AUC and what it was scored on, version,
time left), and a table at the end with a row per partition. `--eval-next` scores each
partition on the next one (test-then-train) instead of a holdout slice of its own.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from picasso.connectors.partitions import partition_range, with_hours
from picasso.pipelines.cli.output import CommandResult, print_warnings
from picasso.pipelines.cli.progress import Progress, number

if TYPE_CHECKING:  # backfill imports Beam and MLflow: at run time only once a range runs
    from picasso.pipelines.runs.backfill import RangeProgress


def range_partitions(args) -> list[str] | None:
    """The partitions the flags name, or None for a single partition (run as before)."""
    if args.eval_next and args.eval_date:
        raise ValueError("--eval-next and --eval-date: give one (--eval-next scores each partition of a range on "
                         "the next; --eval-date scores one partition on the day given)")
    if args.dates is None and args.hours is None:
        if args.publish_every != 1 or args.missing != "fail" or args.eval_next:
            raise ValueError("--publish-every, --missing and --eval-next are for a range (--dates, or --hours); "
                             "to score one partition on the next, give --eval-date NEXT")
        return None
    if args.eval_date:
        raise ValueError("--eval-date is for one partition: a range scores each partition on the next with "
                         "--eval-next")
    partitions = partition_range(args.dates or args.date)
    if args.hours is not None:
        partitions = with_hours(partitions, args.hours)
    return partitions


def run_daily_range(args, partitions: list[str], config, console: Console) -> CommandResult:
    """Run the range: its results as the command's output, or where it stopped and why."""
    from picasso.pipelines.runs.backfill import RangeStopped, run_range  # Beam and MLflow: only for a run

    with Progress(console, f"daily {partitions[0]}..{partitions[-1]}") as progress:
        finished_at = []  # the wall clock (epoch seconds) as each partition ends

        def on_partition(p: RangeProgress) -> None:
            finished_at.append(time.time())
            progress.line(progress_line(p))
            print_warnings(p.result)

        try:
            results = run_range(replace(config, date=partitions[0]), partitions, args.publish_every, on_partition,
                                missing=args.missing, eval_next=args.eval_next)
        except RangeStopped as stopped:
            return CommandResult({"error": str(stopped), "failed": stopped.partition,
                                  "partitions": [asdict(r) for r in stopped.results]}, stopped=str(stopped))
    console.print(summary_table(results))
    return CommandResult({"partitions": [asdict(r) for r in results],
                          "trained": sum(not r.skipped for r in results), "skipped": sum(r.skipped for r in results),
                          "versions": [r.version for r in results if r.version is not None],
                          "finished_at": finished_at, "missing": sorted(set(partitions) - {r.date for r in results}),
                          "eval_next": args.eval_next,
                          "tracking_uri": config.mlflow.tracking_uri},
                         pending=any(r.status == "pending" for r in results))


def progress_line(p: RangeProgress) -> str:
    """One partition's line."""
    r = p.result
    what = "done before" if r.skipped else f"{r.samples + r.holdout_samples:,} rows"
    version = f"version {r.version}" if r.version else r.status
    left = "" if p.eta_s is None or p.done == p.total else f"; about {p.eta_s:.0f} s left"
    pace = f" at {p.rows_per_s:,.0f} rows/s" if p.rows_per_s else ""
    score = r.not_evaluated if r.not_evaluated else f"AUC {number(r.auc)} on {r.scored_on}"
    return f"[{p.done}/{p.total}] {r.date}: {what}{pace}, {score}, {version}{left}"


def summary_table(results) -> Table:
    # Narrow, so that an hourly row and its "scored on" fit in 80 columns (a log file's width).
    table = Table(title=f"daily: {len(results)} partition(s)", show_edge=False, collapse_padding=True)
    for name in ("partition", "rows", "scored on", "AUC", "log loss", "version", ""):
        table.add_column(name, justify="left" if name in ("partition", "scored on", "") else "right", no_wrap=bool(name))
    for r in results:
        note = "done before" if r.skipped else ("champion" if r.champion else "")
        own = r.samples + (r.holdout_samples if r.scored_on == "holdout" else 0)  # the partition's rows, not the next's
        auc, loss = ("-", "-") if r.not_evaluated else (f"{r.auc:.4f}", f"{r.logloss:.4f}")
        table.add_row(r.date, f"{own:,}", r.scored_on, auc, loss, r.version or r.status, note)
    return table
