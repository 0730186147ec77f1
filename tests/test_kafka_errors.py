"""What `produce` and `stream` say when Kafka is not as they were told: one line a retry
while no broker answers (none of kafka-python's own lines, no traceback), exit 2 for
`produce` after --broker-timeout-s, and exit 2 naming the topics there for a topic that
does not exist, unless the stream is told to wait for it (--wait-for-topic)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys

import pytest
from helpers import CLI_PROCESS, refusal_in_process
from kafka.errors import KafkaTimeoutError
from kafka_broker import create_topic
from stream_helpers import fill_topic, json_messages, start_process, stream_command, wait_for, write_spec

from picasso.connectors.kafka_clients import KafkaReadFailed
from picasso.connectors.kafka_readers import open_reader
from picasso.connectors.kafka_config import KafkaConnection, TopicNotFound, topic_partitions
from picasso.connectors.kafka_source import bounded_ranges
from picasso.connectors.librdkafka_config import librdkafka_consumer_config
from picasso.connectors.kafka_wait import BrokerWait, BrokerWaiter, KafkaUnreachable, TopicsMissing, check_topics
from picasso.pipelines.runs.cycle_failures import OUTSIDE, classify, retry_line

RETRY = re.compile(r"^no Kafka broker at (\S+) \(connection refused\); retrying in ([0-9.]+) s$")
# What kafka-python logs of a failed connection, a dozen lines a try, when it is not kept quiet.
CLIENT_LINES = ("ECONNREFUSED", "Bootstrap", "kafka.net", "KafkaConnectionError")


@pytest.fixture
def free_port() -> int:
    """A loopback port where nothing listens: bound to find it free, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _retry_lines(text: str) -> list[re.Match]:
    return [m for m in (RETRY.match(line.strip()) for line in text.splitlines()) if m]


def _assert_quiet(text: str) -> None:
    assert "Traceback" not in text, text[-3000:]
    assert not [line for line in text.splitlines() if any(mark in line for mark in CLIENT_LINES)], text[-3000:]


# -- no broker -----------------------------------------------------------------------------


def test_the_wait_says_one_line_a_retry_and_gives_up_after_its_timeout(free_port):
    clock, said = FakeClock(), []
    waiter = BrokerWaiter(KafkaConnection(f"127.0.0.1:{free_port}"), BrokerWait(timeout_s=10, max_backoff_s=4),
                          said.append, sleep=clock.sleep, clock=lambda: clock.now)
    with pytest.raises(KafkaUnreachable, match=rf"no Kafka broker at 127.0.0.1:{free_port} \(connection refused\) "
                                               r"within 10 s"):
        waiter.topics()
    # Backoff 1, 2, 4, then capped at 4 and at what is left of the 10 s.
    assert [float(RETRY.match(line).group(2)) for line in said] == [1, 2, 4, 3]
    assert all(RETRY.match(line).group(1) == f"127.0.0.1:{free_port}" for line in said)
    assert sum(clock.sleeps) == 10


def test_a_wait_that_is_stopped_ends_without_an_error(free_port):
    clock, said = FakeClock(), []
    waiter = BrokerWaiter(KafkaConnection(f"127.0.0.1:{free_port}"), BrokerWait(), said.append,
                          stopped=lambda: len(said) >= 2, sleep=clock.sleep, clock=lambda: clock.now)
    assert waiter.topics() is None and len(said) == 2


def test_an_unknown_host_is_named_as_such():
    clock, said = FakeClock(), []
    waiter = BrokerWaiter(KafkaConnection("no-such-host.invalid:9092"), BrokerWait(timeout_s=1), said.append,
                          sleep=clock.sleep, clock=lambda: clock.now)
    with pytest.raises(KafkaUnreachable, match=r"\(unknown host\)"):
        waiter.topics()
    assert said == ["no Kafka broker at no-such-host.invalid:9092 (unknown host); retrying in 1 s"]


def test_produce_with_no_broker_exits_2_after_its_timeout_with_a_line_a_retry(free_port, tmp_path):
    day = tmp_path / "data" / "date=2026-11-01"
    day.mkdir(parents=True)
    (day / "part-00000.jsonl").write_bytes(b"\n".join(json_messages(5)) + b"\n")
    log = tmp_path / "produce.log"
    with open(log, "wb") as out:
        done = subprocess.run([*CLI_PROCESS, "produce", "--data", str(tmp_path / "data"), "--date", "2026-11-01",
                               "--topic", "events", "--bootstrap-servers", f"127.0.0.1:{free_port}",
                               "--broker-timeout-s", "3"], stdout=out, stderr=subprocess.STDOUT, timeout=300)
    text = log.read_text()
    assert done.returncode == 2, text[-3000:]
    retries = _retry_lines(text)
    assert retries and sum(float(m.group(2)) for m in retries) <= 3, text[-3000:]  # each wait within the timeout
    assert f"no Kafka broker at 127.0.0.1:{free_port} (connection refused) within 3 s" in " ".join(text.split())
    _assert_quiet(text)


def test_a_stream_with_no_broker_retries_with_a_line_a_try_until_it_is_stopped(free_port, tmp_path):
    log = tmp_path / "stream.log"
    process = start_process(stream_command(write_spec(tmp_path), f"127.0.0.1:{free_port}", "events", tmp_path / "w",
                                           "--until-caught-up", "--publish-every", "0", "--backoff", "0.2",
                                           "--backoff-max", "0.2"), log)
    try:
        wait_for(lambda: len(_retry_lines(log.read_text())) >= 3, process, "three retry lines", timeout=300)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0  # stopped as asked
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert {m.group(1) for m in _retry_lines(text)} == {f"127.0.0.1:{free_port}"}
    _assert_quiet(text)


def test_a_cycle_retried_while_no_broker_answers_says_so_as_at_start(free_port, kafka_bootstrap):
    err = KafkaTimeoutError(f"Unable to bootstrap from 127.0.0.1:{free_port}")
    assert retry_line(err, f"127.0.0.1:{free_port}", 2.0) == \
        f"no Kafka broker at 127.0.0.1:{free_port} (connection refused); retrying in 2 s"
    # A broker that answers: the failure is something else, and is named.
    assert retry_line(err, kafka_bootstrap, 0.5) == \
        f"cycle failed (KafkaTimeoutError: Unable to bootstrap from 127.0.0.1:{free_port}); retrying in 0.5 s"


# -- a topic that does not exist -----------------------------------------------------------


def test_a_missing_topic_is_named_with_the_topics_there(kafka_bootstrap, kafka_topic):
    create_topic(kafka_bootstrap, kafka_topic)
    waiter = BrokerWaiter(KafkaConnection(kafka_bootstrap), BrokerWait(timeout_s=30), print)
    with pytest.raises(TopicsMissing) as missing:
        check_topics(waiter, [kafka_topic, f"{kafka_topic}-nope"])
    message = str(missing.value)
    assert message.startswith(f"topic '{kafka_topic}-nope' does not exist at {kafka_bootstrap}; the topics there: ")
    there = message.split("the topics there: ")[1].split(", ")
    assert kafka_topic in there and not [t for t in there if t.startswith("_")]
    consumer = KafkaConnection(kafka_bootstrap).consumer()
    try:  # a cycle's lookup (and the endless job's, which exits 2 with it) says the same
        with pytest.raises(TopicNotFound, match=f"'{kafka_topic}-nope' does not exist at .*{kafka_topic}"):
            topic_partitions(consumer, [f"{kafka_topic}-nope"])
    finally:
        consumer.close()


def test_a_stream_on_a_topic_that_does_not_exist_exits_2_naming_it_and_those_there(kafka_bootstrap, kafka_topic,
                                                                                  tmp_path, capsys):
    create_topic(kafka_bootstrap, kafka_topic)
    status, stderr = refusal_in_process(
        stream_command(write_spec(tmp_path), kafka_bootstrap, "nosuchtopic:json", tmp_path / "w",
                       "--until-caught-up", "--publish-every", "0", "--max-seconds", "120"), capsys)
    text = " ".join(stderr.split())
    assert status == 2, stderr[-3000:]
    assert "topic 'nosuchtopic' does not exist" in text and kafka_topic in text, stderr[-3000:]


def test_a_stream_told_to_wait_for_its_topic_says_so_once_and_trains_once_it_exists(kafka_bootstrap, kafka_topic,
                                                                                   tmp_path):
    log = tmp_path / "stream.log"
    process = start_process(stream_command(write_spec(tmp_path), kafka_bootstrap, f"{kafka_topic}:json",
                                           tmp_path / "w", "--wait-for-topic", "--max-cycles", "1",
                                           "--publish-every", "0", "--idle-sleep", "0.2", "--json"), log)
    try:
        wait_for(lambda: f"waiting for topic {kafka_topic}" in log.read_text(), process, "the waiting line",
                 timeout=300)
        fill_topic(kafka_bootstrap, kafka_topic, json_messages(50), partitions=1)
        assert process.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert text.count("waiting for topic") == 1
    summary = json.loads(text.strip().splitlines()[-1])
    assert summary["cycles"] == 1 and summary["messages"] > 0  # a cycle of what the topic held by then


# -- the confluent client (--kafka-client confluent) ---------------------------------------


def test_a_confluent_read_with_no_broker_fails_naming_the_broker_and_is_retried_as_kafka_pythons_is(free_port):
    servers = f"127.0.0.1:{free_port}"
    connection = KafkaConnection(servers, {"bootstrap_timeout_ms": 1000}, client="confluent")
    with pytest.raises(KafkaReadFailed, match=rf"no answer from the Kafka broker at {servers} to list its topics"):
        bounded_ranges(connection, ["events"], {})
    try:
        bounded_ranges(connection, ["events"], {})
    except KafkaReadFailed as err:
        # A cycle retries it (an outside failure), saying what a kafka-python cycle says.
        assert classify(err) == OUTSIDE
        assert retry_line(err, servers, 1.0) == f"no Kafka broker at {servers} (connection refused); retrying in 1 s"


def test_a_confluent_read_of_a_missing_topic_names_it_with_the_topics_there(kafka_bootstrap, kafka_topic):
    create_topic(kafka_bootstrap, kafka_topic)
    with pytest.raises(TopicNotFound, match=f"'{kafka_topic}-nope' does not exist at .*{kafka_topic}"):
        bounded_ranges(KafkaConnection(kafka_bootstrap, client="confluent"), [f"{kafka_topic}-nope"], {})


def test_a_setting_librdkafka_has_no_name_for_is_an_error_naming_it():
    connection = KafkaConnection("h:1", {"max_poll_records": 5, "ssl_cafile": "/ca.pem"}, client="confluent")
    with pytest.raises(ValueError, match=r"--kafka-option max_poll_records: no librdkafka setting"):
        open_reader(connection)
    config = librdkafka_consumer_config(KafkaConnection("h:1", {"ssl_cafile": "/ca.pem", "ssl_check_hostname": False,
                                                                "sasl_plain_username": "u"}))
    assert config == {"bootstrap.servers": "h:1", "ssl.ca.location": "/ca.pem", "sasl.username": "u",
                      "ssl.endpoint.identification.algorithm": "none"}


def test_confluent_asked_for_where_it_is_not_installed_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)  # what `import confluent_kafka` then raises: ImportError
    status, stderr = refusal_in_process(stream_command(write_spec(tmp_path), "127.0.0.1:1", "events", tmp_path / "w",
                                                       "--kafka-client", "confluent"), capsys)
    assert status == 2, stderr
    assert "--kafka-client confluent needs confluent-kafka, which is not installed here: pip install " \
           "confluent-kafka==2.16.1 (picasso-stage's extra 'confluent')" in " ".join(stderr.split()), stderr
    assert "Traceback" not in stderr
