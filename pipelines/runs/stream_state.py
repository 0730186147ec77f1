"""The state a stream checkpoints: the trainer (model, optimizer, positions) and the ledger.

The ledger counts, per partition, what the model was trained on: the position range
covered, messages, records, samples and refused records, and the sum of the trained
messages' offsets. It is written into the same checkpoint directory as the weights, so it
describes exactly the model next to it. Spans must arrive back to back: a span that starts
before the partition's position would train messages twice, one that starts after it
would skip some; either one fails the cycle instead of being trained.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from picasso import storage
from picasso.batch import PackedBatch
from picasso.checkpoint import prune_checkpoints, read_checkpoint_file
from picasso.serving.publishing import registry_tags as tags
from picasso.pipelines.runs.lineage import stream_origin
from picasso.pipelines.runs.stream_publisher import VersionInfo
from picasso.pipelines.runs.stream_window import SCORED_FILE, ScoredWindow
from picasso.pipelines.transforms.message_spans import MessageSpan, PackedMessages
from picasso.spec import FeatureSpec
from picasso.trainer import StepResult, TrainConfig, Trainer


class SpanMismatch(RuntimeError):
    """A span that would train a message twice or skip one."""


@dataclass
class PartitionLedger:
    start: int  # the position training began at
    next_position: int
    messages: int = 0
    records: int = 0
    samples: int = 0
    refused: int = 0
    offset_sum: int = 0  # sum of the offsets trained: with `messages`, a fingerprint of which ones
    newest_timestamp_ms: int | None = None


@dataclass
class StreamLedger:
    partitions: dict[str, PartitionLedger] = field(default_factory=dict)
    cycles: int = 0
    # How a stream started with --warm-start or --start-at began (stream_start.start_record):
    # the model it took and the offsets it read from first; None for one that did not.
    start: dict | None = None

    def check(self, span: MessageSpan, position: int | None) -> None:
        """Raise unless span starts where the partition stands (its checkpointed position,
        or the previous span's end)."""
        entry = self.partitions.get(span.source)
        expected = entry.next_position if entry else position
        if expected is not None and span.start != expected:
            kind = "train offsets again" if span.start < expected else "skip offsets"
            raise SpanMismatch(f"{span.source}: span [{span.start}, {span.next_position}) would {kind}; "
                               f"the partition stands at {expected}")

    def record(self, span: MessageSpan, samples: int) -> None:
        entry = self.partitions.setdefault(span.source, PartitionLedger(start=span.start, next_position=span.start))
        entry.next_position = span.next_position
        entry.messages += span.messages
        entry.records += span.records_in
        entry.refused += span.records_refused
        entry.samples += samples
        entry.offset_sum += span.offset_sum
        if span.newest_timestamp_ms is not None:
            entry.newest_timestamp_ms = max(entry.newest_timestamp_ms or 0, span.newest_timestamp_ms)

    @property
    def newest_timestamp_ms(self) -> int | None:
        stamps = [p.newest_timestamp_ms for p in self.partitions.values() if p.newest_timestamp_ms is not None]
        return max(stamps) if stamps else None

    def to_dict(self) -> dict:
        return {"cycles": self.cycles, "partitions": {k: asdict(v) for k, v in sorted(self.partitions.items())},
                **({"start": self.start} if self.start else {})}

    @classmethod
    def from_dict(cls, data: dict) -> "StreamLedger":
        return cls({k: PartitionLedger(**v) for k, v in data.get("partitions", {}).items()}, data.get("cycles", 0),
                   data.get("start"))


class StreamModel:
    """A Trainer and its ledger, trained one PackedMessages at a time.

    Each batch is scored before it is trained on (prequential evaluation): the scores
    since the last publish (the window, kept in the checkpoint: stream_window.py) give the
    metrics of the next model version.
    """

    def __init__(self, trainer: Trainer, ledger: StreamLedger, checkpoint: str | None, window: ScoredWindow | None = None,
                 lineage: dict | None = None):
        self.trainer = trainer
        self.ledger = ledger
        self.checkpoint = checkpoint
        self.window = window or ScoredWindow()
        # The newest version of this stream's line, queued: its checkpoint and positions,
        # which the next version descends from and counts its offsets since (lineage.py);
        # None before any. Kept in the checkpoint's metrics beside the ledger.
        self.lineage = lineage
        self.keeps_window = True  # False: nothing will publish the window (StreamPublisher.adopt)

    @property
    def only_started(self) -> bool:
        """The checkpoint is the one a stream's start made (stream_start.begin_stream): the
        warm-start model, whose version exists already, with nothing trained since."""
        return self.ledger.cycles == 0 and self.ledger.start is not None

    def end_cycle(self) -> None:
        """A cycle of this model succeeded (before its checkpoint)."""

    def publish_extras(self) -> tuple[dict[str, float], dict[str, list], dict[str, str]]:
        """Metrics, per-step series and plots of a subclass for the next published
        version: those of its window."""
        return {}, {}, {}

    def version_info(self) -> VersionInfo:
        """What the version made of the last checkpoint says of this model: with its
        lineage, the version before it in this stream's line and the offsets since."""
        before = self.lineage or {}
        since = before.get("positions") or {s: p.start for s, p in self.ledger.partitions.items()}
        return VersionInfo("stream", f"stream-cycle-{self.ledger.cycles}",
                           {"newest_event_ms": self.ledger.newest_timestamp_ms, "cycle": self.ledger.cycles},
                           {tags.PARENT_CHECKPOINT: before.get("checkpoint") or "",
                            tags.ORIGIN: stream_origin(since, self.trainer.positions)})

    def versioned(self) -> None:
        """A version of the last checkpoint is queued: the next one descends from it."""
        self.lineage = {"checkpoint": self.checkpoint, "positions": dict(self.trainer.positions)}

    def reset_window(self) -> None:
        """A version now holds the window (its publish is queued): the next starts afresh."""
        self.window = ScoredWindow()

    def drop_window(self) -> None:
        """Keep no window: this stream never publishes, and a window would only grow."""
        self.keeps_window = False
        self.reset_window()

    def extra_files(self) -> dict[str, bytes]:
        """State committed in the same checkpoint as the model: the window (a subclass
        adds its own)."""
        return {SCORED_FILE: self.window.to_bytes()} if self.keeps_window else {}

    @classmethod
    def load(cls, spec: FeatureSpec, config: TrainConfig, root: str | Path) -> "StreamModel":
        trainer = Trainer(spec, config)
        path = trainer.warm_start(root)
        metrics = json.loads(storage.read_text(storage.join(path, "metrics.json"))) if path else {}
        ledger = StreamLedger.from_dict(metrics.get("ledger", {}))
        window = read_checkpoint_file(path, SCORED_FILE) if path else None
        return cls(trainer, ledger, path, ScoredWindow.from_bytes(window) if window else None, metrics.get("lineage"))

    def train(self, packed: PackedMessages) -> StepResult:
        span, batch = packed.span, packed.batch
        self.ledger.check(span, self.trainer.positions.get(span.source))
        result = self.score_and_train(batch)
        self.ledger.record(span, batch.num_samples)
        return result

    def score_and_train(self, batch: PackedBatch) -> StepResult:
        """Score the batch (for the window's metrics), then train on it: the scores are the
        model's before the step (Trainer.train_step_scored), whether or not the window is
        kept, so that no step depends on it."""
        loss_sum, scores = self.trainer.train_step_scored(batch)
        if batch.num_samples and self.keeps_window:
            self.window.add(batch.data.column("label").to_numpy(), scores)
        return StepResult(self.trainer.step, batch.num_samples, loss_sum, batch.positions)

    def window_metrics(self) -> dict[str, float]:
        """Prequential metrics of the window: since the last publish."""
        return self.window.metrics()

    def save(self, root: str | Path, keep: int = 3) -> str:
        """Checkpoint model, optimizer, positions and ledger at once; keep the newest `keep`.

        Every save is a new checkpoint, a cycle whose every message was refused (positions
        moved, no step) included."""
        metrics = {"ledger": self.ledger.to_dict(), "samples": self.trainer.samples,
                   **({"lineage": self.lineage} if self.lineage else {})}
        self.checkpoint = self.trainer.save_checkpoint(root, metrics=metrics, extra=self.extra_files())
        prune_checkpoints(root, keep)
        return self.checkpoint


@dataclass(frozen=True)
class ModelLoader:
    """Builds a StreamModel from the newest checkpoint (picklable, for Shared.acquire)."""

    spec: FeatureSpec
    config: TrainConfig
    checkpoint_dir: str

    def __call__(self) -> StreamModel:
        return StreamModel.load(self.spec, self.config, self.checkpoint_dir)
