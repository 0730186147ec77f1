"""The Kafka client a stream reads with: kafka-python (the default) or confluent-kafka.

What the stream needs from a consumer is small, and is all here, as PartitionReader:
the partitions of its topics, each partition's first and latest offsets, and, one
partition at a time, an assignment at a position and polls of raw records. Positions,
ledgers, dead letters and cut points are picasso's own (connectors.kafka_source, the
checkpoint), so a reader never commits and never joins a group: either client gives the
same elements for the same positions.

- kafka-python (connectors.kafka_python_reader): pure Python, reads record batches whole
  (connectors.kafka_blocks).
- confluent (connectors.confluent_reader): librdkafka, a C client that fetches in a
  thread of its own; an install extra (`pip install 'picasso-stage[confluent]'`).

Only the reads go through the chosen client. The broker wait before a command starts
(connectors.kafka_wait), the best-effort commit of positions to the consumer group and the
dead-letter producer stay on kafka-python, which is always installed.

This module is the contract alone, below the connection's settings (kafka_config, which
names its client) and both readers; connectors.kafka_readers.open_reader opens the one
a connection names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations alone: the command line takes CLIENTS without loading kafka-python
    from kafka import TopicPartition

    from picasso.connectors.kafka_record_batches import RecordBlock

KAFKA_PYTHON, CONFLUENT = "kafka-python", "confluent"
CLIENTS = (KAFKA_PYTHON, CONFLUENT)
CONFLUENT_PIN = "confluent-kafka==2.16.1"


class ClientUnavailable(ValueError):
    """The client asked for is not installed: bad input (exit 2), one line saying what to install."""


class KafkaReadFailed(ConnectionError):
    """The client could not do what a read asked of the broker (no broker answered, an
    error fetching a partition). A ConnectionError: a stream's cycle retries it, as it
    does kafka-python's errors (pipelines.runs.cycle_failures)."""


@dataclass(frozen=True)
class Polled:
    """What one poll of a partition brought."""

    block: RecordBlock  # its records, in offset order; a fetch may begin before the position asked for
    position: int  # where the client reads on from: past the last record, and past offsets that held none


class PartitionReader(Protocol):
    def partitions(self, topics) -> list[TopicPartition]:
        """Every partition of the topics, in (topic, partition) order; TopicNotFound names a missing topic."""

    def beginning_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]: ...

    def latest_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The offset after each partition's last message: the larger of the offset the
        broker reports and the high watermark of a fetch (Tansu under-reports the first)."""

    def offsets_for_times(self, partitions: list[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int | None]:
        """What the broker says is each partition's first offset stamped at or after
        timestamp_ms (None: no such message). Not every broker answers right (Tansu says
        0): connectors.kafka_times checks the answer against the records."""

    def assign(self, tp: TopicPartition, position: int) -> None:
        """Read this partition alone, from this position on."""

    def poll(self, tp: TopicPartition, max_records: int, timeout_s: float) -> Polled:
        """Records of the assigned partition, waiting up to timeout_s for the first. A
        client may hand over more than max_records (whatever it has fetched already)."""

    def connected(self) -> bool | None:
        """Whether the client holds a connection to a broker now, as far as it says (None:
        it cannot tell). Asked after polls that brought nothing (connectors.broker_outage)."""

    def close(self) -> None: ...


def require_client(client: str) -> None:
    """A client that is not known or not installed is refused at start, in one line."""
    if client not in CLIENTS:
        raise ValueError(f"unknown Kafka client {client!r}: one of {', '.join(CLIENTS)}")
    if client == CONFLUENT:
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            # No brackets (picasso-stage[confluent]): the commands print errors as rich markup.
            raise ClientUnavailable(f"--kafka-client confluent needs confluent-kafka, which is not installed here: "
                                    f"pip install {CONFLUENT_PIN} (picasso-stage's extra 'confluent')") from None

