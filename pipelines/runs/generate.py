"""`picasso generate`: synthetic day partitions with a planted ground-truth model.

Two shapes of data:
- labelled rows (generate_days): ROOT/date=YYYY-MM-DD/part-*, what daily runs train on,
  from the planted model or (churn=) the churn model (picasso.connectors.synthetic.churn), whose
  item ids churn along one stream laid across the partitions (first_position);
- event streams (generate_event_days, `--events`): the impressions and the delayed clicks
  that a stream joins into samples, with the truth beside them:
      ROOT/impressions/date=YYYY-MM-DD/part-*   impression events, in event-time order
      ROOT/labels/date=YYYY-MM-DD/part-*        click events, in event-time order
      ROOT/truth/date=YYYY-MM-DD/part-00000.parquet and _planted.json
  A date's clicks are those on its impressions, so the last few carry times just past
  midnight; `picasso produce` merges the dates it replays in event time.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from picasso import storage
from picasso.connectors.day_files import FORMATS, partition_dir, write_part
from picasso.connectors.partitions import parse_partition
from picasso.sample_join.join_spec import JoinSpec
from picasso.metrics import auc
from picasso.sample_join.join_rules import DELAY_COLUMN
from picasso.spec import FeatureSpec
from picasso.connectors.synthetic.planted import PlantedModel, SyntheticConfig
from picasso.connectors.synthetic.churn import ChurnConfig, ChurnModel
from picasso.connectors.synthetic.events import (IMPRESSIONS, LABELS, PROBABILITY, TRUTH, EventStreamConfig, late_share,
                                      make_event_stream)

EVENT_FORMATS = ("parquet", "jsonl")  # events need named fields: a TSV line has none
DAY_MS = 86_400_000
PLANTED_FILE = "_planted.json"  # next to the parts: the planted model's facts (its own AUC)


@dataclass(frozen=True)
class GeneratedDay:
    date: str
    rows: int
    files: int
    auc_ceiling: float  # AUC of the planted model's true probabilities on these rows
    ctr: float


@dataclass(frozen=True)
class GeneratedEventDay:
    date: str
    impressions: int
    clicks: int  # impressions whose planted label is 1
    label_events: int  # clicks and their duplicates
    impression_files: int
    label_files: int
    auc_ceiling: float  # AUC of the planted model's true probabilities on these impressions
    ctr: float
    mean_delay_ms: float  # of the clicks, as drawn
    late_share: float  # of the clicks, more than wait_ms after their impression
    wait_ms: int  # the default join wait (picasso.sample_join.join_spec)


def dates_from(start: str, days: int) -> list[str]:
    first = dt.date.fromisoformat(start)
    return [(first + dt.timedelta(days=i)).isoformat() for i in range(days)]


HOUR_STREAMS = 1_000_000  # hourly partitions' streams start here, above every date's
EPOCH = dt.date(2000, 1, 1)  # partitions count from here


def day_stream(partition: str) -> int:
    """The planted model's stream number of a partition: days since 2000-01-01 for a date,
    HOUR_STREAMS + hours since then for an hour (so an hour never repeats a date's rows)."""
    date, hour = parse_partition(partition)
    days = (date - EPOCH).days
    return days if hour is None else HOUR_STREAMS + days * 24 + hour


def first_position(partition: str, rows: int) -> int:
    """The churn stream's position of a partition's first row: partitions of `rows` rows
    laid end to end from 2000-01-01, a date after the day before it, an hour after the
    hour before it; so consecutive partitions continue one stream, and each holds the same
    rows whichever are written with it."""
    date, hour = parse_partition(partition)
    days = (date - EPOCH).days
    return (days if hour is None else days * 24 + hour) * rows


def midnight_ms(date: str) -> int:
    """Epoch milliseconds of the date's start, UTC."""
    return int(dt.datetime.combine(dt.date.fromisoformat(date), dt.time(), dt.timezone.utc).timestamp()) * 1000


def whole_day_rate(rows: int) -> float:
    """The impression rate (per second) that spreads `rows` impressions over a day."""
    return rows * 1000 / DAY_MS


# A partition's part: (partition, part number, its first row in the partition, its rows)
# -> the rows (in the spec's schema) and their true click probabilities.
Sampler = Callable[[str, int, int, int], tuple[pa.Table, np.ndarray]]


def generate_days(
    spec: FeatureSpec,
    root: str | Path,
    dates: list[str],
    rows: int,
    fmt: str = "parquet",
    rows_per_file: int = 100_000,
    synthetic: SyntheticConfig = SyntheticConfig(),
    on_part: Callable[[int], None] = lambda rows: None,
    churn: ChurnConfig | None = None,
) -> list[GeneratedDay]:
    """Write `rows` rows per partition as date=YYYY-MM-DD[/hour=HH]/part-NNNNN.<fmt>, and
    beside them _planted.json: the GeneratedDay, what made the rows and the spec's name.

    Day k of the calendar (days since 2000-01-01) is the planted model's stream k (hours
    have streams of their own, day_stream), so a partition always holds the same rows for
    the same seed. With `churn` (then `synthetic` is not used), the rows come from the
    churn model (picasso.connectors.synthetic.churn; the spec needs its item field): partition p
    holds the stream's positions first_position(p, rows) on, so consecutive dates (or
    hours) continue one stream of churning items.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {fmt!r}")
    if rows <= 0 or rows_per_file <= 0:
        raise ValueError("rows and rows_per_file must be positive")
    sample, planted = _sampler(spec, rows, synthetic, churn)
    days = []
    for date in dates:
        labels, probabilities = [], []
        files = 0
        for part, start in enumerate(range(0, rows, rows_per_file)):
            count = min(rows_per_file, rows - start)
            table, p = sample(date, part, start, count)
            write_part(table, storage.join(partition_dir(root, date), f"part-{part:05d}{FORMATS[fmt]}"))
            labels.append(table.column(spec.label).to_numpy())
            probabilities.append(p)
            files += 1
            on_part(count)
        labels, probabilities = np.concatenate(labels), np.concatenate(probabilities)
        day = GeneratedDay(date, rows, files, auc(labels, probabilities), float(labels.mean()))
        storage.write_text(
            storage.join(partition_dir(root, date), PLANTED_FILE),
            json.dumps({**asdict(day), **planted, "spec": spec.name})
        )
        days.append(day)
    return days


def _sampler(spec: FeatureSpec, rows: int, synthetic: SyntheticConfig,
             churn: ChurnConfig | None) -> tuple[Sampler, dict]:
    """The model behind generate_days's rows, and what _planted.json records of it."""
    if churn is None:
        planted = PlantedModel(spec, synthetic)
        return (lambda partition, part, first, count: planted.sample(count, day_stream(partition) * 10_000 + part),
                {"alpha": synthetic.alpha, "seed": synthetic.seed})
    model = ChurnModel(spec, churn)
    return (lambda partition, part, first, count: model.sample(first_position(partition, rows) + first, count),
            {"alpha": churn.alpha, "seed": churn.seed, "churn": asdict(churn)})


def generate_event_days(
    spec: FeatureSpec,
    root: str | Path,
    dates: list[str],
    rows: int,
    fmt: str = "parquet",
    rows_per_file: int = 100_000,
    synthetic: SyntheticConfig = SyntheticConfig(),
    events: EventStreamConfig | None = None,
    on_part: Callable[[int], None] = lambda rows: None,
) -> list[GeneratedEventDay]:
    """Write `rows` impressions per date, their clicks and the truth (see the module's
    docstring for the layout).

    Each date's stream starts at its midnight UTC (events.start_ms is set per date). By
    default the impressions spread over the whole day; an events config with a rate must
    still fit them into the day, so that dates do not overlap in event time.
    """
    if fmt not in EVENT_FORMATS:
        raise ValueError(f"events are written as {' or '.join(EVENT_FORMATS)} (they need named fields), got {fmt!r}")
    if rows <= 0 or rows_per_file <= 0:
        raise ValueError("rows and rows_per_file must be positive")
    events = events or EventStreamConfig(impressions_per_s=whole_day_rate(rows))
    if rows / events.impressions_per_s > DAY_MS / 1000 * (1 + 1e-9):  # a whole day's rate, rounded, still fits
        raise ValueError(f"{rows:,} impressions at {events.impressions_per_s:g} per second take "
                         f"{rows / events.impressions_per_s / 3600:.1f} h of event time, more than a day: "
                         "raise the impression rate or lower the rows")
    planted = PlantedModel(spec, synthetic)
    wait_ms = JoinSpec().wait_ms
    days = []
    for date in dates:
        config = replace(events, start_ms=midnight_ms(date))
        stream = make_event_stream(planted, rows, day_stream(date), config)
        impression_files = _write_parts(stream.impressions, storage.join(root, IMPRESSIONS), date, fmt, rows_per_file,
                                        on_part)
        label_files = _write_parts(stream.labels, storage.join(root, LABELS), date, fmt, rows_per_file)
        truth = stream.truth
        labels = truth.column(spec.label).to_numpy()
        delays = truth.column(DELAY_COLUMN).to_numpy()
        day = GeneratedEventDay(
            date=date, impressions=rows, clicks=stream.clicks, label_events=stream.labels.num_rows,
            impression_files=impression_files, label_files=label_files,
            auc_ceiling=auc(labels, truth.column(PROBABILITY).to_numpy()), ctr=float(labels.mean()),
            mean_delay_ms=float(delays[delays >= 0].mean()) if stream.clicks else 0.0,
            late_share=late_share(truth, wait_ms), wait_ms=wait_ms,
        )
        truth_dir = partition_dir(storage.join(root, TRUTH), date)
        write_part(truth, storage.join(truth_dir, "part-00000.parquet"))
        storage.write_text(storage.join(truth_dir, PLANTED_FILE), json.dumps(
            {**asdict(day), "alpha": synthetic.alpha, "seed": synthetic.seed, "spec": spec.name,
             "events": asdict(config)}))
        days.append(day)
    return days


def _write_parts(table: pa.Table, tree: str, date: str, fmt: str, rows_per_file: int,
                 on_part: Callable[[int], None] = lambda rows: None) -> int:
    """The table as part-NNNNN files of at most rows_per_file rows, in its order; at least
    one file, so that a date without clicks still has its (empty) partition."""
    starts = range(0, max(table.num_rows, 1), rows_per_file)
    for part, start in enumerate(starts):
        piece = table.slice(start, rows_per_file)
        write_part(piece, storage.join(partition_dir(tree, date), f"part-{part:05d}{FORMATS[fmt]}"))
        on_part(piece.num_rows)
    return len(starts)


def planted_ceiling(data_root: str, date: str) -> float | None:
    path = storage.join(partition_dir(data_root, date), PLANTED_FILE)
    return json.loads(storage.read_text(path))["auc_ceiling"] if storage.exists(path) else None
