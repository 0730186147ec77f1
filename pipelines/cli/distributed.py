"""`picasso ps` (a parameter server of one or more shards) and `picasso gba-worker`.

    picasso ps --spec criteo --workdir ./gba --shards 2 --workers 4 --port 29500 --mode gba
    picasso gba-worker --port 29500 --rank 0 --rows 100000

The server starts from the latest checkpoint under WORKDIR/checkpoints (any mode's; a
fresh model when there is none) and, when every worker is done or dropped, writes one in
the Trainer's layout, which any mode resumes from. Workers get the spec, the TrainConfig
and the layout from shard 0, so they cannot disagree with the servers. Learning rates,
optimizers and the global batch (M local batches) are the same flags in every mode.

`add_ps_commands(subparsers)` registers both commands on the `picasso` command line;
`python -m picasso.pipelines.cli.distributed` runs them on their own.

Without --json they say what they do in plain lines on stderr, as it happens: where the
server listens, each worker that joins, leaves or is dropped (the server's log), each
checkpoint, and what a worker waits for. --json adds one summary line on stdout.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch.distributed as dist

from picasso.cache import parse_capacity
from picasso.checkpoint import read_applied, save_checkpoint
from picasso.distributed.gba import GBAConfig
from picasso.distributed.worker_startup import JoinSettings, join_job
from picasso.distributed.layout import SYNC_DYNAMIC
from picasso.distributed.param_server import JobDescription, ParameterServerError, ServerAddress, serve_shard
from picasso.distributed.ps_checkpoint import build_shard, save_ps_checkpoint
from picasso.distributed.row_cache import RowCacheConfig
from picasso.distributed.staleness import parse_decay
from picasso.distributed.sync import SyncReplica
from picasso.distributed.transport import Security
from picasso.pipelines.cli.endless import add_ps_endless_args, run_ps_endless
from picasso.pipelines.cli.metrics_args import add_metrics_arg
from picasso.pipelines.cli.parser import CommandParser
from picasso.pipelines.cli.process_exit import run_command
from picasso.pipelines.cli.spec_arg import add_spec_arg
from picasso.pipelines.cli.train_args import (MODEL_FLAGS, add_model_args, add_row_gradient_arg, flag_value,
                                              model_settings)
from picasso.connectors.synthetic.planted_batches import planted_batches, planted_source
from picasso.pipelines.runs.workdir import Workdir
from picasso.spec import SpecError
from picasso.spec_refs import load_spec
from picasso.trainer import TrainConfig, Trainer

# By name: run with `python -m` (a shard process, torchrun's ranks) __name__ is "__main__",
# outside the "picasso" loggers that say_progress lets speak.
log = logging.getLogger("picasso.pipelines.cli.distributed")
MODES = ("gba", "async")
COMMANDS = ("ps", "gba-worker", "sync-worker")  # each sets args.run


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


def _slowdown(args, rank: int) -> float:
    return args.straggler[1] if args.straggler and args.straggler[0] == rank else 1.0


def _trainer(args, sync: bool = False):
    """A Trainer of the flags' model, resumed from WORKDIR/checkpoints when it has one;
    returns (it, the checkpoints' root, the checkpoint resumed or None)."""
    try:
        spec = load_spec(args.spec)
    except SpecError as err:
        raise SystemExit(f"error: {err}") from None
    if sync and spec.dynamic_fields:
        raise SystemExit(f"error: {', '.join(f.name for f in spec.dynamic_fields)}: {SYNC_DYNAMIC}")
    # A sync rank's local batch (B is the ranks' sum); `picasso ps` has none: its workers say theirs.
    config = TrainConfig(**model_settings(args), seed=args.seed, log_every=0, device="cpu",
                         loss_batch_size=getattr(args, "batch_size", None))
    trainer = Trainer(spec, config)
    root = Path(Workdir(args.workdir).checkpoints)
    try:
        resumed = trainer.warm_start(root)
    except (RuntimeError, ValueError) as err:  # another spec, or a model of other shapes
        raise SystemExit(f"error: cannot resume from {root}: {err}") from None
    return trainer, root, resumed


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

    trainer, root, resumed = _trainer(args)
    spec, config = trainer.spec, trainer.config
    children = []
    if args.shard_index is None and args.shards > 1:
        children = [subprocess.Popen([sys.executable, "-m", "picasso.pipelines.cli.distributed", *_shard_argv(args, s)])
                    for s in range(1, args.shards)]
    # The ledger of source ranges trained goes on with the weights: a batch replayed after
    # the restart is acknowledged, not trained twice.
    applied = read_applied(resumed) if resumed is not None else None
    shard, layout = build_shard(trainer, index, args.shards, gba, args.samples, args.checkpoint_every, applied)
    summary = {"shard": index, "mode": args.mode, "global_batches": gba.global_batches, "decay": gba.decay.describe(),
               "row_gradient": gba.row_gradient}

    def checkpoint(snapshots, last: bool = False):
        path, state = save_ps_checkpoint(root, layout, snapshots, trainer, {"mode": args.mode})
        log.info("%scheckpoint at step %d (%d samples): %s", "last " if last else "", state["step"], state["samples"],
                 path)
        return path, state

    def write_checkpoint(snapshots, lost_workers) -> None:
        path, state = checkpoint(snapshots, last=True)
        summary.update(step=state["step"], samples=state["samples"], counts=snapshots[0].counts,
                       contributed=snapshots[0].contributed, positions=snapshots[0].positions, checkpoint=str(path),
                       dropped_workers=sorted(shard.control.dropped), lost_workers=lost_workers)

    description = JobDescription(spec, config, layout, args.lease)
    from picasso.pipelines.runs.run_metrics import ShardMetrics, serving_metrics

    try:
        with serving_metrics(args.metrics_port) as registry:  # this shard's; None: no --metrics-port
            if registry is not None:
                ShardMetrics(registry, shard)
            serve_shard(shard, address, args.workers, args.lease, description=description,
                        on_stop=write_checkpoint, on_checkpoint=checkpoint, num_shards=args.shards)
    except (ValueError, OSError, ParameterServerError) as err:  # a bad address or credentials, a shard that never came
        for child in children:
            child.terminate()
        raise SystemExit(f"error: {err}") from None
    failed = [c.args for c in children if c.wait() != 0]
    if failed:
        raise SystemExit(f"error: {len(failed)} shard process(es) failed")
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
    settings = JoinSettings(name=f"worker{args.rank}", max_in_flight=args.max_in_flight, row_cache=row_cache,
                            slowdown=_slowdown(args, args.rank), seed=args.rank, batch_size=args.batch_size)
    # At once: with no server yet, join_job waits for it, up to the timeout, with nothing to say.
    log.info("worker%d: joining the parameter server at %s:%d (waiting up to %g s for it to listen)", args.rank,
             address.host, address.port, address.timeout_s)
    try:
        joined = join_job(address, settings)
    except (ParameterServerError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    try:
        spec = joined.description.spec
        stream = args.stream_base + args.rank if args.stream is None else args.stream
        source = planted_source(stream)
        start = joined.positions().get(source, 0)  # resume where trained: a replacement reads on from there
        end = start + args.rows
        batches = planted_batches(spec, args.rows, args.batch_size, stream, start)

        def reread(positions: dict[str, int]):  # after a rejoin: on from what the model has
            at = positions.get(source, start)
            return planted_batches(spec, end - at, args.batch_size, stream, at)

        joined.start_line()
        began = time.time()  # wall clock: the benchmark spans every worker's run with it
        stats = joined.worker.train(batches, reread)
    except ParameterServerError as err:
        raise SystemExit(f"error: {err}") from None
    finally:
        joined.close()
    log.info("%s: done: %d batches, %d samples, mean loss %.4f", joined.name, stats.batches, stats.samples,
             stats.mean_loss)
    if args.json:
        client = joined.client
        saved = {f"row_cache_{k}": v for k, v in client.stats.as_metrics().items()} if row_cache else {}
        print(json.dumps({"worker": joined.name, "batches": stats.batches, "samples": stats.samples,
                          "mean_loss": stats.mean_loss, "refused": stats.refused, "duplicates": stats.duplicates,
                          "rejoined": stats.rejoined,
                          "mean_staleness": stats.mean_staleness, "seconds": stats.seconds, "start": start,
                          "began": began, "ended": began + stats.seconds, **saved}))
    return 0


def run_sync(args) -> int:
    say_progress()
    if "RANK" not in os.environ:
        raise SystemExit("error: sync-worker runs under torchrun (RANK, WORLD_SIZE and MASTER_ADDR unset)")
    trainer, root, _ = _trainer(args, sync=True)
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        replica = SyncReplica(trainer, rank, world, _slowdown(args, rank), args.row_gradient)
        stream = args.stream_base + rank if args.stream is None else args.stream
        start = trainer.positions.get(planted_source(stream), 0)  # resume where the checkpoint's training ends
        batches = planted_batches(trainer.spec, args.rows, args.batch_size, stream, start)

        def save(replica) -> None:  # the replicas are identical: rank 0 writes
            if rank == 0:
                _said(save_checkpoint(root, replica.state(), trainer.spec, replica.positions, {"mode": "sync"}))

        dist.barrier()  # every rank has its data: time the training alone, from a common start
        began = time.time()
        stats = replica.train(batches, args.checkpoint_every, save)
        seconds = time.time() - began
        state = replica.state()
        dist.barrier()  # every rank has taken its last step before rank 0 writes
        path = _said(save_checkpoint(root, state, trainer.spec, replica.positions, {"mode": "sync"}), "last ") \
            if rank == 0 else None
    finally:
        dist.destroy_process_group()
    if args.json:  # one write, so that the ranks' lines (torchrun merges their stdout) never interleave
        _print_line({"rank": rank, "world_size": world, "steps": stats.steps, "samples": stats.samples,
                     "mean_loss": stats.mean_loss, "seconds": seconds, "began": began, "ended": began + seconds,
                     "apply_s": stats.apply_s, "step_s": stats.seconds, "row_gradient": args.row_gradient,
                     "step": state["step"], "checkpoint": str(path) if path else None,
                     "state_hash": _state_hash(state["model"])})
    return 0


def _said(path, last: str = ""):
    log.info("%scheckpoint: %s", last, path)
    return path


def say_progress() -> None:
    """What the distributed commands say, as it happens: picasso's own log records (the
    server's joins, leaves and drops, the worker's steps, the checkpoints above), one plain
    line each on stderr; other libraries stay at warnings. A root logger set up with
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


def _state_hash(model_state: dict) -> str:
    """A digest of the model's tensors: replicas that agree bit for bit have the same one."""
    digest = hashlib.sha256()
    for key in sorted(model_state):
        digest.update(key.encode())
        digest.update(model_state[key].contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints every thread's stack: for a hung group
    parser = CommandParser(prog="picasso")
    add_ps_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    run_command(main)
