"""Every `picasso` command's run, by name (RUNS), each importing its command's module when
the command runs, not when the parser is built.

The parser (cli/main.py) is made of the commands' flags alone (the *_args.py modules,
broker.py and serve.py), which import neither torch, Beam nor MLflow: seconds of start-up
that `picasso --version`, every --help and a mistyped flag would otherwise pay, as would
every command for the others' libraries. A command's run module loads what it runs with
(daily: torch and Beam; apply-delta: MLflow), and nothing another command needs.

Only main imports this module: the runs import the flag modules (for the values of their
flags), which must therefore not import the runs.
"""

from __future__ import annotations

from picasso.pipelines.cli.broker import run_broker  # light: its run imports the broker's client
from picasso.pipelines.cli.serve import run_serve  # light: its run imports MLflow and the server


def generate(args) -> int:
    from picasso.pipelines.cli.generate import generate_command  # the synthetic data: numpy, torch's hashing

    return generate_command(args)


def plan(args) -> int:
    from picasso.pipelines.cli.generate import plan_command  # the spec's packing: torch's kernels

    return plan_command(args)


def daily(args) -> int:
    from picasso.pipelines.cli.daily import daily_command  # the pipeline: torch, Beam

    return daily_command(args)


def demo(args) -> int:
    from picasso.pipelines.cli.daily import demo_command  # as daily

    return demo_command(args)


def apply_delta(args) -> int:
    from picasso.pipelines.cli.publish import apply_delta_command  # the registry: MLflow, when it runs

    return apply_delta_command(args)


def publish_pending(args) -> int:
    from picasso.pipelines.cli.publish import publish_pending_command  # as apply_delta

    return publish_pending_command(args)


def promote(args) -> int:
    from picasso.pipelines.cli.publish import promote_command  # as apply_delta

    return promote_command(args)


def versions(args) -> int:
    from picasso.pipelines.cli.versions import versions_command  # as apply_delta

    return versions_command(args)


def stream(args) -> int:
    from picasso.pipelines.cli.stream import stream_command  # the stream's pipeline: Kafka, torch, Beam

    return stream_command(args)


def produce(args) -> int:
    from picasso.pipelines.cli.stream import produce_command  # Kafka's producer and the day files

    return produce_command(args)


def ps(args) -> int:
    from picasso.pipelines.cli.distributed import run_ps  # the shards: torch, gRPC

    return run_ps(args)


def gba_worker(args) -> int:
    from picasso.pipelines.cli.distributed import run_worker  # as ps

    return run_worker(args)


def sync_worker(args) -> int:
    from picasso.pipelines.cli.distributed import run_sync  # as ps

    return run_sync(args)


RUNS = {"generate": generate, "plan": plan, "daily": daily, "demo": demo, "apply-delta": apply_delta,
        "publish-pending": publish_pending, "promote": promote, "versions": versions, "stream": stream,
        "produce": produce, "ps": ps, "gba-worker": gba_worker, "sync-worker": sync_worker, "broker": run_broker,
        "serve": run_serve}
