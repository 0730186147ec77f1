"""The runs of `picasso apply-delta`, `publish-pending` and `promote` (their flags, and the
publish policy's that daily, demo and stream share: publish_args.py), and the MLflow store
they read versions from."""

from __future__ import annotations

from pathlib import Path

from picasso.serving.publishing.local_store import sqlite_path
from picasso.serving.publishing.contract import PUBLISHED, MLflowTarget
from picasso.pipelines.cli.output import CommandResult, reported, summary
from picasso.pipelines.cli.publish_args import publish_policy
from picasso.pipelines.runs.workdir import Workdir


def _apply_delta_command(args) -> CommandResult:
    output = run_apply_delta(args)
    summary("apply-delta: rebuilt bit for bit", output)
    return CommandResult(output)


def _publish_pending_command(args) -> CommandResult:
    output = run_publish_pending(args)
    summary("publish-pending", output)
    return CommandResult(output, pending=bool(output["pending"]))


def _promote_command(args) -> CommandResult:
    output = run_promote(args)
    summary(f"promote: {output['model_name']}@{output['alias']}", output)
    return CommandResult(output)


# The commands' runs (cli/command_runs.py calls them): each ends as cli/output.py says.
apply_delta_command = reported(_apply_delta_command)
publish_pending_command = reported(_publish_pending_command)
promote_command = reported(_promote_command)


def run_promote(args) -> dict:
    from picasso.serving.publishing.registry import client_for, version_by_alias  # MLflow: see run_apply_delta

    target = existing_store(args)
    client = client_for(target)
    version = client.get_model_version(target.model_name, args.version)  # raises for no such version
    before = version_by_alias(client, target.model_name, args.alias)
    client.set_registered_model_alias(target.model_name, args.alias, version.version)
    return {"model_name": target.model_name, "alias": args.alias, "version": str(version.version),
            "was": str(before.version) if before else None}


def run_apply_delta(args) -> dict:
    # MLflow: a second of start-up that the commands which never publish skip.
    from mlflow.tracking import MlflowClient

    from picasso.serving.publishing.delta_store import rebuild, rebuild_version

    out = Path(args.out)
    if args.version:
        if args.base or args.delta:
            raise ValueError("give either --version (fetched from MLflow) or --base and --delta (local files)")
        target = existing_store(args)
        out.parent.mkdir(parents=True, exist_ok=True)
        client = MlflowClient(target.tracking_uri, target.tracking_uri)
        try:
            return rebuild_version(client, target.model_name, args.version, out)
        except Exception as err:  # noqa: BLE001 - MLflow's errors: said with where they were looked for
            if not type(err).__module__.startswith("mlflow"):
                raise
            raise ValueError(f"{err} (in the MLflow store {target.tracking_uri}; {_STORE_CHOICE})") from err
    out.parent.mkdir(parents=True, exist_ok=True)
    if not (args.base and args.delta):
        raise ValueError("apply-delta needs --version, or both --base and --delta")
    for path in (args.base, args.delta):
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path} does not exist")
    sha = rebuild(Path(args.base), Path(args.delta), out)
    return {"sha256": sha, "out": str(out), "delta_bytes": Path(args.delta).stat().st_size,
            "full_bytes": out.stat().st_size}


_STORE_CHOICE = "--workdir (its WORKDIR/mlflow.db) or --mlflow-uri chooses the store"


def existing_store(args) -> MLflowTarget:
    """The MLflow store that apply-delta, promote and versions read versions from."""
    check_existing_store(args.workdir, args.mlflow_uri)
    return MLflowTarget.for_workdir(args.workdir, args.mlflow_uri, args.experiment, args.model_name)


def check_existing_store(workdir: str, mlflow_uri: str | None) -> None:
    """A store that versions are read from (apply-delta, serve) must be there already,
    since a store made here (./mlflow.db, say, for a forgotten --workdir) holds none."""
    default = mlflow_uri is None
    path = Path(workdir).resolve() / "mlflow.db" if default else sqlite_path(mlflow_uri)
    if path is not None and not path.is_file():
        raise FileNotFoundError(f"no MLflow store at {path if default else mlflow_uri}: {_STORE_CHOICE}")


def run_publish_pending(args) -> dict:
    from picasso.serving.publishing.outbox import PublishOutbox  # MLflow: see run_apply_delta

    workdir = Path(args.workdir).resolve()
    target = MLflowTarget.for_workdir(workdir, args.mlflow_uri, args.experiment, args.model_name)
    outcomes = PublishOutbox(Workdir(str(workdir)).publish).flush(target, publish_policy(args))
    published = [o.version.version for o in outcomes if o.status == PUBLISHED]
    pending = [o.checkpoint_path for o in outcomes if o.status != PUBLISHED]
    return {"published": published, "pending": pending, "error": next((o.error for o in outcomes if o.error), None)}
