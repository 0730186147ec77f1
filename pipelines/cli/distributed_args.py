"""The flags of `picasso ps`, `picasso gba-worker` and `picasso sync-worker`; their runs are
distributed.py's (which `python -m picasso.pipelines.cli.distributed` runs on their own).
Torch-free, as every module that builds the parser (cli/main.py)."""

from __future__ import annotations

import argparse

from picasso.pipelines.cli.endless_args import add_ps_endless_args
from picasso.pipelines.cli.metrics_args import add_metrics_arg
from picasso.pipelines.cli.spec_arg import add_spec_arg
from picasso.pipelines.cli.train_args import add_model_args, add_row_gradient_arg

MODES = ("gba", "async")  # picasso ps --mode: how its shards step (distributed.py: _gba_config)


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

    sync = commands.add_parser("sync-worker", help="one rank of sync training; launch N with "
                               "torchrun --nproc-per-node N -m picasso.pipelines.cli.distributed sync-worker ...")
    add_spec_arg(sync, required=True)
    sync.add_argument("--workdir", required=True, help="checkpoints are read from and written to WORKDIR/checkpoints")
    _add_checkpoint_every(sync)
    _add_model_args(sync)
    add_row_gradient_arg(sync)
    _add_data_args(sync)
    sync.add_argument("--json", action="store_true", help="print one JSON summary as the last line")


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
