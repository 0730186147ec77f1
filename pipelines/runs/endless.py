"""`picasso stream --endless`: one Beam pipeline that a streaming runner keeps running.

    ReadFromKafka.unbounded (from the server's positions)
      → DecodeMessages (each poll's dead letters written and acknowledged before its chunk goes
        on, each letter once: one the topic holds already is not written again)
      → PackMessages → PicassoTrain(GBAHandler, unbounded) → the parameter server

The model lives in the parameter server, not in the runner (DESIGN.md): the runner's
workers join it, pull, compute and push; each push names the source range it trained, and
the server applies a range at most once, so a retried bundle or a restarted worker trains
nothing twice. The server checkpoints on wall-clock time and publishes versions
(endless_server.py). With no --ps, this process starts one in a thread of its own on
loopback and stops it on exit, which writes a last checkpoint and publishes it.

A job starts reading each partition at the server's position: what its newest checkpoint
holds. So a job that was killed is resubmitted as it is: it reads on from there, and the
ledger refuses whatever the killed job had pushed already.

With impressions and labels (config.joined) the job joins them in Beam's keyed state
(endless_joined.py): each sample is trained under its impression's position, and a joined
partition's position is the end of its settled prefix, so a resubmitted job re-reads every
impression the killed job held pending, and the server skips, sample by sample, what of
it was trained. That join needs a runner whose event-time timers follow the watermark
(not this machine's FnApiRunner: see below).

It runs until SIGTERM or SIGINT, or until it fails. On a local runner a signal drains the
reads (kafka_source.drain_unbounded_reads): each partition's read ends once it holds
nothing unsent, the steps in flight finish, the worker leaves the server, and the server
writes its last checkpoint. A streaming service drains a job its own way (Dataflow's
drain, Flink's stop-with-savepoint); the server is what keeps the model either way.

What this machine's runners do with such a pipeline (README, runner notes): the
FnApiRunner with one worker runs it, fused steps getting each bundle as it is read; on it,
a GroupByKey or timers after the endless source would never fire, so checkpoints,
versions and commits are all on wall-clock time in the server, none through Beam.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from kafka.errors import KafkaError

from picasso.connectors.beam_kafka_io import BeamKafkaIO, BeamKafkaRead, ReadWithBeamKafka
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.dead_letters.lettered import LetterScope
from picasso.connectors.dead_letters.policy import DeadLetterPolicy
from picasso.connectors.dead_letters.topic import DeadLetterProducer
from picasso.connectors.kafka_config import KafkaConnection, TopicNotFound, ensure_topic
from picasso.connectors.kafka_source import (PartitionRange, ReadFromKafka, bounded_ranges, drain_unbounded_reads,
                                             undrain_unbounded_reads)
from picasso.connectors.retry import Backoff
from picasso.distributed.gba import WorkerDropped
from picasso.distributed.param_server import ParameterServerError, ServerAddress
from picasso.distributed.ps_client import ServerRestarted
from picasso.distributed.transport import Security, free_port
from picasso.pipelines.runs.endless_joined import JoinedBatches, settled_before
from picasso.pipelines.runs.endless_server import EndlessServer, EndlessServerConfig
from picasso.pipelines.runs.joined_stream_state import JoinedTopics
from picasso.pipelines.runs.stop_signals import stopped_by_signals
from picasso.pipelines.transforms.decode import DecodeMessages
from picasso.pipelines.transforms.gba_train import PSAddress
from picasso.pipelines.transforms.pack import PackMessages
from picasso.pipelines.transforms.train import PicassoTrain
from picasso.pipelines.transforms.train_handlers import GBAHandler
from picasso.spec import FeatureSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EndlessConfig:
    connection: KafkaConnection
    topics: dict[str, str]  # topic -> message format (json | arrow | tsv)
    spec: FeatureSpec
    # The server this process starts and serves (None: train against `ps`, a server of its own).
    server: EndlessServerConfig | None
    ps: PSAddress | None = None  # a running `picasso ps --endless`
    decode: DecodeOptions = DecodeOptions()
    dead_letters: DeadLetterPolicy = DeadLetterPolicy()  # where bad messages' letters go, and what if they cannot
    batch_messages: int = 1000  # messages per training batch (an Arrow message holds many rows)
    runner: str = "FnApiRunner"
    beam_args: tuple[str, ...] = ()
    resume_every_s: float = 1.0  # an unbounded read hands its rest back to the runner this often
    max_batch_delay_s: float = 0.5  # a batch short of batch_messages goes once its oldest event waited this long
    # The broker at start: retried with these delays (doubling) for this many attempts.
    connect_attempts: int = 10
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    kafka_io: BeamKafkaIO | None = None  # Beam's ReadFromKafka (--kafka-io beam); None: picasso's own reader
    # Impressions and labels joined in the job (--impressions, --labels; endless_joined.py);
    # None: labelled events.
    joined: JoinedTopics | None = None

    def __post_init__(self):
        if (self.server is None) == (self.ps is None):
            raise ValueError("an endless job trains against the server it starts (server=) or a running one (ps=)")

    def pipeline_options(self) -> PipelineOptions:
        return PipelineOptions([f"--runner={self.runner}", *self.beam_args])


@dataclass
class EndlessSummary:
    started_at: dict[str, int] = field(default_factory=dict)  # the positions the reads began at
    positions: dict[str, int] = field(default_factory=dict)  # the server's when the job ended
    step: int = 0
    samples: int = 0
    checkpoint: str | None = None
    versions: list[str] = field(default_factory=list)  # made by this process's server
    stopped: str | None = None  # why the job stopped on its own: its parameter server failed it
    # What the pushes came to on this process's server: accepted, duplicates (a retried
    # bundle's, a resubmitted job's), refusals by reason.
    pushes: dict[str, int] = field(default_factory=dict)


def start_ranges(config: EndlessConfig, positions: dict[str, int], sleep=time.sleep) -> list[PartitionRange]:
    """Every partition of the topics, unbounded, from the server's positions. A broker that
    cannot be reached is tried again with a backoff, said once per attempt; a topic that
    does not exist is bad input (ValueError), not something to wait for."""
    backoff = Backoff(config.backoff_s, config.backoff_max_s)
    for attempt in range(1, config.connect_attempts + 1):
        try:
            with _client_logs_quiet():  # it logs each reconnection: one line per attempt is ours
                ranges = bounded_ranges(config.connection, config.topics, positions)
            return [PartitionRange(r.topic, r.partition, r.start) for r in ranges]
        except TopicNotFound as err:
            raise ValueError(f"{err}: create it, or name the topic the events go to") from None
        except (KafkaError, OSError) as err:
            if attempt == config.connect_attempts:
                raise ConnectionError(f"no Kafka broker at {config.connection.bootstrap_servers} after {attempt} "
                                      f"attempts: {err}") from None
            delay = backoff.next_delay()
            log.warning("Kafka at %s cannot be reached (%s); attempt %d of %d, again in %.0f s",
                        config.connection.bootstrap_servers, type(err).__name__, attempt, config.connect_attempts,
                        delay)
            sleep(delay)
    raise AssertionError("unreachable")


def build_pipeline(config: EndlessConfig, ps: PSAddress, ranges: list[PartitionRange]) -> beam.Pipeline:
    pipeline = beam.Pipeline(options=config.pipeline_options())
    # Each letter once: what a killed job lettered of what this one reads again is read back
    # from the topic and skipped (connectors/dead_letters/lettered.py). A joined job letters
    # an orphan label when its wait ends, out of its partition's order.
    scope = LetterScope({r.source: r.start for r in ranges}, in_order=config.joined is None)
    letters = DeadLetterProducer(config.connection, config.dead_letters, scope)
    messages = _read_messages(pipeline, config, ranges)
    if config.joined is not None:
        batches = _joined_batches(config, messages, letters)
    else:
        decoded = messages | "DecodeMessages" >> DecodeMessages(config.spec, config.topics, config.decode,
                                                                letters_to=letters)
        batches = (decoded.chunks
                   | "PackMessages" >> PackMessages(config.spec)
                   | "Batches" >> beam.Map(lambda packed: packed.batch))
    # A batch cut short by --max-batch-delay weighs each sample as a full one's (aggregation.py).
    ps = replace(ps, batch_size=config.batch_messages)
    _ = batches | "Train" >> PicassoTrain(GBAHandler(ps, config.spec), unbounded=True)
    return pipeline


def _joined_batches(config: EndlessConfig, messages, letters: DeadLetterProducer):
    """Decode, join (in Beam's keyed state) and pack: the samples, and what settles the
    positions that train nothing (endless_joined.py)."""
    return messages | "Joined" >> JoinedBatches(config.spec, config.joined, config.topics, letters,
                                                rows_per_table=config.batch_messages)


def _settle_unread(config: EndlessConfig, server: EndlessServer | None, ps: PSAddress, starts: dict[str, int]) -> None:
    """A joined job settles every position before its reads' starts (endless_joined.py)."""
    settles = settled_before(config.spec, config.joined, starts)
    if not settles:
        return
    if server is not None:
        server.shard.settle("endless-job", settles)
    else:
        _remote_call(ps, "settle", "endless-job", settles)


def _read_messages(pipeline: beam.Pipeline, config: EndlessConfig, ranges: list[PartitionRange]):
    """Messages from the ranges' starts on: picasso's reader, or Beam's (connectors/beam_kafka_io.py),
    which starts where the consumer group's offsets are: the ranges' starts are committed
    there once its transform is expanded, right before the job is submitted."""
    if config.kafka_io is None:
        return pipeline | "ReadFromKafka" >> ReadFromKafka(
            config.connection, ranges, max_messages=config.batch_messages, resume_every_s=config.resume_every_s,
            max_delay_s=config.max_batch_delay_s)
    read = BeamKafkaRead(config.connection, tuple(config.topics), config.kafka_io, {r.source: r.start for r in ranges},
                         config.batch_messages, config.max_batch_delay_s)
    messages = pipeline | "ReadFromKafka" >> ReadWithBeamKafka(read)
    read.commit_start_positions()
    return messages


def run_endless(config: EndlessConfig, watch=None) -> EndlessSummary:
    """watch(server, positions): an observer of the job (the CLI's metrics), called before
    the reads start with the server this process started (None with config.ps) and a
    function that returns the server's positions."""
    summary = EndlessSummary()
    server, ps = None, config.ps
    if config.server is not None:
        port = free_port()
        server = EndlessServer(config.server, ServerAddress("127.0.0.1", port), summary.versions).start()
        # One push in flight: a worker's pushes then reach the server in order, so the
        # server's positions are where its applied ranges end, and a resubmitted job's
        # re-read cuts nothing the ledger holds in part. The runner's workers in this
        # process call the server directly (local_transport.py).
        ps = PSAddress("127.0.0.1", port, max_in_flight=1, in_process=True)
    try:
        server_positions = server.positions if server is not None else (lambda: _remote_positions(ps))
        if watch is not None:
            watch(server, server_positions)
        positions = server_positions()
        ranges = start_ranges(config, positions)
        summary.started_at = {r.source: r.start for r in ranges}
        if config.joined is not None:
            _settle_unread(config, server, ps, summary.started_at)
        ensure_topic(config.connection, config.dead_letters.topic, 1)  # one partition: letters in arrival order
        log.info("endless job: reading %s from %s",
                 ", ".join(f"{r.source}@{r.start}" for r in ranges), config.connection.bootstrap_servers)
        pipeline = build_pipeline(config, ps, ranges)
        undrain_unbounded_reads()
        try:
            with stopped_by_signals(_drain):
                pipeline.run().wait_until_finish()
        except ParameterServerError as err:  # gone, restarted, or refusing: the job cannot train on
            summary.stopped = str(err) if isinstance(err, ServerRestarted) else \
                f"{err}; run the job again once the server is back: it reads on from the server's positions"
            log.error("%s", summary.stopped)
        except WorkerDropped as err:
            # Silent past its lease (frozen, not idle: an idle worker renews it). What it had
            # pushed and the server had not applied is gone with it; its reads have moved on,
            # so training on would skip it. A resubmit reads on from the server's positions.
            summary.stopped = f"{err}; run the job again: it reads on from the server's positions"
            log.error("%s", summary.stopped)
    finally:
        if server is not None:
            server.stop()  # the last checkpoint, and its version
    if server is not None:
        model = server.model
        summary.positions, summary.pushes = server.positions(), server.shard.counts()
        summary.step, summary.samples, summary.checkpoint = model.trainer.step, model.trainer.samples, model.checkpoint
    return summary


@contextmanager
def _client_logs_quiet():
    client = logging.getLogger("kafka")
    level = client.level
    client.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        client.setLevel(level)


def _drain() -> None:
    log.info("stopping: the reads end once what they hold is trained")
    drain_unbounded_reads()


def _remote_positions(ps: PSAddress) -> dict[str, int]:
    return _remote_call(ps, "positions")


def _remote_call(ps: PSAddress, method: str, *args):
    address = ServerAddress(ps.host, ps.port, ps.timeout_s, (ps.security or Security()).with_env_token())
    connection = address.connect(0)
    try:
        if not connection.wait_ready(address.timeout_s):
            raise ConnectionError(f"no parameter server at {ps.host}:{ps.port} after {address.timeout_s:g} s "
                                  "(start `picasso ps --endless` first)")
        return connection.call(method, *args)
    finally:
        connection.close()
