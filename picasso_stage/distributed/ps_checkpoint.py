"""Between a Trainer's checkpoint state and the parameter-server shards.

A parameter server starts from a Trainer's state (a fresh Trainer's, or a checkpoint any
mode wrote) and writes its checkpoints in exactly Trainer.state()'s layout, so
Trainer.restore, and a parameter server in any mode, resume from them.

Positions: shard 0 records the sources' positions of every batch whose gradient left its
buffer (applied in a global step, or dropped as too stale), starting from the positions of
the checkpoint it was built from. A checkpoint carries those, never a buffered batch's:
a job resumed from it reads each source from where the model's training ends, so it
neither skips nor repeats data. Every worker reads its own sources in order, so per
source the furthest position is a prefix of what was trained.

Out of order: a worker's pushes go out with rpc_async, and with --max-in-flight above 1
the shard's RPC threads may take two of them out of order. Each push is numbered, and
shard 0 advances a worker's positions only over an unbroken run of its numbers
(TokenControl._record_positions), so a checkpoint never records a batch's position while
an earlier batch of that worker is still on its way: a resumed job may read such a later
batch again, but never skips one.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from picasso.checkpoint import save_checkpoint
from picasso.distributed.dynamic_shard import checkpoint_metrics
from picasso.distributed.gba import GBAConfig
from picasso.distributed.layout import ShardLayout
from picasso.distributed.applied_ranges import AppliedRanges
from picasso.distributed.shard import Scored, Shard, ShardSnapshot
from picasso.trainer import Trainer


def build_shard(trainer: Trainer, index: int, num_shards: int, gba: GBAConfig,
                sample_budget: int | None = None, checkpoint_every: int = 0,
                applied: dict[str, list[list[int]]] | None = None, window: Scored | None = None,
                newest_event_ms: int | None = None) -> tuple[Shard, ShardLayout]:
    """Shard `index` of a Trainer's model, at the Trainer's step (and, on shard 0, its
    positions); checkpoint_every: stash a snapshot every that many global steps (0: never);
    applied: the source ranges the model holds (the checkpoint's applied.json), which every
    shard refuses to train again; window and newest_event_ms (shard 0): the prequential
    window and the newest event time the checkpoint kept."""
    layout = ShardLayout.from_model(trainer.model, num_shards)
    state = trainer.state()
    part = layout.split(state["model"])[index]
    shard = Shard(index, layout, part, gba, trainer.config,
                  dense_optimizer=state["dense_optimizer"] if index == 0 else None,
                  step=int(state["step"]), samples=int(state["samples"]), sample_budget=sample_budget,
                  positions=dict(trainer.positions) if index == 0 else None, checkpoint_every=checkpoint_every,
                  ledger=AppliedRanges.from_checkpoint(applied, trainer.positions),
                  window=window if index == 0 else None, newest_event_ms=newest_event_ms if index == 0 else None)
    return shard, layout


def trainer_state(layout: ShardLayout, snapshots: list[ShardSnapshot], trainer: Trainer) -> dict:
    """Trainer.state()'s layout from every shard's snapshot: the model merged, shard 0's
    dense optimizer, step and samples, and the rest (RNG, config) from `trainer`, the one
    the server was built from."""
    snapshots = sorted(snapshots, key=lambda s: s.index)
    if [s.index for s in snapshots] != list(range(layout.num_shards)):
        raise ValueError(f"need one snapshot of each of {layout.num_shards} shards, got {[s.index for s in snapshots]}")
    first = snapshots[0]
    return {
        "step": first.step,
        "samples": first.samples,
        "model": layout.merge([s.tensors for s in snapshots]),
        "dense_optimizer": first.dense_optimizer,
        "rng": torch.get_rng_state(),
        "config": asdict(trainer.config),
    }


def save_ps_checkpoint(root: str | Path, layout: ShardLayout, snapshots: list[ShardSnapshot], trainer: Trainer,
                       metrics: dict, extra: dict[str, bytes] | None = None) -> tuple[Path, dict]:
    """Write the shards' state as a Trainer checkpoint under root, with shard 0's positions,
    and its counts (per worker too) and the newest event time trained among the metrics;
    extra: files committed with it. Returns (its path, the state)."""
    state = trainer_state(layout, snapshots, trainer)
    first = min(snapshots, key=lambda s: s.index)
    metrics = {"ps": first.counts, "contributed": first.contributed, "newest_event_ms": first.newest_event_ms,
               **metrics}
    if layout.dynamic:  # the version's own counts, as a Trainer's checkpoint reports them
        metrics.update(checkpoint_metrics(layout.dynamic, [s.dynamic for s in snapshots]))
    return save_checkpoint(root, state, trainer.spec, first.positions, metrics, first.applied, extra), state
