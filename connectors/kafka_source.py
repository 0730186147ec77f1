"""ReadFromKafka: a Splittable DoFn over topic partitions, on kafka-python or librdkafka
(the connection's client: connectors.kafka_clients).

Beam's own ReadFromKafka needs a Java expansion service (a download); this one is plain
Python. One element per partition; its restriction is an offset range.

- Bounded: from start positions up to the end positions taken when the transform is built
  (a bounded Beam cycle of `picasso stream`).
- Unbounded: from start positions on, for streaming runners. The reader hands its
  remainder back to the runner every `resume_every_s`, and the watermark follows the
  message timestamps. An element is also cut short when its oldest message has waited
  `max_delay_s` (a slow stream's element would otherwise wait to fill), so unbounded cut
  points depend on timing: a re-read may cut differently.

Each output element is one Messages: up to `max_messages` consecutive messages of one
partition (one element per poll, not one per message: Beam costs about 8 µs per element).
Elements cover contiguous position ranges ([start, next_position)), so a consumer of them
can prove that it saw every offset once. In bounded mode the cut points are a pure
function of the start position (every `max_messages` messages), not of network timing,
so a cycle that is re-run after a crash sees the very same elements.

A partition's restriction is never split: its messages must reach the trainer in order.
Work is spread across partitions up front, which is also what keeps the FnApiRunner with
several local workers from dropping self-checkpointed remainders (see FACTS.md).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.utils.timestamp import Duration, Timestamp
from kafka import TopicPartition

from picasso.connectors.broker_outage import broker_watch
from picasso.connectors.element_coder import register_sized_coder
from picasso.connectors.kafka_readers import open_reader
from picasso.connectors.kafka_codecs import CodecUnavailable, check_codecs, naming_missing_codec
from picasso.connectors.kafka_config import KafkaConnection, source_name

log = logging.getLogger(__name__)

UNBOUNDED = sys.maxsize
# Set, every unbounded read in this process ends once it holds nothing read and not yet
# emitted: what stops an endless job on a local runner (its SIGTERM). A streaming service
# drains a job its own way, by truncating the reads' restrictions.
_DRAIN = threading.Event()


def drain_unbounded_reads() -> None:
    _DRAIN.set()


def undrain_unbounded_reads() -> None:
    """Before a new job in this process: its reads run until drained again."""
    _DRAIN.clear()

# Large fetches: one poll then brings thousands of messages (or many Arrow IPC messages).
FETCH_SETTINGS = {"fetch_max_bytes": 64 * 1024 * 1024, "max_partition_fetch_bytes": 16 * 1024 * 1024}


@dataclass(frozen=True)
class PartitionRange:
    topic: str
    partition: int
    start: int
    stop: int = UNBOUNDED  # exclusive; UNBOUNDED in unbounded mode

    @property
    def source(self) -> str:
        return source_name(self.topic, self.partition)


@register_sized_coder
@dataclass(frozen=True)
class Messages:
    """Consecutive messages of one partition: one element of ReadFromKafka."""

    topic: str
    partition: int
    start: int  # position this element's range begins at
    next_position: int  # position after it (past any offsets that held no message)
    offsets: list[int] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)  # ms, as stamped by the producer/broker

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def source(self) -> str:
        return source_name(self.topic, self.partition)

    @property
    def nbytes(self) -> int:
        """Bytes of the payloads, plus a little per message for its offset and timestamp."""
        return sum(map(len, filter(None, self.values))) + sum(map(len, filter(None, self.keys))) + 16 * len(self)


class SourceStalled(RuntimeError):
    """A bounded read made no progress for too long (the broker is gone, say)."""


def bounded_ranges(connection: KafkaConnection, topics: Iterable[str], positions: dict[str, int],
                   max_per_partition: int | None = None) -> list[PartitionRange]:
    """Every partition of the topics, from its position (the earliest offset when there is
    none) up to its latest offset now, capped at max_per_partition offsets."""
    reader = open_reader(connection)
    try:
        partitions = reader.partitions(topics)
        # Before the end offsets: their lookup leaves a fetch waiting at each partition's
        # end (up to fetch_max_wait_ms), which a request on the same connection waits behind.
        beginnings = reader.beginning_offsets(partitions)
        # The lookup fetches the last batch of each partition, which may be compressed.
        with naming_missing_codec(f"{', '.join(sorted(set(topics)))} (looking up the end offsets)"):
            ends = reader.latest_offsets(partitions)
    finally:
        reader.close()
    ranges = []
    for tp in partitions:
        start = positions.get(source_name(tp.topic, tp.partition), beginnings[tp])
        stop = max(start, ends[tp])  # an end behind the checkpoint (a wiped topic) reads nothing
        if max_per_partition:
            stop = min(stop, start + max_per_partition)
        ranges.append(PartitionRange(tp.topic, tp.partition, start, stop))
    return ranges


class _Restrictions(RestrictionProvider):
    def initial_restriction(self, element: PartitionRange) -> OffsetRange:
        return OffsetRange(element.start, element.stop)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def split(self, element, restriction):
        yield restriction  # never split a partition up front: its order is the training order

    def restriction_size(self, element, restriction: OffsetRange) -> int:
        return restriction.size()


class _ReadPartitionDoFn(beam.DoFn):
    def __init__(self, connection: KafkaConnection, max_messages: int, stall_timeout_s: float, resume_every_s: float,
                 max_delay_s: float):
        self.connection = connection
        self.max_messages = max_messages
        self.stall_timeout_s = stall_timeout_s
        self.resume_every_s = resume_every_s
        self.max_delay_s = max_delay_s

    def setup(self):
        self.reader = open_reader(self.connection, **{**FETCH_SETTINGS, **self.connection.options})

    def teardown(self):
        self.reader.close()

    def process(
        self,
        element: PartitionRange,
        tracker=beam.DoFn.RestrictionParam(_Restrictions()),
        watermark=beam.DoFn.WatermarkEstimatorParam(ManualWatermarkEstimator.default_provider()),
    ):
        try:
            yield from self._read(element, tracker, watermark)
        except CodecUnavailable:
            # kafka-python spins for ever in the next poll of a consumer whose fetch failed
            # to decompress: should this DoFn be reused, it must poll a fresh one.
            self.teardown()
            self.setup()
            raise

    def _read(self, element: PartitionRange, tracker, watermark):
        bounded = element.stop != UNBOUNDED
        # A bounded read that stalls fails its cycle, which says the retry; an unbounded one
        # waits for the broker, and its watch says each retry (connectors/broker_outage.py).
        watch = None if bounded else broker_watch(self.connection.bootstrap_servers)
        reader = _PartitionReader(self.reader, element, tracker, self.max_messages, watch)
        started = last_progress = time.monotonic()
        while not reader.done:
            batch = reader.read(flush_partial=not bounded, max_delay_s=None if bounded else self.max_delay_s)
            if batch is not None:
                if batch.timestamps:
                    newest = Timestamp(micros=max(batch.timestamps) * 1000)
                    if watermark.current_watermark() is None or newest > watermark.current_watermark():
                        watermark.set_watermark(newest)
                yield beam.window.TimestampedValue(batch, newest if batch.timestamps else Timestamp(0))
                # Time spent downstream (a first training step, say) is not a stalled fetch.
                last_progress = time.monotonic()
            elif reader.progressed:
                last_progress = time.monotonic()
            now = time.monotonic()
            if bounded and now - last_progress > self.stall_timeout_s:
                raise SourceStalled(f"{element.source}: no progress at position {reader.fetched} "
                                    f"(reading up to {reader.stop}) for {self.stall_timeout_s:.0f}s")
            if not bounded and _DRAIN.is_set() and reader.empty:
                # Claiming past the end finishes the restriction: the runner resumes nothing.
                tracker.try_claim(reader.stop)
                return
            if not bounded and now - started > self.resume_every_s and reader.empty:
                # Hand the rest back to the runner; it resumes from the next unclaimed offset.
                tracker.defer_remainder(Duration(seconds=0))
                return


class _PartitionReader:
    """Polls one partition into Messages cut every max_messages messages.

    A poll may bring more than one element's worth (whole record batches, see
    connectors.kafka_blocks, or librdkafka's queue): what lies past a cut point waits in the
    reader for the next element, so cut points stay a pure function of the start position.
    """

    def __init__(self, reader, element: PartitionRange, tracker, max_messages: int, watch=None):
        self.reader = reader
        self.watch = watch  # a BrokerWatch, told of each poll
        self.tracker = tracker
        self.max_messages = max_messages
        self.tp = TopicPartition(element.topic, element.partition)
        self.batch_start = tracker.current_restriction().start  # where the next element begins
        self.fetched = self.batch_start  # offsets below it are waiting here or already emitted
        self.done = self.fetched >= self.stop
        self.progressed = False
        self.held_since = time.monotonic()  # when the oldest message held was fetched
        self._clear()
        reader.assign(self.tp, self.fetched)

    @property
    def stop(self) -> int:
        return self.tracker.current_restriction().stop

    @property
    def empty(self) -> bool:
        return not self.offsets and self.fetched == self.batch_start

    def _clear(self):
        self.offsets, self.values, self.keys, self.timestamps = [], [], [], []

    def read(self, flush_partial: bool, max_delay_s: float | None = None) -> Messages | None:
        """Poll (unless a full element is already waiting); a Messages when a cut point (or
        the end) is reached, else None. flush_partial: also when a poll brings nothing;
        max_delay_s: also when the oldest message held has waited this long (a slow stream's
        batch would otherwise wait to fill, and the model's freshness with it)."""
        stop = self.stop
        got = 0
        self.progressed = False
        if len(self.offsets) < self.max_messages and self.fetched < stop:
            got = self._poll(stop)
        full = len(self.offsets) >= self.max_messages
        at_end = self.fetched >= stop
        overdue = max_delay_s is not None and self.offsets and time.monotonic() - self.held_since >= max_delay_s
        if not (full or at_end or (flush_partial and not got and self.offsets) or overdue):
            return None
        return self._emit()

    def _poll(self, stop: int) -> int:
        with naming_missing_codec(f"{source_name(self.tp.topic, self.tp.partition)} at offset {self.fetched}"):
            polled = self.reader.poll(self.tp, self.max_messages - len(self.offsets), timeout_s=0.2)
        block = polled.block
        if self.watch is not None:
            self.watch.after_poll(len(block), self.reader.connected)
        before = self.fetched
        if len(block) and block.offsets[-1] >= stop:
            self.fetched = stop
        else:
            self.fetched = max(self.fetched, min(polled.position, stop))
        # A fetch answers with whole batches, which may begin before the position asked for.
        block = block.between(before, stop)
        self.progressed = self.fetched > before
        if not self.offsets and len(block):
            self.held_since = time.monotonic()
        self.offsets += block.offsets.tolist()
        self.values += block.values
        self.keys += block.keys
        self.timestamps += block.timestamps.tolist()
        return len(block)

    def _emit(self) -> Messages | None:
        n = min(len(self.offsets), self.max_messages)
        # Cut inside what was fetched: the element ends after its last message.
        position = self.offsets[n - 1] + 1 if n < len(self.offsets) else self.fetched
        if position == self.batch_start:
            return None
        if not self.tracker.try_claim(position - 1):
            # The runner split the restriction: what lies below the new stop is still ours.
            stop = self.stop
            n = sum(1 for offset in self.offsets[:n] if offset < stop)
            position = self.fetched = stop
            self.offsets, self.values, self.keys, self.timestamps = (
                self.offsets[:n], self.values[:n], self.keys[:n], self.timestamps[:n])
        batch = Messages(self.tp.topic, self.tp.partition, self.batch_start, position,
                         self.offsets[:n], self.values[:n], self.keys[:n], self.timestamps[:n])
        self.offsets, self.values, self.keys, self.timestamps = (
            self.offsets[n:], self.values[n:], self.keys[n:], self.timestamps[n:])
        self.held_since = time.monotonic()  # for what is left held: fetched with the emitted ones, or later
        self.batch_start = position
        self.done = position >= self.stop
        return batch


class ReadFromKafka(beam.PTransform):
    """PartitionRanges (given, or looked up now) in; Messages out.

    connection: bootstrap servers, the client, and any consumer settings in kafka-python's
      names (SASL, SSL, ...).
    max_messages: messages per element at most (a cut point every max_messages messages).
    stall_timeout_s: a bounded read that makes no progress for this long fails, so that
      a cycle against a dead broker ends cleanly instead of hanging.
    """

    def __init__(self, connection: KafkaConnection, ranges: list[PartitionRange], max_messages: int = 1000,
                 stall_timeout_s: float = 30.0, resume_every_s: float = 1.0, max_delay_s: float = 0.5):
        super().__init__()
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        self.connection = connection
        self.ranges = list(ranges)
        self.max_messages = max_messages
        self.stall_timeout_s = stall_timeout_s
        self.resume_every_s = resume_every_s
        self.max_delay_s = max_delay_s

    @classmethod
    def bounded(cls, connection: KafkaConnection, topics: Iterable[str], positions: dict[str, int] | None = None,
                max_per_partition: int | None = None, **kwargs) -> "ReadFromKafka":
        """From positions (default: the earliest offsets) to the latest offsets now."""
        return cls(connection, bounded_ranges(connection, topics, positions or {}, max_per_partition), **kwargs)

    @classmethod
    def unbounded(cls, connection: KafkaConnection, topics: Iterable[str], positions: dict[str, int] | None = None,
                  **kwargs) -> "ReadFromKafka":
        ranges = bounded_ranges(connection, topics, positions or {})
        return cls(connection, [PartitionRange(r.topic, r.partition, r.start) for r in ranges], **kwargs)

    def expand(self, pbegin):
        check_codecs()  # a missing codec's package is named before the first batch needs it
        return (
            pbegin
            | "Partitions" >> beam.Create(self.ranges)
            | "Read" >> beam.ParDo(_ReadPartitionDoFn(self.connection, self.max_messages, self.stall_timeout_s,
                                                      self.resume_every_s, self.max_delay_s)).with_output_types(Messages)
        )
