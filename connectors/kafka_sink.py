"""The dead-letter topic: every refused Kafka message, as it arrived, with where and why.

A dead-letter record keeps the original key and value bytes untouched (so it can be
replayed once fixed) and says in its headers which topic, partition and offset it came
from, why it was refused, and how many of its records were refused (an Arrow IPC message
carries many). Writes are flushed at the end of each bundle: a cycle whose dead letters
could not be written fails and is retried, so none is lost. A retried cycle may write a
dead letter twice; the (topic, partition, offset) headers make duplicates easy to drop.
"""

from __future__ import annotations

from dataclasses import dataclass

import apache_beam as beam

from picasso.connectors.kafka_config import KafkaConnection, source_name

MAX_REASON_BYTES = 4096


@dataclass(frozen=True)
class MessageDeadLetter:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None  # the message exactly as it arrived
    timestamp_ms: int
    reason: str
    records: int = 1  # refused records in this message (rows of an Arrow IPC message)

    @property
    def source(self) -> str:
        return source_name(self.topic, self.partition)

    def headers(self) -> list[tuple[str, bytes]]:
        return [
            ("picasso.topic", self.topic.encode()),
            ("picasso.partition", str(self.partition).encode()),
            ("picasso.offset", str(self.offset).encode()),
            ("picasso.reason", self.reason.encode()[:MAX_REASON_BYTES]),
            ("picasso.records", str(self.records).encode()),
        ]

    @classmethod
    def from_record(cls, record) -> "MessageDeadLetter":
        """Read one back from a consumed dead-letter record."""
        headers = {key: value.decode() for key, value in record.headers}
        return cls(
            topic=headers["picasso.topic"],
            partition=int(headers["picasso.partition"]),
            offset=int(headers["picasso.offset"]),
            key=record.key,
            value=record.value,
            timestamp_ms=record.timestamp,
            reason=headers["picasso.reason"],
            records=int(headers["picasso.records"]),
        )


class _WriteDeadLettersDoFn(beam.DoFn):
    def __init__(self, connection: KafkaConnection, topic: str):
        self.connection = connection
        self.topic = topic

    def setup(self):
        # acks=all and no retries hidden from us: a failed write fails the bundle.
        self.producer = self.connection.producer(acks="all", linger_ms=20)

    def process(self, letter: MessageDeadLetter):
        self.producer.send(self.topic, key=letter.key, value=letter.value, headers=letter.headers(),
                           timestamp_ms=letter.timestamp_ms or None)

    def finish_bundle(self):
        self.producer.flush()

    def teardown(self):
        self.producer.close(timeout=5)


class WriteDeadLettersToKafka(beam.PTransform):
    """MessageDeadLetters in; each becomes one record of the dead-letter topic."""

    def __init__(self, connection: KafkaConnection, topic: str):
        super().__init__()
        self.connection = connection
        self.topic = topic

    def expand(self, letters):
        return letters | "Produce" >> beam.ParDo(_WriteDeadLettersDoFn(self.connection, self.topic))
