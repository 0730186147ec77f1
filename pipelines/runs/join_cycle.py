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
picasso.sample_join.join_state:

  Messages → DecodeJoinEvents ─┬→ SplitJoinEvents → JoinLabels → PackSamples ─┬→ PicassoTrain
                               └→ SpanPositions ──────────────────────────────┘

(PicassoTrain's local mode trains once, when every batch is in: that is, only when the
stream ends. tests/test_join_graph.py runs this graph under TestStream.)

The endless job trains the same graph against a parameter server that trains each sample
at most once (pipelines.runs.endless_joined): there JoinLabels identifies its samples, and
the positions that will train nothing more reach the server as batches of no samples that
name them (PackedBatch.settles): a poll's messages that carried no event
(SettleUneventful: dead letters, offsets with no message), and each orphan label once its
dead letter is written (WriteOrphanLetters).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.utils.shared import Shared
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from picasso.batch import SETTLES_KEY, PackedBatch, pack
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.connectors.element_coder import register_sized_coder
from picasso.connectors.join_events import (POSITION_COLUMN, JoinDecoders, decode_poll, impressions_of, labels_of,
                                            orphan_dead_letter)
from picasso.connectors.dead_letters.topic import DeadLetterProducer
from picasso.connectors.kafka_source import Messages
from picasso.packing import PackingPlan
from picasso.pipelines.transforms.decode import DEAD_LETTERS, DecodePollDoFn
from picasso.pipelines.transforms.message_spans import MessageSpan
from picasso.pipelines.transforms.join_labels import IDENTITY_POSITION, IDENTITY_SOURCE, IMPRESSIONS, LABELS
from picasso.pipelines.runs.joined_stream_state import JoinedTopics
from picasso.sample_join.join_rules import Impressions, Labels, OrphanLabel
from picasso.sample_identity import Range, correction_source, identity_of, runs, settled_source
from picasso.spec import FeatureSpec

ORPHANS = "orphans"


@register_sized_coder
@dataclass(frozen=True)
class JoinEventChunk:
    topic: str
    events: Impressions | Labels | None  # None: every event of the poll was refused
    span: MessageSpan
    # The positions of the poll's span that carry no event (a dead letter's, an offset that
    # held no message), as runs: nothing will ever be trained of them.
    uneventful: tuple[Range, ...] = ()

    @property
    def nbytes(self) -> int:
        return self.events.rows.nbytes if isinstance(self.events, Impressions) else 64 * len(self.events or ())


class _DecodeJoinEventsDoFn(DecodePollDoFn):
    def __init__(self, spec: FeatureSpec, topics: JoinedTopics, formats: dict[str, str],
                 letters: DeadLetterProducer | None = None, identify: bool = False):
        self.spec, self.topics, self.formats, self.letters = spec, topics, formats, letters
        self.identify = identify

    def setup(self):
        super().setup()
        self.decoders = JoinDecoders(self.spec, self.topics.join, identify=self.identify)

    def decode(self, messages: Messages):
        impressions = messages.topic == self.topics.impressions
        decoder = self.decoders.impressions if impressions else self.decoders.labels
        return decode_poll(decoder, self.formats[messages.topic], messages)

    def chunk(self, messages: Messages, decoded, span: MessageSpan) -> JoinEventChunk:
        table, events = decoded.table, None
        source = messages.source if self.identify else None
        if table.num_rows:
            events = impressions_of(table, self.decoders.feature_names, source) \
                if messages.topic == self.topics.impressions else labels_of(table, messages.source)
        if not self.identify:
            return JoinEventChunk(messages.topic, events, span)
        with_events = set(table.column(POSITION_COLUMN).to_pylist()) if table.num_rows else set()
        uneventful = runs(p for p in range(messages.start, messages.next_position) if p not in with_events)
        return JoinEventChunk(messages.topic, events, span, tuple(uneventful))


class DecodeJoinEvents(beam.PTransform):
    """Messages of the two topics in; JoinEventChunks out, and tagged `dead_letters`.
    letters_to: write each poll's letters there, acknowledged before its chunk goes on, as
    DecodeMessages does (the `dead_letters` output stays empty). identify: each impression
    keeps its source and offset, and a chunk names its positions that carry no event
    (an endless job's: picasso.sample_identity)."""

    def __init__(self, spec: FeatureSpec, topics: JoinedTopics, formats: dict[str, str],
                 letters_to: DeadLetterProducer | None = None, identify: bool = False):
        super().__init__()
        self.spec, self.topics, self.formats, self.letters_to = spec, topics, dict(formats), letters_to
        self.identify = identify

    def expand(self, messages):
        return messages | "Decode" >> beam.ParDo(
            _DecodeJoinEventsDoFn(self.spec, self.topics, self.formats, self.letters_to, self.identify)
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
        if IDENTITY_POSITION in table.schema.names:  # JoinLabels(identify=True)'s
            batch = batch.with_identities(table.column(IDENTITY_SOURCE).to_pylist(),
                                          table.column(IDENTITY_POSITION).to_numpy())
        batch = batch.with_settles(json.loads((table.schema.metadata or {}).get(SETTLES_KEY, b"{}")))
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


class Settling:
    """Which ledger namespaces a joined stream's settled position closes (picasso.sample_identity),
    and the batch of no samples that names them."""

    def __init__(self, spec: FeatureSpec, topics: JoinedTopics):
        self.topics = topics
        self.empty = PackedBatch(pack(RecordDecoder(spec).schema.empty_table(), spec, PackingPlan.from_spec(spec)).data)

    def namespaces(self, source: str) -> tuple[str, ...]:
        """An impression that will train nothing closes its sample's and its correction's
        identities; a label, its settled position."""
        if source.rsplit("/", 1)[0] == self.topics.impressions:
            return source, correction_source(source)
        return (settled_source(source),)

    def batch(self, positions: list[tuple[str, int]]) -> PackedBatch:
        return self.empty.with_settles(identity_of((name, p) for source, p in positions
                                                   for name in self.namespaces(source)))


class _SettleUneventfulDoFn(beam.DoFn):
    def __init__(self, settling: Settling):
        self.settling = settling

    def process(self, chunk: JoinEventChunk):
        if chunk.uneventful:
            yield self.settling.batch([(chunk.span.source, p) for a, b in chunk.uneventful for p in range(a, b)])


class SettleUneventful(beam.PTransform):
    """JoinEventChunks in (from a decode that wrote its letters first: DecodeJoinEvents with
    letters_to); for each poll with positions that carry no event, a PackedBatch of no
    samples that settles them."""

    def __init__(self, spec: FeatureSpec, topics: JoinedTopics):
        super().__init__()
        self.settling = Settling(spec, topics)

    def expand(self, chunks):
        return chunks | "Settle" >> beam.ParDo(_SettleUneventfulDoFn(self.settling)).with_output_types(PackedBatch)


class _OrphanLettersDoFn(beam.DoFn):
    def __init__(self, letters: DeadLetterProducer, topics: JoinedTopics, label_field: str, settling: Settling):
        self.letters, self.topics, self.label_field, self.settling = letters, topics, label_field, settling

    def setup(self):
        self.letters.open()
        self.orphans = Metrics.counter("picasso", "join_orphan_labels")

    def teardown(self):
        self.letters.close()

    def start_bundle(self):
        self.written: dict = {}  # window -> (the orphans' positions, the newest timestamp)

    def process(self, orphan: OrphanLabel, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam):
        self.letters.send(orphan_dead_letter(orphan, self.topics.join, self.label_field))
        self.orphans.inc()
        source, offset, _ = orphan.ref
        positions, newest = self.written.get(window, ([], timestamp))
        positions.append((source, int(offset)))
        self.written[window] = (positions, max(newest, timestamp))

    def finish_bundle(self):
        if not self.written:
            return
        self.letters.confirm()  # acknowledged before their positions are settled
        for window, (positions, newest) in self.written.items():
            yield WindowedValue(self.settling.batch(positions), newest, (window,))


class WriteOrphanLetters(beam.PTransform):
    """JoinLabels' orphan labels in, written as dead letters; per bundle, once the broker
    acknowledged them, a PackedBatch of no samples that settles their positions."""

    def __init__(self, letters: DeadLetterProducer, spec: FeatureSpec, topics: JoinedTopics, label_field: str):
        super().__init__()
        self.letters, self.topics, self.label_field = letters, topics, label_field
        self.settling = Settling(spec, topics)

    def expand(self, orphans):
        return orphans | "Write" >> beam.ParDo(
            _OrphanLettersDoFn(self.letters, self.topics, self.label_field, self.settling)).with_output_types(PackedBatch)
