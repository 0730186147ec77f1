"""PackFeatures and PackMessages: decoded chunks in, PackedBatches out; a Kafka chunk's
batch goes out with its MessageSpan."""

from __future__ import annotations

import apache_beam as beam

from picasso.batch import pack
from picasso.connectors.partitions import partition_time_ms
from picasso.packing import PackingPlan
from picasso.pipelines.transforms.decode import DecodedChunk
from picasso.pipelines.transforms.message_spans import DecodedMessageChunk, PackedMessages
from picasso.spec import FeatureSpec


class PackFeatures(beam.PTransform):
    """One PackedBatch per decoded chunk, carrying the chunk's source positions.

    Chunks whose every record was refused still become (empty) batches, so that their
    positions reach the checkpoint.
    """

    def __init__(self, spec: FeatureSpec):
        super().__init__()
        self.spec = spec
        self.plan = PackingPlan.from_spec(spec)

    def pack_chunk(self, chunk: DecodedChunk):
        # A chunk is one file's: its partition's time is its rows' event time.
        times = [t for t in map(partition_time_ms, chunk.positions) if t is not None]
        return pack(chunk.table, self.spec, self.plan, chunk.positions, chunk.starts).with_event_time(
            max(times, default=None))

    def expand(self, chunks):
        return chunks | "Pack" >> beam.Map(self.pack_chunk)


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
