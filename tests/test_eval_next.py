"""Test-then-train over a range (`picasso daily --dates A..B --eval-next`): each partition
trains on all its rows and its version is scored on the next partition, publishing to a
real `mlflow server`. Each AUC is checked against the partition's checkpoint scored on the
next partition's rows here, outside the pipeline."""

from __future__ import annotations

import io
import json
import re
import uuid
from contextlib import contextmanager

import numpy as np
import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient
from rich.console import Console
from sklearn.metrics import roc_auc_score

from picasso.batch import pack
from picasso.builtin_specs import criteo_spec
from picasso.connectors.day_files import list_day_files
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.connectors.partitions import next_partition, partition_range
from picasso.serving.publishing.contract import MLflowTarget
from picasso.serving.publishing.policy import PublishPolicy, decide_promotion
from picasso.packing import PackingPlan
from picasso.pipelines.cli.backfill import summary_table
from picasso.pipelines.cli.main import main
from picasso.pipelines.cli.output import BAD_INPUT_EXIT
from picasso.pipelines.runs.backfill import run_range
from picasso.pipelines.runs.daily import DailyConfig
from picasso.pipelines.runs.generate import generate_days
from picasso.trainer import TrainConfig, Trainer

DAYS = partition_range("2026-11-01..2026-11-04")
ROWS = 600
TRAIN = TrainConfig(hidden=(16,))


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-next-days")
    generate_days(criteo_spec(), root, DAYS, rows=ROWS)
    return root


def _template(root, workdir, server) -> DailyConfig:
    name = f"next-{uuid.uuid4().hex[:8]}"
    return DailyConfig(data_root=str(root), date=DAYS[0], workdir=str(workdir), spec=criteo_spec(),
                       mlflow=MLflowTarget(tracking_uri=server, experiment=f"test-{name}", model_name=name),
                       train=TRAIN, batch_size=256)


def _auc_on(checkpoint: str, root, partition: str) -> float:
    """The checkpoint's AUC on every row of the partition: decoded, packed and scored here,
    the AUC by scikit-learn."""
    spec = criteo_spec()
    trainer = Trainer(spec, TRAIN)
    trainer.restore(checkpoint)
    labels, scores = [], []
    for path in list_day_files(root, partition):
        decoded = RecordDecoder(spec).decode_table(pq.read_table(path), path)
        assert decoded.dead_letters == []
        labels.append(decoded.table.column("label").to_numpy())
        scores.append(trainer.predict(pack(decoded.table, spec, PackingPlan.from_spec(spec))))
    return roc_auc_score(np.concatenate(labels), np.concatenate(scores))


@contextmanager
def _hidden(folder):
    """The partition's folder out of sight for the length of a `with`."""
    hidden = folder.with_name(folder.name + ".hidden")
    folder.rename(hidden)
    try:
        yield
    finally:
        hidden.rename(folder)


def test_each_partition_is_scored_on_the_next_and_a_rerun_trains_nothing(days, mlflow_server, tmp_path):
    template = _template(days, tmp_path, mlflow_server)
    results = run_range(template, DAYS[:3], eval_next=True)
    assert [r.evaluation for r in results] == [f"day={d}" for d in DAYS[1:]]  # the last on the day after the range
    assert [r.scored_on for r in results] == DAYS[1:]
    assert all(r.samples == ROWS and r.holdout_samples == ROWS for r in results)  # all trained, all of the next scored
    for r, scored_on in zip(results, DAYS[1:]):
        assert r.auc == pytest.approx(_auc_on(r.checkpoint, days, scored_on), abs=1e-6)

    client = MlflowClient(mlflow_server)
    name = template.mlflow.model_name
    for r, scored_on in zip(results, DAYS[1:]):
        version = client.get_model_version(name, r.version)
        assert version.tags["picasso.evaluation"] == f"day={scored_on}"
        assert client.get_run(version.run_id).data.metrics["auc"] == pytest.approx(r.auc)
    # The summary table says what each was scored on: a row per partition, in a log file's 80 columns.
    console = Console(file=io.StringIO(), width=80)
    console.print(summary_table(results))
    lines = console.file.getvalue().splitlines()
    for r in results:
        cells = [re.split(r"[\s│]+", line.strip())[:4] for line in lines]
        assert [r.date, f"{ROWS:,}", r.scored_on, f"{r.auc:.4f}"] in cells, lines
    # Every version was scored the same way, so the gate compares their AUCs.
    assert results[0].promotion_reason == "no champion yet"
    assert all(r.promotion_reason.startswith("auc ") for r in results[1:])

    with _hidden(days / f"date={DAYS[3]}"):  # a rerun of a done range needs no partition after it
        again = run_range(template, DAYS[:3], eval_next=True)
    assert all(r.skipped for r in again)
    assert [(r.version, r.auc, r.evaluation) for r in again] == [(r.version, r.auc, r.evaluation) for r in results]
    assert len(client.search_model_versions(f"name='{name}'")) == 3


def test_without_a_partition_after_the_range_nothing_trains(days, mlflow_server, tmp_path):
    template = _template(days, tmp_path, mlflow_server)
    after = next_partition(DAYS[-1])
    with pytest.raises(FileNotFoundError, match=f"scores the last, {DAYS[-1]}, on {after}, which has no files"):
        run_range(template, DAYS, eval_next=True)
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "runs").exists()


def test_a_skipped_partition_passes_its_turn_to_the_next(days, mlflow_server, tmp_path):
    template = _template(days, tmp_path, mlflow_server)
    with _hidden(days / f"date={DAYS[1]}"):
        results = run_range(template, DAYS[:3], missing="skip", eval_next=True)
    assert [(r.date, r.scored_on) for r in results] == [(DAYS[0], DAYS[2]), (DAYS[2], DAYS[3])]
    assert results[0].auc == pytest.approx(_auc_on(results[0].checkpoint, days, DAYS[2]), abs=1e-6)


def test_a_holdout_champion_is_not_compared_with_a_version_scored_on_the_next(days, mlflow_server, tmp_path):
    template = _template(days, tmp_path, mlflow_server)
    first = run_range(template, DAYS[:1])[0]
    assert first.evaluation == "holdout" and first.champion
    results = run_range(template, DAYS[:2], eval_next=True)
    assert results[0].skipped and results[0].evaluation == "holdout"  # done before, as it was done
    assert results[1].scored_on == DAYS[2] and results[1].champion
    assert results[1].promotion_reason.startswith(f"champion v1 was scored on holdout and this version on day={DAYS[2]}")


def test_the_gate_compares_only_aucs_measured_alike():
    policy = PublishPolicy()
    assert not decide_promotion(0.60, 0.70, "1", policy, "day=2026-11-03", "day=2026-11-02").promote
    assert not decide_promotion(0.60, 0.70, "1", policy, "holdout", "holdout").promote
    assert not decide_promotion(0.60, 0.70, "1", policy).promote  # versions that do not say how: as before
    unlike = decide_promotion(0.60, 0.70, "1", policy, "day=2026-11-03", "holdout")
    assert unlike.promote and "not compared" in unlike.reason
    assert not decide_promotion(0.60, 0.70, "1", PublishPolicy(auto_promote=False), "day=2026-11-03",
                                "holdout").promote


def test_hourly_partitions_scored_on_the_next_hour_from_the_command_line(mlflow_server, tmp_path, capsys):
    root = tmp_path / "data"
    assert main(["generate", "--out", str(root), "--start-date", "2026-11-01", "--hourly", "--rows", "200"]) == 0
    capsys.readouterr()
    name = f"hourly-next-{uuid.uuid4().hex[:8]}"
    common = ["--data", str(root), "--workdir", str(tmp_path / "w"), "--mlflow-uri", mlflow_server,
              "--model-name", name, "--hidden", "16", "--json"]
    assert main(["daily", "--date", "2026-11-01", "--hours", "3..4", "--eval-next", *common]) == 0
    output = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert output["eval_next"] and output["versions"] == ["1", "2"]
    assert [(p["date"], p["evaluation"]) for p in output["partitions"]] == [
        ("2026-11-01T03", "day=2026-11-01T04"), ("2026-11-01T04", "day=2026-11-01T05")]
    assert all(p["samples"] == 200 and p["holdout_samples"] == 200 for p in output["partitions"])
    assert not (root / "date=2026-11-02").exists()  # so the hour after 23 has no files
    assert main(["daily", "--date", "2026-11-01", "--hours", "22..23", "--eval-next", *common]) == BAD_INPUT_EXIT
    refused = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "on 2026-11-02T00, which has no files" in refused["error"]


@pytest.mark.parametrize("flags, named", [
    (["--dates", "2026-11-01..2026-11-02", "--eval-next", "--eval-date", "2026-11-03"], "--eval-next and --eval-date"),
    (["--date", "2026-11-01", "--eval-next"], "--eval-next are for a range"),
    (["--dates", "2026-11-01..2026-11-02", "--eval-date", "2026-11-03"], "--eval-date is for one partition"),
])
def test_bad_flag_combinations_are_refused_by_name(flags, named, tmp_path, capsys):
    argv = ["daily", "--data", str(tmp_path / "data"), "--workdir", str(tmp_path / "w"), *flags, "--json"]
    assert main(argv) == BAD_INPUT_EXIT
    assert named in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
    assert not (tmp_path / "w").exists()  # refused before the work folder is made
