"""What every benchmark shares: argument parsing, timing, and the report.

A report is a table on stdout and, with --json, one JSON object as the last line:
{"benchmark": ..., "ratios": {...}, "metrics": {...}}. Ratios are oriented so that higher
means picasso is better.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table


def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--repeat", type=int, default=5, help="timed repetitions; the median is reported")
    if extra:
        extra(parser)
    return parser.parse_args()


def torchrec_absent() -> str | None:
    """Why TorchRec cannot be measured here, or None when it can (it is not a dependency;
    the recipe is in the README)."""
    try:
        import torchrec  # noqa: F401
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any import failure means absent
        return f"{type(err).__name__}: {err}"
    return None


def median_seconds(fn: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def print_table(name: str, columns: list[str], rows: list[list], caption: str | None = None) -> Console:
    # Piped to a file, rich would squeeze a wide table into 80 columns and cut its cells.
    console = Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title=name, caption=caption)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(f"{v:,.1f}" if isinstance(v, float) else str(v) for v in row))
    console.print(table)
    return console


def report(name: str, columns: list[str], rows: list[list], ratios: dict[str, float], metrics: dict, as_json: bool,
           caption: str | None = None) -> None:
    console = print_table(name, columns, rows, caption)
    for key, value in ratios.items():
        console.print(f"{key}: {value:.4g}")  # AUC deltas are thousandths
    if as_json:
        print(json.dumps({"benchmark": name, "ratios": ratios, "metrics": metrics}))
