"""PartitionReader on confluent-kafka (librdkafka, `--kafka-client confluent`).

librdkafka fetches in a thread of its own and queues the messages; a poll here waits for
the first one and then takes whatever else is queued at once. The consumer is only ever
assigned partitions at positions: it joins no group and commits nothing (the group id
librdkafka insists on is never used).

The latest offsets are taken as kafka-python's are (connectors.kafka_config.latest_offsets):
the offset the broker reports (get_watermark_offsets, a ListOffsets request), and the
high watermark of a fetch from just before it (librdkafka caches each fetch answer's);
Tansu under-reports the first. The fetch is waited for, partition by partition (a record,
or the partition's end: enable.partition.eof): until it answers, the cached value may be
an older fetch's, from when the partition was last read, and an endless job that took it
would wait for ever under a record it believes is not there yet. Errors of the broker or of a fetch are KafkaReadFailed,
which a stream's cycle retries; bad settings are a ValueError at start.

A broker that goes away is not an error of a poll: librdkafka reconnects in its thread and
reports it to error_cb, which notes it for connected() (connectors.broker_outage says it
in picasso's words).
"""

from __future__ import annotations

import logging
import time

import numpy as np
from kafka import TopicPartition

from picasso.connectors.kafka_client_logs import apply_client_logs
from picasso.connectors.kafka_clients import CONFLUENT, KafkaReadFailed, Polled, require_client
from picasso.connectors.kafka_config import KafkaConnection, TopicNotFound, topics_missing_message
from picasso.connectors.librdkafka_config import LOOKUP_TIMEOUT, librdkafka_consumer_config
from picasso.connectors.kafka_record_batches import RecordBlock

# librdkafka's log lines come here (on poll), below kafka-python's logger, so that what
# quiets the client's lines in the commands (connectors.kafka_client_logs) quiets both.
_LOG = logging.getLogger("kafka.librdkafka")
UNKNOWN = -1001  # librdkafka's OFFSET_INVALID: no offset known (yet)


class ConfluentReader:
    def __init__(self, connection: KafkaConnection, **overrides):
        require_client(CONFLUENT)
        apply_client_logs()  # in a Beam worker process too (kafka-python's clients: KafkaConnection.settings)
        import confluent_kafka

        self._kafka = confluent_kafka
        self.servers = connection.bootstrap_servers
        # For each request a lookup makes (metadata, offsets, the first fetch); kafka-python's default.
        self.timeout_s = {**connection.options, **overrides}.get(LOOKUP_TIMEOUT, 30_000) / 1000
        overrides.pop("enable_auto_commit", None)  # never: positions live in picasso's checkpoint
        config = librdkafka_consumer_config(connection, **overrides)
        config.setdefault("group.id", "picasso")
        config |= {"enable.auto.commit": False, "enable.auto.offset.store": False, "logger": _LOG,
                   "enable.partition.eof": True,  # a fetch's answer at a partition's end (latest_offsets)
                   "error_cb": self._client_error}
        self._lost_brokers = False
        try:
            self.consumer = confluent_kafka.Consumer(config)
        except (confluent_kafka.KafkaException, ValueError, TypeError) as err:
            raise ValueError(f"--kafka-client confluent: {_reason(err)}") from None
        self.next_position: dict[TopicPartition, int] = {}

    def partitions(self, topics) -> list[TopicPartition]:
        metadata = self._ask("list its topics", lambda: self.consumer.list_topics(timeout=self.timeout_s))
        out = []
        for topic in topics:
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                raise TopicNotFound(topics_missing_message([topic], metadata.topics, self.servers))
            out += [TopicPartition(topic, p) for p in sorted(found.partitions)]
        return out

    def beginning_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._watermarks(tp)[0] for tp in partitions}

    def latest_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        reported = {tp: self._watermarks(tp)[1] for tp in partitions}
        self.consumer.assign([self._kafka.TopicPartition(tp.topic, tp.partition, max(0, reported[tp] - 1))
                              for tp in partitions])
        self.next_position.clear()
        answered: set[TopicPartition] = set()
        deadline = time.monotonic() + self.timeout_s
        while not answered.issuperset(partitions):
            if time.monotonic() > deadline:
                missing = [f"{tp.topic}/{tp.partition}" for tp in partitions if tp not in answered]
                raise TimeoutError(f"no fetch answer for {', '.join(missing)} within {self.timeout_s:g}s")
            message = self.consumer.poll(0.2)  # its record is not wanted: that the fetch answered is
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() != self._kafka.KafkaError._PARTITION_EOF:
                raise KafkaReadFailed(f"{self.servers}: {message.topic()}/{message.partition()}: {error.str()}")
            answered.add(TopicPartition(message.topic(), message.partition()))
        return {tp: max(reported[tp], self._cached_high(tp)) for tp in partitions}

    def offsets_for_times(self, partitions: list[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int | None]:
        asked = [self._kafka.TopicPartition(tp.topic, tp.partition, timestamp_ms) for tp in partitions]
        found = self._ask(f"look up the offsets at {timestamp_ms} ms",
                          lambda: self.consumer.offsets_for_times(asked, timeout=self.timeout_s))
        # librdkafka's answer for a time past the last message is -1 (OFFSET_END).
        return {TopicPartition(f.topic, f.partition): None if f.offset < 0 else f.offset for f in found}

    def assign(self, tp: TopicPartition, position: int) -> None:
        self.consumer.assign([self._kafka.TopicPartition(tp.topic, tp.partition, position)])
        self.next_position = {tp: position}

    def poll(self, tp: TopicPartition, max_records: int, timeout_s: float) -> Polled:
        first = self.consumer.poll(timeout_s)
        if first is None:
            return Polled(_EMPTY, self._position_when_idle(tp))
        # No more than asked for: librdkafka fetches ahead in its own thread anyway, and
        # what a poll brings past the element's cut waits in the caller, sliced at every cut.
        messages = self.consumer.consume(max_records - 1, timeout=0) if max_records > 1 else []
        messages.insert(0, first)
        failed = [m for m in messages if m.error() is not None]
        if failed:
            error = failed[0].error()
            if error.code() != self._kafka.KafkaError._PARTITION_EOF:
                raise KafkaReadFailed(f"{self.servers}: {failed[0].topic()}/{failed[0].partition()}: {error.str()}")
            messages = [m for m in messages if m.error() is None]
        # Only the assigned partition's: librdkafka drops what an earlier assignment
        # fetched, and this makes sure of it.
        mine = [m for m in messages if m.partition() == tp.partition and m.topic() == tp.topic]
        if not mine:
            return Polled(_EMPTY, self.next_position[tp])
        block = RecordBlock(
            np.fromiter([m.offset() for m in mine], np.int64, len(mine)),
            np.fromiter([m.timestamp()[1] for m in mine], np.int64, len(mine)),
            [m.key() for m in mine],
            [m.value() for m in mine],
        )
        self.next_position[tp] = max(self.next_position[tp], int(block.offsets[-1]) + 1)
        return Polled(block, self.next_position[tp])

    def _position_when_idle(self, tp: TopicPartition) -> int:
        """Where the partition reads on from when nothing is queued for it: librdkafka's
        own position moves past offsets that hold no message for the application (a
        transaction's marker, say), which the records alone never show. Taken only when
        idle and up to the last fetch's high watermark, so it never passes a record that
        is still on its way."""
        known = self.next_position[tp]
        position = self.consumer.position([self._kafka.TopicPartition(tp.topic, tp.partition)])[0].offset
        high = self._cached_high(tp)
        if position > known and high != UNKNOWN:
            self.next_position[tp] = known = min(position, high)
        return known

    def _cached_high(self, tp: TopicPartition) -> int:
        return self.consumer.get_watermark_offsets(self._kafka.TopicPartition(tp.topic, tp.partition),
                                                   cached=True)[1]

    def _watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        what = f"look up the offsets of {tp.topic}/{tp.partition}"
        found = self._ask(what, lambda: self.consumer.get_watermark_offsets(
            self._kafka.TopicPartition(tp.topic, tp.partition), timeout=self.timeout_s, cached=False))
        if found is None:  # confluent-kafka's answer to a timeout
            raise KafkaReadFailed(f"no answer from the Kafka broker at {self.servers} to {what} "
                                  f"within {self.timeout_s:g} s")
        return found

    def _ask(self, what: str, call):
        try:
            return call()
        except self._kafka.KafkaException as err:
            raise KafkaReadFailed(f"no answer from the Kafka broker at {self.servers} to {what} "
                                  f"(librdkafka: {_reason(err)})") from None

    def connected(self) -> bool:
        """False once after librdkafka reported, since the last time asked, that it lost its
        connections (a transport failure, or every broker down)."""
        lost, self._lost_brokers = self._lost_brokers, False
        return not lost

    def _client_error(self, error) -> None:  # librdkafka's error_cb, called in a poll
        if error.code() in (self._kafka.KafkaError._TRANSPORT, self._kafka.KafkaError._ALL_BROKERS_DOWN):
            self._lost_brokers = True
        else:
            _LOG.error("%s", error.str())  # as librdkafka logs an error no callback takes

    def close(self) -> None:
        self.consumer.close()


_EMPTY = RecordBlock(np.zeros(0, np.int64), np.zeros(0, np.int64), [], [])


def _reason(err: BaseException) -> str:
    first = err.args[0] if err.args else err
    return first.str() if hasattr(first, "str") else str(first)
