"""EventStreamConfig: how the planted rows become timed impression and click events
(events.py, which re-exports it). Plain settings, checked when made, numpy- and torch-free:
the command line offers DELAY_DISTRIBUTIONS without loading the generator."""

from __future__ import annotations

import math
from dataclasses import dataclass

DELAY_DISTRIBUTIONS = ("exponential", "fixed", "uniform")


@dataclass(frozen=True)
class EventStreamConfig:
    """How the planted rows become timed events."""

    start_ms: int = 0  # event time of the stream's start, epoch milliseconds
    impressions_per_s: float = 100.0  # of event time
    # exponential: memoryless, most clicks soon and a long tail (the realistic one);
    # fixed: every click exactly the mean after its impression; uniform: 0 to twice the mean.
    label_delay: str = "exponential"
    label_delay_mean_ms: int = 5 * 60_000
    duplicate_fraction: float = 0.02  # of clicks, sent twice

    def __post_init__(self):
        problems = []
        if not isinstance(self.start_ms, int) or self.start_ms < 0:
            problems.append(f"start_ms must be whole epoch milliseconds >= 0, got {self.start_ms!r}")
        if not self.impressions_per_s > 0 or not math.isfinite(self.impressions_per_s):
            problems.append(f"the impression rate must be a positive number per second, got {self.impressions_per_s!r}")
        if self.label_delay not in DELAY_DISTRIBUTIONS:
            problems.append(f"label_delay must be one of {', '.join(DELAY_DISTRIBUTIONS)}, got {self.label_delay!r}")
        if not isinstance(self.label_delay_mean_ms, int) or self.label_delay_mean_ms <= 0:
            problems.append(f"the mean label delay must be a positive whole number of ms, "
                            f"got {self.label_delay_mean_ms!r}")
        if not 0 <= self.duplicate_fraction <= 1:
            problems.append(f"the duplicate fraction must lie in [0, 1], got {self.duplicate_fraction!r}")
        if problems:
            raise ValueError("; ".join(problems))
