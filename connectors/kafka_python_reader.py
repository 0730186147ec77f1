"""PartitionReader on kafka-python: the stream's reads as they have always been made."""

from __future__ import annotations

from kafka import TopicPartition

from picasso.connectors.kafka_blocks import blocks_of, use_blocks
from picasso.connectors.kafka_clients import Polled
from picasso.connectors.kafka_config import KafkaConnection, latest_offsets, topic_partitions


class KafkaPythonReader:
    def __init__(self, connection: KafkaConnection, **overrides):
        self.consumer = connection.consumer(**overrides)
        self.blocks = use_blocks(self.consumer)

    def partitions(self, topics) -> list[TopicPartition]:
        return topic_partitions(self.consumer, topics)

    def beginning_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return self.consumer.beginning_offsets(partitions)

    def latest_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return latest_offsets(self.consumer, partitions)

    def offsets_for_times(self, partitions: list[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int | None]:
        found = self.consumer.offsets_for_times({tp: timestamp_ms for tp in partitions})
        return {tp: None if found.get(tp) is None else found[tp].offset for tp in partitions}

    def assign(self, tp: TopicPartition, position: int) -> None:
        self.consumer.assign([tp])
        self.consumer.seek(tp, position)

    def poll(self, tp: TopicPartition, max_records: int, timeout_s: float) -> Polled:
        # Block mode takes everything the fetcher holds, so that kafka-python sends the
        # next fetch now and the broker prepares it while this one is decoded.
        wanted = 1 << 20 if self.blocks else max_records
        records = self.consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=wanted)
        return Polled(blocks_of(records.get(tp, [])), self.consumer.position(tp))

    def connected(self) -> bool | None:
        # kafka-python's own count of its open connections (None: its metrics are off).
        count = self.consumer.metrics().get("consumer-metrics", {}).get("connection-count")
        return None if count is None else count > 0

    def close(self) -> None:
        self.consumer.close()
