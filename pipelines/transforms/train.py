"""PicassoTrain and EvaluateCheckpoint: thin Beam wrappers around picasso's engines.

PicassoTrain is the one training transform of every run: daily (a picasso.Trainer, local
mode), stream (the stream's model and ledger) and gba (a worker of a parameter server).
The caller hands it the handler of its mode (train_handlers.py: TrainerHandler.for_run,
StreamHandler, GBAHandler); it knows no mode by name. Like Beam's RunInference, the heavy
object is built by that small handler and shared by every DoFn instance in a process, so
that the training step and what follows it see the same model. Training is a sink in Beam
terms; its one output is what the handler makes of the merged statistics: a reference to
the checkpoint written once every batch has been trained on (local), or those statistics
(stream, gba).

A daily run (local mode) trains ONE model, whatever the runner and its number of workers
(the handler's one_trainer): decoding and packing run in parallel, and then one DoFn call
trains every packed batch in one trainer, in the order of their source positions, so that
the model is the same for any number of workers. Stream and gba train in each worker
process, bundle by bundle.
"""

from __future__ import annotations

from collections import Counter

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.shared import Shared
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from picasso.batch import PackedBatch
from picasso.connectors.beam_urls import serve_urls_through_beam
from picasso.pipelines.transforms.train_handlers import CheckpointRef, Trained, TrainHandler
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


class _TrainAllDoFn(beam.DoFn):
    """handler.one_trainer: the one element is the order keys of every element of the run,
    and this call trains them all, in that order, into one engine of its own; the elements
    are looked up by key in a multimap side input. Out: one Trained."""

    def __init__(self, handler: TrainHandler, shared: Shared):
        self.handler = handler
        self.shared = shared

    def process(self, keys: list, elements_by_key):
        # An engine of this attempt's own (a key of its own in Shared): a runner that retries
        # the bundle in this process trains a fresh one, from the same start (pinned when the
        # pipeline was built, see TrainerHandler.for_run), instead of training the day again
        # into the engine the failed attempt left behind.
        handler = self.handler.attempt()
        engine = handler.acquire(self.shared)
        stats = TrainStats()
        steps = handler.open_steps(engine)
        try:
            # Looked up here, in the bundle's thread (push, not Trainer.pipeline().run, whose
            # worker thread would pull): a side input is read over the bundle's state
            # channel, which the SDK binds to this thread. A key is listed once per element
            # that has it: elements sharing one are trained once each, in any order.
            for key, count in sorted(Counter(keys).items()):
                found = 0
                for element in elements_by_key[key]:
                    found += 1
                    for result in steps.push(element):
                        stats.add(result)
                if found != count:  # a lookup that missed would silently drop training
                    raise RuntimeError(f"{count} elements are keyed {key}, but the side input holds {found}")
            for result in steps.drain():
                stats.add(result)
        finally:
            steps.close()
        try:
            yield Trained(handler.key, stats)  # finish's steps run here, fused, while engine is held
        finally:
            handler.release(engine)


def _order_key(batch: PackedBatch) -> tuple:
    """Where a batch comes from: (source, position after it) pairs. Sorted, they are the
    order one worker reads a day in (its files in name order, each from its start)."""
    return tuple(sorted(batch.positions.items()))


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
    """PackedBatches in; what the handler makes of their training out.

    With a TrainerHandler (TrainerHandler.for_run: the daily run's), one CheckpointRef, once
    all of them are trained on. With a GBAHandler (a gba_train.PSAddress and the spec),
    every worker process of the runner trains as one GBA worker of that parameter server
    instead; the output is then the merged TrainStats and the checkpoint is the server's
    (gba_train.py). The stream's handlers (StreamHandler, JoinedStreamHandler) output the
    merged TrainStats too. shared= is the Shared the engine lives in, for a caller that
    holds the engine too (the stream keeps its model across cycles).

    unbounded=True (an endless job's: a handler with runs_unbounded, a GBAHandler): the
    output is each step's TrainStats, never merged: a global combine after an unbounded
    source would never fire, and would hold a partial result per bundle for as long as the
    job runs."""

    def __init__(self, handler: TrainHandler, *, shared: Shared | None = None, unbounded: bool = False):
        super().__init__()
        if unbounded and not handler.runs_unbounded:
            raise ValueError(f"an unbounded PicassoTrain trains against a parameter server (a GBAHandler), "
                             f"not with a {type(handler).__name__}")
        self.unbounded = unbounded
        self.handler = handler
        self.shared = Shared() if shared is None else shared

    def expand(self, batches):
        if self.handler.one_trainer:
            return self.handler.finish(self._train_together(batches), self.shared)
        stats = batches | "TrainStep" >> beam.ParDo(_TrainDoFn(self.handler, self.shared))
        if self.unbounded:
            return stats
        return self.handler.finish(stats | "MergeStats" >> beam.CombineGlobally(_MergeStats()), self.shared)

    def _train_together(self, batches):
        """Every batch to one trainer, in a fixed order: the batches keyed by their source
        positions become a multimap side input, and their keys, gathered into one list
        (one element, [] for a run with no batch), are the main input of the one call that
        trains them all. A GroupByKey under one key would gather them too, but hands them
        over in the order they reached the shuffle, which the workers' timing decides: the
        model, and its AUC by a few thousandths on a small day, would vary from run to run.

        What it costs: training starts once every batch is packed (a barrier), and each
        batch is encoded and decoded on its way. The trainer's worker looks each batch up
        when it is due and holds a few of them; Dataflow and Flink serve the lookups from
        the side input they materialize. The FnApiRunner keeps the whole side input in
        the runner's (driver's) process memory: every packed training batch of the run,
        encoded, about three times over (its buffer, the per-key and the key-value state
        entries), and decoded once while it sorts them by key. For a day of 54k Criteo
        rows (20 MB of packed batches) its peak RSS rose by about 80 MB, where the fused
        pipeline this replaced held a few batches at a time. The key list is small (one
        tuple per batch)."""
        keyed = batches | "ByPosition" >> beam.Map(lambda batch: (_order_key(batch), batch))
        return (
            keyed
            | "Keys" >> beam.Keys()
            | "AllKeys" >> beam.combiners.ToList()
            | "TrainStep" >> beam.ParDo(_TrainAllDoFn(self.handler, self.shared),
                                        beam.pvalue.AsMultiMap(keyed))
        )


class _ScoreDoFn(beam.DoFn):
    def __init__(self, spec: FeatureSpec, config: TrainConfig, shared: Shared):
        self.spec = spec
        self.config = config
        self.shared = shared

    def setup(self):
        serve_urls_through_beam()  # the checkpoint may be a URL (as in TrainHandler.acquire)

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
