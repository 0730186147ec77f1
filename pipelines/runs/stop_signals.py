"""How an operator stops a run that goes on until told: SIGTERM (a scheduler, `kill`) or
SIGINT (Ctrl-C) asks it to stop, and it finishes what is in flight and leaves cleanly."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stopped_by_signals(stop: Callable[[], None]) -> Iterator[None]:
    """While the block runs, SIGTERM and SIGINT call stop(); the handlers before come back
    after it."""
    previous = {sig: signal.signal(sig, lambda *_: stop()) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
