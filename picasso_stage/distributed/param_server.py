"""The parameter server over torch.distributed.rpc (TensorPipe), and the worker's client.

Processes and names: one RPC group of `num_shards + num_workers` processes, shards at
ranks 0..S-1 named ps0, ps1, ..., workers after them named worker0, worker1, ... Each
shard process serves one `Shard` (shard.py) through the module-level functions below;
RPC runs them on its thread pool, and the shard's lock makes each atomic.

The client (`PSClient`) splits a worker's requests by owner (layout.py): a pull asks each
shard for its rows (and shard 0 for the dense parameters) and reassembles them in the
order asked; a push sends every shard its part with rpc_async and returns at once, so
the worker computes its next batch while the shards aggregate. Every shard receives every
push, even one with none of its rows: each shard counts the same local batches towards
its global batches. At most `max_in_flight` pushes per shard are outstanding; a worker
further ahead waits for the oldest (a bound on memory, not a barrier between workers;
0 makes every push complete before the next pull, for runs that must be deterministic).

A shard stops when every worker has said it is done or has been dropped. Workers that go
silent for `lease_s` are dropped: their buffered batches leave the global batch. A dropped
worker that is still alive (it stalled past its lease: a long pause, a partition) finds
out at its next pull, rejoins under a new incarnation (`PSClient.rejoin`) and reads its
source on from the server's positions, so the batches it lost are trained after all.

Workers meet at a start line on shard 0 (`_start_line`) after loading their data and
before training, so a job's training is timed from a common start.

Limitation (torch 2.13): the group is static. A worker that dies is dropped (its buffered
batches leave the global batch, its token is refused) and the others train on, but a
replacement process cannot join the running group. Checked with real processes (a server
and a worker in a dynamic group, `world_size=None`, TCP transport; the worker killed with
SIGKILL; a second worker joining under a new name): the join handshake calls every member
listed in the rendezvous store, the dead one included, inside the store's membership
critical section; that call fails after the RPC timeout, the join raises, and the
membership token it held is never released, so every later join waits on it too. A
static group cannot take a new process at a dead rank either (its rendezvous is a
one-time barrier). A live member rejoins under a new incarnation (above); a new process
would need a transport whose membership tolerates dead peers.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

import torch
import torch.distributed.rpc as rpc

from picasso import kernels
from picasso.distributed.aggregation import Contribution, RowGradient
from picasso.distributed.layout import ShardLayout
from picasso.distributed.local_gradient import LocalGradient
from picasso.distributed.shard import Pulled, Shard, ShardSnapshot
from picasso.distributed.gba import PushOutcome, WorkerDropped, worker_id

log = logging.getLogger(__name__)


class ParameterServerError(RuntimeError):
    """A shard could not be reached, or refused the call (a dropped worker's pull, say)."""


@dataclass(frozen=True)
class Group:
    """Where the RPC group meets and who is in it."""

    init_method: str  # tcp://127.0.0.1:PORT
    num_shards: int
    num_workers: int
    timeout_s: float = 60.0  # for joining and for each call

    @property
    def world_size(self) -> int:
        return self.num_shards + self.num_workers

    def options(self) -> rpc.TensorPipeRpcBackendOptions:
        # One thread per worker and two spare: a shard never makes a worker's call wait
        # for a thread while another worker's push aggregates.
        # TCP (libuv) only: TensorPipe's default shared-memory transport busy-polls its
        # rings, one spinning thread per process. With more processes than cores (4
        # workers and a server on 2 cores here) the spinning takes the CPU from the
        # gradients: measured on the benchmark, libuv gave up to 2x the samples/s.
        return rpc.TensorPipeRpcBackendOptions(init_method=self.init_method, rpc_timeout=self.timeout_s,
                                               num_worker_threads=self.num_workers + 2, _transports=["uv"])


def shard_name(index: int) -> str:
    return f"ps{index}"


# -- the server side: one shard per process --------------------------------------------------

class _Served:
    def __init__(self, shard: Shard, num_workers: int, lease_s: float):
        self.shard = shard
        self.finished: set[str] = set()
        self.expected = {f"worker{r}" for r in range(num_workers)}
        self.lease_s = lease_s
        self.met_at: float | None = None  # when the group met
        self.lost: set[str] = set()  # workers that met the group but never called within a lease
        self.stopped = threading.Event()
        self.description = None
        self.at_start: dict[str, float] = {}  # workers that reached the start line, and when
        self.all_at_start = threading.Event()

    def settle(self) -> None:
        """Shard 0 stops once every worker has finished or been dropped; the others stop
        when shard 0 releases them, after it has read their state for the checkpoint."""
        control = self.shard.control
        heard = {w.split("/", 1)[0] for w in (*control.workers, *control.dropped)} | self.finished
        now = time.monotonic()
        if self.met_at is not None:
            # A worker that died between meeting the group and its first pull has no
            # incarnation to drop; without this the server would wait for it forever.
            # Its lease runs from the meeting, or from its start line when it reached it.
            for name in sorted(self.expected - heard - self.lost):
                if now - max(self.met_at, self.at_start.get(name, self.met_at)) > self.lease_s:
                    log.warning("shard %d: worker %s never pulled within %.1f s; counted as lost",
                                self.shard.index, name, self.lease_s)
                    self.lost.add(name)
        if self.expected <= set(self.at_start) | self.lost:
            self.all_at_start.set()
        # A dropped worker is gone unless it has rejoined under a new incarnation.
        live = {w.split("/", 1)[0] for w in control.workers}
        gone = self.finished | ({w.split("/", 1)[0] for w in control.dropped} - live) | self.lost
        if self.shard.index == 0 and self.expected <= gone:
            self.stopped.set()


_served: _Served | None = None


def _here() -> _Served:
    if _served is None:
        raise RuntimeError("this process serves no parameter-server shard")
    return _served


def _pull(worker: str, rows: dict[str, torch.Tensor], dense: bool) -> Pulled:
    return _here().shard.pull(worker, rows, dense)


def _push(contribution: Contribution) -> PushOutcome:
    return _here().shard.push(contribution)


def _snapshot() -> ShardSnapshot:
    return _here().shard.snapshot()


def _forget(worker: str) -> int:
    """Drop an incarnation that has rejoined under a new one (every shard at once, rather
    than each when its lease runs out)."""
    return _here().shard.drop_worker(worker)


def _finish(worker: str) -> None:
    served = _here()
    served.shard.retire(worker)
    served.finished.add(worker.split("/", 1)[0])
    served.settle()


def _release() -> None:
    _here().stopped.set()


def _stashed(step: int, take: bool):
    """This shard's snapshot stashed at `step`: take=False only says whether there is one."""
    found = _here().shard.stashed(step, take)
    return found if take else found is not None


def _positions() -> dict[str, int]:
    """How far the model is trained into each source: where a joining worker reads on from."""
    return _here().shard.positions()


def _start_line(worker: str) -> None:
    """Wait until every expected worker has reached its start line or is lost, for at
    most half a lease (so the waiting worker pulls well within its own): workers plant or
    load their data at different speeds, and a job timed from its first worker's start
    would otherwise count the others' loading as training time. A worker that rejoins
    later finds the line crossed and goes on at once."""
    served = _here()
    served.at_start[worker.split("/", 1)[0]] = time.monotonic()
    served.settle()
    served.all_at_start.wait(served.lease_s / 2)


def _describe():
    """What a joining worker needs to build the same model: (spec YAML, TrainConfig as a
    dict, layout), from shard 0, so workers and servers cannot disagree."""
    return _here().description


def serve_shard(shard: Shard, group: Group, lease_s: float, description=None, on_stop=None,
                on_checkpoint=None) -> None:
    """Serve `shard` until every worker is done or dropped; then shard 0 calls
    on_stop(snapshots of every shard) (to write the checkpoint), releases the other shards
    and everyone leaves the group."""
    global _served
    kernels.backend_for(torch.device("cpu"))  # load (or build) the kernels before the first push needs them
    _served = _Served(shard, group.num_workers, lease_s)
    _served.description = description
    rpc.init_rpc(shard_name(shard.index), rank=shard.index, world_size=group.world_size,
                 rpc_backend_options=group.options())
    _served.met_at = time.monotonic()
    log.info("shard %d: serving %d workers in a group of %d", shard.index, group.num_workers, group.world_size)
    try:
        while not _served.stopped.wait(timeout=min(lease_s / 4, 1.0)):
            for worker in shard.drop_silent(lease_s):
                log.warning("shard %d: dropped worker %s (silent for %.1f s)", shard.index, worker, lease_s)
            _served.settle()
            if shard.index == 0 and on_checkpoint is not None:
                write_stashed(shard, group.num_shards, on_checkpoint)
        log.info("shard %d: stopping at step %d", shard.index, shard.control.step)
        if shard.index == 0 and on_checkpoint is not None:
            # Steps stashed since the last poll (a short job may take them all in one) are
            # still written, before the final checkpoint.
            write_stashed(shard, group.num_shards, on_checkpoint)
        if shard.index == 0:
            snapshots = gather_snapshots(group.num_shards)
            if on_stop is not None:
                on_stop(snapshots, sorted(_served.lost))
            for s in range(1, group.num_shards):
                try:
                    rpc.rpc_sync(shard_name(s), _release)
                except RuntimeError:  # it may leave the group before its answer is sent
                    log.debug("shard %d left while being released", s)
    finally:
        # Not graceful: a graceful shutdown waits for every member, and a dead worker never comes.
        rpc.shutdown(graceful=False)
        _served = None
        log.info("shard %d: left the group", shard.index)


def write_stashed(shard: Shard, num_shards: int, on_checkpoint) -> None:
    """Shard 0, during training: on_checkpoint(snapshots) for each step every shard has
    stashed (Shard.checkpoint_every), oldest first. A step some shard has not reached yet
    is tried again on the next call; one left behind by a newer complete step is skipped."""
    for step in shard.stashed_steps():
        if not all(rpc.rpc_sync(shard_name(s), _stashed, args=(step, False)) for s in range(1, num_shards)):
            continue
        snapshots = [shard.stashed(step, take=True)]
        snapshots += [rpc.rpc_sync(shard_name(s), _stashed, args=(step, True)) for s in range(1, num_shards)]
        on_checkpoint(snapshots)


def gather_snapshots(num_shards: int) -> list[ShardSnapshot]:
    """Every shard's state, asked from any member of the group."""
    return [rpc.rpc_sync(shard_name(s), _snapshot) for s in range(num_shards)]


# -- the worker side ----------------------------------------------------------------------------

@dataclass(frozen=True)
class PulledBatch:
    tokens: tuple[int, ...]  # per shard
    dense: dict[str, torch.Tensor]
    rows: dict[str, torch.Tensor]  # table key -> rows asked for
    values: dict[str, torch.Tensor]  # table key -> their values, in that order
    versions: dict[str, torch.Tensor]
    stop: bool  # shard 0 says the job's sample budget is spent


class PSClient:
    def __init__(self, layout: ShardLayout, worker: str, max_in_flight: int = 2, call=None):
        """call(shard, fn, args, asynchronous) -> a value or a torch Future; the default
        goes over RPC, tests may pass one that calls Shard objects in process."""
        self.layout, self.worker, self.max_in_flight = layout, worker, max_in_flight
        self._call = call or _rpc_call
        self._in_flight: list[list[torch.futures.Future]] = [[] for _ in range(layout.num_shards)]
        self.outcomes: list[PushOutcome] = []  # shard 0's answers to this worker's pushes
        self._pushed = 0  # pushes so far: the next push's sequence number

    def pull(self, rows: dict[str, torch.Tensor]) -> PulledBatch:
        owners = {key: self.layout.owner(r) for key, r in rows.items()}
        answers = [self._call(s, _pull, (self.worker, {k: r[owners[k] == s] for k, r in rows.items()}, s == 0), False)
                   for s in range(self.layout.num_shards)]
        dropped = [shard_name(s) for s, answer in enumerate(answers) if answer.dropped]
        if dropped:
            raise WorkerDropped(f"{self.worker} was dropped by {', '.join(dropped)} (silent past its lease?)")
        values, versions = {}, {}
        for key, wanted in rows.items():
            dim = self.layout.table(key).dim
            values[key] = torch.empty(wanted.numel(), dim)
            versions[key] = torch.empty(wanted.numel(), dtype=torch.int64)
            for s, answer in enumerate(answers):
                mine = owners[key] == s
                values[key][mine], versions[key][mine] = answer.rows[key], answer.versions[key]
        return PulledBatch(tuple(a.token for a in answers), answers[0].dense, rows, values, versions, answers[0].stop)

    def push(self, pulled: PulledBatch, gradient: LocalGradient, positions: dict[str, int] | None = None) -> None:
        """Send every shard its part; returns without waiting for the shards' answers.
        positions: where the batch ends in its sources (shard 0 records them for checkpoints)."""
        self.collect()
        for s in range(self.layout.num_shards):
            sparse = {}
            for key, rows in gradient.rows.items():
                mine = self.layout.owner(rows) == s
                sparse[key] = RowGradient(rows[mine], gradient.row_grads[key][mine], pulled.versions[key][mine])
            contribution = Contribution(self.worker, pulled.tokens[s], gradient.samples,
                                        gradient.dense if s == 0 else {}, sparse, (positions or {}) if s == 0 else {},
                                        sequence=self._pushed)
            while len(self._in_flight[s]) > self.max_in_flight - 1 and self._in_flight[s]:
                self._settle(s, self._in_flight[s].pop(0))
            future = self._call(s, _push, (contribution,), True)
            if self.max_in_flight == 0:
                self._settle(s, future)
            else:
                self._in_flight[s].append(future)
        self._pushed += 1

    def rejoin(self) -> None:
        """Go on as a new incarnation of this worker, after the shards dropped this one: its
        unanswered pushes are taken (refused), and pushes are numbered from 0 again."""
        self.drain()
        old, name = self.worker, self.worker.split("/", 1)[0]
        for s in range(self.layout.num_shards):  # the shards that have not dropped it yet do so now
            self._call(s, _forget, (old,), False)
        self.worker = worker_id(name, uuid.uuid4().hex[:8])
        self._pushed = 0
        log.info("%s rejoined as %s", old, self.worker)

    def positions(self) -> dict[str, int]:
        """How far the model is trained into each source: where a rejoining worker reads on."""
        return self._call(0, _positions, (), False)

    def collect(self) -> None:
        """Take the answers of finished pushes (raising a shard's error, if one came back)."""
        for s, futures in enumerate(self._in_flight):
            while futures and futures[0].done():
                self._settle(s, futures.pop(0))

    def drain(self) -> None:
        for s, futures in enumerate(self._in_flight):
            while futures:
                self._settle(s, futures.pop(0))

    def finish(self) -> None:
        self.drain()
        for s in range(self.layout.num_shards):
            self._call(s, _finish, (self.worker,), False)

    def _settle(self, shard: int, future: torch.futures.Future) -> None:
        try:
            outcome = future.wait()
        except Exception as err:
            raise ParameterServerError(f"shard {shard_name(shard)} failed a push from {self.worker}: {err}") from err
        if shard == 0:
            self.outcomes.append(outcome)


def in_process(shards: list[Shard]):
    """A `call` for PSClient that reaches Shard objects in this process instead of over
    RPC: the same client, for tests and one-process runs."""
    methods = {_pull: "pull", _push: "push", _positions: "positions", _forget: "drop_worker"}

    def call(index: int, fn, args: tuple, asynchronous: bool):
        if fn is _finish:
            return None
        result = getattr(shards[index], methods[fn])(*args)
        if not asynchronous:
            return result
        future = torch.futures.Future()
        future.set_result(result)
        return future

    return call


def _rpc_call(shard: int, fn, args: tuple, asynchronous: bool):
    name = shard_name(shard)
    if asynchronous:
        return rpc.rpc_async(name, fn, args=args)
    try:
        return rpc.rpc_sync(name, fn, args=args)
    except (RuntimeError, ValueError) as err:  # unreachable, or a refusal raised over there
        raise ParameterServerError(f"parameter-server shard {name} failed {fn.__name__[1:]}: {err}") from err
