"""A GBA (or plain async) worker: pull, compute a local batch's gradients, push, repeat.

The worker never waits for other workers: its push returns at once (ps_client.py) and
it goes on to its next batch. `slowdown` makes it a straggler on purpose (`Straggler`),
which is how the benchmark slows one worker down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass

from picasso.batch import PackedBatch, TorchBatch
from picasso.distributed.gba import WorkerDropped
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.ps_client import PSClient

log = logging.getLogger(__name__)


@dataclass
class WorkerStats:
    batches: int = 0
    samples: int = 0
    loss_sum: float = 0.0  # per-sample log loss of each batch, before its update
    refused: int = 0  # pushes shard 0 did not count (too stale, the worker dropped, the budget spent, duplicates)
    duplicates: int = 0  # of those, batches the model held already (a replay): acknowledged, not trained
    held_rows: int = 0  # rows of joined batches left out before their pull: the model held them
    rejoined: int = 0  # times the shards had dropped this worker and it came back under a new incarnation
    mean_staleness: float = 0.0  # over the pushes shard 0 counted: global steps between pull and push
    seconds: float = 0.0

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.samples if self.samples else float("nan")


class Straggler:
    """A worker made `factor` times slower on purpose (the benchmark's injection; 1: none).

    Its own work in a step (preparing the batch, computing the gradients, and in sync mode
    stepping its replica) is timed, and at the end of the step it sleeps (factor - 1)
    times that, so the work takes factor times as long. Waits on the network or on other
    workers are not stretched: a slow machine's network is no slower. Sleeping also
    frees the CPU, as a slow machine would not use ours.
    """

    def __init__(self, factor: float = 1.0):
        if not factor >= 1.0:
            raise ValueError(f"a straggler's factor must be >= 1 (1: none), got {factor}")
        self.factor = factor
        self._work_s = 0.0

    @contextmanager
    def working(self):
        began = time.perf_counter()
        try:
            yield
        finally:
            self._work_s += time.perf_counter() - began

    def end_step(self) -> float:
        """Sleep out the step's slowness; returns the seconds slept."""
        delay, self._work_s = (self.factor - 1.0) * self._work_s, 0.0
        if delay > 0:
            time.sleep(delay)
        return delay


class GBAWorker:
    def __init__(self, client: PSClient, computer: GradientComputer, slowdown: float = 1.0,
                 prequential: bool = False):
        """prequential: send each batch's labels and its scores before the update with the
        push (the job's description asks for them: an endless job's server evaluates)."""
        self.client, self.computer, self.straggler = client, computer, Straggler(slowdown)
        self.prequential = prequential

    def train(self, batches: Iterable[PackedBatch],
              reread: Callable[[dict[str, int]], Iterable[PackedBatch]] | None = None) -> WorkerStats:
        """reread(positions): the worker's batches from the server's positions on. Given, a
        worker the shards dropped (silent past its lease) rejoins and reads on from there, so
        the batches it lost with its old incarnation are trained after all; without it,
        being dropped is an error (WorkerDropped)."""
        stats = WorkerStats()
        start = time.perf_counter()
        source = iter(batches)
        while True:
            try:
                self._train_on(source, stats)
                break
            except WorkerDropped as dropped:
                if reread is None:
                    raise
                log.warning("%s; rejoining", dropped)
                self.client.rejoin()
                stats.rejoined += 1
                source = iter(reread(self.client.positions()))
        self.client.finish()
        stats.refused = sum(not outcome.accepted for outcome in self.client.outcomes)
        stats.duplicates = sum(outcome.duplicate for outcome in self.client.outcomes)
        counted = [outcome.staleness for outcome in self.client.outcomes if outcome.accepted]
        stats.mean_staleness = sum(counted) / len(counted) if counted else 0.0
        stats.seconds = time.perf_counter() - start
        return stats

    def _train_on(self, batches: Iterable[PackedBatch], stats: WorkerStats) -> None:
        for batch in batches:
            if not self.step(batch, stats):
                return

    def step(self, batch: PackedBatch, stats: WorkerStats) -> bool:
        """One local batch: pull, compute, push (without waiting), counted into stats.
        False when shard 0 says the job's sample budget is spent: train no further.

        A batch whose rows carry identities (a joined stream's samples) first leaves out the
        rows the shards hold: a re-read cuts its batches elsewhere than the first read, and
        only the gradient of the rows not yet trained may be pushed. The positions it
        settles go to the shards after its push."""
        settles = batch.settles
        identities = batch.row_identities()
        if identities is not None and batch.num_samples:
            fresh = batch.without_held(self.client.held(batch.ranges))
            stats.held_rows += batch.num_samples - fresh.num_samples
            batch = fresh
        elif identities is None and not batch.num_samples and batch.ranges:
            # Every message of it refused (dead letters): nothing to train, but its range
            # must reach the ledger and its positions the checkpoint, in order.
            if not self.client.pass_over(batch.positions, batch.ranges):
                return False
        if batch.num_samples and not self._train_step(batch, stats):
            return False
        if settles:
            self.client.settle(settles)
        return True

    def _train_step(self, batch: PackedBatch, stats: WorkerStats) -> bool:
        with self.straggler.working():
            tensors = batch.to_torch()
        tensors = self._resolve(tensors)
        with self.straggler.working():
            rows = self.computer.rows_needed(tensors)
        pulled = self.client.pull(rows)
        if pulled.stop:
            return False
        if stats.batches == 0:
            log.info("%s: training from step %d", self.client.worker, pulled.tokens[0])
        with self.straggler.working():
            gradient = self.computer.compute(tensors, pulled.dense, rows, pulled.values)
        self.straggler.end_step()
        self.client.push(pulled, gradient, batch.positions, batch.ranges,
                         tensors.label if self.prequential else None, batch.event_time_ms)
        stats.batches += 1
        stats.samples += gradient.samples
        stats.loss_sum += gradient.loss_sum
        return True

    def _resolve(self, tensors: TorchBatch) -> TorchBatch:
        """The batch with its dynamic fields' keys turned into rows by the shards that own
        them (dynamic_shard.py); a spec without dynamic fields as it is."""
        dynamic = self.computer.model._modules.get("dynamic_rows")
        if dynamic is None:
            return tensors
        parts = dynamic.keys_of(tensors)
        rows = self.client.resolve({part.member.field.field.name: part.keys for part in parts}, tensors.event_time_ms)
        return dynamic.with_rows(tensors, parts, [rows[part.member.field.field.name] for part in parts])
