"""Checkpoints of a small model to publish, and MLflow look-ups the publishing tests share."""

from __future__ import annotations

import uuid
from pathlib import Path

from helpers import planted_batches, small_spec

from picasso.serving.publishing.contract import MLflowTarget, PublishRequest
from picasso.trainer import TrainConfig, Trainer

SPEC = small_spec(name="publish-test")


class CheckpointMaker:
    """A trainer that saves a checkpoint after each call, on fresh planted rows."""

    def __init__(self, root: Path, rows_per_checkpoint: int = 512, spec=SPEC):
        self.spec = spec
        self.trainer = Trainer(spec, TrainConfig(hidden=(16, 8), device="cpu"))
        self.root = root
        self.rows = rows_per_checkpoint
        self.stream = 0

    def next(self) -> Path:
        batches, _ = planted_batches(self.spec, self.rows, 256, stream=self.stream, source=f"part-{self.stream}")
        self.stream += 1
        self.trainer.train(batches)
        metrics = {"train_loss": 0.5, "cache": {"hit_rate": 0.75}}
        if self.spec.dynamic_fields:  # as the pipeline's training saves them (train_handlers)
            metrics.update(self.trainer.performance_metrics())
        return Path(self.trainer.save_checkpoint(self.root, metrics=metrics))


def request(checkpoint: Path, auc: float, **extra) -> PublishRequest:
    return PublishRequest(str(checkpoint), {"auc": auc, "logloss": 0.6, "calibration": 1.02, "samples": 512},
                          params={"mode": "test"}, tags={"picasso.holdout_samples": "64"}, **extra)


def fresh_target(uri: str) -> MLflowTarget:
    name = f"publish-{uuid.uuid4().hex[:8]}"
    return MLflowTarget(uri, experiment=name, model_name=name)
