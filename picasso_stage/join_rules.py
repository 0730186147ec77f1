"""The sample join's rules and contract types (the policy itself: sample_join's docstring).

The decisions are pure functions over numpy arrays (decide_labels, timed_out, forgettable,
orphaned), so that both hosts of the join take them from one place: JoinState
(sample_join.py, for the bounded-cycle stream) and JoinLabels (Beam's keyed state on a
streaming runner, pipelines/transforms/join_labels.py). join_keys and event_watermark are
how either host keys events and moves event time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import pyarrow as pa

from picasso.hashing import hash_to_buckets, splitmix64_array

LATE_LABEL_POLICIES = ("drop", "correct")
CORRECTION_COLUMN = "join_correction"  # int8: 1 on the extra positive `correct` emits
DELAY_COLUMN = "label_delay_ms"  # int64: label time - impression time; -1 without a label
KEY_COLUMN = "join_key"  # uint64: the impression's key (join_keys), to tell samples apart

# The state of an impression's record (the `states` array).
PENDING = 0  # waiting for its label
PENDING_LATE = 1  # waiting, and its first label was beyond W: a negative now, late later
POSITIVE = 2  # emitted as a positive
NEGATIVE = 3  # emitted as a negative: a label with value 1 is late
SETTLED = 4  # a late label came (dropped or corrected): every further label is a duplicate
FORGOTTEN = 5  # past its horizon; its slot awaits compaction


@dataclass(frozen=True)
class JoinPolicy:
    wait_ms: int  # W
    late_labels: str = "drop"  # or "correct"
    horizon_ms: int | None = None  # remembered past W for late labels; None: W again
    orphan_grace_ms: int = 60_000  # how long a label waits for its impression, past its time

    def __post_init__(self):
        problems = []
        if not isinstance(self.wait_ms, int) or self.wait_ms < 0:
            problems.append(f"the label wait must be a whole number of ms >= 0, got {self.wait_ms!r}")
        if self.late_labels not in LATE_LABEL_POLICIES:
            problems.append(f"late labels must be one of {', '.join(LATE_LABEL_POLICIES)}, got {self.late_labels!r}")
        if self.horizon_ms is not None and (not isinstance(self.horizon_ms, int) or self.horizon_ms < 0):
            problems.append(f"the late-label horizon must be a whole number of ms >= 0, got {self.horizon_ms!r}")
        if not isinstance(self.orphan_grace_ms, int) or self.orphan_grace_ms < 0:
            problems.append(f"the orphan grace must be a whole number of ms >= 0, got {self.orphan_grace_ms!r}")
        if problems:
            raise ValueError("invalid join policy: " + "; ".join(problems))

    @property
    def keep_ms(self) -> int:
        """How long past its time an impression is remembered."""
        return self.wait_ms + (self.wait_ms if self.horizon_ms is None else self.horizon_ms)


@dataclass
class Impressions:
    """Impression events, in arrival order: a key and an event time per row of `rows`
    (canonical features; its label column is ignored)."""

    keys: np.ndarray  # uint64
    times: np.ndarray  # int64 ms
    rows: pa.Table

    def __post_init__(self):
        self.keys = np.asarray(self.keys, dtype=np.uint64)
        self.times = np.asarray(self.times, dtype=np.int64)
        if not len(self.keys) == len(self.times) == self.rows.num_rows:
            raise ValueError(f"{len(self.keys)} keys, {len(self.times)} times and {self.rows.num_rows} rows")

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class Labels:
    """Label events, in arrival order. `refs` say where each came from (a source and
    position, or anything the host can turn back into a dead letter); only orphans keep
    theirs."""

    keys: np.ndarray  # uint64
    times: np.ndarray  # int64 ms
    values: np.ndarray  # int8, 0 or 1
    refs: list | None = None

    def __post_init__(self):
        self.keys = np.asarray(self.keys, dtype=np.uint64)
        self.times = np.asarray(self.times, dtype=np.int64)
        self.values = np.asarray(self.values, dtype=np.int8)
        if not len(self.keys) == len(self.times) == len(self.values):
            raise ValueError(f"{len(self.keys)} keys, {len(self.times)} times and {len(self.values)} values")
        if self.refs is not None and len(self.refs) != len(self.keys):
            raise ValueError(f"{len(self.refs)} refs for {len(self.keys)} labels")

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class JoinCounts:
    impressions: int = 0  # distinct impressions taken in
    duplicate_impressions: int = 0
    labels: int = 0  # label events taken in, duplicates included
    duplicate_labels: int = 0
    positives: int = 0  # samples emitted as positives (corrections not included)
    negatives: int = 0
    explicit_negatives: int = 0  # of the negatives: decided by a label with value 0
    late_labels: int = 0
    corrections: int = 0  # extra positives `correct` emitted
    orphan_labels: int = 0  # dead-lettered: no impression within the grace
    forgotten: int = 0  # impressions past their horizon

    def add(self, other: "JoinCounts") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass(frozen=True)
class OrphanLabel:
    key: int
    time_ms: int
    value: int
    ref: object


@dataclass
class JoinOutput:
    samples: pa.Table  # canonical rows with their label, plus CORRECTION_COLUMN, DELAY_COLUMN and KEY_COLUMN
    orphans: list[OrphanLabel] = field(default_factory=list)
    counts: JoinCounts = field(default_factory=JoinCounts)
    delays_ms: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # of the labels matched


@dataclass(frozen=True)
class LabelDecision:
    """What one label does to the record of its impression (masks over the labels)."""

    positive: np.ndarray  # within W: a positive, now
    explicit_negative: np.ndarray  # value 0: a negative, now
    beyond: np.ndarray  # value 1, more than W after the impression: late once it times out
    late: np.ndarray  # value 1 for an impression emitted as a negative
    duplicate: np.ndarray  # anything else: the impression was decided by an earlier label


def decide_labels(states: np.ndarray, delays: np.ndarray, values: np.ndarray, policy: JoinPolicy) -> LabelDecision:
    """The policy's verdict on labels whose impressions are known: `states` are those
    records' states, `delays` label time - impression time. Both hosts take their
    decisions here."""
    fresh = states == PENDING
    clicked = values == 1
    in_window = delays <= policy.wait_ms
    late = (states == NEGATIVE) & clicked
    return LabelDecision(positive=fresh & clicked & in_window, explicit_negative=fresh & ~clicked,
                         beyond=fresh & clicked & ~in_window, late=late, duplicate=~(fresh | late))


def timed_out(times: np.ndarray, watermark: int, policy: JoinPolicy) -> np.ndarray:
    """Which waiting impressions of these times the watermark decides as negatives."""
    return times + policy.wait_ms < watermark


def forgettable(times: np.ndarray, watermark: int, policy: JoinPolicy) -> np.ndarray:
    """Which decided impressions of these times are past their horizon."""
    return times + policy.keep_ms < watermark


def orphaned(label_times: np.ndarray, watermark: int, policy: JoinPolicy) -> np.ndarray:
    """Which labels waiting for their impression have waited long enough."""
    return label_times + policy.orphan_grace_ms < watermark


def join_keys(columns: Sequence[pa.Array | np.ndarray]) -> np.ndarray:
    """One uint64 key per row from the join-key columns (strings or integers).

    Strings hash with picasso.hashing's FNV-1a (kept to 62 bits), integers as themselves,
    then each column is mixed in with splitmix64, so ("a", 1) and (1, "a") differ. Two
    distinct text keys collide with probability about 2^-62 per pair: about 1e-7 for any
    collision among a million pending impressions."""
    key = np.zeros(len(columns[0]) if len(columns) else 0, dtype=np.uint64)
    for i, column in enumerate(columns):
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        values = column if isinstance(column, np.ndarray) else None
        if values is None and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                               or pa.types.is_binary(column.type)):
            values = hash_to_buckets(column, 1 << 62).astype(np.uint64)  # the FNV hash of the text
        elif values is None:
            values = column.to_numpy(zero_copy_only=False)
        values = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
        with np.errstate(over="ignore"):
            key = splitmix64_array(key ^ splitmix64_array(values + np.uint64(i + 1)))
    return key


def event_watermark(newest_ms: dict[str, int], allowed_lateness_ms: int) -> int | None:
    """The event-time watermark: the oldest of the partitions' newest event times, less the
    allowed lateness; None before any partition has an event."""
    return min(newest_ms.values()) - allowed_lateness_ms if newest_ms else None
