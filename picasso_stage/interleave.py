"""Interleaving: prepare the next batch while the current one computes.

A Prefetcher pulls items from an iterator and prepares them (for the trainer: decode and
pack when the iterator does that lazily, then de-duplicate ids and gather missing rows
into the cache's staging), one item ahead, in a single worker thread. The consumer says
when the next item may start (`start_next`), because preparing must not overlap some
steps of its own (a cache refresh remaps the rows a prepared batch points at). Most of
the work on both sides is in torch, numpy and Arrow kernels that release the GIL, so a
thread is enough. Switched off, the same calls prepare each item in the caller's thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

Item = TypeVar("Item")
Prepared = TypeVar("Prepared")


class Prefetcher(Generic[Item, Prepared]):
    def __init__(self, items: Iterable[Item], prepare: Callable[[Item], Prepared], enabled: bool = True):
        self._items = iter(items)
        self._prepare = prepare
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="picasso-prefetch") if enabled else None
        self._future: Future | None = None
        self._exhausted = False
        self.wait_seconds = 0.0  # time the consumer spent waiting for a prepared item
        self.source_seconds = 0.0  # time spent pulling items (decoding, when the iterator does it)

    def _produce(self) -> Prepared | None:
        start = time.perf_counter()
        item = next(self._items, _END)
        self.source_seconds += time.perf_counter() - start
        if item is _END:
            self._exhausted = True
            return None
        return self._prepare(item)

    def start_next(self) -> None:
        """Begin preparing the next item in the worker (no-op when switched off)."""
        if self._pool is not None and self._future is None and not self._exhausted:
            self._future = self._pool.submit(self._produce)

    def next(self) -> Prepared | None:
        """The next prepared item, or None at the end."""
        if self._future is None:
            return None if self._exhausted else self._produce()
        start = time.perf_counter()
        try:
            return self._future.result()
        finally:
            self._future = None
            self.wait_seconds += time.perf_counter() - start

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "Prefetcher[Item, Prepared]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_END = object()
