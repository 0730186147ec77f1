"""The runs of `picasso daily` (one partition, or a range of them: cli/backfill.py) and
`picasso demo` (a generated day, then daily on embedded defaults); their flags are
daily_args.py's."""

from __future__ import annotations

from dataclasses import asdict, replace

from picasso import storage
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.serving.publishing.contract import MLflowTarget
from picasso.pipelines.cli.backfill import range_partitions, run_daily_range
from picasso.pipelines.cli.cache_args import cache_config, interleave_setting
from picasso.pipelines.cli.generate import generate_rows
from picasso.pipelines.cli.generate_args import DEMO_DATE
from picasso.pipelines.cli.health_args import health_limits
from picasso.pipelines.cli.output import CommandResult, console, print_warnings, reported, summary
from picasso.pipelines.cli.publish_args import publish_policy
from picasso.pipelines.cli.train_args import model_settings
from picasso.pipelines.runs.workdir import Workdir
from picasso.spec_refs import load_spec
from picasso.train_config import TrainConfig


def daily_config(args, data: str, date: str):
    """The DailyConfig the flags describe. It makes WORKDIR and names its MLflow target,
    and trains nothing. The target's store is made by the run's first call to MLflow (a
    publish, a champion's lookup), so that a partition which publishes nothing (too small
    to score, refused, only checkpointed in a range) never loads MLflow."""
    from picasso.pipelines.runs.daily import DailyConfig  # Beam's runners: for the run alone

    workdir = storage.make_folder(args.workdir)
    target = MLflowTarget.for_workdir(workdir, args.mlflow_uri, args.experiment, args.model_name, make_store=False)
    return DailyConfig(
        data_root=data,
        date=date,
        workdir=workdir,
        spec=load_spec(args.spec),
        mlflow=target,
        train=TrainConfig(
            **model_settings(args),
            device=args.device,
            cache=cache_config(args),
            interleave=interleave_setting(args),
        ),
        decode=DecodeOptions(unknown_fields=args.unknown_fields),
        batch_size=args.batch_size,
        holdout_fraction=args.holdout,
        eval_date=getattr(args, "eval_date", None) or None,  # "" (the MLproject default): a holdout slice
        warm_start=args.warm_start,
        force=args.force,
        policy=publish_policy(args),
        health=health_limits(args),
        runner=args.runner,
        beam_args=args.beam_args,
    )


def _daily_command(args) -> CommandResult:
    partitions = range_partitions(args)
    if partitions is not None:
        return run_daily_range(args, partitions, daily_config(args, args.data, partitions[0]), console)
    return _one_partition(args, args.data, args.date)


def _demo_command(args) -> CommandResult:
    data = Workdir(args.workdir).demo_data
    days = generate_rows(args, data, [DEMO_DATE])
    return _one_partition(args, data, DEMO_DATE, auc_ceiling=days[0].auc_ceiling)


def _one_partition(args, data: str, date: str, auc_ceiling: float | None = None) -> CommandResult:
    from picasso.pipelines.runs.daily import run_daily  # Beam and MLflow: see daily_config

    config = daily_config(args, data, date)
    with console.status(f"daily run for {date}: read, decode, pack, train, evaluate, publish"):
        result = run_daily(config)
    if result.auc_ceiling is None and auc_ceiling is not None:
        result = replace(result, auc_ceiling=auc_ceiling)
    output = {**asdict(result), "tracking_uri": config.mlflow.tracking_uri}
    summary(f"daily {result.date}" + (" (done before: nothing trained)" if result.skipped else ""),
            {k: v for k, v in output.items() if k not in ("counters", "warnings")})
    print_warnings(result)
    if result.refused:
        return CommandResult(output, stopped=refusal(result))
    if result.not_evaluated:
        console.print(f"{result.date}: trained and done, {result.not_evaluated}: no version made; the next "
                      "version covers it", soft_wrap=True)
    return CommandResult(output, pending=result.status not in ("published", "not_evaluated"))


# The commands' runs (cli/command_runs.py calls them): each ends as cli/output.py says.
daily_command = reported(_daily_command)
demo_command = reported(_demo_command)


def refusal(result) -> str:
    """Why the gate refused a partition, in one line, and what follows from it."""
    return (f"{result.date} refused: {result.refused}. Nothing was published and the partition is not done: "
            "fix the data or the spec and run it again")
