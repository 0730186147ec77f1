"""Interleaving: while one step computes, the next batch is made ready.

A step has three parts (the trainer's):
- prepare: everything that does not touch the model (to tensors; with the hot-row cache,
  de-duplicate the ids, count them, map them to fast-tier slots, gather the rows that
  are not hot);
- begin: the short part that must follow the previous step (a cache refresh, loading
  the gathered rows into the fast tier);
- finish: compute (forward, backward with the fused sparse update, dense optimizer step)
  and commit (write the staged rows back).

StepPipeline computes in the caller's thread and prepares the next batch in a worker
thread meanwhile: with `run(items)` the worker also pulls the batch from the iterator (so
decoding and packing overlap the step too); with `push(item)` (a Beam bundle, whose
items arrive one at a time) it prepares what it is given.

While a pipeline interleaves, the interpreter's switch interval is short (SWITCH_INTERVAL_S
instead of 5 ms): compute and preparation take turns holding the GIL between kernels, and
the compute thread, asking for it back, would otherwise wait out the whole interval each
time the worker holds it in Python code (decoding and packing hundreds of columns is
mostly that). The interval is process-wide; the last pipeline to close restores it.

The worker runs at the lowest CPU priority (SCHED_IDLE on Linux). Compute is the bigger
part, and torch spreads it over every core; a preparing thread that took a core from it
would stall each of its parallel regions, which wait for their slowest thread. At idle
priority the worker only uses what compute leaves: its single-threaded stretches, and
the time it waits for the next batch. Even so, where torch's threads take every core the
worker costs the step about as much as it hides (worth_interleaving), so the trainer switches it
on only with a GPU or spare cores. Switched off, every part runs in the caller's thread,
in the same order, with the same results.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

import torch

Item = TypeVar("Item")
Ready = TypeVar("Ready")
Result = TypeVar("Result")

_END = object()

SWITCH_INTERVAL_S = 0.0005


class _ShortSwitchInterval:
    """Holds the interpreter's switch interval at SWITCH_INTERVAL_S while any pipeline
    interleaves (pipelines may overlap: one per Beam DoFn instance)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._holders = 0
        self._saved = sys.getswitchinterval()

    def acquire(self) -> None:
        with self._lock:
            if self._holders == 0:
                self._saved = sys.getswitchinterval()
                sys.setswitchinterval(min(self._saved, SWITCH_INTERVAL_S))
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                sys.setswitchinterval(self._saved)


_switch_interval = _ShortSwitchInterval()


def worth_interleaving(device: torch.device) -> bool:
    """Whether preparing beside the step speeds training up here: with a GPU (the step runs
    there), or with CPU cores that torch's threads leave free. Where torch's threads take
    every core, a preparing thread slows the step's kernels by about as much as it hides,
    or more, even at idle priority (benchmarks.train, 2 cores: 0.90x at 39 fields, 1.04x
    at 400): it takes the GIL and the caches from them, and the OS a moment to hand a core
    back."""
    if device.type == "cuda":
        return True
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores > torch.get_num_threads()


def _lowest_priority() -> None:
    """Make the calling thread run only on otherwise idle CPU time, where the OS allows it."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread, on Linux
    except (AttributeError, OSError):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 19)
        except (AttributeError, OSError):
            pass  # no way to lower it here: it runs at normal priority


class StepPipeline(Generic[Item, Ready, Result]):
    def __init__(self, prepare: Callable[[Item], Ready], begin: Callable[[Ready], Ready],
                 finish: Callable[[Ready], Result], enabled: bool = True,
                 on_wait: Callable[[float], None] = lambda seconds: None):
        """on_wait: told the seconds of each wait of the caller for a prepared batch."""
        self._prepare, self._begin, self._finish = prepare, begin, finish
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="picasso-prepare",
                                        initializer=_lowest_priority) if enabled else None
        if self._pool is not None:
            _switch_interval.acquire()
        self._on_wait = on_wait
        self._ready: Ready | None = None  # begun, waiting to compute

    def run(self, items: Iterable[Item]) -> Iterator[Result]:
        """Train on every item; yields each step's result as it finishes."""
        source = iter(items)

        def pull_and_prepare():
            item = next(source, _END)
            return _END if item is _END else self._prepare(item)

        ready = pull_and_prepare()
        while ready is not _END:
            ready = self._begin(ready)
            upcoming = self._start(pull_and_prepare)  # beside the step below, or after it
            yield self._finish(ready)
            ready = self._wait(upcoming)

    def push(self, item: Item) -> list[Result]:
        """Start the step of `item`; returns the result of the step this one follows."""
        if self._ready is None:
            self._ready = self._begin(self._prepare(item))
            return []
        upcoming = self._start(lambda: self._prepare(item))
        result = self._finish(self._ready)
        self._ready = None
        self._ready = self._begin(self._wait(upcoming))
        return [result]

    def drain(self) -> list[Result]:
        """Compute the step still waiting, if any; its result."""
        if self._ready is None:
            return []
        ready, self._ready = self._ready, None
        return [self._finish(ready)]

    def _start(self, work: Callable[[], Ready]) -> Future | Callable[[], Ready]:
        """Interleaving: start `work` beside the step the caller runs next. Off: keep it
        for _wait, so that it runs after that step, in the order one thread would take."""
        return self._pool.submit(work) if self._pool is not None else work

    def _wait(self, upcoming: Future | Callable[[], Ready]) -> Ready:
        if not isinstance(upcoming, Future):
            return upcoming()
        start = time.perf_counter()
        try:
            return upcoming.result()
        finally:
            self._on_wait(time.perf_counter() - start)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            _switch_interval.release()

    def __enter__(self) -> "StepPipeline[Item, Ready, Result]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
