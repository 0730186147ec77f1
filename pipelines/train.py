"""PicassoTrain and EvaluateCheckpoint: thin Beam wrappers around picasso.Trainer.

Like Beam's RunInference, the heavy object (the Trainer, with its tables) is built by a
small handler and shared by every DoFn instance in a process through
apache_beam.utils.shared.Shared, so the training step and the checkpoint step see the same
model. Training is a sink in Beam terms; its one output is a reference to the checkpoint
written once every batch has been trained on.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.shared import Shared
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from picasso.batch import PackedBatch
from picasso.spec import FeatureSpec
from picasso.trainer import EvalMetrics, StepResult, TrainConfig, Trainer, TrainStats, evaluation_metrics


@dataclass(frozen=True)
class TrainerHandler:
    """How to build the trainer a pipeline run trains: warm-started from the latest
    checkpoint under checkpoint_dir (start_from="latest", the default), from a given
    checkpoint directory, or from scratch (start_from=None)."""

    spec: FeatureSpec
    config: TrainConfig
    checkpoint_dir: str
    run_id: str  # one trainer per pipeline run, even when runs share a process
    start_from: str | None = "latest"

    def load(self) -> Trainer:
        trainer = Trainer(self.spec, self.config)
        if self.start_from == "latest":
            trainer.warm_start(self.checkpoint_dir)
        elif self.start_from is not None:
            trainer.restore(self.start_from)
        return trainer


@dataclass(frozen=True)
class CheckpointRef:
    path: str
    step: int
    stats: TrainStats


class _TrainDoFn(beam.DoFn):
    """Trains on each batch through the trainer's step pipeline: with interleaving on, a
    step computes in a worker thread while the runner decodes and packs the next batch
    (the fused upstream stages) and the trainer prepares it. The bundle's last step is
    waited for in finish_bundle, so a bundle commits only what it trained."""

    def __init__(self, handler: TrainerHandler, shared: Shared):
        self.handler = handler
        self.shared = shared

    def setup(self):
        self.trainer = self.shared.acquire(self.handler.load, tag=self.handler.run_id)

    def start_bundle(self):
        self.steps = self.trainer.pipeline()

    def process(self, batch: PackedBatch):
        yield from map(_stats_of, self.steps.push(batch))

    def finish_bundle(self):
        try:
            for result in self.steps.drain():
                yield WindowedValue(_stats_of(result), MIN_TIMESTAMP, [GlobalWindow()])
        finally:
            self.steps.close()


def _stats_of(result: StepResult) -> TrainStats:
    return TrainStats(steps=1 if result.samples else 0, samples=result.samples, loss_sum=result.loss_sum,
                      positions=result.positions)


class _MergeStats(beam.CombineFn):
    def create_accumulator(self):
        return TrainStats()

    def add_input(self, accumulator, stats):
        return accumulator.merge(stats)

    def merge_accumulators(self, accumulators):
        total = TrainStats()
        for accumulator in accumulators:
            total = total.merge(accumulator)
        return total

    def extract_output(self, accumulator):
        return accumulator


class _CheckpointDoFn(beam.DoFn):
    def __init__(self, handler: TrainerHandler, shared: Shared):
        self.handler = handler
        self.shared = shared

    def process(self, stats: TrainStats):
        trainer = self.shared.acquire(self.handler.load, tag=self.handler.run_id)
        if trainer.step != trainer.start_step + stats.steps:
            # The trainer was rebuilt between stages (its process changed, say): saving it
            # would silently drop the training this run did.
            raise RuntimeError(
                f"trainer holds {trainer.step - trainer.start_step} steps of this run, but {stats.steps} were trained"
            )
        # Stage times and cache counts go with the checkpoint; publishing logs them to the
        # MLflow run, the per-step series as charts.
        metrics = {"train_loss": stats.mean_loss, **trainer.performance_metrics(), "step_metrics": trainer.step_metrics_so_far()}
        path = trainer.save_checkpoint(self.handler.checkpoint_dir, metrics=metrics)
        yield CheckpointRef(path=str(path), step=trainer.step, stats=stats)


class PicassoTrain(beam.PTransform):
    """PackedBatches in; one CheckpointRef out, once all of them are trained on.

    mode="gba" (with ps, a gba_train.PSAddress): every worker process of the runner trains
    as one GBA worker of that parameter server instead; the output is then the workers'
    merged TrainStats and the checkpoint is the server's (gba_train.py)."""

    def __init__(self, spec: FeatureSpec, config: TrainConfig, checkpoint_dir: str | Path,
                 start_from: str | None = "latest", mode: str = "local", ps=None):
        super().__init__()
        if mode not in ("local", "gba") or (mode == "gba") != (ps is not None):
            raise ValueError(f"mode must be 'local', or 'gba' with ps= the parameter server's address; got {mode!r}")
        self.handler = TrainerHandler(spec, config, str(checkpoint_dir), run_id=uuid.uuid4().hex, start_from=start_from)
        self.shared = Shared()
        self.mode, self.ps = mode, ps

    def expand(self, batches):
        if self.mode == "gba":
            from picasso.pipelines.gba_train import GBATrain

            return batches | GBATrain(self.ps, self.handler.spec)
        return (
            batches
            | "TrainStep" >> beam.ParDo(_TrainDoFn(self.handler, self.shared))
            | "MergeStats" >> beam.CombineGlobally(_MergeStats())
            | "Checkpoint" >> beam.ParDo(_CheckpointDoFn(self.handler, self.shared))
        )


class _ScoreDoFn(beam.DoFn):
    def __init__(self, spec: FeatureSpec, config: TrainConfig, shared: Shared):
        self.spec = spec
        self.config = config
        self.shared = shared

    def process(self, batch: PackedBatch, checkpoint: CheckpointRef):
        def load() -> Trainer:
            trainer = Trainer(self.spec, self.config)
            trainer.restore(checkpoint.path)
            return trainer

        if batch.num_samples:
            trainer = self.shared.acquire(load, tag=checkpoint.path)
            yield batch.data.column("label").to_numpy(), trainer.predict(batch)


class _ConcatScores(beam.CombineFn):
    def create_accumulator(self):
        return [], []

    def add_input(self, accumulator, scored):
        accumulator[0].append(scored[0])
        accumulator[1].append(scored[1])
        return accumulator

    def merge_accumulators(self, accumulators):
        labels, scores = [], []
        for more_labels, more_scores in accumulators:
            labels += more_labels
            scores += more_scores
        return labels, scores

    def extract_output(self, accumulator) -> EvalMetrics:
        labels, scores = accumulator
        return evaluation_metrics(np.concatenate(labels or [np.zeros(0)]), np.concatenate(scores or [np.zeros(0)]))


class EvaluateCheckpoint(beam.PTransform):
    """Holdout PackedBatches in, scored by the checkpoint given as a singleton side input;
    one EvalMetrics out (exact AUC over every holdout row)."""

    def __init__(self, spec: FeatureSpec, config: TrainConfig, checkpoint):
        super().__init__()
        self.spec = spec
        self.config = config
        self.checkpoint = checkpoint
        self.shared = Shared()

    def expand(self, batches):
        return (
            batches
            | "Score" >> beam.ParDo(
                _ScoreDoFn(self.spec, self.config, self.shared), checkpoint=beam.pvalue.AsSingleton(self.checkpoint)
            )
            | "Metrics" >> beam.CombineGlobally(_ConcatScores())
        )
