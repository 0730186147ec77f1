"""Compressed topics: every Kafka codec is read in full, and a codec that cannot be read
stops the read with an error naming it and its package, instead of stalling.

The topics are written by confluent-kafka (librdkafka), an independent client, the way
most producers write them: whole compressed record batches.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid

import apache_beam as beam
import confluent_kafka
import kafka.codec
import pytest
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.sdf_utils import RestrictionTrackerView, ThreadsafeRestrictionTracker
from kafka_broker import create_topic
from stream_helpers import json_messages, run_stream_process, stream_command, write_spec

from picasso.connectors import kafka_python_reader, kafka_source
from picasso.connectors.kafka_codecs import PACKAGES, CodecUnavailable, available_codecs, check_codecs
from picasso.connectors.kafka_config import KafkaConnection
from picasso.connectors.kafka_source import ReadFromKafka, bounded_ranges

CODECS = list(PACKAGES)  # gzip, snappy, lz4, zstd
MESSAGES = 400  # per topic, over 2 partitions
HANG_GUARD_S = 120  # far above a failing read's second or two, far below a stall timeout
NEVER_STALLS_S = 3600.0  # a reader that stalled instead of failing would hang the test


@pytest.fixture(scope="module")
def codec_topics(kafka_bootstrap) -> dict[str, str]:
    """Codec name -> a topic whose batches confluent-kafka compressed with it."""
    topics = {}
    values = json_messages(MESSAGES)
    for codec in CODECS:
        topic = topics[codec] = f"codec-{codec}-{uuid.uuid4().hex[:8]}"
        create_topic(kafka_bootstrap, topic, partitions=2)
        producer = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap, "compression.type": codec,
                                             "linger.ms": 20, "acks": "all"})
        for i, value in enumerate(values):
            producer.produce(topic, value=value, partition=i % 2)
        assert producer.flush(60) == 0, f"{codec}: messages left unsent"
    return topics


def test_every_codec_is_installed():
    assert available_codecs() == {codec: True for codec in CODECS}
    assert check_codecs() == available_codecs()


def test_a_stream_trains_every_message_of_every_codec(kafka_bootstrap, codec_topics, tmp_path):
    first, *others = codec_topics.values()
    more_topics = [arg for topic in others for arg in ("--topic", topic)]
    command = stream_command(write_spec(tmp_path), kafka_bootstrap, first, tmp_path / "work", *more_topics,
                             "--until-caught-up", "--publish-every", "0", "--batch-messages", "100", "--json")
    log = tmp_path / "stream.log"
    done = run_stream_process(command, log)
    assert done.returncode == 0, log.read_text()[-3000:]
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    assert summary["failures"] == 0 and summary["lag"] == 0
    assert summary["messages"] == summary["samples"] == MESSAGES * len(CODECS)
    assert summary["dead_letters"] == 0
    for codec, topic in codec_topics.items():
        partitions = [entry for source, entry in summary["ledger"]["partitions"].items()
                      if source.startswith(f"{topic}/")]
        assert sum(entry["messages"] for entry in partitions) == MESSAGES, codec
        assert sum(entry["refused"] for entry in partitions) == 0, codec


@pytest.fixture
def hide_codec(monkeypatch):
    """Make kafka-python believe a codec's package is not installed."""
    def hide(codec: str) -> None:
        monkeypatch.setattr(kafka.codec, f"has_{codec}", lambda: False)
    return hide


def test_the_codec_check_names_the_package_of_a_missing_codec(hide_codec, caplog):
    hide_codec("lz4")
    with caplog.at_level(logging.WARNING, logger="picasso.connectors.kafka_codecs"):
        assert check_codecs() == {"gzip": True, "snappy": True, "lz4": False, "zstd": True}
    assert "lz4" in caplog.text and "pip install lz4" in caplog.text


@pytest.mark.parametrize("codec", CODECS)
def test_the_end_offset_lookup_names_a_codec_that_cannot_be_read(kafka_bootstrap, codec_topics, codec, hide_codec):
    hide_codec(codec)
    with pytest.raises(CodecUnavailable) as raised:
        bounded_ranges(KafkaConnection(kafka_bootstrap), [codec_topics[codec]], {})
    assert codec_topics[codec] in str(raised.value)
    _assert_names_the_codec(raised.value, codec)


@pytest.mark.parametrize("reading", ["blocks", "records"])
@pytest.mark.parametrize("codec", CODECS)
def test_a_codec_that_cannot_be_read_fails_the_pipeline_instead_of_stalling(
        kafka_bootstrap, codec_topics, codec, reading, hide_codec, monkeypatch):
    connection = KafkaConnection(kafka_bootstrap)
    ranges = bounded_ranges(connection, [codec_topics[codec]], {})  # looked up while the codec is there
    hide_codec(codec)
    if reading == "records":  # as with a kafka-python that batches cannot be taken from
        monkeypatch.setattr(kafka_python_reader, "use_blocks", lambda consumer: False)

    def read():
        with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
            pipeline | ReadFromKafka(connection, ranges, stall_timeout_s=NEVER_STALLS_S)

    error = _raised_within(read, HANG_GUARD_S)
    # Beam re-raises a DoFn's error as a copy of the same type: the type, its codec and
    # `retryable` reach the pipeline's caller.
    assert isinstance(error, CodecUnavailable) and CodecUnavailable.raised_in(error), repr(error)
    assert error.retryable is False
    _assert_names_the_codec(error, codec)
    assert f"{codec_topics[codec]}/" in str(error) and "at offset 0" in str(error)


def test_several_workers_hand_the_error_back_as_text_that_names_it(kafka_bootstrap, codec_topics, hide_codec):
    connection = KafkaConnection(kafka_bootstrap)
    ranges = bounded_ranges(connection, [codec_topics["snappy"]], {})
    hide_codec("snappy")

    def read():
        options = ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_threading"]
        with beam.Pipeline(options=PipelineOptions(options)) as pipeline:
            pipeline | ReadFromKafka(connection, ranges, stall_timeout_s=NEVER_STALLS_S)

    error = _raised_within(read, HANG_GUARD_S)
    # The worker's exception does not cross over: a RuntimeError carries its traceback.
    assert not isinstance(error, CodecUnavailable) and CodecUnavailable.raised_in(error), repr(error)
    assert "compressed with snappy" in str(error) and "pip install python-snappy" in str(error)


def test_a_reader_that_met_a_codec_it_cannot_read_fails_again_when_reused(kafka_bootstrap, codec_topics, hide_codec):
    """kafka-python spins for ever in the next poll of a consumer whose fetch could not be
    decompressed; the DoFn polls a fresh consumer instead."""
    connection = KafkaConnection(kafka_bootstrap)
    element = bounded_ranges(connection, [codec_topics["snappy"]], {})[0]
    hide_codec("snappy")
    dofn = kafka_source._ReadPartitionDoFn(connection, max_messages=100, stall_timeout_s=NEVER_STALLS_S,
                                           resume_every_s=1.0, max_delay_s=1.0)

    def read_twice():
        dofn.setup()
        try:
            for _ in range(2):
                tracker = ThreadsafeRestrictionTracker(OffsetRestrictionTracker(OffsetRange(element.start,
                                                                                             element.stop)))
                with pytest.raises(CodecUnavailable, match="snappy"):
                    list(dofn.process(element, tracker=RestrictionTrackerView(tracker),
                                      watermark=ManualWatermarkEstimator(None)))
        finally:
            dofn.teardown()

    assert _raised_within(read_twice, HANG_GUARD_S) is None


def _assert_names_the_codec(error: CodecUnavailable, codec: str) -> None:
    assert error.codec == codec
    message = str(error)
    assert f"compressed with {codec}" in message
    assert (f"pip install {PACKAGES[codec]}" if PACKAGES[codec] else "standard library") in message


def _raised_within(work, timeout_s: float) -> BaseException | None:
    """What work() raised (None if nothing); fails the test if it is still running after
    timeout_s (a hang guard: the work runs on in a daemon thread)."""
    outcome = []

    def run():
        try:
            work()
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert outcome, f"still running after {timeout_s}s: a stall, not an error"
    return outcome[0]
