"""`picasso stream` end to end: real broker, real mlflow server, checkpoints, ledger,
consumer-group offsets, dead-letter topic, published versions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from mlflow.tracking import MlflowClient
from stream_helpers import SPEC, arrow_messages, fill_topic, json_messages

from picasso.checkpoint import load_checkpoint
from picasso.connectors.kafka_clients import CLIENTS
from picasso.connectors.dead_letters.policy import DeadLetterPolicy
from picasso.connectors.kafka_config import KafkaConnection
from picasso.serving.publishing.contract import MLflowTarget
from picasso.pipelines.runs.stream import StreamConfig, run_stream
from picasso.trainer import TrainConfig


@pytest.fixture(scope="module")
def stream_topics(kafka_bootstrap):
    """Two topics (JSON over 2 partitions with bad messages mixed in, Arrow IPC): their
    names, and how many messages the JSON one has, bad ones among them."""
    events, batches = "stream-events", "stream-batches"
    good = json_messages(900)
    bad = [b"{broken", json.dumps({"d1": 1.0}).encode(), b""]  # invalid JSON, missing label, empty
    values = good[:400] + bad + good[400:]
    fill_topic(kafka_bootstrap, events, values, partitions=2)
    fill_topic(kafka_bootstrap, batches, arrow_messages(1200, 100), partitions=1)
    return events, batches, len(values), len(bad)


@pytest.fixture(scope="module", params=CLIENTS)
def streamed(request, kafka_bootstrap, mlflow_server, stream_topics, tmp_path_factory):
    """The topics streamed until caught up while publishing, read with one client
    (--kafka-client); each client's stream has a workdir, group, model and dead-letter
    topic of its own."""
    events, batches, messages, bad = stream_topics
    client = request.param
    workdir = tmp_path_factory.mktemp("stream")
    config = StreamConfig(
        connection=KafkaConnection(kafka_bootstrap, client=client),
        topics={events: "json", batches: "arrow"},
        workdir=str(workdir),
        spec=SPEC,
        mlflow=MLflowTarget(mlflow_server, experiment="stream-test", model_name=f"stream-test-model-{client}"),
        train=TrainConfig(hidden=(16, 8), device="cpu"),
        dead_letters=DeadLetterPolicy(topic=f"stream-test.dead.{client}"),
        batch_messages=100,
        max_cycle_messages=200,
        publish_every_s=0.5,
        until_caught_up=True,
        group_id=f"stream-test-group-{client}",
    )
    reports = []
    summary = run_stream(config, on_cycle=lambda report, _: reports.append(report))
    return config, summary, reports, messages, bad


def test_stream_trains_every_message_once_and_checkpoints_each_cycle(streamed):
    config, summary, reports, messages, bad = streamed
    assert summary.failures == 0 and summary.lag == 0
    ledger = summary.ledger["partitions"]
    events = {k: v for k, v in ledger.items() if k.startswith("stream-events/")}
    assert sum(p["messages"] for p in events.values()) == messages
    for source, entry in events.items():
        assert entry["next_position"] == entry["messages"] == messages // 2 + (source.endswith("/0") and messages % 2)
        n = entry["messages"]
        assert entry["offset_sum"] == n * (n - 1) // 2  # offsets 0..n-1, each once
    assert sum(p["refused"] for p in events.values()) == bad
    arrow = ledger["stream-batches/0"]
    assert arrow["messages"] == 12 and arrow["samples"] == 1200
    # Capped cycles: 200 messages per partition at most, one checkpoint each.
    assert summary.cycles == len(reports) >= 3
    checkpoint = load_checkpoint(summary.checkpoint)
    assert checkpoint.metrics["ledger"] == summary.ledger
    assert checkpoint.positions == {source: entry["next_position"] for source, entry in ledger.items()}
    assert checkpoint.state["samples"] == messages - bad + 1200
    kept = sorted(p.name for p in (Path(config.workdir) / "checkpoints").iterdir())
    assert len(kept) == config.keep_checkpoints and kept[-1] == Path(summary.checkpoint).name


def test_stream_commits_checkpointed_positions_to_the_consumer_group(streamed):
    config, summary, _, _, _ = streamed
    consumer = KafkaConsumer(bootstrap_servers=config.connection.bootstrap_servers, group_id=config.group_id,
                             enable_auto_commit=False)
    try:
        for source, entry in summary.ledger["partitions"].items():
            topic, partition = source.rsplit("/", 1)
            assert consumer.committed(TopicPartition(topic, int(partition))) == entry["next_position"]
    finally:
        consumer.close()


def test_stream_publishes_versions_tagged_with_their_checkpoint(streamed, mlflow_server):
    config, summary, _, _, _ = streamed
    assert summary.versions
    records = [json.loads(line) for line in Path(config.folders.stream_versions).read_text().splitlines()]
    assert [r["version"] for r in records] == summary.versions
    client = MlflowClient(mlflow_server)
    last = client.get_model_version(config.mlflow.model_name, summary.versions[-1])
    assert last.tags["picasso.checkpoint_id"] == Path(summary.checkpoint).name
    assert json.loads(last.tags["picasso.positions"]) == load_checkpoint(summary.checkpoint).positions
    assert records[-1]["newest_event_ms"] > 0
    # picasso serve's freshness is read from this tag (serving/server_metrics.py)
    assert int(last.tags["picasso.newest_event_ms"]) == records[-1]["newest_event_ms"]
    # One lineage: the first version descends from nothing, each later one from the one before,
    # and each says the offsets it trained since; together they cover each partition once.
    line = [client.get_model_version(config.mlflow.model_name, v).tags for v in summary.versions]
    assert [t["picasso.parent_version"] for t in line] == ["none", *summary.versions[:-1]]
    ends = {}
    for tags in line:
        for source, start, stop in re.findall(r"(\S+) \[(\d+), (\d+)\)", tags["picasso.origin"]):
            start, stop = int(start), int(stop)
            assert start == ends.get(source, 0), (source, tags["picasso.origin"])
            ends[source] = stop
    assert ends == json.loads(last.tags["picasso.positions"])


def test_stream_sends_bad_messages_to_the_dead_letter_topic(streamed):
    config, _, _, _, bad = streamed
    consumer = KafkaConsumer(bootstrap_servers=config.connection.bootstrap_servers, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=3000)
    consumer.assign([TopicPartition(config.dead_letters.topic, p)
                     for p in consumer.partitions_for_topic(config.dead_letters.topic)])
    letters = [dict(r.headers) for r in consumer]
    consumer.close()
    reasons = sorted(h["picasso.reason"].decode() for h in letters)
    assert len(letters) == bad
    assert any("invalid JSON" in r for r in reasons) and any("missing label" in r for r in reasons)
    assert any("empty message" in r for r in reasons)
    assert all(h["picasso.topic"] == b"stream-events" for h in letters)


def test_stream_resumes_from_its_checkpoint_with_nothing_to_do(streamed):
    config, summary, _, _, _ = streamed
    again = run_stream(config)
    assert again.cycles == 0 and again.lag == 0 and again.ledger == summary.ledger


def test_a_stream_stopped_after_its_cycle_says_the_lag_that_cycle_left(kafka_bootstrap, tmp_path):
    topic = "stream-test-lag-left"
    fill_topic(kafka_bootstrap, topic, json_messages(150, stream=5), partitions=1)
    config = StreamConfig(connection=KafkaConnection(kafka_bootstrap), topics={topic: "json"}, workdir=str(tmp_path),
                          spec=SPEC, mlflow=None, train=TrainConfig(hidden=(8,), device="cpu"),
                          dead_letters=DeadLetterPolicy(topic=f"{topic}.dead"), batch_messages=100,
                          max_cycle_messages=100, max_cycles=1)
    summary = run_stream(config)
    # One cycle of 100 of 150 messages, then the stop: 50 behind (not the 150 it started behind).
    assert summary.cycles == 1 and summary.messages == 100 and summary.lag == 50
