"""Finding and making what a publish needs in MLflow's tracking store and registry: the
client of a target, its experiment and registered model (made once, whoever races to make
them), a version by alias, the latest version, and the search filter that finds a
checkpoint's run or version by its tags."""

from __future__ import annotations

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from picasso.serving.publishing import registry_tags as tags
from picasso.serving.publishing.contract import MLflowTarget

# The error codes of get_model_version_by_alias for an alias that points nowhere.
ALIAS_ABSENT = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")
# ... and those of a version or a model that is not there at all.
NO_SUCH_VERSION = ALIAS_ABSENT + ("NOT_FOUND",)


def client_for(target: MLflowTarget) -> MlflowClient:
    """A client whose tracking store and registry are both the target's, a SQLite store made
    complete first (MLflowTarget.make_store: a target made without its store, or one whose
    store went since; a complete one is only looked at)."""
    target.make_store()
    return MlflowClient(target.tracking_uri, target.tracking_uri)


def ensure_experiment(client: MlflowClient, target: MLflowTarget) -> str:
    """The id of the target's experiment, made if there is none yet."""
    experiment = client.get_experiment_by_name(target.experiment)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(target.experiment, artifact_location=target.artifact_location)
    except MlflowException as err:  # created by a concurrent publisher, or by our lost first attempt
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(target.experiment).experiment_id


def ensure_registered_model(client: MlflowClient, name: str) -> None:
    try:
        client.create_registered_model(name)
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def version_by_alias(client: MlflowClient, name: str, alias: str, absent: tuple[str, ...] = ALIAS_ABSENT):
    """The version under alias, or None where MLflow answers one of the error codes `absent`."""
    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as err:
        if err.error_code not in absent:
            raise
        return None


def latest_version(client: MlflowClient, model_name: str):
    found = client.search_model_versions(f"name = '{model_name}'", max_results=1, order_by=["version_number DESC"])
    return found[0] if found else None


def quote(value: str) -> str:
    """value inside '...' of a search filter."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def key_filter(checkpoint_id: str, checkpoint_path: str) -> str:
    """The search filter of the runs and versions published from this checkpoint."""
    return (f"tags.`{tags.CHECKPOINT_ID}` = '{quote(checkpoint_id)}' "
            f"and tags.`{tags.CHECKPOINT_PATH}` = '{quote(checkpoint_path)}'")
