"""The state of a joined stream: the model and, in the same checkpoint, the join.

`picasso stream --impressions T1 --labels T2` builds its samples itself
(picasso.sample_join.join_state). Between two cycles the join holds impressions that wait for their
label, labels that wait for their impression, and samples emitted but not yet trained (a
training batch is a fixed number of samples, drawn from a window of several batches'
worth: picasso.sample_join.sample_buffer). All of it is written into the checkpoint directory next
to the weights, the optimizer, the positions and the ledger, and committed with them: a
cycle that fails or is killed leaves no trace, and its re-run from the checkpoint
re-joins the very same samples and trains the very same batches.

The watermark of the bounded cycles is event time: the oldest newest event time of the
partitions, less the allowed lateness (CycleClock).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pyarrow as pa

from picasso.batch import PackedBatch
from picasso.checkpoint import read_checkpoint_file
from picasso.connectors.join_events import JoinDecoders
from picasso.connectors.metric_plots import label_delay_svg
from picasso.sample_join.delayed_feedback import late_share
from picasso.sample_join.join_spec import JoinSpec
from picasso.pipelines.runs.stream_state import StreamModel
from picasso.pipelines.runs.stream_window import JOIN_FILE, JoinWindow
from picasso.sample_join.sample_buffer import SampleBuffer
from picasso.sample_join.join_rules import JoinCounts, OrphanLabel, event_watermark
from picasso.sample_join.join_state import JoinState, sample_schema
from picasso.spec import FeatureSpec
from picasso.trainer import TrainConfig

READY_FILE = "join-ready.arrow"  # samples emitted, not yet trained
PARTITIONS_FILE = "join-partitions.json"  # each partition's newest event time


@dataclass(frozen=True)
class JoinedTopics:
    """Which topic carries what, and how the two are joined."""

    impressions: str
    labels: str
    join: JoinSpec

    def params(self) -> dict[str, str]:
        """The run parameters of a published version."""
        join = self.join
        return {"impressions": self.impressions, "labels": self.labels, "join_key": ",".join(join.key),
                "label_wait_ms": str(join.wait_ms), "late_labels": join.late_labels}

    def __post_init__(self):
        if self.impressions == self.labels:
            raise ValueError(f"impressions and labels must come from two topics, not both from {self.impressions!r}")


@dataclass
class CycleClock:
    """Event time for the join of a stream's bounded cycles: each partition's newest event
    time, and the watermark they give.

    The watermark is the oldest newest time of every partition seen so far, less the
    allowed lateness (join_rules.event_watermark); None while a partition this cycle reads
    has shown no event yet (its first ones may be older than the others').

    A partition with nothing to read this cycle holds it back too. Leaving such a one out
    would let the others move the watermark past events it has yet to deliver, and which
    partitions have nothing to read depends on when a cycle begins: the same events, cut
    into other cycles, would be joined otherwise (a label read after the watermark passed
    its impression's timeout is late, not a positive; one read after its horizon, an
    orphan). A partition counts from its first event on, so that an empty one stops
    nothing; its first events must then not be older than the watermark the others have
    made (see the README's join section).

    But a partition that stops receiving events would stop the join's clock for good: no
    impression would time out into a negative, and pending ones would pile up. So one
    with nothing to read for `idle_after_ms` of wall-clock time (the spec's
    `join.idle_after`) is idle and holds the watermark no longer, until it has messages
    again (Flink's source idleness). The join is then only as deterministic as the
    partitions are live; 0 never counts a partition idle."""

    allowed_lateness_ms: int
    newest: dict[str, int] = field(default_factory=dict)
    reading: set[str] = field(default_factory=set)
    idle_after_ms: int = 0
    wall_clock: Callable[[], float] = time.monotonic  # seconds
    # Per partition, the wall-clock time it last had messages to read (or this process first
    # saw it: a restart counts its idleness afresh).
    last_read: dict[str, float] = field(default_factory=dict)

    def begin_cycle(self, reading: set[str]) -> None:
        """The partitions this cycle reads (those with messages to read)."""
        self.reading = set(reading)
        now = self.wall_clock()
        self.last_read.update(dict.fromkeys(self.reading, now))
        for source in self.newest:
            self.last_read.setdefault(source, now)

    def observe(self, source: str, times: np.ndarray) -> None:
        """The event times of one poll of `source`."""
        if len(times):
            newest = int(times.max())
            self.newest[source] = max(self.newest.get(source, newest), newest)

    def watermark(self) -> int | None:
        if any(source not in self.newest for source in self.reading):
            return None
        return event_watermark(self.holding(), self.allowed_lateness_ms)

    def holding(self) -> dict[str, int]:
        """The newest event times of the partitions that hold the watermark: every one seen,
        less the idle ones (all of them, should every one be idle)."""
        if not self.idle_after_ms:
            return self.newest
        now = self.wall_clock()
        live = {source: newest for source, newest in self.newest.items()
                if source in self.reading or (now - self.last_read.get(source, now)) * 1000 < self.idle_after_ms}
        return live or self.newest


@dataclass
class JoinedCycle:
    """What one cycle's join did: for its report and the published version's metrics."""

    counts: JoinCounts = field(default_factory=JoinCounts)
    delays_ms: list = field(default_factory=list)  # arrays of matched labels' delays


class JoinedStreamModel(StreamModel):
    """A StreamModel that joins before it trains. `take` turns one decoded poll into the
    training batches it completes (picasso.sample_join.sample_buffer: batch_rows samples each, mixed);
    `score_and_train` trains them."""

    def __init__(self, base: StreamModel, topics: JoinedTopics, decoders: JoinDecoders, join: JoinState,
                 ready: SampleBuffer, newest: dict[str, int], join_window: JoinWindow | None = None):
        super().__init__(base.trainer, base.ledger, base.checkpoint, base.window, base.lineage)
        self.topics = topics
        self.decoders = decoders
        self.join = join
        self.ready = ready
        self.clock = CycleClock(topics.join.allowed_lateness_ms, newest, idle_after_ms=topics.join.idle_after_ms)
        self.cycle = JoinedCycle()
        self.join_window = join_window or JoinWindow()  # the cycles since the last published version

    @classmethod
    def load_joined(cls, spec: FeatureSpec, config: TrainConfig, root: str, topics: JoinedTopics,
                    batch_rows: int) -> "JoinedStreamModel":
        base = StreamModel.load(spec, config, root)
        decoders = JoinDecoders(spec, topics.join)
        schema = decoders.feature_schema
        policy = topics.join.policy()
        files = {name: read_checkpoint_file(base.checkpoint, name) for name in JoinState.FILES} if base.checkpoint else {}
        window = None
        if files and all(files.values()):
            join = JoinState.from_files(files, schema, policy)
            ready = SampleBuffer.from_bytes(read_checkpoint_file(base.checkpoint, READY_FILE), sample_schema(schema),
                                            batch_rows)
            newest = json.loads(read_checkpoint_file(base.checkpoint, PARTITIONS_FILE))["newest_ms"]
            saved = read_checkpoint_file(base.checkpoint, JOIN_FILE)
            window = JoinWindow.from_bytes(saved) if saved else None
        elif base.checkpoint and base.ledger.partitions:
            raise ValueError(f"{base.checkpoint} was written by a stream without a join: its impressions "
                             "and labels were never joined (use a new --workdir)")
        else:
            join, ready, newest = JoinState(policy, schema), SampleBuffer(sample_schema(schema), batch_rows), {}
        return cls(base, topics, decoders, join, ready, newest, window)

    # -- a cycle -----------------------------------------------------------------------

    def begin_cycle(self, reading: set[str]) -> None:
        """The partitions this cycle reads (those with messages to read)."""
        self.clock.begin_cycle(reading)
        self.cycle = JoinedCycle()

    def take(self, chunk) -> tuple[list[pa.Table], list[OrphanLabel]]:
        """Join one decoded poll (a join_cycle.JoinEventChunk): the full training batches it
        completes, and the labels it gives up on. Its span must start where its partition
        stands, as for an unjoined stream."""
        span = chunk.span
        self.ledger.check(span, self.trainer.positions.get(span.source))
        events = chunk.events
        if events is not None:
            self.clock.observe(span.source, events.times)
        is_labels = chunk.topic == self.topics.labels
        out = self.join.advance(None if is_labels else events, events if is_labels else None, self.clock.watermark())
        self.trainer.positions[span.source] = span.next_position
        self.ledger.record(span, out.samples.num_rows)
        self.cycle.counts.add(out.counts)
        self.cycle.delays_ms.append(out.delays_ms)
        self.ready.add(out.samples)
        return self.ready.batches(), out.orphans

    def weighted(self, batch: PackedBatch) -> PackedBatch:
        """Under `correct`, the batch with the loss weights of late labels
        (picasso.sample_join.delayed_feedback), by the share of late clicks the join has seen so far."""
        if self.topics.join.late_labels != "correct":
            return batch
        counts = self.join.counts
        return batch.with_late_share(late_share(counts.positives, counts.late_labels))

    # -- what a published version reports ------------------------------------------------

    def held(self) -> dict[str, int]:
        """What the join holds now."""
        return {"pending": self.join.pending, "pending_bytes": self.join.nbytes(),
                "waiting_labels": self.join.waiting_labels, "ready_samples": self.ready.num_rows}

    def end_cycle(self) -> None:
        if self.keeps_window:
            self.join_window.add_cycle(self.ledger.cycles, self.cycle.counts, self.cycle.delays_ms, self.held())

    def publish_extras(self) -> tuple[dict[str, float], dict[str, list], dict[str, str]]:
        """The join since the last version: its counts, what it holds, the label delays'
        quantiles and their plot against W."""
        window, join = self.join_window, self.topics.join
        delays = window.delays()
        held = self.held()
        metrics = {f"join.{name}": float(value) for name, value in {**asdict(window.counts), **held}.items()}
        metrics["join.pending_bytes_per_impression"] = held["pending_bytes"] / max(held["pending"], 1)
        metrics["join.late_share"] = late_share(window.counts.positives, window.counts.late_labels)
        metrics["join.wait_s"] = join.wait_ms / 1000
        if len(delays):
            for q in (50, 90, 99):
                metrics[f"join.label_delay_p{q}_s"] = float(np.percentile(delays, q)) / 1000
        plots = {"label_delays.svg": label_delay_svg(delays.tolist(), join.wait_ms)}
        return metrics, window.series, plots

    def version_info(self):
        info = super().version_info()
        return replace(info, facts={**info.facts, "watermark_ms": self.join.watermark,
                                    "wait_ms": self.topics.join.wait_ms})

    def reset_window(self) -> None:
        super().reset_window()
        self.join_window = JoinWindow()

    # -- checkpoints -------------------------------------------------------------------

    def extra_files(self) -> dict[str, bytes]:
        window = {JOIN_FILE: self.join_window.to_bytes()} if self.keeps_window else {}
        return {**super().extra_files(), **window, **self.join.to_files(), READY_FILE: self.ready.to_bytes(),
                PARTITIONS_FILE: json.dumps({"newest_ms": self.clock.newest}, sort_keys=True).encode()}


@dataclass(frozen=True)
class JoinedModelLoader:
    """Builds a JoinedStreamModel from the newest checkpoint (picklable, for Shared.acquire)."""

    spec: FeatureSpec
    config: TrainConfig
    checkpoint_dir: str
    topics: JoinedTopics
    batch_rows: int

    def __call__(self) -> JoinedStreamModel:
        return JoinedStreamModel.load_joined(self.spec, self.config, self.checkpoint_dir, self.topics, self.batch_rows)
