"""The MLflow Project's entry points, run for real with `mlflow run --env-manager local`
against a real `mlflow server` (and, for stream, a real broker)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from mlflow.tracking import MlflowClient
from stream_helpers import fill_topic, json_messages, write_spec

from picasso.builtin_specs import criteo_spec
from picasso.pipelines.runs.generate import generate_days

PROJECT = Path(__file__).resolve().parents[1] / "mlflow"


def mlflow_run(entry_point: str, server: str, experiment: str, cwd: Path, **params) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mlflow", "run", str(PROJECT), "-e", entry_point, "--env-manager", "local",
               "--experiment-name", experiment]
    for key, value in params.items():
        command += ["-P", f"{key}={value}"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": server, "MLFLOW_DISABLE_TELEMETRY": "true"}
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


def _published_under_project_run(client: MlflowClient, model_name: str) -> None:
    version = client.get_model_version(model_name, "1")
    publish_run = client.get_run(version.run_id)
    parent = publish_run.data.tags["mlflow.parentRunId"]
    assert client.get_run(parent).data.tags["mlflow.project.entryPoint"] in ("daily", "stream")
    assert client.get_model_version_by_alias(model_name, "champion").version == "1"


def test_the_daily_entry_point_runs_and_publishes(mlflow_server, tmp_path):
    generate_days(criteo_spec(), tmp_path / "data", ["2026-11-20"], rows=5_000, rows_per_file=5_000)
    model_name = f"project-daily-{uuid.uuid4().hex[:6]}"
    done = mlflow_run("daily", mlflow_server, model_name, tmp_path, data=tmp_path / "data", date="2026-11-20",
                      workdir=tmp_path / "work", model_name=model_name, hidden="16,8")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    _published_under_project_run(MlflowClient(mlflow_server), model_name)


def test_the_stream_entry_point_runs_and_publishes(mlflow_server, kafka_bootstrap, tmp_path):
    topic = f"project-{uuid.uuid4().hex[:6]}"
    fill_topic(kafka_bootstrap, topic, json_messages(600), partitions=1)
    model_name = f"project-stream-{uuid.uuid4().hex[:6]}"
    done = mlflow_run("stream", mlflow_server, model_name, tmp_path, spec=write_spec(tmp_path),
                      topic=f"{topic}:json", bootstrap_servers=kafka_bootstrap, workdir=tmp_path / "work",
                      publish_every=1, max_cycles=1, model_name=model_name, hidden="16,8")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    _published_under_project_run(MlflowClient(mlflow_server), model_name)
    assert (tmp_path / "work" / "runs" / "stream-versions.jsonl").exists()
