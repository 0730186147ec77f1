"""Publishing to MLflow: metrics, a pyfunc model that serves raw events, a registered
version tagged with the checkpoint and source positions it came from."""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import apache_beam as beam
import mlflow
import numpy as np
import pyarrow as pa
import torch
from mlflow.tracking import MlflowClient

import picasso
from picasso.checkpoint import load_checkpoint
from picasso.connectors import pyfunc_model

# What the pyfunc needs at serving time, and nothing of the trainer's (Beam, Kafka).
SERVING_REQUIREMENTS = [
    f"torch>={torch.__version__.split('+')[0]}",
    f"pyarrow>={pa.__version__}",
    f"numpy>={np.__version__}",
    "pandas",
    "pyyaml",
]
MAX_TAG_CHARS = 5000


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
        with artifacts under WORKDIR/mlartifacts."""
        workdir = Path(workdir).resolve()
        return cls(
            tracking_uri=tracking_uri or f"sqlite:///{workdir / 'mlflow.db'}",
            experiment=experiment,
            model_name=model_name,
            artifact_location=None if tracking_uri else (workdir / "mlartifacts").as_uri(),
        )


@dataclass(frozen=True)
class PublishRequest:
    checkpoint_path: str
    metrics: dict[str, float]
    params: dict[str, str] = field(default_factory=dict)
    run_name: str | None = None


@dataclass(frozen=True)
class ModelVersionRef:
    model_name: str
    version: str
    model_uri: str  # models:/NAME/VERSION
    run_id: str


def _experiment_id(client: MlflowClient, target: MLflowTarget) -> str:
    experiment = client.get_experiment_by_name(target.experiment)
    if experiment is not None:
        return experiment.experiment_id
    return client.create_experiment(target.experiment, artifact_location=target.artifact_location)


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


def publish(request: PublishRequest, target: MLflowTarget) -> ModelVersionRef:
    """Log a checkpoint as a run with a pyfunc model, and register it as a new version."""
    checkpoint = load_checkpoint(request.checkpoint_path)
    mlflow.set_tracking_uri(target.tracking_uri)
    mlflow.set_registry_uri(target.tracking_uri)
    client = MlflowClient(target.tracking_uri, target.tracking_uri)
    experiment_id = _experiment_id(client, target)
    tags = {
        "picasso.checkpoint_id": checkpoint.checkpoint_id,
        "picasso.step": str(checkpoint.step),
        "picasso.samples": str(checkpoint.state["samples"]),
    }
    positions = json.dumps(checkpoint.positions, sort_keys=True)
    if len(positions) <= MAX_TAG_CHARS:
        tags["picasso.positions"] = positions
    with tempfile.TemporaryDirectory() as tmp, mlflow.start_run(
        experiment_id=experiment_id, run_name=request.run_name, tags=tags
    ) as run:
        tmp = Path(tmp)
        config = checkpoint.state["config"]
        mlflow.log_params({"model": config["model"], "hidden": list(config["hidden"]), "spec": checkpoint.spec.name,
                           **request.params})
        mlflow.log_metrics({k: float(v) for k, v in request.metrics.items() if v is not None})
        torch.save(checkpoint.state["model"], tmp / "weights.pt")
        (tmp / "model_config.json").write_text(json.dumps({"model": config["model"], "hidden": list(config["hidden"])}))
        (tmp / "positions.json").write_text(positions)
        mlflow.log_artifact(str(tmp / "positions.json"))
        with warnings.catch_warnings():
            # MLflow asks for type hints on predict() to infer a signature; the model takes
            # whatever raw columns events carry, and checks them itself.
            warnings.filterwarnings("ignore", message=".*type hints to the `predict` method")
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=pyfunc_model.__file__,
                artifacts={
                    pyfunc_model.ARTIFACT_WEIGHTS: str(tmp / "weights.pt"),
                    pyfunc_model.ARTIFACT_SPEC: str(checkpoint.path / "spec.yaml"),
                    pyfunc_model.ARTIFACT_CONFIG: str(tmp / "model_config.json"),
                },
                code_paths=[str(_stage_code(tmp / "code"))],
                pip_requirements=SERVING_REQUIREMENTS,
                registered_model_name=target.model_name,
            )
        version = str(info.registered_model_version)
        for key, value in tags.items():
            client.set_model_version_tag(target.model_name, version, key, value)
    return ModelVersionRef(target.model_name, version, f"models:/{target.model_name}/{version}", run.info.run_id)


class PublishToMLflow(beam.PTransform):
    """PublishRequests in, ModelVersionRefs out."""

    def __init__(self, target: MLflowTarget):
        super().__init__()
        self.target = target

    def expand(self, requests):
        target = self.target
        return requests | "Publish" >> beam.Map(lambda request: publish(request, target))
