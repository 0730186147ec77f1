"""What the Kafka benchmarks share: a broker, the benchmark pinned to one core, topics.

The broker is a local Tansu process (or --bootstrap HOST:PORT). It is started before the
benchmark pins itself to one core, so the broker keeps the other one: what is measured is
the client side, on one core.
"""

from __future__ import annotations

import contextlib
import os

from picasso.connectors.kafka_config import KafkaConnection, ensure_topic
from picasso.connectors.local_broker import TansuBroker


@contextlib.contextmanager
def kafka_broker(bootstrap: str | None):
    """Yields a bootstrap address: the given one, or a Tansu broker started here."""
    if bootstrap:
        yield bootstrap
        return
    broker = TansuBroker().start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def pin_to_one_core() -> int | None:
    """Pin this process to one core (the lowest it may use); returns it."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def produce_all(connection: KafkaConnection, topic: str, values: list[bytes], partitions: int = 1) -> None:
    ensure_topic(connection, topic, partitions)
    producer = connection.producer(linger_ms=20, batch_size=512 * 1024)
    for i, value in enumerate(values):
        producer.send(topic, value=value, partition=i % partitions)
    producer.flush()
    producer.close()
