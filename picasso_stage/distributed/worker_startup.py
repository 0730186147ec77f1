"""Joining a running GBA (or async) job as one worker: the one way in, for the command
line (`picasso gba-worker`) and for Beam (PicassoTrain with a GBAHandler).

In order: wait for shard 0 (a server that never comes is a clear error, not a hang), read
the job's description from it (spec, TrainConfig, layout: a worker cannot train a model
the server does not hold), connect to every shard, join under a name (given, or the first
free one), and build the model, the client and its optional row cache; then, once the
worker's data is ready, cross the start line (`Joined.start_line`). A job may be joined at any global step; the worker trains from wherever the model is.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass

import torch

from picasso import kernels
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.param_server import JobDescription, ParameterServerError, ServerAddress
from picasso.distributed.ps_client import PSClient, over_grpc
from picasso.distributed.row_cache import CachedPSClient, RowCacheConfig
from picasso.distributed.transport import Connection, TransportError
from picasso.distributed.worker import GBAWorker
from picasso.packing import PackingPlan
from picasso.spec import FeatureSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JoinSettings:
    """How this worker joins: the same values as gba-worker's flags."""

    name: str | None = None  # worker0..; None: the server gives the first free name
    max_in_flight: int = 2  # pushes per shard not yet answered before the worker waits
    row_cache: RowCacheConfig | None = None  # hot rows served locally; None: every row pulled
    slowdown: float = 1.0  # a straggler on purpose (worker.Straggler), for benchmarks
    seed: int = 0  # the row cache's sampling
    # The local batch this worker's source is cut into: its pushes say it, so that the
    # server weighs a short batch's samples as a full one's (aggregation.py). 0: unsaid.
    batch_size: int = 0


@dataclass
class Joined:
    """A worker in a job: train with `worker`, then `leave()`."""

    worker: GBAWorker
    description: JobDescription
    connections: list[Connection]
    timeout_s: float

    @property
    def client(self) -> PSClient | CachedPSClient:
        return self.worker.client

    @property
    def name(self) -> str:
        return self.client.worker.split("/", 1)[0]

    def positions(self) -> dict[str, int]:
        """How far the model is trained into each source: where this worker reads on from."""
        return self.client.positions()

    def start_line(self) -> None:
        """Meet the other workers before the first batch (once this worker's data is
        ready): a process started late would otherwise find the model many steps on, and
        its first pushes dropped as too stale. A job already under way is joined at once."""
        try:
            self.connections[0].call("start_line", self.client.worker,
                                     timeout_s=self.timeout_s + self.description.lease_s)
        except TransportError as err:
            raise ParameterServerError(str(err)) from None

    def leave(self) -> None:
        """Drain this worker's pushes, tell every shard it finished, and disconnect."""
        try:
            self.client.finish()
            if isinstance(self.client, CachedPSClient):
                stats = self.client.stats
                log.info("%s: the row cache served %d of %d rows (%.1f MB the server did not send)", self.name,
                         stats.rows_served, stats.rows_asked, stats.bytes_saved / 1e6)
        finally:
            self.close()

    def close(self) -> None:
        for connection in self.connections:
            connection.close()


def join_job(address: ServerAddress, settings: JoinSettings = JoinSettings(),
             spec: FeatureSpec | None = None) -> Joined:
    """spec: the one the caller packs its batches with; refused unless it is the server's."""
    # Load (or build) the kernels before joining, as the server does before serving: loading
    # takes their build lock, which other processes of this machine may hold for seconds,
    # and a worker that joined first would be silent meanwhile and could outlive its lease.
    kernels.backend_for(torch.device("cpu"))
    first = address.connect(0)
    connections = [first]
    try:
        if not first.wait_ready(address.timeout_s):
            raise ParameterServerError(f"no parameter server at {address.host}:{address.port} after "
                                       f"{address.timeout_s:g} s (start `picasso ps` first, with the same --port)")
        description = first.call("describe")
        if settings.row_cache is not None and description.spec.dynamic_fields:
            # Refused before joining: its rows change keys on the shards, unseen by the cache.
            raise ValueError("the row cache serves rows by number, and a dynamic table's rows change hands on the "
                             f"shards: turn it off (--row-cache off) for spec {description.spec.name!r}, whose "
                             f"{', '.join(f.name for f in description.spec.dynamic_fields)} are dynamic")
        if spec is not None and description.spec != spec:
            raise ValueError(f"the parameter server trains spec {description.spec.name!r}, the pipeline packs "
                             f"{spec.name!r}: start `picasso ps` with the pipeline's spec")
        layout = description.layout
        connections += [address.connect(s) for s in range(1, layout.num_shards)]
        for connection in connections[1:]:  # shard 0 starts the others: they may come up later
            if not connection.wait_ready(address.timeout_s):
                raise ParameterServerError(f"{connection.name} did not come up at {connection.address} within "
                                           f"{address.timeout_s:g} s")
        worker_name, replaced = first.call("join", settings.name, f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
        if replaced is not None:  # its pushes must not count beside ours: drop it everywhere now
            for connection in connections:
                connection.call("forget", replaced)
        client = PSClient(layout, worker_name, settings.max_in_flight, call=over_grpc(connections))
        if settings.row_cache is not None:
            client = CachedPSClient(client, settings.row_cache, seed=settings.seed)
        config = description.config
        model = config.build_model(description.spec, PackingPlan.from_spec(description.spec))
        joined = Joined(GBAWorker(client, GradientComputer(model, settings.batch_size), settings.slowdown, description.prequential),
                        description, connections, address.timeout_s)
    except TransportError as err:
        _close(connections)
        raise ParameterServerError(str(err)) from None
    except BaseException:
        _close(connections)
        raise
    log.info("joined the parameter server as %s", worker_name)
    return joined


def _close(connections: list[Connection]) -> None:
    for connection in connections:
        connection.close()
