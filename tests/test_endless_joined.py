"""The endless job's joined graph (pipelines/runs/endless_joined.py) and the multi-range
identity that makes its parameter server train each sample at most once.

The graph runs under TestStream on `DirectRunner --streaming` (the BundleBasedDirectRunner,
which fails on the Kafka read's splittable DoFn: FACTS.md), so the TestStream yields the
`Messages` the read would: impressions on a topic of two partitions, labels on one, as
JSON, in steps of event time with the watermark after each, a jump of the watermark past
every deadline in the middle, and at the end to infinity. It trains with
PicassoTrain(GBAHandler(...), unbounded=True) against `picasso ps --endless` started as a
process, as an operator starts it; dead letters go to a real broker.

The stream holds late labels (corrected), labels sent twice, impressions sent twice,
orphan labels (of no impression, and beyond the horizon), a bad impression and a bad
label. The samples trained must be the join core's (JoinState) for the same events and
watermarks, each under its impression's position, and the server's ledger must hold each
impression, each correction's namespace and each label once, its positions at every
partition's end.
"""

from __future__ import annotations

import json
import random
import signal
import sys
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
import torch
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing import test_stream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.timestamp import Timestamp
from helpers import refusal_in_process
from kafka_broker import create_topic
from stream_helpers import SPEC, start_process, wait_until_serving, write_spec

from picasso.batch import PackedBatch, pack
from picasso.checkpoint import load_checkpoint, read_applied
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.connectors.join_events import JoinDecoders, decode_poll, impressions_of, labels_of
from picasso.connectors.kafka_config import KafkaConnection, source_name
from picasso.connectors.dead_letters.policy import DeadLetterPolicy
from picasso.connectors.dead_letters.topic import DeadLetterProducer
from picasso.connectors.kafka_source import Messages
from picasso.connectors.testing.param_server import in_process
from picasso.distributed.gba import GBAConfig
from picasso.distributed.applied_ranges import AppliedRanges
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.param_server import ServerAddress
from picasso.distributed.ps_checkpoint import build_shard
from picasso.distributed.ps_client import PSClient
from picasso.distributed.transport import free_port
from picasso.distributed.worker import GBAWorker, WorkerStats
from picasso.sample_join.join_rules import CORRECTION_COLUMN, KEY_COLUMN
from picasso.sample_join.join_spec import JoinSpec
from picasso.models import build_model
from picasso.packing import PackingPlan
from picasso.pipelines.runs.endless_joined import JoinedBatches
from picasso.pipelines.runs.joined_stream_state import JoinedTopics
from picasso.pipelines.transforms.gba_train import PSAddress
from picasso.pipelines.transforms.train import PicassoTrain
from picasso.pipelines.transforms.train_handlers import GBAHandler
from picasso.sample_identity import correction_source, held_mask, joined_positions, runs, settled_source
from picasso.sample_join.join_state import JoinState
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.connectors.synthetic.events import EventStreamConfig, make_event_stream
from picasso.trainer import TrainConfig, Trainer

START_MS = 1_780_000_000_000
STEP_MS = 2_000
JUMP_MS = 60_000  # the second part of the stream starts this much later: the watermark jumps past every deadline
IMPRESSION_TOPIC, LABEL_TOPIC = "joined-impressions", "joined-labels"
IMPRESSION_PARTITIONS = 2
JOIN = JoinSpec(wait_ms=4_000, late_labels="correct", horizon_ms=4_000, orphan_grace_ms=2_000)
TOPICS = JoinedTopics(IMPRESSION_TOPIC, LABEL_TOPIC, JOIN)
FORMATS = {IMPRESSION_TOPIC: "json", LABEL_TOPIC: "json"}
# Clicks 3 s after their impressions on average: some beyond the wait (late, corrected),
# some beyond the horizon (orphans told of their impression), a fifth of them sent twice.
EVENTS = EventStreamConfig(impressions_per_s=20.0, label_delay_mean_ms=3_000, duplicate_fraction=0.2)
IMPRESSIONS_PER_PART = 100


def _json(row: dict) -> bytes:
    return json.dumps(row, separators=(",", ":")).encode()


def timed_events(rng: random.Random, seed: int) -> list[tuple[int, str, int, bytes]]:
    """(event time, topic, partition, value): two parts of planted events, the second
    JUMP_MS after the first, with impressions sent twice, orphan labels, a bad impression
    and a bad label."""
    timed = []
    for part in range(2):
        config = EventStreamConfig(**{**EVENTS.__dict__, "start_ms": START_MS + part * JUMP_MS})
        events = make_event_stream(PlantedModel(SPEC), IMPRESSIONS_PER_PART, stream=seed * 2 + part, config=config)
        for row in events.impressions.to_pylist():
            partition = rng.randrange(IMPRESSION_PARTITIONS)
            timed.append((row["event_time_ms"], IMPRESSION_TOPIC, partition, _json(row)))
            if rng.random() < 0.08:  # logged twice, on either partition, a little later
                again = {**row, "event_time_ms": row["event_time_ms"] + rng.randrange(100, 1_500)}
                timed.append((again["event_time_ms"], IMPRESSION_TOPIC, rng.randrange(IMPRESSION_PARTITIONS),
                              _json(again)))
        for row in events.labels.to_pylist():
            timed.append((row["event_time_ms"], LABEL_TOPIC, 0, _json(row)))
        for i in range(3):  # clicks of impressions that never came
            at = START_MS + part * JUMP_MS + rng.randrange(1_000, 5_000)
            timed.append((at, LABEL_TOPIC, 0, _json({"request_id": f"nobody-{part}-{i}", "event_time_ms": at,
                                                      SPEC.label: 1})))
    bad_at = START_MS + 3_100
    timed.append((bad_at, IMPRESSION_TOPIC, 1, b"{broken"))
    timed.append((bad_at, LABEL_TOPIC, 0, _json({"request_id": "r-bad", "event_time_ms": bad_at, SPEC.label: 0.5})))
    timed.sort(key=lambda event: event[0])
    return timed


def with_offsets(timed) -> list[tuple[int, str, int, int, bytes]]:
    """(time, topic, partition, offset, value): each partition's events get offsets from 0
    in the order they come."""
    next_offset: dict[tuple[str, int], int] = {}
    placed = []
    for time, topic, partition, value in timed:
        offset = next_offset.get((topic, partition), 0)
        next_offset[(topic, partition)] = offset + 1
        placed.append((time, topic, partition, offset, value))
    return placed


def polls_in_steps(events, positions: dict[str, int] | None = None) -> list[tuple[list[Messages], int]]:
    """The events (with_offsets) from `positions` on (None: all), in steps of STEP_MS of
    event time as the source polls them, each step with the watermark at its end; where no
    event is due for a while, the watermark jumps to the next one's step."""
    events = [e for e in events if e[3] >= (positions or {}).get(source_name(e[1], e[2]), 0)]
    steps, end = [], START_MS
    while events:
        end = max(end + STEP_MS, events[0][0] + 1)  # the jump: past the gap at once
        due, events = [e for e in events if e[0] < end], [e for e in events if e[0] >= end]
        polls = []
        for topic, partition in sorted({(e[1], e[2]) for e in due}):
            mine = [e for e in due if (e[1], e[2]) == (topic, partition)]
            offsets = [e[3] for e in mine]
            polls.append(Messages(topic, partition, offsets[0], offsets[-1] + 1, offsets, [e[4] for e in mine],
                                  [None] * len(mine), [e[0] for e in mine]))
        steps.append((polls, end))
    return steps


def ends(events) -> dict[str, int]:
    """Every partition's next offset after the events."""
    found: dict[str, int] = {}
    for _, topic, partition, offset, _ in events:
        found[source_name(topic, partition)] = max(found.get(source_name(topic, partition), 0), offset + 1)
    return found


def core_samples(steps) -> tuple[list[tuple[str, int, float]], JoinState]:
    """What JoinState emits for the same events and watermarks (then one past every
    deadline: the watermark's advance to infinity), as (identity source, position, label):
    each sample under its impression's source and offset, a correction under its source's
    correction namespace."""
    decoders = JoinDecoders(SPEC, JOIN, identify=True)
    core = JoinState(JOIN.policy(), decoders.feature_schema)
    where: dict[int, tuple[str, int]] = {}  # key -> its first impression's (source, offset)
    samples = []

    def take(out) -> None:
        rows = out.samples
        for key, label, corrected in zip(rows.column(KEY_COLUMN).to_pylist(), rows.column("label").to_pylist(),
                                         rows.column(CORRECTION_COLUMN).to_pylist()):
            source, offset = where[key]
            samples.append((correction_source(source) if corrected else source, offset, label))

    for polls, watermark in steps:
        for messages in polls:
            impressions = messages.topic == IMPRESSION_TOPIC
            decoded = decode_poll(decoders.impressions if impressions else decoders.labels, "json", messages)
            if not decoded.table.num_rows:
                continue
            if impressions:
                events = impressions_of(decoded.table, decoders.feature_names, messages.source)
                for key, offset in zip(events.keys.tolist(), events.offsets.tolist()):
                    where.setdefault(key, (messages.source, offset))
                take(core.advance(events, None, None))
            else:
                take(core.advance(None, labels_of(decoded.table, messages.source), None))
        take(core.advance(None, None, watermark))
    take(core.advance(None, None, steps[-1][1] + JOIN.policy().keep_ms + JOIN.orphan_grace_ms + 1))
    return samples, core


def _ms(ms: int) -> Timestamp:
    return Timestamp(micros=ms * 1000)


def _stream(steps) -> test_stream.TestStream:
    stream = test_stream.TestStream()
    for polls, watermark in steps:
        # Each poll at its newest message's time, as the Kafka source stamps its elements.
        stream.add_elements([beam.window.TimestampedValue(m, _ms(max(m.timestamps))) for m in polls])
        stream.advance_watermark_to(_ms(watermark))
    return stream.advance_watermark_to_infinity()


def _identity_rows(batch: PackedBatch) -> list[tuple[str, int, float]]:
    identities = batch.row_identities() or []
    labels = batch.data.column("label").to_pylist()
    return [(source, position, label) for (source, position), label in zip(identities, labels)]


def _start_server(tmp_path: Path, port: int):
    """`picasso ps --endless` as a process, once it takes calls."""
    command = [sys.executable, "-m", "picasso.pipelines.cli", "ps", "--endless", "--spec", str(write_spec(tmp_path)),
               "--workdir", str(tmp_path / "server"), "--port", str(port), "--hidden", "16,8",
               "--checkpoint-every-s", "1", "--publish-every", "0", "--lease", "60", "--json"]
    log = tmp_path / "server.log"
    server = start_process(command, log)
    wait_until_serving(server, port)
    return server, log


def _stop_server(server, log: Path) -> dict:
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=300) == 0, log.read_text()[-3000:]
    return json.loads(log.read_text().strip().splitlines()[-1])


def _joined_pipeline(steps, port: int, letters: DeadLetterProducer, between=None):
    """TestStream → JoinedBatches → [between] → PicassoTrain against the server at port;
    the pipeline and its batches."""
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--streaming"]))
    batches = pipeline | _stream(steps) | JoinedBatches(SPEC, TOPICS, FORMATS, letters, rows_per_table=40)
    trained = batches if between is None else batches | "Between" >> beam.Map(between)
    trained | PicassoTrain(GBAHandler(PSAddress("127.0.0.1", port, max_in_flight=1), SPEC), unbounded=True)
    return pipeline, batches


def _assert_each_once(summary: dict, expected: list, next_offsets: dict[str, int], why: str) -> None:
    """The server trained as many samples as the core emits, and its ledger holds every
    impression (trained, or a duplicate's or a dead letter's settled untrained), every
    correction's identity and every label once: its positions are every partition's end."""
    checkpoint = summary["checkpoint"]
    assert summary["samples"] == len(expected), why
    applied = read_applied(checkpoint)
    for source, end in next_offsets.items():
        names = (source, correction_source(source)) if source.startswith(IMPRESSION_TOPIC) else \
            (settled_source(source),)
        for name in names:
            assert applied[name] == [[0, end]], f"{name}: {applied.get(name)}; {why}"
    assert load_checkpoint(checkpoint).positions == next_offsets, why


def _letters(bootstrap: str, seed: int) -> DeadLetterProducer:
    topic = f"joined-dead-{seed}"
    create_topic(bootstrap, topic, 1)
    return DeadLetterProducer(KafkaConnection(bootstrap), DeadLetterPolicy(topic=topic, delivery_timeout_s=30.0))


def _stream_of(seed: int):
    """The seed's events, their steps, every partition's end, and the core's samples."""
    events = with_offsets(timed_events(random.Random(seed), seed))
    steps = polls_in_steps(events)
    expected, core = core_samples(steps)
    counts = core.counts
    assert (counts.corrections and counts.duplicate_impressions and counts.duplicate_labels and counts.orphan_labels
            and counts.forgotten), f"{counts}; seed {seed}"
    return events, steps, ends(events), expected


def test_the_joined_graph_trains_the_cores_samples_once_each_against_a_parameter_server(kafka_bootstrap, tmp_path):
    seed = random.randrange(2**20)
    why = f"seed {seed}"
    _, steps, next_offsets, expected = _stream_of(seed)
    port = free_port()
    server, log = _start_server(tmp_path, port)
    try:
        pipeline, batches = _joined_pipeline(steps, port, _letters(kafka_bootstrap, seed))
        assert_that(batches | beam.FlatMap(_identity_rows), equal_to(expected), label="TheCoresSamples")
        assert pipeline.run().wait_until_finish() == PipelineState.DONE, why
        summary = _stop_server(server, log)
    finally:
        if server.poll() is None:
            server.kill()
    _assert_each_once(summary, expected, next_offsets, why)


class Killed(RuntimeError):
    """The test's kill of a job."""


def _kill_at(event_time_ms: int):
    """A step that kills the job at its first samples of this event time or later (by the
    data, not by a count: a runner may retry a bundle, and deserializes its steps afresh)."""
    def between(batch: PackedBatch) -> PackedBatch:
        if batch.num_samples and batch.event_time_ms >= event_time_ms:
            raise Killed(f"killed at {batch.event_time_ms}")
        return batch
    return between


def test_a_resubmitted_joined_job_trains_what_the_killed_one_held_pending_and_nothing_twice(
        kafka_bootstrap, tmp_path, monkeypatch):
    """The job dies (an exception in the training step) while impressions and labels are
    pending in the join's keyed state, and is resubmitted as the endless job does: reading
    every partition from the server's positions. Together the two runs train exactly the
    core's samples, each once, the held ones skipped sample by sample."""
    seed = random.randrange(2**20)
    why = f"seed {seed}"
    events, steps, next_offsets, expected = _stream_of(seed)
    # The worker trains in this process (the DirectRunner's): what it was given, and every
    # row it computed a gradient of and pushed.
    offered: list[tuple[str, int, float]] = []
    pushed: list[tuple[str, int, float]] = []
    step, push = GBAWorker.step, GBAWorker._train_step

    def offer(worker, batch, stats):
        offered.extend(_identity_rows(batch))
        return step(worker, batch, stats)

    def train(worker, batch, stats):
        pushed.extend(_identity_rows(batch))
        return push(worker, batch, stats)

    monkeypatch.setattr(GBAWorker, "step", offer)
    monkeypatch.setattr(GBAWorker, "_train_step", train)
    letters = _letters(kafka_bootstrap, seed)
    port = free_port()
    server, log = _start_server(tmp_path, port)
    try:
        # Mid-way through the first part: impressions pending, labels waiting.
        killed, _ = _joined_pipeline(steps, port, letters, between=_kill_at(START_MS + 6_000))
        with pytest.raises(Exception, match="killed at"):
            killed.run().wait_until_finish()
        first_run, offered[:] = list(pushed), []
        connection = ServerAddress("127.0.0.1", port).connect(0)
        try:
            positions = connection.call("positions")
        finally:
            connection.close()
        # Some impressions were read and still pending: the positions are behind what was read.
        read = {source_name(m.topic, m.partition) for polls, _ in steps[:2] for m in polls}
        assert all(positions.get(source, 0) < next_offsets[source] for source in read), f"{positions}; {why}"

        resubmitted, _ = _joined_pipeline(polls_in_steps(events, positions), port, letters)
        assert resubmitted.run().wait_until_finish() == PipelineState.DONE, why
        summary = _stop_server(server, log)
    finally:
        if server.poll() is None:
            server.kill()
    assert sorted(pushed) == sorted(expected), why
    assert set(offered) & set(first_run), f"the re-read held nothing the first run trained; {why}"
    _assert_each_once(summary, expected, next_offsets, why)


# -- the multi-range identity, without Beam -------------------------------------------------


def test_a_ledger_judges_a_batch_of_several_ranges_per_source_whole():
    ledger = AppliedRanges()
    ledger.add_all({"t/0": [(0, 3), (7, 9)], "t/1": (4, 6)})
    assert ledger.ranges == {"t/0": [(0, 3), (7, 9)], "t/1": [(4, 6)]}
    assert ledger.verdict({"t/0": [(0, 2), (8, 9)]}) == "held"
    assert ledger.verdict({"t/0": [(0, 2), (3, 4)]}) == "partly"
    assert ledger.verdict({"t/0": [(3, 7)], "t/1": [(0, 4), (6, 8)]}) == "new"
    assert ledger.verdict({"t/0": (1, 2)}) == "held"  # one range, as every batch read in order names
    assert ledger.held({"t/0": [(2, 8)], "t/1": [(5, 10)], "t/2": [(0, 9)]}) == {"t/0": [(2, 3), (7, 8)],
                                                                                 "t/1": [(5, 6)]}
    ledger.remove_all({"t/0": [(1, 2), (8, 9)]})
    assert ledger.ranges["t/0"] == [(0, 1), (2, 3), (7, 8)]
    # JSON (a checkpoint's applied.json, a batch's metadata) gives lists of lists
    assert AppliedRanges.from_json({"t/0": [[0, 1], [2, 3]]}).verdict({"t/0": [[0, 1], [2, 3]]}) == "held"


def test_a_joined_partitions_position_is_the_end_of_its_settled_prefix():
    assert runs([9, 3, 4, 5, 4]) == [(3, 6), (9, 10)]
    assert held_mask([(5, 8), (0, 2), (1, 3)], np.array([0, 2, 3, 5, 7, 8])).tolist() == [True, True, False, True,
                                                                                            True, False]
    ranges = {"i/0": [(0, 10), (12, 13)], "i/0#corrections": [(0, 6), (7, 13)], "i/1": [(2, 5)],
              "i/1#corrections": [(0, 5)], "l/0#settled": [(0, 4), (5, 9)], "plain/0": [(0, 50)]}
    # An impression partition: the first position whose sample or correction is still open.
    assert joined_positions(ranges) == {"i/0": 6, "i/1": 0, "l/0": 4}


def _one_shard() -> tuple:
    trainer = Trainer(SPEC, TrainConfig(hidden=(8,), device="cpu", seed=3))
    shard, layout = build_shard(trainer, 0, 1, GBAConfig(1))
    return shard, layout, trainer


def _worker(shard, layout, trainer) -> GBAWorker:
    client = PSClient(layout, "worker0/a", max_in_flight=0, call=in_process([shard]))
    config = trainer.config
    return GBAWorker(client, GradientComputer(build_model(config.model, SPEC, trainer.plan, config.hidden)))


def _joined_batch(seed: int, positions: list[int], source: str = "i/0") -> PackedBatch:
    """Planted samples trained under these positions of `source`."""
    decoder = RecordDecoder(SPEC)
    table = decoder.decode_table(PlantedModel(SPEC).sample(len(positions), seed)[0], "planted").table \
        if positions else decoder.schema.empty_table()
    return pack(table, SPEC, PackingPlan.from_spec(SPEC)).with_identities([source] * len(positions),
                                                                           np.array(positions, np.int64))


def test_a_repeated_joined_batch_trains_nothing_twice_and_an_overlapping_one_only_its_new_samples():
    """A retried bundle's batch is held whole; a re-read's batch that overlaps the ledger
    in part trains only its new rows, with the gradient of those rows alone: the model is
    the one trained on the new rows only."""
    seed = random.randrange(2**20)
    first = _joined_batch(seed, [4, 9, 2, 7, 30, 31])
    new_rows = _joined_batch(seed + 1, [10, 11, 12])
    # A re-read cuts first's samples and new ones into one batch, in another order.
    overlapping = PackedBatch(pa.Table.from_batches([first.data.slice(1, 3), new_rows.data]).combine_chunks()
                              .to_batches()[0])

    shard, layout, trainer = _one_shard()
    worker, stats = _worker(shard, layout, trainer), WorkerStats()
    for batch in (first, first, overlapping):
        assert worker.step(batch, stats)
    worker.client.drain()
    assert shard.samples == 9 and stats.held_rows == 6 + 3, f"seed {seed}"
    assert shard.control.ledger.ranges == {"i/0": [(2, 3), (4, 5), (7, 8), (9, 13), (30, 32)]}, f"seed {seed}"

    alone, alone_layout, alone_trainer = _one_shard()
    alone_worker = _worker(alone, alone_layout, alone_trainer)
    for batch in (first, new_rows):
        assert alone_worker.step(batch, WorkerStats())
    alone_worker.client.drain()
    for key, value in alone.snapshot().tensors.items():
        torch.testing.assert_close(shard.snapshot().tensors[key], value, rtol=0, atol=0,
                                   msg=lambda m, key=key: f"{key}: {m}; seed {seed}")


def test_positions_a_joined_batch_settles_reach_the_ledger_after_its_samples_untrained():
    shard, layout, trainer = _one_shard()
    worker, stats = _worker(shard, layout, trainer), WorkerStats()
    settles = {correction_source("i/0"): [(0, 3)], "i/0": [(2, 3)], settled_source("l/0"): [(0, 2)]}
    samples = _joined_batch(7, [0, 1]).with_settles(settles)
    assert worker.step(samples, stats)
    worker.step(_joined_batch(8, []).with_settles({settled_source("l/0"): [(2, 5)]}), stats)
    assert shard.samples == 2
    assert shard.positions() == {"i/0": 3, "l/0": 5}


@pytest.mark.parametrize("flags, refusal", [
    (["--impressions", "i:json", "--labels", "l:json"], "--runner FnApiRunner does not fire by the watermark"),
    (["--impressions", "i:arrow", "--labels", "l:json", "--runner", "DataflowRunner"], "one impression per message"),
])
def test_a_joined_endless_job_refuses_what_cannot_run_it_by_name(flags, refusal, tmp_path, capsys):
    command = [sys.executable, "-m", "picasso.pipelines.cli", "stream", "--endless", "--spec",
               str(write_spec(tmp_path)), "--workdir", str(tmp_path / "w"), "--bootstrap-servers", "127.0.0.1:1",
               *flags]
    status, stderr = refusal_in_process(command, capsys)
    assert status == 2 and refusal in stderr, stderr[-2000:]
