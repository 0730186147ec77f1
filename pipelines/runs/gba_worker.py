"""`picasso gba-worker`: one worker of a running `picasso ps`, training on planted data.

The worker joins the job (picasso.distributed.worker_startup: the model, its TrainConfig
and the layout come from shard 0), reads its planted stream from where the server's
positions say it was trained to (a replacement reads on from there), meets the other
workers at the start line, and trains its rows: each batch pulled, computed and pushed
without waiting for the others (picasso.distributed.worker). After a rejoin it reads on
from what the model has.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from picasso.connectors.synthetic.planted_batches import planted_batches, planted_source
from picasso.distributed.param_server import ParameterServerError, ServerAddress
from picasso.distributed.row_cache import RowCacheConfig
from picasso.distributed.worker_startup import JoinSettings, join_job
from picasso.pipelines.runs.distributed_job import PlantedData, RunError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GBAWorkerSettings:
    address: ServerAddress  # where shard 0 listens, and the credentials
    rank: int  # joins as worker<rank>; a replacement takes the rank of the one it replaces
    data: PlantedData = field(default_factory=PlantedData)
    max_in_flight: int = 2  # pushes per shard not yet answered before the worker waits (0: deterministic)
    row_cache: RowCacheConfig | None = None  # the hottest rows served locally; None: pull every row


def run_gba_worker(settings: GBAWorkerSettings) -> dict:
    """Join, train, leave; the worker's summary (its batches, samples, loss, staleness and
    wall-clock span, and the row cache's counts when it has one)."""
    rank, data, address = settings.rank, settings.data, settings.address
    join = JoinSettings(name=f"worker{rank}", max_in_flight=settings.max_in_flight, row_cache=settings.row_cache,
                        slowdown=data.slowdown(rank), seed=rank, batch_size=data.batch_size)
    # At once: with no server yet, join_job waits for it, up to the timeout, with nothing to say.
    log.info("worker%d: joining the parameter server at %s:%d (waiting up to %g s for it to listen)", rank,
             address.host, address.port, address.timeout_s)
    try:
        joined = join_job(address, join)
    except (ParameterServerError, ValueError) as err:
        raise RunError(str(err)) from err
    try:
        spec = joined.description.spec
        stream = data.stream_of(rank)
        source = planted_source(stream)
        start = joined.positions().get(source, 0)  # resume where trained: a replacement reads on from there
        end = start + data.rows
        batches = planted_batches(spec, data.rows, data.batch_size, stream, start)

        def reread(positions: dict[str, int]):  # after a rejoin: on from what the model has
            at = positions.get(source, start)
            return planted_batches(spec, end - at, data.batch_size, stream, at)

        joined.start_line()
        began = time.time()  # wall clock: the benchmark spans every worker's run with it
        stats = joined.worker.train(batches, reread)
    except ParameterServerError as err:
        raise RunError(str(err)) from err
    finally:
        joined.close()
    log.info("%s: done: %d batches, %d samples, mean loss %.4f", joined.name, stats.batches, stats.samples,
             stats.mean_loss)
    cached = settings.row_cache is not None
    saved = {f"row_cache_{k}": v for k, v in joined.client.stats.as_metrics().items()} if cached else {}
    return {"worker": joined.name, "batches": stats.batches, "samples": stats.samples, "mean_loss": stats.mean_loss,
            "refused": stats.refused, "duplicates": stats.duplicates, "rejoined": stats.rejoined,
            "mean_staleness": stats.mean_staleness, "seconds": stats.seconds, "start": start, "began": began,
            "ended": began + stats.seconds, **saved}
