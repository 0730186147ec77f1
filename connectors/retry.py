"""Retrying a call to an outside system with exponential backoff."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5  # calls in all, the first one included
    first_backoff_s: float = 1.0  # doubles after each failure, up to max_backoff_s
    max_backoff_s: float = 30.0

    def __post_init__(self):
        if self.attempts < 1:
            raise ValueError(f"retry attempts must be at least 1, got {self.attempts}")
        if self.first_backoff_s < 0 or self.max_backoff_s < self.first_backoff_s:
            raise ValueError(f"retry backoff must satisfy 0 <= first ({self.first_backoff_s}) <= max "
                             f"({self.max_backoff_s})")

    def delays(self):
        backoff = Backoff(self.first_backoff_s, self.max_backoff_s)
        for _ in range(self.attempts - 1):
            yield backoff.next_delay()


class Backoff:
    """Delays that start at first_s and double up to max_s, for as long as they are asked
    for; reset() starts them over (after a success)."""

    def __init__(self, first_s: float, max_s: float):
        self.first_s, self.max_s = first_s, max_s
        self.delay_s = first_s

    def next_delay(self) -> float:
        delay = self.delay_s
        self.delay_s = min(self.max_s, self.delay_s * 2)
        return delay

    def wait(self, sleep: Callable[[float], None] = time.sleep) -> float:
        delay = self.next_delay()
        sleep(delay)
        return delay

    def reset(self) -> None:
        self.delay_s = self.first_s


def with_retries(call: Callable[[], T], policy: RetryPolicy, what: str,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """call() until it returns; after policy.attempts failures the last error propagates."""
    delays = policy.delays()
    while True:
        try:
            return call()
        except Exception as err:  # noqa: BLE001 - any failure of the outside system is retried
            delay = next(delays, None)
            if delay is None:
                raise
            log.warning("%s failed (%s: %s); retrying in %.1fs", what, type(err).__name__,
                        str(err).splitlines()[0][:300] if str(err) else "", delay)
            sleep(delay)
