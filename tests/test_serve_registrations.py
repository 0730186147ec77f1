"""A version registered in any of the ways MLflow allows is served by `picasso serve`, or
refused with a reason that says what is wrong.

One model logged by `picasso publish` (its version 1), then registered again: by
mlflow.register_model of a runs:/ URI and of a models:/<logged model id> URI, by
client.create_model_version with each kind of source (runs:/, models:/ with its model id,
a run's artifact URI), and as MLflow 2 laid a model out (its files among the run's
artifacts, registered from runs:/RUN/PATH). A real `mlflow server` and a real `picasso
serve` following an alias that moves to each version; then the local SQLite store, where a
source may be a path on disk, and a pinned runs:/ URI."""

from __future__ import annotations

import json

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from publish_helpers import CheckpointMaker, fresh_target, request
from serving_helpers import ServeProcess, call, post, probabilities, wait_for

from picasso.serving.publishing.contract import MLflowTarget
from picasso.serving.publishing.publication import publish

EVENTS = pd.DataFrame({"d1": [0.5, 3.0, None], "h": ["a", None, 42], "v": [3, None, 0]})
BODY = {"dataframe_split": json.loads(EVENTS.to_json(orient="split", index=False))}
ALIAS = "live"


def _logged(client: MlflowClient, tracking_uri: str, name: str, tmp_path):
    """Version 1's run and logged model, and its files as MLflow 2 laid a model out: among
    the run's own artifacts, at classic/."""
    first = client.get_model_version(name, "1")
    run_id = first.run_id
    model_id = first.source.removeprefix("models:/")
    logged = client.get_logged_model(model_id)
    files = mlflow.artifacts.download_artifacts(artifact_uri=logged.artifact_location, dst_path=str(tmp_path / "files"),
                                                tracking_uri=tracking_uri)
    client.log_artifacts(run_id, files, "classic")
    return run_id, model_id, logged


def _registrations(client: MlflowClient, name: str, run_id: str, model_id: str, logged) -> dict:
    """Each way of registering, by what it is called: a function making the version."""
    run_uri = client.get_run(run_id).info.artifact_uri
    return {
        "register_model(runs:/RUN/model)": lambda: mlflow.register_model(f"runs:/{run_id}/{logged.name}", name),
        "register_model(models:/MODEL_ID)": lambda: mlflow.register_model(f"models:/{model_id}", name),
        "create_model_version(runs:/RUN/model)": lambda: client.create_model_version(
            name, f"runs:/{run_id}/{logged.name}", run_id),
        "create_model_version(models:/MODEL_ID, model_id)": lambda: client.create_model_version(
            name, f"models:/{model_id}", run_id, model_id=model_id),
        "register_model(runs:/RUN/classic), MLflow 2's layout": lambda: mlflow.register_model(
            f"runs:/{run_id}/classic", name),
        "create_model_version(runs:/RUN/classic)": lambda: client.create_model_version(
            name, f"runs:/{run_id}/classic", run_id),
        "create_model_version(RUN_ARTIFACT_URI/classic)": lambda: client.create_model_version(
            name, f"{run_uri}/classic", run_id),
    }


def test_every_way_mlflow_registers_a_version_is_served(mlflow_server, tmp_path):
    target = fresh_target(mlflow_server)
    publish(request(CheckpointMaker(tmp_path / "checkpoints").next(), 0.7), target)
    mlflow.set_tracking_uri(mlflow_server)
    mlflow.set_registry_uri(mlflow_server)
    client = MlflowClient(mlflow_server, mlflow_server)
    name = target.model_name
    expected = mlflow.pyfunc.load_model(f"models:/{name}/1").predict(EVENTS)
    run_id, model_id, logged = _logged(client, mlflow_server, name, tmp_path)
    made = {way: str(register().version) for way, register in _registrations(client, name, run_id, model_id,
                                                                               logged).items()}
    client.set_registered_model_alias(name, ALIAS, "1")
    with ServeProcess(f"models:/{name}@{ALIAS}", mlflow_server, tmp_path / "serve", "--poll-s", "0.2") as server:
        server.wait_serving()
        for way, version in made.items():
            client.set_registered_model_alias(name, ALIAS, version)
            wait_for(lambda: call(server.url, "/version").body.get("version") == version or
                      call(server.url, "/health").body["failed_versions"].get(version), f"version {version} loaded")
            health = call(server.url, "/health")
            assert health.status == 200, f"{way}: {health.body['failed_versions']}"
            answer = call(server.url, "/invocations", BODY)
            assert (answer.status, answer.version) == (200, version), (way, answer)
            np.testing.assert_array_equal(probabilities(answer.body, len(EVENTS)), expected, err_msg=way)


@pytest.mark.parametrize("path, says", [("nothing-here", "cannot download its files from"),
                                         ("plots", "there is no model at")])  # files, but no MLmodel
def test_a_version_whose_source_holds_no_model_is_refused_saying_so_and_the_served_one_stays(
        mlflow_server, tmp_path, path, says):
    target = fresh_target(mlflow_server)
    publish(request(CheckpointMaker(tmp_path / "checkpoints").next(), 0.7), target)
    client = MlflowClient(mlflow_server, mlflow_server)
    run_id = client.get_model_version(target.model_name, "1").run_id
    empty = client.create_model_version(target.model_name, f"runs:/{run_id}/{path}", run_id)
    with ServeProcess(f"models:/{target.model_name}@champion", mlflow_server, tmp_path / "serve",
                      "--poll-s", "0.2") as server:
        server.wait_serving()
        client.set_registered_model_alias(target.model_name, "champion", empty.version)
        failure = wait_for(lambda: call(server.url, "/health").body["failed_versions"].get(str(empty.version)),
                            "the empty version refused")
        assert failure["kind"] == "artifact"
        assert f"{says} runs:/{run_id}/{path}" in failure["reason"], failure
        assert post(server.url, BODY)[0] == 200 and call(server.url, "/version").body["version"] == "1"


@pytest.mark.parametrize("how", ["a path on disk", "a pinned runs:/ URI"])
def test_the_local_sqlite_store_serves_a_version_from_a_path_and_a_pinned_runs_uri(tmp_path, how):
    workdir = tmp_path / "workdir"
    target = MLflowTarget.for_workdir(workdir, model_name="picasso-ctr")
    publish(request(CheckpointMaker(tmp_path / "checkpoints").next(), 0.7), target)
    client = MlflowClient(target.tracking_uri, target.tracking_uri)
    first = client.get_model_version(target.model_name, "1")
    mlflow.set_tracking_uri(target.tracking_uri)
    expected = mlflow.pyfunc.load_model(f"models:/{target.model_name}/1").predict(EVENTS)
    if how == "a path on disk":
        folder = mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{target.model_name}/1",
                                                     dst_path=str(tmp_path / "copy"))
        version = client.create_model_version(target.model_name, folder)
        model = f"models:/{target.model_name}/{version.version}"
    else:
        model = f"runs:/{first.run_id}/model"
    with ServeProcess(model, None, tmp_path / "serve", "--workdir", str(workdir)) as server:
        server.wait_serving()
        status, body = post(server.url, BODY)
        assert status == 200
        np.testing.assert_array_equal(probabilities(body, len(EVENTS)), expected)
