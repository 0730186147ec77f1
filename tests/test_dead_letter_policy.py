"""The dead-letter policy (connectors/dead_letters/policy.py): its defaults are what every
run does, and changing one of its fields changes what happens to a bad message's letter.

The stream's answer to a failed letter is checked without a broker; the letters themselves
are written to a real one (the kafka_bootstrap fixture), as every Kafka test here is."""

from __future__ import annotations

from dataclasses import fields

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaTimeoutError
from kafka_broker import create_topic

from picasso.connectors.dead_letters.letters import MessageDeadLetter
from picasso.connectors.dead_letters.policy import CUT, RETRY, STOP, DeadLetterPolicy
from picasso.connectors.dead_letters.topic import DeadLetterProducer, DeadLettersNotWritten, DeadLetterTooLarge
from picasso.connectors.kafka_config import KafkaConnection
from picasso.pipelines.cli.dead_letter_args import dead_letter_policy
from picasso.pipelines.cli.main import build_parser
from picasso.pipelines.runs.cycle_failures import FATAL, OUTSIDE, REPEATED, FailureTracker
from picasso.pipelines.runs.endless import EndlessConfig
from picasso.pipelines.runs.stream import StreamConfig

MiB = 1 << 20


def _default(config_class, name: str):
    return next(f.default for f in fields(config_class) if f.name == name)


def _stream_args(*flags: str):
    return build_parser().parse_args(["stream", "--workdir", "w", "--topic", "events", *flags])


def test_the_defaults_are_what_every_run_does():
    policy = DeadLetterPolicy()
    assert policy == DeadLetterPolicy(topic="picasso.dead-letters", too_large=CUT, kept_prefix_bytes=1024,
                                      not_written=RETRY, delivery_timeout_s=60.0, max_reason_bytes=4096)
    # The cycle stream and the endless job hold it whole, and the flags build it.
    assert _default(StreamConfig, "dead_letters") == policy == _default(EndlessConfig, "dead_letters")
    assert dead_letter_policy(_stream_args()) == policy
    assert dead_letter_policy(_stream_args("--dead-letter-topic", "bad")) == DeadLetterPolicy(topic="bad")


def _as_a_cycle_sees_it(err: Exception) -> RuntimeError:
    """The sink's error raised again by the runner, with the sink's as its cause."""
    outer = RuntimeError("Pipeline failed")
    outer.__cause__ = err
    return outer


def test_a_letter_the_topic_did_not_take_retries_the_cycle_unless_the_policy_stops():
    written = DeadLettersNotWritten("2 of 2 dead letters were not written to 'picasso.dead-letters'")
    written.__cause__ = KafkaTimeoutError("Batch for TopicPartition expired")
    err, at = _as_a_cycle_sees_it(written), {"events/0": 100}

    retrying = FailureTracker()
    assert retrying.classify(err) == OUTSIDE
    assert all(retrying.record(err, at) is None for _ in range(10))  # for ever, unless --max-failures

    stopping = FailureTracker(dead_letters=DeadLetterPolicy(not_written=STOP))
    assert stopping.classify(err) == FATAL
    stop = stopping.record(err, at)
    assert stop is not None and "the dead-letter policy stops on it" in str(stop)


def _write(bootstrap: str, policy: DeadLetterPolicy, letters: list[MessageDeadLetter]) -> list[MessageDeadLetter]:
    """Write the letters as the policy says; what the policy's topic holds then."""
    producer = DeadLetterProducer(KafkaConnection(bootstrap), policy)
    producer.open()
    try:
        for letter in letters:
            producer.send(letter)
        producer.confirm()
    finally:
        producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        consumer.assign([TopicPartition(policy.topic, 0)])
        consumer.seek_to_beginning()
        return [MessageDeadLetter.from_record(record) for record in consumer]
    finally:
        consumer.close()


def _letter(offset: int, value: bytes, reason: str = "invalid JSON") -> MessageDeadLetter:
    return MessageDeadLetter(topic="events", partition=0, offset=offset, key=None, value=value,
                             timestamp_ms=1_700_000_000_000 + offset, reason=reason)


def test_the_policy_says_how_much_of_a_letter_is_kept(kafka_bootstrap, kafka_topic):
    large, long_reason = _letter(0, b"{" * (2 * MiB)), _letter(1, b"{", reason="invalid JSON: " + "x" * 300)
    create_topic(kafka_bootstrap, kafka_topic)
    policy = DeadLetterPolicy(topic=kafka_topic, kept_prefix_bytes=16, max_reason_bytes=100)
    cut, capped = _write(kafka_bootstrap, policy, [large, long_reason])
    assert cut.is_cut and cut.value == large.value[:16] and cut.original_value.matches(large.value)
    assert cut.original_reason == large.reason
    assert capped.reason == long_reason.reason[:100] and capped.value == long_reason.value


def test_a_letter_too_large_stops_the_stream_when_the_policy_says_so(kafka_bootstrap, kafka_topic):
    stopping = DeadLetterPolicy(topic=kafka_topic, too_large=STOP)
    producer = DeadLetterProducer(KafkaConnection(kafka_bootstrap), stopping)
    producer.open()
    try:
        with pytest.raises(DeadLetterTooLarge, match="policy stops rather than cut it") as raised:
            producer.send(_letter(0, b"{" * (2 * MiB)))
    finally:
        producer.close()
    # By default this error comes only of a letter too large even cut down: the cycle is
    # retried until it fails so at the same positions again and again.
    assert FailureTracker().classify(raised.value) == REPEATED
    assert FailureTracker(dead_letters=stopping).classify(raised.value) == FATAL


@pytest.mark.parametrize("change", [{"too_large": "drop"}, {"not_written": "ignore"}, {"delivery_timeout_s": 0.5},
                                    {"kept_prefix_bytes": 0}, {"max_reason_bytes": 0}])
def test_a_policy_that_cannot_be_is_refused_naming_its_field(change):
    with pytest.raises(ValueError, match=next(iter(change))):
        DeadLetterPolicy(**change)
