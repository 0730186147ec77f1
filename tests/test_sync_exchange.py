"""Sync mode's gradient exchange (sync.GradientExchange) between real gloo processes on
loopback: what every rank steps with is GBA's aggregate of the ranks' local batches (M = W,
no decay), the same bits on every rank, and replicas trained with it stay identical."""

from __future__ import annotations


import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from picasso.connectors.testing.loopback import free_port
from picasso.distributed.aggregation import Contribution, RowGradient
from picasso.distributed.gba import GBAConfig, TokenControl
from picasso.distributed.local_gradient import GradientComputer, LocalGradient
from picasso.distributed.ps_checkpoint import build_shard, trainer_state
from picasso.distributed.staleness import NO_DECAY
from picasso.distributed.sync import ExchangeLayout, GradientExchange, SyncReplica, TableSlot
from picasso.models import build_model
from picasso.connectors.synthetic.planted_batches import planted_batches
from picasso.trainer import Trainer

from test_gba_sync import TRAIN
from test_trainer import SPEC

STEPS = 3
DENSE = (("w", (3, 4)), ("b", (4,)), ("unused", (2,)))  # b: rank 0's batches only; unused: no rank's
TABLES = (TableSlot("emb.t4", 4, 0), TableSlot("wide.t4", 1, 0), TableSlot("emb.t2", 2, 1))
BIG = 2 ** 33  # a row id past int32: only an int64 exchange carries it
# Per row set, each rank's distinct rows: overlapping and disjoint ones, different counts,
# and in set 1 one rank (rank 1) that touches none.
ROWS = {0: ([0, 1, 2, 5], [1, 2, 3, 40], [2, 9, 10, 11, 12, 40]),
        1: ([4, 6], [], [0, 4, 7])}


def _spawn(target, world: int, *args) -> None:
    mp.spawn(target, args=(world, free_port(), *args), nprocs=world, join=True)


def _init(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def _rows(step: int, rank: int, row_set: int, id_dtype: torch.dtype) -> torch.Tensor:
    rows = list(ROWS[row_set][rank])
    if row_set == 0 and rank == 0 and step % 2:  # counts change from step to step
        rows.append(99)
    if row_set == 0 and rank == 1 and id_dtype == torch.int64:
        rows.append(BIG + step)
    return torch.tensor(sorted(rows), dtype=torch.int64)


def _local(step: int, rank: int, id_dtype: torch.dtype) -> LocalGradient:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    samples = 5 + 3 * rank + step  # uneven batches: the weighted mean is what is tested
    rows = {t.key: _rows(step, rank, t.row_set, id_dtype) for t in TABLES}
    dense = {"w": torch.randn(3, 4, generator=generator)}
    if rank == 0:
        dense["b"] = torch.randn(4, generator=generator)
    row_grads = {t.key: torch.randn(rows[t.key].numel(), t.dim, generator=generator) for t in TABLES}
    mean_loss = float(torch.rand(1, generator=generator))  # float32, as a computed loss is
    # Every rank configured with local batches of 16, all short of it: B = 16 W, which the
    # exchange's header must carry for the dense part and the rows to be divided by it.
    return LocalGradient(mean_loss * samples, samples, dense, rows, row_grads, batch_size=16)


def _positions(step: int, rank: int) -> dict[str, int]:
    positions = {f"src-{rank}": 10 * (step + 1) + rank}
    if rank == 0 and step >= 1:  # a source joins: the names are agreed anew
        positions["extra"] = 2 ** 40 + step
    return positions


def _gba(step: int, world: int, id_dtype: torch.dtype):
    """GBA's gradient of the same local batches: token control with M = world, no decay,
    every rank pulling at the step and pushing fresh."""
    control = TokenControl(GBAConfig(world, NO_DECAY), step=step)
    names = [f"rank{r}/sync" for r in range(world)]
    for name in names:
        control.pull(name)
    for rank, name in enumerate(names):
        local = _local(step, rank, id_dtype)
        sparse = {key: RowGradient(rows, local.row_grads[key], torch.zeros_like(rows))
                  for key, rows in local.rows.items()}
        _, gradient = control.push(Contribution(name, step, local.samples, local.dense, sparse,
                                                batch_size=local.batch_size),
                                   {key: torch.zeros_like(rows) for key, rows in local.rows.items()})
    return gradient


def _exchange_rank(rank: int, world: int, port: int, id_dtype: torch.dtype, out: str) -> None:
    _init(rank, world, port)
    try:
        exchange = GradientExchange(ExchangeLayout(DENSE, TABLES, id_dtype), rank, world)
        stepped = []
        for step in range(STEPS):
            got = exchange.exchange(_local(step, rank, id_dtype), _positions(step, rank), token=step)
            gradient, want = got.gradient(), _gba(step, world, id_dtype)
            assert got.positions == tuple(_positions(step, r) for r in range(world))
            assert got.loss_sum == sum(_local(step, r, id_dtype).loss_sum for r in range(world))
            assert gradient.samples == want.samples and gradient.workers == want.workers
            assert sorted(gradient.dense) == sorted(want.dense) == ["b", "w"]
            for name, value in want.dense.items():
                torch.testing.assert_close(gradient.dense[name], value, rtol=1e-6, atol=1e-7, msg=name)
            assert sorted(gradient.sparse) == sorted(want.sparse)
            for key, (rows, grads) in want.sparse.items():  # summed by aggregation itself: bit for bit
                assert torch.equal(gradient.sparse[key][0], rows), key
                assert torch.equal(gradient.sparse[key][1], grads), key
            stepped.append({"dense": gradient.dense, "sparse": gradient.sparse})
        last = None if rank == world - 1 else _local(STEPS, rank, id_dtype)  # one rank is out of batches
        assert exchange.exchange(last, _positions(STEPS, rank) if last else {}) is None
        torch.save(stepped, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world, id_dtype", [(2, torch.int32), (3, torch.int64)],
                         ids=["2-ranks-int32", "3-ranks-int64"])
def test_exchange_gives_gbas_aggregate_on_every_rank(tmp_path, world, id_dtype):
    _spawn(_exchange_rank, world, id_dtype, str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for other in ranks[1:]:  # the same bits everywhere: the replicas cannot drift apart
        for mine, theirs in zip(ranks[0], other):
            assert mine["dense"].keys() == theirs["dense"].keys()
            assert all(torch.equal(mine["dense"][k], theirs["dense"][k]) for k in mine["dense"])
            assert all(torch.equal(a, b)
                       for key in mine["sparse"] for a, b in zip(mine["sparse"][key], theirs["sparse"][key]))


def test_layout_carries_rows_as_int32_only_when_every_table_fits():
    trainer = Trainer(SPEC, TRAIN)
    shard, layout = build_shard(trainer, 0, 1, GBAConfig(2))
    computer = GradientComputer(build_model(TRAIN.model, SPEC, trainer.plan, TRAIN.hidden))
    exchange = ExchangeLayout.of(layout, shard.tensors, computer)
    assert exchange.id_dtype == torch.int32
    assert [name for name, _ in exchange.dense] == list(layout.dense)
    groups = {lookup.key: lookup.group for lookup in computer.lookups}
    for a in exchange.tables:  # one row set per packing group, whatever the embedding
        assert all((a.row_set == b.row_set) == (groups[a.key] == groups[b.key]) for b in exchange.tables)


BATCH_SIZES = (40, 50, 60)  # per rank: uneven local batches
BATCHES = 3  # each rank's; the last rank has one more, which no step can take


def _rank_batches(rank: int) -> list:
    count = BATCHES + (rank == len(BATCH_SIZES) - 1)
    return list(planted_batches(SPEC, count * BATCH_SIZES[rank], BATCH_SIZES[rank], 100 + rank))


def _replica_rank(rank: int, world: int, port: int, out: str) -> None:
    _init(rank, world, port)
    try:
        replica = SyncReplica(Trainer(SPEC, TRAIN), rank, world)
        stats = replica.train(_rank_batches(rank))
        torch.save({"model": replica.state()["model"], "stats": (stats.steps, stats.samples, stats.loss_sum),
                    "positions": replica.positions}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _fresh_gba_model(world: int) -> dict:
    """GBA on one shard in process, M = world, every rank pulling before any pushes."""
    trainer = Trainer(SPEC, TRAIN)
    shard, layout = build_shard(trainer, 0, 1, GBAConfig(world))
    computer = GradientComputer(build_model(TRAIN.model, SPEC, trainer.plan, TRAIN.hidden))
    streams = [_rank_batches(rank) for rank in range(world)]
    for step in range(BATCHES):
        work = []
        for rank, batches in enumerate(streams):
            tensors = batches[step].to_torch()
            rows = computer.rows_needed(tensors)
            work.append((f"w{rank}", tensors, rows, shard.pull(f"w{rank}", rows, dense=True)))
        for name, tensors, rows, pulled in work:
            local = computer.compute(tensors, pulled.dense, rows, pulled.rows)
            sparse = {key: RowGradient(rows[key], local.row_grads[key], pulled.versions[key]) for key in rows}
            assert shard.push(Contribution(name, pulled.token, local.samples, local.dense, sparse)).accepted
    assert shard.control.step == BATCHES
    return trainer_state(layout, [shard.snapshot()], trainer)["model"]


def test_three_replicas_with_uneven_batches_stay_identical_and_step_like_gba(tmp_path):
    world = len(BATCH_SIZES)
    _spawn(_replica_rank, world, str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    first = ranks[0]
    assert first["stats"][:2] == (BATCHES, BATCHES * sum(BATCH_SIZES))  # the last rank's extra batch: not trained
    assert first["positions"] == {f"planted-{100 + r}": BATCHES * size for r, size in enumerate(BATCH_SIZES)}
    for other in ranks[1:]:
        assert other["stats"] == first["stats"] and other["positions"] == first["positions"]
        assert all(torch.equal(first["model"][k], other["model"][k]) for k in first["model"]), "replicas differ"
    for key, value in _fresh_gba_model(world).items():
        torch.testing.assert_close(first["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)
