"""A GBA (or plain async) worker: pull, compute a local batch's gradients, push, repeat.

The worker never waits for other workers: its push returns at once (param_server.py) and
it goes on to its next batch. `slowdown` makes it a straggler on purpose (each step also
sleeps (slowdown - 1) times its compute time), which is how the benchmark slows one
worker down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from picasso.batch import PackedBatch
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.param_server import PSClient

log = logging.getLogger(__name__)


@dataclass
class WorkerStats:
    batches: int = 0
    samples: int = 0
    loss_sum: float = 0.0  # per-sample log loss of each batch, before its update
    refused: int = 0  # pushes shard 0 did not count (too stale, or the worker was dropped)
    seconds: float = 0.0

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.samples if self.samples else float("nan")


def straggle(slowdown: float, began: float) -> None:
    """Make the work since `began` take `slowdown` times as long (1: no delay)."""
    if slowdown > 1.0:
        time.sleep((slowdown - 1.0) * (time.perf_counter() - began))


class GBAWorker:
    def __init__(self, client: PSClient, computer: GradientComputer, slowdown: float = 1.0):
        if slowdown < 1.0:
            raise ValueError(f"slowdown must be >= 1 (1: none), got {slowdown}")
        self.client, self.computer, self.slowdown = client, computer, slowdown

    def train(self, batches: Iterable[PackedBatch]) -> WorkerStats:
        stats = WorkerStats()
        start = time.perf_counter()
        for batch in batches:
            if not self.step(batch, stats):
                break
        self.client.finish()
        stats.refused = sum(not outcome.accepted for outcome in self.client.outcomes)
        stats.seconds = time.perf_counter() - start
        return stats

    def step(self, batch: PackedBatch, stats: WorkerStats) -> bool:
        """One local batch: pull, compute, push (without waiting), counted into stats.
        False when shard 0 says the job's sample budget is spent: train no further."""
        if batch.num_samples == 0:
            return True
        tensors = batch.to_torch()
        rows = self.computer.rows_needed(tensors)
        pulled = self.client.pull(rows)
        if pulled.stop:
            return False
        if stats.batches == 0:
            log.info("%s: training from step %d", self.client.worker, pulled.tokens[0])
        began = time.perf_counter()
        gradient = self.computer.compute(tensors, pulled.dense, rows, pulled.values)
        straggle(self.slowdown, began)
        self.client.push(pulled, gradient, batch.positions)
        stats.batches += 1
        stats.samples += gradient.samples
        stats.loss_sum += gradient.loss_sum
        return True
