"""The embedded MLflow store: made in one step a SIGKILL cannot leave half-done, a half-made
one rebuilt when it holds nothing and refused when it holds runs, and a stream that ends
with a version pending says so in its exit status."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from publish_helpers import CheckpointMaker, request
from stream_helpers import fill_topic, json_messages, stream_command, write_spec
from test_cli import run_cli

from picasso.serving.publishing.local_store import HalfMadeStoreError, ensure_sqlite_store
from picasso.serving.publishing.contract import PUBLISHED, MLflowTarget
from picasso.serving.publishing.outbox import PublishOutbox
from picasso.connectors.testing.loopback import free_port

# Makes a store and stops for good inside MLflow's schema creation, right after the migration
# that creates `mcp_servers` created it (its alembic revision not yet recorded: the state the
# bug report's store was in), after writing a marker file so the test knows to SIGKILL it.
# "picasso": the store picasso makes for a workdir; "mlflow": MLflow's client making it in
# place on first use, as picasso let it do before.
STOP_IN_SCHEMA_CREATION = """
import pathlib, sys, time
import alembic.op

mode, workdir, marker = sys.argv[1:]
create_table = alembic.op.create_table

def create_then_stop(name, *columns, **options):
    created = create_table(name, *columns, **options)
    if name == "mcp_servers":
        pathlib.Path(marker).write_text("in schema creation")
        time.sleep(3600)
    return created

alembic.op.create_table = create_then_stop
if mode == "picasso":
    from picasso.serving.publishing.contract import MLflowTarget
    MLflowTarget.for_workdir(workdir)
else:
    from mlflow.tracking import MlflowClient
    MlflowClient(f"sqlite:///{workdir}/mlflow.db").search_experiments()
"""


def _kill_in_schema_creation(mode: str, workdir: Path) -> None:
    marker = workdir.parent / f"{workdir.name}.marker"
    process = subprocess.Popen([sys.executable, "-c", STOP_IN_SCHEMA_CREATION, mode, str(workdir), str(marker)],
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300  # a hang guard: imports and the first migrations take seconds
    while not marker.exists():
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the store's creation never reached mcp_servers"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    process.stderr.close()


def _temporaries(workdir: Path) -> list[Path]:
    return sorted(workdir.glob(".mlflow.db.tmp-*"))


def _publish_one(workdir: Path, target: MLflowTarget):
    checkpoint = CheckpointMaker(workdir / "checkpoints").next()
    return PublishOutbox(workdir / "publish").submit(request(checkpoint, 0.7), target)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_kill_while_picasso_makes_the_store_leaves_none_and_the_next_run_publishes(tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    _kill_in_schema_creation("picasso", workdir)
    # The half-made schema is in the temporary file; the store itself was never there.
    assert _temporaries(workdir) and not (workdir / "mlflow.db").exists()

    target = MLflowTarget.for_workdir(workdir)
    assert (workdir / "mlflow.db").exists() and not _temporaries(workdir)
    outcome = _publish_one(workdir, target)
    assert outcome.status == PUBLISHED and outcome.version.version == "1", outcome.error
    assert PublishOutbox(workdir / "publish").pending() == []


def test_a_store_mlflow_left_half_made_and_empty_is_rebuilt_with_a_warning(tmp_path, caplog):
    workdir = tmp_path / "work"
    workdir.mkdir()
    store = workdir / "mlflow.db"
    _kill_in_schema_creation("mlflow", workdir)
    # The failure of the bug report: MLflow cannot open the store it half made.
    reopened = subprocess.run([sys.executable, "-c", "import sys; from mlflow.tracking import MlflowClient; "
                               "MlflowClient(sys.argv[1]).search_experiments()", f"sqlite:///{store}"],
                              capture_output=True, text=True, timeout=300)
    assert reopened.returncode != 0 and "table mcp_servers already exists" in reopened.stderr

    with caplog.at_level(logging.WARNING, logger="picasso.serving.publishing.local_store"):
        target = MLflowTarget.for_workdir(workdir)
    warnings = [r.getMessage() for r in caplog.records if r.name == "picasso.serving.publishing.local_store"]
    assert len(warnings) == 1 and str(store) in warnings[0] and "rebuilding" in warnings[0]
    outcome = _publish_one(workdir, target)
    assert outcome.status == PUBLISHED and outcome.version.version == "1", outcome.error


def _store_with_a_run_at_an_older_revision(store: Path) -> str:
    """A complete store holding a run, then marked one migration behind (as an upgrade
    killed halfway leaves it); returns the run's id."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db import utils

    uri = f"sqlite:///{store}"
    ensure_sqlite_store(uri)
    run_id = MlflowClient(uri).create_run("0").info.run_id
    head = utils._get_latest_schema_revision()
    older = ScriptDirectory.from_config(utils._get_alembic_config("")).get_revision(head).down_revision
    with sqlite3.connect(store) as connection:
        connection.execute("UPDATE alembic_version SET version_num = ?", (older,))
    return run_id


def test_a_half_made_store_that_holds_runs_is_refused_naming_the_file(tmp_path):
    # A user-given sqlite URI (as in the bug report) gets the same treatment as the default store.
    store = tmp_path / "shared" / "store.db"
    store.parent.mkdir()
    run_id = _store_with_a_run_at_an_older_revision(store)
    before = _sha256(store)

    with pytest.raises(HalfMadeStoreError, match=str(store)):
        MLflowTarget.for_workdir(tmp_path / "work", f"sqlite:///{store}")
    done = run_cli("publish-pending", "--workdir", str(tmp_path / "work"), "--mlflow-uri", f"sqlite:///{store}",
                   "--json")
    assert done.returncode == 2, done.stderr[-3000:]
    error = json.loads(done.stdout.strip().splitlines()[-1])["error"]
    assert str(store) in error and "mlflow db upgrade" in error and "runs: 1" in error
    assert _sha256(store) == before  # never touched
    with sqlite3.connect(store) as connection:
        assert connection.execute("SELECT run_uuid FROM runs").fetchall() == [(run_id,)]


def test_a_stream_that_ends_with_a_version_pending_exits_3_and_counts_it(kafka_bootstrap, kafka_topic, tmp_path):
    fill_topic(kafka_bootstrap, kafka_topic, json_messages(200), partitions=1)
    workdir = tmp_path / "work"
    nothing_listens = f"http://127.0.0.1:{free_port()}"
    # One publish at the end (the interval is never due), one attempt: it fails at once.
    command = stream_command(write_spec(tmp_path), kafka_bootstrap, kafka_topic, workdir, "--until-caught-up",
                             "--batch-messages", "100", "--publish-every", "3600", "--publish-attempts", "1",
                             "--mlflow-uri", nothing_listens, "--json")
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 3, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["pending"] == len(PublishOutbox(workdir / "publish").pending()) == 1
    assert summary["versions"] == [] and summary["messages"] == 200
    assert re.search(r"pending\s+│\s+1\s", done.stderr), done.stderr[-3000:]  # the human-readable summary too

    # The scheduler's retry, with MLflow back (the embedded store this time): nothing is
    # left to train, and the pending version is published all the same.
    retry = [arg for arg in command if arg not in ("--mlflow-uri", nothing_listens)]
    done = subprocess.run(retry, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["pending"] == 0 and summary["versions"] == ["1"] and summary["messages"] == 0, done.stderr[-5000:]
    [record] = [json.loads(line) for line in (workdir / "runs" / "stream-versions.jsonl").read_text().splitlines()]
    assert record["version"] == "1"
    # Recorded by the retry, with the facts the first run queued with it (what a follower's
    # freshness is measured from): the newest event trained, the step, the samples.
    assert record["newest_event_ms"] > 0 and record["samples"] == 200 and record["step"] > 0, record
