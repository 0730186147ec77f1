"""`picasso produce`: replay day files into a topic, as JSON events, Arrow IPC messages or
TSV lines, at a given rate. For demos, tests and benchmarks.

Messages go round-robin over the topic's partitions by their index, so replaying the same
files always puts the same messages at the same offsets. Each message is stamped with its
send time (the freshness benchmark measures from it).

The joined replay (replay_events) sends what `picasso generate --events` wrote: the
impressions into one topic and the clicks into another, merged in event-time order as
serving would have logged them, each message stamped with its event's `event_time_ms` (the
join refuses an event time far past its poll's newest message timestamp). `speedup`
paces them: event time runs that many times faster than the wall clock, so a day of
traffic replays in minutes; 0 sends as fast as the client goes.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from picasso import storage
from picasso.connectors.day_files import UnreadableFile, format_of, list_day_files, read_chunks
from picasso.connectors.kafka_config import KafkaConnection, ensure_topic
from picasso.connectors.decoding.message_formats import encode_arrow, encode_json
from picasso.connectors.synthetic.events import EVENT_TIME, IMPRESSIONS, LABELS


def _arrow(table: pa.Table, rows: int) -> list[tuple[bytes, int]]:
    return list(zip(encode_arrow(table, rows), [b.num_rows for b in table.to_batches(max_chunksize=rows)]))


def _jsonl_table(lines: list[bytes]) -> pa.Table:
    return pa_json.read_json(pa.py_buffer(b"\n".join(lines)))


# (day-file format, message format) -> (value, records in it) for each message of a chunk
_CONVERSIONS = {
    ("parquet", "json"): lambda chunk, n: [(v, 1) for v in encode_json(chunk)],
    ("jsonl", "json"): lambda chunk, n: [(v, 1) for v in chunk],
    ("parquet", "arrow"): lambda chunk, n: _arrow(chunk, n),
    ("jsonl", "arrow"): lambda chunk, n: _arrow(_jsonl_table(chunk), n),
    ("tsv", "tsv"): lambda chunk, n: [(v, 1) for v in chunk],
}


@dataclass(frozen=True)
class ProduceConfig:
    connection: KafkaConnection
    topic: str
    data_root: str
    dates: tuple[str, ...]
    fmt: str = "json"  # json | arrow | tsv
    rows_per_message: int = 1000  # arrow only
    rate: float = 0.0  # records (events) per second; 0: as fast as the client goes
    partitions: int = 1  # when the topic has to be created
    max_records: int | None = None


@dataclass(frozen=True)
class ProduceResult:
    topic: str
    messages: int
    records: int
    seconds: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


def message_values(config: ProduceConfig) -> Iterator[tuple[bytes, int]]:
    """(value, records in it) for every message, file after file, in order."""
    left = config.max_records
    for date in config.dates:
        for path in list_day_files(config.data_root, date):
            convert = _CONVERSIONS.get((format_of(path), config.fmt))
            if convert is None:
                raise ValueError(f"{path}: cannot produce {format_of(path)} day files as {config.fmt} messages")
            for chunk in read_chunks(path, 8192):
                records = chunk.records
                if left is not None:
                    records = records[:left] if isinstance(records, list) else records.slice(0, left)
                pairs = convert(records, config.rows_per_message)
                yield from pairs
                if left is not None:
                    left -= sum(size for _, size in pairs)
                    if left <= 0:
                        return


def count_records(root: str, dates: Iterable[str]) -> int:
    """The records of the dates' day files, as produce sends them: a Parquet file's rows
    (from its footer), a text file's lines. For the progress lines' total: reading only
    the footers and counting newlines costs a fraction of sending."""
    total = 0
    for date in dates:
        for path in list_day_files(root, date):
            with storage.open_read(path) as f:
                if format_of(path) == "parquet":
                    total += pq.ParquetFile(f).metadata.num_rows
                    continue
                last = b"\n"
                while block := f.read(1 << 20):
                    total += block.count(b"\n")
                    last = block[-1:]
                total += last != b"\n"  # a last line without its newline
    return total


def produce_total(config: ProduceConfig) -> int:
    """How many records produce(config) sends."""
    total = count_records(config.data_root, config.dates)
    return total if config.max_records is None else min(total, config.max_records)


def produce(config: ProduceConfig, on_progress: Callable[[int], None] = lambda records: None) -> ProduceResult:
    partitions = ensure_topic(config.connection, config.topic, config.partitions)
    producer = config.connection.producer(linger_ms=20, batch_size=512 * 1024, acks="all")
    started = time.perf_counter()
    messages = records = 0
    try:
        for value, size in message_values(config):
            if config.rate > 0:
                ahead = started + records / config.rate - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)
            producer.send(config.topic, value=value, partition=messages % partitions)
            messages += 1
            records += size
            on_progress(size)
        producer.flush()
    finally:
        producer.close(timeout=10)
    return ProduceResult(config.topic, messages, records, time.perf_counter() - started)


@dataclass(frozen=True)
class EventReplayConfig:
    connection: KafkaConnection
    data_root: str  # the root `picasso generate --events` wrote (impressions/, labels/)
    dates: tuple[str, ...]
    impressions_topic: str
    labels_topic: str
    speedup: float = 0.0  # event time runs this many times faster than the wall clock; 0: no pacing
    partitions: int = 1  # when a topic has to be created
    max_records: int | None = None  # events over both topics

    def __post_init__(self):
        if not (self.speedup >= 0 and math.isfinite(self.speedup)):
            raise ValueError(f"the speedup must be a number >= 0 (0: as fast as possible), got {self.speedup!r}")
        if self.impressions_topic == self.labels_topic:
            raise ValueError(f"impressions and labels need topics of their own, got {self.labels_topic!r} for both")


@dataclass(frozen=True)
class EventReplayResult:
    impressions_topic: str
    labels_topic: str
    impressions: int
    labels: int
    first_event_ms: int | None  # None: nothing was sent
    last_event_ms: int | None
    seconds: float

    @property
    def records_per_s(self) -> float:
        return (self.impressions + self.labels) / self.seconds if self.seconds else 0.0


def event_trees(data_root: str) -> tuple[str, str]:
    """The impressions and labels roots under what `picasso generate --events` wrote."""
    roots = tuple(storage.join(data_root, tree) for tree in (IMPRESSIONS, LABELS))
    for tree, root in zip((IMPRESSIONS, LABELS), roots):
        if not storage.exists(root):
            raise FileNotFoundError(f"{data_root} has no {tree}/ tree: a joined replay reads a root that "
                                    "`picasso generate --events` wrote")
    return roots


def replay_total(config: EventReplayConfig) -> int:
    """How many events replay_events(config) sends, impressions and labels together."""
    total = sum(count_records(root, config.dates) for root in event_trees(config.data_root))
    return total if config.max_records is None else min(total, config.max_records)


def pacing_wait_s(first_event_ms: int, started_s: float, event_ms: int, now_s: float, speedup: float) -> float:
    """How long to hold an event so that event time, counted from the first event (sent at
    started_s), runs `speedup` times faster than the wall clock: 0 once it is due.

    The schedule is absolute, so a replay that fell behind (a slow send) catches up by
    sending at once rather than drifting later and later; speedup 0 never holds.
    """
    if speedup <= 0:
        return 0.0
    due_s = started_s + (event_ms - first_event_ms) / 1000 / speedup
    return max(0.0, due_s - now_s)


@dataclass
class EventTimePacer:
    """Holds each event until its time is due (pacing_wait_s); the clock and the sleep are
    injectable so that tests can check the pacing without waiting."""

    speedup: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    _first: tuple[float, int] | None = field(default=None, init=False)  # (wall s, event ms) of the first event

    def hold(self, event_ms: int) -> None:
        if self.speedup <= 0:
            return
        now = self.clock()
        if self._first is None:
            self._first = (now, event_ms)
        wait = pacing_wait_s(self._first[1], self._first[0], event_ms, now, self.speedup)
        if wait > 0:
            self.sleep(wait)


def timed_values(root: str, date: str) -> Iterator[tuple[int, bytes]]:
    """(event_time_ms, JSON message value) of one date partition's events, in file order,
    which must be event-time order: the merge of the partitions relies on it."""
    latest = None
    for path in list_day_files(root, date):
        fmt = format_of(path)
        for chunk in read_chunks(path, 8192):
            if isinstance(chunk, UnreadableFile):
                raise ValueError(chunk.reason)
            if fmt == "parquet":
                values, times = encode_json(chunk.records), _table_times(chunk.records, path)
            elif fmt == "jsonl":
                values, times = chunk.records, _jsonl_times(chunk.records, path)
            else:
                raise ValueError(f"{path}: events are replayed from parquet or jsonl day files, not {fmt}")
            if len(times) and ((latest is not None and times[0] < latest) or np.any(np.diff(times) < 0)):
                raise ValueError(f"{path}: events are not in event-time order (rows {chunk.first_row} on)")
            if len(times):
                latest = int(times[-1])
            yield from zip(times.tolist(), values)


def _table_times(table: pa.Table, path: str) -> np.ndarray:
    if EVENT_TIME not in table.column_names:
        raise ValueError(f"{path} has no {EVENT_TIME} column: not an event partition of `picasso generate --events`")
    column = table.column(EVENT_TIME)
    if column.null_count:
        raise ValueError(f"{path}: {column.null_count} events without {EVENT_TIME}")
    return column.to_numpy().astype(np.int64)


def _jsonl_times(lines: list[bytes], path: str) -> np.ndarray:
    """Only the event time of each line: the features are passed on as they are."""
    options = pa_json.ParseOptions(explicit_schema=pa.schema([(EVENT_TIME, pa.int64())]),
                                   unexpected_field_behavior="ignore")
    return _table_times(pa_json.read_json(pa.py_buffer(b"\n".join(lines)), parse_options=options), path)


def merged_events(config: EventReplayConfig) -> Iterator[tuple[int, str, bytes]]:
    """(event_time_ms, topic, value) of every impression and label of the dates, in event
    time; at equal times impressions come first, then earlier dates first.

    A lazy k-way merge: a date's late clicks (just past midnight) interleave with the next
    date's first events without the days being read into memory.
    """
    impressions, labels = event_trees(config.data_root)
    streams = [_tagged(topic, timed_values(root, date))
               for root, topic in ((impressions, config.impressions_topic), (labels, config.labels_topic))
               for date in config.dates]
    return heapq.merge(*streams, key=lambda event: event[0])  # stable: ties keep the streams' order


def _tagged(topic: str, events: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, str, bytes]]:
    for event_ms, value in events:
        yield event_ms, topic, value


def replay_events(config: EventReplayConfig, on_progress: Callable[[int], None] = lambda records: None,
                  pacer: EventTimePacer | None = None) -> EventReplayResult:
    """Send the merged events; each topic's messages go round-robin over its partitions by
    index, as in produce, so a replay always puts the same events at the same offsets."""
    topics = (config.impressions_topic, config.labels_topic)
    partitions = {topic: ensure_topic(config.connection, topic, config.partitions) for topic in topics}
    pacer = pacer or EventTimePacer(config.speedup)
    producer = config.connection.producer(linger_ms=20, batch_size=512 * 1024, acks="all")
    started = time.perf_counter()
    sent = dict.fromkeys(topics, 0)
    first = last = None
    try:
        for event_ms, topic, value in itertools.islice(merged_events(config), config.max_records):
            pacer.hold(event_ms)
            producer.send(topic, value=value, partition=sent[topic] % partitions[topic], timestamp_ms=event_ms)
            sent[topic] += 1
            first = event_ms if first is None else first
            last = event_ms
            on_progress(1)
        producer.flush()
    finally:
        producer.close(timeout=10)
    return EventReplayResult(config.impressions_topic, config.labels_topic, sent[config.impressions_topic],
                             sent[config.labels_topic], first, last, time.perf_counter() - started)
