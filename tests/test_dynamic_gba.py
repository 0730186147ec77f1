"""Dynamic tables on the parameter server: shards own ids by hash and admit and evict them
there (picasso/distributed/dynamic_shard.py); in process against the Trainer."""

from __future__ import annotations

import pytest
import torch

from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.testing.loopback import free_port
from picasso.connectors.testing.param_server import in_process
from picasso.distributed.dynamic_shard import checkpoint_metrics, owner_of
from picasso.distributed.gba import GBAConfig
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.ps_checkpoint import build_shard, trainer_state
from picasso.distributed.ps_client import PSClient
from picasso.distributed.sync import SyncReplica
from picasso.distributed.worker import GBAWorker, WorkerStats
from picasso.kernels.id_map_reference import EMPTY_KEY
from picasso.spec import parse_spec
from picasso.trainer import TrainConfig, Trainer

from helpers import planted_batches
from test_dynamic_tables import SETTINGS, batch_of, make_spec, stream
from test_gba_ps import _finish, _ps, _worker
from test_trainer import SPEC as TRAINER_SPEC

CONFIG = TrainConfig(hidden=(8,), log_every=0, interleave=False)


def roomy_spec():
    """Rows for every id the stream brings: no shard ever runs out."""
    return parse_spec({"name": "roomy", "label": "y", "dense": ["d"], "sparse": [
        {"name": "item", "embedding_dim": 4, "dynamic": {"capacity": 400}},
        {"name": "c", "embedding_dim": 4, "hash_buckets": 30},
        {"name": "tags", "embedding_dim": 8, "max_len": 3, "pooling": "mean", "dynamic": {"capacity": 90}}]})


def on_shards(trainer: Trainer, shards: int, gba: GBAConfig = GBAConfig.plain_async()):
    built = [build_shard(trainer, s, shards, gba) for s in range(shards)]
    servers = [shard for shard, _ in built]
    return servers, built[0][1]


def gba_train(trainer: Trainer, batches, shards: int, gba: GBAConfig = GBAConfig.plain_async()):
    """The batches trained by one worker on `shards` shards started from `trainer`; the
    shards, the Trainer state they merge into and its dynamic metrics."""
    servers, layout = on_shards(trainer, shards, gba)
    client = PSClient(layout, "worker0/a", max_in_flight=0, call=in_process(servers))
    model = trainer.config.build_model(trainer.spec, trainer.plan)
    stats = GBAWorker(client, GradientComputer(model)).train(batches)
    assert stats.batches == len(batches) and stats.refused == 0
    snapshots = [s.snapshot() for s in servers]
    return servers, layout, trainer_state(layout, snapshots, trainer), checkpoint_metrics(
        layout.dynamic, [s.dynamic for s in snapshots])


def restored(spec, state) -> Trainer:
    trainer = Trainer(spec, CONFIG)
    trainer.model.load_state_dict(state["model"])
    return trainer


def rows_by_key(trainer: Trainer, field: int = 0) -> dict[int, int]:
    row_keys = trainer.model.dynamic_rows.maps[field].row_keys
    return {int(k): r for r, k in enumerate(row_keys.tolist()) if k != EMPTY_KEY}


def values_by_key(trainer: Trainer, field: int = 0) -> dict[int, torch.Tensor]:
    member = trainer.model.dynamic_rows.members[field]
    table = trainer.model.embedding.tables[member.group]
    return {k: table[member.row_offset + r] for k, r in rows_by_key(trainer, field).items()}


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_one_worker_on_the_shards_trains_like_the_trainer(shards):
    """M = 1, one worker, each push answered before the next pull: every id takes its
    first values from its key wherever its row is, so the model is the Trainer's, each id
    on a row its owner holds."""
    spec = roomy_spec()
    batches = stream(spec, batches=12, size=40)
    local = Trainer(spec, CONFIG)
    local.train(batches)
    servers, layout, state, metrics = gba_train(Trainer(spec, CONFIG), batches, shards)
    assert state["step"] == local.step
    local_metrics = local.model.dynamic_rows.metrics()
    assert {k: metrics[k] for k in local_metrics} == local_metrics  # the same counts, summed over the shards
    merged = restored(spec, state)
    for field in (0, 1):
        ours, theirs = values_by_key(merged, field), values_by_key(local, field)
        assert ours.keys() == theirs.keys() and len(ours) > 50
        assert max(float((ours[k] - theirs[k]).abs().max()) for k in ours) <= 1e-5
    probe = stream(spec, batches=2, size=40, seed=5)
    for batch in probe:
        torch.testing.assert_close(merged.predict(batch), local.predict(batch), rtol=1e-5, atol=1e-6)
    # Each id's row is on the shard that owns the id.
    for d, member in zip(layout.dynamic, merged.model.dynamic_rows.members):
        keys = torch.tensor(list(rows_by_key(merged, layout.dynamic.index(d))))
        rows = torch.tensor(list(rows_by_key(merged, layout.dynamic.index(d)).values()))
        assert torch.equal((rows + member.row_offset) % shards, owner_of(keys, shards))


def test_shards_admit_and_evict_on_their_own_rows_and_merge_into_a_trainer(tmp_path):
    spec = make_spec(SETTINGS)  # admission at the second sighting, eviction after 3 steps, 70 rows
    batches = stream(spec, batches=20)
    servers, layout, state, metrics = gba_train(Trainer(spec, CONFIG), batches, shards=3)
    item = layout.dynamic[0]
    assert metrics["dynamic_item_evicted_by_age"] > 0 and metrics["dynamic_item_admitted"] > item.capacity
    assert all(s.maps.fields["item"].stats.admitted == 0 for s in servers)  # a snapshot takes the counts
    for index, server in enumerate(servers):
        field = server.maps.fields["item"]
        live = field.row_keys[field.row_keys != EMPTY_KEY]
        assert bool((owner_of(live, 3) == index).all())  # a shard maps only its own ids
        assert field.capacity == item.local_capacity(index, 3) and field.live_rows <= field.capacity
    merged = restored(spec, state)
    assert len(rows_by_key(merged)) == sum(s.maps.fields["item"].live_rows for s in servers)
    # The merged maps split into the shards' again: every id on its row, with its counts
    # (the free rows' order and the index's layout are made afresh).
    for part, server in zip(layout.split(state["model"]), servers):
        for name in ("row_keys", "last_seen", "counts"):
            assert torch.equal(part[f"{item.prefix}.{name}"], server.tensors[f"{item.prefix}.{name}"]), name
    merged.train(stream(spec, batches=3, seed=3))  # and train on locally


def test_a_trainers_ids_move_to_their_owners_with_their_rows():
    spec = roomy_spec()
    trainer = Trainer(spec, CONFIG)
    trainer.train(stream(spec, batches=8, size=40))
    for shards in (2, 3):
        _, layout = on_shards(trainer, shards)
        merged = restored(spec, {"model": layout.merge(layout.split(trainer.state()["model"]))})
        ours, theirs = values_by_key(merged), values_by_key(trainer)
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
        batch = stream(spec, batches=1, seed=4)[0]
        torch.testing.assert_close(merged.predict(batch), trainer.predict(batch))


def test_a_shard_with_more_ids_than_rows_keeps_its_most_counted():
    spec = make_spec({"capacity": 12})
    trainer = Trainer(spec, CONFIG)
    for position in range(1, 4):  # 12 ids fill the table; 0..5 are seen three times, 6..11 once
        trainer.train_step(batch_of(spec, list(range(6)) if position > 1 else list(range(12)), position))
    _, layout = on_shards(trainer, 3)
    merged = restored(spec, {"model": layout.merge(layout.split(trainer.state()["model"]))})
    owners = owner_of(torch.arange(12), 3).tolist()
    kept = set(rows_by_key(merged))
    for shard in range(3):
        mine = [k for k in range(12) if owners[k] == shard]
        room = layout.dynamic[0].local_capacity(shard, 3)
        expected = sorted(mine, key=lambda k: (k >= 6, k))[:room]  # the most counted first
        assert kept & set(mine) == set(expected)


def test_a_shard_refuses_keys_another_shard_owns():
    spec = roomy_spec()
    servers, _ = on_shards(Trainer(spec, CONFIG), 2)
    foreign = torch.tensor([k for k in range(40) if owner_of(torch.tensor([k]), 2).item() == 1][:1])
    with pytest.raises(ValueError, match="keys of dynamic field 'item' that another shard owns"):
        servers[0].resolve("w/a", {"item": foreign}, None)


def test_sync_refuses_dynamic_tables_by_name():
    with pytest.raises(ValueError, match="dynamic tables .* train in the local and gba modes, not in sync"):
        SyncReplica(Trainer(roomy_spec(), CONFIG), 0, 1)


# -- real processes on loopback ---------------------------------------------------------------

def test_a_gba_job_over_grpc_trains_a_dynamic_table_on_its_shards(tmp_path):
    """`picasso ps` on two shards and two `gba-worker`s, with field `a` a dynamic table:
    the checkpoint restores into a Trainer whose ids sit on their owners' rows, and a
    worker that asks for the row cache is refused before it joins."""
    raw = TRAINER_SPEC.to_dict()
    for field in raw["sparse"]:
        if field["name"] == "a":
            del field["hash_buckets"]
            field["dynamic"] = {"capacity": 120, "admit_after": 2, "evict_after_steps": 4}
    spec = parse_spec(raw)
    path = tmp_path / "dynamic.yaml"
    spec.save(path)
    port = free_port(count=2)
    server = _ps(str(path), tmp_path, port, 2, 2)
    refused = _worker(port, 2, 100, "--row-cache", "64")
    code, _, err = _finish(refused)
    assert code != 0 and "dynamic table's rows change hands" in err
    workers = [_worker(port, rank, 600) for rank in range(2)]
    for code, stats, err in [_finish(w) for w in workers]:
        assert code == 0 and stats["batches"] == 6, err
    code, summary, err = _finish(server)
    assert code == 0, err
    trainer = Trainer(spec, TrainConfig(hidden=(16, 8), lr_dense=0.01, log_every=0))
    trainer.restore(latest_checkpoint(tmp_path / "checkpoints"))
    keys = rows_by_key(trainer)
    assert 20 < len(keys) <= 120
    member = trainer.model.dynamic_rows.members[0]
    rows = torch.tensor(list(keys.values())) + member.row_offset
    assert torch.equal(rows % 2, owner_of(torch.tensor(list(keys)), 2))
    assert int(trainer.model.dynamic_rows.batches) == summary["step"]
    # The version's own counts, summed over the shards, as a Trainer's checkpoint has them.
    metrics = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints")).metrics
    assert metrics["dynamic_a_live_rows"] == len(keys) and metrics["dynamic_a_fill"] == len(keys) / 120
    assert metrics["dynamic_a_admitted"] >= len(keys) and metrics["dynamic_a_lookups"] >= 1200
    assert trainer.predict(planted_batches(spec, 64, 64)[0][0]).shape == (64,)


def test_shards_evict_by_the_event_time_their_batches_carry():
    spec = make_spec({"capacity": 300, "evict_after": "1h"})  # room enough: only age evicts
    hour = 3_600_000
    batches = [batch.with_event_time(i * hour // 2) for i, batch in enumerate(stream(spec, batches=10))]
    local = Trainer(spec, CONFIG)
    local.train(batches)
    servers, _, state, metrics = gba_train(Trainer(spec, CONFIG), batches, shards=2)
    assert metrics["dynamic_item_evicted_by_age"] > 0
    assert int(state["model"]["dynamic_rows.event_time"]) == 9 * hour // 2
    merged = restored(spec, state)
    assert rows_by_key(merged).keys() == rows_by_key(local).keys()  # the same ids left, on either clock


def test_a_gradient_for_a_rows_old_key_is_dropped_once_a_new_key_took_the_row():
    """Worker A pulls key 7's row; meanwhile key 7 ages out and key 99 takes the row. A's
    late gradient still counts for the rest of its batch, but not for that row."""
    spec = make_spec({"capacity": 50, "evict_after_steps": 1})
    servers, layout = on_shards(Trainer(spec, CONFIG), 1, GBAConfig(global_batches=1))
    call = in_process(servers)

    def worker(name):
        model = CONFIG.build_model(spec, Trainer(spec, CONFIG).plan)
        return GBAWorker(PSClient(layout, name, max_in_flight=0, call=call), GradientComputer(model))

    late, busy = worker("late/a"), worker("busy/b")
    tensors = late._resolve(batch_of(spec, [7, 8], 1).to_torch())
    rows = late.computer.rows_needed(tensors)
    pulled = late.client.pull(rows)
    gradient = late.computer.compute(tensors, pulled.dense, rows, pulled.values)
    item, field = layout.dynamic[0], servers[0].maps.fields["item"]
    theirs = sorted(field.row_keys.tolist().index(k) for k in (7, 8))
    for position in range(2, 5):  # steps without 7 or 8: both age out, 20 stays
        busy.step(batch_of(spec, [20], position), WorkerStats())
    busy.step(batch_of(spec, [99, 98, 20], 5), WorkerStats())  # the new keys take the freed rows
    keys = field.row_keys.tolist()
    assert sorted(keys.index(k) for k in (98, 99)) == theirs and 7 not in keys and 8 not in keys
    table = item.tables[0]
    rows = torch.tensor(theirs) + item.row_offset
    before = servers[0].tensors[table][rows].clone()
    dense_before = servers[0].tensors[layout.dense[0]].clone()
    late.client.push(pulled, gradient)
    assert late.client.outcomes[-1].accepted and late.client.outcomes[-1].stepped
    assert torch.equal(servers[0].tensors[table][rows], before)  # the old keys' gradients left them alone
    assert not torch.equal(servers[0].tensors[layout.dense[0]], dense_before)  # the rest of it counted
