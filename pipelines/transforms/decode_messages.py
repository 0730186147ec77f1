"""DecodeMessages and PackMessages: Kafka polls in, PackedBatches with their offset spans out.

The Kafka counterparts of DecodeRecords/PackFeatures. They differ where Kafka differs:
- a topic's format is json, arrow (many rows per message) or tsv (see
  connectors.message_formats), and a dead letter keeps the message's original bytes;
- every batch carries its MessageSpan: which partition, which position range
  [start, next_position), how many messages and records. The stream's ledger checks the
  spans against the checkpoint, which is how a run proves that no message was trained
  twice or skipped.
There is no holdout split: a stream is evaluated prequentially (each batch is scored
before it is trained on).
"""

from __future__ import annotations

from dataclasses import dataclass

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from picasso.batch import PackedBatch, pack
from picasso.connectors.element_coder import register_sized_coder
from picasso.connectors.decoders import DecodeOptions, RecordDecoder
from picasso.connectors.kafka_source import Messages
from picasso.connectors.message_formats import FORMATS, decode_messages
from picasso.pipelines.transforms.pack import PackFeatures
from picasso.spec import FeatureSpec

DEAD_LETTERS = "dead_letters"


@dataclass(frozen=True)
class MessageSpan:
    source: str  # topic/partition
    start: int
    next_position: int
    messages: int
    records_in: int
    records_refused: int
    newest_timestamp_ms: int | None  # of the newest message in the span
    offset_sum: int = 0  # sum of the span's message offsets: which messages, in one number


@register_sized_coder
@dataclass(frozen=True)
class DecodedMessageChunk:
    table: pa.Table  # canonical rows
    span: MessageSpan

    @property
    def nbytes(self) -> int:
        return self.table.nbytes


@register_sized_coder
@dataclass(frozen=True)
class PackedMessages:
    batch: PackedBatch
    span: MessageSpan

    @property
    def nbytes(self) -> int:
        return self.batch.data.nbytes


class DecodePollDoFn(beam.DoFn):
    """What every decode of a Kafka poll does around its decoder: count the messages,
    records and refusals, send the dead letters to the tagged output, and make the poll's
    MessageSpan. Subclasses decode (decode) and make the main element (chunk)."""

    def setup(self):
        self.messages_in = Metrics.counter("picasso", "messages_in")
        self.records_in = Metrics.counter("picasso", "rows_in")
        self.dead = Metrics.counter("picasso", "dead_letters")

    def decode(self, messages: Messages):
        raise NotImplementedError

    def chunk(self, messages: Messages, decoded, span: MessageSpan):
        raise NotImplementedError

    def process(self, messages: Messages):
        decoded = self.decode(messages)
        self.messages_in.inc(len(messages))
        self.records_in.inc(decoded.records_in)
        self.dead.inc(decoded.records_refused)
        for letter in decoded.dead_letters:
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, letter)
        span = MessageSpan(
            source=messages.source, start=messages.start, next_position=messages.next_position,
            messages=len(messages), records_in=decoded.records_in, records_refused=decoded.records_refused,
            newest_timestamp_ms=max(messages.timestamps) if messages.timestamps else None,
            offset_sum=sum(messages.offsets),
        )
        yield self.chunk(messages, decoded, span)


class _DecodeMessagesDoFn(DecodePollDoFn):
    def __init__(self, spec: FeatureSpec, formats: dict[str, str], options: DecodeOptions):
        self.spec = spec
        self.formats = formats
        self.options = options

    def setup(self):
        super().setup()
        self.decoder = RecordDecoder(self.spec, self.options)

    def decode(self, messages: Messages):
        return decode_messages(self.decoder, self.formats[messages.topic], messages)

    def chunk(self, messages: Messages, decoded, span: MessageSpan) -> DecodedMessageChunk:
        return DecodedMessageChunk(decoded.table, span)


class DecodeMessages(beam.PTransform):
    """Messages in. Main output: DecodedMessageChunks (valid rows + span); tagged output
    `dead_letters`: one MessageDeadLetter per message with any refused record."""

    def __init__(self, spec: FeatureSpec, formats: dict[str, str], options: DecodeOptions = DecodeOptions()):
        super().__init__()
        bad = {topic: fmt for topic, fmt in formats.items() if fmt not in FORMATS}
        if bad:
            raise ValueError(f"unknown message format(s) {bad}: expected one of {', '.join(FORMATS)}")
        self.spec = spec
        self.formats = dict(formats)
        self.options = options

    def expand(self, messages):
        return messages | "Decode" >> beam.ParDo(
            _DecodeMessagesDoFn(self.spec, self.formats, self.options)
        ).with_output_types(DecodedMessageChunk).with_outputs(DEAD_LETTERS, main="chunks")


class PackMessages(PackFeatures):
    """One PackedMessages per chunk; its PackedBatch carries the partition's next position.
    Chunks whose every record was refused still become (empty) batches, so their
    positions reach the checkpoint."""

    def pack_chunk(self, chunk: DecodedMessageChunk) -> PackedMessages:
        span = chunk.span
        batch = pack(chunk.table, self.spec, self.plan, {span.source: span.next_position}, {span.source: span.start})
        return PackedMessages(batch.with_event_time(span.newest_timestamp_ms), span)

    def expand(self, chunks):
        return chunks | "Pack" >> beam.Map(self.pack_chunk).with_output_types(PackedMessages)
