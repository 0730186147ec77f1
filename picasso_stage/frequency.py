"""Decayed access counts for the long tail of a table: a count-min sketch.

The hot-row cache needs to know, for any row, roughly how often it was looked up
lately. Exact counts for every row of a 100M-row table would cost as much memory as a
column of the table itself, so rows outside the cache are counted in a count-min sketch:
`depth` rows of `width` counters, each id hashed to one counter per row, and the estimate
is the smallest of its counters. It never under-counts. Updates are conservative (a
counter only rises as far as the row's new estimate), which keeps the over-count of rare
rows far below the plain sketch's (total count) × e / width: on a Zipf(0.8) stream the
long tail is most of the traffic, and plain updates let tail rows look as hot as the
rows the cache should hold. Counts decay: `decay(factor)` scales every counter, so old traffic
fades and the sketch follows a drifting stream.
"""

from __future__ import annotations

import torch

from picasso import kernels
from picasso.kernels.reference import sketch_cells


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class DecayedSketch:
    def __init__(self, width: int, depth: int = 4, seed: int = 0):
        self.width = _next_power_of_two(max(width, 64))
        self.bits = self.width.bit_length() - 1
        generator = torch.Generator().manual_seed(seed)
        # Odd multipliers for multiply-shift hashing (kernels.reference.sketch_cells).
        self.multipliers = torch.randint(-(1 << 62), 1 << 62, (depth,), generator=generator, dtype=torch.int64) * 2 + 1
        self.counters = torch.zeros(depth * self.width, dtype=torch.float32)

    def add(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Count `counts[i]` more lookups of `rows[i]` (rows unique within one call).

        Returns each row's new estimate: never below its true count, and at most what a
        fresh `estimate` call would say (less when all its counters were also raised by
        another row of this call).
        """
        if not rows.numel():
            return torch.zeros(0, dtype=torch.float32)
        return kernels.sketch_add(self.counters, rows, counts, self.multipliers, self.bits)

    def estimate(self, rows: torch.Tensor) -> torch.Tensor:
        """Decayed count of each row, never below the true one."""
        if not rows.numel():
            return torch.zeros(0, dtype=torch.float32)
        return self.counters[sketch_cells(rows, self.multipliers, self.bits)].amin(dim=0)

    def decay(self, factor: float) -> None:
        self.counters.mul_(factor)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"counters": self.counters.clone(), "multipliers": self.multipliers.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if state["counters"].numel() != self.counters.numel():
            raise ValueError(f"sketch of {state['counters'].numel()} counters, expected {self.counters.numel()}")
        self.counters.copy_(state["counters"])
        self.multipliers.copy_(state["multipliers"])
