"""`picasso ps`: a parameter server of one or more shards, for GBA or plain async workers,
serving until every worker of the job is done or dropped.

The server starts from the latest checkpoint under WORKDIR/checkpoints (any mode's; a
fresh model when there is none) and, when the job ends, writes one in the Trainer's
layout, which any mode resumes from (and every checkpoint_every global steps, if set).
Workers get the spec, the TrainConfig and the layout from shard 0 (JobDescription), so
they cannot disagree with the servers. This process serves one shard; given the other
shards' commands, it starts their processes first and waits for them at the end.
(`picasso ps --endless`, whose workers come and go, is endless_server.py.)
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

from picasso.checkpoint import read_applied
from picasso.distributed.gba import GBAConfig
from picasso.distributed.param_server import JobDescription, ParameterServerError, ServerAddress, serve_shard
from picasso.distributed.ps_checkpoint import build_shard, save_ps_checkpoint
from picasso.pipelines.runs.distributed_job import RunError, resume_trainer
from picasso.spec import FeatureSpec
from picasso.trainer import TrainConfig

if TYPE_CHECKING:  # run_metrics imports prometheus_client: at run time only with a metrics port
    from picasso.pipelines.runs.run_metrics import MetricsAddress

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParamServerSettings:
    spec: FeatureSpec
    config: TrainConfig
    workdir: str  # checkpoints are read from and written to WORKDIR/checkpoints
    address: ServerAddress  # where shard 0 listens (shard s on port + s), and the credentials
    gba: GBAConfig  # M, the staleness decay and the row gradient; GBAConfig.plain_async() for async
    mode: str  # what the checkpoints and the summary call it: "gba" or "async"
    workers: int  # the job ends when worker0..worker{N-1} (and any extra) are done
    shards: int = 1
    shard_index: int = 0  # the shard this process serves
    lease_s: float = 30.0  # a worker silent this long is dropped
    samples: int | None = None  # stop the workers once this many samples are counted; None: each its rows
    checkpoint_every: int = 0  # global steps between checkpoints while training; 0: only the last
    metrics_port: MetricsAddress | None = None  # serve this shard's Prometheus metrics there
    # The commands that start the other shards' processes (shard 0's process starts them);
    # empty when each shard is started on its own.
    shard_commands: tuple[tuple[str, ...], ...] = ()


def run_param_server(settings: ParamServerSettings) -> dict:
    """Serve this shard until the job ends; the summary of the job as shard `shard_index`
    saw it (its last checkpoint, the counts, who contributed, who was dropped or lost)."""
    start = resume_trainer(settings.spec, settings.config, settings.workdir)
    trainer, root, gba = start.trainer, start.checkpoints, settings.gba
    children = [subprocess.Popen(list(command)) for command in settings.shard_commands]
    # The ledger of source ranges trained goes on with the weights: a batch replayed after
    # the restart is acknowledged, not trained twice.
    applied = read_applied(start.resumed_from) if start.resumed_from is not None else None
    shard, layout = build_shard(trainer, settings.shard_index, settings.shards, gba, settings.samples,
                                settings.checkpoint_every, applied)
    summary = {"shard": settings.shard_index, "mode": settings.mode, "global_batches": gba.global_batches,
               "decay": gba.decay.describe(), "row_gradient": gba.row_gradient}

    def checkpoint(snapshots, last: bool = False):
        path, state = save_ps_checkpoint(root, layout, snapshots, trainer, {"mode": settings.mode})
        log.info("%scheckpoint at step %d (%d samples): %s", "last " if last else "", state["step"], state["samples"],
                 path)
        return path, state

    def write_checkpoint(snapshots, lost_workers) -> None:
        path, state = checkpoint(snapshots, last=True)
        summary.update(step=state["step"], samples=state["samples"], counts=snapshots[0].counts,
                       contributed=snapshots[0].contributed, positions=snapshots[0].positions, checkpoint=str(path),
                       dropped_workers=sorted(shard.control.dropped), lost_workers=lost_workers)

    description = JobDescription(trainer.spec, trainer.config, layout, settings.lease_s)
    from picasso.pipelines.runs.run_metrics import ShardMetrics, serving_metrics

    try:
        with serving_metrics(settings.metrics_port) as registry:  # this shard's; None: no metrics port
            if registry is not None:
                ShardMetrics(registry, shard)
            serve_shard(shard, settings.address, settings.workers, settings.lease_s, description=description,
                        on_stop=write_checkpoint, on_checkpoint=checkpoint, num_shards=settings.shards)
    except (ValueError, OSError, ParameterServerError) as err:  # a bad address or credentials, a shard that never came
        for child in children:
            child.terminate()
        raise RunError(str(err)) from err
    failed = [c.args for c in children if c.wait() != 0]
    if failed:
        raise RunError(f"{len(failed)} shard process(es) failed")
    return summary
