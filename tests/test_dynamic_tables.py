"""Dynamic tables in training: every admitted id its own row, admission by count, eviction
by age and when full, fresh rows for new ids, and the same model with or without
interleaving, the cache, or a restart from a checkpoint."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from picasso import kernels
from picasso.batch import pack
from picasso.cache import CacheConfig
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.dynamic_rows import initial_rows
from picasso.kernels import id_map_reference
from picasso.kernels.id_map_reference import EMPTY_KEY
from picasso.packing import PackingPlan
from picasso.spec import FeatureSpec, parse_spec
from picasso.trainer import TrainConfig, Trainer


def make_spec(item: dict, **extra) -> FeatureSpec:
    return parse_spec({"name": "dynamic", "label": "y", "dense": ["d"], "sparse": [
        {"name": "item", "embedding_dim": 4, "dynamic": item},
        {"name": "c", "embedding_dim": 4, "hash_buckets": 30},  # shares the item's table (one dim)
        {"name": "tags", "embedding_dim": 8, "max_len": 3, "pooling": "mean", "dynamic": {"capacity": 30}},
        *extra.get("more", []),
    ]})


def batch_of(spec, items, position: int, tags=None, seed: int = 0):
    """A packed batch of these item ids (and random tags, labels and dense values)."""
    rng = np.random.default_rng([seed, position])
    n = len(items)
    tags = tags if tags is not None else [[f"t{t}" for t in rng.integers(0, 60, rng.integers(0, 4))] for _ in items]
    table = pa.table({"y": (rng.random(n) < 0.3).astype(np.int64), "d": rng.random(n), "item": pa.array(items),
                      "c": rng.integers(0, 100, n), "tags": pa.array(tags, pa.list_(pa.string()))})
    decoded = RecordDecoder(spec).decode_table(table, "s")
    assert decoded.dead_letters == []
    return pack(decoded.table, spec, PackingPlan.from_spec(spec), {"s": position})


def stream(spec, batches: int = 24, size: int = 48, seed: int = 0):
    """Batches whose items churn: each draws from a window of ids that moves on."""
    rng = np.random.default_rng(seed)
    return [batch_of(spec, (rng.integers(0, 60, size) + 7 * i).tolist(), (i + 1) * size, seed=seed)
            for i in range(batches)]


def item_map(trainer):
    return trainer.model.dynamic_rows.maps[0]


def live_keys(field) -> dict[int, int]:
    """key -> row of every live row."""
    return {int(k): row for row, k in enumerate(field.row_keys.tolist()) if k != EMPTY_KEY}


def rows_of(trainer, keys) -> list[int]:
    """The table rows the model reads for item keys, through the whole resolve."""
    spec = trainer.spec
    batch = batch_of(spec, list(keys), 0, tags=[[] for _ in keys]).to_torch()
    resolved, _ = trainer.model.resolve(batch)
    group = next(g for g in trainer.plan.groups if "item" in g.fields)
    return resolved.ids[group.name].view(len(keys), group.num_fields)[:, group.fields.index("item")].tolist()


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0) for k in a)


def test_admitted_ids_never_share_a_row_and_the_rest_share_the_default_row():
    spec = make_spec({"capacity": 40, "when_full": "refuse"})
    trainer = Trainer(spec, TrainConfig(hidden=(8,)))
    trainer.train(stream(spec, batches=6))
    field = item_map(trainer)
    live = live_keys(field)
    assert len(live) == 40 == field.live_rows  # full, and every live row a distinct key
    assert len(set(live.values())) == len(live)
    offset = trainer.plan.groups[0].row_offsets[trainer.plan.groups[0].fields.index("item")]
    assert rows_of(trainer, live) == [offset + row for row in live.values()]
    unseen = [10**12, 10**12 + 1]
    assert rows_of(trainer, unseen) == [offset + field.default_row] * 2
    assert field.stats.default_lookups > 0 and field.stats.admitted == 40


def test_an_id_is_admitted_once_it_has_been_seen_admit_after_times():
    spec = make_spec({"capacity": 10, "admit_after": 3})
    trainer = Trainer(spec, TrainConfig(hidden=(8,)))
    field = item_map(trainer)
    for seen in range(1, 4):
        trainer.train_step(batch_of(spec, [77, 5, 5, 5], seen))
        admitted = live_keys(field)
        assert 5 in admitted  # three times in the first batch
        assert (77 in admitted) == (seen >= 3), seen


def test_rows_unseen_for_evict_after_steps_are_freed_but_keep_rows_stay():
    spec = make_spec({"capacity": 10, "evict_after_steps": 2, "keep_rows": 3})
    trainer = Trainer(spec, TrainConfig(hidden=(8,)))
    field = item_map(trainer)
    trainer.train_step(batch_of(spec, [1, 2, 3, 4, 5], 1))  # batch 0
    trainer.train_step(batch_of(spec, [6], 2))  # batch 1
    trainer.train_step(batch_of(spec, [6], 3))  # batch 2: 1-5 last seen 2 batches ago, kept
    assert set(live_keys(field)) == {1, 2, 3, 4, 5, 6}
    trainer.train_step(batch_of(spec, [6], 4))  # batch 3: 1-5 expire, but 3 live rows must stay
    assert set(live_keys(field)) == {4, 5, 6}  # the oldest go first, lowest row first
    assert field.stats.evicted_by_age == 3 and field.live_rows == 3
    trainer.train_step(batch_of(spec, [9, 10], 5))  # freed rows are taken again, last freed first
    assert live_keys(field)[9] == 2 and live_keys(field)[10] == 1


def test_when_full_lfu_takes_the_least_counted_row_the_last_batches_did_not_use():
    spec = make_spec({"capacity": 4})
    trainer = Trainer(spec, TrainConfig(hidden=(8,)))
    field = item_map(trainer)
    trainer.train_step(batch_of(spec, [1, 1, 1, 2, 3, 3, 4, 4], 1))  # counts 3, 1, 2, 2
    trainer.train_step(batch_of(spec, [4], 2))
    trainer.train_step(batch_of(spec, [5, 6], 3))  # 4 was used by the batch before: never a victim
    assert set(live_keys(field)) == {1, 4, 5, 6}  # 2 (count 1), then 3 (count 2, older than 4's)
    assert field.stats.evicted_when_full == 2
    refuse = make_spec({"capacity": 4, "when_full": "refuse"})
    trainer = Trainer(refuse, TrainConfig(hidden=(8,)))
    trainer.train_step(batch_of(refuse, [1, 2, 3, 4], 1))
    trainer.train_step(batch_of(refuse, [5, 5], 2))
    assert set(live_keys(item_map(trainer))) == {1, 2, 3, 4}
    assert item_map(trainer).stats.default_lookups == 2 and item_map(trainer).stats.refused == 1


def test_a_new_key_starts_from_its_own_first_values_even_on_a_reused_row():
    """With a zero learning rate rows never move, so each row holds exactly the values it
    was given when its key took it: those of the key, not of the key before."""
    spec = make_spec({"capacity": 6})
    trainer = Trainer(spec, TrainConfig(hidden=(8,), lr_sparse=0.0))
    trainer.train(stream(spec, batches=10, size=8))
    field = item_map(trainer)
    assert field.stats.evicted_when_full > 0  # rows did change hands
    group = trainer.plan.groups[0]
    offset = group.row_offsets[group.fields.index("item")]
    table = trainer.model.embedding.tables[group.name]
    live = live_keys(field)
    keys = torch.tensor(list(live), dtype=torch.int64)
    rows = torch.tensor(list(live.values())) + offset
    assert torch.equal(table[rows], initial_rows(keys, 4, trainer.model.embedding.init_scale))
    assert not trainer.model.wide_embedding.tables[group.name][rows].any()  # the wide part starts at zero


def test_reset_rows_zeroes_the_optimizer_slots():
    spec = make_spec({"capacity": 6})
    trainer = Trainer(spec, TrainConfig(hidden=(8,), sparse_optimizer="adam"))
    embedding = trainer.model.embedding
    group = trainer.plan.groups[0].name
    for slot in embedding.slots(group):
        slot.fill_(1.0)
    targets, keys = torch.tensor([2, 4]), torch.tensor([11, 12])
    embedding.reset_rows(group, targets, keys)
    assert all(not slot[targets].any() and slot[0].eq(1).all() for slot in embedding.slots(group))
    assert torch.equal(embedding.tables[group][targets], initial_rows(keys, 4, embedding.init_scale))


def test_the_default_row_trains():
    spec = make_spec({"capacity": 2, "when_full": "refuse"})
    trainer = Trainer(spec, TrainConfig(hidden=(8,)))
    group = trainer.plan.groups[0]
    default = group.row_offsets[group.fields.index("item")] + item_map(trainer).default_row
    before = trainer.model.embedding.tables[group.name][default].clone()
    trainer.train(stream(spec, batches=3, size=16))
    assert not torch.equal(before, trainer.model.embedding.tables[group.name][default])


def test_evaluation_reads_the_maps_without_changing_them():
    spec = make_spec({"capacity": 20, "admit_after": 2, "evict_after_steps": 3})
    trainer = Trainer(spec, TrainConfig(hidden=(8,)))
    batches = stream(spec, batches=5)
    trainer.train(batches)
    before = {k: v.clone() for k, v in trainer.model.dynamic_rows.state_dict().items()}
    trainer.evaluate(stream(spec, batches=3, seed=9))
    after = trainer.model.dynamic_rows.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


SETTINGS = {"capacity": 70, "admit_after": 2, "evict_after_steps": 3, "keep_rows": 5}


@pytest.mark.parametrize("cache", [None, CacheConfig(capacity="8", refresh_every=3)], ids=["tables", "cache"])
def test_interleaving_the_cache_and_a_restart_train_the_same_model(cache, tmp_path):
    spec = make_spec(SETTINGS)
    batches = stream(spec, batches=20)
    plain = Trainer(spec, TrainConfig(hidden=(8,), interleave=False))
    plain.train(batches)
    config = TrainConfig(hidden=(8,), interleave=True, cache=cache)
    first = Trainer(spec, config)
    first.train(batches[:9])
    path = first.save_checkpoint(tmp_path)
    resumed = Trainer(spec, config)
    resumed.restore(path)
    resumed.train(batches[9:])
    expected, got = plain.state()["model"], resumed.state()["model"]
    assert max_difference(expected, got) <= 1e-6
    for key in expected:  # the maps themselves are equal exactly
        if "dynamic_rows" in key:
            assert torch.equal(expected[key], got[key]), key
    assert item_map(plain).stats.evicted_by_age > 0 and item_map(plain).stats.admitted > 70


@pytest.mark.parametrize("seed, settings", [
    (0, {"capacity": 25, "admit_after": 2, "evict_after_steps": 2, "keep_rows": 4}),
    (1, {"capacity": 12, "when_full": "refuse", "evict_after_steps": 3}),
    (2, {"capacity": 9, "admit_after": 3}),
    (3, {"capacity": 40, "evict_after_steps": 1, "keep_rows": 40}),
])
def test_training_on_the_cpp_map_equals_training_on_the_reference(monkeypatch, seed, settings):
    """Randomized streams through whole training steps: the same rows, weights and
    evictions whichever implementation of the map runs."""
    spec = make_spec(settings)
    batches = stream(spec, batches=14, size=40, seed=seed)
    cpp = Trainer(spec, TrainConfig(hidden=(8,), seed=seed))
    cpp.train(batches)
    host_op, referenced = kernels._host_op, []

    def reference_map(name: str):
        if not name.startswith("id_map_"):
            return host_op(name)
        referenced.append(name)
        return getattr(id_map_reference, name.removeprefix("id_map_"))

    monkeypatch.setattr(kernels, "_host_op", reference_map)
    reference = Trainer(spec, TrainConfig(hidden=(8,), seed=seed))
    reference.train(batches)
    assert {"id_map_resolve", "id_map_reset_rows"} <= set(referenced)
    expected, got = cpp.state()["model"], reference.state()["model"]
    assert all(torch.equal(expected[key], got[key]) for key in expected), [
        key for key in expected if not torch.equal(expected[key], got[key])]
    assert [m.stats for m in cpp.model.dynamic_rows.maps] == [m.stats for m in reference.model.dynamic_rows.maps]
    stats = cpp.model.dynamic_rows.maps[0].stats
    assert stats.admitted > settings["capacity"] and stats.evicted_by_age + stats.evicted_when_full + stats.refused > 0
