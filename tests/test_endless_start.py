"""The endless job's start (pipelines/runs/stream_start.py, made by its parameter server:
endless_server.py): warm-started from a registered version at a time, made once, and
refused for a model of another spec. Against the Tansu broker and a real `mlflow server`."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from kafka import KafkaProducer
from kafka_broker import create_topic
from helpers import refusal_in_process
from mlflow.tracking import MlflowClient
from publish_helpers import CheckpointMaker, request
from stream_helpers import SPEC, json_messages, start_process, stop_when_trained, stream_command, write_spec

from picasso.checkpoint import checkpoint_metrics, latest_checkpoint, load_checkpoint, read_applied
from picasso.connectors.kafka_config import KafkaConnection
from picasso.distributed.param_server import ServerAddress
from picasso.pipelines.cli import main as cli
from picasso.pipelines.cli.main import parse_args
from picasso.pipelines.cli.endless import endless_server_config
from picasso.pipelines.runs.endless_server import EndlessServer, EndlessServerConfig
from picasso.pipelines.runs.stream_start import StreamStart
from picasso.serving.publishing import registry_tags as tags
from picasso.serving.publishing.contract import MLflowTarget
from picasso.serving.publishing.publication import publish
from picasso.trainer import TrainConfig

PARTITIONS = 2
MESSAGES = 200  # round-robin: 100 a partition
BASE_MS = 1_790_000_000_000  # message i is stamped BASE_MS + i seconds


def _stamped_topic(bootstrap: str, name: str, first: int = 0, count: int = MESSAGES) -> str:
    """Messages first..first+count-1 of one sequence, message i on partition i % 2."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    values = json_messages(first + count, stream=7)
    for i in range(first, first + count):
        producer.send(name, value=values[i], partition=i % PARTITIONS, timestamp_ms=BASE_MS + i * 1000)
    producer.flush()
    producer.close()
    return name


def _warm_model(tmp_path: Path) -> Path:
    """A small model of the stream tests' spec, trained on planted rows: the checkpoint a
    backfill would leave."""
    return CheckpointMaker(tmp_path / "backfill", rows_per_checkpoint=256, spec=SPEC).next()


def test_an_endless_job_warm_started_from_a_version_at_a_time_trains_exactly_what_came_after_it(
        kafka_bootstrap, mlflow_server, tmp_path):
    warm = _warm_model(tmp_path)
    name = f"endless-start-{uuid.uuid4().hex[:6]}"
    target = MLflowTarget(mlflow_server, experiment=name, model_name=name)
    assert publish(request(warm, auc=0.7), target).version == "1"
    topic = f"endless-start-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    _stamped_topic(kafka_bootstrap, topic)
    start_ms = BASE_MS + 100_000  # message 100: offset 50 of each partition
    workdir, log = tmp_path / "work", tmp_path / "endless.log"
    # One version, made as the job stops: it holds every message the job trained.
    command = stream_command(write_spec(tmp_path), kafka_bootstrap, topic, workdir, "--endless", "--batch-messages",
                             "20", "--checkpoint-every-s", "1", "--keep-checkpoints", "1000", "--publish-every",
                             "3600", "--mlflow-uri", mlflow_server, "--experiment", name, "--model-name", name,
                             "--warm-start", f"models:/{name}/1", "--start-at", str(start_ms),
                             "--dead-letter-topic", f"{topic}.dead", "--json")
    ends = {f"{topic}/{p}": MESSAGES // PARTITIONS for p in range(PARTITIONS)}
    summary = stop_when_trained(start_process(command, log), workdir, ends, log)

    started = {f"{topic}/{p}": 50 for p in range(PARTITIONS)}
    checkpoints = sorted((workdir / "checkpoints").iterdir())
    first = load_checkpoint(checkpoints[0])  # the start: the warm-start model, unchanged, at the start offsets
    made = checkpoint_metrics(checkpoints[0])
    assert first.positions == started and made["ledger"]["start"]["positions"] == started
    assert made["ledger"]["start"]["warm_start"]["model_uri"] == f"models:/{name}/1"
    assert made["lineage"] == {"checkpoint": str(warm), "positions": started}
    model = load_checkpoint(warm)
    for key, value in model.state["model"].items():
        assert torch.equal(first.state["model"][key], value), key

    final = Path(summary["checkpoint"])
    trained = load_checkpoint(final)
    assert trained.positions == ends and summary["positions"] == ends
    assert trained.state["samples"] == model.state["samples"] + sum(ends[s] - started[s] for s in ends)
    # What the model held before the start counts as trained (the warm-start model's own).
    assert read_applied(final) == {source: [[0, end]] for source, end in ends.items()}

    assert summary["versions"] == ["2"], summary
    version = MlflowClient(mlflow_server).get_model_version(name, "2")
    assert version.tags[tags.CHECKPOINT_PATH] == str(final)
    assert version.tags[tags.PARENT_VERSION] == "1"  # the warm-start version
    assert version.tags[tags.PARENT_CHECKPOINT] == str(warm)
    assert version.tags[tags.ORIGIN] == f"stream {topic}/0 [50, 100), {topic}/1 [50, 100)"


def _server_config(bootstrap: str, topic: str, workdir: Path, start: StreamStart | None) -> EndlessServerConfig:
    return EndlessServerConfig(spec=SPEC, train=TrainConfig(hidden=(16, 8), device="cpu"), workdir=str(workdir),
                               topics={topic: "json"}, start=start, connection=KafkaConnection(bootstrap))


def test_a_resubmitted_endless_job_goes_on_from_its_checkpoint_not_from_the_start_again(
        kafka_bootstrap, tmp_path):
    warm = _warm_model(tmp_path)
    topic = f"endless-again-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    _stamped_topic(kafka_bootstrap, topic, count=40)
    workdir = tmp_path / "work"
    # `picasso ps --endless`'s flags, as its server is built from them.
    args = parse_args(["ps", "--endless", "--spec", str(write_spec(tmp_path)), "--workdir", str(workdir), "--port",
                       "1", "--hidden", "16,8", "--publish-every", "0", "--topic", topic, "--bootstrap-servers",
                       kafka_bootstrap, "--warm-start", str(warm.parent), "--start-at", "latest"])
    config = endless_server_config(args, SPEC, {topic: "json"})
    assert config.start == StreamStart(str(warm.parent), "latest") and config.topics == {topic: "json"}
    server = EndlessServer(config, ServerAddress("127.0.0.1", 1))  # it made the start; killed before it served
    started = {f"{topic}/{p}": 20 for p in range(PARTITIONS)}
    assert server.positions() == started and server.model.only_started
    assert server.trainer.samples == load_checkpoint(warm).state["samples"]
    start_checkpoint = latest_checkpoint(workdir / "checkpoints")

    _stamped_topic(kafka_bootstrap, topic, first=40, count=40)  # arrived while it was down
    again = EndlessServer(endless_server_config(args, SPEC, {topic: "json"}), ServerAddress("127.0.0.1", 1))
    assert again.positions() == started  # from where the start said, not from the end now
    assert latest_checkpoint(workdir / "checkpoints") == start_checkpoint and again.model.only_started
    assert len(list((workdir / "checkpoints").iterdir())) == 1
    assert not again.publisher.unpublished  # the start's checkpoint is the warm-start model: no version of it


def test_an_endless_start_of_another_spec_or_one_it_cannot_make_is_refused_naming_why(
        kafka_bootstrap, tmp_path, capsys):
    warm = _warm_model(tmp_path)
    topic = f"endless-other-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    workdir = tmp_path / "work"
    config = _server_config(kafka_bootstrap, topic, workdir, StreamStart(str(warm)))
    other = replace(SPEC, sparse=tuple(replace(f, embedding_dim=2) if f.name == "h" else f for f in SPEC.sparse))
    address = ServerAddress("127.0.0.1", 1)
    with pytest.raises(ValueError, match="id feature h: embedding_dim 2 in this run, 4 in the model"):
        EndlessServer(replace(config, spec=other), address)
    with pytest.raises(ValueError, match=r"--hidden 16,8 \(this run: 32\)"):
        EndlessServer(replace(config, train=TrainConfig(hidden=(32,), device="cpu")), address)
    with pytest.raises(ValueError, match="--start-at latest: the server finds each partition's start offset"):
        EndlessServer(replace(config, start=StreamStart(str(warm), "latest"), topics={}), address)
    assert latest_checkpoint(workdir / "checkpoints") is None  # nothing was started

    spec = write_spec(tmp_path)
    with pytest.raises(SystemExit, match=r"error: --start-at latest: the server finds .* \(--topic\)"):
        cli.main([str(arg) for arg in ("ps", "--endless", "--spec", spec, "--workdir", workdir, "--port", "1",
                                       "--hidden", "16,8", "--start-at", "latest")])
    status, stderr = refusal_in_process(stream_command(spec, "127.0.0.1:1", topic, workdir, "--endless", "--ps",
                                                       "127.0.0.1:29500", "--warm-start", str(warm)), capsys)
    assert status == 2 and "with --ps: the parameter server makes the start" in stderr, stderr[-2000:]
