"""`picasso serve` following a registered model's champion: real processes on loopback (an
`mlflow server`, `picasso serve`, and this process publishing versions as a stream does,
each with a delta on the one before), and a client that never pauses.

Every check is of what a client or an operator sees: answers, the version header, /health,
/version and /metrics. Waits are bounded only by hang guards; nothing is timed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient
from publish_helpers import CheckpointMaker, fresh_target, request
from serving_helpers import HANG_GUARD_S, call, metric, probabilities, wait_for
from test_dynamic_serving import dynamic_spec

from picasso.serving.publishing.publication import publish
from picasso.connectors.testing.mlflow_server import MlflowServer, picasso_served
from picasso.serving.follower import ModelRef
from picasso.serving.publishing import registry_tags as tags
from picasso.serving.publishing.mlflow_env import python_model_of
from picasso.serving import versions
from picasso.serving.signature import BUILT_FROM
from picasso.serving.versions import DELTA, FULL, WEIGHTS, VersionLoader
from picasso.serving.weights import file_sha256, weights_sha256

POLL = ("--poll-s", "0.3")
EVENTS = pd.DataFrame({"d1": [0.5, 3.0, None, 1.0], "h": ["a", None, "b", 42], "v": [3, 7, None, 0]})
BODY = {"dataframe_split": {"columns": list(EVENTS.columns), "data": EVENTS.astype(object).where(EVENTS.notna(), None)
                            .values.tolist()}}


def served_version(url: str) -> str | None:
    return call(url, "/version").body.get("version")


class ClientLoop:
    """Requests one after the other, without pause, until stopped; keeps every answer."""

    def __init__(self, url: str):
        self.url, self.answers, self._stop = url, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + HANG_GUARD_S
        while not self._stop.is_set() and time.monotonic() < deadline:
            self.answers.append(call(self.url, "/invocations", BODY))

    def __enter__(self) -> "ClientLoop":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=HANG_GUARD_S)


@pytest.fixture
def publisher(mlflow_server, tmp_path):
    """A model of its own with version 1 published; publish() makes the next version."""
    target = fresh_target(mlflow_server)
    maker = CheckpointMaker(tmp_path / "checkpoints")

    def publish_next(auc: float = 0.7):
        return publish(request(maker.next(), auc), target)

    publish_next()
    return target, publish_next


def test_a_client_that_never_pauses_gets_every_version_in_order_each_answer_that_versions(publisher, mlflow_server,
                                                                                          tmp_path):
    target, publish_next = publisher
    uri = f"models:/{target.model_name}@champion"
    with picasso_served(uri, mlflow_server, tmp_path / "serve.log", *POLL) as (url, _):
        with ClientLoop(url) as client:
            for version in ("2", "3"):
                ref = publish_next()
                assert ref.version == version and ref.champion and ref.delta_base == str(int(version) - 1)
                wait_for(lambda: served_version(url) == version, f"version {version} served")
            answered = len(client.answers)
            wait_for(lambda: len(client.answers) > answered + 3, "answers from version 3")
        # The client has stopped: every request it made is in the server's metrics.
        deltas, fulls = metric(url, 'picasso_serve_swaps_total{how="delta"}'), metric(url, 'picasso_serve_swaps_total{how="full"}')
        answered = metric(url, 'picasso_serve_request_seconds_count{status="200"}')
        assert answered == len(client.answers)
        assert metric(url, "picasso_serve_request_rows_sum") == len(EVENTS) * answered
    assert all(answer.status == 200 for answer in client.answers), [a for a in client.answers if a.status != 200][:3]
    seen = [int(answer.version) for answer in client.answers]
    assert seen == sorted(seen) and set(seen) == {1, 2, 3}  # never backwards, none missed at the end
    mlflow.set_tracking_uri(mlflow_server)
    for version in (1, 2, 3):
        expected = mlflow.pyfunc.load_model(f"models:/{target.model_name}/{version}").predict(EVENTS)
        for answer in (a for a in client.answers if a.version == str(version)):
            np.testing.assert_array_equal(probabilities(answer.body, len(EVENTS)), expected)
    assert (deltas, fulls) == (2, 1)  # the first in full; both new ones from the served one plus their delta


def test_the_delta_path_rebuilds_the_full_models_tables_bit_for_bit_with_dynamic_tables(mlflow_server, tmp_path):
    """New ids and evicted ones (tombstones) in every version; each built in memory from
    the one before plus its delta equals the same version loaded in full: every tensor bit
    for bit (the bytes its weights file would have), and every prediction; and the version
    it was built from answers as before."""
    target = fresh_target(mlflow_server)
    maker = CheckpointMaker(tmp_path / "checkpoints", spec=dynamic_spec())
    refs = [publish(request(maker.next(), 0.7), target) for _ in range(3)]
    client = MlflowClient(mlflow_server, mlflow_server)
    by_delta, in_full = VersionLoader(client, tmp_path / "delta"), VersionLoader(client, tmp_path / "full")
    served = None
    events = pd.DataFrame({"item": ["never-seen", 5, "7"], "d1": [1.0, 2.0, None], "h": ["a", "b", 3]})
    for ref in refs:
        version = client.get_model_version(target.model_name, ref.version)
        before = None if served is None else served.model.predict(events)
        loaded = by_delta.load_version(target.model_name, version, served)
        assert loaded.loaded_by == (FULL if served is None else DELTA)
        full = in_full.load_version(target.model_name, version, None)
        # What the publisher says the version is built from is what its files hash to.
        assert full.model.metadata.metadata[BUILT_FROM] == full.built_from == loaded.built_from
        assert full.weights_sha256 == file_sha256(full.folder / WEIGHTS) == version.tags[tags.WEIGHTS_SHA]
        ours, theirs = (python_model_of(v.model).serving_weights() for v in (loaded, full))
        assert list(ours) == list(theirs) and weights_sha256(ours) == weights_sha256(theirs) == full.weights_sha256
        assert loaded.weights_sha256 == full.weights_sha256
        np.testing.assert_array_equal(loaded.model.predict(events), full.model.predict(events))
        if served is not None:
            assert loaded.bytes_read * 3 < full.bytes_read  # its MLmodel and delta, not the model
            np.testing.assert_array_equal(served.model.predict(events), before)
            assert not np.array_equal(loaded.model.predict(events), before)
            by_delta.forget(served)
        in_full.forget(full)
        served = loaded


def test_a_version_logged_before_versions_said_what_they_are_built_from_still_loads_by_delta(
        mlflow_server, tmp_path, monkeypatch):
    """Without built_from_sha256 in its MLmodel, a version's spec, model config and pyfunc
    file are read and hashed instead; the same ones still make a delta version, others a
    full load."""
    target = fresh_target(mlflow_server)
    maker = CheckpointMaker(tmp_path / "checkpoints")
    refs = [publish(request(maker.next(), 0.7), target) for _ in range(2)]
    client = MlflowClient(mlflow_server, mlflow_server)
    read_mlmodel = versions._read_mlmodel

    def as_logged_before(folder):
        mlmodel = read_mlmodel(folder)
        mlmodel["metadata"].pop(BUILT_FROM)
        return mlmodel

    monkeypatch.setattr(versions, "_read_mlmodel", as_logged_before)
    loader = VersionLoader(client, tmp_path / "cache")
    first, second = (client.get_model_version(target.model_name, ref.version) for ref in refs)
    served = loader.load_version(target.model_name, first, None)
    assert served.built_from is not None  # from its files
    loaded = loader.load_version(target.model_name, second, served)
    assert loaded.loaded_by == DELTA and loaded.weights_sha256 == second.tags[tags.WEIGHTS_SHA]
    small = sum((served.folder / name).stat().st_size for name in (versions.MLMODEL, *versions.SAME_FOR_A_DELTA))
    assert loaded.bytes_read > small  # the three files were read
    other = replace(served, built_from="0" * 64)  # as if the served version had another spec
    assert loader.load_version(target.model_name, second, other).loaded_by == FULL


def test_a_rollback_by_picasso_promote_is_followed(publisher, mlflow_server, tmp_path):
    target, publish_next = publisher
    publish_next()
    uri = f"models:/{target.model_name}@champion"
    with picasso_served(uri, mlflow_server, tmp_path / "serve.log", *POLL) as (url, _), ClientLoop(url) as client:
        assert served_version(url) == "2"
        done = subprocess.run([sys.executable, "-m", "picasso.pipelines.cli", "promote", "--version", "1",
                               "--mlflow-uri", mlflow_server, "--model-name", target.model_name, "--json"],
                              capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert done.returncode == 0, done.stderr
        assert '"was": "2"' in done.stdout
        wait_for(lambda: served_version(url) == "1", "the rollback served")
        answered = len(client.answers)
        wait_for(lambda: len(client.answers) > answered + 3, "answers after the rollback")
        # The first, and the rollback: version 1 has no delta on version 2.
        assert metric(url, 'picasso_serve_swaps_total{how="full"}') == 2
    assert all(answer.status == 200 for answer in client.answers)
    seen = [answer.version for answer in client.answers]
    assert seen[-1] == "1" and "2" in seen and seen[seen.index("1"):] == ["1"] * (len(seen) - seen.index("1"))


class _FailsToLoad(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        raise RuntimeError("this version's model cannot load")


def test_a_version_that_fails_to_load_or_takes_other_fields_leaves_the_served_one(publisher, mlflow_server, tmp_path):
    target, publish_next = publisher
    uri = f"models:/{target.model_name}@champion"
    client = MlflowClient(mlflow_server, mlflow_server)
    with picasso_served(uri, mlflow_server, tmp_path / "serve.log", *POLL) as (url, _), ClientLoop(url) as loop:
        # A model that raises as it loads, with the served version's request fields.
        mlflow.set_tracking_uri(mlflow_server)
        fields = mlflow.models.Model.load(f"models:/{target.model_name}/1").metadata["input_fields"]
        with mlflow.start_run():
            broken = mlflow.pyfunc.log_model(name="model", python_model=_FailsToLoad(), metadata={"input_fields": fields},
                                             pip_requirements=[], registered_model_name=target.model_name)
        client.set_registered_model_alias(target.model_name, "champion", broken.registered_model_version)
        health = wait_for(lambda: _degraded(url), "the broken version reported")
        assert health["served_version"] == "1" and health["wanted_version"] == "2"
        assert health["failed_versions"]["2"]["kind"] == "model"
        assert metric(url, 'picasso_serve_swap_failures_total{kind="model"}') == 1  # once, however many polls
        # Another spec: other request fields, which would break every client.
        other = CheckpointMaker(tmp_path / "other", spec=dynamic_spec())
        publish(request(other.next(), 0.99), target)
        client.set_registered_model_alias(target.model_name, "champion", "3")
        health = wait_for(lambda: (h := _degraded(url)) and h["wanted_version"] == "3" and h, "the spec change refused")
        assert health["failed_versions"]["3"]["kind"] == "spec" and "item" in health["failed_versions"]["3"]["reason"]
        assert call(url, "/ping").status == 200 and served_version(url) == "1"
        # Back to a good version: followed, and healthy again.
        publish_next()
        client.set_registered_model_alias(target.model_name, "champion", "4")
        wait_for(lambda: call(url, "/health").status == 200, "healthy on version 4")
        wait_for(lambda: loop.answers[-1].version == "4", "answers from version 4")
    assert all(answer.status == 200 for answer in loop.answers)
    assert {answer.version for answer in loop.answers} == {"1", "4"}
    log = (tmp_path / "serve.log").read_text()
    assert log.count("version 2: model:") == 1 and log.count("version 3: spec:") == 1


def _degraded(url: str) -> dict | None:
    answer = call(url, "/health")
    return answer.body if answer.status == 503 else None


def test_serving_goes_on_while_the_registry_is_down_and_follows_it_when_it_is_back(tmp_path):
    registry = MlflowServer(tmp_path / "registry")
    uri = registry.start()
    target = fresh_target(uri)
    maker = CheckpointMaker(tmp_path / "checkpoints")
    publish(request(maker.next(), 0.7), target)
    try:
        with picasso_served(f"models:/{target.model_name}@champion", uri, tmp_path / "serve.log", *POLL) as (url, _), \
                ClientLoop(url) as loop:
            registry.stop()
            health = wait_for(lambda: _degraded(url), "the registry reported unreachable")
            assert health["registry_error"] and health["served_version"] == "1"
            assert call(url, "/ping").status == 200
            registry.start()
            publish(request(maker.next(), 0.7), target)
            wait_for(lambda: served_version(url) == "2", "version 2 served once the registry is back")
            assert call(url, "/health").status == 200
        assert all(answer.status == 200 for answer in loop.answers)
        assert [answer.version for answer in loop.answers] == sorted(answer.version for answer in loop.answers)
    finally:
        registry.stop()


@pytest.mark.parametrize("model, says", [
    ("models:/x", "give models:/NAME@ALIAS"),
    ("models:/x@champion", "points at no version"),
    ("models:/no-such-model/3", "nothing to serve"),
])
def test_nothing_to_serve_is_one_line_and_exit_2(mlflow_server, tmp_path, model, says):
    done = subprocess.run([sys.executable, "-m", "picasso.pipelines.cli", "serve", "--model", model, "--mlflow-uri",
                           mlflow_server, "--port", "0", "--start-timeout-s", "0", "--poll-s", "0.1"],
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr


def test_model_uris_are_read_as_followed_or_pinned():
    assert ModelRef.parse("models:/ctr@champion").follows
    pinned = ModelRef.parse("models:/ctr/7")
    assert (pinned.follows, pinned.name, pinned.version) == (False, "ctr", "7")
    assert not ModelRef.parse("runs:/abc/model").follows
    with pytest.raises(ValueError, match="models:/NAME@ALIAS"):
        ModelRef.parse("models:/ctr")


def test_freshness_is_served_from_the_versions_newest_event(publisher, mlflow_server, tmp_path):
    target, publish_next = publisher
    client = MlflowClient(mlflow_server, mlflow_server)
    newest_ms = int(time.time() * 1000) - 60_000
    client.set_model_version_tag(target.model_name, "1", "picasso.newest_event_ms", str(newest_ms))
    with picasso_served(f"models:/{target.model_name}/1", mlflow_server, tmp_path / "serve.log") as (url, _):
        assert call(url, "/version").body["newest_event_ms"] == newest_ms
        freshness = metric(url, "picasso_serve_model_freshness_seconds")
        assert freshness >= 60 and metric(url, "picasso_serve_model_version") == 1
