"""A range run as a scheduler runs it, stderr redirected to a file: one plain progress line
per partition while it runs, and no line of Beam's or MLflow's warnings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

from picasso.builtin_specs import criteo_spec
from picasso.connectors.partitions import partition_range
from picasso.pipelines.runs.generate import generate_days

DAYS = partition_range("2026-11-01..2026-11-30")
NOISE = re.compile(r"WARNING:|Warning|apache_beam|mlflow\.|No shards found|apitools|\x1b\[")


def test_a_30_partition_range_writes_30_progress_lines_and_no_warnings(tmp_path, mlflow_server):
    generate_days(criteo_spec(), tmp_path / "data", DAYS, rows=120)
    log = tmp_path / "stderr.log"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    with open(log, "wb") as err:
        done = subprocess.run(
            [sys.executable, "-m", "picasso.pipelines.cli", "daily", "--data", str(tmp_path / "data"),
             "--dates", f"{DAYS[0]}..{DAYS[-1]}", "--workdir", str(tmp_path / "work"), "--mlflow-uri", mlflow_server,
             "--model-name", f"progress-{uuid.uuid4().hex[:8]}", "--hidden", "8", "--batch-size", "120",
             "--publish-every", "10", "--runner", "FnApiRunner"],
            stdout=subprocess.DEVNULL, stderr=err, env=env, timeout=1800)
    text = log.read_text()
    assert done.returncode == 0, text[-3000:]
    progress = [line for line in text.splitlines() if line.startswith("[")]
    assert [line.split("]")[0] for line in progress] == [f"[{n}/30" for n in range(1, 31)]
    for n, (line, day) in enumerate(zip(progress, DAYS), start=1):
        assert f"] {day}: " in line and "AUC " in line
        assert ("version" in line) == (n % 10 == 0), line  # published every 10
    assert not [line for line in text.splitlines() if NOISE.search(line)], text
