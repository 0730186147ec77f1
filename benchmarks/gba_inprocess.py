"""Sync, GBA and plain async in one process, with the order in which pushes land under control.

W workers take turns against the Shard and PSClient that `picasso ps` serves, called in
process. Each turn one worker pulls, computes its local batch's gradients and sends its push,
which lands `delay` +- JITTER turns later; the turn's worker is drawn at random (`order`
seeds both). With order None the workers go round robin and every push lands at once: with
M = W every pull of a round sees the same step, which is a sync step (tests/test_gba_sync.py
checks that arithmetic against torchrun's sync-worker; on benchmarks.gba's first draw of
data the two train to the same held-out AUC, 0.801355, to six digits).

benchmarks.gba_staleness measures the modes this way, without the scheduler's noise, and
both GBA benchmarks train the model every mode starts from with `warm_up`.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from picasso.batch import PackedBatch
from picasso.checkpoint import save_checkpoint
from picasso.connectors.testing.param_server import in_process
from picasso.distributed.gba import GBAConfig
from picasso.distributed.layout import ShardLayout
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.ps_checkpoint import build_shard, trainer_state
from picasso.distributed.ps_client import PSClient
from picasso.distributed.shard import Shard
from picasso.distributed.staleness import NO_DECAY
from picasso.packing import PackingPlan
from picasso.connectors.synthetic.planted_batches import planted_batches
from picasso.trainer import Trainer

HOLDOUT_STREAM = 9_999  # the held-out rows' planted stream: no worker trains on it
WARM_STREAM_BASE = 500  # warm_up's streams (plus 1,000 per repeat): none a measured run reads
JITTER = 2  # a push lands within delay +- this many turns


@dataclass(frozen=True)
class Schedule:
    """Who trains on what, and when pushes land."""

    workers: int
    batch_size: int
    rows: int  # samples per worker
    stream_base: int  # worker r reads planted stream stream_base + r
    order: int | None = None  # seed of the turn order and the delays; None: round robin, no delay
    delay: int = 4  # turns between a pull and its push landing (4: the staleness real runs measure)

    def __post_init__(self):
        if self.rows < self.batch_size:
            raise ValueError(f"each worker needs at least one batch: rows {self.rows} < batch size {self.batch_size}")
        if self.order is not None and self.delay < JITTER:
            raise ValueError(f"a delay must be >= {JITTER} turns, got {self.delay}")


@dataclass(frozen=True)
class Trained:
    shard: Shard  # holds the trained model
    layout: ShardLayout
    staleness: float  # mean global steps between a push's pull and its landing

    def model_state(self, start: Trainer) -> dict:
        """Trainer.state()'s layout, of the model trained from `start`."""
        return trainer_state(self.layout, [self.shard.snapshot()], start)


def train(start: Trainer, mode: str, schedule: Schedule, row_gradient: str = "global-mean",
          sources: dict[int, Iterable[PackedBatch]] | None = None) -> Trained:
    """Train `start`'s model in mode sync, gba (M = W, the default decay) or async (M = 1,
    no decay), averaging rows by `row_gradient` (aggregation.ROW_GRADIENTS); `start`
    itself is left as it was. sources: each worker's batches (default: worker r reads
    schedule.rows of planted stream schedule.stream_base + r)."""
    gba = GBAConfig(1, NO_DECAY, row_gradient) if mode == "async" else \
        GBAConfig(schedule.workers, row_gradient=row_gradient)
    shard, layout = build_shard(start, 0, 1, gba)
    call = in_process([shard])
    clients = [PSClient(layout, f"worker{r}/bench", max_in_flight=0, call=call) for r in range(schedule.workers)]
    config = start.config
    # Each push says the configured batch, as gba-worker's do: a source's short last batch
    # weighs its samples as a full one's.
    computer = GradientComputer(config.build_model(start.spec, PackingPlan.from_spec(start.spec)), schedule.batch_size)
    if sources is None:
        sources = {r: planted_batches(start.spec, schedule.rows, schedule.batch_size, schedule.stream_base + r)
                   for r in range(schedule.workers)}
    streams = {r: iter(batches) for r, batches in sources.items()}
    rng = random.Random(schedule.order)
    in_flight = []  # (turn it lands at, worker, pulled, gradient, positions)
    staleness = []
    turn = 0
    while streams or in_flight:
        if streams:
            live = sorted(streams)
            worker = live[turn % len(live)] if schedule.order is None else rng.choice(live)
            batch = next(streams[worker], None)
            if batch is None:
                del streams[worker]
            else:
                tensors = batch.to_torch()
                needed = computer.rows_needed(tensors)
                pulled = clients[worker].pull(needed)
                gradient = computer.compute(tensors, pulled.dense, needed, pulled.values)
                lands = turn if schedule.order is None else turn + schedule.delay + rng.randint(-JITTER, JITTER)
                in_flight.append((lands, worker, pulled, gradient, batch.positions))
        turn += 1
        in_flight.sort(key=lambda flight: flight[0])
        while in_flight and (in_flight[0][0] <= turn or not streams):
            _, worker, pulled, gradient, positions = in_flight.pop(0)
            staleness.append(shard.control.step - pulled.tokens[0])
            clients[worker].push(pulled, gradient, positions)
    return Trained(shard, layout, sum(staleness) / len(staleness))


def warm_up(start: Trainer, workers: int, batch_size: int, rows: int, stream_base: int, root: Path) -> str:
    """Continuous training's starting point: `start`'s model trained in sync on `rows`
    samples per worker, saved under root as a checkpoint (optimizer state and positions
    included) that `picasso ps`, `sync-worker` and Trainer.restore resume from."""
    trained = train(start, "sync", Schedule(workers, batch_size, rows, stream_base))
    snapshot = trained.shard.snapshot()
    return save_checkpoint(root, trained.model_state(start), start.spec, snapshot.positions, {"mode": "sync"})
