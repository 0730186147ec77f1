"""The endless job's topics read through Beam's cross-language ReadFromKafka (`--kafka-io beam`).

On Dataflow and Flink, Beam's Java KafkaIO is the reader the runner knows best (its own
splits, backlog and metrics). It is a cross-language transform: building the pipeline asks
an expansion service (a Java process) to expand it, and the runner runs it in a Java
environment. This module builds it and turns its records into the very Messages picasso's
own reader emits (connectors/kafka_source.py), so the rest of the endless graph
(DecodeMessages -> PackMessages -> PicassoTrain) is the same whichever reader runs.

Start positions. Beam's Python ReadFromKafka takes no start offset per partition: the Java
reader starts each partition at its consumer group's committed offset (`position()` of a
consumer of the group). So before the job is submitted, the parameter server's positions
are committed as the group's offsets (`commit_group_offsets`), and `auto.offset.reset` is
"none": a partition with no committed offset, or one out of range, fails the read by name
rather than start anywhere the server did not say. A job a runner restores from its own
snapshot (a Dataflow update, a Flink savepoint) reads from the snapshot's offsets instead.

Chunks. The Java reader yields one record an element. They are keyed by partition and
batched with GroupIntoBatches (keyed state and a processing-time timer, which Dataflow and
Flink run): at most `max_messages` a batch, fewer once the first has waited `max_delay_s`.
Each batch becomes Messages of consecutive offsets of one partition (`contiguous_chunks`
says why they must be).
"""

from __future__ import annotations

import shutil
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import apache_beam as beam
import numpy as np
from apache_beam.io import kafka as beam_kafka
from apache_beam.utils import subprocess_server
from apache_beam.utils.timestamp import Timestamp
from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata

from picasso.connectors.kafka_config import KafkaConnection
from picasso.connectors.kafka_java_config import java_consumer_config
from picasso.connectors.kafka_source import Messages

TIMESTAMP_POLICIES = (beam_kafka.ReadFromKafka.create_time_policy, beam_kafka.ReadFromKafka.log_append_time,
                      beam_kafka.ReadFromKafka.processing_time_policy)


class KafkaHeaderRow(typing.NamedTuple):
    key: str
    value: typing.Optional[bytes]


class KafkaRecordRow(typing.NamedTuple):
    """A record as Beam's Java reader yields it with with_metadata=True (KafkaIO's
    ByteArrayKafkaRecord as a Beam Row). The Python SDK decodes each into a NamedTuple it
    makes from the row's schema, with these fields; `RecordsToMessages` reads them by name."""

    topic: str
    partition: np.int32
    offset: np.int64
    timestamp: np.int64  # ms: the record's own (create or log-append time), whatever the timestamp policy
    key: typing.Optional[bytes]
    value: typing.Optional[bytes]
    headers: typing.Optional[typing.Sequence[KafkaHeaderRow]]
    timestampTypeId: np.int32
    timestampTypeName: str


# What a record becomes before it is batched: plain values, so that the batching's coders
# are Beam's standard ones, whatever type the SDK made for the rows.
_Partition = typing.Tuple[str, int]
_Record = typing.Tuple[int, int, typing.Optional[bytes], typing.Optional[bytes]]  # offset, timestamp ms, key, value


class ExpansionFailed(ValueError):
    """Beam's ReadFromKafka could not be expanded: no expansion service, or it refused."""


@dataclass(frozen=True)
class BeamKafkaIO:
    """What `--kafka-io beam` adds to the endless job: the group its start positions are
    committed to, and the expansion service that expands Beam's reader."""

    group_id: str
    expansion_service: str | None = None  # HOST:PORT; None: Beam starts its own (Java and Beam's jar)
    # Off: the group's offsets are picasso's, written from the server's positions before each
    # submission; the Java reader would commit what it read, which is not what the server trained.
    commit_offset_in_finalize: bool = False
    # CreateTime: elements carry the producers' event time and the watermark follows it, as
    # with picasso's own reader.
    timestamp_policy: str = beam_kafka.ReadFromKafka.create_time_policy

    def __post_init__(self):
        if not self.group_id:
            raise ValueError("--kafka-io beam needs a consumer group (--group-id): its start positions are committed "
                             "there")
        if self.timestamp_policy not in TIMESTAMP_POLICIES:
            raise ValueError(f"timestamp policy {self.timestamp_policy!r}: one of {', '.join(TIMESTAMP_POLICIES)}")
        if self.expansion_service is not None:
            host, _, port = self.expansion_service.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"--expansion-service {self.expansion_service!r}: expected HOST:PORT")


@dataclass(frozen=True)
class BeamKafkaRead:
    """One read of the job's topics with Beam's reader: where from, where each partition
    starts, and how chunks are cut (as picasso's reader cuts them: --batch-messages,
    --max-batch-delay)."""

    connection: KafkaConnection  # bootstrap servers, and TLS/SASL settings (kafka_java_config.py)
    topics: tuple[str, ...]
    io: BeamKafkaIO
    positions: Mapping[str, int] = field(default_factory=dict)  # "topic/partition" -> next offset, every partition
    max_messages: int = 1000
    max_delay_s: float = 0.5

    def __post_init__(self):
        if self.max_messages < 1:
            raise ValueError("max_messages must be at least 1")

    def consumer_config(self) -> dict[str, str]:
        return {**java_consumer_config(self.connection), "group.id": self.io.group_id,
                "enable.auto.commit": "false", "auto.offset.reset": "none"}

    def transform(self) -> beam_kafka.ReadFromKafka:
        """Beam's transform, built (not expanded: that happens when it is applied)."""
        return beam_kafka.ReadFromKafka(
            consumer_config=self.consumer_config(), topics=list(self.topics), with_metadata=True,
            commit_offset_in_finalize=self.io.commit_offset_in_finalize, timestamp_policy=self.io.timestamp_policy,
            expansion_service=self.io.expansion_service)

    def commit_start_positions(self) -> None:
        commit_group_offsets(self.connection, self.io.group_id, self.positions)


def commit_group_offsets(connection: KafkaConnection, group_id: str, positions: Mapping[str, int]) -> None:
    """Commit positions ("topic/partition" -> next offset) as the group's offsets, so that a
    consumer of the group (Beam's Java reader) starts each partition there.

    The commit comes from a consumer that joins no group, which a broker takes while the
    group has no members. Beam's reader assigns itself partitions and never joins, so the
    group stays empty unless another consumer subscribes with it (then the commit fails)."""
    offsets = {}
    for source, position in positions.items():
        topic, _, partition = source.rpartition("/")
        offsets[TopicPartition(topic, int(partition))] = OffsetAndMetadata(position, "picasso: the server's position",
                                                                           -1)
    if not offsets:
        return
    consumer = connection.consumer(group_id=group_id)
    try:
        consumer.commit(offsets)
    finally:
        consumer.close()


def check_before_start(io: BeamKafkaIO, connection: KafkaConnection) -> None:
    """What can be known before the job starts anything: the connection's settings have
    Java names, and an expansion service can be had.

    With no expansion service given, Beam starts its own: `java -jar` on Beam's
    expansion-service jar, fetched from Maven Central into its cache the first time. Say
    which of the two is missing."""
    java_consumer_config(connection)  # a setting with no Java name is an error naming it
    if io.expansion_service:
        return  # what it says is known when the pipeline is built (ExpansionFailed)
    hint = "or give --expansion-service HOST:PORT (a Flink job server's, say: port 8097)"
    java = subprocess_server.JavaHelper.get_java()
    if not shutil.which(java):
        raise ExpansionFailed(f"--kafka-io beam: Beam's own expansion service needs Java, and there is none at "
                              f"{java!r} ($JAVA_HOME, else PATH): install a JRE, {hint}")
    jar = beam_kafka.default_io_expansion_service().path_to_jar
    try:
        subprocess_server.JavaJarServer.local_jar(jar)
    except Exception as err:  # noqa: BLE001 - no network, a proxy, a mirror: Beam says which
        raise ExpansionFailed(f"--kafka-io beam: Beam's own expansion service needs its jar, which is not in "
                              f"{subprocess_server.JavaJarServer.JAR_CACHE} and could not be fetched from {jar} "
                              f"({err}): put it there, {hint}") from None


class ReadWithBeamKafka(beam.PTransform):
    """PBegin in; Messages out, as picasso's own ReadFromKafka yields them."""

    def __init__(self, read: BeamKafkaRead):
        super().__init__()
        self.read = read

    def expand(self, pbegin):
        transform = self.read.transform()
        try:
            records = pbegin | "ReadFromKafka" >> transform  # the expansion service is asked here
        except Exception as err:  # noqa: BLE001 - gRPC, the jar, Java's refusal: all end the job at its start
            where = self.read.io.expansion_service or "Beam's own, started with Java"
            raise ExpansionFailed(f"Beam's ReadFromKafka could not be expanded by the expansion service "
                                  f"({where}): {type(err).__name__}: {err}") from None
        return records | "Chunks" >> RecordsToMessages(self.read.max_messages, self.read.max_delay_s)


class RecordsToMessages(beam.PTransform):
    """Beam's Kafka rows (KafkaRecordRow) in; Messages of consecutive offsets of one
    partition out, at most max_messages each."""

    def __init__(self, max_messages: int, max_delay_s: float):
        super().__init__()
        self.max_messages = max_messages
        self.max_delay_s = max_delay_s

    def expand(self, records):
        return (
            records
            | "ByPartition" >> beam.Map(_by_partition).with_output_types(typing.Tuple[_Partition, _Record])
            | "Batches" >> beam.GroupIntoBatches(self.max_messages, max_buffering_duration_secs=self.max_delay_s)
            | "Contiguous" >> beam.FlatMapTuple(contiguous_chunks).with_output_types(Messages)
        )


def _by_partition(record) -> tuple[_Partition, _Record]:
    return (record.topic, int(record.partition)), (int(record.offset), int(record.timestamp), record.key,
                                                    record.value)


def contiguous_chunks(partition: _Partition, records: Iterable[_Record]) -> Iterator[beam.window.TimestampedValue]:
    """A batch of one partition's records as Messages of consecutive offsets, in order.

    The parameter server's ledger takes each chunk's range [start, next_position) whole:
    it trains a range it holds none of, acknowledges one it holds all of, and refuses one
    it holds only in part (a gradient cannot be split). So a chunk's range must hold exactly
    its messages. A shuffle (the batching's) may hand a partition's records over in any
    order: the batch is sorted, and cut wherever an offset is missing. Had 0, 1, 3 gone
    as one range [0, 4), offset 2, arriving in a later batch, would be acknowledged as
    held and never trained. (A compacted topic's missing offsets cut chunks short too.)

    Each chunk is stamped with its newest message's time, as picasso's reader stamps its
    elements (the batching's output time is its timer's)."""
    topic, number = partition
    by_offset = {record[0]: record for record in records}  # a record met twice counts once
    run: list[_Record] = []
    for offset in sorted(by_offset):
        if run and offset != run[-1][0] + 1:
            yield _chunk(topic, number, run)
            run = []
        run.append(by_offset[offset])
    if run:
        yield _chunk(topic, number, run)


def _chunk(topic: str, partition: int, run: list[_Record]) -> beam.window.TimestampedValue:
    offsets, timestamps, keys, values = (list(column) for column in zip(*run))
    messages = Messages(topic, partition, offsets[0], offsets[-1] + 1, offsets, values, keys, timestamps)
    return beam.window.TimestampedValue(messages, Timestamp(micros=max(timestamps) * 1000))

