"""Publishing checkpoints to a real `mlflow server`: what a version carries, promotion,
idempotency, deltas, the outbox, and bad configuration."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient
from publish_helpers import SPEC, CheckpointMaker, fresh_target, request

from picasso.checkpoint import load_checkpoint
from picasso.serving.publishing.contract import PENDING, PUBLISHED, MLflowTarget
from picasso.serving.publishing.delta_store import download_delta, download_weights, rebuild, rebuild_version
from picasso.serving.model_code import served_files, serving_requirements
from picasso.serving.publishing.model_delta import DeltaMismatch, apply_delta, changed_rows, compute_delta
from picasso.serving.publishing.outbox import PublishOutbox
from picasso.serving.publishing.policy import PublishPolicy, decide_promotion
from picasso.serving.publishing.publication import publish
from picasso.connectors.retry import RetryPolicy
from picasso.connectors.testing.loopback import free_port
from picasso.serving.weights import file_sha256, load_weights, serving_state

FAST = PublishPolicy(retry=RetryPolicy(attempts=2, first_backoff_s=0.05, max_backoff_s=0.05), http_timeout_s=5,
                     http_retries=0)


@pytest.fixture(scope="module")
def published(mlflow_server, tmp_path_factory):
    """Three checkpoints published in order: AUC 0.70 (first: champion), 0.60 (worse:
    stays candidate), 0.698 (within epsilon of 0.70: champion)."""
    root = tmp_path_factory.mktemp("publish")
    maker = CheckpointMaker(root / "checkpoints")
    target = fresh_target(mlflow_server)
    checkpoints = [maker.next() for _ in range(3)]
    versions = [publish(request(c, auc, step_metrics={"cache.hit_rate": [[1, 0.5], [2, 0.6]]}), target,
                        workspace=root / "publish")
                for c, auc in zip(checkpoints, (0.70, 0.60, 0.698))]
    return target, checkpoints, versions, root


def test_the_model_states_every_feature_in_its_metadata_and_no_input_schema_mlflow_would_enforce(published, mlflow_server):
    """An input schema would make MLflow drop the rows of a request that carry no column
    of it (serving/signature.py)."""
    target, _, _, _ = published
    mlflow.set_tracking_uri(mlflow_server)
    info = mlflow.models.get_model_info(f"models:/{target.model_name}/1")
    assert info.signature.inputs is None
    assert info.signature.outputs.input_names() == ["probability"]
    assert [(p.name, p.default) for p in info.signature.params.params] == [("on_bad_row", "error")]
    fields = info.metadata["input_fields"]
    assert set(fields) == {*SPEC.dense_names, *(f.name for f in SPEC.sparse)} and SPEC.label not in fields
    assert fields["bag"] == "integer or string ids, a list of at most 3" and fields["v"] == "integer ids in [0, 10)"


def test_a_version_carries_tags_metrics_params_and_artifacts(published, mlflow_server):
    target, checkpoints, versions, _ = published
    client = MlflowClient(mlflow_server)
    assert [v.version for v in versions] == ["1", "2", "3"]
    checkpoint = load_checkpoint(checkpoints[1])
    version = client.get_model_version(target.model_name, "2")
    assert version.tags["picasso.checkpoint_id"] == checkpoint.checkpoint_id
    assert json.loads(version.tags["picasso.positions"]) == checkpoint.positions
    assert version.tags["picasso.samples"] == str(checkpoint.state["samples"])
    assert version.tags["picasso.holdout_samples"] == "64"
    run = client.get_run(version.run_id)
    metrics = run.data.metrics
    assert metrics["auc"] == 0.60 and metrics["logloss"] == 0.6 and metrics["calibration"] == 1.02
    assert metrics["samples"] == 512
    assert metrics["positions_total"] == sum(checkpoint.positions.values())
    assert metrics["positions.part-1"] == checkpoint.positions["part-1"]
    assert metrics["train.cache.hit_rate"] == 0.75  # from the checkpoint's metrics
    history = client.get_metric_history(run.info.run_id, "cache.hit_rate")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.6)]
    assert run.data.params["mode"] == "test" and run.data.params["spec"] == SPEC.name
    assert run.data.params["promote_epsilon"] == "0.005"
    files = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {"spec.yaml", "packing_plan.json", "positions.json", "plots", "delta"} <= files
    plots = client.list_artifacts(run.info.run_id, "plots")
    assert [p.path for p in plots] == ["plots/metrics_over_versions.svg"]
    svg = open(client.download_artifacts(run.info.run_id, "plots/metrics_over_versions.svg")).read()
    assert svg.startswith("<svg") and "v1" in svg and "polyline" in svg  # version 1's point is on it
    plan = json.load(open(client.download_artifacts(run.info.run_id, "packing_plan.json")))
    assert sum(len(g["fields"]) for g in plan["groups"]) == len(SPEC.sparse)


def test_promotion_follows_auc_within_epsilon_and_says_why(published, mlflow_server):
    target, _, versions, _ = published
    client = MlflowClient(mlflow_server)
    assert [v.champion for v in versions] == [True, False, True]
    assert client.get_model_version_by_alias(target.model_name, "champion").version == "3"
    assert client.get_model_version_by_alias(target.model_name, "candidate").version == "3"
    second = client.get_model_version(target.model_name, "2")
    assert second.tags["picasso.promotion"] == "not_promoted"
    assert second.tags["picasso.promotion_reason"] == "auc 0.60000 < champion v1 auc 0.70000 - epsilon 0.005"
    assert client.get_model_version(target.model_name, "1").tags["picasso.promotion_reason"] == "no champion yet"


def test_promotion_can_be_turned_off(mlflow_server, tmp_path):
    target = fresh_target(mlflow_server)
    version = publish(request(CheckpointMaker(tmp_path).next(), 0.9), target, PublishPolicy(auto_promote=False))
    client = MlflowClient(mlflow_server)
    assert not version.champion and version.promotion_reason == "auto-promotion is off"
    assert client.get_model_version_by_alias(target.model_name, "candidate").version == "1"
    with pytest.raises(mlflow.exceptions.MlflowException):
        client.get_model_version_by_alias(target.model_name, "champion")


def test_promotion_decisions():
    policy = PublishPolicy(promote_epsilon=0.01)
    assert decide_promotion(0.70, 0.705, "4", policy).promote
    assert not decide_promotion(0.69, 0.705, "4", policy).promote
    assert decide_promotion(0.5, None, None, policy).reason == "no champion yet"
    assert not decide_promotion(math.nan, 0.7, "4", policy).promote  # a single-class evaluation set


def test_publishing_a_checkpoint_again_gives_the_same_version(published, mlflow_server):
    target, checkpoints, versions, root = published
    again = publish(request(checkpoints[1], 0.99), target, workspace=root / "publish")
    assert again.version == "2" and not again.created
    client = MlflowClient(mlflow_server)
    assert len(client.search_model_versions(f"name = '{target.model_name}'")) == 3
    # A re-publish leaves the aliases alone: version 3 stays champion and candidate.
    assert client.get_model_version_by_alias(target.model_name, "candidate").version == "3"


def test_a_version_is_rebuilt_bit_for_bit_from_the_one_before_and_its_delta(published, mlflow_server, tmp_path):
    target, checkpoints, versions, _ = published
    client = MlflowClient(mlflow_server)
    assert versions[0].delta_base is None and versions[2].delta_base == "2"
    assert versions[2].delta_bytes > 0 and versions[2].full_bytes > 0  # sizes: benchmarks.publish (tiny tables here)
    tagged = client.get_model_version(target.model_name, "3").tags
    assert int(tagged["picasso.delta_bytes"]) == versions[2].delta_bytes
    assert int(tagged["picasso.full_bytes"]) == versions[2].full_bytes
    done = rebuild_version(client, target.model_name, "3", tmp_path / "rebuilt.pt")
    served = download_weights(client, client.get_model_version(target.model_name, "3"), tmp_path / "served")
    assert done["sha256"] == file_sha256(served)
    assert (tmp_path / "rebuilt.pt").read_bytes() == served.read_bytes()
    expected = serving_state(load_checkpoint(checkpoints[2]).state["model"])
    assert all(torch.equal(expected[k], v) for k, v in load_weights(tmp_path / "rebuilt.pt").items())
    # The command line does the same from MLflow, and refuses a delta on the wrong base.
    out = tmp_path / "cli.pt"
    cli = subprocess.run([sys.executable, "-m", "picasso.pipelines.cli", "apply-delta", "--mlflow-uri", mlflow_server,
                          "--model-name", target.model_name, "--version", "3", "--out", str(out), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert json.loads(cli.stdout.strip().splitlines()[-1])["base_version"] == "2"
    assert out.read_bytes() == served.read_bytes()
    first = download_weights(client, client.get_model_version(target.model_name, "1"), tmp_path / "v1")
    delta = download_delta(client, client.get_model_version(target.model_name, "3"), tmp_path / "d3")
    with pytest.raises(DeltaMismatch, match="the delta applies to"):
        rebuild(first, delta, tmp_path / "wrong.pt")
    wrong = subprocess.run([sys.executable, "-m", "picasso.pipelines.cli", "apply-delta", "--base", str(first),
                            "--delta", str(delta), "--out", str(tmp_path / "wrong2.pt")],
                           capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 2 and "the delta applies to" in " ".join(wrong.stderr.split())


def test_deltas_compare_bits_and_ship_busy_tensors_whole():
    base = {"table": torch.zeros(10, 4), "dense": torch.ones(3, 2), "steps": torch.tensor(5)}
    target = {k: v.clone() for k, v in base.items()}
    target["table"][2, 1] = -0.0  # equal as a float, not as bits
    target["table"][7] = float("nan")
    target["dense"] += 1  # every row: whole
    target["steps"] += 1  # a scalar: whole
    assert changed_rows(base["table"], target["table"]).tolist() == [2, 7]
    delta = compute_delta(base, target, "a", "b")
    assert set(delta["rows"]) == {"table"} and set(delta["whole"]) == {"dense", "steps"}
    rebuilt = apply_delta(base, delta)
    assert list(rebuilt) == list(target)
    for key in target:
        assert torch.equal(rebuilt[key].view(torch.int32) if key == "table" else rebuilt[key],
                           target[key].view(torch.int32) if key == "table" else target[key])


def test_an_unreachable_server_leaves_the_publish_pending_until_it_answers(mlflow_server, tmp_path):
    maker = CheckpointMaker(tmp_path / "checkpoints")
    checkpoint = maker.next()
    outbox = PublishOutbox(tmp_path / "publish")
    down = MLflowTarget(f"http://127.0.0.1:{free_port()}", experiment="never", model_name="never")
    outcome = outbox.submit(request(checkpoint, 0.7), down, FAST, sleep=lambda s: None)
    assert outcome.status == PENDING and outcome.version is None
    assert "Connection" in outcome.error or "connect" in outcome.error
    assert len(outbox.pending()) == 1
    # The checkpoint directory may be pruned meanwhile: the outbox holds its own links.
    import shutil

    shutil.rmtree(checkpoint)
    target = fresh_target(mlflow_server)
    outcomes = outbox.flush(target, FAST)
    assert [o.status for o in outcomes] == [PUBLISHED] and outbox.pending() == []
    assert outcomes[0].version.version == "1"
    assert outbox.flush(target, FAST) == []
    assert outbox.published(str(checkpoint))["version"] == "1"
    version = MlflowClient(mlflow_server).get_model_version(target.model_name, "1")
    assert version.tags["picasso.checkpoint_id"] == checkpoint.name


def test_the_same_checkpoint_queued_twice_is_one_entry(tmp_path):
    checkpoint = CheckpointMaker(tmp_path / "checkpoints").next()
    outbox = PublishOutbox(tmp_path / "publish")
    assert outbox.add(request(checkpoint, 0.7)) == outbox.add(request(checkpoint, 0.7))
    assert len(outbox.pending()) == 1


def test_bad_publish_configuration_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="promote epsilon"):
        PublishPolicy(promote_epsilon=-0.1)
    with pytest.raises(ValueError, match="at least 1"):
        RetryPolicy(attempts=0)
    done = subprocess.run([sys.executable, "-m", "picasso.pipelines.cli", "apply-delta", "--out",
                           str(tmp_path / "x.pt"), "--base", str(tmp_path / "missing.pt"), "--delta",
                           str(tmp_path / "missing.pt")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "does not exist" in " ".join(done.stderr.split())


def test_the_model_loads_and_predicts_without_beam_kafka_or_an_installed_picasso(published, mlflow_server, tmp_path,
                                                                                  monkeypatch):
    target, _, _, _ = published
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", mlflow_server)  # models:/ URIs resolve through the registry
    repo = str(Path(__file__).resolve().parents[1])
    local = mlflow.artifacts.download_artifacts(f"models:/{target.model_name}/3", dst_path=str(tmp_path),
                                                tracking_uri=mlflow_server)
    requirements = (Path(local) / "requirements.txt").read_text().split()
    assert set(serving_requirements()) <= set(requirements)
    assert all("==" in line for line in requirements)  # pinned
    assert not any(name in " ".join(requirements) for name in ("apache-beam", "kafka"))
    code = Path(local) / "code"  # exactly the modules the pyfunc needs (test_served_code.py)
    assert sorted(str(path.relative_to(code)) for path in code.rglob("*") if path.is_file()) == served_files()
    script = f"""
import sys
for name in ("apache_beam", "kafka"):
    sys.modules[name] = None  # importing either now fails
# Hide the installed (editable) picasso: the model must bring its own copy.
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
# The repo's own paths go, but not the venv's site-packages, which CI makes inside it (.venv).
sys.path = [p for p in sys.path if not (p == {repo!r} or p.startswith({repo!r} + "/")) or p.startswith(sys.prefix)]
try:
    import picasso
    raise SystemExit("picasso is still importable")
except ImportError:
    pass
import mlflow, pandas as pd
model = mlflow.pyfunc.load_model({local!r})
assert {local!r} in sys.modules["picasso"].__file__, sys.modules["picasso"].__file__
print(list(model.predict(pd.DataFrame({{"h": ["new-id", None], "d1": [1, None], "bag": [["a", "b"], None]}}))))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    predictions = np.array(eval(done.stdout.strip().splitlines()[-1]))
    assert predictions.shape == (2,) and np.all((predictions > 0) & (predictions < 1))
    in_process = mlflow.pyfunc.load_model(local).predict(
        pd.DataFrame({"h": ["new-id", None], "d1": [1, None], "bag": [["a", "b"], None]}))
    np.testing.assert_allclose(predictions, in_process, rtol=1e-6)


def test_a_publish_leaves_the_callers_mlflow_uris_alone(mlflow_server, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    before = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    publish(request(CheckpointMaker(tmp_path).next(), 0.7), fresh_target(mlflow_server))
    assert (mlflow.get_tracking_uri(), mlflow.get_registry_uri()) == before
    assert "MLFLOW_TRACKING_URI" not in os.environ and "MLFLOW_REGISTRY_URI" not in os.environ


def test_publish_pending_exits_3_while_mlflow_is_down_and_publishes_once_it_answers(mlflow_server, tmp_path):
    checkpoint = CheckpointMaker(tmp_path / "checkpoints").next()
    PublishOutbox(tmp_path / "work" / "publish").add(request(checkpoint, 0.7))
    target = fresh_target(mlflow_server)

    def publish_pending(uri: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "picasso.pipelines.cli", "publish-pending", "--workdir",
                               str(tmp_path / "work"), "--mlflow-uri", uri, "--model-name", target.model_name,
                               "--experiment", target.experiment, "--publish-attempts", "1", "--json"],
                              capture_output=True, text=True, timeout=300)

    down = publish_pending(f"http://127.0.0.1:{free_port()}")
    assert down.returncode == 3, down.stderr[-2000:]
    assert json.loads(down.stdout.strip().splitlines()[-1])["pending"] == [str(checkpoint)]
    up = publish_pending(mlflow_server)
    assert up.returncode == 0, up.stderr[-2000:]
    assert json.loads(up.stdout.strip().splitlines()[-1])["published"] == ["1"]
