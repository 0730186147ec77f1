"""No message can stall a stream for ever.

- A message that makes a decoder raise (a decoder bug that data found) is isolated: it
  becomes a dead letter with the error as its reason, and the rest of its poll trains.
- Failures from outside (the broker, timeouts) are retried; errors that no retry mends
  (a codec with no library) stop the stream at once; any other error that fails the same
  cycle the same way, again and again, stops it with that error rather than spin on the
  same offsets. (The broker outage in mid-run is tests/test_stream_broker_restart.py.)
"""

from __future__ import annotations

import json

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaTimeoutError
from stream_helpers import SPEC, fill_topic, json_messages

from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.connectors.kafka_codecs import CodecUnavailable
from picasso.connectors.kafka_config import KafkaConnection
from picasso.connectors.dead_letters.letters import MessageDeadLetter
from picasso.connectors.dead_letters.policy import DeadLetterPolicy
from picasso.connectors.kafka_source import Messages, SourceStalled
from picasso.connectors.decoding.message_formats import decode_messages
from picasso.pipelines.runs import cycle_failures
from picasso.pipelines.runs.cycle_failures import FATAL, OUTSIDE, REPEATED, FailureTracker, classify
from picasso.pipelines.runs.stream import StreamConfig, StreamRunner
from picasso.pipelines.runs.stream_state import StreamModel
from picasso.trainer import TrainConfig

POISON = "poison-id"


@pytest.fixture
def poisoned_decoder(monkeypatch):
    """The decoders raise (as a bug would) on any poll that holds the poison id."""
    validate = RecordDecoder._validate

    def raising(self, columns, *args, **kwargs):
        values = columns.get("h")
        items = values.to_pylist() if hasattr(values, "to_pylist") else list(values or [])
        if POISON in items:
            raise IndexError("a decoder bug")
        return validate(self, columns, *args, **kwargs)

    monkeypatch.setattr(RecordDecoder, "_validate", raising)


def test_a_message_that_makes_the_decoder_raise_becomes_a_dead_letter_alone(poisoned_decoder):
    values = json_messages(10, stream=7)
    values[4] = json.dumps({**json.loads(values[4]), "h": POISON}).encode()
    n = len(values)
    decoded = decode_messages(RecordDecoder(SPEC), "json", Messages("t", 0, 0, n, list(range(n)), values, [None] * n,
                                                                     [0] * n))
    assert decoded.table.num_rows == 9
    [letter] = decoded.dead_letters
    assert letter.offset == 4 and letter.value == values[4]
    assert letter.reason == "decoder error: IndexError: a decoder bug"
    assert decoded.records_in == 10 and decoded.records_refused == 1


@pytest.mark.parametrize("err, kind", [
    (KafkaTimeoutError("no broker"), OUTSIDE), (SourceStalled("t/0: no progress"), OUTSIDE), (TimeoutError("fetch"), OUTSIDE),
    (ConnectionResetError(), OUTSIDE), (CodecUnavailable.at("t/0 offset 5", "snappy"), FATAL),
    (RuntimeError("Traceback ...\npicasso.connectors.kafka_codecs.CodecUnavailable: t/0 at offset 5: ..."), FATAL),
    (ValueError("a bug"), REPEATED), (IndexError("index 7 is out of bounds"), REPEATED),
])
def test_failures_are_told_apart(err, kind):
    assert classify(err) == kind


def test_a_wrapped_error_is_classified_by_its_cause():
    try:
        try:
            raise CodecUnavailable.at("t/0 offset 5", "lz4")
        except CodecUnavailable as inner:
            raise RuntimeError("Pipeline failed") from inner
    except RuntimeError as outer:
        assert classify(outer) == FATAL


def test_only_the_same_failure_at_the_same_positions_stops_the_stream():
    tracker = FailureTracker()
    at = {"t/0": 100}
    # Outside failures never stop it, however many.
    assert all(tracker.record(KafkaTimeoutError("no broker"), at) is None for _ in range(10))
    # A fatal one stops it at once, with the error.
    assert "pip install lz4" in str(tracker.record(CodecUnavailable.at("t/0 offset 100", "lz4"), at))
    # Another error: stopped on its REPEATS_BEFORE_STOPPING-th identical failure only.
    for _ in range(cycle_failures.REPEATS_BEFORE_STOPPING - 1):
        assert tracker.record(ValueError("boom"), at) is None
    assert tracker.record(ValueError("boom"), {"t/0": 120}) is None  # it moved on: counting starts again
    for _ in range(cycle_failures.REPEATS_BEFORE_STOPPING - 2):
        assert tracker.record(ValueError("boom"), {"t/0": 120}) is None
    stop = tracker.record(ValueError("boom"), {"t/0": 120})
    assert stop is not None and "t/0 at 120" in str(stop) and "ValueError: boom" in str(stop)


def _config(kafka_bootstrap, topic, workdir, dead_letter_topic) -> StreamConfig:
    return StreamConfig(
        connection=KafkaConnection(kafka_bootstrap), topics={topic: "json"}, workdir=str(workdir), spec=SPEC,
        mlflow=None, train=TrainConfig(hidden=(16, 8), device="cpu"), batch_messages=20,
        dead_letters=DeadLetterPolicy(topic=dead_letter_topic), until_caught_up=True, backoff_s=0.01, backoff_max_s=0.05,
    )


def _dead_letters(kafka_bootstrap, topic) -> list[MessageDeadLetter]:
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        return [MessageDeadLetter.from_record(record) for record in consumer]
    finally:
        consumer.close()


def test_a_poison_message_does_not_stop_the_stream(poisoned_decoder, kafka_bootstrap, kafka_topic, tmp_path):
    values = json_messages(60, stream=8)
    values[33] = json.dumps({**json.loads(values[33]), "h": POISON}).encode()
    fill_topic(kafka_bootstrap, kafka_topic, values, partitions=1)
    dead_letter_topic = f"{kafka_topic}.dead"
    summary = StreamRunner(_config(kafka_bootstrap, kafka_topic, tmp_path, dead_letter_topic)).run()
    assert summary.failures == 0 and summary.stopped is None
    assert summary.messages == 60 and summary.samples == 59 and summary.dead_letters == 1
    [letter] = _dead_letters(kafka_bootstrap, dead_letter_topic)
    assert (letter.topic, letter.partition, letter.offset) == (kafka_topic, 0, 33)
    assert letter.reason == "decoder error: IndexError: a decoder bug" and letter.value == values[33]


def test_a_cycle_that_fails_the_same_way_every_time_stops_the_stream(monkeypatch, kafka_bootstrap, kafka_topic,
                                                                      tmp_path):
    fill_topic(kafka_bootstrap, kafka_topic, json_messages(40, stream=9), partitions=1)
    train = StreamModel.train

    def failing(self, packed):
        if packed.span.start >= 20:
            raise ValueError("a training bug")
        return train(self, packed)

    monkeypatch.setattr(StreamModel, "train", failing)
    summary = StreamRunner(_config(kafka_bootstrap, kafka_topic, tmp_path, f"{kafka_topic}.dead")).run()
    assert summary.failures == cycle_failures.REPEATS_BEFORE_STOPPING  # not for ever
    assert summary.stopped is not None and "a training bug" in summary.stopped
    assert f"{kafka_topic}/0 at 0" in summary.stopped  # the cycle's start, which no attempt got past
    assert summary.cycles == 0


def test_a_broker_gone_when_offsets_are_committed_does_not_end_the_stream(monkeypatch, kafka_bootstrap, kafka_topic,
                                                                           tmp_path):
    """Committing the checkpoint's positions to the consumer group comes after a cycle, and
    only serves lag tools: the broker gone at that moment (the group consumer cannot
    bootstrap) is logged, and the stream trains on."""
    fill_topic(kafka_bootstrap, kafka_topic, json_messages(40, stream=10), partitions=1)
    make_consumer = KafkaConnection.consumer

    def unreachable_for_the_group(self, **overrides):
        if "group_id" in overrides:
            raise KafkaTimeoutError("Unable to bootstrap from the broker")
        return make_consumer(self, **overrides)

    monkeypatch.setattr(KafkaConnection, "consumer", unreachable_for_the_group)
    summary = StreamRunner(_config(kafka_bootstrap, kafka_topic, tmp_path, f"{kafka_topic}.dead")).run()
    assert summary.stopped is None and summary.failures == 0
    assert summary.messages == 40 and summary.cycles >= 1
