"""Interleaving: while one step computes, the next batch is made ready.

A step has three parts (the trainer's):
- prepare: everything that does not touch the model (to tensors; with the hot-row cache,
  de-duplicate the ids, count them, map them to fast-tier slots, gather the rows that
  are not hot);
- begin: the short part that must follow the previous step (a cache refresh, loading
  the gathered rows into the fast tier);
- finish: compute (forward, backward with the fused sparse update, dense optimizer step)
  and commit (write the staged rows back).

StepPipeline runs each finish in a worker thread and returns to the caller at once, so
the caller's thread makes the next batch (decoding and packing it, in a pipeline or a
Beam bundle) and prepares it while the previous step computes. Most of the work on both
sides is in torch, numpy and Arrow kernels that release the GIL, so threads suffice.
Switched off, every part runs in the caller's thread, in the same order, with the same
results.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

Item = TypeVar("Item")
Ready = TypeVar("Ready")
Result = TypeVar("Result")


class StepPipeline(Generic[Item, Ready, Result]):
    def __init__(self, prepare: Callable[[Item], Ready], begin: Callable[[Ready], Ready],
                 finish: Callable[[Ready], Result], enabled: bool = True,
                 on_wait: Callable[[float], None] = lambda seconds: None):
        """on_wait: told the seconds of each wait of the caller for a step to finish."""
        self._prepare, self._begin, self._finish = prepare, begin, finish
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="picasso-compute") if enabled else None
        self._running: Future | None = None
        self._on_wait = on_wait

    def push(self, item: Item) -> list[Result]:
        """Start the step of `item`; returns the results of the steps that finished."""
        ready = self._prepare(item)  # overlaps the step still computing
        done = self.drain()
        ready = self._begin(ready)
        if self._pool is None:
            return [*done, self._finish(ready)]
        self._running = self._pool.submit(self._finish, ready)
        return done

    def drain(self) -> list[Result]:
        """Wait for the step computing now, if any; its result (or its exception)."""
        if self._running is None:
            return []
        start = time.perf_counter()
        running, self._running = self._running, None
        try:
            return [running.result()]
        finally:
            self._on_wait(time.perf_counter() - start)

    def close(self) -> None:
        """Let the running step finish (its update is applied either way), then stop."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> "StepPipeline[Item, Ready, Result]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
