"""What `picasso produce` says while it sends: one line per period of producing (10 s
unless --progress-every says otherwise), and a last one when it is done:

    producing into events: 52,000/200,000 events · 5,198 events/s · 28s left
    producing into events: 200,000/200,000 events in 38.5s · 5,195 events/s
"""

from __future__ import annotations

import time
from collections.abc import Callable

from picasso.pipelines.cli.progress import Progress, eta

PERIOD_S = 10.0


class ProduceProgress:
    """An on_progress(records) for produce and replay_events. It only prints when it is
    called, which is after each message sent, and so as often as once per period."""

    def __init__(self, progress: Progress, what: str, total: int, period_s: float = PERIOD_S,
                 clock: Callable[[], float] = time.monotonic):
        if not period_s > 0:
            raise ValueError(f"--progress-every must be a positive number of seconds, got {period_s!r}")
        self.progress, self.what, self.total, self.period_s, self.clock = progress, what, total, period_s, clock
        self.sent = 0
        self.started = self.last_line = clock()

    def __call__(self, records: int) -> None:
        self.sent += records
        now = self.clock()
        if now - self.last_line >= self.period_s:
            self.last_line = now
            elapsed = now - self.started
            self.progress.line(f"{self.what}: {self.sent:,}/{self.total:,} events · {self._rate(elapsed)} · "
                               f"{eta(self.sent, self.total, elapsed)} left")

    def finish(self) -> None:
        elapsed = self.clock() - self.started
        self.progress.line(f"{self.what}: {self.sent:,}/{self.total:,} events in {elapsed:.1f}s · "
                           f"{self._rate(elapsed)}")

    def _rate(self, elapsed: float) -> str:
        return f"{self.sent / elapsed if elapsed > 0 else 0.0:,.0f} events/s"
