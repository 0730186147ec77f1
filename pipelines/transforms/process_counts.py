"""The decode's counts, kept in this process as well as in Beam's counters: what a running
endless job's /metrics reads (run_metrics.EndlessJobMetrics).

Beam's counters reach a pipeline's result only when the pipeline ends, and an endless job
never ends while it is watched. On this machine's runners (the FnApiRunner, in memory) the
job's workers are threads of the process that runs it, so a process-wide tally of the same
counts is what the job's metrics read while it runs. On a runner whose workers are
elsewhere (Flink, Dataflow) the runner's own monitoring shows Beam's counters (namespace
"picasso"), and this tally stays empty.
"""

from __future__ import annotations

import threading
from collections import Counter

DEAD_LETTER_KIND_COUNTER = "dead_letters."  # + a reason's kind: the refused records of that kind


def dead_letter_kinds(counts: dict[str, int]) -> dict[str, int]:
    """The refused records by their reason's kind, out of the decode's counts (Beam's or
    this tally's): the kinds with any."""
    return {name.removeprefix(DEAD_LETTER_KIND_COUNTER): n for name, n in counts.items()
            if name.startswith(DEAD_LETTER_KIND_COUNTER) and n}


class ProcessCounts:
    """Named counts, added to from any thread. Readers take a snapshot and subtract the one
    they started from (several runs in one process, as in tests, share the tally)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, name: str, n: int) -> None:
        with self._lock:
            self._counts[name] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


PROCESS_COUNTS = ProcessCounts()
