"""The endless job's parameter server: where the model lives while the stream runs.

`picasso stream --endless` starts one in its own process when it is given no --ps, and
`picasso ps --endless` serves one on its own (for runners whose workers are elsewhere).
Either way it:
- starts from the newest checkpoint under WORKDIR/checkpoints: the weights, the optimizer
  slots, the ledger of the source ranges applied, the positions, and the prequential window
  (the scores of the batches trained since the last version);
- where WORKDIR has no checkpoint yet and a start is given (--warm-start, --start-at), makes
  that start first, as the cycle stream does (stream_start.begin_stream): a checkpoint of the
  warm-start model at each partition's start offset, which the job then reads on from (a
  start other than at the earliest offsets needs the topics and the broker to find those
  offsets). Once the workdir has a checkpoint, the start is not looked at again: a
  resubmitted job goes on from its checkpoint;
- takes workers that come and go: there is no worker count, and the job ends only when its
  owner stops it;
- writes a checkpoint every `checkpoint_every_s` seconds of wall clock (or every
  `publish_every_s`, when versions are due more often: a version is made of a checkpoint),
  when the model trained since the one before (keeping `keep_checkpoints`);
- publishes the newest checkpoint every `publish_every_s` seconds through the outbox, gated
  and with deltas, exactly as the cycle stream does (stream_publisher.StreamPublisher),
  with the progressive metrics of its window: each batch was scored by its worker with the
  parameters it pulled, before its gradient was pushed (test-then-train);
- on stop, writes a last checkpoint and publishes it.

Each version names its parent, as a cycle stream's do: the checkpoint of the version before
it in this job's line (or the warm-start model's, for the first), and the offsets it
trained since (the lineage, kept in each checkpoint's metrics).

A worker joined to an earlier start of the server (the server died and was restarted from
its checkpoint) is refused at its next pull (ps_client.ServerRestarted): its source has read
past the checkpoint's positions, and pushing on would skip what lies between.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import torch

from picasso import storage
from picasso.checkpoint import checkpoint_metrics, prune_checkpoints, read_applied, read_checkpoint_file
from picasso.connectors.kafka_config import KafkaConnection
from picasso.distributed.gba import GBAConfig
from picasso.distributed.param_server import JobDescription, ServerAddress, serve_shard
from picasso.distributed.ps_checkpoint import build_shard, save_ps_checkpoint
from picasso.distributed.shard import Scored, ShardSnapshot
from picasso.pipelines.runs.lineage import stream_origin
from picasso.pipelines.runs.run_health import HealthLimits
from picasso.pipelines.runs.stop_signals import stopped_by_signals
from picasso.pipelines.runs.stream_start import StreamStart, begin_stream
from picasso.pipelines.runs.stream_state import StreamLedger
from picasso.pipelines.runs.stream_publisher import StreamPublisher, VersionInfo
from picasso.pipelines.runs.stream_window import SCORED_FILE, ScoredWindow
from picasso.pipelines.runs.workdir import Workdir
from picasso.serving.publishing import registry_tags as tags
from picasso.spec import FeatureSpec
from picasso.trainer import TrainConfig, Trainer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EndlessServerConfig:
    """What the endless job's server needs; the names StreamPublisher reads (mlflow,
    publish_every_s, topics, joined, publish_policy, folders) and begin_stream reads
    (start, connection, group_id, warm_start_target) are a stream config's."""

    spec: FeatureSpec
    train: TrainConfig
    workdir: str
    topics: dict[str, str]  # what the job reads: the versions' `topics` parameter
    gba: GBAConfig = field(default_factory=lambda: GBAConfig(1))
    lease_s: float = 30.0  # a worker silent this long is dropped
    checkpoint_every_s: float = 30.0
    keep_checkpoints: int = 3
    mlflow: object | None = None  # an MLflowTarget; None: never publish
    publish_every_s: float = 300.0
    publish_policy: object | None = None
    joined: object | None = None  # a joined stream's JoinedTopics (its parameters go on the versions)
    health: HealthLimits = HealthLimits()  # the run-health gate before each version
    # How a job whose workdir has no checkpoint begins (stream_start.py); None: from scratch
    # at each partition's earliest offset. The connection finds the start offsets.
    start: StreamStart | None = None
    connection: KafkaConnection | None = None
    group_id: str = "picasso-stream"  # --start-at committed: the group whose offsets it takes
    warm_start_target: object | None = None  # the MLflowTarget a registered warm start is looked up in

    @property
    def folders(self) -> Workdir:
        return Workdir(self.workdir)


@dataclass
class _Counts:
    """The trainer-shaped counts StreamPublisher reads off a model."""

    step: int = 0
    samples: int = 0


class ServedModel:
    """The server's model as StreamPublisher sees a stream's: its newest checkpoint, the
    window since the last version, and what a version of it says."""

    def __init__(self, server: "EndlessServer", checkpoint: str | None, step: int, samples: int,
                 newest_event_ms: int | None, positions: dict[str, int] | None = None, metrics: dict | None = None,
                 applied: dict[str, list[list[int]]] | None = None):
        metrics = metrics or {}
        self.server = server
        self.checkpoint = checkpoint
        self.trainer = _Counts(step, samples)
        self.newest_event_ms = newest_event_ms
        self.positions = dict(positions or {})  # the newest checkpoint's
        self.began = _began(applied, self.positions)
        self.window = ScoredWindow()  # the newest checkpoint's (what its version reports)
        self.keeps_window = True
        # The newest version of this job's line, queued: its checkpoint and positions (as a
        # StreamModel's lineage); None before any, or the warm-start model's after a start.
        self.lineage = metrics.get("lineage")
        # The checkpoint is the one a start made (stream_start.begin_stream): the warm-start
        # model, whose version exists already, with nothing trained since.
        ledger = StreamLedger.from_dict(metrics.get("ledger", {}))
        self.only_started = metrics.get("mode") != "endless" and ledger.cycles == 0 and ledger.start is not None

    def checkpointed(self, path: str, snapshot: ShardSnapshot, window: ScoredWindow) -> None:
        self.checkpoint = path
        self.trainer = _Counts(snapshot.step, snapshot.samples)
        self.newest_event_ms = snapshot.newest_event_ms
        self.positions = dict(snapshot.positions)
        self.began = _began(snapshot.applied, self.positions)
        self.window = window
        self.only_started = False

    def window_metrics(self) -> dict[str, float]:
        return self.window.metrics()

    def publish_extras(self) -> tuple[dict[str, float], dict[str, list], dict[str, str]]:
        return {}, {}, {}

    def version_info(self) -> VersionInfo:
        """With its lineage: the version before it in this job's line (the warm-start model
        for the first after a start) and the offsets trained since."""
        parent = self.lineage or {}
        origin = stream_origin(parent.get("positions") or self.began, self.positions)
        return VersionInfo("endless", f"endless-step-{self.trainer.step}",
                           {"newest_event_ms": self.newest_event_ms, "step": self.trainer.step},
                           {tags.PARENT_CHECKPOINT: parent.get("checkpoint") or "", tags.ORIGIN: origin})

    def reset_window(self) -> None:
        """A version holds the newest checkpoint's window: the shard forgets it up to there."""
        self.window = ScoredWindow()
        self.server.shard.forget_window(self.trainer.step)

    def drop_window(self) -> None:
        self.keeps_window = False
        self.reset_window()

    def versioned(self) -> None:
        """A version of the newest checkpoint is queued: the next one descends from it."""
        self.lineage = {"checkpoint": self.checkpoint, "positions": dict(self.positions)}


def _began(applied: dict[str, list[list[int]]] | None, positions: dict[str, int]) -> dict[str, int]:
    """Where a line with no version before it began reading each source: its first range
    the model holds (a job from scratch starts at each partition's earliest offset)."""
    spans = applied or {}
    return {source: spans[source][0][0] if spans.get(source) else position for source, position in positions.items()}


def check_start(config: EndlessServerConfig) -> None:
    """Refuse a start the server cannot make: its offsets other than the earliest are found
    in the topics, on the broker."""
    start = config.start
    if start is not None and start.start_at != "earliest" and (config.connection is None or not config.topics):
        raise ValueError(f"--start-at {start.start_at}: the server finds each partition's start offset on the broker: "
                         "give it the topics the job reads (--topic) and the broker (--bootstrap-servers)")


class EndlessServer:
    """One shard serving an endless job, checkpointing and publishing (module docstring)."""

    def __init__(self, config: EndlessServerConfig, address: ServerAddress, versions: list[str] | None = None):
        self.config, self.address = config, address
        self.versions = [] if versions is None else versions  # the versions this server made
        self.root = config.folders.checkpoints
        check_start(config)
        begin_stream(config)  # the start's checkpoint, where the workdir has none yet
        self.trainer = Trainer(config.spec, config.train)
        resumed = self.trainer.warm_start(self.root)
        # The window and the newest event time go on from the checkpoint (a restart loses
        # neither: stream_window.py says why a version's metrics need that).
        kept = read_checkpoint_file(resumed, SCORED_FILE) if resumed else None
        window = ScoredWindow.from_bytes(kept) if kept else ScoredWindow()
        labels, scores = window.arrays()
        metrics = checkpoint_metrics(resumed) if resumed else {}
        newest = metrics.get("newest_event_ms")
        applied = read_applied(resumed) if resumed else None
        self.shard, self.layout = build_shard(self.trainer, 0, 1, config.gba, applied=applied,
                                              window=Scored(torch.tensor(labels), torch.tensor(scores)),
                                              newest_event_ms=newest)
        self.model = ServedModel(self, resumed, self.trainer.step, self.trainer.samples, newest,
                                 self.trainer.positions, metrics, applied)
        self.model.window = window
        self.publisher = StreamPublisher(config, self.versions)
        self.publisher.adopt(self.model)
        self._written = (self.trainer.step, dict(self.trainer.positions))  # what the newest checkpoint holds
        self._stop = threading.Event()
        self._ready = threading.Event()  # set once the server takes calls
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @property
    def description(self) -> JobDescription:
        # Workers send their scores only to a server that publishes them: one that never
        # publishes would keep a window that only grows.
        return JobDescription(self.config.spec, self.config.train, self.layout, self.config.lease_s,
                              prequential=self.model.keeps_window)

    def positions(self) -> dict[str, int]:
        """How far the model is trained into each source: where the job's reads begin."""
        return self.shard.positions()

    # -- serving ---------------------------------------------------------------------------

    def serve(self) -> None:
        """Serve until stop() (from another thread or a signal handler); then write the last
        checkpoint and publish it."""
        # A version is made of a checkpoint: one is taken as often as versions are due.
        every_s = self.config.checkpoint_every_s
        if self.publisher.publishes:
            every_s = min(every_s, self.config.publish_every_s)
        serve_shard(self.shard, self.address, 0, self.config.lease_s, description=self.description,
                    on_stop=self._last, on_checkpoint=self._checkpoint, checkpoint_every_s=every_s, stop=self._stop,
                    ready=self._ready)

    def serve_until_signalled(self) -> None:
        """serve() in the foreground until SIGTERM or SIGINT (`picasso ps --endless`)."""
        with stopped_by_signals(self.request_stop):
            self.serve()

    def start(self) -> "EndlessServer":
        """Serve in a thread of this process; returns once the server takes calls."""
        def run():
            try:
                self.serve()
            except BaseException as err:  # noqa: BLE001 - the owner re-raises it at stop()
                self.error = err
                log.error("the parameter server failed: %s", err)

        self._thread = threading.Thread(target=run, name="endless-ps", daemon=True)
        self._thread.start()
        # Waited for as long as it is starting (loading the kernels may take a while on a
        # busy machine), not for a fixed time; a server that failed to start says why.
        while not self._ready.wait(0.5):
            if not self._thread.is_alive():
                raise RuntimeError(f"the job's parameter server did not come up on {self.address.host}:"
                                   f"{self.address.port}: {self.error}")
        return self

    def request_stop(self) -> None:
        """Stop serving soon (from a signal handler, say): serve() then writes the last
        checkpoint, publishes it and returns."""
        self._stop.set()

    def stop(self) -> None:
        """Stop serving: the last checkpoint is written and published before this returns."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise self.error

    # -- checkpoints and versions ----------------------------------------------------------

    def _checkpoint(self, snapshots: list[ShardSnapshot]) -> None:
        snapshot = snapshots[0]
        if (snapshot.step, snapshot.positions) == self._written:
            return  # nothing trained since the newest checkpoint
        window = ScoredWindow()
        if snapshot.window is not None and snapshot.window.labels.numel():
            window.add(snapshot.window.labels.numpy(), snapshot.window.scores.numpy())
        extra = {SCORED_FILE: window.to_bytes()} if self.model.keeps_window else {}
        lineage = {"lineage": self.model.lineage} if self.model.lineage else {}
        path, _ = save_ps_checkpoint(self.root, self.layout, snapshots, self.trainer,
                                     {"mode": "endless", "samples": snapshot.samples, **lineage}, extra)
        prune_checkpoints(self.root, self.config.keep_checkpoints)
        self._written = (snapshot.step, dict(snapshot.positions))
        self.model.checkpointed(str(path), snapshot, window)
        self.publisher.cycle_trained()
        log.info("checkpoint %s: step %d, %d samples", storage.name(str(path)), snapshot.step, snapshot.samples)
        self.publisher.maybe_publish(self.model)

    def _last(self, snapshots: list[ShardSnapshot], lost_workers: list[str]) -> None:
        self._checkpoint(snapshots)
        self.publisher.maybe_publish(self.model, force=True)
