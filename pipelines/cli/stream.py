"""The runs of `picasso stream` (in cycles; the endless job's: endless.py) and `picasso
produce` (their flags: stream_args.py)."""

from __future__ import annotations

import logging
from dataclasses import asdict

from rich.console import Console

from picasso import storage
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.join_events import JOIN_FORMATS
from picasso.connectors.kafka_config import KafkaConnection
from picasso.connectors.kafka_wait import BrokerWait, BrokerWaiter, check_topics
from picasso.serving.publishing.contract import MLflowTarget
from picasso.pipelines.cli.cache_args import cache_config
from picasso.pipelines.cli.dead_letter_args import dead_letter_policy
from picasso.pipelines.cli.endless import check_endless_args, refuse_endless_only, run_endless_command
from picasso.pipelines.cli.output import CommandResult, console, reported, summary
from picasso.pipelines.cli.produce_progress import ProduceProgress
from picasso.pipelines.cli.progress import Progress
from picasso.pipelines.cli.kafka_args import kafka_connection, stream_start, topic_formats
from picasso.pipelines.cli.health_args import health_limits
from picasso.pipelines.cli.publish_args import publish_policy
from picasso.pipelines.cli.train_args import model_settings
from picasso.pipelines.runs.joined_stream_state import JoinedTopics
from picasso.pipelines.runs.produce import (EventReplayConfig, ProduceConfig, produce, produce_total, replay_events,
                                            replay_total)
from picasso.pipelines.runs.stop_signals import stopped_by_signals
from picasso.spec_refs import load_join_spec, load_spec
from picasso.train_config import TrainConfig


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


# The commands' runs (cli/command_runs.py calls them): each ends as cli/output.py says.
stream_command = reported(_stream_command)
produce_command = reported(_produce_command)


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
