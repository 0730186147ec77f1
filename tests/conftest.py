"""Shared fixtures: a real `mlflow server` on loopback, and small generated days."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from picasso.serving.publishing.mlflow_env import kept_fluent_uris
from picasso.connectors.testing.mlflow_server import MlflowServer

pytest_plugins = ["kafka_broker"]  # the Kafka broker fixtures

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

# The slowest files (pytest's --durations: C++ builds, processes killed and restarted), run
# first: with two workers (README: -n 2 --dist loadfile) the files left at the end are then
# short, so the two finish together rather than one working alone through a long file.
SLOWEST_FIRST = ("test_kernel_build.py", "test_packaging.py", "test_stream_exactly_once.py", "test_endless.py",
                 "test_benchmarks_smoke.py", "test_object_storage.py", "test_progress_lines.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests stay together


@pytest.fixture(autouse=True)
def _mlflow_uris_stay_with_their_test():
    """A test that points MLflow's fluent API at a store (mlflow.set_tracking_uri) also sets
    MLFLOW_TRACKING_URI for the process: without this, every later test's `picasso`
    subprocess would publish there instead of to the store it names or defaults to."""
    with kept_fluent_uris():
        yield


@pytest.fixture(autouse=True, scope="module")
def _mlflow_uris_stay_with_their_module():
    """The same around a module, for its module-scoped fixtures (test_serving's points
    MLflow at the server): set up before them, it puts the URIs back after their teardown.
    Without it, a later module in the same worker published to that server: a stream's
    retry that should have made version 1 of its own store made version 2 there."""
    with kept_fluent_uris():
        yield


@contextmanager
def _kept_sys_path():
    saved = list(sys.path)
    try:
        yield
    finally:
        sys.path[:] = saved


@pytest.fixture(autouse=True)
def _sys_path_stays_with_its_test():
    """mlflow.pyfunc.load_model puts the model's code folder first on sys.path, for good.
    In this process picasso is imported already, so that changes nothing here; but a child
    a later test spawns (torch.multiprocessing's spawn, which hands its children this
    sys.path) would import `picasso` from that folder, which holds only the modules the
    served model needs, and fail on any other."""
    with _kept_sys_path():
        yield


@pytest.fixture(autouse=True, scope="module")
def _sys_path_stays_with_its_module():
    """The same around a module's module-scoped fixtures (test_serving's loads models)."""
    with _kept_sys_path():
        yield


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> str:
    """A real `mlflow server` with a SQLite store; yields its tracking URI."""
    with MlflowServer(tmp_path_factory.mktemp("mlflow-server")) as uri:
        yield uri


@pytest.fixture(scope="session")
def criteo_day(tmp_path_factory) -> tuple[Path, str]:
    """One generated Criteo-shaped day in Parquet: (data root, date)."""
    from picasso.builtin_specs import criteo_spec
    from picasso.pipelines.runs.generate import generate_days

    root = tmp_path_factory.mktemp("days")
    generate_days(criteo_spec(), root, ["2026-11-01"], rows=30_000, rows_per_file=10_000)
    return root, "2026-11-01"
