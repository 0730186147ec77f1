"""`picasso generate`: synthetic day partitions with a planted ground-truth model."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from picasso import storage
from picasso.connectors.day_files import FORMATS, partition_dir, write_part
from picasso.metrics import auc
from picasso.pipelines.daily import PLANTED_FILE
from picasso.spec import FeatureSpec
from picasso.synthetic import PlantedModel, SyntheticConfig


@dataclass(frozen=True)
class GeneratedDay:
    date: str
    rows: int
    files: int
    auc_ceiling: float  # AUC of the planted model's true probabilities on these rows
    ctr: float


def dates_from(start: str, days: int) -> list[str]:
    first = dt.date.fromisoformat(start)
    return [(first + dt.timedelta(days=i)).isoformat() for i in range(days)]


def generate_days(
    spec: FeatureSpec,
    root: str | Path,
    dates: list[str],
    rows: int,
    fmt: str = "parquet",
    rows_per_file: int = 100_000,
    synthetic: SyntheticConfig = SyntheticConfig(),
    on_part: Callable[[int], None] = lambda rows: None,
) -> list[GeneratedDay]:
    """Write `rows` rows per date as date=YYYY-MM-DD/part-NNNNN.<fmt>.

    Day k of the calendar (days since 2000-01-01) is the planted model's stream k, so a
    date always holds the same rows for the same seed.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {fmt!r}")
    if rows <= 0 or rows_per_file <= 0:
        raise ValueError("rows and rows_per_file must be positive")
    planted = PlantedModel(spec, synthetic)
    days = []
    for date in dates:
        stream = (dt.date.fromisoformat(date) - dt.date(2000, 1, 1)).days
        labels, probabilities = [], []
        files = 0
        for part, start in enumerate(range(0, rows, rows_per_file)):
            count = min(rows_per_file, rows - start)
            table, p = planted.sample(count, stream * 10_000 + part)
            write_part(table, storage.join(partition_dir(root, date), f"part-{part:05d}{FORMATS[fmt]}"))
            labels.append(table.column(spec.label).to_numpy())
            probabilities.append(p)
            files += 1
            on_part(count)
        labels, probabilities = np.concatenate(labels), np.concatenate(probabilities)
        day = GeneratedDay(date, rows, files, auc(labels, probabilities), float(labels.mean()))
        storage.write_text(
            storage.join(partition_dir(root, date), PLANTED_FILE),
            json.dumps({**asdict(day), "alpha": synthetic.alpha, "seed": synthetic.seed, "spec": spec.name})
        )
        days.append(day)
    return days
