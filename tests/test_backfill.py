"""Ranges of partitions in one process (pipelines/runs/backfill.py), publishing to a real
`mlflow server`: a version per partition in order, done once, publish every N, a failure
that stops the range where it is, and hourly partitions from the command line."""

from __future__ import annotations

import json
import uuid

import pytest
from mlflow.tracking import MlflowClient

from picasso.builtin_specs import criteo_spec
from picasso.checkpoint import load_checkpoint
from picasso.connectors.partitions import partition_range, with_hours
from picasso.serving.publishing.contract import MLflowTarget
from picasso.pipelines.runs.backfill import RangeStopped, run_range
from picasso.pipelines.cli.main import main
from picasso.pipelines.cli.output import STOPPED_EXIT
from picasso.pipelines.runs.daily import CHECKPOINTED, DailyConfig
from picasso.pipelines.runs.generate import generate_days
from picasso.trainer import TrainConfig

DAYS = partition_range("2026-11-01..2026-11-04")
ROWS = 600


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    root = tmp_path_factory.mktemp("range-days")
    generate_days(criteo_spec(), root, DAYS, rows=ROWS)
    return root


def _template(root, workdir, server, **overrides) -> DailyConfig:
    name = f"range-{uuid.uuid4().hex[:8]}"
    return DailyConfig(data_root=str(root), date=DAYS[0], workdir=str(workdir), spec=criteo_spec(),
                       mlflow=MLflowTarget(tracking_uri=server, experiment=f"test-{name}", model_name=name),
                       train=TrainConfig(hidden=(16,)), batch_size=256, **overrides)


def test_a_range_checkpoints_every_partition_in_order_and_publishes_every_n(days, mlflow_server, tmp_path):
    template = _template(days, tmp_path, mlflow_server)
    seen = []
    results = run_range(template, DAYS, publish_every=2, on_partition=seen.append)
    assert [r.date for r in results] == DAYS and not any(r.skipped for r in results)
    assert [r.status for r in results] == [CHECKPOINTED, "published", CHECKPOINTED, "published"]
    assert [r.version for r in results] == [None, "1", None, "2"]
    # Each partition starts from the checkpoint of the one before, and ends in its own.
    assert results[0].warm_start_from is None
    assert [r.warm_start_from for r in results[1:]] == [r.checkpoint for r in results[:-1]]
    steps = [load_checkpoint(r.checkpoint).step for r in results]
    assert steps == sorted(steps) and len(set(steps)) == len(DAYS)
    assert all(r.samples + r.holdout_samples == ROWS for r in results)
    # The versions say which partition they are, in date order.
    client = MlflowClient(mlflow_server)
    versions = {v.version: v for v in client.search_model_versions(f"name='{template.mlflow.model_name}'")}
    dates = [versions[str(n)].tags["picasso.date"] for n in (1, 2)]
    assert dates == [DAYS[1], DAYS[3]]
    assert [p.done for p in seen] == [1, 2, 3, 4] and seen[-1].eta_s == 0 and seen[0].rows_per_s > 0

    again = run_range(template, DAYS, publish_every=2)  # done once: nothing trains, nothing is published again
    assert all(r.skipped for r in again)
    assert [r.version for r in again] == [None, "1", None, "2"]
    assert len(client.search_model_versions(f"name='{template.mlflow.model_name}'")) == 2


def test_the_last_partition_done_is_published_when_a_range_stops(days, mlflow_server, tmp_path):
    template = _template(days, tmp_path, mlflow_server)
    (days / "date=2026-11-03").rename(days / "held-back")
    try:
        with pytest.raises(RangeStopped) as stopped:
            run_range(template, DAYS, publish_every=5)
    finally:
        (days / "held-back").rename(days / "date=2026-11-03")
    assert stopped.value.partition == "2026-11-03"
    assert "partition 2026-11-03 failed: FileNotFoundError" in str(stopped.value)
    assert "run the same range again to resume at 2026-11-03" in str(stopped.value)
    assert [r.date for r in stopped.value.results] == DAYS[:2]
    assert [r.status for r in stopped.value.results] == [CHECKPOINTED, "published"]
    resumed = run_range(template, DAYS, publish_every=5)
    assert [r.skipped for r in resumed] == [True, True, False, False]
    assert [r.version for r in resumed] == [None, "1", None, "2"]
    assert resumed[2].warm_start_from == stopped.value.results[1].checkpoint


def test_hourly_partitions_from_the_command_line(mlflow_server, tmp_path, capsys):
    root = tmp_path / "data"
    assert main(["generate", "--out", str(root), "--start-date", "2026-11-01", "--hourly", "--rows", "200"]) == 0
    assert sorted(p.name for p in (root / "date=2026-11-01").iterdir())[:2] == ["hour=00", "hour=01"]
    capsys.readouterr()
    name = f"hourly-{uuid.uuid4().hex[:8]}"
    argv = ["daily", "--data", str(root), "--date", "2026-11-01", "--hours", "3..4", "--workdir", str(tmp_path / "w"),
            "--mlflow-uri", mlflow_server, "--model-name", name, "--hidden", "16", "--json"]
    assert main(argv) == 0
    output = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [p["date"] for p in output["partitions"]] == with_hours(["2026-11-01"], "3..4")
    assert output["versions"] == ["1", "2"] and output["trained"] == 2
    assert all(p["samples"] + p["holdout_samples"] == 200 for p in output["partitions"])

    missing = ["daily", "--data", str(root), "--dates", "2026-11-01T23..2026-11-02T00",
               "--workdir", str(tmp_path / "w"), "--mlflow-uri", mlflow_server, "--model-name", name, "--hidden", "16",
               "--json"]
    assert main(missing) == STOPPED_EXIT
    stopped = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stopped["failed"] == "2026-11-02T00" and [p["date"] for p in stopped["partitions"]] == ["2026-11-01T23"]
    assert "no partition for 2026-11-02T00" in stopped["error"]


def test_missing_partitions_can_be_skipped_and_a_bad_policy_is_refused(days, mlflow_server, tmp_path):
    template = _template(days, tmp_path, mlflow_server)
    with pytest.raises(ValueError, match="missing partitions: one of fail, skip"):
        run_range(template, DAYS, missing="ignore")
    results = run_range(template, ["2026-10-31", DAYS[0]], missing="skip")  # no 2026-10-31: skipped
    assert [(r.date, r.version) for r in results] == [(DAYS[0], "1")]
