"""`picasso produce`: replay day files into a topic, as JSON events, Arrow IPC messages or
TSV lines, at a given rate. For demos, tests and benchmarks.

Messages go round-robin over the topic's partitions by their index, so replaying the same
files always puts the same messages at the same offsets. Each message is stamped with its
send time (the freshness benchmark measures from it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.json as pa_json

from picasso.connectors.day_files import format_of, list_day_files, read_chunks
from picasso.connectors.kafka_config import KafkaConnection, ensure_topic
from picasso.connectors.message_formats import encode_arrow, encode_json

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
