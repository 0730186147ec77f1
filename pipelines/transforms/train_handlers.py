"""What PicassoTrain trains with in each mode: one small handler per mode.

PicassoTrain (train.py) is the same Beam transform in every mode, and the caller hands it
the handler of its mode; a handler tells it which engine to train (the heavy object, built
once per process), how a bundle pushes its elements through that engine, and what follows
the merged statistics. A new mode is a new handler here (and the run that builds it):
PicassoTrain itself has no list of modes.

- `TrainerHandler` (daily, local mode; TrainerHandler.for_run pins where a run starts):
  the engine is a picasso.Trainer, and there is one of it (one_trainer): every batch of
  the run is brought to one call that trains them all through Trainer.pipeline()
  (interleaved); its stats are followed by the checkpoint, and the output is a
  CheckpointRef.
- `StreamHandler` (one cycle of `picasso stream`): the engine is the stream's StreamModel;
  a step checks the span against the ledger, scores the batch, trains on it and records
  it; the stream runner checkpoints after the cycle, so the output is the merged stats.
- `GBAHandler` (gba): the engine is this process's worker of a running `picasso ps`
  (gba_train.py); a step pulls, computes and pushes; the checkpoint is the server's, so
  the output is the merged stats. The one handler that may train an unbounded collection
  (runs_unbounded: the endless job's).

Like the model handlers of Beam's RunInference, a handler is small and picklable: it
travels in the pipeline's graph, and each worker process builds its engine from it.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import apache_beam as beam
from apache_beam.utils.shared import Shared

from picasso.batch import PackedBatch
from picasso.checkpoint import latest_checkpoint
from picasso.connectors.beam_urls import serve_urls_through_beam
from picasso.distributed.worker import WorkerStats
from picasso.pipelines.transforms.gba_train import PSAddress, acquire_member, release_member
from picasso.spec import FeatureSpec
from picasso.trainer import StepResult, TrainConfig, Trainer, TrainStats



class Steps(Protocol):
    """One bundle's steps. push may return a step that finished earlier than the element
    it was given (interleaving), drain returns the rest, and close ends the bundle."""

    def push(self, element: Any) -> Iterable[StepResult]: ...

    def drain(self) -> Iterable[StepResult]: ...

    def close(self) -> None: ...


class TrainHandler:
    """The contract between PicassoTrain and a mode. By default the engine is shared by every
    DoFn instance of the process through Shared, tagged by `key`, and lives while any of
    them holds it; a handler whose engine must be let go of explicitly overrides acquire
    and release."""

    key: str  # the Shared tag: a new key builds a new engine
    # False: each worker process trains its own engine on the bundles it is given (gba:
    # each is a worker of one parameter server; stream: one process). True: the run has
    # ONE engine, which trains every element: PicassoTrain brings them all to one call
    # (train._TrainAllDoFn), which trains them in a fixed order; finish then gets a Trained.
    one_trainer: ClassVar[bool] = False
    # True: nothing follows the last element (the model and its checkpoint are a parameter
    # server's), so PicassoTrain(unbounded=True) may train an unbounded collection with it.
    runs_unbounded: ClassVar[bool] = False

    def load(self) -> Any:
        raise NotImplementedError

    def acquire(self, shared: Shared) -> Any:
        # An engine loads and saves checkpoints, which may be URLs, in a worker process that
        # imports only the modules of its DoFns: nothing else has set up reading them.
        serve_urls_through_beam()
        return shared.acquire(self.load, tag=self.key)

    def release(self, engine: Any) -> None:
        """A DoFn instance is done with the engine (its teardown)."""

    def open_steps(self, engine: Any) -> Steps:
        raise NotImplementedError

    def finish(self, stats: beam.PCollection, shared: Shared) -> beam.PCollection:
        """What follows the one merged TrainStats (a Trained, with one_trainer): the
        transform's output."""
        return stats

    def attempt(self) -> "TrainHandler":
        """This handler under a key of its own, so that it builds an engine of its own: one
        attempt at training every element, with one_trainer. Handlers are frozen dataclasses."""
        return dataclasses.replace(self, key=f"{self.key}/{uuid.uuid4().hex}")


@dataclass(frozen=True)
class Trained:
    """What one_trainer's training step hands to finish: the stats of every step, and the
    key of the engine (in this process's Shared) that took them."""

    key: str
    stats: TrainStats


class _Unbuffered:
    """Steps that each finish within their push: nothing to drain or close."""

    def drain(self) -> list[StepResult]:
        return []

    def close(self) -> None:
        pass


# -- local: the daily run's trainer ----------------------------------------------------


@dataclass(frozen=True)
class CheckpointRef:
    path: str
    step: int
    stats: TrainStats


@dataclass(frozen=True)
class TrainerHandler(TrainHandler):
    """How to build the trainer a pipeline run trains: warm-started from the latest
    checkpoint under checkpoint_dir (start_from="latest", the default), from a given
    checkpoint directory, or from scratch (start_from=None)."""

    spec: FeatureSpec
    config: TrainConfig
    checkpoint_dir: str
    key: str  # one per pipeline run, so that runs sharing a process do not share a trainer
    start_from: str | None = "latest"
    # The partitions the checkpoint holds that no version has yet (its metrics' "partitions"):
    # how the next run knows what its version covers (pipelines/runs/daily.py, _covers).
    lineage: tuple[str, ...] = ()
    # The checkpoint of the version this run's model descends from ("" from scratch): the
    # next run's version may descend from it too, when this one makes none (daily._lineage).
    parent_checkpoint: str = ""
    # One model per run, whatever the runner and its number of workers: trainers in several
    # processes would each learn from part of the day, and only one could be saved.
    one_trainer: ClassVar[bool] = True

    @classmethod
    def for_run(cls, spec: FeatureSpec, config: TrainConfig, checkpoint_dir: str | Path,
                start_from: str | None = "latest", lineage: tuple[str, ...] = (),
                parent_checkpoint: str = "") -> "TrainerHandler":
        """The handler of one pipeline run: a key of its own, and its start pinned now, when
        the pipeline is built, so that every attempt at training (a retried bundle's too)
        starts from the same checkpoint, never from one an earlier attempt of this run wrote."""
        if spec is None or config is None or checkpoint_dir is None:
            raise ValueError("a TrainerHandler needs a spec, a train config and a checkpoint directory")
        if start_from == "latest":
            start_from = latest_checkpoint(checkpoint_dir)
        return cls(spec, config, str(checkpoint_dir), key=uuid.uuid4().hex, start_from=start_from,
                   lineage=tuple(lineage), parent_checkpoint=parent_checkpoint)

    def load(self) -> Trainer:
        trainer = Trainer(self.spec, self.config)
        if self.start_from == "latest":
            trainer.warm_start(self.checkpoint_dir)
        elif self.start_from is not None:
            trainer.restore(self.start_from)
        return trainer

    def open_steps(self, trainer: Trainer) -> Steps:
        # With interleaving on, a step computes in a worker thread while the trainer
        # prepares the next batch, and the training call looks up the one after it.
        return trainer.pipeline()

    def finish(self, trained: beam.PCollection, shared: Shared) -> beam.PCollection:
        # Fused with the training step (a ParDo right after it): the same bundle, so the same
        # process and the very trainer that trained.
        return trained | "Checkpoint" >> beam.ParDo(_CheckpointDoFn(self, shared))


class _CheckpointDoFn(beam.DoFn):
    def __init__(self, handler: TrainerHandler, shared: Shared):
        self.handler = handler
        self.shared = shared

    def process(self, trained: Trained):
        stats = trained.stats
        trainer = dataclasses.replace(self.handler, key=trained.key).acquire(self.shared)
        if trainer.step != trainer.start_step + stats.steps:
            # Not the trainer that trained: a runner that did not fuse this step with the
            # training ran it in another process, which built a fresh one; or several
            # trainers each trained part of the run. Saving it would silently drop training.
            raise RuntimeError(
                f"trainer holds {trainer.step - trainer.start_step} steps of this run, but {stats.steps} were trained"
            )
        # Stage times and cache counts go with the checkpoint; publishing logs them to the
        # MLflow run, the per-step series as charts.
        metrics = {"train_loss": stats.mean_loss, **trainer.performance_metrics(),
                   "step_metrics": trainer.step_metrics_so_far()}
        if self.handler.lineage:
            metrics["partitions"] = list(self.handler.lineage)
            metrics["parent_checkpoint"] = self.handler.parent_checkpoint
        path = trainer.save_checkpoint(self.handler.checkpoint_dir, metrics=metrics)
        yield CheckpointRef(path=str(path), step=trainer.step, stats=stats)


# -- stream: one cycle of `picasso stream` ---------------------------------------------


@dataclass(frozen=True)
class StreamHandler(TrainHandler):
    """The stream's model, kept across cycles: the stream runner holds it under the same
    Shared and key, and takes a new key to drop it after a failed cycle. Elements are
    PackedMessages. The checkpoint is the runner's, written after the cycle, once it has
    checked that the pipeline trained this very model (the messages_trained counter)."""

    loader: Callable[[], Any]  # a picklable stream_state.ModelLoader
    key: str

    def load(self):
        return self.loader()

    def open_steps(self, model) -> Steps:
        return _StreamSteps(model)


class _StreamSteps(_Unbuffered):
    """No interleaving: StreamModel.train scores a batch before it trains on it, and checks
    its span against the ledger first, so that a mismatch fails before any training."""

    def __init__(self, model):
        self.model = model
        self.trained = beam.metrics.Metrics.counter("picasso", "messages_trained")

    def push(self, packed) -> list[StepResult]:
        result = self.model.train(packed)
        self.trained.inc(packed.span.messages)
        return [result]


class JoinedStreamHandler(StreamHandler):
    """A joined stream's model (joined_stream_state.JoinedStreamModel). Elements are the
    PackedBatches of the samples its join emitted (join_cycle.PackSamples); the join
    step before has checked and recorded the spans."""

    def open_steps(self, model) -> Steps:
        return _JoinedSteps(model)


class _JoinedSteps(_Unbuffered):
    def __init__(self, model):
        self.model = model

    def push(self, batch: PackedBatch) -> list[StepResult]:
        return [self.model.score_and_train(self.model.weighted(batch))]


# -- gba: a worker of a running `picasso ps` -------------------------------------------


@dataclass(frozen=True)
class GBAHandler(TrainHandler):
    """Each worker process is one worker of the parameter server at `address`
    (gba_train.py). The model and its checkpoint are the server's."""

    address: PSAddress
    spec: FeatureSpec  # the spec the pipeline packs: the server refuses a worker of another
    runs_unbounded: ClassVar[bool] = True

    def __post_init__(self):
        if self.address is None or self.spec is None:
            raise ValueError("a GBAHandler needs the parameter server's address (a gba_train.PSAddress) and the "
                             "spec the pipeline packs (the model is the server's)")

    # Not through Shared: the member must leave the job when its last user goes, and Shared
    # never says when that is. gba_train keeps one counted member per process instead.
    def acquire(self, shared: Shared):
        return acquire_member(self.address, self.spec)

    def release(self, member) -> None:
        release_member()

    def open_steps(self, member) -> Steps:
        return _GBASteps(member)


class _GBASteps(_Unbuffered):
    def __init__(self, member):
        self.member = member
        self.stats = WorkerStats()  # the bundle's: the worker logs where its first batch starts

    def push(self, batch: PackedBatch) -> list[StepResult]:
        member, stats = self.member, self.stats
        samples, loss_sum = stats.samples, stats.loss_sum
        with member.lock:  # a PSClient is not thread-safe
            # After the budget is spent the batch is neither trained nor counted: its positions
            # stay unconsumed, so a resumed job reads it.
            if member.stopped or not member.worker.step(batch, stats):
                member.stopped = True
                return []
        # step: the worker's batches in this bundle (the model's step count is the server's)
        return [StepResult(stats.batches, stats.samples - samples, stats.loss_sum - loss_sum, batch.positions)]
