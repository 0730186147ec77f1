"""Prometheus metrics of the long-running commands: `picasso stream` (in cycles or
--endless), `picasso ps` and `picasso produce`, served over HTTP when --metrics-port asks.

Each process makes a registry of its own (never prometheus_client's global default), so
that several runs in one process (tests) each serve their own. The metrics are read off
what the runs keep anyway, through small hooks:
- a stream cycle's CycleReport and the stream's StreamSummary (pipelines/runs/stream.py),
  through its on_cycle callback and the runner (StreamMetrics.watch);
- a parameter-server shard's status (Shard.status), for `ps` and the endless job's server;
- the versions a stream made: the newest line of its version log
  (WORKDIR/runs/stream-versions.jsonl, stream_publisher.py), read again when one is added;
- produce's progress callback;
- the endless job's own process: the lag of its server's positions, looked up by a
  thread every few seconds, and what its workers decoded (process_counts.py).
What is counted is a counter (a name ending in _total): rate() over it is the per-second
rate, which is how Prometheus wants rates (a gauge of "events per second" would hide
whatever happened between two scrapes). The README lists every name.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from picasso import storage
from picasso.connectors.kafka_config import KafkaConnection
from picasso.connectors.kafka_wait import BROKER_RETRIES
from picasso.pipelines.runs.cycle_failures import FATAL, OUTSIDE, REPEATED
from picasso.pipelines.runs.workdir import Workdir
from picasso.pipelines.transforms.process_counts import PROCESS_COUNTS, ProcessCounts, dead_letter_kinds

log = logging.getLogger(__name__)

# Dead letters are counted by their reason's kind (dead_letters.reason_kind), a small fixed
# set; past this many kinds the rest count as "other", so that no input can make the
# number of time series grow without bound.
MAX_REASON_KINDS = 32


@dataclass(frozen=True)
class MetricsAddress:
    """Where /metrics is served: --metrics-port [HOST:]PORT (HOST 0.0.0.0: every interface,
    for a scraper on another machine, as exporters do)."""

    port: int
    host: str = "0.0.0.0"

    @classmethod
    def parse(cls, text: str) -> "MetricsAddress":
        host, _, port = str(text).rpartition(":")
        if not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"--metrics-port {text!r}: expected PORT or HOST:PORT, with PORT in [0, 65535]")
        return cls(int(port), host.strip("[]") or "0.0.0.0")


class MetricsEndpoint:
    """A registry of its own, served over HTTP (GET /metrics) from a daemon thread."""

    def __init__(self, address: MetricsAddress):
        self.address = address
        self.registry = CollectorRegistry()
        self._server, self._thread = start_http_server(address.port, addr=address.host, registry=self.registry)
        self.port = self._server.server_port  # the one bound, for port 0

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.address.host in ("0.0.0.0", "::", "") else self.address.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> "MetricsEndpoint":
        return self

    def __exit__(self, *_) -> None:
        self.close()


@contextmanager
def serving_metrics(address: MetricsAddress | None, say: Callable[[str], None] = log.info):
    """The endpoint's registry for the with block, served at `address`; None when address
    is None (--metrics-port not given)."""
    if address is None:
        yield None
        return
    try:
        endpoint = MetricsEndpoint(address)
    except OSError as err:
        raise ValueError(f"--metrics-port: cannot serve metrics on {address.host}:{address.port}: {err}") from None
    say(f"metrics on {endpoint.url}")
    with endpoint:
        yield endpoint.registry


# -- what several runs share -----------------------------------------------------------------


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _add_reason_kinds(letters: dict[str, int], kinds: dict[str, int]) -> None:
    """Add dead-letter counts by kind into `letters`, kinds past MAX_REASON_KINDS as "other"."""
    for kind, count in kinds.items():
        if kind not in letters and len(letters) >= MAX_REASON_KINDS:
            kind = "other"
        letters[kind] = letters.get(kind, 0) + count


def _read_families(lag: dict[str, int], messages: int, events: int, letters: dict[str, int]) -> Iterator:
    """What a stream and an endless job both report of their reads: each partition's lag,
    the messages and events read, and the dead letters by reason."""
    gauge = GaugeMetricFamily("picasso_consumer_lag_messages", "the partition's end offset minus the position "
                              "trained to", labels=["topic", "partition"])
    for source, behind in sorted(lag.items()):
        topic, partition = source.rsplit("/", 1)
        gauge.add_metric([topic, partition], behind)
    yield gauge
    yield _counter("picasso_messages_read", "Kafka messages read", messages)
    yield _counter("picasso_events_read", "events (records) decoded from those messages", events)
    dead = CounterMetricFamily("picasso_dead_letters", "records refused, by the kind of their reason (its first "
                               "words)", labels=["reason"])
    for kind, count in sorted(letters.items()):
        dead.add_metric([kind], count)
    yield dead


def _broker_retries(since: int) -> CounterMetricFamily:
    """The retries said while no Kafka broker answered ('no Kafka broker at ...; retrying
    in N s'), at start, by a cycle or by a running read, since the collector started."""
    return _counter("picasso_kafka_broker_retries", "retries while no Kafka broker answered, one a line",
                    BROKER_RETRIES.count - since)


def _window_gauges(window: dict | None) -> Iterator[GaugeMetricFamily]:
    """The progressive (test-then-train) metrics of a model's window: each batch was scored
    before it was trained on."""
    if window is None:
        return
    yield _gauge("picasso_progressive_auc", "AUC of the batches since the last version, each scored before it "
                 "was trained on", window["auc"])
    yield _gauge("picasso_progressive_logloss", "log loss of the same window", window["logloss"])
    yield _gauge("picasso_progressive_window_samples", "samples in that window", window["window_samples"])


class VersionLog:
    """The newest version a stream made, and the facts its version log keeps of it (when it
    was published, the newest event time it trained on). `versions` is the list the run
    appends each version it makes to: the log is read again only when that list grows."""

    def __init__(self, workdir: str, versions: list[str]):
        self.path = Workdir(workdir).stream_versions
        self.versions = versions
        self._seen: int | None = None
        self._newest: dict | None = None

    def newest(self) -> dict | None:
        if self._seen != len(self.versions):
            try:
                lines = storage.read_text(self.path).splitlines() if storage.exists(self.path) else []
                self._newest = json.loads(lines[-1]) if lines else None
                self._seen = len(self.versions)
            except (OSError, ValueError) as err:  # a line half written: read again at the next scrape
                log.debug("version log %s: %s", self.path, err)
        return self._newest

    def collect(self, now_s: float) -> Iterator[GaugeMetricFamily]:
        entry = self.newest()
        if entry is None:
            return
        try:
            number = float(entry["version"])
        except (TypeError, ValueError):
            number = math.nan
        yield _gauge("picasso_model_version", "the newest model version this stream published", number)
        yield _gauge("picasso_model_version_published_timestamp_seconds", "when that version was published",
                     entry["published_ms"] / 1000)
        newest_event_ms = entry.get("newest_event_ms")
        if newest_event_ms is not None:
            yield _gauge("picasso_model_version_newest_event_timestamp_seconds",
                         "the event time of the newest event that version was trained on", newest_event_ms / 1000)
            yield _gauge("picasso_model_version_freshness_seconds",
                         "now minus that event time: how old the newest thing the serving model knows is",
                         now_s - newest_event_ms / 1000)


# -- the stream in cycles --------------------------------------------------------------------


class StreamMetrics(Collector):
    """A stream's metrics: fed by each cycle's report (on_cycle) and read off its runner
    (its summary, its publisher, its version log) at scrape time. watch(runner) starts it."""

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.runner = None
        self.versions: VersionLog | None = None
        self._lock = threading.Lock()  # on_cycle runs in the stream's thread, collect in the server's
        self._lag: dict[str, int] = {}
        self._events = 0
        self._dead_letters: dict[str, int] = {}
        self._join: dict | None = None
        self._window: dict | None = None
        self._retries_from = BROKER_RETRIES.count
        registry.register(self)

    def watch(self, runner) -> None:
        """Observe a StreamRunner (pipelines/runs/stream.py) before its first cycle: its
        on_cycle callback reports here first."""
        self.runner = runner
        self.versions = VersionLog(runner.config.workdir, runner.summary.versions)
        reported = runner.on_cycle

        def on_cycle(report, summary) -> None:
            self.on_cycle(report, summary)
            reported(report, summary)

        runner.on_cycle = on_cycle

    def on_cycle(self, report, summary) -> None:
        """A cycle's report (CycleReport); runs in the stream's thread, after the checkpoint
        and any version of it."""
        window = self._window_now()
        with self._lock:
            self._lag.update(report.partition_lag)
            self._events += report.events
            _add_reason_kinds(self._dead_letters, report.dead_letter_kinds)
            self._join = report.join
            self._window = window

    def _window_now(self) -> dict | None:
        """The window since the last version; right after a version took it, that version's."""
        model = self.runner.model if self.runner is not None else None
        if model is not None and model.keeps_window and model.window.labels:
            return model.window_metrics()
        return self.runner.publisher.last_window if self.runner is not None else None

    def collect(self):
        if self.runner is None:
            return
        summary = self.runner.summary
        with self._lock:
            lag, events, letters = dict(self._lag), self._events, dict(self._dead_letters)
            join, window = self._join, self._window
        yield _counter("picasso_stream_cycles", "stream cycles trained and checkpointed", summary.cycles)
        failures = CounterMetricFamily("picasso_stream_cycle_failures", "failed cycles by kind: outside (retried), "
                                       "fatal (stops), repeated (the same error at the same positions)",
                                       labels=["kind"])
        for kind in (OUTSIDE, FATAL, REPEATED):
            failures.add_metric([kind], summary.failure_kinds.get(kind, 0))
        yield failures
        # The lag as of the latest cycle; the messages read are those trained and checkpointed.
        yield from _read_families(lag, summary.messages, events, letters)
        yield _counter("picasso_samples_trained", "samples trained", summary.samples)
        if join is not None:
            yield _gauge("picasso_join_pending_impressions", "impressions the join holds, waiting for a label",
                         join["pending"])
            yield _gauge("picasso_join_pending_bytes", "bytes the join holds for them", join["pending_bytes"])
        yield _broker_retries(self._retries_from)
        yield from _window_gauges(window)
        yield from self.versions.collect(self.clock())


# -- the parameter server, and the endless job's -----------------------------------------------


class ShardMetrics(Collector):
    """A parameter-server shard's metrics (picasso_stage/distributed/shard.py), read at
    scrape time: its live workers, its pushes by outcome, their staleness, its step."""

    def __init__(self, registry: CollectorRegistry, shard):
        self.shard = shard
        registry.register(self)

    def collect(self):
        status = self.shard.status()
        yield _gauge("picasso_ps_live_workers", "workers that pulled or pushed within their lease",
                     len(status.workers))
        yield _gauge("picasso_ps_global_step", "the model's global step", status.step)
        yield _counter("picasso_ps_samples_trained", "samples in the global steps taken", status.samples)
        pushes = CounterMetricFamily("picasso_ps_pushes", "pushes by outcome: accepted, duplicate (its source range "
                                     "was trained already: acknowledged, not trained again), dropped_stale, refused_*",
                                     labels=["outcome"])
        for outcome, count in sorted(status.counts.items()):
            if outcome not in ("accepted_samples", "steps"):
                pushes.add_metric([outcome], count)
        yield pushes
        yield SummaryMetricFamily("picasso_ps_push_staleness_steps", "global steps between an accepted push's pull "
                                  "and its push (rate of _sum over rate of _count: the mean staleness)",
                                  count_value=status.counts.get("accepted", 0), sum_value=status.staleness_sum)


class EndlessServerMetrics(Collector):
    """The endless job's server (pipelines/runs/endless_server.py): its shard's metrics,
    the window of its newest checkpoint, and the versions it made."""

    def __init__(self, registry: CollectorRegistry, server, clock: Callable[[], float] = time.time):
        self.server, self.clock = server, clock
        self.versions = VersionLog(server.config.workdir, server.versions)
        self._window: tuple[object, dict | None] = (None, None)  # (a window, its metrics): each computed once
        ShardMetrics(registry, server.shard)
        registry.register(self)

    def _window_metrics(self) -> dict | None:
        window = self.server.model.window  # replaced, never changed, at each checkpoint
        if self._window[0] is not window:
            self._window = (window, window.metrics() if window.labels else self.server.publisher.last_window)
        return self._window[1]

    def collect(self):
        yield from _window_gauges(self._window_metrics())
        yield from self.versions.collect(self.clock())


class EndlessJobMetrics(Collector):
    """What the endless job's own process adds to its server's metrics: each partition's lag,
    and the messages, events and dead letters its workers decoded since this started
    (process_counts.py says why a tally of this process, not Beam's counters).

    The lag is the partitions' end offsets minus the server's positions, both looked up by a
    thread of this every `lookup_every_s` seconds, not by a scrape: a broker that cannot be
    reached takes half a minute to say so, longer than a scrape may take. While either
    lookup fails there is no lag series (alert on its absence), and one warning says why.
    lookup_every_s None: no thread; refresh() looks up (tests)."""

    def __init__(self, registry: CollectorRegistry, connection: KafkaConnection, topics: Iterable[str],
                 positions: Callable[[], dict[str, int]], lookup_every_s: float | None = 5.0,
                 counts: ProcessCounts = PROCESS_COUNTS):
        self.connection, self.topics, self.positions = connection, list(topics), positions
        self.counts = counts
        self.started = counts.snapshot()
        self._retries_from = BROKER_RETRIES.count
        self._lag: dict[str, int] = {}
        self._failing = False
        self._stop = threading.Event()
        self._thread = None
        if lookup_every_s is not None:
            self._thread = threading.Thread(target=self._look_up_every, args=(lookup_every_s,), daemon=True,
                                            name="metrics-lag")
            self._thread.start()
        registry.register(self)

    def refresh(self) -> None:
        """Look up the ends and the positions now."""
        from picasso.connectors.kafka_source import bounded_ranges  # Beam: not for `ps` and `produce`

        try:
            positions = self.positions()
            ranges = bounded_ranges(self.connection, self.topics, positions)
        except Exception as err:  # noqa: BLE001 - the broker or the server is away: no lag until it is back
            if not self._failing:
                log.warning("metrics: no lag of %s until it can be looked up: %s", ", ".join(self.topics), err)
            self._failing, self._lag = True, {}
            return
        # A partition the server has no position in is read from its beginning (the range's start).
        self._failing, self._lag = False, {r.source: r.stop - r.start for r in ranges}

    def _look_up_every(self, seconds: float) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(seconds)

    def close(self) -> None:
        """No more lookups. Not waited for: a lookup in flight (its daemon thread) ends on
        its own, within the client's timeout."""
        self._stop.set()

    def collect(self):
        read = {name: count - self.started.get(name, 0) for name, count in self.counts.snapshot().items()}
        letters: dict[str, int] = {}
        _add_reason_kinds(letters, dead_letter_kinds(read))
        yield from _read_families(dict(self._lag), read.get("messages_in", 0), read.get("rows_in", 0), letters)
        yield _broker_retries(self._retries_from)


# -- produce ------------------------------------------------------------------------------------


class ProduceMetrics(Collector):
    """What `picasso produce` has sent: counted() wraps its progress callback (called once
    per message with the records in it)."""

    def __init__(self, registry: CollectorRegistry):
        self.messages = self.records = 0
        self._lock = threading.Lock()
        registry.register(self)

    def counted(self, on_progress: Callable[[int], None]) -> Callable[[int], None]:
        def progress(records: int) -> None:
            with self._lock:
                self.messages += 1
                self.records += records
            on_progress(records)

        return progress

    def collect(self):
        with self._lock:
            messages, records = self.messages, self.records
        yield _counter("picasso_produce_messages", "Kafka messages sent", messages)
        yield _counter("picasso_produce_records", "records (events) in them", records)
