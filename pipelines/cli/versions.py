"""`picasso versions`: a model's chain of versions, from the champion (or --from) back to the
model trained from scratch: each version's aliases, what it trained since its parent (its
partitions, or a stream's offsets), its parent and its AUC. Its flags: publish_args.py."""

from __future__ import annotations

import datetime as dt

from rich.table import Table

from picasso.pipelines.cli.output import CommandResult, console, reported
from picasso.pipelines.cli.publish import existing_store


def _versions_command(args) -> CommandResult:
    output = run_versions(args)
    table = Table(title=f"{output['model_name']}: from {args.start} back to its first version")
    for column in ("version", "aliases", "trained since its parent", "parent", "auc", "created (UTC)"):
        table.add_column(column)
    for link in output["chain"]:
        name = link["version"] if link["model_name"] == output["model_name"] else f"{link['model_name']}/{link['version']}"
        auc = "" if link["auc"] is None else f"{link['auc']:.4f} ({link['evaluation']})"
        created = dt.datetime.fromtimestamp(link["created_ms"] / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(name, ", ".join(link["aliases"]), link["origin"], link["parent"], auc, created)
    console.print(table)
    return CommandResult(output)


versions_command = reported(_versions_command)  # the command's run (cli/command_runs.py)


def run_versions(args) -> dict:
    from dataclasses import asdict

    from picasso.serving.publishing.registry import client_for  # MLflow: see publish.run_apply_delta
    from picasso.serving.publishing.version_chain import version_chain

    target = existing_store(args)
    chain = version_chain(client_for(target), target.model_name, args.start)
    return {"model_name": target.model_name, "from": args.start, "chain": [asdict(link) for link in chain]}
