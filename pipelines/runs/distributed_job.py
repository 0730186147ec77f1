"""What the distributed runs share (param_server.py, gba_worker.py, sync_worker.py): the
error they stop with, the trainer resumed from the work folder's checkpoints, and the
planted data a worker trains on.

A RunError is a failure the operator can act on (a checkpoint of another model, a server
that never came, a launch the run cannot work under): the command line prints it as one
`error:` line, without a traceback. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from picasso.pipelines.runs.workdir import Workdir
from picasso.spec import FeatureSpec
from picasso.trainer import TrainConfig, Trainer


class RunError(Exception):
    """A distributed run stopped for a reason its message gives in full."""


@dataclass(frozen=True)
class ResumedTrainer:
    trainer: Trainer
    checkpoints: Path  # WORKDIR/checkpoints: where the run writes its own
    resumed_from: str | None  # the checkpoint it resumed; None: a fresh model


def resume_trainer(spec: FeatureSpec, config: TrainConfig, workdir: str) -> ResumedTrainer:
    """A Trainer of spec and config, resumed from the latest checkpoint under
    WORKDIR/checkpoints when there is one (any mode's: they share the Trainer's layout)."""
    trainer = Trainer(spec, config)
    root = Path(Workdir(workdir).checkpoints)
    try:
        resumed = trainer.warm_start(root)
    except (RuntimeError, ValueError) as err:  # another spec, or a model of other shapes
        raise RunError(f"cannot resume from {root}: {err}") from err
    return ResumedTrainer(trainer, root, resumed)


@dataclass(frozen=True)
class PlantedData:
    """What a worker of `picasso gba-worker` or `picasso sync-worker` trains on: rows of a
    planted stream (picasso.connectors.synthetic), one stream per rank, so that the ranks
    read disjoint data and a benchmark can say which rank is slow."""

    rows: int = 100_000  # rows to train on
    batch_size: int = 512  # the local batch
    stream: int | None = None  # None: stream_base + the rank
    stream_base: int = 100
    straggler: tuple[int, float] | None = None  # (rank, factor): that rank computes factor times slower

    def stream_of(self, rank: int) -> int:
        return self.stream_base + rank if self.stream is None else self.stream

    def slowdown(self, rank: int) -> float:
        return self.straggler[1] if self.straggler and self.straggler[0] == rank else 1.0
