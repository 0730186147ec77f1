"""`--kafka-io beam`: Beam's cross-language ReadFromKafka for the endless job.

Expanding Beam's reader takes a Java expansion service with Beam's jar, which this machine
cannot download, so the transform is built and its configuration read back, never run.
What runs for real: the records -> Messages step on the FnApiRunner (with rows shaped as
the SDK decodes Beam's KafkaIO rows), the commit of start positions against the real
broker, and the command's refusals.
"""

from __future__ import annotations

import random
import time
import uuid

import apache_beam as beam
import pytest
from apache_beam.coders import RowCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import external_transforms_pb2
from apache_beam.testing.util import assert_that
from apache_beam.transforms.external import BeamJarExpansionService
from apache_beam.typehints.schemas import named_tuple_to_schema
from kafka import KafkaConsumer, TopicPartition
from kafka_broker import create_topic, produce_values
from stream_helpers import SPEC, write_spec

from picasso.connectors.beam_kafka_io import (BeamKafkaIO, BeamKafkaRead, ExpansionFailed, KafkaRecordRow,
                                              ReadWithBeamKafka, RecordsToMessages)
from picasso.connectors.kafka_config import KafkaConnection
from picasso.connectors.kafka_java_config import java_consumer_config
from picasso.connectors.kafka_source import PartitionRange
from picasso.connectors.testing.loopback import free_port
from picasso.pipelines.cli.main import main
from picasso.pipelines.runs.endless import EndlessConfig, build_pipeline
from picasso.pipelines.transforms.gba_train import PSAddress

BYTES = "org.apache.kafka.common.serialization.ByteArrayDeserializer"
SECURE = KafkaConnection("k1:9093,k2:9093", {
    "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "trainer",
    "sasl_plain_password": 'se"cret', "ssl_cafile": "/etc/kafka/ca.pem", "ssl_check_hostname": False,
    "client_id": "picasso", "max_poll_records": 500})


def _configuration(transform) -> object:
    """What the built transform would send to the expansion service: its configuration row."""
    payload = external_transforms_pb2.ExternalConfigurationPayload.FromString(transform._payload)
    return RowCoder(payload.schema).decode(payload.payload)


def test_the_transform_reads_the_topics_with_metadata_through_the_group_and_the_given_expansion_service():
    read = BeamKafkaRead(SECURE, ("events", "more-events"), BeamKafkaIO("endless-job", "127.0.0.1:8097"),
                         {"events/0": 12, "more-events/0": 0})
    transform = read.transform()
    assert transform._urn == beam.io.kafka.ReadFromKafka.URN_WITH_METADATA
    assert transform._expansion_service == "127.0.0.1:8097"
    config = _configuration(transform)
    assert config.topics == ["events", "more-events"]
    assert config.key_deserializer == config.value_deserializer == BYTES
    assert config.commit_offset_in_finalize is False and config.timestamp_policy == "CreateTime"
    assert config.start_read_time is None and config.max_num_records is None  # unbounded, from the group's offsets
    assert dict(config.consumer_config) == {
        "bootstrap.servers": "k1:9093,k2:9093", "group.id": "endless-job", "enable.auto.commit": "false",
        "auto.offset.reset": "none", "client.id": "picasso", "max.poll.records": "500",
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="trainer" '
                            'password="se\\"cret";',
        "ssl.truststore.type": "PEM", "ssl.truststore.location": "/etc/kafka/ca.pem",
        "ssl.endpoint.identification.algorithm": ""}


def test_with_no_expansion_service_given_beam_s_own_is_the_one_with_its_kafka_jar():
    transform = BeamKafkaRead(KafkaConnection("k:9092"), ("events",), BeamKafkaIO("g")).transform()
    assert isinstance(transform._expansion_service, BeamJarExpansionService)
    assert "beam-sdks-java-io-expansion-service" in transform._expansion_service.path_to_jar


def test_a_plain_login_is_said_to_java_whose_default_mechanism_is_another():
    config = java_consumer_config(KafkaConnection("k:9092", {"sasl_plain_username": "u", "sasl_plain_password": "p",
                                                             "security_protocol": "SASL_PLAINTEXT"}))
    assert config["sasl.mechanism"] == "PLAIN" and "PlainLoginModule required" in config["sasl.jaas.config"]


@pytest.mark.parametrize("options, named", [
    ({"ssl_certfile": "/c.pem", "ssl_keyfile": "/k.pem"}, "ssl_keyfile"),
    ({"api_version": [2, 8], "ssl_crlfile": "/crl.pem"}, "api_version, ssl_crlfile"),
    ({"sasl_mechanism": "OAUTHBEARER", "sasl_plain_username": "u", "sasl_plain_password": "p"}, "OAUTHBEARER"),
])
def test_a_setting_java_cannot_be_given_is_an_error_naming_it(options, named):
    with pytest.raises(ValueError, match=named):
        java_consumer_config(KafkaConnection("k:9092", options))


def test_an_expansion_service_that_does_not_answer_fails_the_build_naming_it():
    address = f"127.0.0.1:{free_port()}"
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    with pytest.raises(ExpansionFailed, match=address):
        pipeline | ReadWithBeamKafka(BeamKafkaRead(KafkaConnection("k:9092"), ("events",), BeamKafkaIO("g", address)))


# -- Beam's records into Messages, run on the FnApiRunner ------------------------------------------


def _sdk_rows(records: list[tuple[str, int, int]]) -> list:
    """Rows as the Python SDK hands over Beam's KafkaIO records: decoded by a RowCoder of the
    rows' schema (a fresh id, as Java's is) into the NamedTuple type the SDK makes for it."""
    schema = named_tuple_to_schema(KafkaRecordRow)
    schema.id = uuid.uuid4().hex
    coder = RowCoder(schema)
    rows = [KafkaRecordRow(topic, partition, offset, 1_700_000_000_000 + offset, f"k{offset}".encode(),
                           f"{topic}/{partition}@{offset}".encode(), [], 0, "CreateTime")
            for topic, partition, offset in records]
    decoded = [coder.decode(coder.encode(row)) for row in rows]
    assert type(decoded[0]) is not KafkaRecordRow and decoded[0]._fields == KafkaRecordRow._fields
    return decoded


def _run_chunks(rows: list, max_messages: int, max_delay_s: float, check) -> None:
    """check((Messages, its element timestamp in ms) of every chunk), in the pipeline."""
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        out = (pipeline
               | beam.Create(rows)
               | RecordsToMessages(max_messages, max_delay_s)
               | beam.Map(lambda m, t=beam.DoFn.TimestampParam: (m, t.micros // 1000)))
        assert_that(out, check)


def _check_chunks(chunks, records: list[tuple[str, int, int]], max_messages: int) -> None:
    """Each chunk: consecutive offsets of one partition, its range exactly them, its values
    theirs, stamped with its newest message's time; every record in exactly one chunk."""
    seen = []
    for messages, stamped_ms in chunks:
        assert 1 <= len(messages) <= max_messages
        assert messages.offsets == list(range(messages.start, messages.next_position)), messages
        assert messages.values == [f"{messages.source}@{o}".encode() for o in messages.offsets]
        assert messages.keys == [f"k{o}".encode() for o in messages.offsets]
        assert messages.timestamps == [1_700_000_000_000 + o for o in messages.offsets]
        assert stamped_ms == max(messages.timestamps)
        seen += [(messages.topic, messages.partition, o) for o in messages.offsets]
    assert sorted(seen) == sorted(set(records))


def _check_whole_batches(records: list[tuple[str, int, int]], ranges: list[tuple[str, int, int]]) -> None:
    """Batches that hold a partition's records whole (no delay, room for all): the chunks'
    (source, start, next_position) are exactly `ranges`."""

    def check(chunks):
        _check_chunks(chunks, records, 100)
        assert sorted((m.source, m.start, m.next_position) for m, _ in chunks) == ranges

    _run_chunks(_sdk_rows(records), 100, 0, check)


def test_a_partition_s_shuffled_records_become_one_chunk_of_its_whole_range():
    records = [("events", p, o) for p in range(3) for o in range(10, 30)]
    random.Random(7).shuffle(records)
    _check_whole_batches(records, [("events/0", 10, 30), ("events/1", 10, 30), ("events/2", 10, 30)])


def test_a_missing_offset_cuts_a_chunk_so_that_no_range_claims_a_message_it_does_not_hold():
    # Offset 5 of events/0 is not in this batch (it arrives later, or was compacted away);
    # events/1's record 3 is met twice (a record counts once).
    records = [("events", 0, o) for o in (9, 0, 4, 6, 1, 2, 8, 3, 7)] + [("events", 1, o) for o in (3, 0, 3, 1, 2)]
    _check_whole_batches(records, [("events/0", 0, 5), ("events/0", 6, 10), ("events/1", 0, 4)])


def test_shuffled_records_of_many_partitions_in_small_batches_are_cut_into_contiguous_chunks():
    # Batches of 7 over shuffled records: which records share a batch is the runner's
    # business, so only what must hold whatever it does is checked.
    records = [(topic, p, o) for topic in ("events", "more") for p in range(2) for o in range(40)]
    random.Random(11).shuffle(records)
    _run_chunks(_sdk_rows(records), 7, 0.5, lambda chunks: _check_chunks(chunks, records, 7))


# -- start positions, on the real broker --------------------------------------------------------------


def test_committed_start_positions_are_where_a_consumer_of_the_group_starts(kafka_bootstrap, kafka_topic):
    create_topic(kafka_bootstrap, kafka_topic, 3)
    produce_values(kafka_bootstrap, kafka_topic, [f"m{i}".encode() for i in range(30)], 3)  # 10 a partition
    group = f"endless-{uuid.uuid4().hex[:8]}"
    io = BeamKafkaIO(group)
    connection = KafkaConnection(kafka_bootstrap)
    partitions = [TopicPartition(kafka_topic, p) for p in range(3)]

    def first_offsets() -> dict[int, int]:
        # As Beam's reader starts a partition: a consumer of the group, assigned (it joins no
        # group), taking the committed offset ("none": no committed offset would be an error).
        consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, auto_offset_reset="none",
                                 enable_auto_commit=False)
        try:
            consumer.assign(partitions)
            first = {tp.partition: consumer.position(tp) for tp in partitions}
            polled: dict[int, int] = {}
            deadline = time.monotonic() + 120  # a hang guard
            while len(polled) < 2 and time.monotonic() < deadline:  # partition 2 starts at its end: nothing to poll
                for tp, records in consumer.poll(timeout_ms=200).items():
                    polled.setdefault(tp.partition, records[0].offset)
            assert polled == {p: first[p] for p in (0, 1)}
            return first
        finally:
            consumer.close()

    BeamKafkaRead(connection, (kafka_topic,), io, {f"{kafka_topic}/0": 3, f"{kafka_topic}/1": 7,
                                                   f"{kafka_topic}/2": 10}).commit_start_positions()
    assert first_offsets() == {0: 3, 1: 7, 2: 10}
    # Resubmitted from an older checkpoint: the group's offsets go back with the server's.
    BeamKafkaRead(connection, (kafka_topic,), io, {f"{kafka_topic}/0": 1, f"{kafka_topic}/1": 2,
                                                   f"{kafka_topic}/2": 10}).commit_start_positions()
    assert first_offsets() == {0: 1, 1: 2, 2: 10}


def test_the_endless_job_reads_with_beam_s_reader_and_a_failed_expansion_leaves_the_group_alone(kafka_bootstrap,
                                                                                                   kafka_topic):
    group = f"endless-{uuid.uuid4().hex[:8]}"
    ps = PSAddress("127.0.0.1", free_port())
    config = EndlessConfig(KafkaConnection(kafka_bootstrap), {kafka_topic: "json"}, SPEC, server=None, ps=ps,
                           kafka_io=BeamKafkaIO(group, f"127.0.0.1:{free_port()}"))
    with pytest.raises(ExpansionFailed, match="could not be expanded"):
        build_pipeline(config, ps, [PartitionRange(kafka_topic, 0, 5)])
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False)
    try:
        assert consumer.committed(TopicPartition(kafka_topic, 0)) is None
    finally:
        consumer.close()


# -- the command ----------------------------------------------------------------------------------------


def _stream(tmp_path, *flags: str) -> list[str]:
    return ["stream", "--spec", str(write_spec(tmp_path)), "--topic", "events", "--workdir", str(tmp_path / "w"),
            "--bootstrap-servers", "127.0.0.1:1", "--hidden", "16,8", "--device", "cpu", *flags]


@pytest.mark.parametrize("flags, said", [
    (["--kafka-io", "beam"], "--kafka-io: only for the endless job (--endless)"),
    (["--expansion-service", "h:8097"], "--expansion-service: only for the endless job (--endless)"),
    (["--endless", "--expansion-service", "h:8097"], "--expansion-service: only with --kafka-io beam"),
    (["--endless", "--kafka-io", "beam", "--expansion-service", "h"], "--expansion-service 'h': expected HOST:PORT"),
    (["--endless", "--kafka-io", "beam", "--expansion-service", "h:8097", "--kafka-option", "ssl_keyfile=/k.pem"],
     "ssl_keyfile"),
], ids=["kafka-io-in-cycles", "expansion-service-in-cycles", "expansion-service-without-beam", "bad-address",
        "untranslatable-setting"])
def test_the_command_refuses_beam_s_reader_where_it_cannot_be(flags, said, tmp_path, capsys):
    assert main(_stream(tmp_path, *flags)) == 2
    assert said in " ".join(capsys.readouterr().err.split())


def test_with_no_expansion_service_and_no_java_the_command_says_what_is_missing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    assert main(_stream(tmp_path, "--endless", "--kafka-io", "beam")) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "needs Java" in said and "no-java" in said and "--expansion-service HOST:PORT" in said
    assert not (tmp_path / "w").exists()  # refused before anything started
