"""`picasso ps` (a parameter server of one or more shards), `picasso gba-worker` and
`picasso sync-worker`: their flags, and what they print. Each parses its flags into the
settings of its run, in pipelines/runs/ (param_server.py, gba_worker.py, sync_worker.py,
sharing distributed_job.py), and calls it.

    picasso ps --spec criteo --workdir ./gba --shards 2 --workers 4 --port 29500 --mode gba
    picasso gba-worker --port 29500 --rank 0 --rows 100000

Learning rates, optimizers and the global batch (M local batches) are the same flags in
every mode, and mean the same in each.

`add_ps_commands(subparsers)` registers the three commands on the `picasso` command line;
`python -m picasso.pipelines.cli.distributed` runs them on their own (as `picasso ps`
starts its other shards, and torchrun the ranks of sync-worker).

Without --json they say what they do in plain lines on stderr, as it happens: where the
server listens, each worker that joins, leaves or is dropped (the server's log), each
checkpoint, and what a worker waits for. --json adds one summary line on stdout.
"""

from __future__ import annotations

import argparse
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
from picasso.pipelines.cli.endless import add_ps_endless_args, run_ps_endless
from picasso.pipelines.cli.metrics_args import add_metrics_arg
from picasso.pipelines.cli.parser import CommandParser
from picasso.pipelines.cli.process_exit import run_command
from picasso.pipelines.cli.spec_arg import add_spec_arg
from picasso.pipelines.cli.train_args import (MODEL_FLAGS, add_model_args, add_row_gradient_arg, flag_value,
                                              model_settings)
from picasso.pipelines.runs.distributed_job import PlantedData, RunError
from picasso.pipelines.runs.gba_worker import GBAWorkerSettings, run_gba_worker
from picasso.pipelines.runs.param_server import ParamServerSettings, run_param_server
from picasso.pipelines.runs.sync_worker import SyncWorkerSettings, run_sync_worker
from picasso.spec import FeatureSpec, SpecError
from picasso.spec_refs import load_spec
from picasso.trainer import TrainConfig

MODES = ("gba", "async")  # picasso ps --mode: how its shards step (_gba_config)


def _add_group_args(parser: argparse.ArgumentParser, server: bool) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="where shard 0 listens (shard s on PORT + s); a host "
                        "other than loopback needs --tls-cert, --tls-key and $PICASSO_PS_TOKEN" if server else
                        "where shard 0 listens")
    parser.add_argument("--port", type=int, required=True)
    if server:
        parser.add_argument("--shards", type=int, default=1, help="parameter-server shards")
        parser.add_argument("--workers", type=int, default=None,
                            help="the job's workers: it ends when worker0..worker{N-1} (and any extra) are done "
                                 "(not with --endless, whose workers come and go)")
        parser.add_argument("--tls-cert", default=None, help="PEM certificate the server presents")
        parser.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    else:
        parser.add_argument("--tls-ca", default=None, help="PEM certificate (or its CA) to trust: the server's TLS")
        parser.add_argument("--tls-server-name", default=None, help="the name in the server's certificate, when "
                            "it is not --host")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds per call, and to find the server" + (" (and for an expected worker to join)"
                                                                          if server else ""))
    parser.add_argument("--json", action="store_true", help="print one JSON summary as the last line")


def add_ps_commands(commands) -> None:
    ps = commands.add_parser("ps", help="serve parameter-server shards for GBA or plain async workers")
    add_spec_arg(ps, required=True)
    ps.add_argument("--workdir", required=True, help="checkpoints are read from and written to WORKDIR/checkpoints")
    _add_checkpoint_every(ps)
    ps.add_argument("--mode", choices=MODES, default="gba", help="gba: global batches with token control; "
                    "async: every push steps at once, no staleness control (the baseline)")
    ps.add_argument("--global-batches", type=int, default=None,
                    help="M, local batches per global step: sync's worker count (default: --workers)")
    ps.add_argument("--decay", default="exp", help="staleness decay: 'exp' (default: exp:tau_max=2,"
                    "half_life=1,limit=8), 'exp:tau_max=..,half_life=..,limit=..|none' or 'none'")
    ps.add_argument("--samples", type=int, default=None, help="stop the workers once this many samples are "
                    "counted (fast workers then take more batches than a straggler); default: each its --rows")
    ps.add_argument("--lease", type=float, default=30.0, help="drop a worker silent for this many seconds")
    ps.add_argument("--shard-index", type=int, default=None,
                    help="serve only this shard (one process per shard, e.g. across hosts); "
                    "default: this process serves shard 0 and starts the others")
    _add_model_args(ps)
    add_row_gradient_arg(ps)
    _add_group_args(ps, server=True)
    add_ps_endless_args(ps)
    add_metrics_arg(ps)
    ps.set_defaults(run=run_ps)

    worker = commands.add_parser("gba-worker", help="train as one worker against `picasso ps` on planted data")
    worker.add_argument("--rank", type=int, required=True, help="joins as worker<RANK> (a replacement takes the "
                        "rank of the one it replaces); it reads planted stream STREAM_BASE + RANK")
    _add_data_args(worker)
    worker.add_argument("--max-in-flight", type=int, default=2, help="pushes per shard not yet answered "
                        "before the worker waits (0: wait for each: deterministic runs)")
    worker.add_argument("--row-cache", default="off", metavar="CAPACITY",
                        help="keep the hottest rows of each table here and serve their pulls locally: rows "
                        "(50000), bytes (64MiB) or a share of the table (10%%); off (default): pull every row")
    worker.add_argument("--row-cache-staleness", type=int, default=2, metavar="STEPS",
                        help="global steps a row served from the row cache may lag the server")
    _add_group_args(worker, server=False)
    worker.set_defaults(run=run_worker)

    sync = commands.add_parser("sync-worker", help="one rank of sync training; launch N with "
                               "torchrun --nproc-per-node N -m picasso.pipelines.cli.distributed sync-worker ...")
    add_spec_arg(sync, required=True)
    sync.add_argument("--workdir", required=True, help="checkpoints are read from and written to WORKDIR/checkpoints")
    _add_checkpoint_every(sync)
    _add_model_args(sync)
    add_row_gradient_arg(sync)
    _add_data_args(sync)
    sync.add_argument("--json", action="store_true", help="print one JSON summary as the last line")
    sync.set_defaults(run=run_sync)


def _add_checkpoint_every(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                        help="also write a checkpoint (with the sources' positions) every STEPS global steps "
                        "while training (default 0: only at the end)")


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    """The model and its hyper-parameters: the same flags, and values, in every mode."""
    add_model_args(parser)
    parser.add_argument("--seed", type=int, default=0)


def _add_data_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--straggler", type=parse_straggler, default=None, metavar="RANK:FACTOR",
                        help="make worker RANK compute FACTOR times slower (injected, for benchmarks)")
    parser.add_argument("--rows", type=int, default=100_000, help="planted rows to train on")
    parser.add_argument("--batch-size", type=int, default=512, help="the local batch")
    parser.add_argument("--stream", type=int, default=None, help="planted data stream (default: STREAM_BASE + rank)")
    parser.add_argument("--stream-base", type=int, default=100, help="each rank's stream is this + its rank")


def parse_straggler(text: str) -> tuple[int, float]:
    rank, sep, factor = text.partition(":")
    try:
        parsed = int(rank), float(factor)
    except ValueError:
        parsed = None
    if not sep or parsed is None or parsed[0] < 0 or not parsed[1] >= 1.0:
        raise argparse.ArgumentTypeError(f"--straggler takes RANK:FACTOR with RANK >= 0 and FACTOR >= 1, got {text!r}")
    return parsed


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


def main(argv: list[str] | None = None) -> int:
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints every thread's stack: for a hung group
    serve_urls_through_beam()  # a shard's workdir and checkpoints may be URLs (picasso.storage)
    parser = CommandParser(prog="picasso")
    add_ps_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    run_command(main)
