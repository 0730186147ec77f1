"""Beam's options on the pipeline commands: handed to PipelineOptions as given, while an
option neither picasso nor Beam knows (a typo of a picasso flag above all) is an error."""

from __future__ import annotations

import json

import pytest

from picasso.builtin_specs import criteo_spec
from picasso.pipelines.cli import main as cli
from picasso.pipelines.cli.daily import daily_config
from picasso.pipelines.runs import daily
from picasso.pipelines.runs.generate import generate_days
from picasso.pipelines.cli.stream import stream_config

DATE = "2026-11-01"
BEAM_OPTIONS = (
    "--direct_num_workers=2",
    "--direct_running_mode", "multi_processing",  # a value in its own token
    "--project", "p", "--region", "r", "--temp_location", "gs://b/t",
    "--flink_master", "localhost:8081",
    "--environment_type", "LOOPBACK",
    "--setup_file", "./setup.py",
    "--s3_endpoint_url", "http://127.0.0.1:9",
)
# An MLflow URI that is never contacted: building a config opens no store with it.
NO_MLFLOW = ("--mlflow-uri", "http://127.0.0.1:9")


def _daily_flags(workdir, *extra: str) -> list[str]:
    return ["daily", "--data", str(workdir / "data"), "--date", DATE, "--workdir", str(workdir), *NO_MLFLOW, *extra]


def _parse_error(argv: list[str], capsys) -> str:
    """The parser's message for argv, which it must refuse as a usage error (exit 2)."""
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_beam_options_of_every_kind_come_through_in_order(tmp_path):
    # Picasso's own flags between Beam's are taken by picasso and left out.
    argv = _daily_flags(tmp_path, *BEAM_OPTIONS[:3], "--batch-size", "64", *BEAM_OPTIONS[3:], "--runner", "DirectRunner")
    args = cli.parse_args(argv)
    assert args.beam_args == BEAM_OPTIONS
    assert args.batch_size == 64 and args.runner == "DirectRunner"  # --runner stays picasso's, not passed twice


def test_without_beam_options_there_are_none(tmp_path):
    assert cli.parse_args(_daily_flags(tmp_path)).beam_args == ()


def test_a_typo_of_a_picasso_flag_is_an_error_that_suggests_the_flag(tmp_path, capsys):
    message = _parse_error(_daily_flags(tmp_path, "--workdr", "x"), capsys)
    assert "unrecognized arguments: --workdr x" in message
    assert "did you mean --workdir?" in message


def test_an_abbreviation_of_a_picasso_flag_is_not_taken(tmp_path, capsys):
    message = _parse_error(_daily_flags(tmp_path, "--batch", "64"), capsys)
    assert "unrecognized arguments: --batch 64 (did you mean --batch-size?)" in message


def test_an_option_nobody_knows_is_an_error(tmp_path, capsys):
    assert "unrecognized arguments: --frobnicate" in _parse_error(_daily_flags(tmp_path, "--frobnicate"), capsys)


def test_a_stray_positional_is_an_error(tmp_path, capsys):
    argv = _daily_flags(tmp_path, "--direct_num_workers=2", "stray")
    assert "unrecognized arguments: stray" in _parse_error(argv, capsys)


def test_a_bad_value_of_a_beam_option_is_an_error_before_any_work(tmp_path, capsys):
    message = _parse_error(_daily_flags(tmp_path, "--direct_num_workers=many"), capsys)
    assert "--direct_num_workers: invalid int value: 'many'" in message


def test_commands_that_run_no_pipeline_still_refuse_beam_options(capsys):
    assert "unrecognized arguments: --direct_num_workers=2" in _parse_error(["plan", "--direct_num_workers=2"], capsys)


def test_help_of_the_pipeline_commands_says_where_other_options_go(capsys):
    for command in ("daily", "demo", "stream"):
        with pytest.raises(SystemExit) as exit_:
            cli.parse_args([command, "--help"])
        assert exit_.value.code == 0
        assert "handed to Beam's PipelineOptions" in " ".join(capsys.readouterr().out.split())


def test_daily_config_carries_the_beam_options(tmp_path):
    config = daily_config(cli.parse_args(_daily_flags(tmp_path, *BEAM_OPTIONS)), str(tmp_path / "data"), DATE)
    assert config.beam_args == BEAM_OPTIONS


def test_stream_config_carries_the_beam_options(tmp_path):
    argv = ["stream", "--topic", "clicks", "--workdir", str(tmp_path), "--publish-every", "0", *BEAM_OPTIONS]
    assert stream_config(cli.parse_args(argv)).beam_args == BEAM_OPTIONS


def test_daily_runs_with_a_beam_option(tmp_path, monkeypatch, capsys):
    """A real run through main(): the option reaches PipelineOptions and the day trains."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default store: WORKDIR/mlflow.db
    generate_days(criteo_spec(), tmp_path / "data", [DATE], rows=3000, rows_per_file=3000)
    flags_seen = []

    def recording_options(flags, **kwargs):
        flags_seen.append(list(flags))
        return real_options(flags, **kwargs)

    real_options = daily.PipelineOptions
    monkeypatch.setattr(daily, "PipelineOptions", recording_options)
    code = cli.main(["daily", "--data", str(tmp_path / "data"), "--date", DATE, "--workdir", str(tmp_path / "work"),
                     "--hidden", "16,8", "--device", "cpu", "--json", "--direct_num_workers=1"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["status"] == "published" and result["version"] == "1"
    assert result["samples"] + result["holdout_samples"] == 3000
    assert any("--direct_num_workers=1" in flags for flags in flags_seen)
