"""The sample join's rules and contract types (the policy itself: sample_join's docstring).

The decisions are pure functions over numpy arrays (decide_labels, timed_out, forgettable,
orphaned, settle_waiting, recalled, unrecalled), so that both hosts of the join take them
from one place: JoinState (join_state.py, for the bounded-cycle stream) and JoinLabels
(Beam's keyed state on a streaming runner, pipelines/transforms/join_labels.py).
join_keys and event_watermark are how either host keys events and moves event time.

Every verdict on a label is a function of event times: of the label's and its
impression's, never of how far the watermark happened to trail when the label came. A
host only has to hold the impression's record when a label needs it, and it does as long
as no event arrives behind the watermark: the watermark passes a record's deadline (its
timeout, its horizon) only after every label whose verdict the deadline could change has
arrived. So the same events, cut into calls (or cycles, or bundles) in any way, and
polled in any order that keeps each partition's, give the same samples, late labels,
duplicates and orphans. Two things are left to arrival order: which of two labels of one
key comes first (keep a key's labels on one partition), and a label more than
orphan_grace before its impression (it joins if the impression comes before the
watermark passes the label's time + orphan_grace, and is an orphan otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from picasso.kernels.hashing import hash_to_buckets, splitmix64_array
from picasso.sample_join.join_policy import JoinPolicy  # the contract, torch-free: its own module

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


def _event_ids(ids, n: int, what: str) -> np.ndarray:
    """An event batch's exact keys as an object array; None: every one unknown (None)."""
    if ids is None:
        return np.full(n, None, dtype=object)
    ids = np.asarray(ids, dtype=object)
    if ids.shape != (n,):
        raise ValueError(f"{len(ids)} ids for {n} {what}")
    return ids


@dataclass
class Impressions:
    """Impression events, in arrival order: a key and an event time per row of `rows`
    (canonical features; its label column is ignored). `source` and `offsets`, where the
    host knows them: where each came from, its samples' identity (picasso.sample_identity).

    `keys` are the join keys' hashes (join_keys), `ids` the keys themselves (join_ids). The
    join finds a record by its hash and takes it only if the ids are equal too: the hash
    is unkeyed, so a key can be chosen to share another's hash. Without ids (None) a key is
    its hash alone, and two keys of one hash are one key."""

    keys: np.ndarray  # uint64
    times: np.ndarray  # int64 ms
    rows: pa.Table
    source: str | None = None
    offsets: np.ndarray | None = None  # int64, one per row
    ids: np.ndarray | None = None  # object: str per row (join_ids), or None

    def __post_init__(self):
        self.keys = np.asarray(self.keys, dtype=np.uint64)
        self.times = np.asarray(self.times, dtype=np.int64)
        if not len(self.keys) == len(self.times) == self.rows.num_rows:
            raise ValueError(f"{len(self.keys)} keys, {len(self.times)} times and {self.rows.num_rows} rows")
        if self.offsets is not None:
            self.offsets = np.asarray(self.offsets, dtype=np.int64)
            if len(self.offsets) != len(self.keys):
                raise ValueError(f"{len(self.offsets)} offsets for {len(self.keys)} impressions")
        self.ids = _event_ids(self.ids, len(self.keys), "impressions")

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class Labels:
    """Label events, in arrival order. `refs` say where each came from (a source and
    position, or anything the host can turn back into a dead letter); only orphans keep
    theirs. `keys` and `ids` as Impressions'."""

    keys: np.ndarray  # uint64
    times: np.ndarray  # int64 ms
    values: np.ndarray  # int8, 0 or 1
    refs: list | None = None
    ids: np.ndarray | None = None  # object: str per label (join_ids), or None

    def __post_init__(self):
        self.keys = np.asarray(self.keys, dtype=np.uint64)
        self.times = np.asarray(self.times, dtype=np.int64)
        self.values = np.asarray(self.values, dtype=np.int8)
        if not len(self.keys) == len(self.times) == len(self.values):
            raise ValueError(f"{len(self.keys)} keys, {len(self.times)} times and {len(self.values)} values")
        if self.refs is not None and len(self.refs) != len(self.keys):
            raise ValueError(f"{len(self.refs)} refs for {len(self.keys)} labels")
        self.ids = _event_ids(self.ids, len(self.keys), "labels")

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
    orphan_labels: int = 0  # dead-lettered: no impression within the grace, or beyond its horizon
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
    # The time of its impression, when that came but was forgotten at the horizon (or the
    # label was beyond it); None when no impression is known (see recalled).
    forgotten_impression_ms: int | None = None


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
    explicit_negative: np.ndarray  # value 0 within W: a negative, now
    beyond: np.ndarray  # value 1, more than W after the impression: late once it times out
    late: np.ndarray  # value 1 for an impression emitted as a negative
    beyond_horizon: np.ndarray  # past keep_ms: as if the impression were forgotten (it waits, an orphan)
    duplicate: np.ndarray  # anything else: the impression was decided by an earlier label


def decide_labels(states: np.ndarray, delays: np.ndarray, values: np.ndarray, policy: JoinPolicy) -> LabelDecision:
    """The policy's verdict on labels whose impressions are known: `states` are those
    records' states, `delays` label time - impression time. Both hosts take their
    decisions here.

    Two verdicts are made by event time where the record's state would depend on when the
    watermark passed a deadline. A label beyond the horizon never joins, though the record
    may not be forgotten yet: whether it is depends on how far the watermark trails the
    label. A label of value 0 more than W after its impression decides nothing (a
    duplicate): it says what the timeout says, and before the timeout it would otherwise
    be an explicit negative, after it a duplicate."""
    gone = beyond_horizon(delays, policy)
    fresh = (states == PENDING) & ~gone
    clicked = values == 1
    in_window = delays <= policy.wait_ms
    late = (states == NEGATIVE) & clicked & ~gone
    return LabelDecision(positive=fresh & clicked & in_window, explicit_negative=fresh & ~clicked & in_window,
                         beyond=fresh & clicked & ~in_window, late=late, beyond_horizon=gone,
                         duplicate=~(fresh & (clicked | in_window) | late | gone))


def timed_out(times: np.ndarray, watermark: int, policy: JoinPolicy) -> np.ndarray:
    """Which waiting impressions of these times the watermark decides as negatives."""
    return times + policy.wait_ms < watermark


def forgettable(times: np.ndarray, watermark: int, policy: JoinPolicy) -> np.ndarray:
    """Which decided impressions of these times are past their horizon."""
    return times + policy.keep_ms < watermark


def orphaned(label_times: np.ndarray, watermark: int, policy: JoinPolicy) -> np.ndarray:
    """Which labels waiting for their impression have waited long enough."""
    return label_times + policy.orphan_grace_ms < watermark


def settle_waiting(times: np.ndarray, watermark: int, policy: JoinPolicy) -> tuple[np.ndarray, np.ndarray]:
    """One key's labels waiting for its impression (their times, in arrival order) as the
    watermark passes: (orphans, duplicates), masks; the rest go on waiting.

    The first one still waiting is an orphan once its grace is over, and the labels after
    it within its grace are its duplicates; then the next one left is judged the same way.
    Every label waits, not only the first of its key: a later one is a duplicate only if
    the impression would make it one, and that is known only when the impression comes
    (a label beyond its horizon is not a duplicate of an earlier one that joined)."""
    orphans, duplicates = np.zeros(len(times), bool), np.zeros(len(times), bool)
    left = np.ones(len(times), bool)
    while left.any():
        head = int(np.flatnonzero(left)[0])
        if not orphaned(times[head:head + 1], watermark, policy)[0]:
            break
        orphans[head], left[head] = True, False
        echoes = left & (times <= times[head] + policy.orphan_grace_ms)
        duplicates |= echoes
        left &= ~echoes
    return orphans, duplicates


def beyond_horizon(delays: np.ndarray, policy: JoinPolicy) -> np.ndarray:
    """Which labels, of these delays after their impressions, come too late to join them."""
    return delays > policy.keep_ms


def recalled(delays: np.ndarray, policy: JoinPolicy) -> np.ndarray:
    """Which orphan labels, of these delays after an impression of their key that came,
    are told that it was forgotten. A label notes its key's impression when it begins to
    wait: the held one, or a forgotten one whose key is kept (until unrecalled). For these
    delays the key is still kept then, however far the watermark trails (unless the label
    itself comes behind the watermark); past them a host may or may not still have it, so
    they are not told, and every host says the same."""
    return delays <= policy.recall_ms


def unrecalled(times: np.ndarray, watermark: int, policy: JoinPolicy) -> np.ndarray:
    """Which forgotten impressions of these times no orphan label can be told about any
    more: a label recalled for them has been dead-lettered by now."""
    return times + policy.recall_ms + policy.orphan_grace_ms < watermark


def join_keys(columns: Sequence[pa.Array | np.ndarray]) -> np.ndarray:
    """One uint64 key per row from the join-key columns (strings or integers).

    Strings hash with picasso.kernels.hashing's word-wise splitmix64 (hash_bytes: the UTF-8 bytes
    as 64-bit words, each mixed in with splitmix64; kept to 62 bits), integers as
    themselves, then each column is mixed in with splitmix64, so ("a", 1) and (1, "a")
    differ. Two random text keys collide with probability about 2^-62 per pair (about 1e-7
    for any collision among a million pending impressions), but the hash is unkeyed: keys
    can be chosen to collide ('aaaaaaaabbbbbbbb' and 'WnSYpkMCpr|VGy6A' do). So the join
    uses the hash to find a record and join_ids to confirm it."""
    key = np.zeros(len(columns[0]) if len(columns) else 0, dtype=np.uint64)
    for i, column in enumerate(columns):
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        values = column if isinstance(column, np.ndarray) else None
        if values is None and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                               or pa.types.is_binary(column.type)):
            values = hash_to_buckets(column, 1 << 62).astype(np.uint64)  # the text's hash_bytes
        elif values is None:
            values = column.to_numpy(zero_copy_only=False)
        values = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
        with np.errstate(over="ignore"):
            key = splitmix64_array(key ^ splitmix64_array(values + np.uint64(i + 1)))
    return key


def join_ids(columns: Sequence[pa.Array | np.ndarray]) -> np.ndarray:
    """The join key of each row itself, as text (an object array of str), for the join to
    confirm what join_keys' hashes find. One column: its value as text. Several: each
    value's length, ':' and the value, joined by ':', so that no two tuples of values give
    one text ("1:a:2:bc" is ("a", "bc"))."""
    texts = [_key_text(i, column) for i, column in enumerate(columns)]
    if not texts:
        raise ValueError("a join key needs at least one column")
    if len(texts) == 1:
        joined = texts[0]
    else:
        parts = [part for text in texts for part in (pc.cast(pc.utf8_length(text), pa.string()), text)]
        joined = pc.binary_join_element_wise(*parts, ":")
    return joined.to_numpy(zero_copy_only=False).astype(object, copy=False)


def _key_text(i: int, column: pa.Array | pa.ChunkedArray | np.ndarray) -> pa.Array:
    if isinstance(column, np.ndarray):
        column = pa.array(column)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
            or pa.types.is_integer(column.type)):
        raise ValueError(f"join key column {i} must hold strings or integers, got {column.type}")
    if column.null_count:
        raise ValueError(f"join key column {i} has {column.null_count} missing values")
    return pc.cast(column, pa.string())


def event_watermark(newest_ms: dict[str, int], allowed_lateness_ms: int) -> int | None:
    """The event-time watermark: the oldest of the partitions' newest event times, less the
    allowed lateness; None before any partition has an event."""
    return min(newest_ms.values()) - allowed_lateness_ms if newest_ms else None
