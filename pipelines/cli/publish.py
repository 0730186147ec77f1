"""The publishing side of the `picasso` command line: the publish-policy options shared by
`daily`, `demo` and `stream`, and the `apply-delta`, `publish-pending` and `promote`
commands."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from picasso.serving.publishing.local_store import sqlite_path
from picasso.serving.publishing.contract import PUBLISHED, MLflowTarget
from picasso.serving.publishing.policy import PublishPolicy
from picasso.connectors.retry import RetryPolicy
from picasso.pipelines.cli.output import CommandResult, reported, summary
from picasso.pipelines.runs.workdir import Workdir


def add_publish_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--promote-epsilon", type=float, default=0.005,
                        help="promote a version to champion when its AUC >= the champion's AUC - this")
    parser.add_argument("--no-auto-promote", action="store_true",
                        help="register versions as candidate only; promote by hand")
    parser.add_argument("--no-deltas", action="store_true", help="do not store each version's changed rows")
    parser.add_argument("--publish-attempts", type=int, default=5,
                        help="tries per publish (backoff 1 s doubling to 30 s) before it is left pending")


def publish_policy(args):
    return PublishPolicy(promote_epsilon=args.promote_epsilon, auto_promote=not args.no_auto_promote,
                         deltas=not args.no_deltas, retry=RetryPolicy(attempts=args.publish_attempts))


def add_target_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
                        help="default: $MLFLOW_TRACKING_URI, else sqlite:///WORKDIR/mlflow.db")
    parser.add_argument("--experiment", default="picasso")
    parser.add_argument("--model-name", default="picasso-ctr")


def add_publish_commands(commands) -> list[argparse.ArgumentParser]:
    apply = commands.add_parser(
        "apply-delta", help="rebuild a version's serving weights from the version before it plus its delta")
    apply.add_argument("--out", required=True, help="where the rebuilt weights.pt goes")
    apply.add_argument("--base", help="local weights of the base version (with --delta)")
    apply.add_argument("--delta", help="a local delta.pt (with --base)")
    apply.add_argument("--version", help="fetch the base weights and this version's delta from MLflow instead")
    apply.add_argument("--workdir", default=".", help="the run's work folder, whose MLflow store "
                       "(WORKDIR/mlflow.db) holds --version, unless --mlflow-uri names another (default: .)")
    add_target_args(apply)
    apply.set_defaults(run=reported(_apply_delta_command))

    pending = commands.add_parser("publish-pending", help="publish the checkpoints waiting in WORKDIR/publish")
    pending.add_argument("--workdir", required=True)
    add_target_args(pending)
    add_publish_args(pending)
    pending.set_defaults(run=reported(_publish_pending_command))

    promote = commands.add_parser(
        "promote", help="point the champion alias (or --alias) at a version: a promotion by hand, or a rollback")
    promote.add_argument("--version", required=True, help="the version the alias is to point at")
    promote.add_argument("--alias", default="champion", help="default: %(default)s")
    promote.add_argument("--workdir", default=".", help="the work folder whose MLflow store (WORKDIR/mlflow.db) holds "
                         "the model, unless --mlflow-uri names another (default: .)")
    add_target_args(promote)
    promote.set_defaults(run=reported(_promote_command))
    return [apply, pending, promote]


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
