"""PicassoTrain and EvaluateCheckpoint: thin Beam wrappers around picasso's engines.

PicassoTrain is the one training transform of every run: daily (a picasso.Trainer, local
mode), stream (the stream's model and ledger) and gba (a worker of a parameter server).
Like Beam's RunInference, the heavy object is built by a small handler
(train_handlers.py) and shared by every DoFn instance in a process, so that the training
step and what follows it see the same model. Training is a sink in Beam terms; its one
output is what the handler makes of the merged statistics: a reference to the checkpoint
written once every batch has been trained on (local), or those statistics (stream, gba).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.shared import Shared
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from picasso.batch import PackedBatch
from picasso.pipelines.train_handlers import CheckpointRef, GBAHandler, TrainerHandler, TrainHandler
from picasso.spec import FeatureSpec
from picasso.trainer import EvalMetrics, StepResult, TrainConfig, Trainer, TrainStats, evaluation_metrics


class _TrainDoFn(beam.DoFn):
    """Pushes each element through the handler's steps, one TrainStats out per finished
    step. The bundle's last steps are waited for in finish_bundle, so a bundle commits only
    what it trained."""

    def __init__(self, handler: TrainHandler, shared: Shared):
        self.handler = handler
        self.shared = shared
        self.engine = None

    def setup(self):
        self.engine = self.handler.acquire(self.shared)

    def start_bundle(self):
        self.steps = self.handler.open_steps(self.engine)

    def process(self, element):
        yield from map(_stats_of, self.steps.push(element))

    def finish_bundle(self):
        try:
            for result in self.steps.drain():
                yield WindowedValue(_stats_of(result), MIN_TIMESTAMP, [GlobalWindow()])
        finally:
            self.steps.close()

    def teardown(self):
        if self.engine is not None:
            engine, self.engine = self.engine, None
            self.handler.release(engine)


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


class PicassoTrain(beam.PTransform):
    """PackedBatches in; one CheckpointRef out, once all of them are trained on.

    mode="gba" (with ps, a gba_train.PSAddress): every worker process of the runner trains
    as one GBA worker of that parameter server instead; the output is then the merged
    TrainStats and the checkpoint is the server's (gba_train.py).

    handler= (with no other settings) trains with a handler of one's own, such as the
    stream's train_handlers.StreamHandler; shared= is the Shared its engine lives in, for a
    caller that holds the engine too (the stream keeps its model across cycles)."""

    def __init__(self, spec: FeatureSpec | None = None, config: TrainConfig | None = None,
                 checkpoint_dir: str | Path | None = None, start_from: str | None = "latest", mode: str = "local",
                 ps=None, *, handler: TrainHandler | None = None, shared: Shared | None = None):
        super().__init__()
        if handler is None:
            handler = _handler_for(spec, config, checkpoint_dir, start_from, mode, ps)
        elif any(setting is not None for setting in (spec, config, checkpoint_dir, ps)) or mode != "local":
            raise ValueError("PicassoTrain takes a handler or the settings to build one, not both")
        self.handler = handler
        self.shared = Shared() if shared is None else shared

    def expand(self, batches):
        stats = (
            batches
            | "TrainStep" >> beam.ParDo(_TrainDoFn(self.handler, self.shared))
            | "MergeStats" >> beam.CombineGlobally(_MergeStats())
        )
        return self.handler.finish(stats, self.shared)


def _handler_for(spec, config, checkpoint_dir, start_from, mode, ps) -> TrainHandler:
    if mode not in ("local", "gba") or (mode == "gba") != (ps is not None):
        raise ValueError(f"mode must be 'local', or 'gba' with ps= the parameter server's address; got {mode!r}")
    if spec is None or config is None or (mode == "local" and checkpoint_dir is None):
        raise ValueError("PicassoTrain needs a spec, a train config and (in local mode) a checkpoint directory")
    if mode == "gba":
        return GBAHandler(ps, spec)
    return TrainerHandler(spec, config, str(checkpoint_dir), key=uuid.uuid4().hex, start_from=start_from)


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
