"""`picasso sync-worker`: one rank of sync training, started by torchrun with the others.

Every rank resumes the same checkpoint from WORKDIR/checkpoints, reads a planted stream
of its own from where that checkpoint's training ends, and steps in lockstep with the
others (picasso.distributed.sync: dense gradients all-reduced, row gradients gathered,
GBA's step applied once per rank). The replicas stay identical, so rank 0 alone writes the
checkpoints, in the Trainer's layout that every mode resumes from.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass

import torch.distributed as dist

from picasso.checkpoint import save_checkpoint
from picasso.connectors.synthetic.planted_batches import planted_batches, planted_source
from picasso.distributed.layout import SYNC_DYNAMIC
from picasso.distributed.sync import SyncReplica, SyncStats
from picasso.pipelines.runs.distributed_job import PlantedData, RunError, resume_trainer
from picasso.spec import FeatureSpec
from picasso.trainer import TrainConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncWorkerSettings:
    spec: FeatureSpec
    config: TrainConfig  # its loss_batch_size is this rank's local batch (B is the ranks' sum)
    workdir: str  # checkpoints are read from and written to WORKDIR/checkpoints
    data: PlantedData
    row_gradient: str = "global-mean"  # aggregation's rule for rows (ROW_GRADIENTS)
    checkpoint_every: int = 0  # global steps between checkpoints while training; 0: only the last


@dataclass(frozen=True)
class SyncWorkerResult:
    rank: int
    world_size: int
    stats: SyncStats
    began: float  # wall clock (epoch seconds) at the common start
    seconds: float  # training alone, from the common start
    row_gradient: str
    state: dict  # the replica's state after its last step
    checkpoint: str | None  # the last checkpoint: rank 0's; None on the other ranks

    def summary(self) -> dict:
        """What `picasso sync-worker --json` prints, with a digest of the model that replicas
        in agreement share (computed here: only when asked for)."""
        stats = self.stats
        return {"rank": self.rank, "world_size": self.world_size, "steps": stats.steps, "samples": stats.samples,
                "mean_loss": stats.mean_loss, "seconds": self.seconds, "began": self.began,
                "ended": self.began + self.seconds, "apply_s": stats.apply_s, "step_s": stats.seconds,
                "row_gradient": self.row_gradient, "step": self.state["step"], "checkpoint": self.checkpoint,
                "state_hash": _state_hash(self.state["model"])}


def run_sync_worker(settings: SyncWorkerSettings) -> SyncWorkerResult:
    """Train this rank under torchrun (RANK, WORLD_SIZE and MASTER_ADDR set)."""
    if "RANK" not in os.environ:
        raise RunError("sync-worker runs under torchrun (RANK, WORLD_SIZE and MASTER_ADDR unset)")
    spec, data = settings.spec, settings.data
    if spec.dynamic_fields:
        raise RunError(f"{', '.join(f.name for f in spec.dynamic_fields)}: {SYNC_DYNAMIC}")
    start = resume_trainer(spec, settings.config, settings.workdir)
    trainer, root = start.trainer, start.checkpoints
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        replica = SyncReplica(trainer, rank, world, data.slowdown(rank), settings.row_gradient)
        stream = data.stream_of(rank)
        start_at = trainer.positions.get(planted_source(stream), 0)  # resume where the checkpoint's training ends
        batches = planted_batches(trainer.spec, data.rows, data.batch_size, stream, start_at)

        def save(replica) -> None:  # the replicas are identical: rank 0 writes
            if rank == 0:
                _said(save_checkpoint(root, replica.state(), trainer.spec, replica.positions, {"mode": "sync"}))

        dist.barrier()  # every rank has its data: time the training alone, from a common start
        began = time.time()
        stats = replica.train(batches, settings.checkpoint_every, save)
        seconds = time.time() - began
        state = replica.state()
        dist.barrier()  # every rank has taken its last step before rank 0 writes
        path = _said(save_checkpoint(root, state, trainer.spec, replica.positions, {"mode": "sync"}), "last ") \
            if rank == 0 else None
    finally:
        dist.destroy_process_group()
    return SyncWorkerResult(rank, world, stats, began, seconds, settings.row_gradient, state,
                            str(path) if path else None)


def _said(path, last: str = ""):
    log.info("%scheckpoint: %s", last, path)
    return path


def _state_hash(model_state: dict) -> str:
    """A digest of the model's tensors: replicas that agree bit for bit have the same one."""
    digest = hashlib.sha256()
    for key in sorted(model_state):
        digest.update(key.encode())
        digest.update(model_state[key].contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]
