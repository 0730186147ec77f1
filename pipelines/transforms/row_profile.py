"""What the valid rows of a decode held, for the run-health gate (pipelines/runs/run_health.py):
how many, how many are clicks (a label in [0, 1] counts as one from 0.5), and per field of
the spec how many rows lack it (null or missing).

A daily run combines the profiles of its chunks in the pipeline, where its gate stands
before the publish; a stream's cycle reads its profile back from the decode's Beam
counters (counters, of_counters), which every decode increments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

PROFILE_ROWS, PROFILE_POSITIVES, ABSENT_PREFIX = "profile_rows", "profile_positives", "absent/"


@dataclass(frozen=True)
class RowProfile:
    """What the valid rows of a partition (or a stream's cycle) held, counted as they are
    decoded: their number, how many are clicks, and per field of the spec how many lack it."""

    rows: int = 0
    positives: int = 0
    absent: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of_table(cls, table: pa.Table, absent: dict[str, int]) -> "RowProfile":
        """The profile of a decoded chunk (canonical table) and its decode's absent counts."""
        labels = table.column("label").to_numpy() if table.num_rows else np.zeros(0, dtype=np.float32)
        return cls(table.num_rows, int(np.count_nonzero(labels >= 0.5)), dict(absent))

    @classmethod
    def of_counters(cls, counters: dict[str, int]) -> "RowProfile":
        return cls(counters.get(PROFILE_ROWS, 0), counters.get(PROFILE_POSITIVES, 0),
                   {name[len(ABSENT_PREFIX):]: n for name, n in counters.items() if name.startswith(ABSENT_PREFIX)})

    def counters(self) -> dict[str, int]:
        """As Beam counter increments (see of_counters)."""
        return {PROFILE_ROWS: self.rows, PROFILE_POSITIVES: self.positives,
                **{ABSENT_PREFIX + name: n for name, n in self.absent.items() if n}}

    @staticmethod
    def merged(profiles) -> "RowProfile":
        """The profile of many chunks (a CombineGlobally's function: order does not matter)."""
        total = RowProfile()
        for profile in profiles:
            total = total.merge(profile)
        return total

    def merge(self, other: "RowProfile") -> "RowProfile":
        absent = dict(self.absent)
        for name, n in other.absent.items():
            absent[name] = absent.get(name, 0) + n
        return RowProfile(self.rows + other.rows, self.positives + other.positives, absent)
