"""Which source ranges a parameter-server shard has trained: what makes pushes idempotent.

Runners retry bundles, restart workers and replay a source from a checkpoint's positions,
so the same samples can be pushed twice. Every push carries, per source, the range
[start, end) of the batch it came from (PackedBatch.ranges), or several ranges where the
batch is a set of positions (a joined stream's samples: picasso.sample_identity), and a
shard trains a range at most once: a push whose ranges are all in the ledger is
acknowledged and not trained; one that overlaps the ledger only in part is refused whole
(its gradient cannot be split), which a deterministic re-read never produces: a source
re-read from the ledger's positions cuts the same batches. A batch that may overlap (a
joined job's re-read samples) asks first which of its identities are held (`held`) and
leaves those rows out before its gradient is computed.

The ledger holds, per source, sorted disjoint half-open ranges, merged where they touch,
so a source read in order is one range however many batches it had. A shard claims a
range when it accepts the push into its global batch, or when a batch with nothing to
train (its every message refused) is passed over (gba.TokenControl.pass_over), and gives
it back if the batch leaves unapplied (its worker was dropped): `applied()` is what a
checkpoint stores, the ranges in the model. A checkpoint restored restores the ledger
with the weights.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from picasso.sample_identity import Range, Spans, spans_of


@dataclass
class AppliedRanges:
    ranges: dict[str, list[Range]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, list[list[int]]] | None) -> "AppliedRanges":
        ledger = cls()
        for source, spans in (data or {}).items():
            for start, end in spans:
                ledger.add(source, start, end)
        return ledger

    @classmethod
    def from_checkpoint(cls, applied: dict[str, list[list[int]]] | None, positions: dict[str, int]) -> "AppliedRanges":
        """A checkpoint's ledger. A source it has positions for but no ranges (a checkpoint
        of local or sync training, which keep no ledger) counts as trained up to its
        position: a resumed job reads it on from there, and nothing before it is new."""
        ledger = cls.from_json(applied)
        for source, position in positions.items():
            if source not in ledger.ranges:
                ledger.add(source, 0, position)
        return ledger

    def to_json(self) -> dict[str, list[list[int]]]:
        return {source: [[a, b] for a, b in spans] for source, spans in sorted(self.ranges.items()) if spans}

    def copy(self) -> "AppliedRanges":
        return AppliedRanges({source: list(spans) for source, spans in self.ranges.items()})

    def covered(self, source: str, start: int, end: int) -> int:
        """How many positions of [start, end) the ledger holds."""
        spans = self.ranges.get(source, [])
        at = max(bisect.bisect_right(spans, (start, start)) - 1, 0)
        total = 0
        for a, b in spans[at:]:
            if a >= end:
                break
            total += max(0, min(b, end) - max(a, start))
        return total

    def verdict(self, ranges: dict[str, Spans]) -> str:
        """"new" (none of it held), "held" (all of it) or "partly" held. A source names one
        range or several (disjoint)."""
        spans = [(source, span) for source, value in ranges.items() for span in spans_of(value)]
        held = sum(self.covered(source, a, b) for source, (a, b) in spans)
        size = sum(b - a for _, (a, b) in spans)
        return "new" if held == 0 else "held" if held == size else "partly"

    def held(self, ranges: dict[str, Spans]) -> dict[str, list[Range]]:
        """The parts of `ranges` the ledger holds, per source (sources with none left out)."""
        found = {}
        for source, value in ranges.items():
            parts = [(max(a, x), min(b, y)) for x, y in spans_of(value) for a, b in self.ranges.get(source, [])
                     if max(a, x) < min(b, y)]
            if parts:
                found[source] = sorted(parts)
        return found

    def missing(self, ranges: dict[str, Spans]) -> dict[str, list[Range]]:
        """The parts of `ranges` the ledger does not hold, per source (sources with none
        left out)."""
        left = AppliedRanges()
        left.add_all(ranges)
        left.remove_all(self.held(ranges))
        return {source: spans for source, spans in left.ranges.items() if spans}

    def add(self, source: str, start: int, end: int) -> None:
        if not start < end:
            return
        spans = self.ranges.setdefault(source, [])
        kept = [(a, b) for a, b in spans if b < start or a > end]
        touching = [(a, b) for a, b in spans if not (b < start or a > end)]
        merged = (min([start, *(a for a, _ in touching)]), max([end, *(b for _, b in touching)]))
        bisect.insort(kept, merged)
        self.ranges[source] = kept

    def remove(self, source: str, start: int, end: int) -> None:
        spans = self.ranges.get(source, [])
        left: list[Range] = []
        for a, b in spans:
            if b <= start or a >= end:
                left.append((a, b))
                continue
            if a < start:
                left.append((a, start))
            if b > end:
                left.append((end, b))
        self.ranges[source] = left

    def add_all(self, ranges: dict[str, Spans]) -> None:
        for source, value in ranges.items():
            for a, b in spans_of(value):
                self.add(source, a, b)

    def remove_all(self, ranges: dict[str, Spans]) -> None:
        for source, value in ranges.items():
            for a, b in spans_of(value):
                self.remove(source, a, b)
