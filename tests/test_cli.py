"""The `picasso` command line, run as users run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlflow
import pandas as pd
import pyarrow.parquet as pq
import yaml
from mlflow.projects._project_spec import load_project


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "picasso.pipelines.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def test_demo_runs_end_to_end_and_its_model_loads(tmp_path):
    done = run_cli("demo", "--workdir", str(tmp_path / "work"), "--rows", "40000", "--hidden", "64,32", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("model_uri", "version", "auc", "auc_ceiling", "logloss", "samples"):
        assert key in result
    assert result["version"] == "1"
    assert result["auc_ceiling"] >= 0.80
    assert 0.6 < result["auc"] < result["auc_ceiling"]
    assert result["samples"] + result["holdout_samples"] == 40_000
    mlflow.set_tracking_uri(result["tracking_uri"])
    model = mlflow.pyfunc.load_model(result["model_uri"])
    rows = pq.read_table(next((tmp_path / "work" / "data").glob("date=*/part-*.parquet"))).slice(0, 10)
    predictions = model.predict(rows.to_pandas().drop(columns=["label"]))
    assert ((predictions > 0) & (predictions < 1)).all()
    # Rows with ids never seen, and with most fields missing, still score.
    assert ((model.predict(pd.DataFrame({"C1": ["unseen-id"], "I1": [2]})) > 0)).all()


def test_generate_writes_each_format_with_its_ceiling(tmp_path):
    for fmt in ("jsonl", "tsv"):
        done = run_cli("generate", "--out", str(tmp_path / fmt), "--rows", "3000", "--rows-per-file", "1000",
                       "--format", fmt, "--spec", "criteo:30", "--json")
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        assert summary["days"][0]["rows"] == 3000 and summary["days"][0]["files"] == 3
        parts = sorted((tmp_path / fmt / "date=2026-11-01").glob(f"part-*.{fmt}"))
        assert len(parts) == 3
        assert sum(len(p.read_bytes().splitlines()) for p in parts) == 3000


def test_bad_spec_fails_at_start_naming_the_field(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"label": "y", "sparse": [{"name": "ad", "hash_buckets": 0, "embedding_dim": 8}]}))
    done = run_cli("generate", "--out", str(tmp_path / "data"), "--spec", str(spec), "--json")
    assert done.returncode == 2
    assert "sparse field 'ad': hash_buckets must be a positive integer" in done.stderr
    assert "error" in json.loads(done.stdout.strip().splitlines()[-1])


def test_mlflow_project_has_daily_and_stream_entry_points():
    project_dir = Path(__file__).resolve().parents[1] / "mlflow"
    assert not (project_dir / "__init__.py").exists()
    project = load_project(str(project_dir))
    assert {"daily", "stream"} <= set(project._entry_points)
    command = project.get_entry_point("daily").compute_command(
        {"data": "/d", "date": "2026-11-01"}, storage_dir=None
    )
    assert command.startswith("picasso daily") and "--date 2026-11-01" in command


def test_plan_prints_groups_rows_and_bytes(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "label": "y",
        "dense": ["d"],
        "sparse": [
            {"name": "a", "hash_buckets": 100, "embedding_dim": 8},
            {"name": "b", "vocab_size": 50, "embedding_dim": 8},
            {"name": "c", "hash_buckets": 30, "embedding_dim": 8, "optimizer": "adam"},
            {"name": "e", "hash_buckets": 10, "embedding_dim": 4, "group": "small"},
        ],
    }))
    done = run_cli("plan", "--spec", str(spec), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads(done.stdout.strip().splitlines()[-1])
    groups = {g["name"]: g for g in plan["groups"]}
    assert set(groups) == {"dim8", "dim8_adam", "small"}
    assert groups["dim8"]["fields"] == ["a", "b"] and groups["dim8"]["rows"] == 150
    assert groups["dim8"]["table_bytes"] == 150 * 8 * 4 and groups["dim8"]["slot_bytes"] == 150 * 4  # row-wise adagrad
    assert groups["dim8_adam"]["slot_bytes"] == 30 * 8 * 4 * 2  # two moments per value
    assert plan["total_bytes"] == sum(g["table_bytes"] + g["slot_bytes"] for g in plan["groups"])
    assert "dim8_adam" in done.stdout  # the table is printed too


def test_parameter_server_commands_are_picasso_commands(tmp_path):
    done = run_cli("ps", "--spec", str(tmp_path / "missing.yaml"), "--workdir", str(tmp_path), "--port", "1",
                   "--workers", "1")
    assert done.returncode != 0
    assert "missing.yaml': no such file" in done.stderr
    assert "gba-worker" in run_cli("--help").stdout
