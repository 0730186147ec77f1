"""The publishing flags of the `picasso` command line: the publish policy's (daily, demo,
stream and the endless job), the MLflow target's, and the registry commands' (apply-delta,
publish-pending, promote, versions), whose runs are publish.py's and versions.py's.

MLflow-free, as every module that builds the parser (cli/main.py)."""

from __future__ import annotations

import argparse
import os

from picasso.connectors.retry import RetryPolicy
from picasso.serving.publishing.policy import PublishPolicy


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
    """apply-delta, publish-pending and promote (their runs: publish.py)."""
    apply = commands.add_parser(
        "apply-delta", help="rebuild a version's serving weights from the version before it plus its delta")
    apply.add_argument("--out", required=True, help="where the rebuilt weights.pt goes")
    apply.add_argument("--base", help="local weights of the base version (with --delta)")
    apply.add_argument("--delta", help="a local delta.pt (with --base)")
    apply.add_argument("--version", help="fetch the base weights and this version's delta from MLflow instead")
    apply.add_argument("--workdir", default=".", help="the run's work folder, whose MLflow store "
                       "(WORKDIR/mlflow.db) holds --version, unless --mlflow-uri names another (default: .)")
    add_target_args(apply)

    pending = commands.add_parser("publish-pending", help="publish the checkpoints waiting in WORKDIR/publish")
    pending.add_argument("--workdir", required=True)
    add_target_args(pending)
    add_publish_args(pending)

    promote = commands.add_parser(
        "promote", help="point the champion alias (or --alias) at a version: a promotion by hand, or a rollback")
    promote.add_argument("--version", required=True, help="the version the alias is to point at")
    promote.add_argument("--alias", default="champion", help="default: %(default)s")
    promote.add_argument("--workdir", default=".", help="the work folder whose MLflow store (WORKDIR/mlflow.db) holds "
                         "the model, unless --mlflow-uri names another (default: .)")
    add_target_args(promote)
    return [apply, pending, promote]


def add_versions_command(commands) -> argparse.ArgumentParser:
    """`picasso versions` (its run: versions.py)."""
    versions = commands.add_parser("versions", help="a model's chain of versions: each one's parent and what it "
                                                    "trained since (partitions, or a stream's offsets)")
    versions.add_argument("--from", dest="start", default="champion", metavar="VERSION|ALIAS",
                          help="where the chain starts (default: %(default)s)")
    versions.add_argument("--workdir", default=".", help="the work folder whose MLflow store (WORKDIR/mlflow.db) holds "
                          "the model, unless --mlflow-uri names another (default: .)")
    add_target_args(versions)
    return versions
