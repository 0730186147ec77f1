"""What every benchmark shares: argument parsing, timing, and the report.

A report is a table on stdout and, with --json, one JSON object as the last line:
{"benchmark": ..., "ratios": {...}, "metrics": {...}}. Ratios are oriented so that higher
means picasso is better. Every report names the CPU it was measured on (metrics["cpu"]):
the machines differ, and a figure means little without it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from picasso.precision import cpu_bf16_units, cpu_info

def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None,
               smoke: dict[str, object] | None = None) -> argparse.Namespace:
    """The command line every benchmark shares, plus its own arguments (`extra`).

    Every benchmark has --smoke: a size that finishes in seconds, which the test suite runs to
    prove the benchmark still works (its figures mean nothing). `smoke` maps an argument's
    dest to its smoke value, which replaces the value only where it was left at its
    default: a value given on the command line wins. A benchmark that declared --smoke
    itself in `extra` (store_true) keeps its own.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--repeat", type=int, default=5, help="timed repetitions; the median is reported")
    if extra:
        extra(parser)
    if "--smoke" not in parser._option_string_actions:
        parser.add_argument("--smoke", action="store_true",
                            help="a size that finishes in seconds, to check the benchmark runs; not a measurement")
    unknown = sorted(set(smoke or {}) - {action.dest for action in parser._actions})
    if unknown:  # a typo would otherwise leave the full size in the smoke run, silently
        raise ValueError(f"smoke sizes for arguments this benchmark does not have: {', '.join(unknown)}")
    args = parser.parse_args()
    if args.smoke:
        for dest, value in (smoke or {}).items():
            if getattr(args, dest) == parser.get_default(dest):
                setattr(args, dest, value)
    return args


def sized(args: argparse.Namespace, full, smoke):
    """`smoke` under --smoke, else `full`: for the sizes a benchmark does not take as arguments."""
    return smoke if args.smoke else full


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


def rss_bytes(pid: int | None = None) -> int:
    """A process's resident memory (VmRSS), this one's by default (0 for a process that has
    no memory of its own left: a zombie's status has no VmRSS line)."""
    with open(f"/proc/{pid or 'self'}/status") as status:
        return next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:")), 0)


def cpu_description() -> str:
    """The CPU's model name, the cores this process may use, and the bf16 units some
    figures depend on (read at run time: it changes from one machine to the next)."""
    name = cpu_info().get("model name", "unknown CPU")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    units = cpu_bf16_units()
    return f"{name}, {cores} cores" + (f" ({', '.join(units)})" if units else "")


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
    cpu = cpu_description()
    console.print(f"measured on: {cpu}")
    if as_json:
        print(json.dumps({"benchmark": name, "ratios": ratios, "metrics": {**metrics, "cpu": cpu}}))
