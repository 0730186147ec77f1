"""A broker that goes away under a running stream: the Kafka clients' own lines stay quiet
(kafka-python's ERROR:kafka.* lines, librdkafka's), picasso says one line a retry in their
place and counts it (picasso_kafka_broker_retries_total), and the stream trains on once the
broker is back. --debug shows the clients' lines.

The streams are real `picasso stream` processes (in cycles, and --endless), on both Kafka
clients, against a Tansu broker of the test's own (kafka_broker.restartable_broker), which
it stops and starts again on the same port. Tansu keeps data in memory: after the restart
the test produces the same messages again (they land at the same offsets), then more.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from stream_helpers import fill_topic, json_messages, start_process, stream_command, wait_for, write_spec
from test_stream_broker_restart import trained_messages

from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.broker_outage import BrokerWatch
from picasso.connectors.kafka_client_logs import CLIENT_LOGGER, ENVIRONMENT, show_client_logs
from picasso.connectors.kafka_wait import BROKER_RETRIES
from picasso.connectors.testing.loopback import free_port

TOPIC = "client-lines"
MESSAGES = 200  # before the broker goes away; as many again once it is back
RETRY = re.compile(r"no Kafka broker at (\S+) \(connection refused\); retrying in ([0-9.]+) s$")
# What the clients log of their connections when they are not kept quiet: kafka-python's
# loggers by name (logging's default format names them), librdkafka's by its own, and the
# marks of their messages.
CLIENT_MARKS = ("ERROR:kafka.", "WARNING:kafka.", "INFO:kafka.", "kafka.net", "kafka.cluster", "kafka.librdkafka",
                "ECONNREFUSED", "KafkaConnectionError", "rdkafka#")
LIBRDKAFKA_LINE = re.compile(r"^%\d\|")  # librdkafka's own format, where nothing takes its log


def retry_lines(text: str, servers: str) -> list[str]:
    found = [m for m in (RETRY.search(line.strip()) for line in text.splitlines()) if m]
    assert {m.group(1) for m in found} <= {servers}, found
    return [m.group(0) for m in found]


PICASSO_LINE = re.compile(r"^[A-Z]+:picasso\.")  # picasso's own, which may name an error of the client's


def client_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not PICASSO_LINE.match(line)
            and (any(mark in line for mark in CLIENT_MARKS) or LIBRDKAFKA_LINE.match(line))]


def retries_counted(metrics_port: int) -> float:
    """picasso_kafka_broker_retries_total, as /metrics serves it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as response:
        text = response.read().decode()
    return next(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                if sample.name == "picasso_kafka_broker_retries_total")


def endless_trained(workdir: Path) -> int:
    """The messages the endless job's server has checkpointed (its positions)."""
    path = latest_checkpoint(workdir / "checkpoints")
    return 0 if path is None else sum(load_checkpoint(path).positions.values())


def away_and_back(broker, command: list[str], log: Path, trained, metrics_port: int | None = None):
    """Run the command; once it trained what the topic holds, stop the broker until the
    stream said two retry lines, start it again with the same messages and as many more,
    and stop the stream (SIGTERM, exit 0) once it trained them all. What it logged from
    the broker's stop on, and the retries its metrics counted by then (None: no metrics_port)."""
    values = json_messages(2 * MESSAGES, stream=3)
    fill_topic(broker.bootstrap, TOPIC, values[:MESSAGES], partitions=2)
    process = start_process(command, log)
    counted = None
    try:
        wait_for(lambda: trained() == MESSAGES, process, "training before the broker goes away")
        mark = len(log.read_text())
        broker.stop()
        wait_for(lambda: len(retry_lines(log.read_text()[mark:], broker.bootstrap)) >= 2, process,
                 "two retry lines while the broker is away")
        broker.start()
        fill_topic(broker.bootstrap, TOPIC, values, partitions=2)  # what it held, at the same offsets, and more
        wait_for(lambda: trained() == 2 * MESSAGES, process, "training after the broker is back")
        if metrics_port is not None:
            counted = retries_counted(metrics_port)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=300) == 0, log.read_text()[-4000:]
    finally:
        if process.poll() is None:
            process.kill()
    return log.read_text()[mark:], counted


def cycle_command(tmp_path: Path, bootstrap: str, client: str, metrics_port: int) -> list[str]:
    # Lookups that give up within seconds: a cycle fails, and says so, soon after the broker goes.
    return stream_command(write_spec(tmp_path), bootstrap, TOPIC, tmp_path / "work", "--kafka-client", client,
                          "--publish-every", "0", "--idle-sleep", "0.2", "--backoff", "0.2", "--backoff-max", "1",
                          "--stall-timeout", "3", "--kafka-option", "bootstrap_timeout_ms=2000",
                          "--kafka-option", "request_timeout_ms=5000", "--metrics-port", f"127.0.0.1:{metrics_port}")


def endless_command(tmp_path: Path, bootstrap: str, client: str, *extra: str) -> list[str]:
    return stream_command(write_spec(tmp_path), bootstrap, TOPIC, tmp_path / "work", "--endless",
                          "--kafka-client", client, "--batch-messages", "50", "--checkpoint-every-s", "1",
                          "--publish-every", "0", *extra)


# -- real processes ------------------------------------------------------------------------


def test_a_cycle_stream_says_its_retries_and_none_of_the_clients_lines(restartable_broker, kafka_client, tmp_path):
    port = free_port()
    log = tmp_path / "stream.log"
    workdir = tmp_path / "work"
    after_stop, counted = away_and_back(restartable_broker, cycle_command(tmp_path, restartable_broker.bootstrap,
                                                                          kafka_client, port),
                                        log, lambda: trained_messages(workdir), metrics_port=port)
    assert not client_lines(log.read_text()), client_lines(log.read_text())[:20]
    retries = retry_lines(after_stop, restartable_broker.bootstrap)
    assert len(retries) >= 2 and "Traceback" not in after_stop, after_stop[-4000:]
    assert counted == len(retry_lines(log.read_text(), restartable_broker.bootstrap))


def test_an_endless_job_says_its_retries_and_none_of_the_clients_lines(restartable_broker, kafka_client, tmp_path):
    port = free_port()
    log = tmp_path / "job.log"
    workdir = tmp_path / "work"
    command = endless_command(tmp_path, restartable_broker.bootstrap, kafka_client,
                              "--metrics-port", f"127.0.0.1:{port}")
    after_stop, counted = away_and_back(restartable_broker, command, log, lambda: endless_trained(workdir),
                                        metrics_port=port)
    assert not client_lines(log.read_text()), client_lines(log.read_text())[:20]
    retries = retry_lines(after_stop, restartable_broker.bootstrap)
    # The backoff of a command's wait at start: 1 s, doubling.
    assert [float(RETRY.search(line).group(2)) for line in retries[:2]] == [1, 2], retries
    assert f"the Kafka broker at {restartable_broker.bootstrap} answers again: reading on" in after_stop
    assert "Traceback" not in after_stop, after_stop[-4000:]
    assert counted == len(retries)


def test_debug_shows_the_clients_own_lines(restartable_broker, tmp_path):
    log = tmp_path / "job.log"
    workdir = tmp_path / "work"
    fill_topic(restartable_broker.bootstrap, TOPIC, json_messages(MESSAGES, stream=3), partitions=2)
    command = [*endless_command(tmp_path, restartable_broker.bootstrap, "kafka-python"), "--debug"]
    process = start_process(command, log)
    try:
        wait_for(lambda: endless_trained(workdir) == MESSAGES, process, "training before the broker goes away")
        mark = len(log.read_text())
        restartable_broker.stop()
        wait_for(lambda: client_lines(log.read_text()[mark:]) and retry_lines(log.read_text()[mark:],
                                                                               restartable_broker.bootstrap),
                 process, "the client's lines and picasso's while the broker is away")
        restartable_broker.start()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=300) == 0, log.read_text()[-4000:]
    finally:
        if process.poll() is None:
            process.kill()
    assert any(line.startswith(("ERROR:kafka.", "WARNING:kafka.")) for line in client_lines(log.read_text()))


# -- the watch, on a clock of the test's own -------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_watch_says_a_line_a_backoff_while_no_broker_answers_and_one_when_it_is_back():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        servers = f"127.0.0.1:{listener.getsockname()[1]}"  # bound, not listening: refused
        clock, said = Clock(), []
        watch = BrokerWatch(servers, said.append, clock)
        counted = BROKER_RETRIES.count
        asked = []

        def connected(answer):
            return lambda: asked.append(answer) or answer

        watch.after_poll(0, connected(True))  # an idle stream's client with its connection: nothing to say
        watch.after_poll(0, connected(None))  # a client that cannot tell: nothing either
        assert said == [] and asked == [True]  # asked at most once a CHECK_EVERY_S
        clock.now = 1.0
        watch.after_poll(0, connected(False))
        assert said == [f"no Kafka broker at {servers} (connection refused); retrying in 1 s"]
        for now in (1.1, 1.5, 1.9):  # polls within the backoff: no line
            clock.now = now
            watch.after_poll(0, connected(False))
        clock.now = 2.0
        watch.after_poll(0, connected(False))
        clock.now = 4.0
        watch.after_poll(0, connected(False))
        assert [RETRY.search(line).group(2) for line in said] == ["1", "2", "4"]
        assert BROKER_RETRIES.count - counted == 3
        listener.listen()  # the broker takes connections again
        clock.now = 8.0
        watch.after_poll(0, connected(False))
        assert said[-1] == f"the Kafka broker at {servers} answers again: reading on"
        clock.now = 9.5
        watch.after_poll(3, connected(True))  # records: nothing more to say
        assert len(said) == 4 and BROKER_RETRIES.count - counted == 3


def test_records_after_an_outage_say_it_is_over_and_the_backoff_starts_again():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        servers = f"127.0.0.1:{closed.getsockname()[1]}"
        clock, said = Clock(), []
        watch = BrokerWatch(servers, said.append, clock)
        watch.after_poll(0, lambda: False)
        clock.now = 1.0
        watch.after_poll(0, lambda: False)
        watch.after_poll(5, lambda: True)  # the client reconnected before the next try
        clock.now = 10.0
        watch.after_poll(0, lambda: False)
        assert [line.rsplit("retrying in ", 1)[-1] for line in said] == [
            "1 s", "2 s", f"the Kafka broker at {servers} answers again: reading on", "1 s"]


@pytest.fixture
def client_logger_restored(monkeypatch):
    monkeypatch.delenv(ENVIRONMENT, raising=False)
    logger = logging.getLogger(CLIENT_LOGGER)
    level = logger.level
    yield logger
    logger.setLevel(level)


def test_a_commands_choice_reaches_the_processes_it_starts(client_logger_restored):
    show_client_logs(False)
    assert os.environ[ENVIRONMENT] == "quiet" and client_logger_restored.level == logging.CRITICAL
    show_client_logs(True)  # --debug: the client's warnings and errors
    assert os.environ[ENVIRONMENT] == "shown" and client_logger_restored.level == logging.WARNING
