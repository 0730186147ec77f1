"""Publishing while the real `mlflow server` goes away: killed in mid-publish and started
again, or down for a whole daily run. A private server, since these tests stop it."""

from __future__ import annotations

import threading
import uuid

import pytest
from mlflow.tracking import MlflowClient
from publish_helpers import CheckpointMaker, fresh_target, request

from picasso.builtin_specs import criteo_spec
from picasso.serving.publishing.contract import MLflowTarget
from picasso.serving.publishing.outbox import PublishOutbox
from picasso.serving.publishing.policy import PublishPolicy
from picasso.serving.publishing.publication import publish
from picasso.connectors.retry import RetryPolicy
from picasso.connectors.testing.mlflow_server import MlflowServer
from picasso.pipelines.runs.daily import DailyConfig, run_daily
from picasso.pipelines.runs.generate import generate_days
from picasso.trainer import TrainConfig

# Enough patience for a server restart (about 10 s, more on a busy machine): 2+4+8+8+... s.
PATIENT = PublishPolicy(retry=RetryPolicy(attempts=12, first_backoff_s=2, max_backoff_s=8), http_timeout_s=10,
                        http_retries=0)
IMPATIENT = PublishPolicy(retry=RetryPolicy(attempts=2, first_backoff_s=0.1, max_backoff_s=0.1), http_timeout_s=5,
                          http_retries=0)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-restart"))
    server.start()
    yield server
    server.stop()


def _kill_then_restart_at(server: MlflowServer, stage: str, restarts: list):
    def on_stage(reached: str) -> None:
        if reached == stage and not restarts:
            server.stop()  # SIGKILL: the server dies in mid-publish
            thread = threading.Thread(target=server.start)
            thread.start()
            restarts.append(thread)

    return on_stage


@pytest.mark.parametrize("stage", ["model_logged", "registered"])
def test_a_server_killed_in_mid_publish_gives_one_version_once_it_is_back(server, tmp_path, stage):
    target = fresh_target(server.uri)
    checkpoint = CheckpointMaker(tmp_path / "checkpoints").next()
    restarts: list[threading.Thread] = []
    version = publish(request(checkpoint, 0.7), target, PATIENT, workspace=tmp_path / "publish",
                      on_stage=_kill_then_restart_at(server, stage, restarts))
    assert restarts, f"the publish never reached {stage}"
    restarts[0].join()
    client = MlflowClient(server.uri)
    versions = client.search_model_versions(f"name = '{target.model_name}'")
    assert [v.version for v in versions] == ["1"] and version.version == "1"
    finished = client.get_model_version(target.model_name, "1")
    assert finished.tags["picasso.checkpoint_id"] == checkpoint.name
    assert finished.tags["picasso.promotion"] == "promoted"
    assert client.get_model_version_by_alias(target.model_name, "champion").version == "1"
    # The run whose model was logged before the kill is the version's run: no second model.
    runs = client.search_runs([client.get_experiment_by_name(target.experiment).experiment_id])
    assert [r.info.run_id for r in runs if "picasso.model_id" in r.data.tags] == [finished.run_id]
    again = publish(request(checkpoint, 0.7), target, PATIENT)
    assert again.version == "1" and not again.created


def test_a_daily_run_while_mlflow_is_down_stays_pending_and_is_published_by_the_rerun(server, tmp_path):
    generate_days(criteo_spec(), tmp_path / "data", ["2026-11-05"], rows=5_000, rows_per_file=5_000)
    name = f"daily-down-{uuid.uuid4().hex[:6]}"
    config = DailyConfig(data_root=str(tmp_path / "data"), date="2026-11-05", workdir=str(tmp_path / "work"),
                         spec=criteo_spec(), mlflow=MLflowTarget(server.uri, experiment=name, model_name=name),
                         train=TrainConfig(hidden=(32, 16)), policy=IMPATIENT)
    server.stop()
    try:
        down = run_daily(config)
    finally:
        server.start()
    assert down.status == "pending" and down.version is None and down.error
    assert len(PublishOutbox(config.folders.publish).pending()) == 1
    again = run_daily(config)  # the date is done: nothing is trained, the pending version goes out
    assert again.skipped and again.status == "published" and again.version == "1"
    assert again.checkpoint == down.checkpoint and again.auc == down.auc
    assert PublishOutbox(config.folders.publish).pending() == []
    versions = MlflowClient(server.uri).search_model_versions(f"name = '{name}'")
    assert [v.version for v in versions] == ["1"]
    assert run_daily(config).version == "1"  # and again: still one version
