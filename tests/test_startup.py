"""Start-up: a command imports what it uses and nothing more. `picasso --version`, `--help`
and every command's --help load neither torch, Beam nor MLflow (seconds of start-up between
them), so the parser is built of torch-free modules, whose choices (models, optimizers, ...)
must stay the same as what they name; and a daily partition that publishes nothing never
loads MLflow, nor makes its store."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from picasso.builtin_specs import criteo_spec
from picasso.models import MODELS
from picasso.pipelines.cli.command_runs import RUNS
from picasso.pipelines.runs.generate import generate_days
from picasso.train_choices import MODEL_NAMES

HEAVY = ("torch", "apache_beam", "mlflow")


def run(*argv: str) -> tuple[set[str], str]:
    """The top-level packages `python -m picasso.pipelines.cli ARGV` imports, as Python's
    -X importtime lists them (the real entry point: its exit handler included), and its stdout."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "picasso.pipelines.cli", *argv],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in done.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}, done.stdout


def imported(*argv: str) -> set[str]:
    return run(*argv)[0]


@pytest.mark.parametrize("argv", [["--version"], ["--help"], *([command, "--help"] for command in sorted(RUNS))],
                         ids=" ".join)
def test_the_parser_imports_no_heavy_library(argv):
    loaded = imported(*argv)
    assert "picasso" in loaded  # the listing is read right
    assert not loaded & set(HEAVY), f"picasso {' '.join(argv)} imported {sorted(loaded & set(HEAVY))}"


def test_the_models_offered_are_those_built():
    assert MODEL_NAMES == tuple(sorted(MODELS))


def test_a_daily_partition_that_makes_no_version_loads_no_mlflow(tmp_path):
    generate_days(criteo_spec(), tmp_path / "data", ["2026-11-01"], rows=1)  # too small to score: no version
    loaded, out = run("daily", "--spec", "criteo", "--data", str(tmp_path / "data"), "--date", "2026-11-01",
                      "--workdir", str(tmp_path / "work"), "--hidden", "8", "--json")
    assert json.loads(out.splitlines()[-1])["status"] == "not_evaluated"
    assert {"torch", "apache_beam"} <= loaded and "mlflow" not in loaded
    assert not (tmp_path / "work" / "mlflow.db").exists()  # made by the first publish, not before
