"""The champion's checkpoint: where a run warm-started from the champion restores."""

from __future__ import annotations

from dataclasses import dataclass

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from picasso import storage
from picasso.connectors import registry_tags as tags
from picasso.connectors.mlflow_registry import MLflowTarget, http_settings
from picasso.connectors.publish_policy import CHAMPION, PublishPolicy
from picasso.connectors.retry import with_retries


@dataclass(frozen=True)
class ChampionCheckpoint:
    version: str
    checkpoint_path: str


def _lookup(target: MLflowTarget):
    client = MlflowClient(target.tracking_uri, target.tracking_uri)
    try:
        return client.get_model_version_by_alias(target.model_name, CHAMPION)
    except MlflowException as err:
        if err.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None  # no such model, or no champion yet
        raise


def champion_checkpoint(target: MLflowTarget, policy: PublishPolicy = PublishPolicy()) -> ChampionCheckpoint | None:
    """The champion version and the checkpoint it was published from; None when the model
    has no champion. Raises FileNotFoundError when that checkpoint is not on this machine
    (pruned, or trained elsewhere): restoring another one instead would be a silent lie."""
    with http_settings(policy):
        version = with_retries(lambda: _lookup(target), policy.retry, f"looking up {target.model_name}@{CHAMPION}")
    if version is None:
        return None
    path = version.tags.get(tags.CHECKPOINT_PATH)
    if not path or not storage.exists(storage.join(path, "state.pt")):
        raise FileNotFoundError(f"{target.model_name}@{CHAMPION} (version {version.version}) was published from "
                                f"checkpoint {path!r}, which is not on this machine; warm-start from the latest "
                                "checkpoint instead (--warm-start latest)")
    return ChampionCheckpoint(str(version.version), path)
