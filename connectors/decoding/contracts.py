"""What the steps of decoding hand each other: the options a decoder is made with, the
parsed columns a parser hands the validator, the verdicts both write, and the result."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from picasso.connectors.dead_letters.letters import DeadLetter


@dataclass(frozen=True)
class DecodeOptions:
    require_label: bool = True  # serving decodes events that carry no label
    unknown_fields: str = "ignore"  # or "reject"

    def __post_init__(self):
        if self.unknown_fields not in ("ignore", "reject"):
            raise ValueError(f"unknown_fields must be 'ignore' or 'reject', got {self.unknown_fields!r}")


def summed_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Per-name counts (a DecodeResult's absent fields) of parts, added up."""
    total: dict[str, int] = {}
    for part in counts:
        for name, n in part.items():
            total[name] = total.get(name, 0) + n
    return total


@dataclass
class DecodeResult:
    table: pa.Table  # valid rows only, canonical schema (see decoding.validation)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    valid_mask: np.ndarray | None = None  # which input rows are in `table`, in order
    # Per field of the spec: the valid rows that lack it (null or missing), for the
    # run-health gate's warnings (pipelines/runs/run_health.py).
    absent: dict[str, int] = field(default_factory=dict)

    @property
    def rows_in(self) -> int:
        return self.table.num_rows + len(self.dead_letters)

    @staticmethod
    def concatenated(parts: list["DecodeResult"]) -> "DecodeResult":
        """One result of parts decoded one after the other."""
        return DecodeResult(
            table=pa.concat_tables([p.table for p in parts]),
            dead_letters=[letter for p in parts for letter in p.dead_letters],
            valid_mask=np.concatenate([p.valid_mask for p in parts]),
            absent=summed_counts(p.absent for p in parts),
        )


class Verdicts:
    """The first reason each bad row was refused for. Parsers, the validator and a
    decoder's join fields (connectors.join_events.EventFields) all write to one, so a row
    keeps the reason of the first check it failed."""

    def __init__(self, n: int):
        self.bad = np.zeros(n, dtype=bool)
        self.reasons: dict[int, str] = {}

    def refuse(self, rows: np.ndarray, reason: Callable[[int], str]) -> None:
        """Refuse rows (a boolean mask or indices); reason(i) is built only for new ones."""
        if rows.dtype == bool and not rows.any():  # the usual case: nothing to refuse
            return
        rows = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows)
        for i in rows[~self.bad[rows]]:
            self.reasons[int(i)] = reason(int(i))
        self.bad[rows] = True


@dataclass
class ParsedColumns:
    """Records of one format parsed into columns, not yet validated."""

    columns: dict[str, object]  # field name -> Arrow (chunked) array, or a list of Python values
    num_rows: int
    verdicts: Verdicts  # rows the parser already refused (invalid JSON, a malformed TSV line)
    payload_of: Callable[[int], str]  # row i as text, for its dead letter
