"""The joined training graph of a streaming runner, after its source, under TestStream.

The Kafka source is replaced by a TestStream of the `Messages` it would yield: the
planted model's impression events on a topic of two partitions and their click events
on a topic of one, as JSON, each message stamped with its event time. The messages come
in steps of event time, the watermark advancing after each, and at the end to infinity:

  TestStream → DecodeJoinEvents ─┬→ SplitJoinEvents → JoinLabels → PackSamples ─┬→ PicassoTrain (local)
                                 ├→ SpanPositions ──────────────────────────────┘
                                 └→ dead letters

The model must end with every partition's next offset, trained on exactly the samples
the core (JoinState) emits for the same events and watermarks, and the bad messages must
leave as dead letters.

Impressions arrive in the step of their event time and the watermark trails every step's
events, so no impression arrives past its timeout: the streams where both hosts of the
join agree by design (see pipelines.join_labels).
"""

from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing import test_stream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.trigger import AccumulationMode, AfterWatermark
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.timestamp import Timestamp
from stream_helpers import SPEC, load_state

from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.join_events import JoinDecoders, decode_poll, impressions_of, labels_of
from picasso.connectors.kafka_config import source_name
from picasso.connectors.kafka_source import Messages
from picasso.sample_join.join_spec import JoinSpec
from picasso.pipelines.transforms.decode import DEAD_LETTERS
from picasso.pipelines.runs.join_cycle import DecodeJoinEvents, PackSamples, SpanPositions, SplitJoinEvents
from picasso.pipelines.transforms.join_labels import SAMPLES, JoinLabels
from picasso.pipelines.runs.joined_stream_state import JoinedTopics
from picasso.pipelines.transforms.train import PicassoTrain
from picasso.pipelines.transforms.train_handlers import TrainerHandler
from picasso.sample_join.join_state import JoinState
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.connectors.synthetic.events import EventStreamConfig, make_event_stream
from picasso.trainer import TrainConfig

START_MS = 1_780_000_000_000
STEP_MS = 2_000  # event time per step of the TestStream
IMPRESSION_TOPIC, LABEL_TOPIC = "graph-impressions", "graph-labels"
IMPRESSION_PARTITIONS = 2
JOIN = JoinSpec(wait_ms=4_000, late_labels="correct", horizon_ms=10_000, orphan_grace_ms=2_000)
TOPICS = JoinedTopics(IMPRESSION_TOPIC, LABEL_TOPIC, JOIN)
FORMATS = {IMPRESSION_TOPIC: "json", LABEL_TOPIC: "json"}
# Clicks a few seconds after their impressions, some beyond the wait (late, corrected), some twice.
EVENTS = EventStreamConfig(start_ms=START_MS, impressions_per_s=20.0, label_delay_mean_ms=2_000,
                           duplicate_fraction=0.1)
IMPRESSIONS = 300
BAD_IMPRESSION = b"{broken"
BAD_LABEL_AT_MS = START_MS + 3 * STEP_MS + 500


def _json(row: dict) -> bytes:
    return json.dumps(row, separators=(",", ":")).encode()


class Partition:
    """One partition's messages as a source would yield them: offsets from 0, one after
    another, each message stamped with its event time."""

    def __init__(self, topic: str, partition: int):
        self.topic, self.partition = topic, partition
        self.next_offset = 0

    def poll(self, values: list[bytes], times_ms: list[int]) -> Messages:
        start = self.next_offset
        self.next_offset += len(values)
        return Messages(self.topic, self.partition, start, self.next_offset, list(range(start, self.next_offset)),
                        values, [None] * len(values), list(times_ms))


def polls_in_steps() -> tuple[list[tuple[list[Messages], int]], dict[str, int]]:
    """The messages in steps of STEP_MS of event time, each with the watermark that follows
    it (the step's end); and each partition's next offset after all of them.

    Impressions go round-robin to the two partitions. The bad messages: a label of 0.5
    among the valid labels, and invalid JSON on the impression topic, a step after the
    last impression: the last poll of its partition, with no valid event, so that only
    that poll's span can carry the partition's final position."""
    events = make_event_stream(PlantedModel(SPEC), IMPRESSIONS, stream=5, config=EVENTS)
    timed = []  # (time, topic, partition, value)
    for i, row in enumerate(events.impressions.to_pylist()):
        timed.append((row["event_time_ms"], IMPRESSION_TOPIC, i % IMPRESSION_PARTITIONS, _json(row)))
    for row in events.labels.to_pylist():
        timed.append((row["event_time_ms"], LABEL_TOPIC, 0, _json(row)))
    timed.append((max(events.impressions.column("event_time_ms").to_pylist()) + STEP_MS, IMPRESSION_TOPIC, 0,
                  BAD_IMPRESSION))
    timed.append((BAD_LABEL_AT_MS, LABEL_TOPIC, 0,
                  _json({"request_id": "r-bad", "event_time_ms": BAD_LABEL_AT_MS, SPEC.label: 0.5})))
    timed.sort(key=lambda event: event[0])

    partitions = {(IMPRESSION_TOPIC, p): Partition(IMPRESSION_TOPIC, p) for p in range(IMPRESSION_PARTITIONS)}
    partitions[(LABEL_TOPIC, 0)] = Partition(LABEL_TOPIC, 0)
    steps = []
    end = START_MS
    while timed:
        end += STEP_MS
        due, timed = [e for e in timed if e[0] < end], [e for e in timed if e[0] >= end]
        polls = []
        for (topic, p), partition in partitions.items():
            mine = [(time, value) for time, t, q, value in due if (t, q) == (topic, p)]
            if mine:
                polls.append(partition.poll([value for _, value in mine], [time for time, _ in mine]))
        steps.append((polls, end))
    return steps, {source_name(*key): partition.next_offset for key, partition in partitions.items()}


def core_samples(steps) -> int:
    """How many samples JoinState emits for the same events and watermarks (then one past
    every deadline: what the watermark's advance to infinity does to Beam's timers)."""
    decoders = JoinDecoders(SPEC, JOIN)
    core = JoinState(JOIN.policy(), decoders.feature_schema)
    emitted = 0
    for polls, watermark in steps:
        for messages in polls:
            impressions = messages.topic == IMPRESSION_TOPIC
            decoded = decode_poll(decoders.impressions if impressions else decoders.labels, "json", messages)
            if decoded.table.num_rows:
                events = impressions_of(decoded.table, decoders.feature_names) if impressions else \
                    labels_of(decoded.table, messages.source)
                out = core.advance(events if impressions else None, None if impressions else events, None)
                emitted += out.samples.num_rows
        emitted += core.advance(None, None, watermark).samples.num_rows
    past_every_deadline = steps[-1][1] + JOIN.policy().keep_ms + JOIN.orphan_grace_ms + 1
    emitted += core.advance(None, None, past_every_deadline).samples.num_rows
    assert core.counts.positives and core.counts.negatives and core.counts.corrections and core.counts.duplicate_labels
    return emitted


def at_the_end() -> beam.WindowInto:
    """Local mode trains every batch of a run in one call, once all of them are in (a
    grouping in the global window: train.PicassoTrain._train_together). Beam refuses such
    a grouping of an unbounded collection under the default trigger, which could never fire
    on an endless stream; here the stream ends, so one firing when the watermark passes the
    window's end (the TestStream's advance to infinity) is the run's end, said explicitly."""
    return beam.WindowInto(GlobalWindows(), trigger=AfterWatermark(), accumulation_mode=AccumulationMode.DISCARDING)


def _ms(ms: int) -> Timestamp:
    return Timestamp(micros=ms * 1000)


def test_the_joined_graph_trains_the_cores_samples_and_ends_at_every_partitions_next_offset(tmp_path):
    steps, next_offsets = polls_in_steps()
    last_of_partition_0 = [m for polls, _ in steps for m in polls if m.source == source_name(IMPRESSION_TOPIC, 0)][-1]
    assert last_of_partition_0.values == [BAD_IMPRESSION]
    stream = test_stream.TestStream()
    for polls, watermark in steps:
        # Each poll at its newest message's time, as the Kafka source stamps its elements.
        stream.add_elements([beam.window.TimestampedValue(m, _ms(max(m.timestamps))) for m in polls])
        stream.advance_watermark_to(_ms(watermark))
    stream.advance_watermark_to_infinity()

    checkpoints = tmp_path / "checkpoints"
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--streaming"]))
    decoded = pipeline | stream | DecodeJoinEvents(SPEC, TOPICS, FORMATS)
    joined = decoded.chunks | SplitJoinEvents() | JoinLabels(JOIN.policy(), JoinDecoders(SPEC, JOIN).feature_schema)
    batches = (joined[SAMPLES] | PackSamples(SPEC), decoded.chunks | SpanPositions(SPEC)) | beam.Flatten()
    batches | at_the_end() | PicassoTrain(
        TrainerHandler.for_run(SPEC, TrainConfig(hidden=(8,), device="cpu"), checkpoints))
    # Each letter's topic and its reason up to the parser's details.
    dead = decoded[DEAD_LETTERS] | beam.Map(lambda letter: (letter.topic, letter.reason.split(":")[0]))
    assert_that(dead, equal_to([(IMPRESSION_TOPIC, "invalid JSON"), (LABEL_TOPIC, "label must be 0 or 1, got 0.5")]),
                label="DeadLetters")
    result = pipeline.run()
    assert result.wait_until_finish() == PipelineState.DONE

    checkpoint = latest_checkpoint(checkpoints)
    assert checkpoint is not None
    assert load_checkpoint(checkpoint).positions == next_offsets
    state = load_state(checkpoint)
    assert state["step"] > 0 and state["samples"] == core_samples(steps)
