"""A local `mlflow server` on loopback with a SQLite store, and `mlflow models serve` or
`picasso serve` of a model, for tests and benchmarks.

It can be stopped (killed, as a crash would) and started again on the same port and
store. One worker and no job execution, so that it starts quickly.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from picasso.connectors.testing.loopback import free_port, wait_http

SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}


def _this_environment() -> dict[str, str]:
    """os.environ with this interpreter's folder first on PATH: mlflow starts uvicorn (and
    its model server's scorer) by name from PATH, and without it a run from a virtual
    environment that is not activated would score with another Python's packages."""
    return {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}


class MlflowServer:
    def __init__(self, root: Path, port: int | None = None, artifacts: str | None = None,
                 env: dict[str, str] | None = None):
        """artifacts: where the server keeps artifacts (default ROOT/artifacts; a URL such
        as s3://bucket/path, with env saying how to reach that store)."""
        self.root = Path(root)
        self.artifacts = artifacts or str(self.root / "artifacts")
        self.env = env or {}
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 90) -> str:
        log = open(self.root / "server.log", "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--workers", "1", "--host", "127.0.0.1", "--port",
             str(self.port), "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", self.artifacts],
            env={**_this_environment(), **SERVER_ENV, **self.env}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        wait_http(f"{self.uri}/health", self.process, timeout, what="mlflow server")
        return self.uri

    def stop(self) -> None:
        """Stop the server and the workers it started (its process group), at once."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, 9)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)
        self.process = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def served_model(model_uri: str, tracking_uri: str, log_path: Path, env: dict[str, str] | None = None,
                 timeout: float = 300) -> Iterator[tuple[str, subprocess.Popen]]:
    """`mlflow models serve` of a model on a free loopback port, as a deployment runs it
    (one worker, --env-manager local); yields its base URL once /ping answers, and the
    process."""
    port = free_port()
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local", "--host",
               "127.0.0.1", "--port", str(port), "--workers", "1"]
    with _serving(command, port, {"MLFLOW_TRACKING_URI": tracking_uri, **(env or {})}, log_path,
                  "mlflow models serve", timeout) as served:
        yield served


@contextlib.contextmanager
def picasso_served(model_uri: str, tracking_uri: str, log_path: Path, *args: str, env: dict[str, str] | None = None,
                   timeout: float = 300) -> Iterator[tuple[str, subprocess.Popen]]:
    """`picasso serve` of a model on a free loopback port, with extra flags `args`; yields
    its base URL once /ping answers (the first version is loaded by then), and the process."""
    port = free_port()
    command = [sys.executable, "-m", "picasso.pipelines.cli", "serve", "--model", model_uri, "--mlflow-uri",
               tracking_uri, "--host", "127.0.0.1", "--port", str(port), *args]
    with _serving(command, port, env or {}, log_path, "picasso serve", timeout) as served:
        yield served


@contextlib.contextmanager
def _serving(command: list[str], port: int, env: dict[str, str], log_path: Path, what: str,
             timeout: float) -> Iterator[tuple[str, subprocess.Popen]]:
    """A model server's process, its output in log_path, in a session of its own whose
    whole process group is killed on the way out."""
    with open(log_path, "wb") as server_log:
        server = subprocess.Popen(command, env={**_this_environment(), "MLFLOW_DISABLE_TELEMETRY": "true", **env},
                                  stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/ping", server, timeout=timeout, what=what)
        yield url, server
    finally:
        os.killpg(server.pid, 9)
        server.wait(timeout=30)
