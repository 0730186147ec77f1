"""The flags of `picasso stream` (in cycles, or the endless job: endless_args.py) and
`picasso produce`; their runs are stream.py's. Torch-, Beam- and MLflow-free, as every
module that builds the parser (cli/main.py)."""

from __future__ import annotations

import argparse
import os

from picasso.durations import duration_arg
from picasso.pipelines.cli.beam_options import add_pipeline_command
from picasso.pipelines.cli.cache_args import add_cache_args
from picasso.pipelines.cli.dead_letter_args import add_dead_letter_args
from picasso.pipelines.cli.endless_args import add_endless_args
from picasso.pipelines.cli.health_args import add_health_args
from picasso.pipelines.cli.kafka_args import add_kafka_args, add_kafka_client_arg
from picasso.pipelines.cli.metrics_args import add_metrics_arg
from picasso.pipelines.cli.produce_progress import PERIOD_S
from picasso.pipelines.cli.publish_args import add_publish_args
from picasso.pipelines.cli.spec_arg import add_spec_arg
from picasso.pipelines.cli.train_args import add_model_args
from picasso.sample_join.join_policy import LATE_LABEL_POLICIES


def add_stream_parser(commands) -> argparse.ArgumentParser:
    stream = add_pipeline_command(commands, "stream",
                                  help="train continuously from Kafka topics; publish versions as it goes")
    add_spec_arg(stream, default="criteo")
    stream.add_argument("--topic", action="append", default=[], metavar="TOPIC[:FORMAT]",
                        help="a topic of labelled events and its message format (json, arrow or tsv; default json); "
                             "repeatable")
    joined = stream.add_argument_group(
        "joined streams", "impressions and their labels on two topics, joined into samples before training; the "
                          "label events' fields and the defaults below come from the spec's `join:` section")
    joined.add_argument("--impressions", metavar="TOPIC[:FORMAT]", help="the impression topic (json or arrow)")
    joined.add_argument("--labels", metavar="TOPIC[:FORMAT]", help="the label topic (json or arrow)")
    joined.add_argument("--join-key", metavar="FIELD[,FIELD]", help="the fields that pair a label with its impression")
    joined.add_argument("--label-wait", type=duration_arg, metavar="DURATION",
                        help="how long an impression waits for its label, in event time (e.g. 15m)")
    joined.add_argument("--late-labels", choices=LATE_LABEL_POLICIES,
                        help="a label after its impression became a negative: drop it (counted), or correct: "
                             "train the impression again as a positive, with loss weights")
    joined.add_argument("--allowed-lateness", type=duration_arg, metavar="DURATION",
                        help="how far the watermark trails the partitions' newest event time")
    stream.add_argument("--workdir", required=True, help="checkpoints and the published-version log go here")
    add_kafka_args(stream)
    add_kafka_client_arg(stream)
    stream.add_argument("--group-id", default="picasso-stream", help="consumer group the positions are committed to")
    start = stream.add_argument_group(
        "start", "how a stream whose --workdir has no checkpoint yet begins; once it has one, it goes on from there "
                 "and these are not looked at again")
    start.add_argument("--warm-start", default=None, metavar="champion|latest|models:/NAME/N|PATH",
                       help="the model to start from: the champion or newest version of --model-name in --mlflow-uri "
                            "(a backfill's), a registered version (models:/NAME/N or models:/NAME@ALIAS), or a "
                            "checkpoint or folder of checkpoints; restored from its checkpoint, optimizer state too "
                            "(default: a new model)")
    start.add_argument("--start-at", default="earliest", metavar="earliest|latest|committed|TIMESTAMP|after-model",
                       help="each partition's first offset: its earliest (the default), its end now, --group-id's "
                            "committed offset, the first message stamped at or after TIMESTAMP (ISO 8601, UTC unless "
                            "it says; or epoch ms), or the first after the --warm-start model's newest event")
    add_dead_letter_args(stream)
    stream.add_argument("--batch-messages", type=int, default=1000, help="messages per training batch")
    stream.add_argument("--max-cycle-messages", type=int, default=None, help="per partition and cycle")
    stream.add_argument("--publish-every", type=float, default=300.0, help="seconds between model versions; 0: never")
    stream.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
                        help="default: $MLFLOW_TRACKING_URI, else sqlite:///WORKDIR/mlflow.db")
    stream.add_argument("--experiment", default="picasso")
    stream.add_argument("--model-name", default="picasso-ctr")
    add_model_args(stream)
    stream.add_argument("--unknown-fields", choices=["ignore", "reject"], default="ignore")
    stream.add_argument("--device", default="auto")
    add_cache_args(stream, interleave=False)  # a stream cycle trains batch by batch
    stream.add_argument("--runner", default="FnApiRunner")
    stream.add_argument("--deterministic", action="store_true", help="one thread, deterministic kernels")
    stream.add_argument("--backoff", type=float, default=1.0, help="first retry delay after a failed cycle (s)")
    stream.add_argument("--backoff-max", type=float, default=30.0)
    stream.add_argument("--stall-timeout", type=float, default=30.0, help="fail a cycle whose fetch stalls this long")
    stream.add_argument("--idle-sleep", type=float, default=1.0, help="seconds between checks when caught up")
    stream.add_argument("--keep-checkpoints", type=int, default=3)
    stream.add_argument("--until-caught-up", action="store_true", help="exit once no message is left to train on")
    stream.add_argument("--max-cycles", type=int, default=None, help="0: no limit")
    stream.add_argument("--max-seconds", type=float, default=None, help="0: no limit")
    stream.add_argument("--max-failures", type=int, default=None, help="consecutive failed cycles before exiting")
    stream.add_argument("--wait-for-topic", action="store_true",
                        help="a topic that does not exist yet is waited for (said once) rather than an error (exit 2)")
    add_publish_args(stream)
    add_health_args(stream)
    add_endless_args(stream)
    add_metrics_arg(stream)
    stream.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    return stream


def _seconds_arg(least: float, above: bool = False):
    """An argparse type: a number of seconds >= least (> least with above)."""

    def seconds(text: str) -> float:
        value = float(text)
        if not (value > least if above else value >= least):
            raise argparse.ArgumentTypeError(f"{text}: seconds must be {'>' if above else '>='} {least:g}")
        return value

    return seconds


def add_produce_parser(commands) -> argparse.ArgumentParser:
    produce = commands.add_parser("produce", help="replay day files into a Kafka topic at a given rate, or generated "
                                                  "impressions and clicks into two topics in event time")
    produce.add_argument("--data", required=True, help="root of the date=YYYY-MM-DD partitions (for a joined replay: "
                                                       "the root `picasso generate --events` wrote)")
    produce.add_argument("--date", action="append", required=True, help="a date to replay; repeatable")
    produce.add_argument("--topic", default=None, help="the topic of a single-topic replay")
    produce.add_argument("--format", choices=["json", "arrow", "tsv"], default="json")
    produce.add_argument("--rows-per-message", type=int, default=1000, help="Arrow IPC messages only")
    produce.add_argument("--rate", type=float, default=0.0, help="events per second; 0: as fast as possible")
    produce.add_argument("--partitions", type=int, default=1, help="when the topic has to be created")
    produce.add_argument("--max-records", type=int, default=None)
    joined = produce.add_argument_group(
        "joined replay", "the impressions and clicks of `picasso generate --events`, merged in event time into two "
                         "topics as JSON events, each message's timestamp its event_time_ms")
    joined.add_argument("--impressions-topic", default=None, metavar="TOPIC")
    joined.add_argument("--labels-topic", default=None, metavar="TOPIC")
    joined.add_argument("--speedup", type=float, default=None, metavar="S",
                        help="event time runs S times faster than the wall clock (3600: an hour a second); "
                             "0: as fast as possible (default)")
    add_kafka_args(produce)
    produce.add_argument("--broker-timeout-s", type=_seconds_arg(0), default=60.0, metavar="SECONDS",
                         help="how long to wait for a Kafka broker to answer, one line a retry, before exiting with "
                              "status 2 (default 60)")
    produce.add_argument("--progress-every", type=_seconds_arg(0, above=True), default=PERIOD_S, metavar="SECONDS",
                         help=f"a progress line per this many seconds of producing (default {PERIOD_S:g})")
    add_metrics_arg(produce)
    produce.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    return produce
