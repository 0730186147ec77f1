"""The dead-letter sink against a real broker: every letter is acknowledged or the pipeline
fails, and a letter too large for Kafka is written cut down, never blocking the stream."""

from __future__ import annotations

import os
import random
import signal
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from kafka import KafkaConsumer, TopicPartition
from kafka_broker import create_topic

from picasso.connectors.dead_letters import oversize as dead_letter_oversize
from picasso.connectors.dead_letters.letters import Digest, MessageDeadLetter
from picasso.connectors.dead_letters.policy import KEPT_PREFIX_BYTES, MAX_REASON_BYTES, DeadLetterPolicy
from picasso.connectors.dead_letters.topic import WriteDeadLettersToKafka
from picasso.connectors.kafka_config import KafkaConnection
from picasso.connectors.kafka_source import FETCH_SETTINGS
from picasso.connectors.testing.kafka_broker import TansuBroker
from picasso.connectors.testing.loopback import listening

MiB = 1024 * 1024


def letter(offset: int, value: bytes | None, key: bytes | None = None, reason: str = "invalid JSON") -> MessageDeadLetter:
    return MessageDeadLetter(topic="events", partition=3, offset=offset, key=key, value=value,
                             timestamp_ms=1_700_000_000_000 + offset, reason=reason, records=offset + 1)


def random_bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def write(connection: KafkaConnection, topic: str, elements: list, step=None, **sink_options):
    """Run one small pipeline that writes dead letters: the elements, or step(element) for
    each. A step builds large letters in the pipeline: Beam's Create takes seconds per
    megabyte of an element."""
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        letters = pipeline | beam.Create(elements)
        if step is not None:
            letters = letters | beam.Map(step)
        letters | WriteDeadLettersToKafka(connection, DeadLetterPolicy(topic=topic, **sink_options))


def read_back(bootstrap: str, topic: str, count: int) -> list[MessageDeadLetter]:
    """The first `count` letters of the topic's partition 0, with a consumer of its own."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **FETCH_SETTINGS)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    letters = []
    deadline = time.monotonic() + 60  # a hang guard
    try:
        while len(letters) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                letters += [MessageDeadLetter.from_record(r) for r in records]
    finally:
        consumer.close()
    assert len(letters) == count, f"read {len(letters)} of {count} dead letters back"
    return letters


def test_a_dead_letter_is_read_back_byte_for_byte(kafka_bootstrap, kafka_topic):
    letters = [
        letter(0, b'{"label": 1, "d1": ', key=b"user-17"),
        letter(1, random_bytes(5000, seed=1), key=random_bytes(40, seed=2), reason="not an Arrow IPC stream"),
        letter(2, b"", reason="empty message: \u00e9t\u00e9 \u2713"),  # a reason in UTF-8
    ]
    create_topic(kafka_bootstrap, kafka_topic)
    write(KafkaConnection(kafka_bootstrap), kafka_topic, letters)
    assert read_back(kafka_bootstrap, kafka_topic, len(letters)) == letters


def large_letter(offset: int) -> MessageDeadLetter:
    """Offset 0: a 2 MiB value; 1: a small one; 2: 12 MiB with a short key; 3: 2 MiB with a 2 MiB key."""
    if offset == 1:
        return letter(1, b"small")
    if offset == 2:
        return letter(2, random_bytes(12 * MiB, seed=2), key=b"k", reason="missing label")
    return letter(offset, random_bytes(2 * MiB, seed=offset), key=random_bytes(2 * MiB, seed=9) if offset == 3 else None)


def test_dead_letters_of_2_and_12_mib_are_written_cut_with_their_size_and_sha256(kafka_bootstrap, kafka_topic):
    letters = [large_letter(offset) for offset in range(4)]
    create_topic(kafka_bootstrap, kafka_topic)
    write(KafkaConnection(kafka_bootstrap), kafka_topic, list(range(4)), step=large_letter)
    back = read_back(kafka_bootstrap, kafka_topic, len(letters))

    assert back[1] == letters[1]  # a letter that fits is untouched, and in its place
    for original, cut in [(letters[0], back[0]), (letters[2], back[2]), (letters[3], back[3])]:
        # where it came from, how many records, and when: intact
        assert (cut.topic, cut.partition, cut.offset, cut.records, cut.timestamp_ms) == (
            original.topic, original.partition, original.offset, original.records, original.timestamp_ms)
        assert cut.is_cut and cut.original_reason == original.reason
        assert cut.reason.startswith("oversize: ") and "> max_request_size 1048576" in cut.reason, cut.reason
        assert cut.value == original.value[:KEPT_PREFIX_BYTES]
        assert cut.original_value == Digest.of(original.value) and cut.original_value.matches(original.value)
    assert back[2].original_value.size == 12 * MiB
    assert back[2].key == b"k" and back[2].original_key is None  # a short key is kept whole
    assert back[3].key == letters[3].key[:KEPT_PREFIX_BYTES] and back[3].original_key.matches(letters[3].key)


def test_a_letter_the_client_refuses_as_too_large_is_written_cut(kafka_bootstrap, kafka_topic, monkeypatch):
    # Should the sink's size estimate ever fall short, kafka-python's own check in send()
    # refuses the letter; the sink then cuts it all the same.
    monkeypatch.setattr(dead_letter_oversize, "record_size", lambda key, value, headers: 0)
    original = large_letter(0)
    create_topic(kafka_bootstrap, kafka_topic)
    write(KafkaConnection(kafka_bootstrap), kafka_topic, [0], step=large_letter)
    [cut] = read_back(kafka_bootstrap, kafka_topic, 1)
    assert cut.is_cut and "MessageSizeTooLargeError" in cut.reason, cut.reason
    assert cut.value == original.value[:KEPT_PREFIX_BYTES] and cut.original_value.matches(original.value)
    assert cut.original_reason == original.reason


def test_a_producer_limit_too_small_for_even_a_cut_letter_fails_the_pipeline(kafka_bootstrap, kafka_topic):
    connection = KafkaConnection(kafka_bootstrap, {"max_request_size": 2048})
    create_topic(kafka_bootstrap, kafka_topic)
    with pytest.raises(Exception, match="does not fit even cut down .*raise the producer's max_request_size"):
        write(connection, kafka_topic, [letter(0, b"x" * 10_000, reason="r" * MAX_REASON_BYTES)])


@pytest.fixture
def schema_checking_broker(tmp_path, kafka_topic, monkeypatch):
    """A broker that checks the dead-letter topic against a JSON schema: a value that is not
    a JSON object with a number `n` is refused with INVALID_RECORD. (Tansu auto-creates a
    topic on produce, even after delete_topics, so a missing topic refuses nothing.)"""
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / f"{kafka_topic}.json").write_text(
        '{"type": "object", "properties": {"value": {"type": "object", "required": ["n"],'
        ' "properties": {"n": {"type": "number"}}}}}')
    with monkeypatch.context() as patch:
        # Tansu reads a file:// registry relative to its working directory.
        patch.setenv("SCHEMA_REGISTRY", "file://schemas")
        patch.chdir(tmp_path)
        broker = TansuBroker(tmp_path).start()
    try:
        yield broker
    finally:
        broker.stop()


def test_a_write_the_broker_refuses_fails_the_pipeline_and_names_the_failure(schema_checking_broker, kafka_topic):
    bootstrap = schema_checking_broker.bootstrap
    create_topic(bootstrap, kafka_topic)
    letters = [letter(0, b'{"n": 1}'), letter(1, b"not JSON at all"), letter(2, b'{"n": 2}')]
    # The broker refuses the whole batch that holds the bad record, so the letters batched
    # with it fail too; the cycle is retried, so they are not lost.
    with pytest.raises(Exception, match=r"[1-3] of 3 dead letters were not written .*InvalidRecordError"):
        write(KafkaConnection(bootstrap), kafka_topic, letters)


def stop_broker_at(offset: int, pid: int, port: int):
    """A step before the sink that kills the broker when the letter at `offset` passes, and
    waits until the port is closed: the letters before it are sent, those after it are not."""
    def step(one: MessageDeadLetter) -> MessageDeadLetter:
        if one.offset == offset:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30  # a hang guard
            while time.monotonic() < deadline and listening(port):
                time.sleep(0.05)
        return one
    return step


def test_a_broker_gone_mid_way_fails_the_pipeline_and_a_rerun_writes_every_letter(restartable_broker, kafka_topic):
    bootstrap = restartable_broker.bootstrap
    connection = KafkaConnection(bootstrap)
    letters = [letter(i, f'{{"bad": {i}'.encode()) for i in range(5)]
    create_topic(bootstrap, kafka_topic)
    killer = stop_broker_at(2, restartable_broker.process.pid, restartable_broker.port)
    with pytest.raises(Exception, match=r"[1-5] of 5 dead letters were not written"):
        write(connection, kafka_topic, letters, step=killer, delivery_timeout_s=3)

    # The cycle is retried from its last checkpoint: the same letters again, to a broker
    # that is back (empty: Tansu keeps data in memory).
    restartable_broker.stop()
    restartable_broker.start()
    create_topic(bootstrap, kafka_topic)
    # The product's own delivery timeout: the short one above only makes the failure quick,
    # and a broker just restarted on a busy machine may take longer than it to take a write.
    write(connection, kafka_topic, letters)
    assert read_back(bootstrap, kafka_topic, len(letters)) == letters
