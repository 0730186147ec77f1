"""The daily pipeline on FnApiRunner, publishing to a real `mlflow server`."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path

import mlflow
import numpy as np
import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient

from picasso.builtin_specs import criteo_spec
from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.dead_letters.letters import DeadLetter
from picasso.connectors.day_files import partition_dir
from picasso.serving.publishing.contract import MLflowTarget
from picasso.pipelines.runs.daily import DailyConfig, run_daily
from picasso.pipelines.runs.generate import generate_days
from picasso.trainer import TrainConfig


def _config(data_root, date, workdir, server, model_name, **overrides) -> DailyConfig:
    return DailyConfig(
        data_root=str(data_root),
        date=date,
        workdir=str(workdir),
        spec=criteo_spec(),
        mlflow=MLflowTarget(tracking_uri=server, experiment=f"test-{model_name}", model_name=model_name),
        train=TrainConfig(hidden=(64, 32)),
        runner="FnApiRunner",
        **overrides,
    )


@pytest.fixture(scope="module")
def first_run(criteo_day, mlflow_server, tmp_path_factory):
    root, date = criteo_day
    workdir = tmp_path_factory.mktemp("daily")
    model_name = f"ctr-{uuid.uuid4().hex[:8]}"
    result = run_daily(_config(root, date, workdir, mlflow_server, model_name))
    return result, workdir, model_name


def test_daily_run_trains_evaluates_and_registers_a_version(first_run, criteo_day, mlflow_server):
    result, workdir, model_name = first_run
    root, date = criteo_day
    assert result.version == "1" and result.status == "published" and not result.skipped
    assert result.champion and result.promotion_reason == "no champion yet"  # the first version
    assert result.model_uri == f"models:/{model_name}/1"
    assert result.rows_in == 30_000 and result.dead_letters == 0
    assert result.samples + result.holdout_samples == 30_000
    assert 0.05 < result.holdout_samples / 30_000 < 0.15
    assert result.auc > 0.62, result  # 27k rows: well above chance, short of the ceiling
    assert result.auc_ceiling > result.auc
    checkpoint = load_checkpoint(latest_checkpoint(workdir / "checkpoints"))
    assert result.checkpoint == str(checkpoint.path)
    assert checkpoint.state["samples"] == result.samples
    # Every file was read to its end, and the positions say so.
    assert sorted(checkpoint.positions.values()) == [10_000, 10_000, 10_000]

    client = MlflowClient(mlflow_server)
    version = client.get_model_version(model_name, "1")
    assert version.tags["picasso.checkpoint_id"] == checkpoint.checkpoint_id
    assert json.loads(version.tags["picasso.positions"]) == checkpoint.positions
    run = client.get_run(version.run_id)
    assert run.data.metrics["auc"] == pytest.approx(result.auc)
    assert run.data.metrics["samples"] == result.samples


def test_published_model_serves_raw_rows_including_unseen_ids(first_run, criteo_day, mlflow_server):
    result, _, _ = first_run
    root, date = criteo_day
    mlflow.set_tracking_uri(mlflow_server)
    model = mlflow.pyfunc.load_model(result.model_uri)
    frame = pq.read_table(next(Path(partition_dir(root, date)).glob("part-*.parquet"))).slice(0, 50).to_pandas()
    frame = frame.drop(columns=["label"])
    seen = model.predict(frame)
    assert seen.shape == (50,) and np.all((seen > 0) & (seen < 1))
    unseen = frame.copy()
    unseen["C1"] = [f"never-seen-{i}" for i in range(50)]
    unseen["C2"] = None  # a missing optional field
    unseen = unseen.drop(columns=["I5"])
    predictions = model.predict(unseen)
    assert np.all((predictions > 0) & (predictions < 1))
    assert not np.allclose(predictions, seen)  # the features matter


def test_second_day_warm_starts_from_the_checkpoint(first_run, mlflow_server, tmp_path):
    result, workdir, model_name = first_run
    generate_days(criteo_spec(), tmp_path, ["2026-11-02"], rows=8_000, rows_per_file=8_000)
    second = run_daily(_config(tmp_path, "2026-11-02", workdir, mlflow_server, model_name))
    assert second.version == "2" and second.delta_base == "1" and 0 < second.delta_bytes < second.full_bytes
    checkpoint = load_checkpoint(second.checkpoint)
    assert checkpoint.step == result.step + 4  # 8,000 rows in chunks of 2,048
    assert checkpoint.state["samples"] == result.samples + second.samples
    # Positions of both days are in the new checkpoint.
    assert len(checkpoint.positions) == 4


def test_a_warm_start_onto_other_mlp_sizes_is_refused_by_flag(first_run, mlflow_server, tmp_path):
    _, workdir, model_name = first_run
    generate_days(criteo_spec(), tmp_path, ["2026-11-03"], rows=500, rows_per_file=500)
    config = replace(_config(tmp_path, "2026-11-03", workdir, mlflow_server, model_name), train=TrainConfig(hidden=(32,)))
    with pytest.raises(ValueError, match=r"--hidden 64,32 \(this run: 32\)"):
        run_daily(config)


def test_bad_rows_go_to_dead_letters_and_the_run_goes_on(mlflow_server, tmp_path):
    spec = criteo_spec()
    root = tmp_path / "data"
    generate_days(spec, root, ["2026-11-03"], rows=6_000, rows_per_file=6_000, fmt="jsonl")
    part = Path(partition_dir(root, "2026-11-03")) / "part-00000.jsonl"
    lines = part.read_text().splitlines()
    bad = {
        10: "{not json",
        20: json.dumps({**json.loads(lines[20]), "label": None}),
        30: json.dumps({**json.loads(lines[30]), "I3": "many"}),
        40: json.dumps({**json.loads(lines[40]), "C4": 4.5}),
        50: "",  # a blank line is no record, and is not dropped silently either
    }
    for i, line in bad.items():
        lines[i] = line
    part.write_text("\n".join(lines) + "\n")
    result = run_daily(_config(root, "2026-11-03", tmp_path / "work", mlflow_server, f"ctr-{uuid.uuid4().hex[:8]}"))
    assert result.dead_letters == 5
    assert result.samples + result.holdout_samples == 6_000 - 5
    letters = [
        DeadLetter.from_json(line)
        for path in (tmp_path / "work" / "dead_letters" / "date=2026-11-03").glob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    by_position = {letter.position: letter for letter in letters}
    assert sorted(by_position) == [10, 20, 30, 40, 50]
    assert by_position[50].reason == "blank line (no JSON object)"
    assert by_position[10].reason.startswith("invalid JSON")
    assert by_position[20].reason == "missing label 'label'"
    assert "'I3'" in by_position[30].reason
    assert "'C4'" in by_position[40].reason
    assert by_position[30].payload == bad[30]
    assert all(letter.source == str(part) for letter in letters)
    assert result.version == "1"


def test_missing_partition_is_a_clear_error(tmp_path, mlflow_server):
    with pytest.raises(FileNotFoundError, match="no partition for 2026-01-01"):
        run_daily(_config(tmp_path, "2026-01-01", tmp_path / "work", mlflow_server, "unused"))


def test_a_done_date_does_nothing_again(first_run, criteo_day, mlflow_server):
    result, workdir, model_name = first_run
    root, date = criteo_day
    checkpoints = sorted((workdir / "checkpoints").iterdir())
    again = run_daily(_config(root, date, workdir, mlflow_server, model_name))
    assert again.skipped and again.version == result.version and again.checkpoint == result.checkpoint
    assert sorted((workdir / "checkpoints").iterdir()) == checkpoints  # nothing trained


def test_next_day_evaluation_force_and_warm_start_from_the_champion(mlflow_server, tmp_path):
    from picasso.serving.publishing.champion import champion_checkpoint
    from picasso.serving.publishing.policy import PublishPolicy

    days = ["2026-11-10", "2026-11-11"]
    generate_days(criteo_spec(), tmp_path / "data", days, rows=6_000, rows_per_file=6_000)
    model_name = f"ctr-{uuid.uuid4().hex[:8]}"
    work = tmp_path / "work"

    def daily(date, **overrides):
        return run_daily(_config(tmp_path / "data", date, work, mlflow_server, model_name, **overrides))

    first = daily(days[0], eval_date=days[1])
    assert first.evaluation == f"day={days[1]}"
    assert first.samples == 6_000 and first.holdout_samples == 6_000  # all of day 1 trained, all of day 2 scored
    assert first.version == "1" and first.champion
    client = MlflowClient(mlflow_server)
    assert client.get_model_version(model_name, "1").tags["picasso.evaluation"] == f"day={days[1]}"

    forced = daily(days[0], eval_date=days[1], force=True, policy=PublishPolicy(auto_promote=False))
    assert not forced.skipped and forced.version == "2" and not forced.champion
    assert forced.step == first.step + 3 and forced.warm_start_from == first.checkpoint  # latest: version 1's

    from_champion = daily(days[1], warm_start="champion")
    assert from_champion.warm_start_from == first.checkpoint  # the champion (1), not the latest (2)
    assert from_champion.step == first.step + 3
    # A champion whose checkpoint is not on this machine is an error, not a silent substitute.
    client.set_registered_model_alias(model_name, "champion", "3")
    Path(from_champion.checkpoint).rename(tmp_path / "moved")
    with pytest.raises(FileNotFoundError, match="not on this machine"):
        champion_checkpoint(MLflowTarget(mlflow_server, model_name=model_name))


def test_bad_daily_configuration_is_a_clear_error(tmp_path, mlflow_server):
    with pytest.raises(ValueError, match="warm start must be one of"):
        _config(tmp_path, "2026-11-01", tmp_path, mlflow_server, "unused", warm_start="best")
    with pytest.raises(ValueError, match="evaluation day must differ"):
        _config(tmp_path, "2026-11-01", tmp_path, mlflow_server, "unused", eval_date="2026-11-01")


def test_a_corrupt_parquet_file_is_one_dead_letter_and_the_rest_of_the_day_trains(mlflow_server, tmp_path):
    spec = criteo_spec()
    root = tmp_path / "data"
    generate_days(spec, root, ["2026-11-04"], rows=6_000, rows_per_file=2_000)
    parts = sorted(Path(partition_dir(root, "2026-11-04")).glob("part-*.parquet"))
    corrupt = parts[1]
    corrupt.write_bytes(corrupt.read_bytes()[: corrupt.stat().st_size // 2])  # its footer is gone
    result = run_daily(_config(root, "2026-11-04", tmp_path / "work", mlflow_server, f"ctr-{uuid.uuid4().hex[:8]}"))
    assert result.dead_letters == 1
    assert result.samples + result.holdout_samples == 4_000
    [letter] = [DeadLetter.from_json(line)
                for path in (tmp_path / "work" / "dead_letters" / "date=2026-11-04").glob("*.jsonl")
                for line in path.read_text().splitlines()]
    assert letter.source == str(corrupt) and letter.position == 0
    assert letter.reason.startswith(f"unreadable parquet file {corrupt} from row 0:"), letter.reason
    assert result.version == "1"
