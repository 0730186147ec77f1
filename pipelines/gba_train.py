"""PicassoTrain(mode="gba"): each Beam worker process is one GBA worker of a running `picasso ps`.

The parameter server's RPC group is static (param_server.py): it has `--workers` member
slots, worker ranks 0..N-1. A Beam worker process does not know its index among the
runner's workers, so the first DoFn instance in a process claims the next free rank from
the group's own rendezvous store (an atomic counter on shard 0's TCPStore, the one
`init_rpc` meets at) and joins as `worker<rank>`, with a fresh incarnation id (pid and a
uuid) so its pushes are told apart from any earlier process's. The model comes from shard
0's description, so a pipeline cannot train a model the server does not hold.

Every DoFn instance in the process shares that one member (torch.distributed.rpc allows
one per process), under a lock: a PSClient is not thread-safe. Each batch is pulled,
computed and pushed; the push returns at once (rpc_async), so the worker never waits for
the server or for other workers. When the last DoFn instance of the process is torn down
(Beam does so when the runner's control channel closes, after the last bundle) the member
drains its pushes, tells every shard it finished, and leaves the group. Shard 0 writes the
job's checkpoint once every worker has left: in gba mode that checkpoint is the server's,
and this transform's one output is the merged statistics of the workers' bundles.

With a multi-process FnApiRunner, give the stage before training at least as many input
splits (sources, keyed up front) as workers: a worker that never gets a bundle never
joins, and the group cannot meet without it. Each source should be read by one worker, in
order, so that a checkpoint's positions are a prefix of every source (FACTS.md: split up
front, never self-checkpoint).
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from picasso.batch import PackedBatch
from picasso.distributed.row_cache import CachedPSClient, RowCacheConfig
from picasso.spec import FeatureSpec
from picasso.trainer import TrainStats

log = logging.getLogger(__name__)
_RANK_KEY = "picasso/gba/claimed_ranks"  # the counter on the rendezvous store


@dataclass(frozen=True)
class PSAddress:
    """Where the parameter server (`picasso ps`) meets its workers, and its group's shape:
    the same values as its --host, --port, --shards and --workers."""

    host: str
    port: int
    num_shards: int
    num_workers: int  # the runner's worker processes (--direct_num_workers)
    timeout_s: float = 60.0
    max_in_flight: int = 2  # pushes per shard not yet answered before a worker waits
    # The hot-row cache in front of the server (picasso.distributed.row_cache); None: every
    # row of every batch is pulled.
    row_cache: RowCacheConfig | None = None

    def group(self):
        from picasso.distributed.param_server import Group

        return Group(f"tcp://{self.host}:{self.port}", self.num_shards, self.num_workers, self.timeout_s)


def claim_rank(address: PSAddress) -> int:
    """The next free worker rank of the group, from its rendezvous store (atomic across
    processes and hosts)."""
    from torch.distributed import TCPStore

    store = TCPStore(address.host, address.port, is_master=False, timeout=timedelta(seconds=address.timeout_s))
    rank = store.add(_RANK_KEY, 1) - 1
    if rank >= address.num_workers:
        raise RuntimeError(f"worker rank {rank} claimed, but the parameter server at {address.host}:{address.port} "
                           f"has {address.num_workers} worker slots: run as many Beam workers as `picasso ps --workers`")
    return rank


class _Member:
    """This process's one GBA worker: joined on first use, left when its last user goes."""

    def __init__(self, address: PSAddress, spec: FeatureSpec):
        import torch.distributed.rpc as rpc

        from picasso.distributed.gba import worker_id
        from picasso.distributed.local_gradient import GradientComputer
        from picasso.distributed.param_server import PSClient, _describe, _start_line, shard_name
        from picasso.distributed.worker import GBAWorker
        from picasso.models import build_model
        from picasso.packing import PackingPlan
        from picasso.pipelines.distributed_cli import _port_open

        group = address.group()
        if not _port_open(address.host, address.port, address.timeout_s):
            raise RuntimeError(f"no parameter server at {address.host}:{address.port} after {address.timeout_s:g} s")
        self.rank = claim_rank(address)
        self.name = f"worker{self.rank}"
        rpc.init_rpc(self.name, rank=address.num_shards + self.rank, world_size=group.world_size,
                     rpc_backend_options=group.options())
        try:
            served_spec, config, layout = rpc.rpc_sync(shard_name(0), _describe)
            if served_spec != spec:
                raise ValueError(f"the parameter server trains spec {served_spec.name!r}, the pipeline packs "
                                 f"{spec.name!r}: start `picasso ps` with the pipeline's spec")
            model = build_model(config.model, spec, PackingPlan.from_spec(spec), config.hidden)
            client = PSClient(layout, worker_id(self.name, f"{os.getpid()}-{uuid.uuid4().hex[:8]}"), address.max_in_flight)
            if address.row_cache is not None:
                client = CachedPSClient(client, address.row_cache, seed=self.rank)
            self.worker = GBAWorker(client, GradientComputer(model))
            # Meet the other workers before the first batch, as `gba-worker` does: a process
            # the runner started late would otherwise find the model many steps on, and its
            # first pushes dropped as too stale.
            rpc.rpc_sync(shard_name(0), _start_line, args=(client.worker,))
        except BaseException:
            rpc.shutdown(graceful=False)
            raise
        self.users = 0
        self.stopped = False  # shard 0 said the sample budget is spent
        self.lock = threading.Lock()
        log.info("joined the parameter server as %s (%s)", self.name, client.worker)

    def leave(self) -> None:
        import torch.distributed.rpc as rpc

        try:
            client = self.worker.client
            client.finish()  # drains this worker's pushes first
            log.info("%s finished", self.name)
            if isinstance(client, CachedPSClient):
                log.info("%s: the row cache served %d of %d rows (%.1f MB the server did not send)", self.name,
                         client.stats.rows_served, client.stats.rows_asked, client.stats.bytes_saved / 1e6)
        finally:
            rpc.shutdown(graceful=False)


_member: _Member | None = None
_member_lock = threading.Lock()


def _acquire(address: PSAddress, spec: FeatureSpec) -> _Member:
    global _member
    with _member_lock:
        if _member is None:
            _member = _Member(address, spec)
        _member.users += 1
        return _member


def _release() -> None:
    global _member
    with _member_lock:
        if _member is None:
            return
        _member.users -= 1
        if _member.users == 0:
            member, _member = _member, None
            member.leave()


class _GBATrainDoFn(beam.DoFn):
    def __init__(self, address: PSAddress, spec: FeatureSpec):
        self.address, self.spec = address, spec
        self.member: _Member | None = None

    def setup(self):
        self.member = _acquire(self.address, self.spec)

    def start_bundle(self):
        from picasso.distributed.worker import WorkerStats

        self.stats = WorkerStats()
        self.positions: dict[str, int] = {}

    def process(self, batch: PackedBatch):
        from picasso.trainer import merge_positions

        member = self.member
        with member.lock:
            # After the budget is spent the batch is neither trained nor counted: its positions
            # stay unconsumed, so a resumed job reads it.
            if not member.stopped and member.worker.step(batch, self.stats):
                self.positions = merge_positions(self.positions, batch.positions)
            else:
                member.stopped = True
        return ()

    def finish_bundle(self):
        stats = TrainStats(steps=self.stats.batches, samples=self.stats.samples, loss_sum=self.stats.loss_sum,
                           positions=self.positions)
        yield WindowedValue(stats, MIN_TIMESTAMP, [GlobalWindow()])

    def teardown(self):
        if self.member is not None:
            self.member = None
            _release()


class GBATrain(beam.PTransform):
    """PackedBatches in; one TrainStats out (steps counts the workers' local batches), once
    every batch is pushed. The model is the parameter server's, and so is the checkpoint."""

    def __init__(self, address: PSAddress, spec: FeatureSpec):
        super().__init__()
        self.address, self.spec = address, spec

    def expand(self, batches):
        from picasso.pipelines.train import _MergeStats

        return (
            batches
            | "GBAStep" >> beam.ParDo(_GBATrainDoFn(self.address, self.spec))
            | "MergeStats" >> beam.CombineGlobally(_MergeStats())
        )
