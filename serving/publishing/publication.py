"""Publishing one checkpoint to MLflow: one evaluated, gated, idempotent model version.

publish() makes, for one checkpoint:
- a run with the params, the metrics (AUC, log loss, calibration, samples, source
  positions, and whatever the trainer put in the checkpoint's metrics), and artifacts:
  the spec, the packing plan, the positions, plots of the metrics over versions, and the
  delta against the previous version (the embedding rows that changed);
- a pyfunc model (serving/pyfunc_model.py, logged as models-from-code with a copy of
  exactly the picasso modules it needs, the kernels' C++ sources and pinned pip
  requirements (serving/model_code.py); its signature states the output and the
  on_bad_row param, its metadata the spec's input fields);
- a registered version tagged with the checkpoint id, the source positions and the data
  counts, under the alias `candidate`, and promoted to `champion` by the PublishPolicy.

It is idempotent: the version carries the checkpoint's id and path as tags, and a publish
first searches for them, so publishing one checkpoint twice, or retrying after a failure
at any point, gives one version. A failed attempt is retried with backoff; the caller
(the outbox, outbox.py) keeps the checkpoint pending when every attempt failed.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import mlflow
from mlflow.entities import Param
from mlflow.tracking import MlflowClient

from picasso import storage
from picasso.checkpoint import Checkpoint, load_checkpoint
from picasso.connectors.metric_plots import metrics_svg
from picasso.serving.publishing import registry_tags as tags
from picasso.serving.publishing.contract import ModelVersionRef, MLflowTarget, PublishRequest
from picasso.serving.publishing.delta_store import DeltaStore
from picasso.serving.publishing.mlflow_env import active_run, fluent_uris, http_settings, project_run_id
from picasso.serving.model_code import serving_requirements, stage_code
from picasso.serving.publishing.policy import CANDIDATE, CHAMPION, PublishPolicy, decide_promotion
from picasso.serving.publishing.registry import (client_for, ensure_experiment, ensure_registered_model, key_filter,
                                                    quote, version_by_alias)
from picasso.serving.publishing.run_metrics import flatten_numbers, metric_entities, metric_name
from picasso.connectors.retry import with_retries
from picasso.packing import PackingPlan
from picasso.serving import pyfunc_model
from picasso.serving.signature import BUILT_FROM, INPUT_FIELDS, built_from_sha256, input_fields, serving_signature
from picasso.serving.weights import save_weights, serving_state

MAX_TAG_CHARS = 5000
MAX_PARAM_CHARS = 6000
MAX_POSITION_METRICS = 100  # per-source position metrics; beyond that only the total
HISTORY_RUNS = 200  # previous versions in the metric plots


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

    def lineage_tags(self, client: MlflowClient) -> dict[str, str]:
        """The version the request's parent checkpoint was published as: its number (NAME/N
        when it is another model's), "none" for a model from scratch, "unknown" when that
        checkpoint made no version anyone can find."""
        if tags.PARENT_CHECKPOINT not in self.request.tags:
            return {}
        parent = self.request.tags[tags.PARENT_CHECKPOINT]
        if not parent:
            return {tags.PARENT_VERSION: "none"}
        path = parent if storage.is_url(parent) else str(Path(parent).resolve())
        found = client.search_model_versions(f"tags.`{tags.CHECKPOINT_PATH}` = '{quote(path)}'")
        mine = [v for v in found if v.name == self.target.model_name]
        if mine:
            number = str(min(int(v.version) for v in mine))
        else:
            number = min((f"{v.name}/{v.version}" for v in found), default="unknown")
        return {tags.PARENT_CHECKPOINT: path, tags.PARENT_VERSION: number}

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
            metrics.update({f"positions.{metric_name(source)}": float(p) for source, p in positions.items()})
        metrics.update(flatten_numbers(self.checkpoint.metrics, "train."))
        return {k: v for k, v in metrics.items() if math.isfinite(v)}

    def series(self) -> dict[str, list]:
        return {**self.checkpoint.metrics.get("step_metrics", {}), **self.request.step_metrics}

    # -- the steps ----------------------------------------------------------------------

    def existing_version(self, client: MlflowClient):
        name = self.target.model_name
        found = client.search_model_versions(
            f"name = '{quote(name)}' and "
            + key_filter(self.checkpoint_id, self.checkpoint_path))
        return min(found, key=lambda v: int(v.version)) if found else None

    def logged_run(self, client: MlflowClient, experiment_id: str):
        """A run of an earlier attempt whose model was logged in full."""
        runs = client.search_runs([experiment_id], key_filter(self.checkpoint_id, self.checkpoint_path)
                                  + f" and tags.`{tags.MODEL_NAME}` = '{quote(self.target.model_name)}'")
        done = [run for run in runs if tags.MODEL_ID in run.data.tags]
        return done[0] if done else None

    def history(self, client: MlflowClient, experiment_id: str) -> list[dict]:
        runs = client.search_runs([experiment_id], f"tags.`{tags.MODEL_NAME}` = '{quote(self.target.model_name)}' "
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
        parent = project_run_id()  # inside `mlflow run`: nest under the project's run
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
        config = _write_model_config(checkpoint, tmp)
        built_from = built_from_sha256((artifacts / "spec.yaml").read_bytes(), config.read_bytes(),
                                       Path(pyfunc_model.__file__).read_bytes())
        with active_run(run_id), warnings.catch_warnings():
            # An input example would make MLflow run the model at logging time (seconds);
            # the inputs are stated from the spec instead (serving/signature.py).
            warnings.filterwarnings("ignore", message=".*input example was not provided")
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=pyfunc_model.__file__,
                artifacts={
                    pyfunc_model.ARTIFACT_WEIGHTS: str(weights),
                    pyfunc_model.ARTIFACT_SPEC: str(artifacts / "spec.yaml"),
                    pyfunc_model.ARTIFACT_CONFIG: str(config),
                },
                code_paths=[str(stage_code(tmp / "code"))],
                pip_requirements=serving_requirements(),
                signature=serving_signature(),
                metadata={INPUT_FIELDS: input_fields(checkpoint.spec), BUILT_FROM: built_from},
            )
        # The metrics after the model, each naming it: logged before, log_model would read
        # every metric's history back from the server to link it to the model.
        ids = ({"delta_new_ids": delta.new_ids, "delta_tombstones": delta.tombstones}
               if delta and self.checkpoint.spec.dynamic_fields else {})
        client.log_batch(run_id, metrics=metric_entities({**self.metrics(), **ids}, self.series(), info.model_id))
        client.set_tag(run_id, tags.MODEL_ID, info.model_id)  # last: the run is complete
        self.on_stage("model_logged")
        return run_id, info.model_id, weights, delta

    def register(self, client: MlflowClient, run) -> object:
        """The version of a run whose model is logged; its tags come from the run's."""
        ensure_registered_model(client, self.target.model_name)
        run_tags = run.data.tags
        model_id = run_tags[tags.MODEL_ID]
        base = run_tags.get(tags.DELTA_BASE, "none")
        version = client.create_model_version(
            self.target.model_name, source=f"models:/{model_id}", run_id=run.info.run_id, model_id=model_id,
            tags={**self.version_tags(run_tags[tags.WEIGHTS_SHA], None if base == "none" else base),
                  **self.lineage_tags(client),
                  **{k: run_tags[k] for k in (tags.FULL_BYTES, tags.DELTA_BYTES) if k in run_tags}})
        client.set_tag(run.info.run_id, tags.VERSION, str(version.version))
        self.on_stage("registered")
        return version

    def promote(self, client: MlflowClient, version) -> tuple[bool, str]:
        """Alias candidate; champion when the policy says so; tag the decision (last, so a
        version without it is finished by the next attempt)."""
        name, number = self.target.model_name, str(version.version)  # an int from a SQL store, a str over REST
        client.set_registered_model_alias(name, CANDIDATE, number)
        champion = version_by_alias(client, name, CHAMPION)
        if champion is not None and str(champion.version) == number:
            promoted, reason = True, version.tags.get(tags.PROMOTION_REASON) or "already champion"
        else:
            champion_auc = float(champion.tags.get(tags.AUC, "nan")) if champion else None
            decision = decide_promotion(float(self.request.metrics.get("auc", math.nan)), champion_auc,
                                        str(champion.version) if champion else None, self.policy,
                                        self.request.tags.get(tags.EVALUATION),
                                        champion.tags.get(tags.EVALUATION) if champion else None)
            promoted, reason = decision.promote, decision.reason
            if promoted:
                client.set_registered_model_alias(name, CHAMPION, number)
        client.set_model_version_tag(name, number, tags.PROMOTION_REASON, reason)
        client.set_model_version_tag(name, number, tags.PROMOTION, "promoted" if promoted else "not_promoted")
        self.on_stage("promoted")
        return promoted, reason

    def attempt(self) -> ModelVersionRef:
        target = self.target
        client = client_for(target)
        version = self.existing_version(client)
        created, weights, delta = version is None, None, None
        if version is not None and tags.PROMOTION in version.tags:
            # Published in full before: leave its aliases alone (a newer version may hold them).
            return self.ref(version, created=False, champion=version.tags[tags.PROMOTION] == "promoted",
                            reason=version.tags.get(tags.PROMOTION_REASON, ""))
        with tempfile.TemporaryDirectory(prefix="picasso-publish-") as tmp:
            if version is None:
                experiment_id = ensure_experiment(client, target)
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


def _plan_dict(checkpoint: Checkpoint) -> dict:
    plan = PackingPlan.from_spec(checkpoint.spec)
    return {"spec": checkpoint.spec.name, "groups": [
        {"name": g.name, "embedding_dim": g.embedding_dim, "fields": list(g.fields), "rows": g.num_rows,
         "row_offsets": list(g.row_offsets), "optimizer": g.optimizer, "table_bytes": g.table_bytes(),
         "part": g.part}  # the model's parts it feeds: a cross's may be one (packing)
        for g in plan.groups]}


def _write_model_config(checkpoint: Checkpoint, tmp: Path) -> Path:
    path = tmp / "model_config.json"
    path.write_text(json.dumps(pyfunc_model.model_config(checkpoint.state["config"])))
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
    local_workspace = Path(workspace) if workspace and not storage.is_url(workspace) else None
    publication = _Publication(request, target, policy, local_workspace, checkpoint_dir, on_stage)
    target.make_store()  # before the retries: a half-made store holding data is refused at once, not retried
    with http_settings(policy), fluent_uris(target.tracking_uri):
        return with_retries(publication.attempt, policy.retry, f"publishing {publication.checkpoint_id}",
                            sleep or time.sleep)
