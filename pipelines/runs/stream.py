"""`picasso stream`: continuous training as repeated bounded Beam cycles.

Each cycle, on the FnApiRunner:

  ReadFromKafka(checkpointed positions → end offsets now) → DecodeMessages ─┬→ PackMessages → train
                                                                           └→ dead-letter topic
then, in order: checkpoint (model, optimizer, positions and ledger in one directory,
renamed into place), commit the positions to the consumer group (for lag monitoring only:
resume always starts from the checkpoint), and publish a model version when one is due.

Exactly-once model state: a cycle trains a model that is exactly the last checkpoint's,
and its work counts only once its checkpoint exists. A cycle that fails (broker gone,
stalled fetch, anything) leaves no trace: the in-memory model is dropped, the next attempt
restores the last checkpoint and re-reads the same offsets, after a backoff. Read cut
points are a function of the start positions only, so a re-run cycle trains the very same
batches in the same order.

A cycle trains through PicassoTrain with a StreamHandler, and the trainer lives across
cycles in this process (held under the runner's apache_beam.utils.shared.Shared), so a
healthy stream never reloads its checkpoint.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import apache_beam as beam
import torch
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions
from apache_beam.utils.shared import Shared
from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata

from picasso.checkpoint import clean_temporaries
from picasso.connectors.beam_files import use_beam_filesystems
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.dead_letters.lettered import Lettered, LetterScope
from picasso.connectors.dead_letters.policy import DeadLetterPolicy
from picasso.connectors.dead_letters.topic import WriteDeadLettersToKafka
from picasso.connectors.kafka_config import KafkaConnection, ensure_topic
from picasso.connectors.kafka_source import PartitionRange, ReadFromKafka, bounded_ranges
from picasso.connectors.retry import Backoff
from picasso.pipelines.runs.counters import picasso_counters
from picasso.pipelines.runs.cycle_failures import FailureTracker, retry_line
from picasso.pipelines.runs.join_cycle import ORPHANS, DecodeJoinEvents, JoinInCycle, PackSamples
from picasso.pipelines.runs.joined_stream_state import JoinedModelLoader, JoinedTopics
from picasso.pipelines.runs.run_health import HealthFacts, HealthLimits, check_health
from picasso.pipelines.runs.stop_signals import stopped_by_signals
from picasso.pipelines.runs.stream_publisher import StreamPublisher
from picasso.pipelines.runs.stream_start import StreamStart, begin_stream
from picasso.pipelines.runs.stream_state import ModelLoader, StreamModel
from picasso.pipelines.runs.workdir import Workdir
from picasso.pipelines.transforms.decode import DEAD_LETTERS, DecodeMessages
from picasso.pipelines.transforms.pack import PackMessages
from picasso.pipelines.transforms.process_counts import dead_letter_kinds
from picasso.pipelines.transforms.row_profile import RowProfile
from picasso.pipelines.transforms.train import PicassoTrain
from picasso.pipelines.transforms.train_handlers import JoinedStreamHandler, StreamHandler
from picasso.spec import FeatureSpec
from picasso.trainer import TrainConfig

log = logging.getLogger(__name__)


def one_worker_in_this_process(options: PipelineOptions) -> None:
    """Raises ValueError unless the options run a cycle's steps in one worker in this process.

    The stream's model lives across cycles here, in the driver's process (held under the
    runner's Shared): a worker process would train a copy of it that no checkpoint saves,
    and a second worker would train part of each cycle beside it."""
    direct = options.view_as(DirectOptions)
    if direct.direct_num_workers != 1 or direct.direct_running_mode == "multi_processing":
        raise ValueError(
            f"picasso stream runs its Beam cycles in one worker in its own process, not with "
            f"--direct_num_workers={direct.direct_num_workers} --direct_running_mode={direct.direct_running_mode}: "
            "its model lives across cycles in this process, and Beam workers would each train a copy of it "
            "(use --direct_num_workers=1 with --direct_running_mode in_memory or multi_threading)")


@dataclass(frozen=True)
class StreamConfig:
    connection: KafkaConnection
    topics: dict[str, str]  # topic -> message format (json | arrow | tsv)
    workdir: str
    spec: FeatureSpec
    mlflow: object | None  # an MLflowTarget; None: never publish
    train: TrainConfig = TrainConfig()
    decode: DecodeOptions = DecodeOptions()
    group_id: str = "picasso-stream"
    dead_letters: DeadLetterPolicy = DeadLetterPolicy()  # where bad messages' letters go, and what if they cannot
    batch_messages: int = 1000  # messages per training batch (an Arrow message holds many rows)
    max_cycle_messages: int | None = None  # per partition and cycle; None: up to the end offsets
    publish_every_s: float = 300.0
    idle_sleep_s: float = 1.0  # between end-offset checks when there is nothing new
    backoff_s: float = 1.0  # first retry delay after a failed cycle; doubles up to backoff_max_s
    backoff_max_s: float = 30.0
    stall_timeout_s: float = 30.0  # a fetch with no progress for this long fails the cycle
    keep_checkpoints: int = 3
    deterministic: bool = False  # one thread, deterministic torch kernels: bit-identical reruns
    runner: str = "FnApiRunner"
    beam_args: tuple[str, ...] = ()
    # When to stop (all optional): caught up with the topic, after N cycles, after S seconds.
    until_caught_up: bool = False
    max_cycles: int | None = None
    max_seconds: float | None = None
    max_failures: int | None = None  # consecutive failed cycles before giving up
    publish_policy: object | None = None  # a PublishPolicy (promotion, retries); None: the defaults
    # Impressions and labels on two topics (both in `topics`), joined into samples here;
    # None: every event carries its label. batch_messages is then samples per batch.
    joined: JoinedTopics | None = None
    health: HealthLimits = HealthLimits()  # the run-health gate on each cycle and before each version
    # --warm-start and --start-at: how the stream begins when its workdir has no checkpoint
    # yet (stream_start.py); None: from scratch, at each partition's earliest offset.
    start: StreamStart | None = None
    # Where --warm-start finds champion, latest and models:/ (an MLflowTarget): the stream's
    # own target, given even when the stream does not publish; None: mlflow.
    warm_start_target: object | None = None

    def __post_init__(self):
        if self.train.loss_batch_size is None:  # each sample weighs one over the configured batch
            object.__setattr__(self, "train", replace(self.train, loss_batch_size=self.batch_messages))

    @property
    def folders(self) -> Workdir:
        return Workdir(self.workdir)

    def pipeline_options(self) -> PipelineOptions:
        return PipelineOptions([f"--runner={self.runner}", *self.beam_args])


@dataclass
class CycleReport:
    cycle: int
    messages: int
    samples: int
    dead_letters: int
    lag: int  # messages behind the end offsets when the cycle started
    seconds: float
    checkpoint: str
    events_per_s: float
    join: dict | None = None  # a joined stream's join this cycle: its counts, what it holds
    refused: str | None = None  # why the run-health gate refuses what this cycle read (the stream goes on)
    warnings: list[str] = field(default_factory=list)  # the gate's warnings on it
    events: int = 0  # records decoded (an Arrow message holds many)
    dead_letter_kinds: dict[str, int] = field(default_factory=dict)  # refused records by reason kind
    partition_lag: dict[str, int] = field(default_factory=dict)  # source -> end offset at the start - position now


@dataclass
class StreamSummary:
    cycles: int = 0
    failures: int = 0
    messages: int = 0
    samples: int = 0
    dead_letters: int = 0
    lag: int | None = None
    checkpoint: str | None = None
    step: int = 0
    versions: list[str] = field(default_factory=list)
    last_error: str | None = None
    ledger: dict = field(default_factory=dict)
    # Why the stream gave up (a fatal error, or one repeating at the same positions;
    # see pipelines.cycle_failures); None when it stopped as asked.
    stopped: str | None = None
    refused_cycles: int = 0  # cycles the run-health gate refused (the stream trained on)
    withheld: str | None = None  # why the last due version was not made, when the gate refused it
    failure_kinds: dict[str, int] = field(default_factory=dict)  # failed cycles by cycle_failures.classify


class StreamRunner:
    def __init__(self, config: StreamConfig, on_cycle: Callable[[CycleReport, StreamSummary], None] = lambda r, s: None,
                 sleep: Callable[[float], None] = time.sleep):
        self.config = config
        self.on_cycle = on_cycle
        self.sleep = sleep
        self.shared = Shared()
        self.model: StreamModel | None = None
        self.key = ""
        self.end_offsets: dict[str, int] = {}  # each partition's, as the last plan found them
        self.summary = StreamSummary()
        self.stopping = False
        # Whether the dead-letter topic may hold letters of what the next cycle reads: at
        # start (a killed process's), and after a failed cycle (_letter_sink).
        self.letters_may_repeat = True
        self.publisher = StreamPublisher(config, self.summary.versions)
        checkpoints = config.folders.checkpoints
        self.load = (ModelLoader(config.spec, config.train, checkpoints) if config.joined is None else
                     JoinedModelLoader(config.spec, config.train, checkpoints, config.joined, config.batch_messages))

    # -- the model: kept across cycles, dropped after a failure ------------------------

    def _acquire(self) -> StreamModel:
        if self.model is None:
            self.key = uuid.uuid4().hex
            self.model = self.shared.acquire(self.load, tag=self.key)  # this strong ref keeps it alive
            self.publisher.adopt(self.model)  # before any cycle adds to its window
        return self.model

    # -- one cycle ---------------------------------------------------------------------

    def plan(self, model: StreamModel) -> tuple[list[PartitionRange], int]:
        """This cycle's ranges (capped per partition) and the total lag now."""
        ranges = bounded_ranges(self.config.connection, self.config.topics, model.trainer.positions)
        lag = sum(r.stop - r.start for r in ranges)
        self.end_offsets = {r.source: r.stop for r in ranges}  # before the cap: the cycle's report measures lag by them
        cap = self.config.max_cycle_messages
        if cap:
            ranges = [PartitionRange(r.topic, r.partition, r.start, min(r.stop, r.start + cap)) for r in ranges]
        return ranges, lag

    def run_cycle(self, model: StreamModel, ranges: list[PartitionRange], lag: int) -> CycleReport:
        config = self.config
        started = time.perf_counter()
        messages_before = sum(p.messages for p in model.ledger.partitions.values())
        pipeline = beam.Pipeline(options=config.pipeline_options())
        messages = pipeline | "ReadFromKafka" >> ReadFromKafka(
            config.connection, ranges, max_messages=config.batch_messages, stall_timeout_s=config.stall_timeout_s)
        letters = self._letter_sink(ranges)
        if config.joined is None:
            self._train_labelled(messages, letters)
        else:
            model.begin_cycle({r.source for r in ranges if r.stop > r.start})
            self._join_and_train(messages, letters)
        result = pipeline.run()
        result.wait_until_finish()
        counters = picasso_counters(result)
        messages = sum(p.messages for p in model.ledger.partitions.values()) - messages_before
        if counters.get("messages_trained", 0) != messages:
            # The runner trained a model other than this one (another process): saving this
            # one would silently drop that training.
            raise RuntimeError(f"{counters.get('messages_trained', 0)} messages trained by the pipeline, "
                               f"{messages} by the stream's model")
        model.ledger.cycles += 1
        model.end_cycle()
        checkpoint = model.save(config.folders.checkpoints, keep=config.keep_checkpoints)
        seconds = time.perf_counter() - started
        samples = counters.get("rows_in", 0) - counters.get("dead_letters", 0)
        join = None
        if config.joined is not None:  # the samples are what the join emitted
            join = asdict(model.cycle.counts)
            samples = join["positives"] + join["negatives"] + join["corrections"]
            join.update(model.held(), watermark_ms=model.join.watermark)
        kinds = dead_letter_kinds(counters)
        if counters.get("join_orphan_labels"):
            kinds["orphan_label"] = kinds.get("orphan_label", 0) + counters["join_orphan_labels"]
        positions = model.trainer.positions
        dead_letters = counters.get("dead_letters", 0) + counters.get("join_orphan_labels", 0)
        read = HealthFacts(trained=samples, rows_read=counters.get("rows_in", 0), dead_letters=dead_letters,
                           profile=RowProfile.of_counters(counters) if config.joined is None else None)
        verdict = check_health(read, config.health, config.spec.feature_names)
        self.publisher.cycle_trained(read)
        return CycleReport(
            cycle=model.ledger.cycles, messages=messages, samples=samples, dead_letters=dead_letters, lag=lag,
            refused=verdict.reason or None, warnings=list(verdict.warnings),
            seconds=seconds, checkpoint=str(checkpoint),
            events_per_s=counters.get("rows_in", 0) / seconds if seconds else 0.0, join=join,
            events=counters.get("rows_in", 0), dead_letter_kinds=kinds,
            partition_lag={r.source: max(0, self.end_offsets.get(r.source, r.stop) - positions.get(r.source, r.start))
                           for r in ranges},
        )

    def _letter_sink(self, ranges: list[PartitionRange]) -> WriteDeadLettersToKafka:
        """The cycle's dead-letter topic, which writes each letter once. Every letter of a
        cycle is at or above its starts, so after a cycle that checkpointed the topic holds
        none of the next one's; after a failed cycle (or at start: a killed process's) it
        may, and the sink reads them back before its first letter (connectors/dead_letters/lettered.py).
        A joined stream letters an orphan label when its wait ends, out of its partition's order."""
        scope = LetterScope({r.source: r.start for r in ranges}, in_order=self.config.joined is None)
        known = None if self.letters_may_repeat else Lettered(scope)
        return WriteDeadLettersToKafka(self.config.connection, self.config.dead_letters, scope, known)

    def _train_labelled(self, messages, letters: WriteDeadLettersToKafka) -> None:
        """Events that carry their labels: decode → pack → train."""
        config = self.config
        decoded = messages | "DecodeMessages" >> DecodeMessages(config.spec, config.topics, config.decode)
        decoded[DEAD_LETTERS] | "DeadLetterTopic" >> letters
        (
            decoded.chunks
            | "PackMessages" >> PackMessages(config.spec)
            | "Train" >> PicassoTrain(handler=StreamHandler(self.load, self.key), shared=self.shared)
        )

    def _join_and_train(self, messages, letters: WriteDeadLettersToKafka) -> None:
        """Impressions and labels: decode → join → pack → train (pipelines.join_cycle)."""
        config, joined = self.config, self.config.joined
        decoded = messages | "DecodeJoinEvents" >> DecodeJoinEvents(config.spec, joined, config.topics)
        samples = decoded.chunks | "JoinLabels" >> JoinInCycle(self.load, self.key, self.shared,
                                                                joined.join.label_of(config.spec.label))
        all_letters = (decoded[DEAD_LETTERS], samples[ORPHANS]) | "AllDeadLetters" >> beam.Flatten()
        all_letters | "DeadLetterTopic" >> letters
        (
            samples.samples
            | "PackSamples" >> PackSamples(config.spec)
            | "Train" >> PicassoTrain(handler=JoinedStreamHandler(self.load, self.key), shared=self.shared)
        )

    def commit_offsets(self, model: StreamModel) -> None:
        """The checkpoint's positions to the consumer group, so that lag tools see them.
        Best effort: resume never reads them."""
        offsets = {}
        for source, position in model.trainer.positions.items():
            topic, partition = source.rsplit("/", 1)
            offsets[TopicPartition(topic, int(partition))] = OffsetAndMetadata(position, "", -1)
        consumer = None
        try:
            # Making the consumer bootstraps, and the broker may have gone since the cycle:
            # inside the try, or a broker outage at this moment would end the stream.
            consumer = self.config.connection.consumer(group_id=self.config.group_id)
            consumer.commit(offsets)
        except Exception as err:  # noqa: BLE001 - monitoring only; never fails a cycle
            log.warning("could not commit offsets to group %s: %s", self.config.group_id, err)
        finally:
            if consumer is not None:
                consumer.close()

    # -- the loop ----------------------------------------------------------------------

    def _should_stop(self, started: float) -> bool:
        config, summary = self.config, self.summary
        return (self.stopping
                or (config.max_cycles is not None and summary.cycles >= config.max_cycles)
                or (config.max_seconds is not None and time.monotonic() - started >= config.max_seconds)
                or (config.max_failures is not None and summary.failures >= config.max_failures))

    def _gives_up(self, err: Exception, starts: dict[str, int], tracker: FailureTracker, failures_in_row: int) -> bool:
        """Count a failed cycle; whether the stream stops rather than retry it."""
        summary = self.summary
        summary.failures += 1
        summary.last_error = f"{type(err).__name__}: {err}"
        kind = tracker.classify(err)
        summary.failure_kinds[kind] = summary.failure_kinds.get(kind, 0) + 1
        self.model = None  # the next attempt restores the last checkpoint
        stop = tracker.record(err, starts)
        if stop is not None:
            summary.stopped = str(stop)
            log.error("%s", summary.stopped)
            return True
        return self.config.max_failures is not None and failures_in_row >= self.config.max_failures

    def run(self) -> StreamSummary:
        config, summary = self.config, self.summary
        options = config.pipeline_options()
        one_worker_in_this_process(options)  # before any work
        # The workdir may be a URL: its filesystem is set up from the options before the first read.
        use_beam_filesystems(options, workdir=config.workdir)
        clean_temporaries(config.folders.checkpoints)
        begin_stream(config)  # once: a stream with a checkpoint goes on from it
        backoff = Backoff(config.backoff_s, config.backoff_max_s)
        started = time.monotonic()
        failures_in_row = 0
        tracker = FailureTracker(dead_letters=config.dead_letters)
        dead_letter_topic_ready = False
        while not self._should_stop(started):
            starts: dict[str, int] = {}  # where this cycle reads from: what a repeated failure is keyed by
            try:
                if not dead_letter_topic_ready:  # one partition: dead letters stay in arrival order
                    ensure_topic(config.connection, config.dead_letters.topic, 1)
                    dead_letter_topic_ready = True
                model = self._acquire()
                ranges, lag = self.plan(model)
                starts = {r.source: r.start for r in ranges}
                summary.lag = lag
                if lag == 0:
                    self.publisher.maybe_publish(model)
                    if config.until_caught_up:
                        break
                    self.sleep(config.idle_sleep_s)
                    continue
                report = self.run_cycle(model, ranges, lag)
            except Exception as err:  # noqa: BLE001 - any failure: drop the model, back off, retry
                failures_in_row += 1
                self.letters_may_repeat = True  # the failed cycle may have written letters the next one reads again
                if self._gives_up(err, starts, tracker, failures_in_row):
                    break
                delay = backoff.next_delay()
                log.warning("%s", retry_line(err, config.connection.bootstrap_servers, delay))
                self.sleep(delay)
                continue
            failures_in_row = 0
            self.letters_may_repeat = False
            tracker.reset()
            backoff.reset()
            summary.cycles += 1
            summary.refused_cycles += report.refused is not None
            summary.messages += report.messages
            summary.samples += report.samples
            summary.dead_letters += report.dead_letters
            summary.checkpoint = report.checkpoint
            summary.lag = report.lag - report.messages  # behind the end offsets the cycle started at, as its line says
            self.commit_offsets(model)
            self.publisher.maybe_publish(model)
            summary.withheld = self.publisher.withheld
            self.on_cycle(report, summary)
        if self.model is not None:
            self.publisher.maybe_publish(self.model, force=True)
            summary.withheld = self.publisher.withheld
            summary.step = self.model.trainer.step
            summary.ledger = self.model.ledger.to_dict()
            summary.checkpoint = str(self.model.checkpoint) if self.model.checkpoint else None
        return summary

    def stop(self, *_):
        self.stopping = True


def configure_determinism(deterministic: bool) -> None:
    if deterministic:
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)


def run_stream(config: StreamConfig, on_cycle=lambda report, summary: None,
               watch: Callable[[StreamRunner], None] | None = None) -> StreamSummary:
    """watch(runner), before the first cycle: an observer of the run (run_metrics.StreamMetrics)."""
    configure_determinism(config.deterministic)
    runner = StreamRunner(config, on_cycle)
    if watch is not None:
        watch(runner)
    with stopped_by_signals(runner.stop):
        return runner.run()


