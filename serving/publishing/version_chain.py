"""A model's life as a chain of versions: from one version (the champion, say) back through
each parent (registry_tags.PARENT_VERSION) to the model trained from scratch, each link
with what it trained since its parent (registry_tags.ORIGIN). `picasso versions` prints it."""

from __future__ import annotations

from dataclasses import dataclass

from mlflow.tracking import MlflowClient

from picasso.serving.publishing import registry_tags as tags
from picasso.serving.publishing.registry import NO_SUCH_VERSION, version_by_alias

MAX_LINKS = 1000  # a chain longer than this is cut (and says so)


@dataclass(frozen=True)
class ChainLink:
    model_name: str
    version: str
    aliases: tuple[str, ...]
    origin: str  # what it trained since its parent: partitions, or a stream's offsets
    parent: str  # a number, NAME/N of another model, "none" or "unknown"
    auc: float | None
    evaluation: str  # how the AUC was measured
    created_ms: int
    checkpoint: str


def version_chain(client: MlflowClient, model_name: str, start: str = "champion") -> list[ChainLink]:
    """The chain from `start` (a version number or an alias) back to its first version;
    raises ValueError when start is neither."""
    version = client.get_model_version(model_name, start) if start.isdigit() else \
        version_by_alias(client, model_name, start, NO_SUCH_VERSION)
    if version is None:
        raise ValueError(f"{model_name} has no version under the alias {start!r}")
    links, seen = [], set()
    while version is not None and (version.name, version.version) not in seen and len(links) < MAX_LINKS:
        seen.add((version.name, version.version))
        links.append(_link(client, version))
        version = _parent(client, version.name, links[-1].parent)
    return links


def _link(client: MlflowClient, version) -> ChainLink:
    found = version.tags
    auc = found.get(tags.AUC)
    aliases = getattr(version, "aliases", None) or client.get_model_version(version.name, version.version).aliases
    return ChainLink(version.name, str(version.version), tuple(sorted(aliases or ())), found.get(tags.ORIGIN, ""),
                     found.get(tags.PARENT_VERSION, "unknown"), float(auc) if auc not in (None, "nan") else None,
                     found.get(tags.EVALUATION, ""), int(version.creation_timestamp or 0),
                     found.get(tags.CHECKPOINT_PATH, ""))


def _parent(client: MlflowClient, name: str, parent: str):
    if parent in ("none", "unknown", ""):
        return None
    other, _, number = parent.rpartition("/")
    return client.get_model_version(other or name, number)
