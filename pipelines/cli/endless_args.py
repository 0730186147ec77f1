"""The flags of the endless job: `picasso stream --endless` (a group of stream's flags) and
`picasso ps --endless` (its parameter server on its own). What they refuse, and the runs,
are endless.py's. Torch-, Beam- and MLflow-free, as every module that builds the parser
(cli/main.py)."""

from __future__ import annotations

import argparse

from picasso.pipelines.cli.health_args import add_health_args
from picasso.pipelines.cli.kafka_args import add_kafka_args, add_kafka_client_arg
from picasso.pipelines.cli.publish_args import add_publish_args, add_target_args
from picasso.pipelines.cli.train_args import add_row_gradient_arg


def add_endless_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "endless job", "one Beam pipeline that a streaming runner keeps running until SIGTERM or SIGINT; the model "
                       "lives in a parameter server, which checkpoints and publishes on wall-clock time")
    group.add_argument("--endless", action="store_true", help="run the endless job instead of cycles")
    group.add_argument("--ps", metavar="HOST:PORT", default=None,
                       help="train against this running `picasso ps --endless` (default: start one in this process "
                            "on loopback, stopped on exit)")
    group.add_argument("--ps-tls-ca", default=None, metavar="PEM",
                       help="--ps over TLS: the certificate (or its CA) to trust, at this path on every worker; the "
                            "token is each worker's $PICASSO_PS_TOKEN")
    group.add_argument("--ps-tls-server-name", default=None, help="the name in the server's certificate, when it "
                       "is not the host of --ps")
    group.add_argument("--checkpoint-every-s", type=float, default=30.0, metavar="SECONDS",
                       help="the server's checkpoints, in seconds of wall clock (default 30)")
    group.add_argument("--lease", type=float, default=30.0, metavar="SECONDS",
                       help="the server drops a worker silent this long (default 30)")
    group.add_argument("--global-batches", type=int, default=1, metavar="M",
                       help="local batches per global step (default 1: one worker steps at each push)")
    group.add_argument("--decay", default="exp", help="staleness decay of GBA (see `picasso ps --decay`)")
    add_row_gradient_arg(group)
    group.add_argument("--max-batch-delay", type=float, default=0.5, metavar="SECONDS",
                       help="train a batch short of --batch-messages once its oldest event has waited this long "
                            "(default 0.5: a slow stream's batch would otherwise wait to fill)")
    group.add_argument("--kafka-io", choices=["picasso", "beam"], default="picasso",
                       help="the Kafka reader: picasso's own (on --kafka-client, any runner; the default), or Beam's "
                            "cross-language ReadFromKafka (Java KafkaIO, for Dataflow and Flink), which starts where "
                            "the server's positions, committed to --group-id before the job is submitted, say")
    group.add_argument("--expansion-service", metavar="HOST:PORT", default=None,
                       help="--kafka-io beam: the expansion service that expands Beam's ReadFromKafka (default: Beam "
                            "starts its own, which needs Java and Beam's expansion-service jar)")


def add_ps_endless_args(ps: argparse.ArgumentParser) -> None:
    """`picasso ps --endless`: the endless job's server on its own (its workers elsewhere)."""
    group = ps.add_argument_group(
        "endless job", "serve the parameter server of an endless job (`picasso stream --endless --ps HOST:PORT`) "
                       "until SIGTERM or SIGINT: workers come and go, checkpoints and versions on wall-clock time")
    group.add_argument("--endless", action="store_true", help="serve an endless job (no --workers)")
    group.add_argument("--checkpoint-every-s", type=float, default=30.0, metavar="SECONDS",
                       help="seconds of wall clock between checkpoints (default 30)")
    group.add_argument("--keep-checkpoints", type=int, default=3)
    group.add_argument("--publish-every", type=float, default=300.0, help="seconds between model versions; 0: never")
    group.add_argument("--topic", action="append", default=[], metavar="TOPIC[:FORMAT]",
                       help="a topic the job reads (repeatable): its versions name it, and a --start-at other than "
                            "earliest finds its start offsets there")
    add_kafka_args(group)
    add_kafka_client_arg(group)
    group.add_argument("--group-id", default="picasso-stream", help="--start-at committed: the consumer group")
    group.add_argument("--warm-start", default=None, metavar="champion|latest|models:/NAME/N|PATH",
                       help="where WORKDIR has no checkpoint yet: the model to start from, as `picasso stream "
                            "--warm-start` (default: a new model)")
    group.add_argument("--start-at", default="earliest", metavar="earliest|latest|committed|TIMESTAMP|after-model",
                       help="where WORKDIR has no checkpoint yet: each partition's first offset, as `picasso stream "
                            "--start-at` (default: earliest)")
    add_target_args(group)
    add_publish_args(group)
    add_health_args(group)
