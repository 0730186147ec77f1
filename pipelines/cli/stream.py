"""The `picasso stream` and `picasso produce` commands (wired into picasso.pipelines.cli.main)."""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import asdict

from rich.console import Console

from picasso import storage
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.join_events import JOIN_FORMATS
from picasso.connectors.kafka_config import KafkaConnection
from picasso.connectors.kafka_wait import BrokerWait, BrokerWaiter, check_topics
from picasso.serving.publishing.contract import MLflowTarget
from picasso.durations import duration_arg
from picasso.pipelines.cli.beam_options import add_pipeline_command
from picasso.pipelines.cli.cache_args import add_cache_args, cache_config
from picasso.pipelines.cli.dead_letter_args import add_dead_letter_args, dead_letter_policy
from picasso.pipelines.cli.endless import (add_endless_args, check_endless_args, refuse_endless_only,
                                          run_endless_command)
from picasso.pipelines.cli.metrics_args import add_metrics_arg
from picasso.pipelines.cli.output import CommandResult, console, reported, summary
from picasso.pipelines.cli.produce_progress import PERIOD_S, ProduceProgress
from picasso.pipelines.cli.progress import Progress
from picasso.pipelines.cli.kafka_args import (add_kafka_args, add_kafka_client_arg, kafka_connection, stream_start,
                                              topic_formats)
from picasso.pipelines.cli.health_args import add_health_args, health_limits
from picasso.pipelines.cli.publish import add_publish_args, publish_policy
from picasso.pipelines.cli.spec_arg import add_spec_arg
from picasso.pipelines.cli.train_args import add_model_args, model_settings
from picasso.pipelines.runs.joined_stream_state import JoinedTopics
from picasso.pipelines.runs.produce import (EventReplayConfig, ProduceConfig, produce, produce_total, replay_events,
                                            replay_total)
from picasso.pipelines.runs.stop_signals import stopped_by_signals
from picasso.sample_join.join_policy import LATE_LABEL_POLICIES
from picasso.spec_refs import load_join_spec, load_spec
from picasso.trainer import TrainConfig

def quiet_kafka_client(args) -> None:
    """kafka-python logs each failed connection as ERROR and WARNING lines, a dozen a try,
    and each connection at INFO: the commands say one line a retry instead
    (connectors.kafka_wait). --debug shows them."""
    if not getattr(args, "debug", False):
        logging.getLogger("kafka").setLevel(logging.CRITICAL)


def say(text: str) -> None:
    """One plain line on stderr, flushed: a log file reads as the terminal does."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)
    console.file.flush()


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
    stream.set_defaults(run=reported(_stream_command))
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
    produce.set_defaults(run=reported(_produce_command))
    return produce


def _stream_command(args) -> CommandResult:
    quiet_kafka_client(args)
    if args.endless:
        check_endless_args(args)
        topics, joined = _stream_topics(args)
        # Without --wait-for-topic the job checks its topics itself (runs/endless.start_ranges).
        if args.wait_for_topic and not topics_ready(args, kafka_connection(args), topics):
            return CommandResult({"endless": True, "stopped_before_start": True})
        output = run_endless_command(args, console, topics, kafka_connection(args), load_spec(args.spec), joined)
        summary("endless job", {k: v for k, v in output.items() if k not in ("started_at", "positions", "pushes")})
        return CommandResult(output, stopped=output["stopped"])
    refuse_endless_only(args)
    output = run_stream_command(args, console)
    # The versions made, those published as the stream stopped too (no cycle line shows them).
    summary("stream", {**{k: v for k, v in output.items() if k not in ("ledger", "versions")},
                       "versions": ", ".join(output["versions"]) or "-"})
    # pending: a stream that ended with versions in the outbox; stopped: one that gave up
    # on an error no retry mends (pipelines/runs/cycle_failures.py).
    return CommandResult(output, pending=bool(output.get("pending")), stopped=output.get("stopped"))


def _produce_command(args) -> CommandResult:
    output = run_produce_command(args, console)
    summary(f"produced into {output['topic']}", output)
    return CommandResult(output)


def _stream_topics(args):
    """The topics and formats to read, and how they are joined (None: labelled events)."""
    if not (args.impressions or args.labels):
        if not args.topic:
            raise ValueError("picasso stream needs --topic (labelled events), or --impressions and --labels")
        given = [flag for flag, value in (("--join-key", args.join_key), ("--label-wait", args.label_wait),
                                          ("--late-labels", args.late_labels),
                                          ("--allowed-lateness", args.allowed_lateness)) if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: only for a joined stream (--impressions and --labels)")
        return topic_formats(args.topic), None
    if not (args.impressions and args.labels) or args.topic:
        raise ValueError("a joined stream takes --impressions and --labels, and no --topic")
    topics = topic_formats([args.impressions, args.labels])
    if len(topics) < 2:
        raise ValueError(f"--impressions and --labels must be two topics, not both {args.impressions!r}")
    join = load_join_spec(args.spec).replace(
        key=tuple(field.strip() for field in args.join_key.split(",")) if args.join_key else None,
        wait_ms=args.label_wait, late_labels=args.late_labels, allowed_lateness_ms=args.allowed_lateness)
    impressions, labels = (item.partition(":")[0] for item in (args.impressions, args.labels))
    for topic in (impressions, labels):
        if topics[topic] not in JOIN_FORMATS:
            raise ValueError(f"{topic}: a joined stream's events are {' or '.join(JOIN_FORMATS)}, not {topics[topic]}")
    return topics, JoinedTopics(impressions, labels, join)


def stream_config(args):
    """The StreamConfig the flags describe. It makes WORKDIR and, when the stream publishes,
    opens its MLflow target; it connects to no broker."""
    from picasso.pipelines.runs.stream import StreamConfig  # MLflow: see run_stream_command

    workdir = storage.make_folder(args.workdir)
    target = None
    start = stream_start(args)  # its flags checked before any store is made
    if args.publish_every > 0 or (start and start.registry):
        target = MLflowTarget.for_workdir(workdir, args.mlflow_uri, args.experiment, args.model_name)
    topics, joined = _stream_topics(args)
    return StreamConfig(
        connection=kafka_connection(args),
        topics=topics,
        joined=joined,
        workdir=workdir,
        spec=load_spec(args.spec),
        mlflow=target,
        train=TrainConfig(**model_settings(args), device=args.device, cache=cache_config(args)),
        decode=DecodeOptions(unknown_fields=args.unknown_fields),
        group_id=args.group_id,
        dead_letters=dead_letter_policy(args),
        batch_messages=args.batch_messages,
        max_cycle_messages=args.max_cycle_messages,
        publish_every_s=args.publish_every,
        idle_sleep_s=args.idle_sleep,
        backoff_s=args.backoff,
        backoff_max_s=args.backoff_max,
        stall_timeout_s=args.stall_timeout,
        keep_checkpoints=args.keep_checkpoints,
        deterministic=args.deterministic,
        runner=args.runner,
        beam_args=args.beam_args,
        until_caught_up=args.until_caught_up,
        max_cycles=args.max_cycles or None,  # 0 (the MLproject's default) means no limit
        max_seconds=args.max_seconds or None,
        max_failures=args.max_failures,
        publish_policy=publish_policy(args),
        health=health_limits(args),
        start=start,
        warm_start_target=target if start and start.registry else None,
    )


def run_stream_command(args, console: Console) -> dict:
    # MLflow (the outbox) and the stream's run: seconds of start-up the other commands skip.
    from picasso.serving.publishing.outbox import PublishOutbox
    from picasso.pipelines.runs.stream import StreamSummary, one_worker_in_this_process, run_stream

    config = stream_config(args)
    # Options the stream cannot run with are refused before any wait for a broker or a topic.
    one_worker_in_this_process(config.pipeline_options())
    workdir, target = config.workdir, config.mlflow
    shown = set()  # the versions cycle lines have shown

    def progress(report, summary):
        version = summary.versions[-1] if summary.versions else "-"
        shown.add(version)
        join = report.join
        joined = (f" · joined {join['positives']:,}+ {join['negatives']:,}- {join['late_labels']:,} late, "
                  f"{join['pending']:,} pending" if join else "")
        # One plain line a cycle (say), whole in a log file, where rich's log would wrap it.
        say(f"cycle {report.cycle}: {report.messages:,} messages, {report.samples:,} samples, "
            f"{report.dead_letters} dead letters in {report.seconds:.1f}s · lag {report.lag - report.messages:,} · "
            f"{report.events_per_s:,.0f} events/s{joined} · version {version}")
        # The run-health gate: one bad cycle never stops a live stream, but it says so.
        if report.refused:
            say(f"cycle {report.cycle} refused: {report.refused} (the stream trains on)")
        for warning in report.warnings:
            say(f"warning: cycle {report.cycle}: {warning}")
        # A version the gate withholds is said by the publisher, once per due version.

    joined = config.joined
    how = (f", joined on {','.join(joined.join.key)} with a {joined.join.wait_ms / 60_000:g} min wait, late labels "
           f"{joined.join.late_labels}" if joined else "")
    console.log(f"streaming {', '.join(f'{t} ({f})' for t, f in config.topics.items())} from "
                f"{config.connection.bootstrap_servers} into {workdir}{how}")
    from picasso.pipelines.runs.run_metrics import StreamMetrics, serving_metrics

    summary = StreamSummary()  # stopped before it started: nothing done
    if topics_ready(args, config.connection, config.topics):
        with serving_metrics(args.metrics_port, console.log) as registry:  # None: no --metrics-port
            summary = run_stream(config, progress, watch=StreamMetrics(registry).watch if registry else None)
    unshown = [version for version in summary.versions if version not in shown]
    if unshown:  # published between cycles, or as the stream stopped
        say(f"version {', '.join(unshown)} published after the last cycle")
    return {**asdict(summary), "workdir": workdir,
            "tracking_uri": target.tracking_uri if target else None,
            # Versions MLflow did not take: they wait in the outbox (the main loop's exit
            # status says so to a scheduler).
            "pending": len(PublishOutbox(config.folders.publish).pending())}


def topics_ready(args, connection: KafkaConnection, topics) -> bool:
    """Before a stream's first cycle: a broker that answers, waited for with one line a
    retry (for ever, or up to --max-seconds), and every topic there. A topic that does not
    exist is an error (exit 2) naming the topics that do, or with --wait-for-topic, waited
    for. False: SIGTERM or SIGINT came first. (Once running, a cycle that finds a topic
    gone retries: a broker that has just restarted may not know it yet.)"""
    stopping = []
    wait = BrokerWait(timeout_s=getattr(args, "max_seconds", None) or None, first_backoff_s=args.backoff,
                      max_backoff_s=args.backoff_max)
    with stopped_by_signals(lambda: stopping.append(True)):
        waiter = BrokerWaiter(connection, wait, say, stopped=lambda: bool(stopping))
        return check_topics(waiter, topics, args.wait_for_topic)


def run_produce_command(args, console: Console) -> dict:
    quiet_kafka_client(args)
    if args.impressions_topic or args.labels_topic:
        return _run_event_replay(args, console)
    if not args.topic:
        raise ValueError("--topic is required (or --impressions-topic and --labels-topic to replay generated events)")
    if args.speedup is not None:
        raise ValueError("--speedup paces a joined replay (--impressions-topic, --labels-topic); "
                         "a single-topic replay goes at --rate")
    config = ProduceConfig(
        connection=kafka_connection(args), topic=args.topic, data_root=args.data, dates=tuple(args.date),
        fmt=args.format, rows_per_message=args.rows_per_message, rate=args.rate, partitions=args.partitions,
        max_records=args.max_records,
    )
    total = produce_total(config)  # bad day files are refused before any wait
    _wait_for_broker(args, config.connection)
    result = _with_progress(f"producing into {args.topic}", total,
                            lambda on_progress: produce(config, on_progress=on_progress), args)
    return {**asdict(result), "records_per_s": result.records_per_s}


def _run_event_replay(args, console: Console) -> dict:
    missing = [flag for flag, topic in (("--impressions-topic", args.impressions_topic),
                                        ("--labels-topic", args.labels_topic)) if not topic]
    if missing:
        raise ValueError(f"a joined replay needs {' and '.join(missing)} too")
    if args.topic:
        raise ValueError("--topic names a single-topic replay's topic; a joined replay sends to "
                         "--impressions-topic and --labels-topic")
    if args.format != "json":
        raise ValueError(f"a joined replay sends JSON events, not --format {args.format}")
    if args.rate:
        raise ValueError("a joined replay is paced in event time by --speedup, not by --rate")
    config = EventReplayConfig(
        connection=kafka_connection(args), data_root=args.data, dates=tuple(args.date),
        impressions_topic=args.impressions_topic, labels_topic=args.labels_topic, speedup=args.speedup or 0.0,
        partitions=args.partitions, max_records=args.max_records,
    )
    total = replay_total(config)
    _wait_for_broker(args, config.connection)
    result = _with_progress(f"replaying events into {args.impressions_topic} and {args.labels_topic}", total,
                            lambda on_progress: replay_events(config, on_progress=on_progress), args)
    # "topic" titles the command line's summary, as a single-topic replay's does.
    return {"topic": f"{result.impressions_topic}, {result.labels_topic}", **asdict(result),
            "records_per_s": result.records_per_s}


def _wait_for_broker(args, connection: KafkaConnection) -> None:
    """A broker that answers, one line a retry; exit 2 (KafkaUnreachable) after
    --broker-timeout-s."""
    BrokerWaiter(connection, BrokerWait(timeout_s=args.broker_timeout_s), say).topics()


def _with_progress(title: str, total: int, run, args):
    """run(on_progress), where on_progress(records) prints a progress line per
    --progress-every seconds (and the produce metrics count, with --metrics-port); a last
    line when it is done."""
    from picasso.pipelines.runs.run_metrics import ProduceMetrics, serving_metrics

    with serving_metrics(args.metrics_port, console.log) as registry, Progress(console, title) as progress:
        lines = ProduceProgress(progress, title, total, args.progress_every)
        result = run(ProduceMetrics(registry).counted(lines) if registry else lines)
        lines.finish()
        return result
