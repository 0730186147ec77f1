"""How picasso reaches a Kafka cluster: one set of client settings for every client it makes.

Settings pass through to kafka-python as kafka-python takes them (bootstrap_servers,
security_protocol, sasl_mechanism, sasl_plain_username, ssl_cafile, ...). The consumer, the
producer and the admin client each accept a different subset, and kafka-python refuses
keys it does not know, so each client gets the keys it knows; a key that no client knows
is an error at start, named.

It also holds the one offset lookup that must not be done naively: end offsets.
"""

from __future__ import annotations

from collections.abc import Iterable
import time
from dataclasses import dataclass, field

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from picasso.connectors.kafka_client_logs import apply_client_logs
from picasso.connectors.kafka_clients import KAFKA_PYTHON, require_client

_KINDS = {"consumer": KafkaConsumer, "producer": KafkaProducer, "admin": KafkaAdminClient}


@dataclass(frozen=True)
class KafkaConnection:
    bootstrap_servers: str
    # Anything else kafka-python takes: SASL, SSL, timeouts, fetch sizes, client_id, ...
    options: dict = field(default_factory=dict)
    # The client the stream's reads use (connectors.kafka_clients); the options keep
    # kafka-python's names whichever it is.
    client: str = KAFKA_PYTHON

    def __post_init__(self):
        require_client(self.client)
        known = set().union(*(cls.DEFAULT_CONFIG for cls in _KINDS.values()))
        unknown = sorted(set(self.options) - known)
        if unknown:
            raise ValueError(f"unknown Kafka client setting(s): {', '.join(unknown)}")

    def settings(self, kind: str, **overrides) -> dict:
        """The settings a client of this kind accepts; overrides win over options."""
        # Every kafka-python client picasso makes comes here, in whichever process (a Beam
        # worker's too): the command's choice of the clients' own log lines holds there.
        apply_client_logs()
        accepted = _KINDS[kind].DEFAULT_CONFIG
        merged = {**self.options, **overrides, "bootstrap_servers": self.bootstrap_servers}
        return {key: value for key, value in merged.items() if key in accepted}

    def consumer(self, **overrides) -> KafkaConsumer:
        # Never auto-commit: positions live in picasso's checkpoint, and a consumer that
        # commits on its own re-trains or skips data after a crash.
        return KafkaConsumer(**self.settings("consumer", enable_auto_commit=False, **overrides))

    def producer(self, **overrides) -> KafkaProducer:
        return KafkaProducer(**self.settings("producer", **overrides))

    def admin(self, **overrides) -> KafkaAdminClient:
        return KafkaAdminClient(**self.settings("admin", **overrides))


class TopicNotFound(RuntimeError):
    pass


def topics_missing_message(missing: Iterable[str], existing: Iterable[str], bootstrap_servers: str) -> str:
    """"topic 'x' does not exist at HOST:PORT; the topics there: a, b". Internal topics
    (named _... or __..., such as __consumer_offsets) are left out of the list."""
    missing = list(missing)
    shown = sorted(topic for topic in existing if not topic.startswith("_"))
    names = ", ".join(f"'{topic}'" for topic in missing)
    what = f"topic {names} does not exist" if len(missing) == 1 else f"topics {names} do not exist"
    return f"{what} at {bootstrap_servers}; the topics there: {', '.join(shown) or 'none'}"


def topic_partitions(consumer: KafkaConsumer, topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of the topics, in (topic, partition) order; a missing topic is an
    error (in a running stream the cycle retries it: a broker that has just restarted may
    not know it yet; commands check their topics before they start: connectors.kafka_wait)."""
    out = []
    for topic in topics:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            servers = consumer.config["bootstrap_servers"]
            servers = servers if isinstance(servers, str) else ",".join(servers)
            raise TopicNotFound(topics_missing_message([topic], consumer.topics(), servers))
        out += [TopicPartition(topic, p) for p in sorted(partitions)]
    return out


def latest_offsets(consumer: KafkaConsumer, partitions: list[TopicPartition], timeout_s: float = 10.0) -> dict[TopicPartition, int]:
    """The offset after the last message of each partition.

    end_offsets() alone is not enough: Tansu answers with the start of the last record batch
    plus one (49,950 for 50,000 records), which would skip the tail of every partition. The
    high watermark of a fetch is right, so fetch once from near the reported end and take the
    larger of the two; on a real Kafka both agree.
    """
    reported = consumer.end_offsets(partitions)
    consumer.unsubscribe()  # forgets the high watermarks of an earlier lookup
    consumer.assign(partitions)
    for tp in partitions:
        consumer.seek(tp, max(0, reported[tp] - 1))
    deadline = time.monotonic() + timeout_s
    while any(consumer.highwater(tp) is None for tp in partitions):
        if time.monotonic() > deadline:
            missing = [f"{tp.topic}/{tp.partition}" for tp in partitions if consumer.highwater(tp) is None]
            raise TimeoutError(f"no fetch answer for {', '.join(missing)} within {timeout_s}s")
        consumer.poll(timeout_ms=200, max_records=1)
    return {tp: max(reported[tp], consumer.highwater(tp)) for tp in partitions}


def source_name(topic: str, partition: int) -> str:
    """How a partition is named in positions, ledgers and dead letters."""
    return f"{topic}/{partition}"


def ensure_topic(connection: KafkaConnection, topic: str, partitions: int) -> int:
    """Create the topic if it does not exist; returns its partition count."""
    admin = connection.admin()
    try:
        if topic not in admin.list_topics():
            try:
                admin.create_topics([NewTopic(topic, partitions, 1)])
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()
    consumer = connection.consumer()
    try:
        deadline = time.monotonic() + 10
        while not consumer.partitions_for_topic(topic):
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic '{topic}' did not appear")
            time.sleep(0.1)
            consumer.topics()  # refresh metadata
        return len(consumer.partitions_for_topic(topic))
    finally:
        consumer.close()
