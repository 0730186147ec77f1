"""Publishing a checkpoint to MLflow: one evaluated, gated, idempotent model version.

publish() makes, for one checkpoint:
- a run with the params, the metrics (AUC, log loss, calibration, samples, source
  positions, and whatever the trainer put in the checkpoint's metrics), and artifacts:
  the spec, the packing plan, the positions, plots of the metrics over versions, and the
  delta against the previous version (the embedding rows that changed);
- a pyfunc model (connectors/pyfunc_model.py, logged as models-from-code with the picasso
  modules it imports and pinned pip requirements; its signature states the output and the
  on_bad_row param, its metadata the spec's input fields);
- a registered version tagged with the checkpoint id, the source positions and the data
  counts, under the alias `candidate`, and promoted to `champion` by the PublishPolicy.

It is idempotent: the version carries the checkpoint's id and path as tags, and a publish
first searches for them, so publishing one checkpoint twice, or retrying after a failure
at any point, gives one version. A failed attempt is retried with backoff; the caller
(PublishOutbox) keeps the checkpoint pending when every attempt failed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import apache_beam as beam
import mlflow
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

import picasso
from picasso import storage
from picasso.checkpoint import Checkpoint, load_checkpoint
from picasso.connectors import pyfunc_model
from picasso.connectors import registry_tags as tags
from picasso.connectors.delta_store import DeltaStore
from picasso.connectors.local_store import ensure_sqlite_store
from picasso.connectors.metric_plots import metrics_svg
from picasso.connectors.model_signature import input_fields, serving_signature
from picasso.connectors.publish_policy import CANDIDATE, CHAMPION, PublishPolicy, decide_promotion
from picasso.connectors.retry import with_retries
from picasso.connectors.serving_weights import save_weights, serving_state
from picasso.packing import PackingPlan

log = logging.getLogger(__name__)

# What the pyfunc needs at serving time, and nothing of the trainer's (Beam, Kafka),
# pinned to the versions it was logged with. torch is pinned without its local build tag
# (2.13.0, not 2.13.0+cpu): the index serves the plain version.
SERVING_PACKAGES = ("torch", "pyarrow", "numpy", "pandas", "pyyaml")


def serving_requirements() -> list[str]:
    from importlib.metadata import version

    return [f"{name}=={version(name).split('+')[0]}" for name in SERVING_PACKAGES]


MAX_TAG_CHARS = 5000
MAX_PARAM_CHARS = 6000
MAX_POSITION_METRICS = 100  # per-source position metrics; beyond that only the total
HISTORY_RUNS = 200  # previous versions in the metric plots



@dataclass(frozen=True)
class MLflowTarget:
    tracking_uri: str
    experiment: str = "picasso"
    model_name: str = "picasso-ctr"
    # Where a new experiment keeps its artifacts; None lets the server decide.
    artifact_location: str | None = None

    @classmethod
    def for_workdir(cls, workdir: str | Path, tracking_uri: str | None = None, experiment: str = "picasso",
                    model_name: str = "picasso-ctr") -> "MLflowTarget":
        """The given server, or by default a local store in workdir: sqlite:///WORKDIR/mlflow.db
        with artifacts under WORKDIR/mlartifacts.

        Every command that talks to MLflow gets its target here, before anything opens the
        store, so this is where a SQLite store (the default one, or a sqlite:/// URI given)
        is made complete, in one step (connectors/local_store.py). It raises
        HalfMadeStoreError for a half-made store that holds data, and ValueError for a
        workdir at a URL without a tracking URI: SQLite cannot live on an object store."""
        if storage.is_url(workdir) and not tracking_uri:
            raise ValueError(f"the work folder {workdir} is not on a local disk, so it cannot hold the default "
                             "SQLite MLflow store: give an MLflow server (--mlflow-uri or $MLFLOW_TRACKING_URI)")
        workdir = Path(workdir).resolve() if not storage.is_url(workdir) else workdir
        target = cls(
            tracking_uri=tracking_uri or f"sqlite:///{workdir / 'mlflow.db'}",
            experiment=experiment,
            model_name=model_name,
            artifact_location=None if tracking_uri else (workdir / "mlartifacts").as_uri(),
        )
        ensure_sqlite_store(target.tracking_uri, target.artifact_location)
        return target


@dataclass(frozen=True)
class PublishRequest:
    checkpoint_path: str
    metrics: dict[str, float]  # evaluation and data counts: auc, logloss, calibration, samples, ...
    params: dict[str, str] = field(default_factory=dict)
    run_name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)  # extra version tags (the date, data counts)
    # Per-step series, {name: [[step, value], ...]}: logged with their steps, e.g. the hot
    # cache's hit rate. Series under the checkpoint's metrics["step_metrics"] are logged too.
    step_metrics: dict[str, list] = field(default_factory=dict)
    plots: dict[str, str] = field(default_factory=dict)  # plots/<name>: SVG text, e.g. a joined stream's label delays

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "PublishRequest":
        return cls(**data)


@dataclass(frozen=True)
class ModelVersionRef:
    model_name: str
    version: str
    model_uri: str  # models:/NAME/VERSION
    run_id: str
    created: bool = True  # False: this checkpoint had been published before
    champion: bool = False  # promoted by this publish (or earlier, for created=False)
    promotion_reason: str = ""
    delta_base: str | None = None  # the version the delta artifact applies to
    full_bytes: int = 0  # serving weights
    delta_bytes: int | None = None


@contextmanager
def http_settings(policy: PublishPolicy):
    """MLflow reads its HTTP timeout and retries from the environment, per request."""
    wanted = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(int(math.ceil(policy.http_timeout_s))),
              "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(policy.http_retries)}
    saved = {key: os.environ.get(key) for key in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_URI_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


@contextmanager
def _fluent_uris(uri: str):
    """log_model goes through MLflow's fluent API, which reads process-wide URIs, and
    set_tracking_uri/set_registry_uri also export them to the environment (so to child
    processes). Point them at the target for one publish, then put back what was there: a
    publish must not redirect its caller's later MLflow calls."""
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    saved = tracking_utils._tracking_uri, registry_utils._registry_uri, {k: os.environ.get(k) for k in _URI_VARIABLES}
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        tracking_utils._tracking_uri, registry_utils._registry_uri = saved[0], saved[1]
        for key, value in saved[2].items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _experiment_id(client: MlflowClient, target: MLflowTarget) -> str:
    experiment = client.get_experiment_by_name(target.experiment)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(target.experiment, artifact_location=target.artifact_location)
    except MlflowException as err:  # created by a concurrent publisher, or by our lost first attempt
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(target.experiment).experiment_id


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    try:
        client.create_registered_model(name)
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def _stage_code(directory: Path) -> Path:
    """A copy of the picasso modules serving imports, shipped inside the model so that it
    loads where picasso is not installed."""
    package = directory / "picasso"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(picasso.__path__[0], package, ignore=ignore)
    from picasso import connectors, kernels, models

    for module, name in ((models, "models"), (kernels, "kernels"), (connectors, "connectors")):
        if not (package / name).exists():
            shutil.copytree(module.__path__[0], package / name, ignore=ignore)
    return package


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _key_filter(checkpoint_id: str, checkpoint_path: str) -> str:
    return (f"tags.`{tags.CHECKPOINT_ID}` = '{_quote(checkpoint_id)}' "
            f"and tags.`{tags.CHECKPOINT_PATH}` = '{_quote(checkpoint_path)}'")


def _metric_name(text: str) -> str:
    """A metric name MLflow takes. It refuses names that a path normalisation would change
    (a source URL's "s3://" has an empty segment), so empty and "." segments are dropped
    and ".." ones renamed."""
    name = re.sub(r"[^A-Za-z0-9_\-. /]", "_", text)
    segments = [("__" if segment == ".." else segment) for segment in name.split("/") if segment not in ("", ".")]
    return ("/" if name.startswith("/") else "") + "/".join(segments)[:200]  # a local path keeps its name


def _flatten_numbers(values: dict, prefix: str, skip: tuple[str, ...] = ("ledger", "step_metrics")) -> dict[str, float]:
    """Numeric leaves of nested dicts, as dotted names."""
    flat = {}
    for key, value in values.items():
        if key in skip:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten_numbers(value, f"{name}.", ()))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[name] = float(value)
    return flat


class _Publication:
    """One publish of one checkpoint: what every attempt shares."""

    def __init__(self, request: PublishRequest, target: MLflowTarget, policy: PublishPolicy,
                 workspace: Path | None, checkpoint_dir: str | None, on_stage: Callable[[str], None]):
        self.request, self.target, self.policy = request, target, policy
        self.checkpoint: Checkpoint = load_checkpoint(checkpoint_dir or request.checkpoint_path)
        self.checkpoint_path = request.checkpoint_path if storage.is_url(request.checkpoint_path) \
            else str(Path(request.checkpoint_path).resolve())
        # The id of the checkpoint as saved (the outbox reads it from a copy of another name).
        self.checkpoint_id = storage.name(request.checkpoint_path)
        self.deltas = DeltaStore(workspace)
        self.on_stage = on_stage

    # -- what gets logged ---------------------------------------------------------------

    def version_tags(self, weights_sha: str, delta_base: str | None) -> dict[str, str]:
        checkpoint = self.checkpoint
        version_tags = {
            tags.CHECKPOINT_ID: self.checkpoint_id,
            tags.CHECKPOINT_PATH: self.checkpoint_path,
            "picasso.step": str(checkpoint.step),
            "picasso.samples": str(checkpoint.state["samples"]),
            tags.AUC: repr(float(self.request.metrics.get("auc", math.nan))),
            tags.WEIGHTS_SHA: weights_sha,
            tags.DELTA_BASE: delta_base or "none",
            **{k: str(v) for k, v in self.request.tags.items()},
        }
        positions = json.dumps(checkpoint.positions, sort_keys=True)
        if len(positions) <= MAX_TAG_CHARS:
            version_tags["picasso.positions"] = positions
        return version_tags

    def params(self) -> dict[str, str]:
        config = self.checkpoint.state["config"]
        params = {**{k: v for k, v in config.items()}, "spec": self.checkpoint.spec.name,
                  "promote_epsilon": self.policy.promote_epsilon, "auto_promote": self.policy.auto_promote,
                  **self.request.params}
        return {k: str(v)[:MAX_PARAM_CHARS] for k, v in params.items()}

    def metrics(self) -> dict[str, float]:
        metrics = {k: float(v) for k, v in self.request.metrics.items() if v is not None}
        positions = self.checkpoint.positions
        metrics["positions_total"] = float(sum(positions.values()))
        if len(positions) <= MAX_POSITION_METRICS:
            metrics.update({f"positions.{_metric_name(source)}": float(p) for source, p in positions.items()})
        metrics.update(_flatten_numbers(self.checkpoint.metrics, "train."))
        return {k: v for k, v in metrics.items() if math.isfinite(v)}

    def series(self) -> dict[str, list]:
        return {**self.checkpoint.metrics.get("step_metrics", {}), **self.request.step_metrics}

    # -- the steps ----------------------------------------------------------------------

    def existing_version(self, client: MlflowClient):
        name = self.target.model_name
        found = client.search_model_versions(
            f"name = '{_quote(name)}' and "
            + _key_filter(self.checkpoint_id, self.checkpoint_path))
        return min(found, key=lambda v: int(v.version)) if found else None

    def logged_run(self, client: MlflowClient, experiment_id: str):
        """A run of an earlier attempt whose model was logged in full."""
        runs = client.search_runs([experiment_id], _key_filter(self.checkpoint_id, self.checkpoint_path)
                                  + f" and tags.`{tags.MODEL_NAME}` = '{_quote(self.target.model_name)}'")
        done = [run for run in runs if tags.MODEL_ID in run.data.tags]
        return done[0] if done else None

    def history(self, client: MlflowClient, experiment_id: str) -> list[dict]:
        runs = client.search_runs([experiment_id], f"tags.`{tags.MODEL_NAME}` = '{_quote(self.target.model_name)}' "
                                  f"and tags.`{tags.VERSION}` != ''", order_by=["attributes.start_time DESC"],
                                  max_results=HISTORY_RUNS)
        points = [{"label": f"v{run.data.tags[tags.VERSION]}", **run.data.metrics} for run in reversed(runs)]
        request = self.request.metrics
        calibration = request.get("calibration")
        return points + [{"label": "new", "auc": request.get("auc"), "logloss": request.get("logloss"),
                          "calibration": calibration}]

    def log_run(self, client: MlflowClient, experiment_id: str, tmp: Path):
        """A run with everything logged and the pyfunc model; returns (run_id, model_id, weights)."""
        checkpoint, target = self.checkpoint, self.target
        artifacts = tmp / "run"
        (artifacts / "plots").mkdir(parents=True)
        weights = tmp / "weights.pt"
        state = serving_state(checkpoint.state["model"])
        weights_sha = save_weights(state, weights)
        delta = self.deltas.make(client, target.model_name, state, weights, weights_sha, artifacts / "delta") \
            if self.policy.deltas else None
        del state
        (artifacts / "spec.yaml").write_bytes(storage.read_bytes(storage.join(checkpoint.path, "spec.yaml")))
        (artifacts / "packing_plan.json").write_text(json.dumps(_plan_dict(checkpoint), indent=1))
        (artifacts / "positions.json").write_text(json.dumps(checkpoint.positions, sort_keys=True, indent=1))
        (artifacts / "plots" / "metrics_over_versions.svg").write_text(metrics_svg(self.history(client, experiment_id)))
        for name, svg in self.request.plots.items():
            (artifacts / "plots" / Path(name).name).write_text(svg)
        parent = os.environ.get("MLFLOW_RUN_ID")  # inside `mlflow run`: nest under the project's run
        # The weights' hash and the delta's base go on the run too: a retry that reuses this
        # run registers the version with them.
        run_tags = {tags.CHECKPOINT_ID: self.checkpoint_id, tags.CHECKPOINT_PATH: self.checkpoint_path,
                    tags.MODEL_NAME: target.model_name, tags.WEIGHTS_SHA: weights_sha,
                    tags.DELTA_BASE: delta.base_version if delta else "none",
                    tags.FULL_BYTES: str(weights.stat().st_size),
                    **({tags.DELTA_BYTES: str(delta.delta_bytes)} if delta else {}),
                    **({"mlflow.parentRunId": parent} if parent else {})}
        run = client.create_run(experiment_id, run_name=self.request.run_name, tags=run_tags)
        run_id = run.info.run_id
        client.log_batch(run_id, params=[Param(k, v) for k, v in self.params().items()])
        client.log_artifacts(run_id, str(artifacts))
        with _active_run(run_id), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*type hints to the `predict` method")
            # An input example would make MLflow run the model at logging time (seconds);
            # the inputs are stated from the spec instead (connectors/model_signature.py).
            warnings.filterwarnings("ignore", message=".*input example was not provided")
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=pyfunc_model.__file__,
                artifacts={
                    pyfunc_model.ARTIFACT_WEIGHTS: str(weights),
                    pyfunc_model.ARTIFACT_SPEC: str(artifacts / "spec.yaml"),
                    pyfunc_model.ARTIFACT_CONFIG: str(_write_model_config(checkpoint, tmp)),
                },
                code_paths=[str(_stage_code(tmp / "code"))],
                pip_requirements=serving_requirements(),
                signature=serving_signature(),
                metadata={"input_fields": input_fields(checkpoint.spec)},
            )
        # The metrics after the model, each naming it: logged before, log_model would read
        # every metric's history back from the server to link it to the model.
        ids = ({"delta_new_ids": delta.new_ids, "delta_tombstones": delta.tombstones}
               if delta and self.checkpoint.spec.dynamic_fields else {})
        client.log_batch(run_id, metrics=_metric_entities({**self.metrics(), **ids}, self.series(), info.model_id))
        client.set_tag(run_id, tags.MODEL_ID, info.model_id)  # last: the run is complete
        self.on_stage("model_logged")
        return run_id, info.model_id, weights, delta

    def register(self, client: MlflowClient, run) -> object:
        """The version of a run whose model is logged; its tags come from the run's."""
        _ensure_registered_model(client, self.target.model_name)
        run_tags = run.data.tags
        model_id = run_tags[tags.MODEL_ID]
        base = run_tags.get(tags.DELTA_BASE, "none")
        version = client.create_model_version(
            self.target.model_name, source=f"models:/{model_id}", run_id=run.info.run_id, model_id=model_id,
            tags={**self.version_tags(run_tags[tags.WEIGHTS_SHA], None if base == "none" else base),
                  **{k: run_tags[k] for k in (tags.FULL_BYTES, tags.DELTA_BYTES) if k in run_tags}})
        client.set_tag(run.info.run_id, tags.VERSION, str(version.version))
        self.on_stage("registered")
        return version

    def promote(self, client: MlflowClient, version) -> tuple[bool, str]:
        """Alias candidate; champion when the policy says so; tag the decision (last, so a
        version without it is finished by the next attempt)."""
        name, number = self.target.model_name, str(version.version)  # an int from a SQL store, a str over REST
        client.set_registered_model_alias(name, CANDIDATE, number)
        try:
            champion = client.get_model_version_by_alias(name, CHAMPION)
        except MlflowException as err:
            if err.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise
            champion = None
        if champion is not None and str(champion.version) == number:
            promoted, reason = True, version.tags.get(tags.PROMOTION_REASON) or "already champion"
        else:
            champion_auc = float(champion.tags.get(tags.AUC, "nan")) if champion else None
            decision = decide_promotion(float(self.request.metrics.get("auc", math.nan)), champion_auc,
                                        str(champion.version) if champion else None, self.policy)
            promoted, reason = decision.promote, decision.reason
            if promoted:
                client.set_registered_model_alias(name, CHAMPION, number)
        client.set_model_version_tag(name, number, tags.PROMOTION_REASON, reason)
        client.set_model_version_tag(name, number, tags.PROMOTION, "promoted" if promoted else "not_promoted")
        self.on_stage("promoted")
        return promoted, reason

    def attempt(self) -> ModelVersionRef:
        target = self.target
        client = MlflowClient(target.tracking_uri, target.tracking_uri)
        version = self.existing_version(client)
        created, weights, delta = version is None, None, None
        if version is not None and tags.PROMOTION in version.tags:
            # Published in full before: leave its aliases alone (a newer version may hold them).
            return self.ref(version, created=False, champion=version.tags[tags.PROMOTION] == "promoted",
                            reason=version.tags.get(tags.PROMOTION_REASON, ""))
        with tempfile.TemporaryDirectory(prefix="picasso-publish-") as tmp:
            if version is None:
                experiment_id = _experiment_id(client, target)
                run = self.logged_run(client, experiment_id)  # an earlier attempt's, which failed later
                if run is None:
                    run_id, _, weights, delta = self.log_run(client, experiment_id, Path(tmp))
                    run = client.get_run(run_id)
                version = self.register(client, run)
            promoted, reason = self.promote(client, version)
            if weights is not None:
                self.deltas.remember(target.model_name, str(version.version), weights, run.data.tags[tags.WEIGHTS_SHA])
        return self.ref(version, created, promoted, reason, delta)

    def ref(self, version, created: bool, champion: bool, reason: str, delta=None) -> ModelVersionRef:
        name, number = self.target.model_name, str(version.version)
        base = version.tags.get(tags.DELTA_BASE) if delta is None else delta.base_version
        delta_bytes = version.tags.get(tags.DELTA_BYTES)
        return ModelVersionRef(
            name, number, f"models:/{name}/{number}", version.run_id, created=created,
            champion=champion, promotion_reason=reason, delta_base=None if base in (None, "none") else base,
            full_bytes=int(version.tags.get(tags.FULL_BYTES, 0)), delta_bytes=int(delta_bytes) if delta_bytes else None)


@contextmanager
def _active_run(run_id: str):
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


def _metric_entities(values: dict[str, float], series: dict[str, list], model_id: str) -> list[Metric]:
    import time

    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, 0, model_id=model_id) for k, v in values.items()]
    for name, points in series.items():
        metrics += [Metric(_metric_name(name), float(value), now, int(step), model_id=model_id)
                    for step, value in points if value is not None and math.isfinite(float(value))]
    return metrics


def _plan_dict(checkpoint: Checkpoint) -> dict:
    plan = PackingPlan.from_spec(checkpoint.spec)
    return {"spec": checkpoint.spec.name, "groups": [
        {"name": g.name, "embedding_dim": g.embedding_dim, "fields": list(g.fields), "rows": g.num_rows,
         "row_offsets": list(g.row_offsets), "optimizer": g.optimizer, "table_bytes": g.table_bytes()}
        for g in plan.groups]}


def _write_model_config(checkpoint: Checkpoint, tmp: Path) -> Path:
    config = checkpoint.state["config"]
    path = tmp / "model_config.json"
    path.write_text(json.dumps({"model": config["model"], "hidden": list(config["hidden"])}))
    return path


def publish(request: PublishRequest, target: MLflowTarget, policy: PublishPolicy = PublishPolicy(), *,
            workspace: str | Path | None = None, checkpoint_dir: str | None = None,
            on_stage: Callable[[str], None] = lambda stage: None, sleep=None) -> ModelVersionRef:
    """Publish one checkpoint as one version (see the module docstring); retried per
    policy.retry, the last error raised.

    workspace: a directory kept between publishes (the outbox's); on a local disk it holds
    the last published weights, so the next delta needs no download (a workspace at a URL
    keeps no such cache: the base comes from MLflow). checkpoint_dir: where to read
    the checkpoint when it is not at request.checkpoint_path any more (the outbox's copy).
    """
    import time

    local_workspace = Path(workspace) if workspace and not storage.is_url(workspace) else None
    publication = _Publication(request, target, policy, local_workspace, checkpoint_dir, on_stage)
    with http_settings(policy), _fluent_uris(target.tracking_uri):
        return with_retries(publication.attempt, policy.retry, f"publishing {publication.checkpoint_id}",
                            sleep or time.sleep)


class PublishToMLflow(beam.PTransform):
    """PublishRequests in, PublishOutcomes out: each request goes through the outbox under
    workspace, so a request MLflow could not take stays pending there (status "pending")
    and is published by the next flush."""

    def __init__(self, target: MLflowTarget, workspace: str | Path, policy: PublishPolicy = PublishPolicy()):
        super().__init__()
        self.target, self.workspace, self.policy = target, str(workspace), policy

    def expand(self, requests):
        from picasso.connectors.publish_outbox import PublishOutbox

        target, workspace, policy = self.target, self.workspace, self.policy
        return requests | "Publish" >> beam.Map(lambda request: PublishOutbox(workspace).submit(request, target, policy))
