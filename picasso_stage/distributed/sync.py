"""Sync mode: N ranks (torchrun), each a full replica, one global batch per step.

Each rank computes its local batch's gradients exactly as a GBA worker does
(local_gradient.py), the ranks all-gather them, and every rank pushes all N into a local
one-shard parameter server (shard.py) with M = N. So a sync step is, by construction,
GBA's aggregation of N fresh local batches followed by the same optimizer step: the
arithmetic is shared, which is what lets a job switch between the modes with nothing
changed but the mode. Every rank applies the same gradients in the same order to the same
state, so the replicas stay identical without broadcasting parameters.

The ranks step together: when one runs out of batches, all stop (its tail is not trained,
as with a DistributedSampler that drops the last uneven batches).

Positions: each rank's batch positions travel in the all-gather, so every replica knows
how far every rank's sources are trained after each step, and a checkpoint (rank 0's,
every `checkpoint_every` steps and at the end) carries them: a job resumed from it, in any
mode, reads each source on from there.

The exchange is `all_gather_object` over the default process group (gloo on CPU, NCCL on
GPU): simple and exact. An all-reduce of the dense part and an all-gather of row gradients
as flat tensors would move less; that is an optimisation for later, with the same result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from picasso.batch import PackedBatch
from picasso.distributed.aggregation import Contribution, RowGradient
from picasso.distributed.gba import GBAConfig
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.ps_checkpoint import build_shard, trainer_state
from picasso.distributed.staleness import NO_DECAY
from picasso.distributed.worker import Straggler
from picasso.models import build_model
from picasso.trainer import Trainer, merge_positions


@dataclass
class SyncStats:
    steps: int = 0
    samples: int = 0  # over every rank
    loss_sum: float = 0.0  # over every rank, each batch's loss before its step

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.samples if self.samples else float("nan")


class SyncReplica:
    def __init__(self, trainer: Trainer, rank: int, world_size: int, slowdown: float = 1.0):
        """trainer: this rank's Trainer, built (and restored) alike on every rank;
        slowdown: this rank straggles (worker.Straggler), as the benchmark injects."""
        self.trainer, self.rank, self.world_size, self.straggler = trainer, rank, world_size, Straggler(slowdown)
        self.shard, self.layout = build_shard(trainer, 0, 1, GBAConfig(world_size, NO_DECAY))
        config = trainer.config
        self.computer = GradientComputer(build_model(config.model, trainer.spec, trainer.plan, config.hidden))
        self.names = [f"rank{r}/sync" for r in range(world_size)]
        self.positions = dict(trainer.positions)  # how far every rank's sources are trained
        for name in self.names:
            self.shard.pull(name, {}, dense=False)  # every rank's pushes are expected

    def train(self, batches: Iterable[PackedBatch], checkpoint_every: int = 0,
              save: Callable[["SyncReplica"], object] | None = None) -> SyncStats:
        """save(replica) is called on every rank after each checkpoint_every-th step (0: never);
        the replicas are identical then, so one rank writing is enough."""
        stats = SyncStats()
        batches = iter(batches)
        while True:
            batch = next(batches, None)
            if not _all_have(batch is not None and batch.num_samples > 0):
                return stats
            loss_sum, samples = self.step(batch)
            stats.steps += 1
            stats.samples += samples
            stats.loss_sum += loss_sum
            if checkpoint_every and save is not None and stats.steps % checkpoint_every == 0:
                save(self)

    def step(self, batch: PackedBatch) -> tuple[float, int]:
        """One global step; returns (summed loss, samples) over every rank's batch."""
        with self.straggler.working():  # this rank's own work: a straggler's takes longer
            tensors = batch.to_torch()
            rows = self.computer.rows_needed(tensors)
            pulled = self.shard.pull(self.names[self.rank], rows, dense=True)
            gradient = self.computer.compute(tensors, pulled.dense, rows, pulled.rows)
        mine = (gradient.samples, gradient.loss_sum, gradient.dense,
                {key: (rows[key], gradient.row_grads[key], pulled.versions[key]) for key in rows}, batch.positions)
        everyone: list = [None] * self.world_size
        dist.all_gather_object(everyone, mine)
        with self.straggler.working():  # stepping its replica is its own work too
            for name, (samples, _, dense, sparse, positions) in zip(self.names, everyone):
                outcome = self.shard.push(Contribution(name, pulled.token, samples, dense,
                                                       {key: RowGradient(*parts) for key, parts in sparse.items()}))
                if not outcome.accepted:
                    raise RuntimeError(f"sync step refused {name}'s gradients: {outcome.reason}")
                self.positions = merge_positions(self.positions, positions)
        self.straggler.end_step()
        return sum(e[1] for e in everyone), sum(e[0] for e in everyone)

    def state(self) -> dict:
        """Trainer.state()'s layout, for a checkpoint any mode resumes from."""
        return trainer_state(self.layout, [self.shard.snapshot()], self.trainer)


def _all_have(flag: bool) -> bool:
    """True when every rank's flag is true."""
    value = torch.tensor([1 if flag else 0])
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())
