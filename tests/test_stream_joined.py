"""`picasso stream` on an impression topic and a label topic, joined in its bounded cycles:
real broker, the planted model's event streams (picasso.connectors.synthetic.events), bad events on
both topics, checkpoints that carry the join."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from kafka_broker import create_topic, produce_values
from stream_helpers import SPEC, assert_same_state, load_state
from test_run_metrics import labelled, scrape

from picasso.checkpoint import latest_checkpoint, read_checkpoint_file
from picasso.connectors.kafka_config import KafkaConnection
from picasso.connectors.dead_letters.letters import MessageDeadLetter
from picasso.connectors.dead_letters.policy import DeadLetterPolicy
from picasso.serving.publishing.contract import MLflowTarget
from picasso.sample_join.join_spec import JoinSpec
from picasso.pipelines.runs.joined_stream_state import JoinedTopics
from picasso.pipelines.runs.run_metrics import MetricsAddress, MetricsEndpoint, StreamMetrics
from picasso.pipelines.runs.stream import StreamConfig, run_stream
from picasso.connectors.join_events import JoinDecoders
from picasso.sample_join.sample_buffer import SampleBuffer
from picasso.sample_join.join_rules import DELAY_COLUMN
from picasso.sample_join.join_state import JoinState, sample_schema
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.connectors.synthetic.events import EventStreamConfig, make_event_stream
from picasso.trainer import TrainConfig

START_MS = 1_780_000_000_000
WAIT_MS = 60_000
JOIN = JoinSpec(wait_ms=WAIT_MS, late_labels="correct", horizon_ms=3_600_000, orphan_grace_ms=5_000)
EVENTS = EventStreamConfig(start_ms=START_MS, impressions_per_s=2.0, label_delay_mean_ms=20_000, duplicate_fraction=0.05)
IMPRESSIONS = 1500
BAD_IMPRESSIONS = [b"{broken", json.dumps({"request_id": "x1"}).encode()]  # invalid JSON; no event time
BAD_LABELS = [json.dumps({"request_id": "x2", "event_time_ms": START_MS, "label": 0.5}).encode()]
ORPHAN = {"request_id": "r-nobody", "event_time_ms": START_MS + 100_000, "label": 1}


def _values(table) -> list[bytes]:
    return [json.dumps(row, separators=(",", ":")).encode() for row in table.to_pylist()]


@pytest.fixture(scope="module")
def events():
    return make_event_stream(PlantedModel(SPEC), IMPRESSIONS, stream=3, config=EVENTS)


@pytest.fixture(scope="module")
def topics(kafka_bootstrap, events):
    imps, labs = "joined-impressions", "joined-labels"
    impressions = _values(events.impressions)
    impressions[200:200] = BAD_IMPRESSIONS
    labels = _values(events.labels)
    labels[50:50] = BAD_LABELS + [json.dumps(ORPHAN).encode()]
    create_topic(kafka_bootstrap, imps, 2)
    produce_values(kafka_bootstrap, imps, impressions, 2)
    create_topic(kafka_bootstrap, labs, 1)
    produce_values(kafka_bootstrap, labs, labels, 1)
    return imps, labs


def _config(bootstrap, topics, workdir, **changes) -> StreamConfig:
    imps, labs = topics
    config = StreamConfig(
        connection=KafkaConnection(bootstrap), topics={imps: "json", labs: "json"}, workdir=str(workdir), spec=SPEC,
        mlflow=None, train=TrainConfig(hidden=(16, 8), device="cpu"), dead_letters=DeadLetterPolicy(topic=f"{imps}.dead"),
        batch_messages=100, max_cycle_messages=300, until_caught_up=True, deterministic=True,
        joined=JoinedTopics(imps, labs, JOIN),
    )
    return replace(config, **changes)


@pytest.fixture(scope="module")
def joined(kafka_bootstrap, topics, mlflow_server, tmp_path_factory):
    # One version, at the end (the forced publish of a stream that stops): its run carries the join's metrics.
    target = MLflowTarget(mlflow_server, experiment="joined-stream", model_name="joined-stream-model")
    config = _config(kafka_bootstrap, topics, tmp_path_factory.mktemp("joined"), mlflow=target, publish_every_s=3600)
    reports, scrapes = [], []  # each cycle's report, and its /metrics scraped right after it
    with MetricsEndpoint(MetricsAddress(0, "127.0.0.1")) as endpoint:
        summary = run_stream(config, on_cycle=lambda report, _: (reports.append(report),
                                                                 scrapes.append(scrape(endpoint.url))),
                             watch=StreamMetrics(endpoint.registry).watch)
    return config, summary, reports, scrapes


def _final_join(config) -> tuple[str, JoinState]:
    path = latest_checkpoint(config.folders.checkpoints)
    files = {name: read_checkpoint_file(path, name) for name in JoinState.FILES}
    return path, JoinState.from_files(files, JoinDecoders(SPEC, JOIN).feature_schema, JOIN.policy())


def test_every_impression_is_decided_once_with_the_label_an_offline_join_gives(joined, events):
    config, summary, reports, _ = joined
    assert summary.failures == 0 and summary.cycles == len(reports) > 2
    _, join = _final_join(config)
    counts = join.counts
    truth = events.truth.to_pydict()
    times, delays = np.array(truth["event_time_ms"]), np.array(truth[DELAY_COLUMN])
    decided = (times + WAIT_MS < join.watermark) | ((delays >= 0) & (delays <= WAIT_MS))
    # Every click within W arrives before the watermark passes its impression's time + W
    # (the label topic is in time order), so these are exact, not bounds.
    assert counts.impressions == IMPRESSIONS and counts.duplicate_impressions == 0
    assert counts.positives == int(np.count_nonzero((delays >= 0) & (delays <= WAIT_MS)))
    assert counts.negatives == int(np.count_nonzero(decided)) - counts.positives
    assert join.pending == IMPRESSIONS - int(np.count_nonzero(decided))
    late = (delays > WAIT_MS) & (times + WAIT_MS < join.watermark)
    assert counts.late_labels == counts.corrections == int(np.count_nonzero(late)) > 0
    assert counts.duplicate_labels == int(np.count_nonzero(truth["duplicated"]))
    assert counts.orphan_labels == 1
    # What was trained: every sample emitted, in batches of exactly 100, the rest (less
    # than the buffer's window of 4 batches) waiting in the checkpoint.
    emitted = counts.positives + counts.negatives + counts.corrections
    assert sum(r.samples for r in reports) == emitted
    ready = read_checkpoint_file(latest_checkpoint(config.folders.checkpoints), "join-ready.arrow")
    waiting = SampleBuffer.from_bytes(ready, sample_schema(JoinDecoders(SPEC, JOIN).feature_schema), 100)
    assert summary.step * 100 + waiting.num_rows == emitted and 300 <= waiting.num_rows < 400


def test_bad_events_and_orphan_labels_reach_the_dead_letter_topic(joined, kafka_bootstrap):
    from kafka import KafkaConsumer, TopicPartition

    config, summary, reports, _ = joined
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000)
    tp = TopicPartition(config.dead_letters.topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    letters = [MessageDeadLetter.from_record(record) for record in consumer]
    consumer.close()
    reasons = [letter.reason for letter in letters]
    assert len(letters) == len(BAD_IMPRESSIONS) + len(BAD_LABELS) + 1 == sum(r.dead_letters for r in reports)
    assert any("invalid JSON" in r for r in reasons) and any("missing event time" in r for r in reasons)
    assert any("label must be 0 or 1" in r for r in reasons)
    orphan = [record for record, reason in zip(letters, reasons) if reason.startswith("orphan label")]
    assert len(orphan) == 1 and json.loads(orphan[0].value) == ORPHAN


def test_the_joins_metrics_are_what_each_cycle_reports(joined):
    """--metrics-port on a joined stream: after each cycle /metrics says what the join
    holds, and the orphan label is a dead letter of its own kind."""
    _, summary, reports, scrapes = joined
    for report, samples in zip(reports, scrapes, strict=True):
        assert samples[("picasso_join_pending_impressions", ())] == report.join["pending"]
        assert samples[("picasso_join_pending_bytes", ())] == report.join["pending_bytes"] > 0
    letters = labelled(scrapes[-1], "picasso_dead_letters_total", "reason")
    assert letters["orphan_label"] == 1 and sum(letters.values()) == summary.dead_letters == 4


def test_a_stream_restarted_between_cycles_joins_and_trains_as_one_that_never_stopped(
        joined, kafka_bootstrap, topics, tmp_path):
    straight_config = joined[0]
    config = _config(kafka_bootstrap, topics, tmp_path, max_cycles=2)
    first = run_stream(config)
    assert first.cycles == 2
    rest = run_stream(replace(config, max_cycles=None))
    assert rest.cycles == joined[1].cycles - 2
    (path, join), (straight_path, straight_join) = _final_join(config), _final_join(straight_config)
    assert join.counts == straight_join.counts and join.watermark == straight_join.watermark
    assert_same_state(load_state(path), load_state(straight_path), atol=0)
    for name in ("join-records.arrow", "join-features.arrow", "join-ready.arrow"):
        assert read_checkpoint_file(path, name) == read_checkpoint_file(straight_path, name)


def test_a_checkpoint_of_an_unjoined_stream_is_refused(kafka_bootstrap, topics, tmp_path):
    plain = replace(_config(kafka_bootstrap, topics, tmp_path), joined=None, topics={topics[1]: "json"}, max_cycles=1)
    run_stream(plain)  # the label topic as if it were labelled events: some checkpoint
    summary = run_stream(_config(kafka_bootstrap, topics, tmp_path, max_failures=1))
    assert summary.cycles == 0 and "without a join" in summary.last_error


def test_the_published_version_reports_the_join(joined, mlflow_server):
    from mlflow.tracking import MlflowClient

    config, summary, reports, _ = joined
    assert len(summary.versions) == 1
    client = MlflowClient(mlflow_server)
    version = client.get_model_version(config.mlflow.model_name, summary.versions[0])
    run = client.get_run(version.run_id)
    metrics = run.data.metrics
    _, join = _final_join(config)
    assert metrics["join.positives"] == join.counts.positives and metrics["join.pending"] == join.pending
    assert metrics["join.late_labels"] == join.counts.late_labels and metrics["join.wait_s"] == WAIT_MS / 1000
    assert 0 < metrics["join.label_delay_p50_s"] < metrics["join.label_delay_p99_s"]
    assert 0 < metrics["join.late_share"] < 0.5 and metrics["join.pending_bytes_per_impression"] > 0
    per_cycle = client.get_metric_history(version.run_id, "join.cycle.pending")
    assert [p.step for p in per_cycle] == [r.cycle for r in reports] and per_cycle[-1].value == join.pending
    assert run.data.params["late_labels"] == "correct" and run.data.params["label_wait_ms"] == str(WAIT_MS)
    plots = [a.path for a in client.list_artifacts(version.run_id, "plots")]
    assert "plots/label_delays.svg" in plots
