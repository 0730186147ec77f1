"""Which rows of one packed table live in the fast tier, and which should.

The directory maps rows to fast-tier slots (`slot_of_row`, -1 for rows that are not
cached) and decides what to admit and evict. Counts decay with a half-life in steps:
- cached rows have exact counts, kept per slot; a row's count moves with it;
- every other row is counted in a DecayedSketch;
- a miss whose estimate beats the coldest cached row becomes a candidate.

Every `refresh_every` steps, `plan_refresh` admits the candidates that beat the coldest
cached rows (into free slots first), evicting those in one batch, and returns the moves
for the storage to carry out (write the evicted rows back, load the admitted ones). From
a cold start the interval doubles from one step up to `refresh_every`: an empty cache is
filled at once with what came first, and the counts that correct it sharpen quickly. The
directory never touches embedding values: which rows are cached changes how fast
training is, never what it computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from picasso.frequency import DecayedSketch


@dataclass(frozen=True)
class RefreshPlan:
    evict_rows: torch.Tensor  # rows leaving the fast tier (their slots are in admit_slots' first len(evict_rows))
    evict_slots: torch.Tensor
    admit_rows: torch.Tensor  # rows entering, slot by slot
    admit_slots: torch.Tensor


class HotRowDirectory:
    def __init__(self, num_rows: int, capacity: int, refresh_every: int = 100, half_life: float = 2000.0,
                 sketch_width: int | None = None, sketch_depth: int = 4, seed: int = 0):
        if capacity < 1:
            raise ValueError(f"a cache needs at least one row of capacity, got {capacity}")
        self.num_rows = num_rows
        self.capacity = capacity
        self.refresh_every = max(1, refresh_every)
        self.decay_per_step = 0.5 ** (1.0 / half_life)
        self.slot_of_row = torch.full((num_rows,), -1, dtype=torch.int32)
        self.row_of_slot = torch.full((capacity,), -1, dtype=torch.int64)
        self.counts = torch.zeros(capacity, dtype=torch.float32)  # exact decayed counts, per slot
        # A width of 8x the capacity keeps the sketch's over-count small next to the
        # counts of rows near the admission line (which carry ~1/capacity of the traffic).
        self.sketch = DecayedSketch(sketch_width or 8 * capacity, sketch_depth, seed)
        self.threshold = 0.0  # count of the coldest cached row (0 while slots are free)
        self._candidates: list[torch.Tensor] = []
        self.steps_since_refresh = 0
        self.refreshes = 0
        self.pending_decay = 1.0  # decay not yet applied to the counts (see plan_refresh)
        self.free_slots = capacity

    # -- per step ---------------------------------------------------------------------

    def observe(self, miss_rows: torch.Tensor, miss_counts: torch.Tensor, hit_slots: torch.Tensor,
                hit_counts: torch.Tensor) -> None:
        """Count one step's lookups: of the rows not cached (unique), and of the hot slots (unique)."""
        self.counts.index_add_(0, hit_slots, hit_counts.to(torch.float32))
        estimates = self.sketch.add(miss_rows, miss_counts)
        self._candidates.append(miss_rows if self.free_slots else miss_rows[estimates > self.threshold])
        self.steps_since_refresh += 1

    @property
    def refresh_due(self) -> bool:
        pending = any(c.numel() for c in self._candidates)
        interval = min(self.refresh_every, 1 << min(self.refreshes, 30))
        return pending and self.steps_since_refresh >= interval

    # -- refresh ----------------------------------------------------------------------

    def plan_refresh(self) -> RefreshPlan:
        """Decide the moves and update the mapping; the caller must carry the moves out."""
        # Counts are only compared with each other, so a decay can wait until it matters:
        # scaling a sketch of millions of counters at every refresh would cost more than
        # the refresh. New lookups then weigh at most 2x too little against old ones.
        self.pending_decay *= self.decay_per_step ** self.steps_since_refresh
        if self.pending_decay < 0.5:
            self.counts.mul_(self.pending_decay)
            self.sketch.decay(self.pending_decay)
            self.threshold *= self.pending_decay
            self.pending_decay = 1.0
        self.steps_since_refresh = 0
        self.refreshes += 1
        candidates = torch.unique(torch.cat(self._candidates)) if self._candidates else torch.zeros(0, dtype=torch.int64)
        self._candidates = []
        candidates = candidates[self.slot_of_row[candidates] < 0]
        estimates = self.sketch.estimate(candidates)
        order = torch.argsort(estimates, descending=True, stable=True)
        candidates, estimates = candidates[order], estimates[order]

        free = torch.nonzero(self.row_of_slot < 0).flatten()
        filled = min(free.numel(), candidates.numel())
        admit_rows, admit_counts, admit_slots = candidates[:filled], estimates[:filled], free[:filled]
        candidates, estimates = candidates[filled:], estimates[filled:]

        evict_slots = torch.zeros(0, dtype=torch.int64)
        if candidates.numel() and free.numel() == filled:
            # Pair the best remaining candidates with the coldest cached rows; swap each
            # pair where the candidate is hotter. Both lists are sorted, so the swaps are
            # a prefix.
            taken = torch.zeros(self.capacity, dtype=torch.bool)
            taken[admit_slots] = True
            cached_counts = self.counts.masked_fill(taken, float("inf"))
            coldest = torch.argsort(cached_counts, stable=True)[: candidates.numel()]
            swaps = int((estimates[: coldest.numel()] > cached_counts[coldest]).sum())
            evict_slots = coldest[:swaps]
            admit_rows = torch.cat([admit_rows, candidates[:swaps]])
            admit_counts = torch.cat([admit_counts, estimates[:swaps]])
            admit_slots = torch.cat([admit_slots, evict_slots])

        evict_rows = self.row_of_slot[evict_slots]
        self.slot_of_row[evict_rows] = -1
        self.slot_of_row[admit_rows] = admit_slots.to(torch.int32)
        self.row_of_slot[admit_slots] = admit_rows
        self.counts[admit_slots] = admit_counts
        self.free_slots = int((self.row_of_slot < 0).sum())
        self.threshold = 0.0 if self.free_slots else float(self.counts.min())
        return RefreshPlan(evict_rows=evict_rows, evict_slots=evict_slots, admit_rows=admit_rows,
                           admit_slots=admit_slots)

    # -- checkpoints ------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "row_of_slot": self.row_of_slot.clone(),
            "counts": self.counts.clone(),
            "sketch": self.sketch.state_dict(),
            "steps_since_refresh": self.steps_since_refresh,
            "refreshes": self.refreshes,
            "pending_decay": self.pending_decay,
            # Decayed since the last refresh: recomputing it from the counts on restore
            # would let other candidates in, and refresh at other steps than a run that
            # never stopped.
            "threshold": self.threshold,
            "candidates": torch.cat(self._candidates) if self._candidates else torch.zeros(0, dtype=torch.int64),
        }

    def load_state_dict(self, state: dict) -> None:
        row_of_slot = state["row_of_slot"]
        if row_of_slot.numel() != self.capacity:
            raise ValueError(f"cache state holds {row_of_slot.numel()} slots, this cache has {self.capacity}")
        self.row_of_slot.copy_(row_of_slot)
        self.counts.copy_(state["counts"])
        self.sketch.load_state_dict(state["sketch"])
        self.steps_since_refresh = int(state["steps_since_refresh"])
        self.refreshes = int(state["refreshes"])
        self.pending_decay = float(state["pending_decay"])
        self._candidates = [state["candidates"]] if state["candidates"].numel() else []
        self.slot_of_row.fill_(-1)
        cached = self.row_of_slot >= 0
        self.slot_of_row[self.row_of_slot[cached]] = torch.nonzero(cached).flatten().to(torch.int32)
        self.free_slots = int((~cached).sum())
        if "threshold" in state:
            self.threshold = float(state["threshold"])
        else:  # a checkpoint written before the threshold was saved
            self.threshold = 0.0 if self.free_slots else float(self.counts.min())
