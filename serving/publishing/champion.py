"""The champion's checkpoint: where a run warm-started from the champion restores."""

from __future__ import annotations

from dataclasses import dataclass

from picasso import storage
from picasso.serving.publishing import registry_tags as tags
from picasso.serving.publishing.contract import MLflowTarget
from picasso.serving.publishing.mlflow_env import http_settings
from picasso.serving.publishing.policy import CHAMPION, PublishPolicy
from picasso.serving.publishing.registry import NO_SUCH_VERSION, client_for, version_by_alias
from picasso.connectors.retry import with_retries


@dataclass(frozen=True)
class ChampionCheckpoint:
    version: str
    checkpoint_path: str


def _lookup(target: MLflowTarget):
    # None for no champion yet, and for no such model (NOT_FOUND) either.
    return version_by_alias(client_for(target), target.model_name, CHAMPION, NO_SUCH_VERSION)


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
