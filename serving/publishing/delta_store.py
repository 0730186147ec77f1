"""Deltas between consecutive model versions, made at publish time and applied by
`picasso apply-delta`.

A version's delta (run artifacts delta/delta.pt and delta/delta.json) takes the previous
version's serving weights to its own. Making it needs the previous weights: the
workspace keeps the last published ones (WORKSPACE/last/), and they are downloaded from
MLflow when the cache holds other weights (another publisher, a fresh workdir).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import mlflow
import torch
from mlflow.tracking import MlflowClient

from picasso.serving.publishing import registry_tags as tags
from picasso.serving.publishing.mlflow_env import tracking_uri
from picasso.serving.publishing.model_delta import (DeltaMismatch, apply_delta, compute_delta, delta_stats,
                                                       load_delta, save_delta)
from picasso.serving.publishing.registry import latest_version
from picasso.serving.weights import file_sha256, load_weights, save_weights

DELTA_FILE, DELTA_INFO = "delta.pt", "delta.json"


@dataclass(frozen=True)
class DeltaArtifact:
    directory: str  # holds delta.pt and delta.json
    base_version: str
    base_sha256: str
    target_sha256: str
    changed_rows: int
    whole_tensors: int
    delta_bytes: int
    full_bytes: int  # of the target's serving weights
    new_ids: int = 0  # ids dynamic tables admitted since the base version
    tombstones: int = 0  # ids they evicted


def model_version_location(client: MlflowClient, version) -> str:
    """Where a registered version's model keeps its files (MLmodel at the top), as MLflow
    itself resolves it for `models:/NAME/VERSION`: a logged model's artifact location for a
    version made by log_model or registered from models:/<model id> (or from a runs:/ URI
    MLflow resolved to its logged model), else the version's source as registered: a
    runs:/RUN/PATH URI (MLflow 2's way, or create_model_version with such a source), an
    artifact URI or a path. The version's entity often has no model_id (MLflow's REST
    answer leaves it out), so the source's last part is never read as one."""
    model_id = getattr(version, "model_id", None)
    if model_id:
        return client.get_logged_model(model_id).artifact_location
    return client.get_model_version_download_uri(version.name, version.version)


def download_weights(client: MlflowClient, version, directory: Path) -> Path:
    """A version's serving weights (the weights artifact of its logged model)."""
    location = model_version_location(client, version)
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=f"{location}/artifacts/weights.pt",
                                                    dst_path=str(directory), tracking_uri=tracking_uri(client)))


def download_delta(client: MlflowClient, version, directory: Path) -> Path:
    return Path(client.download_artifacts(version.run_id, f"delta/{DELTA_FILE}", str(directory)))


def _link_or_copy(source: Path, destination: Path) -> None:
    tmp = destination.with_name(destination.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:  # another filesystem
        shutil.copyfile(source, tmp)
    os.replace(tmp, destination)


class DeltaStore:
    def __init__(self, workspace: Path | None):
        self.last = workspace / "last" if workspace else None

    def _cached(self, model_name: str, sha: str) -> Path | None:
        if self.last is None or not (self.last / "last.json").exists():
            return None
        info = json.loads((self.last / "last.json").read_text())
        if info.get("model_name") == model_name and info.get("sha256") == sha and (self.last / "weights.pt").exists():
            return self.last / "weights.pt"
        return None

    def remember(self, model_name: str, version: str, weights: Path, sha: str) -> None:
        if self.last is None:
            return
        self.last.mkdir(parents=True, exist_ok=True)
        _link_or_copy(weights, self.last / "weights.pt")
        info = self.last / "last.json"
        info.with_suffix(".tmp").write_text(json.dumps({"model_name": model_name, "version": version, "sha256": sha}))
        os.replace(info.with_suffix(".tmp"), info)

    def make(self, client: MlflowClient, model_name: str, target: dict[str, torch.Tensor], weights: Path,
             weights_sha: str, directory: Path) -> DeltaArtifact | None:
        """The delta from the model's latest version to these weights; None for a first
        version (or a previous one published without weights' hash)."""
        previous = latest_version(client, model_name)
        base_sha = previous.tags.get(tags.WEIGHTS_SHA) if previous else None
        if not base_sha:
            return None
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="picasso-base-") as tmp:
            base_path = self._cached(model_name, base_sha) or download_weights(client, previous, Path(tmp))
            delta = compute_delta(load_weights(base_path), target, base_sha, weights_sha)
        stats = delta_stats(delta, save_delta(delta, directory / DELTA_FILE), weights.stat().st_size)
        artifact = DeltaArtifact(directory=str(directory), base_version=str(previous.version), base_sha256=base_sha,
                                 target_sha256=weights_sha, **asdict(stats))
        (directory / DELTA_INFO).write_text(json.dumps(asdict(artifact) | {"directory": None}, indent=1))
        return artifact


def rebuild(base_weights: Path, delta_path: Path, out: Path) -> str:
    """Weights = base + delta, written to out; checks both hashes, returns the SHA-256."""
    delta = load_delta(delta_path)
    base_sha = file_sha256(base_weights)
    if base_sha != delta["base_sha256"]:
        raise DeltaMismatch(f"{base_weights} has SHA-256 {base_sha}, the delta applies to {delta['base_sha256']}")
    sha = save_weights(apply_delta(load_weights(base_weights), delta), out)
    if sha != delta["target_sha256"]:
        raise DeltaMismatch(f"the rebuilt weights have SHA-256 {sha}, the delta promised {delta['target_sha256']}")
    return sha


def rebuild_version(client: MlflowClient, model_name: str, version: str, out: Path) -> dict:
    """Version `version`'s serving weights from its delta base's weights plus its delta,
    both fetched from MLflow; returns what was done."""
    target = client.get_model_version(model_name, version)
    base_version = target.tags.get(tags.DELTA_BASE, "none")
    if base_version == "none":
        raise DeltaMismatch(f"version {version} of {model_name} has no delta (it is the first, or was published "
                            "with deltas off)")
    with tempfile.TemporaryDirectory(prefix="picasso-apply-") as tmp:
        base = download_weights(client, client.get_model_version(model_name, base_version), Path(tmp) / "base")
        delta = download_delta(client, target, Path(tmp) / "delta")
        sha = rebuild(base, delta, out)
        delta_bytes = delta.stat().st_size
    if sha != target.tags.get(tags.WEIGHTS_SHA):
        raise DeltaMismatch(f"rebuilt weights {sha} differ from version {version}'s {target.tags.get(tags.WEIGHTS_SHA)}")
    return {"model_name": model_name, "version": version, "base_version": base_version, "sha256": sha,
            "out": str(out), "delta_bytes": delta_bytes, "full_bytes": out.stat().st_size}
