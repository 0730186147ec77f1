"""Shared fixtures: a real `mlflow server` on loopback, and small generated days."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from picasso.connectors.local_broker import free_port

pytest_plugins = ["kafka_broker"]  # the Kafka broker fixtures

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def _wait_http(url: str, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"mlflow server did not answer {url} within {timeout}s")


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> str:
    """A real `mlflow server` with a SQLite store; yields its tracking URI."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    env = {
        **os.environ,
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    log = open(root / "server.log", "wb")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "mlflow", "server", "--workers", "1",
            "--host", "127.0.0.1", "--port", str(port),
            "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination", str(root / "artifacts"),
        ],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{uri}/health", process, timeout=90)
        yield uri
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture(scope="session")
def criteo_day(tmp_path_factory) -> tuple[Path, str]:
    """One generated Criteo-shaped day in Parquet: (data root, date)."""
    from picasso.builtin_specs import criteo_spec
    from picasso.pipelines.generate import generate_days

    root = tmp_path_factory.mktemp("days")
    generate_days(criteo_spec(), root, ["2026-11-01"], rows=30_000, rows_per_file=10_000)
    return root, "2026-11-01"
