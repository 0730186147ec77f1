"""The run-health gate (pipelines/runs/run_health.py): a partition that learned nothing is
refused (not done, nothing published, its checkpoint gone, a record that says why, exit
1), a range stops at it, and what looks wrong but may be right is a warning on the
console and on the version. Daily runs publish to the session's real `mlflow server`."""

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
from picasso.checkpoint import latest_checkpoint
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.decoding.message_formats import decode_messages, encode_arrow
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.connectors.kafka_source import Messages
from picasso.connectors.partitions import partition_range
from picasso.serving.publishing.contract import MLflowTarget
from picasso.pipelines.cli.main import main
from picasso.pipelines.cli.output import STOPPED_EXIT
from picasso.pipelines.runs.backfill import RangeStopped, run_range
from picasso.pipelines.runs.daily import REFUSED, DailyConfig, run_daily
from picasso.pipelines.runs.generate import generate_days
from picasso.pipelines.runs.run_health import HEALTH_WARNINGS, HealthFacts, HealthLimits, check_health
from picasso.pipelines.transforms.row_profile import RowProfile
from picasso.spec import SparseField
from picasso.trainer import TrainConfig

DAYS = partition_range("2026-11-01..2026-11-04")
ROWS = 400
LIMITS = HealthLimits()


# -- the verdict -----------------------------------------------------------------------

def _facts(**overrides) -> HealthFacts:
    values = dict(trained=900, rows_read=1000, dead_letters=100, losses={"auc": 0.7, "logloss": 0.5},
                  profile=RowProfile(900, 200, {"C1": 5}))
    return HealthFacts(**{**values, **overrides})


def test_a_healthy_run_passes_without_a_word():
    verdict = check_health(_facts(), LIMITS, ("I1", "C1"))
    assert not verdict.refused and verdict.warnings == () and verdict.tags() == {}


def test_nothing_trained_is_refused_and_says_what_was_read():
    verdict = check_health(_facts(trained=0, dead_letters=1000, losses={"auc": math.nan}), LIMITS)
    assert verdict.refused
    assert verdict.refusals[0] == "no sample trained (1,000 rows read, 1,000 dead letters)"
    # Its NaN AUC follows from it, and is not a second reason.
    assert not any("auc" in reason for reason in verdict.refusals)


def test_the_dead_letter_share_is_refused_above_its_limit_only():
    assert not check_health(_facts(dead_letters=500), LIMITS).refused  # 0.5 is the limit, not above it
    verdict = check_health(_facts(dead_letters=501), LIMITS)
    assert verdict.reason == "50.1% of the rows read are dead letters (501 of 1,000; --max-dead-letter-share 0.5)"
    assert not check_health(_facts(dead_letters=501), HealthLimits(max_dead_letter_share=0.6)).refused


@pytest.mark.parametrize("name, value", [("auc", math.nan), ("logloss", math.inf), ("train_loss", math.nan)])
def test_a_loss_or_auc_that_is_not_finite_is_refused(name, value):
    verdict = check_health(_facts(losses={"auc": 0.7, "logloss": 0.5, name: value}), LIMITS)
    assert verdict.refusals == (f"{name} is not finite ({value})",)


def test_an_absent_field_and_a_constant_label_are_warnings():
    profile = RowProfile(rows=1000, positives=0, absent={"C1": 1000, "C2": 990, "I1": 991})
    verdict = check_health(_facts(profile=profile), LIMITS, ("I1", "C1", "C2"))
    assert not verdict.refused
    assert verdict.warnings == (
        "field 'I1' is absent in 99.1% of the rows (--max-missing-share 0.99)",
        "field 'C1' is absent in 100.0% of the rows (--max-missing-share 0.99)",
        "the label is constant (no clicks in 1,000 rows)",
    )
    assert verdict.tags() == {HEALTH_WARNINGS: "; ".join(verdict.warnings)}


@pytest.mark.parametrize("limits", [dict(max_dead_letter_share=1.5), dict(max_missing_share=-0.1)])
def test_limits_outside_zero_to_one_are_a_clear_error(limits):
    with pytest.raises(ValueError, match="must be in \\[0, 1\\]"):
        HealthLimits(**limits)


def test_a_stream_window_adds_up_its_cycles():
    one = HealthFacts(10, 20, 10, {"auc": math.nan}, RowProfile(10, 0, {"C1": 10}))
    two = HealthFacts(30, 40, 10, {"auc": 0.7}, RowProfile(30, 5, {"C1": 1, "C2": 2}))
    both = one.merge(two)
    assert (both.trained, both.rows_read, both.dead_letters, both.losses) == (40, 60, 20, {"auc": 0.7})
    assert both.profile == RowProfile(40, 5, {"C1": 11, "C2": 2})
    assert RowProfile.of_counters(both.profile.counters()) == both.profile


# -- the decode counts what is absent ----------------------------------------------------

def _spec_with(*sparse: str):
    spec = criteo_spec()
    return replace(spec, sparse=tuple(SparseField(name, embedding_dim=4, hash_buckets=100) for name in sparse))


def test_the_decoder_counts_absent_fields_among_the_valid_rows_only():
    spec = _spec_with("C1", "c1_typo")
    table = pa.table({"label": [0.0, 1.0, 2.0, 1.0], "C1": ["a", None, "b", "c"], "I1": [1, None, None, 3]})
    result = RecordDecoder(spec, DecodeOptions()).decode_table(table, "day")
    # Row 2 is refused (label out of range): it counts in no field's absence.
    assert result.table.num_rows == 3
    assert result.absent["C1"] == 1 and result.absent["c1_typo"] == 3 and result.absent["I1"] == 1
    assert result.absent["I2"] == 3  # a dense field with no column at all
    assert RowProfile.of_table(result.table, result.absent).positives == 2


@pytest.mark.parametrize("fmt", ["json", "arrow"])
def test_a_poll_counts_absent_fields_in_either_format(fmt):
    spec = _spec_with("C1", "c1_typo")
    rows = [{"label": 1.0, "C1": "a", "I1": 2}, {"label": 0.0, "I1": 1}, {"label": 0.0, "C1": "b"}]
    if fmt == "json":
        values = [json.dumps(row).encode() for row in rows]
    else:
        values = encode_arrow(pa.Table.from_pylist(rows), rows_per_message=2)
    messages = Messages("events", 0, 0, len(values), list(range(len(values))), values, [None] * len(values),
                        [0] * len(values))
    decoded = decode_messages(RecordDecoder(spec, DecodeOptions()), fmt, messages)
    assert decoded.table.num_rows == 3
    assert decoded.absent["C1"] == 1 and decoded.absent["c1_typo"] == 3 and decoded.absent["I1"] == 1


# -- daily runs and ranges ---------------------------------------------------------------

@pytest.fixture(scope="module")
def days(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("health-days")
    generate_days(criteo_spec(), root, DAYS, rows=ROWS)
    return root


def _config(root, workdir, server, date=DAYS[0], spec=None, **overrides) -> DailyConfig:
    name = f"health-{uuid.uuid4().hex[:8]}"
    return DailyConfig(data_root=str(root), date=date, workdir=str(workdir), spec=spec or criteo_spec(),
                       mlflow=MLflowTarget(tracking_uri=server, experiment=f"test-{name}", model_name=name),
                       train=TrainConfig(hidden=(16,)), batch_size=200, **overrides)


def _versions(config: DailyConfig) -> list:
    return MlflowClient(config.mlflow.tracking_uri).search_model_versions(f"name='{config.mlflow.model_name}'")


def _rewrite_labels(root: Path, date: str, labels) -> None:
    """Every file of the partition with its labels replaced by labels(n) (n: the file's rows)."""
    for path in sorted((root / f"date={date}").glob("*.parquet")):
        table = pq.read_table(path)
        column = pa.array(labels(table.num_rows))
        pq.write_table(table.set_column(table.schema.get_field_index("label"), "label", column), path)


def test_a_wrong_label_is_refused_not_done_not_published_and_its_checkpoint_is_gone(days, mlflow_server, tmp_path):
    spec = replace(criteo_spec(), label="clicked")  # the data's label is `label`: every row is a dead letter
    config = _config(days, tmp_path, mlflow_server, spec=spec)
    result = run_daily(config)
    assert result.status == REFUSED and result.version is None
    assert result.refused == f"no sample trained ({ROWS:,} rows read, {ROWS:,} dead letters)"
    assert _versions(config) == []
    record = json.loads(Path(config.record_path).read_text())
    assert record["status"] == REFUSED and record["refused"] == result.refused
    assert latest_checkpoint(config.folders.checkpoints) is None  # no later run warm-starts from it
    # Not done: the same run tries again (and is refused again), where a done date would be skipped.
    again = run_daily(config)
    assert not again.skipped and again.status == REFUSED


def test_the_command_exits_1_with_the_reason_in_one_line(days, mlflow_server, tmp_path, capsys):
    spec_path = tmp_path / "wrong_label.yaml"
    spec_path.write_text(replace(criteo_spec(), label="clicked").to_yaml())
    status = main(["daily", "--spec", str(spec_path), "--data", str(days), "--date", DAYS[0],
                   "--workdir", str(tmp_path / "work"), "--mlflow-uri", mlflow_server,
                   "--model-name", f"cli-{uuid.uuid4().hex[:8]}", "--hidden", "16", "--batch-size", "200",
                   "--runner", "FnApiRunner", "--json"])
    assert status == STOPPED_EXIT
    err = capsys.readouterr().err
    stopped = [line for line in err.splitlines() if "stopped:" in line]
    assert len(stopped) == 1
    assert f"{DAYS[0]} refused: no sample trained ({ROWS:,} rows read, {ROWS:,} dead letters)" in stopped[0]


def test_a_misspelled_field_trains_with_a_warning_on_the_console_and_the_version(days, mlflow_server, tmp_path):
    spec = criteo_spec()
    spec = replace(spec, sparse=(*spec.sparse[:-1], replace(spec.sparse[-1], name="c26_typo")))
    config = _config(days, tmp_path, mlflow_server, spec=spec)
    result = run_daily(config)
    assert result.status == "published"
    assert result.warnings == ["field 'c26_typo' is absent in 100.0% of the rows (--max-missing-share 0.99)"]
    [version] = _versions(config)
    assert version.tags[HEALTH_WARNINGS] == result.warnings[0]
    # With a share of 1, nothing is too absent.
    config = _config(days, tmp_path / "lenient", mlflow_server, spec=spec, health=HealthLimits(max_missing_share=1))
    assert run_daily(config).warnings == []


def test_a_dead_letter_share_above_the_limit_is_refused_and_a_higher_limit_lets_it_through(tmp_path, mlflow_server):
    root = tmp_path / "data"
    generate_days(criteo_spec(), root, DAYS[:1], rows=ROWS)
    rng = np.random.default_rng(0)
    # 60% of the rows with a label out of [0, 1] (dead letters), the rest clicks and not.
    _rewrite_labels(root, DAYS[0], lambda n: np.where(np.arange(n) % 5 < 3, 2.0, rng.integers(0, 2, n)).astype(float))
    config = _config(root, tmp_path / "strict", mlflow_server)
    result = run_daily(config)
    assert result.status == REFUSED and result.dead_letters > ROWS / 2
    assert result.refused.startswith(f"{result.dead_letters / ROWS:.1%} of the rows read are dead letters")
    assert _versions(config) == []
    config = _config(root, tmp_path / "lenient", mlflow_server, health=HealthLimits(max_dead_letter_share=0.7))
    assert run_daily(config).status == "published"


def test_a_constant_label_warns_and_a_holdout_of_one_class_is_not_evaluated(tmp_path, mlflow_server):
    root = tmp_path / "data"
    generate_days(criteo_spec(), root, DAYS[:2], rows=ROWS)
    _rewrite_labels(root, DAYS[0], lambda n: np.zeros(n))
    # Scored on its own holdout slice, which has no click: no AUC, so no version, but the
    # day is not broken: it trains and is done (tests/test_tiny_partitions.py).
    config = _config(root, tmp_path / "holdout", mlflow_server)
    held = run_daily(config)
    assert held.status == "not_evaluated" and held.refused is None and held.version is None
    assert held.not_evaluated == f"not evaluated ({held.holdout_samples:,} held-out rows, one class)"
    assert held.warnings == [f"the label is constant (no clicks in {ROWS:,} rows)"]
    assert _versions(config) == [] and run_daily(config).skipped
    # Scored on the next day, with clicks: published, with the warning on the version.
    config = _config(root, tmp_path / "next-day", mlflow_server, eval_date=DAYS[1])
    result = run_daily(config)
    assert result.status == "published" and result.warnings == held.warnings
    [version] = _versions(config)
    assert version.tags[HEALTH_WARNINGS] == held.warnings[0]


def test_a_range_stops_at_the_refused_partition_and_resumes_there(tmp_path, mlflow_server):
    root = tmp_path / "data"
    generate_days(criteo_spec(), root, DAYS, rows=ROWS)
    good = {path: path.read_bytes() for path in (root / f"date={DAYS[2]}").glob("*.parquet")}
    _rewrite_labels(root, DAYS[2], lambda n: np.full(n, 7.0))  # every row a dead letter
    template = _config(root, tmp_path / "work", mlflow_server)
    with pytest.raises(RangeStopped) as stopped:
        run_range(template, DAYS, publish_every=2)
    assert stopped.value.partition == DAYS[2]
    assert f"partition {DAYS[2]} was refused: no sample trained" in str(stopped.value)
    assert [r.date for r in stopped.value.results] == DAYS[:2]
    assert [r.version for r in stopped.value.results] == [None, "1"]
    assert not Path(replace(template, date=DAYS[3]).record_path).exists()  # nothing after it ran
    # The data mended, the same range resumes at the refused partition.
    for path, data in good.items():
        path.write_bytes(data)
    results = run_range(template, DAYS, publish_every=2)
    assert [r.skipped for r in results] == [True, True, False, False]
    assert [r.version for r in results] == [None, "1", None, "2"]


def test_a_skipped_partition_does_not_count_toward_publish_every(days, mlflow_server, tmp_path):
    partitions = partition_range("2026-10-31..2026-11-03")  # 10-31 has no files
    results = run_range(_config(days, tmp_path, mlflow_server), partitions, publish_every=2, missing="skip")
    assert [r.date for r in results] == DAYS[:3]
    assert [r.version for r in results] == [None, "1", "2"]  # the 2nd and the last present partitions
