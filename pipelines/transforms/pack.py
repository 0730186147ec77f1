"""PackFeatures: decoded chunks in, PackedBatches out."""

from __future__ import annotations

import apache_beam as beam

from picasso.batch import pack
from picasso.connectors.partitions import partition_time_ms
from picasso.packing import PackingPlan
from picasso.pipelines.transforms.decode import DecodedChunk
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
