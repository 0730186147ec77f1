"""PicassoTrain(GBAHandler(...))'s engine: each Beam worker process is one GBA worker of a running
`picasso ps`. The transform is train.py's, the handler train_handlers.GBAHandler; this
module holds the server's address and the process's membership of the job.

The first DoFn instance in a process joins the job (picasso.distributed.worker_startup) without a
name: a Beam worker process does not know its index among the runner's workers, so the
server gives it the first free one, and a process the runner starts to replace a dead one
takes the dead one's name. The model comes from the server's description, so a pipeline
cannot train a model the server does not hold.

Every DoFn instance in the process shares that one member under a lock (a PSClient is not
thread-safe, and one member per process keeps one copy of the model). Each batch is
pulled, computed and pushed; the push returns at once, so the worker never waits for the
server or for other workers. When the last DoFn instance of the process is torn down (Beam
does so when the runner's control channel closes, after the last bundle) the member drains
its pushes, tells every shard it finished, and disconnects. Shard 0 writes the job's
checkpoint once every worker is done: in gba mode that checkpoint is the server's, and the
transform's one output is the merged statistics of the workers' steps.

With a multi-process FnApiRunner, give the stage before training at least as many input
splits (sources, keyed up front) as workers: a worker that never gets a bundle never
joins, and the server waits for it up to its --timeout. Each source should be read by one
worker, in order, so that a checkpoint's positions are a prefix of every source (FACTS.md:
split up front, never self-checkpoint).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from picasso.distributed.worker_startup import JoinSettings, join_job
from picasso.distributed.param_server import ParameterServerError, ServerAddress
from picasso.distributed.row_cache import RowCacheConfig
from picasso.distributed.transport import Security
from picasso.spec import FeatureSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PSAddress:
    """Where the parameter server (`picasso ps`) listens: its --host and --port."""

    host: str
    port: int
    timeout_s: float = 60.0
    max_in_flight: int = 2  # pushes per shard not yet answered before a worker waits
    # The hot-row cache in front of the server (picasso.distributed.row_cache); None: every
    # row of every batch is pulled.
    row_cache: RowCacheConfig | None = None
    # TLS (the CA to trust) and the token. Without a token, each worker process reads
    # $PICASSO_PS_TOKEN (a secret is better kept out of the pipeline's serialized graph).
    security: Security | None = None
    # The server runs in the process that starts the pipeline (the endless job's own): a
    # worker running in that process too calls it directly, others over gRPC.
    in_process: bool = False
    # The pipeline's batch size (rows per packed batch): each push says it (JoinSettings.batch_size).
    batch_size: int = 0


class _Member:
    """This process's one GBA worker: joined on first use, left when its last user goes."""

    def __init__(self, address: PSAddress, spec: FeatureSpec):
        server = ServerAddress(address.host, address.port, address.timeout_s,
                               (address.security or Security()).with_env_token(), address.in_process)
        self.joined = join_job(server, JoinSettings(max_in_flight=address.max_in_flight, row_cache=address.row_cache,
                                                        batch_size=address.batch_size),
                               spec)
        try:
            self.joined.start_line()
        except BaseException:
            self.joined.close()
            raise
        self.worker = self.joined.worker
        self.users = 0
        self.stopped = False  # shard 0 said the sample budget is spent
        self.lock = threading.Lock()
        # A stream may bring nothing to train for longer than the lease (a quiet hour of an
        # endless job): the member renews it meanwhile, so the server drops only a process
        # that died or froze. Its pushes would otherwise be refused, and its next pull fail.
        self._left = threading.Event()
        self._keep_alive = threading.Thread(target=self._renew_lease, args=(self.joined.description.lease_s / 3,),
                                            name="gba-member-lease", daemon=True)
        self._keep_alive.start()

    def _renew_lease(self, every_s: float) -> None:
        while not self._left.wait(every_s):
            try:
                self.joined.client.renew()
            except ParameterServerError as err:  # the next pull says what happened, and fails the bundle
                log.warning("%s could not renew its lease: %s", self.joined.name, err)

    def leave(self) -> None:
        self._left.set()
        try:
            self.joined.leave()
        except ParameterServerError as err:
            # The server is gone (the job fails for it, and says so): nothing to tell it. A
            # server that comes back drops this worker when its lease runs out.
            log.warning("%s could not tell the server it finished: %s", self.joined.name, err)
            return
        log.info("%s finished", self.joined.name)


_member: _Member | None = None
_member_lock = threading.Lock()


def acquire_member(address: PSAddress, spec: FeatureSpec) -> _Member:
    """This process's member, joining the job if it has none; counted until release_member."""
    global _member
    with _member_lock:
        if _member is None:
            _member = _Member(address, spec)
        _member.users += 1
        return _member


def release_member() -> None:
    """One user fewer; the last one leaves the job."""
    global _member
    with _member_lock:
        if _member is None:
            return
        _member.users -= 1
        if _member.users == 0:
            member, _member = _member, None
            member.leave()
