"""`picasso ps` (a parameter server of one or more shards), `picasso gba-worker` and
`picasso sync-worker`: their runs, and what they print (their flags: distributed_args.py).
Each turns its flags into the settings of its run, in pipelines/runs/ (param_server.py, gba_worker.py, sync_worker.py,
sharing distributed_job.py), and calls it.

    picasso ps --spec criteo --workdir ./gba --shards 2 --workers 4 --port 29500 --mode gba
    picasso gba-worker --port 29500 --rank 0 --rows 100000

Learning rates, optimizers and the global batch (M local batches) are the same flags in
every mode, and mean the same in each.

`distributed_args.add_ps_commands(subparsers)` registers the three commands on the `picasso`
command line, which runs them through cli/command_runs.py; `python -m
picasso.pipelines.cli.distributed` runs them on their own (as `picasso ps` starts its other
shards, and torchrun the ranks of sync-worker), with RUNS.

Without --json they say what they do in plain lines on stderr, as it happens: where the
server listens, each worker that joins, leaves or is dropped (the server's log), each
checkpoint, and what a worker waits for. --json adds one summary line on stdout.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import sys

from picasso.cache import parse_capacity
from picasso.connectors.beam_urls import serve_urls_through_beam
from picasso.distributed.gba import GBAConfig
from picasso.distributed.param_server import ServerAddress
from picasso.distributed.row_cache import RowCacheConfig
from picasso.distributed.staleness import parse_decay
from picasso.distributed.transport import Security
from picasso.pipelines.cli.distributed_args import add_ps_commands
from picasso.pipelines.cli.endless import run_ps_endless
from picasso.pipelines.cli.parser import CommandParser
from picasso.pipelines.cli.process_exit import run_command
from picasso.pipelines.cli.train_args import MODEL_FLAGS, flag_value, model_settings
from picasso.pipelines.runs.distributed_job import PlantedData, RunError
from picasso.pipelines.runs.gba_worker import GBAWorkerSettings, run_gba_worker
from picasso.pipelines.runs.param_server import ParamServerSettings, run_param_server
from picasso.pipelines.runs.sync_worker import SyncWorkerSettings, run_sync_worker
from picasso.spec import FeatureSpec, SpecError
from picasso.spec_refs import load_spec
from picasso.train_config import TrainConfig

def _planted_data(args) -> PlantedData:
    return PlantedData(rows=args.rows, batch_size=args.batch_size, stream=args.stream, stream_base=args.stream_base,
                       straggler=args.straggler)


def _spec(args) -> FeatureSpec:
    try:
        return load_spec(args.spec)
    except SpecError as err:
        raise SystemExit(f"error: {err}") from None


def _train_config(args) -> TrainConfig:
    """The flags' model. A sync rank's local batch (B is the ranks' sum); `picasso ps` has
    none: its workers say theirs."""
    return TrainConfig(**model_settings(args), seed=args.seed, log_every=0, device="cpu",
                       loss_batch_size=getattr(args, "batch_size", None))


def _run(run, settings):
    """What the run returns; a RunError, which the operator can act on, as one error line."""
    try:
        return run(settings)
    except RunError as err:
        raise SystemExit(f"error: {err}") from None


def _address(args, server: bool):
    """Where shard 0 is, and the credentials: TLS files from the flags, the token from
    $PICASSO_PS_TOKEN (never a flag: command lines are visible to every local user)."""
    if server and (args.shards < 1 or (args.workers is not None and args.workers < 1)):
        raise SystemExit(f"error: --shards and --workers must be >= 1 (got {args.shards}, {args.workers})")
    tls = dict(tls_cert=args.tls_cert, tls_key=args.tls_key) if server else \
        dict(tls_cert=args.tls_ca, tls_server_name=args.tls_server_name)
    return ServerAddress(args.host, args.port, args.timeout, Security.from_env(**tls))


def _gba_config(args):
    if args.mode == "async":
        return GBAConfig.plain_async()
    try:
        m = args.workers if args.global_batches is None else args.global_batches
        return GBAConfig(m, parse_decay(args.decay), args.row_gradient)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None


def run_ps(args) -> int:
    say_progress()
    if args.endless:
        if args.workers is not None:
            raise SystemExit("error: --workers: an endless job's workers come and go (no count)")
        return run_ps_endless(args, _address(args, server=True))
    if args.workers is None:
        raise SystemExit("error: --workers is required (the job ends when they are done), unless --endless")
    address, gba = _address(args, server=True), _gba_config(args)
    index = args.shard_index or 0
    if not 0 <= index < args.shards:
        raise SystemExit(f"error: --shard-index {index} outside [0, {args.shards})")
    # Without --shard-index this process serves shard 0 and starts the others.
    others = () if args.shard_index is not None else tuple(
        (sys.executable, "-m", "picasso.pipelines.cli.distributed", *_shard_argv(args, s))
        for s in range(1, args.shards))
    settings = ParamServerSettings(
        spec=_spec(args), config=_train_config(args), workdir=args.workdir, address=address, gba=gba, mode=args.mode,
        workers=args.workers, shards=args.shards, shard_index=index, lease_s=args.lease, samples=args.samples,
        checkpoint_every=args.checkpoint_every, metrics_port=args.metrics_port, shard_commands=others)
    summary = _run(run_param_server, settings)
    if args.json:
        print(json.dumps(summary))
    return 0


def _shard_argv(args, index: int) -> list[str]:
    """The command line of shard `index`: this one's flags, that shard's index."""
    argv = ["ps", "--shard-index", str(index)]
    for flag in ("spec", "workdir", "mode", "global_batches", "decay", "row_gradient", "samples", "lease", *MODEL_FLAGS,
                 "seed",
                 "host", "port", "shards", "workers", "timeout", "checkpoint_every", "tls_cert", "tls_key"):
        value = getattr(args, flag)
        if value is not None:
            argv += ["--" + flag.replace("_", "-"), flag_value(flag, value)]
    return argv


def run_worker(args) -> int:
    say_progress()
    address = _address(args, server=False)
    if args.rank < 0:
        raise SystemExit(f"error: --rank must be >= 0, got {args.rank}")
    try:  # a bad setting fails here, before the worker joins
        row_cache = None if args.row_cache == "off" else RowCacheConfig(capacity=args.row_cache,
                                                                          max_staleness=args.row_cache_staleness)
        if row_cache is not None:
            parse_capacity(row_cache.capacity, num_rows=1, row_bytes=1)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    settings = GBAWorkerSettings(address, args.rank, _planted_data(args), max_in_flight=args.max_in_flight,
                                 row_cache=row_cache)
    summary = _run(run_gba_worker, settings)
    if args.json:
        print(json.dumps(summary))
    return 0


def run_sync(args) -> int:
    say_progress()
    settings = SyncWorkerSettings(_spec(args), _train_config(args), args.workdir, _planted_data(args),
                                  row_gradient=args.row_gradient, checkpoint_every=args.checkpoint_every)
    result = _run(run_sync_worker, settings)
    if args.json:  # one write, so that the ranks' lines (torchrun merges their stdout) never interleave
        _print_line(result.summary())
    return 0


def say_progress() -> None:
    """What the distributed commands say, as it happens: picasso's own log records (the
    server's joins, leaves and drops, the worker's steps, the checkpoints the runs write),
    one plain line each on stderr; other libraries stay at warnings. A root logger set up with
    logging's defaults (Beam's import does it, logging its apitools notice through
    logging.warning: cli/noise.py) gets the plain format; one set up otherwise (a test's
    capture, an embedding program) is left as it is."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(format="%(message)s")
    for handler in root.handlers:
        # "LEVEL:name:message", logging's default: a setting nobody chose.
        if handler.formatter is not None and handler.formatter._fmt == logging.BASIC_FORMAT:
            handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("picasso").setLevel(logging.INFO)


def _print_line(summary: dict) -> None:
    sys.stdout.write(json.dumps(summary) + "\n")
    sys.stdout.flush()


# Each command's run, by name: main's, and cli/command_runs.py's on the `picasso` command line.
RUNS = {"ps": run_ps, "gba-worker": run_worker, "sync-worker": run_sync}


def main(argv: list[str] | None = None) -> int:
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints every thread's stack: for a hung group
    serve_urls_through_beam()  # a shard's workdir and checkpoints may be URLs (picasso.storage)
    parser = CommandParser(prog="picasso")
    commands = parser.add_subparsers(dest="command", required=True)
    add_ps_commands(commands)
    for name, command in commands.choices.items():
        command.set_defaults(run=RUNS[name])
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    run_command(main)
