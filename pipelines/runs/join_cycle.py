"""One cycle of a joined `picasso stream`: decode → join → pack → train.

  ReadFromKafka → DecodeJoinEvents ─┬→ JoinInCycle ─┬→ PackSamples → PicassoTrain(JoinedStreamHandler)
                                    │               └→ orphan labels ─┐
                                    └→ bad events ────────────────────┴→ dead-letter topic

DecodeJoinEvents decodes each poll with its topic's decoder (connectors.join_events):
impression polls become join_rules.Impressions, label polls join_rules.Labels, each with
the poll's MessageSpan. JoinInCycle hands them, in the order they come, to the stream's
JoinedStreamModel (the one the training step trains, held under the same Shared and key),
which joins them and returns full training batches. Nothing of the join lives in the
Beam graph between cycles: it is in the model's checkpoint (pipelines.joined_stream_state).

On a streaming runner the same samples come from pipelines.join_labels.JoinLabels, which
keeps the join in Beam's keyed state instead; both take their decisions from
picasso.sample_join:

  Messages → DecodeJoinEvents ─┬→ SplitJoinEvents → JoinLabels → PackSamples ─┬→ PicassoTrain
                               └→ SpanPositions ──────────────────────────────┘

(PicassoTrain's local mode trains once, when every batch is in: that is, only when the
stream ends. tests/test_join_graph.py runs this graph under TestStream.)
"""

from __future__ import annotations

from dataclasses import dataclass

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.utils.shared import Shared
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp

from picasso.batch import PackedBatch, pack
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.connectors.element_coder import register_sized_coder
from picasso.connectors.join_events import JoinDecoders, decode_poll, impressions_of, labels_of, orphan_dead_letter
from picasso.connectors.kafka_source import Messages
from picasso.packing import PackingPlan
from picasso.pipelines.transforms.decode import DEAD_LETTERS, DecodePollDoFn
from picasso.pipelines.transforms.message_spans import MessageSpan
from picasso.pipelines.transforms.join_labels import IMPRESSIONS, LABELS
from picasso.pipelines.runs.joined_stream_state import JoinedTopics
from picasso.join_rules import Impressions, Labels
from picasso.spec import FeatureSpec

ORPHANS = "orphans"


@register_sized_coder
@dataclass(frozen=True)
class JoinEventChunk:
    topic: str
    events: Impressions | Labels | None  # None: every event of the poll was refused
    span: MessageSpan

    @property
    def nbytes(self) -> int:
        return self.events.rows.nbytes if isinstance(self.events, Impressions) else 64 * len(self.events or ())


class _DecodeJoinEventsDoFn(DecodePollDoFn):
    def __init__(self, spec: FeatureSpec, topics: JoinedTopics, formats: dict[str, str]):
        self.spec, self.topics, self.formats = spec, topics, formats

    def setup(self):
        super().setup()
        self.decoders = JoinDecoders(self.spec, self.topics.join)

    def decode(self, messages: Messages):
        impressions = messages.topic == self.topics.impressions
        decoder = self.decoders.impressions if impressions else self.decoders.labels
        return decode_poll(decoder, self.formats[messages.topic], messages)

    def chunk(self, messages: Messages, decoded, span: MessageSpan) -> JoinEventChunk:
        table, events = decoded.table, None
        if table.num_rows:
            events = impressions_of(table, self.decoders.feature_names) if messages.topic == self.topics.impressions \
                else labels_of(table, messages.source)
        return JoinEventChunk(messages.topic, events, span)


class DecodeJoinEvents(beam.PTransform):
    """Messages of the two topics in; JoinEventChunks out, and tagged `dead_letters`."""

    def __init__(self, spec: FeatureSpec, topics: JoinedTopics, formats: dict[str, str]):
        super().__init__()
        self.spec, self.topics, self.formats = spec, topics, dict(formats)

    def expand(self, messages):
        return messages | "Decode" >> beam.ParDo(
            _DecodeJoinEventsDoFn(self.spec, self.topics, self.formats)
        ).with_output_types(JoinEventChunk).with_outputs(DEAD_LETTERS, main="chunks")


class _JoinInCycleDoFn(beam.DoFn):
    def __init__(self, loader, key: str, shared: Shared, label_field: str):
        self.loader, self.key, self.shared, self.label_field = loader, key, shared, label_field

    def setup(self):
        self.model = self.shared.acquire(self.loader, tag=self.key)
        # The runner checks this against the model's ledger: the pipeline joined into this
        # very model (see stream.StreamRunner.run_cycle).
        self.taken = Metrics.counter("picasso", "messages_trained")
        self.orphans = Metrics.counter("picasso", "join_orphan_labels")

    def process(self, chunk: JoinEventChunk):
        batches, orphans = self.model.take(chunk)
        self.taken.inc(chunk.span.messages)
        self.orphans.inc(len(orphans))
        for orphan in orphans:
            yield beam.pvalue.TaggedOutput(ORPHANS, orphan_dead_letter(orphan, self.model.topics.join, self.label_field))
        yield from batches


class JoinInCycle(beam.PTransform):
    """JoinEventChunks in, in order; full sample tables out, and tagged `orphans` (dead
    letters of labels that found no impression)."""

    def __init__(self, loader, key: str, shared: Shared, label_field: str):
        super().__init__()
        self.loader, self.key, self.shared, self.label_field = loader, key, shared, label_field

    def expand(self, chunks):
        return chunks | "Join" >> beam.ParDo(
            _JoinInCycleDoFn(self.loader, self.key, self.shared, self.label_field)
        ).with_output_types(pa.Table).with_outputs(ORPHANS, main="samples")


class PackSamples(beam.PTransform):
    """Sample tables in, PackedBatches out (the join's own columns are not packed), each
    carrying its table's event timestamp as its event time: JoinLabels stamps a table with
    its newest sample's, and a table JoinInCycle emits keeps the timestamp of the poll that
    completed it (its newest message's)."""

    def __init__(self, spec: FeatureSpec):
        super().__init__()
        self.spec = spec
        self.plan = PackingPlan.from_spec(spec)

    def pack_samples(self, table: pa.Table, timestamp=beam.DoFn.TimestampParam) -> PackedBatch:
        batch = pack(table, self.spec, self.plan)
        if not isinstance(timestamp, Timestamp) or not MIN_TIMESTAMP < timestamp < MAX_TIMESTAMP:
            return batch  # a table outside event time (a bounded source's default)
        return batch.with_event_time(timestamp.micros // 1000)

    def expand(self, samples):
        return samples | "Pack" >> beam.Map(self.pack_samples).with_output_types(PackedBatch)


def _events_by_kind(chunk: JoinEventChunk):
    if isinstance(chunk.events, Impressions):
        yield beam.pvalue.TaggedOutput(IMPRESSIONS, chunk.events)
    elif isinstance(chunk.events, Labels):
        yield beam.pvalue.TaggedOutput(LABELS, chunk.events)


class SplitJoinEvents(beam.PTransform):
    """JoinEventChunks in; {IMPRESSIONS: Impressions, LABELS: Labels} out: the input
    join_labels.JoinLabels takes. A chunk whose every event was refused carries none (its
    span still counts: SpanPositions)."""

    def expand(self, chunks):
        split = chunks | "ByKind" >> beam.FlatMap(_events_by_kind).with_outputs(IMPRESSIONS, LABELS)
        return {IMPRESSIONS: split[IMPRESSIONS], LABELS: split[LABELS]}


class SpanPositions(beam.PTransform):
    """JoinEventChunks in; for each, a PackedBatch with no samples whose positions are its
    span's ({source: next position}).

    JoinLabels' samples carry no positions: a sample leaves the join long after its
    impression's message, often decided by another partition's label or by the watermark.
    So the positions reach the trainer on batches of their own, which it merges without
    training (Trainer._finish). They say how far the source was read; the impressions
    still pending then live in the runner's keyed state, not in the model's checkpoint."""

    def __init__(self, spec: FeatureSpec):
        super().__init__()
        self.spec = spec
        self.plan = PackingPlan.from_spec(spec)
        self.empty = RecordDecoder(spec).schema.empty_table()

    def positions_of(self, chunk: JoinEventChunk) -> PackedBatch:
        return pack(self.empty, self.spec, self.plan, positions={chunk.span.source: chunk.span.next_position})

    def expand(self, chunks):
        return chunks | "Positions" >> beam.Map(self.positions_of).with_output_types(PackedBatch)
