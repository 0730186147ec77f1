"""The parameter server: shards served over gRPC (transport.py); the worker's client is
ps_client.py.

Processes: one per shard, shard s listening on PORT + s (the `picasso ps` process serves
shard 0 and starts the others). Workers are clients: they connect, train and leave at any
time, and no shard ever calls a worker, so a dead one cannot hold up anything.

Membership is a lease. A worker joins at shard 0 (`join`), which names it: the name the
worker asks for (`gba-worker --rank`), or, for a Beam worker process that does not know
its rank, the first expected name (worker0..worker{N-1}, N = --workers) that has no live
holder, so a replacement process takes the slot of the one it replaces; past those, an
extra worker gets a new name. Its id is that name and a fresh incarnation, so the
pushes of a process that died are told apart from its successor's. Every call renews the
lease; a worker silent for `lease_s` is dropped on every shard: its buffered batches leave
the global batch, and its later calls are refused. A dropped worker that is still alive
(it stalled) finds out at its next pull, rejoins under a new incarnation
(`PSClient.rejoin`) and reads its source on from the server's positions.

The global batch stays M local batches (--global-batches, default --workers) whatever the
number of workers at the moment: M is sync's batch, which is what keeps the learning rate
right across modes. With fewer workers a global step takes longer; with more, gradients
are staler, and the staleness decay weighs them.

The job ends when every expected name (and every extra name that joined) is done: its
holder finished, or it was dropped (or never joined within `--timeout` of the
server's start, or joined and never pulled within a lease) and nobody holds it since.
Then shard 0 gathers every shard's snapshot for the checkpoint and releases the others.

Workers meet at a start line on shard 0 (`start_line`) after loading their data, so a
job's training is timed from a common start; a worker that joins later crosses at once.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import torch

from picasso import kernels
from picasso.cache import CacheConfig
from picasso.distributed import local_transport, transport, wire
from picasso.distributed.aggregation import Contribution, RowGradient
from picasso.distributed.gba import PushOutcome, worker_id
from picasso.distributed.dynamic_shard import DynamicLayout
from picasso.dynamic_rows import DynamicStats
from picasso.distributed.layout import ShardLayout, TableLayout
from picasso.distributed.shard import Pulled, Scored, Shard, ShardSnapshot
from picasso.kernels import SparseOptimizer
from picasso.spec import DenseField, DynamicTable, FeatureSpec, SparseField
from picasso.trainer import TrainConfig

log = logging.getLogger(__name__)


class ParameterServerError(RuntimeError):
    """A shard could not be reached, or refused the call (a dropped worker's pull, say)."""


@dataclass(frozen=True)
class ServerAddress:
    """Where shard 0 listens; shard s listens on port + s of the same host."""

    host: str = "127.0.0.1"
    port: int = 29500
    timeout_s: float = 60.0  # per call, and for a shard to come up
    security: transport.Security = field(default_factory=transport.Security)
    # The server may be in this process (the endless job's own): reach it directly when it
    # is, over gRPC when it is not (local_transport.py).
    in_process: bool = False

    def connect(self, index: int = 0) -> transport.Connection | local_transport.LocalConnection:
        if self.in_process:
            local = local_transport.connect(self.host, self.port + index, shard_name(index))
            if local is not None:
                return local
        return transport.Connection(self.host, self.port + index, self.security, self.timeout_s, shard_name(index))


@dataclass(frozen=True)
class JobDescription:
    """What a joining worker needs to build the same model, from shard 0, so that workers
    and servers cannot disagree."""

    spec: FeatureSpec
    config: TrainConfig
    layout: ShardLayout
    lease_s: float  # a worker silent this long is dropped
    # Workers send each batch's labels and scores with its push, for the server's
    # test-then-train evaluation (an endless job publishes versions with it).
    prequential: bool = False


def shard_name(index: int) -> str:
    return f"parameter-server shard ps{index}"


class ShardService:
    """One shard and, on shard 0, the job's membership: what `serve_shard` serves."""

    def __init__(self, shard: Shard, num_workers: int, lease_s: float, join_timeout_s: float,
                 description: JobDescription | None = None, endless: bool = False):
        """endless: the job of an endless stream: workers come and go, and it ends only when
        released (its owner stops it), never because every worker is done."""
        self.shard = shard
        self.endless = endless
        self.expected = {f"worker{r}" for r in range(num_workers)}
        self.lease_s, self.join_timeout_s = lease_s, join_timeout_s
        self.description = description
        self.started = time.monotonic()
        self.finished: set[str] = set()
        self.joined: dict[str, tuple[str, float]] = {}  # name -> (its latest id, when it joined)
        self.lost: set[str] = set()  # names nobody brought to training
        self.dropped_since: dict[str, float] = {}  # name -> when settle first saw its holder dropped
        self.at_start: dict[str, float] = {}  # names that reached the start line, and when
        self.all_at_start = threading.Event()
        self.stopped = threading.Event()
        self._lock = threading.Lock()  # membership; the shard has its own lock

    def methods(self) -> dict:
        shard = self.shard
        return {"describe": self.describe, "join": self.join, "start_line": self.start_line, "pull": shard.pull,
                "resolve": shard.resolve, "push": shard.push, "positions": shard.positions,
                "held": shard.held, "settle": shard.settle, "pass_over": shard.pass_over,
                "forget": shard.drop_worker, "renew": shard.renew, "finish": self.finish, "stashed": self.stashed, "step": shard.step,
                "stash_at": shard.stash_at, "snapshot": shard.snapshot, "release": self.stopped.set,
                "status": self.status}

    def status(self) -> dict:
        """Where the job stands, for monitoring: the step, samples trained, who trains."""
        control = self.shard.control
        with self._lock:
            return {"step": control.step, "samples": self.shard.samples, "live": sorted(self._live()),
                    "finished": sorted(self.finished), "lost": sorted(self.lost), "counts": dict(control.counts)}

    def describe(self) -> JobDescription:
        if self.description is None:
            raise RuntimeError(f"shard {self.shard.index} does not describe the job: ask shard 0")
        return self.description

    def join(self, name: str | None, incarnation: str) -> tuple[str, str | None]:
        """(this worker's id, the id it replaces or None). The id is `name` (None: the
        first expected name nobody holds, else a new one) and the incarnation. A name
        still held by an earlier incarnation (a replacement that came before the dead
        one's lease ran out) is taken over: the caller drops the earlier one on every shard."""
        with self._lock:
            dropped = self.shard.control.dropped
            held = {n for n, (w, _) in self.joined.items() if w not in dropped and n not in self.finished}
            if name is None:
                free = sorted(self.expected - held - self.finished, key=lambda n: int(n.removeprefix("worker")))
                name = free[0] if free else f"worker{len(self.expected | set(self.joined))}"
            previous = self.joined[name][0] if name in held else None
            self.expected.add(name)
            self.finished.discard(name)
            self.lost.discard(name)
            worker = worker_id(name, incarnation)
            self.joined[name] = (worker, time.monotonic())
        log.info("shard %d: %s joined%s", self.shard.index, worker, f", replacing {previous}" if previous else "")
        return worker, previous

    def start_line(self, worker: str) -> None:
        """Wait until every expected worker has reached its start line or is lost, for at
        most half a lease (so the waiting worker pulls well within its own): workers plant
        or load their data at different speeds, and a job timed from its first worker's
        start would otherwise count the others' loading as training time."""
        with self._lock:
            self.at_start[worker.split("/", 1)[0]] = time.monotonic()
        self.settle()
        self.all_at_start.wait(self.lease_s / 2)

    def finish(self, worker: str) -> None:
        self.shard.retire(worker)
        with self._lock:
            self.finished.add(worker.split("/", 1)[0])
        if self.shard.index == 0:  # every shard hears it; shard 0 keeps the membership, and says it
            log.info("shard 0: %s finished and left", worker)
        self.settle()

    def stashed(self, step: int, take: bool):
        """This shard's snapshot stashed at `step`: take=False only says whether there is one."""
        found = self.shard.stashed(step, take)
        return found if take else found is not None

    def _live(self) -> set[str]:
        return {w.split("/", 1)[0] for w in self.shard.control.workers}

    def settle(self) -> None:
        """Mark the names nobody brought to training as lost; stop shard 0 once every name
        is done. The other shards stop when shard 0 releases them."""
        now = time.monotonic()
        with self._lock:
            live = self._live()
            # Dropped counts as done only for a name whose latest holder is the dropped one
            # and that nobody trains under now: a replacement that joined but has not
            # pulled yet keeps its name open, and so does a worker that rejoined.
            dropped = {name for name, (worker, _) in self.joined.items() if worker in self.shard.control.dropped}
            # A name counted as lost whose first pull came late after all (a worker slow to
            # load its data on a busy machine) was brought to training: it is not lost.
            self.lost -= live | dropped
            # A dropped worker may only have stalled (a pause, a swapped-out process, a busy
            # machine): it rejoins at its next call. Its name counts as done a lease after the
            # drop, so that the job does not end under one that comes back at once because
            # the others finished first (its source would then stop short of its end).
            self.dropped_since = {name: self.dropped_since.get(name, now) for name in dropped}
            given_up = {name for name, since in self.dropped_since.items() if now - since > self.lease_s}
            for name in sorted(self.expected - live - dropped - self.finished - self.lost):
                joined = self.joined.get(name)
                if joined is None:
                    waited, limit = now - self.started, self.join_timeout_s
                else:  # joined, never pulled: its lease runs from the join, or from its start line
                    waited, limit = now - max(joined[1], self.at_start.get(name, joined[1])), self.lease_s
                if waited > limit:
                    log.warning("shard %d: %s %s within %.1f s; counted as lost", self.shard.index, name,
                                "never joined" if joined is None else "never pulled", limit)
                    self.lost.add(name)
            if self.expected <= set(self.at_start) | self.lost:
                self.all_at_start.set()
            done = self.finished | (given_up - live) | self.lost
            if self.shard.index == 0 and not self.endless and self.expected <= done:
                self.stopped.set()


def serve_shard(shard: Shard, address: ServerAddress, num_workers: int, lease_s: float,
                description: JobDescription | None = None, on_stop=None, on_checkpoint=None,
                num_shards: int = 1, checkpoint_every_s: float | None = None,
                stop: threading.Event | None = None, ready: threading.Event | None = None) -> None:
    """Serve `shard` on address.port + shard.index until the job ends: shard 0 then calls
    on_stop(snapshots of every shard, lost worker names) (to write the checkpoint) and
    releases the other shards. on_checkpoint(snapshots): shard 0, for every step all
    shards stashed (Shard.checkpoint_every, or every checkpoint_every_s seconds of wall
    clock: the next step every shard reaches after that).

    num_workers=0 serves an endless job: it ends only when `stop` is set (or a caller
    releases shard 0), whoever has joined or left. `ready` is set once the shard takes calls."""
    kernels.backend_for(torch.device("cpu"))  # load (or build) the kernels before the first push needs them
    # An expected worker that has not joined within a call's timeout is counted as lost.
    service = ShardService(shard, num_workers, lease_s, address.timeout_s, description, endless=num_workers == 0)
    host = address.host
    # A thread per worker and spares: a pull never waits for a thread while pushes aggregate.
    methods = service.methods()
    server = transport.serve(methods, host, address.port + shard.index, address.security, threads=num_workers + 4)
    peers = [address.connect(s) for s in range(1, num_shards)] if shard.index == 0 else []
    log.info("shard %d: serving %s, listening on %s:%d", shard.index,
             f"{num_workers} worker{'s' * (num_workers > 1)}" if num_workers else "an endless job", host,
             address.port + shard.index)
    try:
        local_transport.register(address.port + shard.index, methods)
        if ready is not None:
            ready.set()
        for peer in peers:
            if not peer.wait_ready(address.timeout_s):
                raise ParameterServerError(f"{peer.name} did not come up at {peer.address} within "
                                           f"{address.timeout_s:g} s")
        clock = WallClockCheckpoints(checkpoint_every_s) if shard.index == 0 and checkpoint_every_s else None
        # A snapshot asked for is taken at the next step and written as soon as every shard
        # has it: looked for often until then (a version's freshness is the wait).
        asked_at: float | None = None
        while not service.stopped.wait(timeout=STASH_POLL_S if asked_at is not None else min(lease_s / 4, 1.0)):
            if stop is not None and stop.is_set():
                service.stopped.set()
                break
            for worker in shard.drop_silent(lease_s):
                log.warning("shard %d: dropped worker %s (silent for %.1f s)", shard.index, worker, lease_s)
            if shard.index == 0:  # membership is shard 0's: workers join there
                service.settle()
            # Not asked again while one waits: a schedule as short as STASH_WAIT_S would
            # otherwise put off the idle fallback below for ever.
            if clock is not None and asked_at is None and clock.due():
                request_stash(shard, peers)
                asked_at = time.monotonic()
            if asked_at is not None and not shard.stash_pending():
                asked_at = None
            elif asked_at is not None and time.monotonic() - asked_at > STASH_WAIT_S:
                # No step came: the model is idle. One shard is stashed as it is (its last
                # steps, or positions moved by duplicates, are checkpointed all the same);
                # several go on waiting for a step they all reach.
                if not peers:
                    shard.stash_now()
                asked_at = None
            if shard.index == 0 and on_checkpoint is not None:
                write_stashed(shard, peers, on_checkpoint)
        log.info("shard %d: stopping at step %d", shard.index, shard.control.step)
        if shard.index == 0:
            if on_checkpoint is not None:
                # Steps stashed since the last poll (a short job may take them all in one)
                # are still written, before the final checkpoint.
                write_stashed(shard, peers, on_checkpoint)
            snapshots = [shard.snapshot()] + [_ask(peer, "snapshot") for peer in peers]
            if on_stop is not None:
                on_stop(snapshots, sorted(service.lost))
            for peer in peers:
                _ask(peer, "release")
    finally:
        local_transport.unregister(address.port + shard.index, methods)
        server.stop(grace=1.0)
        for peer in peers:
            peer.close()
        log.info("shard %d: stopped", shard.index)


STASH_POLL_S = 0.02  # how often shard 0 looks for a snapshot it asked for
STASH_WAIT_S = 1.0  # how long it waits for the step that snapshot is taken at


class WallClockCheckpoints:
    """When shard 0 next asks the shards for a snapshot: every `every_s` seconds."""

    def __init__(self, every_s: float, clock=time.monotonic):
        self.every_s, self.clock = every_s, clock
        self.last = clock()

    def due(self) -> bool:
        if self.clock() - self.last < self.every_s:
            return False
        self.last = self.clock()
        return True


def request_stash(shard: Shard, peers: list[transport.Connection]) -> None:
    """Every shard stashes a snapshot at the next step none of them has reached yet: one
    step across shards (write_stashed gathers them), taken the moment that step is applied,
    so a version made of it holds the newest batch as soon as it is trained. serve_shard
    takes one shard as it is if no step comes soon; several reach no common step while the
    model does not train, and write no checkpoint until it trains again (the last one, at
    stop, holds whatever came after)."""
    target = max([shard.step()] + [_ask(peer, "step") for peer in peers]) + 1
    shard.stash_at(target)
    for peer in peers:
        _ask(peer, "stash_at", target)


def write_stashed(shard: Shard, peers: list[transport.Connection], on_checkpoint) -> None:
    """Shard 0, during training: on_checkpoint(snapshots) for each step every shard has
    stashed, oldest first. A step some shard has not reached yet is tried again on the
    next call; one left behind by a newer complete step is skipped."""
    for step in shard.stashed_steps():
        if not all(_ask(peer, "stashed", step, False) for peer in peers):
            continue
        snapshots = [shard.stashed(step, take=True)] + [_ask(peer, "stashed", step, True) for peer in peers]
        on_checkpoint(snapshots)


def _ask(peer: transport.Connection, method: str, *args):
    try:
        return peer.call(method, *args)
    except transport.TransportError as err:
        raise ParameterServerError(str(err)) from None


wire.register(Contribution, RowGradient, PushOutcome, Pulled, ShardSnapshot, Scored, JobDescription, FeatureSpec, DenseField,
              SparseField, DynamicTable, TrainConfig, CacheConfig, ShardLayout, TableLayout, DynamicLayout,
              DynamicStats, SparseOptimizer)
