"""MLflow's process-wide state, in one place: what a publish sets for its own calls and
puts back after, so that it never redirects or reconfigures its caller's later MLflow calls.

- http_settings: MLflow reads its HTTP timeout and retries from the environment, per request.
- fluent_uris, kept_fluent_uris: log_model goes through the fluent API, which reads process-wide tracking and
  registry URIs, and set_tracking_uri/set_registry_uri also export them to the
  environment (so to child processes).
- active_run: the fluent API's active run, which log_model logs to.
- project_run_id, tracking_uri: what a publish reads of that state.
- create_sqlite_schema: the whole schema of a new SQLite store, the way MLflow's client
  makes it, for serving/publishing/local_store.py to build the embedded store in one step.
- python_model_of, pyfunc_with: the PythonModel inside a loaded pyfunc, and a pyfunc like
  it around another PythonModel and MLmodel, for serving/versions.py to swap in a version
  built in memory (the served one plus a delta) without MLflow's loader reading files.

MLflow's private globals are used here and nowhere else in picasso, for one reason: the
public getters cannot say "unset". mlflow.get_tracking_uri() answers the default store
when none was set, so putting its answer back would pin that default for the rest of the
process (and export it to MLFLOW_TRACKING_URI); only the module globals behind
set_tracking_uri/set_registry_uri hold None for "unset". Likewise MlflowClient has no
public attribute naming its tracking URI, and MLflow has no public call that creates a
store's schema, nor one that forgets the engine it caches per URI (a store built under a
temporary name must not keep it open after the rename), nor one that builds a pyfunc
around a PythonModel already in memory (PyFuncModel's constructor is public, but the
wrapper MLflow's loader puts a PythonModel in, which adapts predict's arguments, is
private). Checked against MLflow 3.17.2
(mlflow/tracking/_tracking_service/utils.py `_tracking_uri` and `_get_sqlalchemy_store`,
mlflow/tracking/_model_registry/utils.py `_registry_uri`, MlflowClient._tracking_client,
SqlAlchemyStore._engine_map, PyFuncModel._model_impl and mlflow/pyfunc/model.py
_PythonModelPyfuncWrapper's python_model and signature);
setup.py asks for mlflow>=3.0, so check these names again when MLflow moves.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Iterable
from contextlib import contextmanager

import mlflow
from mlflow.models import Model
from mlflow.pyfunc import FLAVOR_NAME, PyFuncModel
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.tracking import MlflowClient
from mlflow.tracking._model_registry import utils as registry_utils
from mlflow.tracking._tracking_service import utils as tracking_utils

from picasso.serving.publishing.policy import PublishPolicy

_URI_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


@contextmanager
def restored_environment(keys: Iterable[str]):
    """The environment variables `keys` as they were before, whatever the block sets."""
    saved = {key: os.environ.get(key) for key in keys}
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def http_settings(policy: PublishPolicy):
    """MLflow reads its HTTP timeout and retries from the environment, per request."""
    wanted = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(int(math.ceil(policy.http_timeout_s))),
              "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(policy.http_retries)}
    with restored_environment(wanted):
        os.environ.update(wanted)
        yield


@contextmanager
def kept_fluent_uris():
    """The fluent API's tracking and registry URIs, and the variables that export them, as
    they were before the block, whatever it sets (None included: see the module docstring)."""
    with restored_environment(_URI_VARIABLES):
        saved = tracking_utils._tracking_uri, registry_utils._registry_uri
        try:
            yield
        finally:
            tracking_utils._tracking_uri, registry_utils._registry_uri = saved


@contextmanager
def fluent_uris(uri: str):
    """Point the fluent API's tracking and registry URIs at uri for one publish, then put
    back what was there."""
    with kept_fluent_uris():
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        yield


@contextmanager
def active_run(run_id: str):
    """Make run_id the fluent API's active run (log_model logs there) without leaving it
    active if anything fails; the run is ended here."""
    mlflow.start_run(run_id=run_id)
    try:
        yield
    except BaseException:
        try:
            mlflow.end_run("FAILED")  # pops the run before calling the server
        except Exception:  # noqa: BLE001 - the server may be the reason we are here
            pass
        raise
    mlflow.end_run()


def project_run_id() -> str | None:
    """The run of the MLflow Project this process runs in (`mlflow run` sets it), if any."""
    return os.environ.get("MLFLOW_RUN_ID")


def tracking_uri(client: MlflowClient) -> str:
    """The tracking URI the client talks to (see the module docstring)."""
    return client._tracking_client.tracking_uri


def create_sqlite_schema(uri: str, artifact_root: str | None) -> None:
    """Create the store at a sqlite URI as MLflow's client would (tables, migrations, the
    Default experiment; None: the artifact root the client would give it), and close and
    forget its engine."""
    store = tracking_utils._get_sqlalchemy_store(uri, artifact_root)
    store.engine.dispose()
    SqlAlchemyStore._engine_map.pop(uri, None)


def python_model_of(pyfunc: PyFuncModel):
    """The PythonModel a pyfunc loaded by mlflow.pyfunc.load_model runs; None for a pyfunc
    of another kind (another flavor's loader, or another MLflow's wrapper)."""
    return getattr(getattr(pyfunc, "_model_impl", None), "python_model", None)


def pyfunc_with(like: PyFuncModel, python_model, meta: Model) -> PyFuncModel:
    """A pyfunc as load_model would make of meta (an MLmodel) whose PythonModel is
    python_model, which is loaded already: like's wrapper, copied, around it."""
    wrapper = copy.copy(like._model_impl)
    wrapper.python_model, wrapper.signature = python_model, meta.signature
    flavor = meta.flavors[FLAVOR_NAME]
    return PyFuncModel(model_meta=meta, model_impl=wrapper, predict_fn=flavor.get("predict_fn", "predict"),
                       model_id=meta.model_id)
