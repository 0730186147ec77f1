"""Between a Trainer's checkpoint state and the parameter-server shards.

A parameter server starts from a Trainer's state (a fresh Trainer's, or a checkpoint any
mode wrote) and writes its checkpoints in exactly Trainer.state()'s layout, so
Trainer.restore, and a parameter server in any mode, resume from them.
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from picasso.distributed.gba import GBAConfig
from picasso.distributed.layout import ShardLayout
from picasso.distributed.shard import Shard, ShardSnapshot
from picasso.trainer import Trainer


def build_shard(trainer: Trainer, index: int, num_shards: int, gba: GBAConfig,
                sample_budget: int | None = None) -> tuple[Shard, ShardLayout]:
    """Shard `index` of a Trainer's model, at the Trainer's step."""
    layout = ShardLayout.from_model(trainer.model, num_shards)
    state = trainer.state()
    part = layout.split(state["model"])[index]
    shard = Shard(index, layout, part, gba, trainer.config.lr_dense,
                  dense_optimizer=state["dense_optimizer"] if index == 0 else None,
                  step=int(state["step"]), samples=int(state["samples"]), sample_budget=sample_budget)
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
