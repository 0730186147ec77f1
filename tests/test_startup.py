"""Start-up: a command imports what it uses and nothing more. `picasso --version`, `--help`
and every command's --help load neither torch, Beam nor MLflow (seconds of start-up between
them), so the parser is built of torch-free modules, whose choices (models, optimizers, ...)
must stay the same as what they name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from picasso.models import MODELS
from picasso.pipelines.cli.command_runs import RUNS
from picasso.train_choices import MODEL_NAMES

HEAVY = ("torch", "apache_beam", "mlflow")


def imported(*argv: str) -> set[str]:
    """The top-level packages `python -m picasso.pipelines.cli ARGV` imports, as Python's
    -X importtime lists them (the real entry point: its exit handler included)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "picasso.pipelines.cli", *argv],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in done.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


@pytest.mark.parametrize("argv", [["--version"], ["--help"], *([command, "--help"] for command in sorted(RUNS))],
                         ids=" ".join)
def test_the_parser_imports_no_heavy_library(argv):
    loaded = imported(*argv)
    assert "picasso" in loaded  # the listing is read right
    assert not loaded & set(HEAVY), f"picasso {' '.join(argv)} imported {sorted(loaded & set(HEAVY))}"


def test_the_models_offered_are_those_built():
    assert MODEL_NAMES == tuple(sorted(MODELS))
