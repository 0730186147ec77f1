"""`picasso stream --endless`: what the endless job's flags refuse, and the run (the flags:
endless_args.py).

    picasso stream --endless --topic events --workdir ./stream           # a server of its own
    picasso stream --endless --topic events --ps ps-host:29500 ...       # a running `picasso ps --endless`

The rest of `picasso stream`'s flags (the topics, the spec, the model, publishing, and the
start: --warm-start, --start-at) mean what they mean for the cycle stream; those that only
bound a cycle stream are refused by name (pipelines/runs/endless.py says why the job has no
cycles). The start is made by the parameter server, where the workdir has no checkpoint
yet: with --ps, give --warm-start and --start-at to `picasso ps --endless` instead.
"""

from __future__ import annotations

import argparse
import dataclasses
from contextlib import ExitStack
import json

from picasso import storage
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.serving.publishing.contract import MLflowTarget
from picasso.distributed.gba import GBAConfig
from picasso.distributed.staleness import parse_decay
from picasso.distributed.transport import Security
from picasso.pipelines.cli.dead_letter_args import dead_letter_policy
from picasso.pipelines.cli.kafka_args import kafka_connection, stream_start, topic_formats
from picasso.pipelines.cli.health_args import health_limits
from picasso.pipelines.cli.publish_args import publish_policy
from picasso.pipelines.cli.train_args import model_settings
from picasso.pipelines.transforms.gba_train import PSAddress
from picasso.spec import SpecError
from picasso.spec_refs import load_spec
from picasso.train_config import TrainConfig

# A cycle stream's bounds: an endless job has no cycles to count, cap or end on.
BOUNDED_ONLY = {"until_caught_up": "--until-caught-up", "max_cycles": "--max-cycles",
                "max_cycle_messages": "--max-cycle-messages", "max_seconds": "--max-seconds",
                "max_failures": "--max-failures"}


def check_endless_args(args: argparse.Namespace) -> None:
    """Refuse, by name, what an endless job cannot do."""
    given = [flag for name, flag in BOUNDED_ONLY.items() if getattr(args, name)]
    if given:
        raise ValueError(f"{', '.join(given)}: only for a stream in cycles; an endless job runs until it is stopped "
                         "(SIGTERM or SIGINT)")
    if args.ps and (args.warm_start is not None or args.start_at != "earliest"):
        raise ValueError("--warm-start, --start-at with --ps: the parameter server makes the start; give them to "
                         "`picasso ps --endless` (with its --topic and --bootstrap-servers)")
    if args.impressions or args.labels:
        check_joined_endless(args)
    if str(args.cache_capacity).lower() not in ("off", "10%"):  # 10%: the cycle stream's default
        raise ValueError("--cache-capacity: an endless job's workers hold no tables (the server does)")


# The runners of this machine: the FnApiRunner fires a stateful DoFn's event-time timers at
# the end of every bundle whatever the watermark (FACTS.md), which would time every pending
# impression out at once; the DirectRunner sends a pipeline with timers to the
# BundleBasedDirectRunner, which cannot run the Kafka read (a splittable DoFn).
LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


def check_joined_endless(args: argparse.Namespace) -> None:
    """A joined endless job (--impressions, --labels) joins in Beam's keyed state with
    event-time timers (pipelines/runs/endless_joined.py): refuse, by name, what cannot run it."""
    if args.runner in LOCAL_RUNNERS:
        raise ValueError(f"--impressions/--labels with --endless join in Beam's keyed state with event-time timers, "
                         f"which --runner {args.runner} does not fire by the watermark: run it on a streaming runner "
                         "(DataflowRunner, FlinkRunner), or run the joined stream in cycles (without --endless)")
    arrow = [item for item in (args.impressions,) if item.partition(":")[2] == "arrow"]
    if arrow:
        raise ValueError(f"--impressions {arrow[0]}: an endless job trains each impression once under its message's "
                         "offset, so it reads one impression per message (json)")


def refuse_endless_only(args: argparse.Namespace) -> None:
    """Without --endless: refuse, by name, the flags only the endless job takes."""
    given = [flag for flag, value in (("--ps", args.ps), ("--ps-tls-ca", args.ps_tls_ca),
                                      ("--kafka-io", args.kafka_io != "picasso"),
                                      ("--expansion-service", args.expansion_service)) if value]
    if given:
        raise ValueError(f"{', '.join(given)}: only for the endless job (--endless)")


def beam_kafka_io(args: argparse.Namespace, connection):
    """--kafka-io beam's settings, checked before anything starts (None: picasso's own reader)."""
    if args.kafka_io != "beam":
        if args.expansion_service:
            raise ValueError("--expansion-service: only with --kafka-io beam")
        return None
    from picasso.connectors.beam_kafka_io import BeamKafkaIO, check_before_start  # Beam: for this reader only

    io = BeamKafkaIO(args.group_id, args.expansion_service)
    check_before_start(io, connection)
    return io


def endless_server_config(args, spec, topics: dict[str, str]):
    """The EndlessServerConfig the flags describe: `picasso stream --endless` (a server in its
    own process) and `picasso ps --endless` alike."""
    from picasso.pipelines.runs.endless_server import EndlessServerConfig  # MLflow: for this command only

    if args.checkpoint_every_s <= 0 or args.lease < 10:
        raise ValueError("--checkpoint-every-s must be positive and --lease at least 10 s")
    start = stream_start(args)  # its flags checked before any store is made
    workdir = storage.make_folder(args.workdir)
    target = None
    if args.publish_every > 0 or (start and start.registry):  # a registered warm start is looked up there
        target = MLflowTarget.for_workdir(workdir, args.mlflow_uri, args.experiment, args.model_name)
    return EndlessServerConfig(
        spec=spec, train=TrainConfig(**model_settings(args), device="cpu", seed=getattr(args, "seed", 0)),
        workdir=workdir, topics=topics, gba=GBAConfig(args.global_batches or 1, parse_decay(args.decay),
                                                          args.row_gradient),
        lease_s=args.lease, checkpoint_every_s=args.checkpoint_every_s, keep_checkpoints=args.keep_checkpoints,
        mlflow=target, publish_every_s=args.publish_every, publish_policy=publish_policy(args),
        health=health_limits(args), start=start, connection=kafka_connection(args) if topics else None,
        group_id=args.group_id, warm_start_target=target if start and start.registry else None)


def endless_config(args, topics: dict[str, str], connection, spec, joined=None):
    """The EndlessConfig the flags describe (the topics, connection and spec parsed as the
    cycle stream parses them)."""
    from picasso.pipelines.runs.endless import EndlessConfig  # Beam and MLflow: for this command only

    kafka_io = beam_kafka_io(args, connection)
    server, ps = None, None
    if args.ps:
        host, _, port = args.ps.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--ps {args.ps!r}: expected HOST:PORT")
        # The token is read by each worker from its environment, never carried in the graph.
        security = Security(tls_cert=args.ps_tls_ca, tls_server_name=args.ps_tls_server_name) \
            if args.ps_tls_ca else None
        ps = PSAddress(host, int(port), max_in_flight=1, security=security)
    else:
        server = endless_server_config(args, spec, topics)
        if joined is not None:  # the join's parameters go on the versions
            server = dataclasses.replace(server, joined=joined)
    return EndlessConfig(connection=connection, topics=topics, spec=spec, server=server, ps=ps,
                         decode=DecodeOptions(unknown_fields=args.unknown_fields),
                         dead_letters=dead_letter_policy(args), batch_messages=args.batch_messages,
                         runner=args.runner, beam_args=args.beam_args, backoff_s=args.backoff,
                         backoff_max_s=args.backoff_max, max_batch_delay_s=args.max_batch_delay, kafka_io=kafka_io,
                         joined=joined)


def run_endless_command(args, console, topics, connection, spec, joined=None) -> dict:
    """joined: a joined stream's JoinedTopics (--impressions, --labels); None: --topic."""
    from picasso.pipelines.runs.endless import run_endless  # Beam and MLflow: for this command only
    from picasso.pipelines.runs.stream import configure_determinism

    config = endless_config(args, topics, connection, spec, joined)
    configure_determinism(args.deterministic)
    where = f"the parameter server at {args.ps}" if args.ps else "a parameter server in this process"
    console.log(f"endless job: {', '.join(f'{t} ({f})' for t, f in topics.items())} from "
                f"{connection.bootstrap_servers}, training against {where}; SIGTERM or SIGINT stops it")
    from picasso.pipelines.runs.run_metrics import EndlessJobMetrics, EndlessServerMetrics, serving_metrics

    with ExitStack() as stack:
        registry = stack.enter_context(serving_metrics(args.metrics_port, console.log))  # None: no --metrics-port

        def watch(server, positions) -> None:
            # The server's metrics where it runs in this process (with --ps, `picasso ps
            # --endless --metrics-port` serves them); the reads' always.
            if server is not None:
                EndlessServerMetrics(registry, server)
            stack.callback(EndlessJobMetrics(registry, config.connection, config.topics, positions).close)

        summary = run_endless(config, watch=watch if registry is not None else None)
    return {"endless": True, "started_at": summary.started_at, "positions": summary.positions, "step": summary.step,
            "samples": summary.samples, "checkpoint": summary.checkpoint, "versions": summary.versions,
            "stopped": summary.stopped, "pushes": summary.pushes}


def run_ps_endless(args, address) -> int:
    """`picasso ps --endless`: serve until SIGTERM or SIGINT, then write the last checkpoint
    and publish it. address: the ServerAddress of the flags (host, port, TLS and token)."""
    from picasso.pipelines.runs.endless_server import EndlessServer  # MLflow: for this command only

    refused = [flag for flag, given in (("--shards", args.shards != 1), ("--shard-index", args.shard_index is not None),
                                        ("--samples", args.samples is not None),
                                        ("--checkpoint-every", args.checkpoint_every)) if given]
    if refused:
        raise SystemExit(f"error: {', '.join(refused)}: not with --endless (one shard, checkpoints on wall-clock "
                         "time, no sample budget)")
    try:
        server = EndlessServer(endless_server_config(args, load_spec(args.spec), topic_formats(args.topic)), address)
    except (SpecError, ValueError, FileNotFoundError) as err:  # a start it cannot make too
        raise SystemExit(f"error: {err}") from None
    from picasso.pipelines.runs.run_metrics import EndlessServerMetrics, serving_metrics

    with ExitStack() as stack:
        try:
            registry = stack.enter_context(serving_metrics(args.metrics_port))  # None: no --metrics-port
        except ValueError as err:  # the port is taken
            raise SystemExit(f"error: {err}") from None
        if registry is not None:
            EndlessServerMetrics(registry, server)
        server.serve_until_signalled()
    if args.json:
        model = server.model
        print(json.dumps({"endless": True, "positions": server.positions(), "step": model.trainer.step,
                          "samples": model.trainer.samples, "checkpoint": model.checkpoint,
                          "versions": server.versions}))
    return 0
