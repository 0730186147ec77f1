"""What a parameter server trains at most once: a batch's identity, as ranges per source.

A batch read in order off a source is one range [start, end) of its positions
(PackedBatch.ranges). A joined stream's samples leave the join out of that order: a sample
goes when its label comes or its impression times out, so a batch of samples is a SET of
impressions. Its identity is then several ranges per source: the impressions' offsets,
sorted and compressed into runs (`runs`). The ledger (distributed/applied_ranges.py) takes either
shape: a source names one range or a list of them (`spans_of`).

Namespaces of a joined stream, so that each thing trained has one identity:
- `<topic>/<partition>` of the impressions: an impression's sample (a positive or a
  negative, whichever its label or timeout decided), trained once;
- `<topic>/<partition>#corrections`: its correction (a late positive for an impression
  trained as a negative, join_rules.CORRECTION_COLUMN). Without a namespace of its own it
  would be refused as held: its impression's offset is in the ledger already;
- `<topic>/<partition>#settled` of the labels: a label the join needs no more.

An impression is settled when nothing more can come of it: its record was forgotten at the
join's horizon (its correction's identity is closed then, corrected or not), it was a
duplicate, or its message was a dead letter (both identities closed). A label is settled
when its impression's record is forgotten, or it left as an orphan (a dead letter) or as
an orphan's duplicate. `joined_positions` turns the ledger into where a joined job reads
on: per partition, the end of the settled prefix from offset 0 (a job settles [0, start)
of every partition when it starts reading at `start`). Everything past it is re-read by a
resubmitted job, and what of it was trained is skipped sample by sample.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

Range = tuple[int, int]
# What a push names per source: one range (a batch read in order) or several.
Spans = Range | list[Range]

CORRECTIONS = "#corrections"
SETTLED = "#settled"


def correction_source(source: str) -> str:
    return source + CORRECTIONS


def settled_source(source: str) -> str:
    return source + SETTLED


def spans_of(value) -> list[Range]:
    """The ranges a source names: one (a 2-tuple of ints) or a list of them (JSON gives
    lists of lists)."""
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return [value]
    return [(int(a), int(b)) for a, b in value]


def runs(positions: Iterable[int]) -> list[Range]:
    """Distinct positions as sorted disjoint ranges: [3, 4, 5, 9] -> [(3, 6), (9, 10)]."""
    ordered = np.unique(np.fromiter(positions, dtype=np.int64))
    if not len(ordered):
        return []
    breaks = np.flatnonzero(np.diff(ordered) != 1) + 1
    starts, ends = np.r_[ordered[:1], ordered[breaks]], np.r_[ordered[breaks - 1], ordered[-1:]] + 1
    return list(zip(starts.tolist(), ends.tolist()))


def identity_of(pairs: Iterable[tuple[str, int]]) -> dict[str, list[Range]]:
    """(source, position) pairs as runs per source."""
    by_source: dict[str, list[int]] = {}
    for source, position in pairs:
        by_source.setdefault(source, []).append(position)
    return {source: runs(positions) for source, positions in sorted(by_source.items())}


def held_mask(held: list[Range], positions: np.ndarray) -> np.ndarray:
    """Which positions lie in `held` (ranges, in any order, overlapping or not)."""
    if not held:
        return np.zeros(len(positions), bool)
    merged: list[Range] = []
    for a, b in sorted(held):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    held = merged
    starts = np.array([a for a, _ in held], np.int64)
    ends = np.array([b for _, b in held], np.int64)
    at = np.searchsorted(starts, positions, side="right") - 1
    return (at >= 0) & (positions < ends[np.maximum(at, 0)])


def prefix_end(spans: list[Range]) -> int:
    """Where the range starting at 0 ends (0: none does)."""
    return spans[0][1] if spans and spans[0][0] <= 0 else 0


def joined_positions(ranges: dict[str, list[Range]]) -> dict[str, int]:
    """Per joined partition, the first position not settled (module docstring): for an
    impression partition the first whose sample or correction identity is still open,
    for a label partition the first label the join may still need."""
    positions = {}
    for name, spans in ranges.items():
        if name.endswith(CORRECTIONS):
            source = name[:-len(CORRECTIONS)]
            positions[source] = min(prefix_end(spans), prefix_end(ranges.get(source, [])))
        elif name.endswith(SETTLED):
            positions[name[:-len(SETTLED)]] = prefix_end(spans)
    return positions

