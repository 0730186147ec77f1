"""Partitions too small to score are unusual, not wrong (pipelines/runs/run_health.py).

Real data has days of one row, of two, of one class, and files that hold no row. Such a
partition trains, is done and says it was not evaluated, in its progress line, its
record and --json; it makes no version (a version would claim a metric it does not
have); a range goes on past it; the next version covers it and says so. The gate still
refuses what is broken: a model that diverges. Daily runs publish to the session's real
`mlflow server`.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient

from picasso.builtin_specs import criteo_spec
from picasso.connectors.partitions import partition_range
from picasso.pipelines.cli.main import main
from picasso.pipelines.runs.backfill import RangeStopped, run_range
from picasso.pipelines.runs.daily import NOT_EVALUATED, PARTITIONS, PARTITIONS_COVERED, REFUSED, run_daily
from picasso.pipelines.runs.generate import generate_days
from picasso.pipelines.runs.run_health import EvaluationRows, HealthFacts, HealthLimits, check_health
from picasso.serving.publishing.contract import MLflowTarget
from picasso.pipelines.runs.daily import DailyConfig
from picasso.trainer import TrainConfig

ROWS = 400
DAYS = partition_range("2026-06-01..2026-06-07")
# What each day holds: its rows, and whether they are all of one class.
TINY = {DAYS[1]: 1, DAYS[2]: 2, DAYS[3]: 5, DAYS[5]: 0}  # DAYS[5]: a file with no row
ONE_CLASS = DAYS[4]


# -- the verdict -----------------------------------------------------------------------

@pytest.mark.parametrize("rows, positives, said", [
    (0, 0, "not evaluated (0 held-out rows)"),
    (1, 1, "not evaluated (1 held-out row, one class)"),
    (2, 0, "not evaluated (2 held-out rows, one class)"),
])
def test_evaluation_rows_without_both_classes_are_not_evaluated_and_not_refused(rows, positives, said):
    losses = {"auc": math.nan, "logloss": math.nan if rows == 0 else 0.3, "train_loss": 0.6}
    verdict = check_health(HealthFacts(100, 100 + rows, 0, losses, evaluation=EvaluationRows(rows, positives)),
                           HealthLimits())
    assert not verdict.refused and verdict.not_evaluated == said


def test_a_partition_that_read_nothing_or_trained_none_of_its_rows_is_not_refused():
    nothing = HealthFacts(0, 0, 0, {"auc": math.nan, "logloss": math.nan, "train_loss": math.nan},
                          evaluation=EvaluationRows(0, 0))
    all_held_out = HealthFacts(0, 1, 0, {"auc": math.nan, "logloss": 0.7, "train_loss": math.nan},
                               evaluation=EvaluationRows(1, 0))
    for facts in (nothing, all_held_out):
        verdict = check_health(facts, HealthLimits())
        assert not verdict.refused and verdict.not_evaluated


def test_a_broken_model_is_still_refused_whatever_its_evaluation_rows():
    both = EvaluationRows(50, 20)
    diverged = check_health(HealthFacts(100, 150, 0, {"auc": math.nan, "logloss": math.nan}, evaluation=both),
                            HealthLimits())
    assert diverged.refusals == ("auc is not finite (nan)", "logloss is not finite (nan)")
    # One class, but a log loss of NaN on its rows: the model's scores are not numbers.
    nan_scores = check_health(HealthFacts(100, 102, 0, {"auc": math.nan, "logloss": math.nan},
                                          evaluation=EvaluationRows(2, 0)), HealthLimits())
    assert nan_scores.refusals == ("logloss is not finite (nan)",)
    train = check_health(HealthFacts(100, 101, 0, {"train_loss": math.inf}, evaluation=EvaluationRows(1, 0)),
                         HealthLimits())
    assert train.refusals == ("train_loss is not finite (inf)",)
    # Diverged without reaching NaN: scores saturated, losses huge.
    saturated = check_health(HealthFacts(100, 150, 0, {"auc": 0.5, "logloss": 13.4, "train_loss": 7.9e18},
                                         evaluation=both), HealthLimits())
    assert saturated.refusals == ("logloss is 13.4, above --max-loss 3 (a model that diverged)",
                                  "train_loss is 7.9e+18, above --max-loss 3 (a model that diverged)")
    assert not check_health(HealthFacts(100, 150, 0, {"auc": 0.5, "logloss": 13.4}, evaluation=both),
                            HealthLimits(max_loss=20)).refused
    # Every row a dead letter is refused, held out or not.
    assert check_health(HealthFacts(0, 3, 3, {}, evaluation=EvaluationRows(0, 0)), HealthLimits()).refused


# -- daily runs and ranges ---------------------------------------------------------------

def _cut(root: Path, date: str, rows: int | None = None, labels=None) -> None:
    """Every file of the partition cut to its first `rows` rows, or its labels replaced."""
    for path in sorted((root / f"date={date}").glob("*.parquet")):
        table = pq.read_table(path)
        if rows is not None:
            table = table.slice(0, rows)
            rows = 0  # the first file holds them; the others none
        if labels is not None:
            column = pa.array(labels(table.num_rows), type=table.schema.field("label").type)
            table = table.set_column(table.schema.get_field_index("label"), "label", column)
        pq.write_table(table, path)


@pytest.fixture(scope="module")
def days(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny-days")
    generate_days(criteo_spec(), root, DAYS, rows=ROWS)
    for date, rows in TINY.items():
        _cut(root, date, rows=rows)
    _cut(root, ONE_CLASS, labels=np.zeros)
    return root


def _model_name() -> str:
    return f"tiny-{uuid.uuid4().hex[:8]}"


def _config(root, workdir, server, date=DAYS[0], **overrides) -> DailyConfig:
    name = _model_name()
    return DailyConfig(data_root=str(root), date=date, workdir=str(workdir), spec=criteo_spec(),
                       mlflow=MLflowTarget(tracking_uri=server, experiment=f"test-{name}", model_name=name),
                       **{"train": TrainConfig(hidden=(16,)), "batch_size": 200, **overrides})


def _range_args(days, workdir, server, name, *more) -> list[str]:
    return ["daily", "--spec", "criteo", "--data", str(days), "--dates", f"{DAYS[0]}..{DAYS[-1]}",
            "--workdir", str(workdir), "--mlflow-uri", server, "--model-name", name, "--hidden", "16",
            "--batch-size", "200", "--runner", "FnApiRunner", "--json", *more]


def test_a_range_among_tiny_days_trains_every_partition_and_versions_only_those_scored(
        days, mlflow_server, tmp_path, capsys):
    name, workdir = _model_name(), tmp_path / "work"
    assert main(_range_args(days, workdir, mlflow_server, name)) == 0
    captured = capsys.readouterr()
    output = json.loads(captured.out.strip().splitlines()[-1])
    by_day = {p["date"]: p for p in output["partitions"]}
    assert list(by_day) == DAYS  # every partition done, none refused
    scored = {DAYS[0], DAYS[-1]}
    for day, result in by_day.items():
        record = json.loads((workdir / "runs" / f"daily-{day}.json").read_text())
        if day in scored:
            assert result["status"] == "published" and result["not_evaluated"] is None
        else:
            assert result["status"] == NOT_EVALUATED and result["version"] is None
            assert result["not_evaluated"].startswith("not evaluated (")
            assert record["status"] == NOT_EVALUATED and record["not_evaluated"] == result["not_evaluated"]
            assert f"{day}: " in captured.err and result["not_evaluated"] in captured.err  # its progress line
    assert by_day[ONE_CLASS]["not_evaluated"].endswith("held-out rows, one class)")
    assert by_day[DAYS[5]]["samples"] == 0 and by_day[DAYS[5]]["not_evaluated"] == "not evaluated (0 held-out rows)"
    # Every row of the tiny days is trained or held out: training went on through them.
    assert sum(by_day[d]["samples"] + by_day[d]["holdout_samples"] for d in TINY) == sum(TINY.values())
    assert output["versions"] == ["1", "2"]
    # The second version covers the days no version had, and says so.
    client = MlflowClient(mlflow_server)
    first, second = (client.get_model_version(name, v) for v in ("1", "2"))
    assert first.tags[PARTITIONS] == DAYS[0] and first.tags[PARTITIONS_COVERED] == "1"
    assert second.tags[PARTITIONS] == ",".join(DAYS[1:]) and second.tags[PARTITIONS_COVERED] == str(len(DAYS) - 1)
    assert by_day[DAYS[-1]]["covers"] == DAYS[1:]
    # The last version warm-started from the tiny days' checkpoints, the first's step count grown.
    assert by_day[DAYS[-1]]["step"] > by_day[DAYS[0]]["step"]
    # A rerun trains nothing.
    assert main(_range_args(days, workdir, mlflow_server, name)) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["trained"] == 0 and again["skipped"] == len(DAYS)


def test_one_partition_at_a_time_covers_the_days_before_it_that_made_no_version(days, mlflow_server, tmp_path):
    """A daily schedule runs one partition per process: the version still says what it covers."""
    template = _config(days, tmp_path, mlflow_server)
    results = [run_daily(replace(template, date=day)) for day in (DAYS[0], DAYS[1], ONE_CLASS, DAYS[-1])]
    assert [r.status for r in results] == ["published", NOT_EVALUATED, NOT_EVALUATED, "published"]
    assert results[-1].covers == [DAYS[1], ONE_CLASS, DAYS[-1]]
    version = MlflowClient(mlflow_server).get_model_version(template.mlflow.model_name, results[-1].version)
    assert version.tags[PARTITIONS_COVERED] == "3"


def test_a_tiny_next_day_leaves_the_partition_not_evaluated(days, mlflow_server, tmp_path):
    result = run_daily(_config(days, tmp_path, mlflow_server, eval_date=DAYS[1]))
    assert result.status == NOT_EVALUATED and result.not_evaluated == "not evaluated (1 held-out row, one class)"
    assert result.samples == ROWS  # the whole day trained, and it is done
    assert run_daily(_config(days, tmp_path, mlflow_server, eval_date=DAYS[1])).skipped


def test_a_range_ending_on_tiny_days_publishes_the_last_partition_scored(days, mlflow_server, tmp_path):
    template = _config(days, tmp_path, mlflow_server)
    results = run_range(template, DAYS[:3], publish_every=3)  # DAYS[0] checkpointed, then two tiny days
    assert [r.status for r in results] == ["published", NOT_EVALUATED, NOT_EVALUATED]
    assert results[0].version == "1"


def test_a_model_that_diverges_is_still_refused(days, mlflow_server, tmp_path):
    config = _config(days, tmp_path, mlflow_server, train=TrainConfig(hidden=(16,), lr_dense=1e6, lr_sparse=1e6))
    with pytest.raises(RangeStopped) as stopped:
        run_range(config, DAYS[:2])
    assert stopped.value.partition == DAYS[0]
    result = run_daily(config)
    assert result.status == REFUSED and "train_loss is " in result.refused and "above --max-loss 3" in result.refused
