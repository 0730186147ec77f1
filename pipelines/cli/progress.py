"""What a long command is doing, as it goes: one line per unit of work (a partition, a
stream cycle, ten seconds of `produce`).

Each line is printed as plain text and flushed at once, so that a log file (stderr
redirected, as under cron or a scheduler) shows where a run is while it runs. On a
terminal, rich's live status (a spinner that redraws in place) also shows the newest line
under the printed ones; off a terminal it is left out, since its redraws would only write
escape codes into the file.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the console is the caller's: `picasso produce`'s flags (PERIOD_S) need no rich
    from rich.console import Console


def eta(done: int, total: int, seconds: float) -> str:
    """Time left, from the pace so far: '42s', '3m05s', '1h02m', or '-' before any unit is done."""
    if done <= 0 or total <= done:
        return "-" if done <= 0 else "0s"
    left = seconds / done * (total - done)
    if left < 60:
        return f"{left:.0f}s"
    if left < 3600:
        return f"{int(left // 60)}m{int(left % 60):02d}s"
    return f"{int(left // 3600)}h{int(left % 3600 // 60):02d}m"


def number(value: float | None, digits: int = 4) -> str:
    """A metric for a progress line: '-' when there is none (nothing evaluated, NaN)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


class Progress(AbstractContextManager):
    """`with Progress(console, "daily 2026-11-01..2026-11-30") as progress: progress.line(...)`."""

    def __init__(self, console: Console, title: str):
        self.console = console
        self.title = title
        self.live = console.is_terminal
        self._status = None

    def __enter__(self):
        if self.live:
            self._status = self.console.status(self.title)
            self._status.__enter__()
        return self

    def line(self, text: str) -> None:
        """One unit of work done: a plain line, and the live status on a terminal."""
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        self.console.file.flush()
        if self._status is not None:
            self._status.update(f"{self.title}: {text}")

    def __exit__(self, *exc):
        if self._status is not None:
            self._status.__exit__(*exc)
            self._status = None
        return False
