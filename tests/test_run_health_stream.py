"""The run-health gate in a stream (pipelines/runs/stream.py, stream_publisher.py): a cycle
that learned nothing is reported as refused and the stream trains on, no version is made
of a window the gate refuses, and the window that follows publishes. Against the session's
Tansu broker and `mlflow server`."""

from __future__ import annotations

import math
import uuid
from dataclasses import replace

import torch
from kafka_broker import produce_values
from mlflow.tracking import MlflowClient
from stream_helpers import SPEC, fill_topic, json_messages

from picasso.connectors.dead_letters.policy import DeadLetterPolicy
from picasso.connectors.kafka_config import KafkaConnection
from picasso.serving.publishing.contract import MLflowTarget
from picasso.connectors.testing.loopback import free_port
from picasso.connectors.testing.param_server import in_process
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.param_server import ServerAddress
from picasso.distributed.ps_client import PSClient
from picasso.distributed.shard import Scored
from picasso.distributed.worker import GBAWorker, WorkerStats
from picasso.models import build_model
from picasso.pipelines.runs.endless_server import EndlessServer, EndlessServerConfig
from picasso.connectors.synthetic.planted_batches import planted_batches
from picasso.pipelines.runs.run_health import HEALTH_WARNINGS
from picasso.pipelines.runs.stream import StreamConfig, run_stream
from picasso.spec import SparseField
from picasso.trainer import TrainConfig

from test_trainer import CONFIG as TRAINER_CONFIG
from test_trainer import SPEC as TRAINER_SPEC


def _config(bootstrap, server, topic, workdir, spec=SPEC) -> StreamConfig:
    return StreamConfig(
        connection=KafkaConnection(bootstrap), topics={topic: "json"}, workdir=str(workdir), spec=spec,
        mlflow=MLflowTarget(server, experiment=f"health-{topic}", model_name=topic),
        train=TrainConfig(hidden=(8,), device="cpu"), dead_letters=DeadLetterPolicy(topic=f"{topic}.dead"), batch_messages=100,
        publish_every_s=3600, until_caught_up=True, group_id=f"{topic}-group")


def _versions(config: StreamConfig) -> list:
    return MlflowClient(config.mlflow.tracking_uri).search_model_versions(f"name='{config.mlflow.model_name}'")


def test_a_cycle_of_dead_letters_is_refused_the_stream_goes_on_and_publishes_once_it_learns(
        kafka_bootstrap, mlflow_server, tmp_path):
    topic = f"health-{uuid.uuid4().hex[:8]}"
    fill_topic(kafka_bootstrap, topic, [b"not json"] * 50, partitions=1)
    config = _config(kafka_bootstrap, mlflow_server, topic, tmp_path)
    reports = []
    summary = run_stream(config, on_cycle=lambda report, _: reports.append(report))
    assert summary.failures == 0 and summary.stopped is None and summary.cycles == 1
    assert reports[0].refused == "no sample trained (50 rows read, 50 dead letters)"
    assert summary.refused_cycles == 1
    # The version due at the stream's end is refused too: its window trained nothing.
    assert summary.versions == [] and _versions(config) == []
    assert summary.withheld.startswith("no sample trained")

    produce_values(kafka_bootstrap, topic, json_messages(400), 1)
    reports.clear()
    summary = run_stream(config, on_cycle=lambda report, _: reports.append(report))
    assert [r.refused for r in reports] == [None]
    assert summary.versions == ["1"] and summary.withheld is None and summary.refused_cycles == 0


def test_a_field_no_event_has_is_a_warning_on_the_cycle_and_the_version(kafka_bootstrap, mlflow_server, tmp_path):
    topic = f"health-{uuid.uuid4().hex[:8]}"
    fill_topic(kafka_bootstrap, topic, json_messages(400, stream=3), partitions=1)
    spec = replace(SPEC, sparse=(*SPEC.sparse, SparseField("c1_typo", embedding_dim=4, hash_buckets=50)))
    config = _config(kafka_bootstrap, mlflow_server, topic, tmp_path, spec=spec)
    reports = []
    summary = run_stream(config, on_cycle=lambda report, _: reports.append(report))
    warning = "field 'c1_typo' is absent in 100.0% of the rows (--max-missing-share 0.99)"
    assert all(r.refused is None and r.warnings == [warning] for r in reports)
    [version] = _versions(config)
    assert summary.versions == [version.version] and version.tags[HEALTH_WARNINGS] == warning


def _endless_server(mlflow_server, tmp_path, name):
    """An endless job's server due to publish at every checkpoint, a worker that pushes to
    it in process, and the planted batches it trains."""
    config = EndlessServerConfig(TRAINER_SPEC, TRAINER_CONFIG, str(tmp_path), {"events": "json"},
                                 mlflow=MLflowTarget(mlflow_server, experiment=name, model_name=name),
                                 publish_every_s=1e-6)
    server = EndlessServer(config, ServerAddress("127.0.0.1", free_port()))
    computer = GradientComputer(build_model(TRAINER_CONFIG.model, TRAINER_SPEC, server.trainer.plan,
                                            TRAINER_CONFIG.hidden))
    worker = GBAWorker(PSClient(server.layout, "worker0/x", max_in_flight=0, call=in_process([server.shard])),
                       computer, prequential=True)
    batches = list(planted_batches(TRAINER_SPEC, 400, 100, stream=5))
    return server, worker, batches


def test_the_endless_jobs_server_withholds_a_version_of_a_window_that_diverged_and_publishes_the_next(
        mlflow_server, tmp_path):
    """The endless job's server judges each version it is due to make with the same gate: a
    checkpoint whose window scored NaN (a model that diverged) makes no version and training
    goes on; the next checkpoint, scored in earnest, is published."""
    name = f"health-endless-{uuid.uuid4().hex[:8]}"
    server, worker, batches = _endless_server(mlflow_server, tmp_path, name)
    for batch in batches[:2]:
        worker.step(batch, WorkerStats())
    snapshot = server.shard.snapshot()
    diverged = replace(snapshot, window=Scored(snapshot.window.labels, torch.full_like(snapshot.window.scores, math.nan)))
    server._checkpoint([diverged])
    assert server.versions == [] and "auc is not finite" in server.publisher.withheld
    for batch in batches[2:]:
        worker.step(batch, WorkerStats())
    server._checkpoint([server.shard.snapshot()])
    assert server.versions == ["1"] and server.publisher.withheld is None
    version = MlflowClient(mlflow_server).get_model_version(name, "1")
    assert MlflowClient(mlflow_server).get_run(version.run_id).data.metrics["window_samples"] == 400


def test_the_endless_jobs_server_makes_no_version_of_a_window_of_one_class_and_is_not_refused(
        mlflow_server, tmp_path):
    """A window whose scored batches are all of one class has no AUC: not a model that went
    wrong, only one too little seen to score. No version is made of it (it would claim an
    AUC it does not have), the gate says it was not evaluated, not refused, and the next
    due version, of both classes, is published with the window grown since."""
    name = f"health-one-class-{uuid.uuid4().hex[:8]}"
    server, worker, batches = _endless_server(mlflow_server, tmp_path, name)
    worker.step(batches[0], WorkerStats())
    snapshot = server.shard.snapshot()
    one_class = replace(snapshot, window=Scored(torch.zeros_like(snapshot.window.labels), snapshot.window.scores))
    server._checkpoint([one_class])
    assert server.versions == []
    assert server.publisher.withheld == "not evaluated (100 scored rows, one class)"
    for batch in batches[1:]:
        worker.step(batch, WorkerStats())
    server._checkpoint([server.shard.snapshot()])
    assert server.versions == ["1"] and server.publisher.withheld is None
