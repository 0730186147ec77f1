"""The endless job's joined graph: impressions and labels in, batches for the parameter server out.

    Messages → DecodeJoinEvents (letters written first) ─┬→ SplitJoinEvents → JoinLabels(identify) ─┬→ PackSamples ─┐
                                                         │                                          └→ WriteOrphanLetters ┤
                                                         └→ SettleUneventful ──────────────────────────────────────────────┴→ batches

JoinLabels keeps the join in Beam's keyed state with event-time timers, so the runner
holds what is pending. Each sample is trained under its impression's source position (a
correction under "<topic>/<partition>#corrections"), and a batch's identity is the set of
its samples' positions as runs per source (picasso.sample_identity): a retried bundle's
samples are acknowledged as held and not trained again.

What a resubmitted job does with the impressions the killed job held in its state: it
reads each partition again from its first unsettled position, which the server computes
from its ledger (sample_identity.joined_positions). An impression is settled when nothing
more can be trained of it (forgotten at the join's horizon, a duplicate, a dead letter); a
label when its impression's record is forgotten, or it left as an orphan. So a resubmitted
job re-reads every impression that could still give a sample, with every label that could
still decide one, and rebuilds the join's state from them; the worker asks the server
which of a batch's samples it holds and computes the gradient of the others only
(worker.GBAWorker.step). Nothing pending is lost, and nothing is trained twice. What
follows from the re-read is in the README (The endless job: joined streams).

The job also settles, as it starts, every position before where it starts reading: a
fresh job reads from each partition's beginning, and the server's prefix of settled
positions must start at 0.
"""

from __future__ import annotations

import apache_beam as beam

from picasso.batch import PackedBatch
from picasso.connectors.join_events import JoinDecoders
from picasso.connectors.dead_letters.topic import DeadLetterProducer
from picasso.pipelines.runs.join_cycle import (DecodeJoinEvents, PackSamples, SettleUneventful, Settling,
                                               SplitJoinEvents, WriteOrphanLetters)
from picasso.pipelines.runs.joined_stream_state import JoinedTopics
from picasso.pipelines.transforms.join_labels import ORPHANS, SAMPLES, JoinLabels
from picasso.sample_identity import Range
from picasso.spec import FeatureSpec


class JoinedBatches(beam.PTransform):
    """Messages of the impression and label topics in; PackedBatches out: the join's samples
    with their identities, and batches of no samples that settle positions. Every dead
    letter (a bad event, an orphan label) is written to `letters` and acknowledged before
    anything that settles its position goes on."""

    def __init__(self, spec: FeatureSpec, topics: JoinedTopics, formats: dict[str, str], letters: DeadLetterProducer,
                 rows_per_table: int = 1000):
        super().__init__()
        self.spec, self.topics, self.formats, self.letters = spec, topics, dict(formats), letters
        self.rows_per_table = rows_per_table

    def expand(self, messages):
        spec, topics = self.spec, self.topics
        decoded = messages | "DecodeJoinEvents" >> DecodeJoinEvents(spec, topics, self.formats,
                                                                    letters_to=self.letters, identify=True)
        joined = (decoded.chunks | "SplitJoinEvents" >> SplitJoinEvents()
                  | "JoinLabels" >> JoinLabels(topics.join.policy(), JoinDecoders(spec, topics.join).feature_schema,
                                               self.rows_per_table, identify=True))
        samples = joined[SAMPLES] | "PackSamples" >> PackSamples(spec)
        orphans = joined[ORPHANS] | "WriteOrphanLetters" >> WriteOrphanLetters(self.letters, spec, topics,
                                                                               topics.join.label_of(spec.label))
        uneventful = decoded.chunks | "SettleUneventful" >> SettleUneventful(spec, topics)
        return (samples, orphans, uneventful) | "AllBatches" >> beam.Flatten().with_output_types(PackedBatch)


def settled_before(spec: FeatureSpec, topics: JoinedTopics, starts: dict[str, int]) -> dict[str, list[Range]]:
    """What a job starting to read each source at `starts` settles first: every position
    before its start (module docstring)."""
    settling = Settling(spec, topics)
    return {name: [(0, start)] for source, start in starts.items() if start > 0
            for name in settling.namespaces(source)}
