"""ReadFromKafka against a real broker: every offset exactly once, in order, in elements
of at most max_messages messages; bounded and unbounded modes; settings pass through."""

from __future__ import annotations

import json
import threading
import time

import apache_beam as beam
import pytest
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.sdf_utils import RestrictionTrackerView, ThreadsafeRestrictionTracker
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka_broker import create_topic, produce_values

from picasso.connectors import kafka_python_reader
from picasso.connectors.confluent_reader import ConfluentReader
from picasso.connectors.kafka_blocks import blocks_of, use_blocks
from picasso.connectors.kafka_config import KafkaConnection, latest_offsets
from picasso.connectors.kafka_record_batches import RecordBlock
from picasso.connectors.kafka_source import UNBOUNDED, PartitionRange, ReadFromKafka, _ReadPartitionDoFn

PARTITIONS = 3
MESSAGES = 3000


@pytest.fixture(scope="module")
def topic(kafka_bootstrap) -> str:
    name = "source-exact"
    create_topic(kafka_bootstrap, name, PARTITIONS)
    produce_values(kafka_bootstrap, name, [f"m{i}".encode() for i in range(MESSAGES)], PARTITIONS)
    return name


def read_spans(bootstrap: str, topic: str, out_dir, positions=None, beam_args=(), max_messages=128,
               client="kafka-python"):
    """[source, start, next_position, offsets, values] of every element."""
    connection = KafkaConnection(bootstrap, client=client)
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner", *beam_args])) as pipeline:
        (pipeline
         | ReadFromKafka.bounded(connection, [topic], positions, max_messages=max_messages)
         | beam.Map(lambda m: json.dumps([m.source, m.start, m.next_position, m.offsets,
                                          [v.decode() for v in m.values]]))
         | beam.io.WriteToText(str(out_dir / "spans"), shard_name_template=""))
    return [json.loads(line) for line in (out_dir / "spans").read_text().splitlines()]


def _check_exact(spans, starts: dict[str, int], ends: dict[str, int], max_messages: int):
    by_source: dict[str, list] = {}
    for span in spans:
        by_source.setdefault(span[0], []).append(span)
    assert set(by_source) == set(ends)
    for source, items in by_source.items():
        items.sort(key=lambda s: s[1])
        position = starts.get(source, 0)
        offsets = []
        for _, start, next_position, span_offsets, _ in items:
            assert start == position  # back to back: no gap, no overlap
            assert len(span_offsets) <= max_messages
            offsets += span_offsets
            position = next_position
        assert position == ends[source]
        assert offsets == list(range(starts.get(source, 0), ends[source]))  # each offset once, in order


@pytest.mark.parametrize("reading", ["blocks", "records", "confluent"])
@pytest.mark.parametrize("beam_args", [(), ("--direct_num_workers=2", "--direct_running_mode=multi_threading")],
                         ids=["one-worker", "two-workers"])
def test_bounded_read_yields_every_offset_once(kafka_bootstrap, topic, tmp_path, beam_args, reading, monkeypatch):
    if reading == "records":  # as with a kafka-python that batches cannot be taken from
        monkeypatch.setattr(kafka_python_reader, "use_blocks", lambda consumer: False)
    client = "confluent" if reading == "confluent" else "kafka-python"
    spans = read_spans(kafka_bootstrap, topic, tmp_path, beam_args=beam_args, client=client)
    ends = {f"{topic}/{p}": MESSAGES // PARTITIONS for p in range(PARTITIONS)}
    _check_exact(spans, {}, ends, 128)
    values = sorted(v for span in spans for v in span[4])
    assert values == sorted(f"m{i}" for i in range(MESSAGES))


def test_bounded_read_starts_from_positions_and_cuts_at_the_same_points(kafka_bootstrap, topic, tmp_path,
                                                                         kafka_client):
    starts = {f"{topic}/0": 17, f"{topic}/2": 999}
    first = read_spans(kafka_bootstrap, topic, tmp_path / "a", starts, max_messages=100, client=kafka_client)
    # The other client cuts at the very same points: the cuts are picasso's, not a client's.
    other = "confluent" if kafka_client == "kafka-python" else "kafka-python"
    second = read_spans(kafka_bootstrap, topic, tmp_path / "b", starts, max_messages=100, client=other)
    _check_exact(first, starts, {f"{topic}/{p}": 1000 for p in range(PARTITIONS)}, 100)
    # Cut points depend on the start positions only, never on how the fetches went.
    assert sorted(s[:3] for s in first) == sorted(s[:3] for s in second)
    assert [s[2] - s[1] for s in sorted(first) if s[0] == f"{topic}/0"][:2] == [100, 100]


def test_block_polls_and_confluent_polls_hold_the_same_records_as_kafka_python_polls(kafka_bootstrap, kafka_topic):
    create_topic(kafka_bootstrap, kafka_topic)
    values = [None if i % 97 == 13 else b"v%d" % i * (i % 7) for i in range(2000)]
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5, batch_size=4096)
    for i, value in enumerate(values):
        producer.send(kafka_topic, key=b"k%d" % i if i % 2 or value is None else None, value=value)
    producer.flush()
    producer.close()

    def read(blocks: bool, start: int) -> RecordBlock:
        consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
        if blocks:
            assert use_blocks(consumer)
        tp = TopicPartition(kafka_topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, start)  # inside a producer batch: the fetch brings all of it
        parts = []
        try:
            while consumer.position(tp) < len(values):
                parts.append(blocks_of(consumer.poll(timeout_ms=1000, max_records=100).get(tp, [])))
        finally:
            consumer.close()
        return RecordBlock.concat(parts).between(start, len(values))

    def read_confluent(start: int) -> RecordBlock:
        reader = ConfluentReader(KafkaConnection(kafka_bootstrap))
        tp = TopicPartition(kafka_topic, 0)
        reader.assign(tp, start)
        parts, position = [], start
        try:
            while position < len(values):
                polled = reader.poll(tp, 100, timeout_s=1.0)
                parts.append(polled.block)
                position = polled.position
        finally:
            reader.close()
        return RecordBlock.concat(parts).between(start, len(values))

    with_blocks, with_records, with_confluent = read(True, 1234), read(False, 1234), read_confluent(1234)
    for block in (with_blocks, with_confluent):
        assert block.offsets.tolist() == with_records.offsets.tolist() == list(range(1234, 2000))
        assert block.values == with_records.values == values[1234:]
        assert block.keys == with_records.keys
        assert block.timestamps.tolist() == with_records.timestamps.tolist()


def test_latest_offsets_reaches_the_tail_of_every_partition(kafka_bootstrap, topic):
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    try:
        assert latest_offsets(consumer, partitions) == {tp: MESSAGES // PARTITIONS for tp in partitions}
    finally:
        consumer.close()
    reader = ConfluentReader(KafkaConnection(kafka_bootstrap))
    try:
        assert reader.partitions([topic]) == partitions
        assert reader.beginning_offsets(partitions) == {tp: 0 for tp in partitions}
        assert reader.latest_offsets(partitions) == {tp: MESSAGES // PARTITIONS for tp in partitions}
    finally:
        reader.close()


def test_the_confluent_readers_latest_offsets_are_the_latest_fetchs_not_an_older_one(kafka_bootstrap, kafka_topic):
    """Offsets asked again after more records came, while another partition was being
    read: the first answer already counts the new records (the high watermark librdkafka
    had cached was the earlier fetch's, and Tansu's own answer under-reports)."""
    create_topic(kafka_bootstrap, kafka_topic, 2)
    produce_values(kafka_bootstrap, kafka_topic, [b"x%d" % i for i in range(10)], partitions=2)
    reader = ConfluentReader(KafkaConnection(kafka_bootstrap))
    try:
        partitions = reader.partitions([kafka_topic])
        before = reader.latest_offsets(partitions)
        reader.assign(partitions[1], 0)
        reader.poll(partitions[1], 100, 0.5)
        produce_values(kafka_bootstrap, kafka_topic, [b"y%d" % i for i in range(4)], partitions=2)
        after = reader.latest_offsets(partitions)
        assert sum(after.values()) == sum(before.values()) + 4, (before, after)
    finally:
        reader.close()


def test_unbounded_read_defers_its_remainder_and_follows_message_timestamps(kafka_bootstrap, kafka_topic,
                                                                             kafka_client):
    create_topic(kafka_bootstrap, kafka_topic)
    produce_values(kafka_bootstrap, kafka_topic, [b"a%d" % i for i in range(50)])
    dofn = _ReadPartitionDoFn(KafkaConnection(kafka_bootstrap, client=kafka_client), max_messages=20, stall_timeout_s=5, resume_every_s=0.5,
                              max_delay_s=600)
    dofn.setup()
    try:
        element = PartitionRange(kafka_topic, 0, 0, UNBOUNDED)
        tracker = ThreadsafeRestrictionTracker(OffsetRestrictionTracker(OffsetRange(0, UNBOUNDED)))
        watermark = ManualWatermarkEstimator(None)
        outputs = list(dofn.process(element, tracker=RestrictionTrackerView(tracker), watermark=watermark))
        batches = [out.value for out in outputs]
        assert [len(b) for b in batches] == [20, 20, 10]  # a partial batch once the topic is drained
        newest = max(t for b in batches for t in b.timestamps)
        assert watermark.current_watermark().micros == newest * 1000
        assert outputs[-1].timestamp.micros == newest * 1000
        # The runner would now split off the remainder: it starts at the next offset.
        residual, delay = tracker.deferred_status()
        assert residual.start == 50 and residual.stop == UNBOUNDED

        produce_values(kafka_bootstrap, kafka_topic, [b"b%d" % i for i in range(5)])
        tracker = ThreadsafeRestrictionTracker(OffsetRestrictionTracker(residual))
        more = [out.value for out in dofn.process(PartitionRange(kafka_topic, 0, 50, UNBOUNDED),
                                                  tracker=RestrictionTrackerView(tracker), watermark=watermark)]
        assert [v for b in more for v in b.values] == [b"b%d" % i for i in range(5)]
        assert more[0].start == 50 and more[-1].next_position == 55
    finally:
        dofn.teardown()


def test_an_unbounded_read_of_a_trickle_cuts_an_element_once_its_oldest_message_waited_max_delay(kafka_bootstrap,
                                                                                                  kafka_topic,
                                                                                                  kafka_client):
    """A message a tenth of a second never fills an element of 1,000: without the delay, the
    first would wait minutes (and the model's freshness with it)."""
    create_topic(kafka_bootstrap, kafka_topic)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    stop = threading.Event()

    def trickle():  # until the first element is out (900: a hang guard)
        for i in range(900):
            if stop.is_set():
                return
            producer.send(kafka_topic, value=b"t%d" % i).get(timeout=30)
            time.sleep(0.1)

    thread = threading.Thread(target=trickle)
    thread.start()
    dofn = _ReadPartitionDoFn(KafkaConnection(kafka_bootstrap, client=kafka_client), max_messages=1000,
                              stall_timeout_s=60,
                              resume_every_s=600, max_delay_s=0.3)
    dofn.setup()
    try:
        tracker = ThreadsafeRestrictionTracker(OffsetRestrictionTracker(OffsetRange(0, UNBOUNDED)))
        outputs = dofn.process(PartitionRange(kafka_topic, 0, 0, UNBOUNDED), tracker=RestrictionTrackerView(tracker),
                               watermark=ManualWatermarkEstimator(None))
        first = next(outputs).value
        assert thread.is_alive() and 0 < len(first) < 900  # cut while the trickle still runs
        assert first.start == 0 and first.next_position == len(first)
    finally:
        stop.set()
        thread.join()
        producer.close()
        dofn.teardown()


def test_a_bounded_read_against_a_dead_broker_fails_instead_of_hanging(restartable_broker, tmp_path, kafka_client):
    create_topic(restartable_broker.bootstrap, "gone")
    produce_values(restartable_broker.bootstrap, "gone", [b"x"] * 10)
    connection = KafkaConnection(restartable_broker.bootstrap, client=kafka_client)
    read = ReadFromKafka.bounded(connection, ["gone"], stall_timeout_s=2)
    ranges = [PartitionRange(r.topic, r.partition, r.start, r.stop + 5) for r in read.ranges]  # beyond the end
    started = time.monotonic()
    with pytest.raises(Exception, match="no progress"):
        with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
            pipeline | ReadFromKafka(connection, ranges, stall_timeout_s=2)
    assert time.monotonic() - started < 60


def test_client_settings_pass_through_to_each_client_kind():
    connection = KafkaConnection("h:1", {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                                         "sasl_plain_username": "u", "sasl_plain_password": "p",
                                         "ssl_cafile": "/ca.pem", "acks": "all", "fetch_max_wait_ms": 100})
    consumer = connection.settings("consumer")
    producer = connection.settings("producer")
    for settings in (consumer, producer, connection.settings("admin")):
        assert settings["security_protocol"] == "SASL_SSL" and settings["sasl_plain_username"] == "u"
        assert settings["ssl_cafile"] == "/ca.pem" and settings["bootstrap_servers"] == "h:1"
    assert "acks" not in consumer and producer["acks"] == "all"
    assert "fetch_max_wait_ms" in consumer and "fetch_max_wait_ms" not in producer


def test_an_unknown_client_setting_is_an_error_naming_it():
    with pytest.raises(ValueError, match="fetch_max_wait_sec"):
        KafkaConnection("h:1", {"fetch_max_wait_sec": 1})
