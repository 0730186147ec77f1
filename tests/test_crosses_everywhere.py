"""Feature crosses on every path after decoding: local training (with and without the hot-row
cache, hashed and dynamic crosses) moves a cross's rows in the embeddings of the model's
part it feeds and in no other; GBA over the parameter server and sync all-reduce train the
cross tables as a Trainer does; checkpoints, deltas and the served pyfunc keep them; models
without a wide part refuse a wide-only cross; and a checkpoint made before crosses existed
still loads."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import mlflow
import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mlflow.tracking import MlflowClient

from picasso.batch import pack
from picasso.cache import CacheConfig
from picasso.checkpoint import load_checkpoint
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.serving.publishing.delta_store import download_delta, download_weights, rebuild_version
from picasso.serving.publishing.model_delta import load_delta
from picasso.serving.publishing.publication import publish
from picasso.connectors.testing.loopback import free_port
from picasso.connectors.testing.param_server import in_process
from picasso.distributed import wire
from picasso.distributed.gba import GBAConfig
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.param_server import JobDescription
from picasso.distributed.ps_checkpoint import build_shard, save_ps_checkpoint
from picasso.distributed.ps_client import PSClient
from picasso.distributed.row_cache import CachedPSClient, RowCacheConfig
from picasso.distributed.staleness import NO_DECAY
from picasso.distributed.sync import SyncReplica
from picasso.distributed.worker import GBAWorker
from picasso.kernels.id_map_reference import EMPTY_KEY
from picasso.packing import PackedGroup, PackingPlan
from picasso.serving.request_decoding import decode_request
from picasso.serving.weights import file_sha256, load_weights, serving_state
from picasso.spec import FeatureSpec, parse_spec
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.trainer import TrainConfig, Trainer

from helpers import planted_batches
from publish_helpers import CheckpointMaker, fresh_target, request
from test_trainer import assert_state_equal

FIELDS = [
    {"name": "a", "embedding_dim": 8, "hash_buckets": 60},
    {"name": "b", "embedding_dim": 8, "vocab_size": 5},
    {"name": "tags", "embedding_dim": 4, "hash_buckets": 40, "max_len": 3},
]
# The lookups of the models' wide parts (a weight per id): Wide&Deep's and DeepFM's.
WIDE_LOOKUPS = {"wide_embedding", "first_order"}
# fp32, not auto: these tests hold modes to one big batch exactly, which bf16 rounds apart.
CONFIG = TrainConfig(hidden=(8,), lr_dense=0.01, lr_sparse=0.1, log_every=0, device="cpu", interleave=False,
                     precision="fp32")
# Small enough that batches miss and refreshes evict.
SMALL_CACHE = CacheConfig(capacity="10%", refresh_every=2)
BATCH = 64


def cross_spec(part: str, dynamic: bool = False) -> FeatureSpec:
    """FIELDS and one cross `x` of a and tags, feeding `part`: hashed, or dynamic with room
    for every key the tests' batches bring (a row that changed hands under LFU may end a
    step as it began: Adagrad's first step on a row is lr times the gradient's sign)."""
    vocabulary = {"dynamic": {"capacity": 1000}} if dynamic else {"hash_buckets": 200}
    dim = {} if part == "wide" else {"embedding_dim": 4}
    return parse_spec({"name": f"cross-{part}", "label": "click", "dense": ["d"], "sparse": FIELDS, "crosses": [
        {"name": "x", "fields": ["a", "tags"], "part": part, **dim, **vocabulary}]})


def mixed_spec(dynamic: bool = True) -> FeatureSpec:
    """FIELDS and a cross of each part (the wide one by default), and with `dynamic` a
    dynamic wide cross in a group of its own (so the hashed groups compare row for row
    where the parameter server moves a dynamic table's ids to their owners' rows)."""
    crosses = [{"name": "ab", "fields": ["a", "b"], "hash_buckets": 300},
               {"name": "a_tags", "fields": ["a", "tags"], "hash_buckets": 200, "part": "deep", "embedding_dim": 4},
               {"name": "b_tags", "fields": ["b", "tags"], "hash_buckets": 100, "part": "both", "embedding_dim": 8}]
    if dynamic:
        crosses.append({"name": "dyn", "fields": ["b", "a"], "dynamic": {"capacity": 120}, "group": "dyn_wide"})
    return parse_spec({"name": "mixed-crosses" + ("-dynamic" if dynamic else ""), "label": "click", "dense": ["d"],
                       "sparse": FIELDS, "crosses": crosses})


def group_of(plan: PackingPlan, name: str) -> tuple[PackedGroup, int]:
    """A field's or cross's packed group and its place among the group's fields."""
    for group in plan.groups:
        if name in group.fields:
            return group, group.fields.index(name)
    raise KeyError(name)


def feeds(lookup: str, part: str) -> bool:
    """Whether a model's lookup (its PackedEmbedding attribute) has a table of a cross of `part`."""
    return part == "both" or (part == "wide") == (lookup in WIDE_LOOKUPS)


def rows_looked_up(trainer: Trainer, batch, name: str) -> set[int]:
    """The table rows of feature `name` that the batch looks up (a dynamic feature's keys
    mapped to their rows as they are now, nothing admitted)."""
    group, position = group_of(trainer.plan, name)
    ids = trainer.model.resolve(batch.to_torch())[0].ids[group.name]
    start = group.row_offsets[position]
    end = group.row_offsets[position + 1] if position + 1 < group.num_fields else group.num_rows
    return set(ids[(ids >= start) & (ids < end)].tolist())


def changed_rows(before: torch.Tensor, after: torch.Tensor) -> set[int]:
    return set((before != after).any(dim=1).nonzero().flatten().tolist())


def model_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The trainer's model state, copied (a cache's tables flushed first: Trainer.state)."""
    return {key: value.clone() for key, value in trainer.state()["model"].items()}


def assert_close_states(got: dict, want: dict, where: str) -> None:
    assert got.keys() == want.keys(), where
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6, msg=lambda m: f"{where}: {key}: {m}")


def cross_tables(state: dict) -> list[str]:
    """The state's tables of groups that hold crosses alone (the fields' groups are others)."""
    return [key for key in state if ".table_" in key and key.rsplit("table_", 1)[1] in
            ("wide_crosses", "deep_crosses_dim4", "dyn_wide")]


# -- local training ------------------------------------------------------------------------

LOCAL = [(model, part) for model in ("wide_deep", "deepfm") for part in ("wide", "deep", "both")] + \
        [(model, part) for model in ("dlrm", "dcn_v2") for part in ("deep", "both")]


@pytest.mark.parametrize("dynamic", [False, True], ids=["hashed", "dynamic"])
@pytest.mark.parametrize("cache", [False, True], ids=["tables", "cache"])
@pytest.mark.parametrize("model, part", LOCAL)
def test_a_local_step_moves_the_crosss_rows_in_the_embeddings_of_its_part_alone(model, part, cache, dynamic):
    """Every row of the cross the batch looks up changes in each embedding that holds the
    cross's group, and no other row of the cross; the embeddings of the other part have no
    table of the group at all. With the cache, training is the uncached training."""
    spec = cross_spec(part, dynamic)
    config = replace(CONFIG, model=model)
    trainer = Trainer(spec, replace(config, cache=SMALL_CACHE) if cache else config)
    batches, _ = planted_batches(spec, 5 * BATCH, BATCH)
    for batch in batches[:-1]:  # through the cache's refreshes, and the dynamic cross's admissions
        trainer.train_step(batch)
    before = model_state(trainer)
    trainer.train_step(batches[-1])
    after = model_state(trainer)

    group, position = group_of(trainer.plan, "x")
    assert group.part == part
    lookups = trainer.model.lookups
    having = {name for name in lookups if getattr(trainer.model, name).has_group(group.name)}
    assert having == {name for name in lookups if feeds(name, part)} and having
    start = group.row_offsets[position]
    looked_up = {row - start for row in rows_looked_up(trainer, batches[-1], "x")}
    assert len(looked_up) > 10
    rows_of_x = spec.sparse_field("x").num_rows
    for name in lookups:
        key = f"{name}.table_{group.name}"
        if name not in having:
            assert key not in after, key
            continue
        moved = changed_rows(before[key][start:start + rows_of_x], after[key][start:start + rows_of_x])
        assert moved == looked_up, key
    if cache:
        assert len(trainer.cache.tables[group.name]) == len(having)
        plain = Trainer(spec, config)
        plain.train(batches)
        assert_close_states(after, model_state(plain), "cached against uncached")


@pytest.mark.parametrize("model", ["dlrm", "dcn_v2"])
def test_a_model_without_a_wide_part_refuses_a_wide_only_cross(model):
    with pytest.raises(ValueError, match=rf"model '{model}' has no wide part, which cross\(es\) x feed alone"):
        Trainer(cross_spec("wide"), replace(CONFIG, model=model))


# -- the parameter server, and the endless job's worker --------------------------------------

def on_two_shards(trainer: Trainer, gba: GBAConfig = GBAConfig.plain_async()):
    """Two shards in this process built from `trainer`, their layout and a worker's client."""
    built = [build_shard(trainer, s, 2, gba) for s in range(2)]
    servers, layout = [shard for shard, _ in built], built[0][1]
    return servers, layout, PSClient(layout, "worker0/a", max_in_flight=0, call=in_process(servers))


def computer_for(trainer: Trainer, batch_size: int = 0) -> GradientComputer:
    return GradientComputer(trainer.config.build_model(trainer.spec, PackingPlan.from_spec(trainer.spec)), batch_size)


def assert_cross_tables_trained(state: dict, trainer: Trainer) -> None:
    """The part-only cross groups' tables (wide_crosses and deep_crosses_dim4, in one
    embedding each) moved from where a fresh model of `trainer`'s starts."""
    initial = model_state(Trainer(trainer.spec, trainer.config))
    assert len(cross_tables(initial)) == 2
    assert all(not torch.equal(initial[key], state[key]) for key in cross_tables(initial))


@pytest.mark.parametrize("model", ["wide_deep", "deepfm"])
def test_gba_on_two_shards_trains_the_crosses_as_the_trainer_does(model, tmp_path):
    """One worker, M = 1, every push answered before the next pull: each step is the
    Trainer's, for the cross tables of every part too. The worker sends its scores as an
    endless job's does, and the shards' checkpoint restores into a Trainer that predicts as
    the local one."""
    spec = mixed_spec(dynamic=False)
    config = replace(CONFIG, model=model)
    batches, _ = planted_batches(spec, 5 * BATCH, BATCH)
    local = Trainer(spec, config)
    scores = []
    for batch in batches[:4]:
        scores.append(torch.from_numpy(local.predict(batch)))
        local.train_step(batch)

    start = Trainer(spec, config)
    servers, layout, client = on_two_shards(start)
    # What a joining worker (the endless job's too) builds its model from, as it travels.
    description = JobDescription(spec, config, layout, lease_s=10.0, prequential=True)
    assert wire.decode(wire.encode(description)) == description
    stats = GBAWorker(client, computer_for(start), prequential=True).train(batches[:4])
    assert stats.batches == 4 and stats.refused == 0
    snapshots = [s.snapshot() for s in servers]
    torch.testing.assert_close(snapshots[0].window.scores, torch.cat(scores), atol=1e-5, rtol=0)
    path, state = save_ps_checkpoint(tmp_path, layout, snapshots, start, {})
    assert_close_states(state["model"], model_state(local), f"{model} on the shards")
    assert_cross_tables_trained(state["model"], local)
    resumed = Trainer(spec, config)
    resumed.restore(path)
    np.testing.assert_allclose(resumed.predict(batches[4]), local.predict(batches[4]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", ["wide_deep", "deepfm"])
def test_a_worker_behind_the_row_cache_trains_the_crosses_as_one_big_batch(model):
    """M = 4 local batches a global step, one worker: between steps the shards' rows do
    not move, so the row cache serves hot rows even at bound 0, and each step is a
    Trainer's on the four batches concatenated."""
    spec = mixed_spec(dynamic=False)
    config = replace(CONFIG, model=model)
    batches, _ = planted_batches(spec, 8 * BATCH, BATCH)
    local = Trainer(spec, replace(config, loss_batch_size=4 * BATCH))
    local.train(planted_batches(spec, 8 * BATCH, 4 * BATCH)[0])

    start = Trainer(spec, config)
    servers, layout, client = on_two_shards(start, GBAConfig(4, NO_DECAY))
    cached = CachedPSClient(client, RowCacheConfig(capacity="50%", max_staleness=0, refresh_every=1))
    assert GBAWorker(cached, computer_for(start, BATCH)).train(batches).refused == 0
    assert cached.stats.rows_served > 0
    state = layout.merge([s.snapshot().tensors for s in servers])
    assert_close_states(state, model_state(local), f"{model} behind the row cache")
    assert_cross_tables_trained(state, local)


def values_by_key(trainer: Trainer, name: str) -> dict[str, dict[int, torch.Tensor]]:
    """A dynamic feature's rows by key, in every embedding that holds its group."""
    members = trainer.model.dynamic_rows.members
    member = next(m for m in members if m.field.field.name == name)
    keys = member.field.row_keys.tolist()
    out = {}
    for lookup, embedding in zip(trainer.model.lookups, trainer.model.embeddings()):
        if embedding.has_group(member.group):
            table = embedding.tables[member.group]
            out[lookup] = {k: table[member.row_offset + r] for r, k in enumerate(keys) if k != EMPTY_KEY}
    return out


@pytest.mark.parametrize("model", ["wide_deep", "deepfm"])
def test_gba_on_two_shards_trains_a_dynamic_cross_as_the_trainer_does(model):
    """The shards own the dynamic cross's keys and give them rows of their own stripes, in
    the wide part's table alone: every key's row ends as the Trainer's, and the hashed
    tables row for row."""
    spec = mixed_spec(dynamic=True)
    config = replace(CONFIG, model=model)
    batches, _ = planted_batches(spec, 5 * BATCH, BATCH)
    local = Trainer(spec, config)
    local.train(batches[:4])

    start = Trainer(spec, config)
    servers, layout, client = on_two_shards(start)
    (dynamic,) = layout.dynamic
    assert [key.split(".")[0] for key in dynamic.tables] == list(WIDE_LOOKUPS & set(local.model.lookups))
    assert GBAWorker(client, computer_for(start)).train(batches[:4]).batches == 4

    merged = Trainer(spec, config)
    merged.model.load_state_dict(layout.merge([s.snapshot().tensors for s in servers]))
    ours, theirs = values_by_key(merged, "dyn"), values_by_key(local, "dyn")
    assert ours.keys() == theirs.keys() and len(ours) == 1
    for lookup in ours:
        assert ours[lookup].keys() == theirs[lookup].keys() and len(ours[lookup]) > 10
        assert max(float((ours[lookup][k] - theirs[lookup][k]).abs().max()) for k in ours[lookup]) <= 1e-5
    merged_state, local_state = model_state(merged), model_state(local)
    hashed = [key for key in local_state if ".table_" in key and not key.endswith("table_dyn_wide")]
    assert_close_states({k: merged_state[k] for k in hashed}, {k: local_state[k] for k in hashed}, "hashed tables")
    np.testing.assert_allclose(merged.predict(batches[4]), local.predict(batches[4]), rtol=1e-5, atol=1e-6)


# -- sync all-reduce ---------------------------------------------------------------------------

SYNC_MODELS = ("wide_deep", "deepfm")
SYNC_STEPS = 3


def _sync_steps(world: int):
    """Per global step, each rank's local batch and the concatenation of them all."""
    spec = mixed_spec(dynamic=False)
    plan = PackingPlan.from_spec(spec)
    table, _ = PlantedModel(spec).sample(SYNC_STEPS * world * BATCH, 3)
    decoded = RecordDecoder(spec).decode_table(table, "planted").table
    steps = []
    for step in range(SYNC_STEPS):
        at = step * world * BATCH
        steps.append(([pack(decoded.slice(at + r * BATCH, BATCH), spec, plan) for r in range(world)],
                      pack(decoded.slice(at, world * BATCH), spec, plan)))
    return steps


def _sync_rank(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        spec, steps, states = mixed_spec(dynamic=False), _sync_steps(world), {}
        for model in SYNC_MODELS:
            replica = SyncReplica(Trainer(spec, replace(CONFIG, model=model, loss_batch_size=BATCH)), rank, world)
            states[model] = []
            for locals_, _ in steps:
                replica.step(locals_[rank])
                state = replica.state()
                states[model].append({"model": {key: value.clone() for key, value in state["model"].items()},
                                      "dense_optimizer": state["dense_optimizer"]})
        if rank == 0:
            torch.save(states, f"{out}/states.pt")
    finally:
        dist.destroy_process_group()


def test_sync_steps_the_cross_tables_as_one_trainer_step_on_the_concatenated_batch(tmp_path):
    world = 2
    mp.spawn(_sync_rank, args=(world, free_port(), str(tmp_path)), nprocs=world, join=True)
    synced = torch.load(tmp_path / "states.pt")
    spec, steps = mixed_spec(dynamic=False), _sync_steps(world)
    for model in SYNC_MODELS:
        config = replace(CONFIG, model=model, loss_batch_size=world * BATCH)
        for step, (_, concatenated) in enumerate(steps):
            # From the replica's state before the step: rounding does not compound over steps.
            trainer = Trainer(spec, config)
            if step:
                trainer.model.load_state_dict(synced[model][step - 1]["model"])
                trainer.dense_optimizer.load_state_dict(synced[model][step - 1]["dense_optimizer"])
            trainer.train_step(concatenated)
            assert_close_states(synced[model][step]["model"], model_state(trainer), f"{model}, step {step}")
        assert_cross_tables_trained(synced[model][-1]["model"], trainer)


def test_sync_refuses_a_dynamic_cross():
    with pytest.raises(ValueError, match=r"a cross's `dynamic:`.* not in sync"):
        SyncReplica(Trainer(mixed_spec(dynamic=True), CONFIG), 0, 1)


# -- checkpoints ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cache", [False, True], ids=["tables", "cache"])
@pytest.mark.parametrize("model", ["wide_deep", "deepfm"])
def test_a_checkpoint_with_crosses_restores_to_the_same_predictions(model, cache, tmp_path):
    spec = mixed_spec(dynamic=True)
    config = replace(CONFIG, model=model, cache=SMALL_CACHE if cache else None)
    batches, _ = planted_batches(spec, 6 * BATCH, BATCH)
    trainer = Trainer(spec, config)
    trainer.train(batches[:4])
    restored = Trainer(spec, config)
    restored.restore(trainer.save_checkpoint(tmp_path))
    assert load_checkpoint(restored.restored_from).spec == spec
    np.testing.assert_array_equal(restored.predict(batches[4]), trainer.predict(batches[4]))
    for each in (trainer, restored):  # and they train on alike
        each.train_step(batches[5])
    assert_state_equal(model_state(restored), model_state(trainer))


# -- publishing, deltas and serving ---------------------------------------------------------

@pytest.fixture(scope="module")
def published(mlflow_server, tmp_path_factory):
    maker = CheckpointMaker(tmp_path_factory.mktemp("crosses-publish"), spec=mixed_spec(dynamic=True))
    target = fresh_target(mlflow_server)
    checkpoints = [maker.next(), maker.next()]
    refs = [publish(request(checkpoint, 0.7 + i / 100), target) for i, checkpoint in enumerate(checkpoints)]
    return target, maker, checkpoints, refs


def test_the_pyfunc_scores_raw_rows_with_crosses_as_the_trainer(published, mlflow_server):
    """The request carries the fields alone: the pyfunc's decoder computes the crosses."""
    target, maker, _, _ = published
    table, _ = PlantedModel(maker.spec).sample(60, maker.stream - 1)
    events = table.drop_columns([maker.spec.label]).to_pandas()
    assert not {c.name for c in maker.spec.crosses} & set(events.columns)
    mlflow.set_tracking_uri(mlflow_server)
    served = np.asarray(mlflow.pyfunc.load_model(f"models:/{target.model_name}/2").predict(events), dtype=np.float64)
    decoded = decode_request(RecordDecoder(maker.spec, DecodeOptions(require_label=False)), events, "error").table
    assert {c.name for c in maker.spec.crosses} <= set(decoded.column_names)
    np.testing.assert_allclose(served, maker.trainer.predict(pack(decoded, maker.spec, maker.trainer.plan)), rtol=1e-6)
    assert len(set(np.round(served, 6))) > 1


def test_a_delta_applied_gives_the_versions_cross_tables(published, mlflow_server, tmp_path):
    target, _, checkpoints, refs = published
    client = MlflowClient(mlflow_server)
    assert refs[1].delta_base == "1"
    version = client.get_model_version(target.model_name, "2")
    want = serving_state(load_checkpoint(checkpoints[1]).state["model"])
    delta = load_delta(download_delta(client, version, tmp_path / "delta"))  # the cross tables' rows travel in it
    assert len(cross_tables(want)) == 3 and set(cross_tables(want)) <= {*delta["rows"], *delta["whole"]}
    done = rebuild_version(client, target.model_name, "2", tmp_path / "rebuilt.pt")  # `picasso apply-delta --version 2`
    assert done["sha256"] == file_sha256(download_weights(client, version, tmp_path / "served"))
    rebuilt = load_weights(tmp_path / "rebuilt.pt")
    assert rebuilt.keys() == want.keys()
    for key in want:
        assert torch.equal(rebuilt[key], want[key]), key
    plan = json.load(open(client.download_artifacts(refs[1].run_id, "packing_plan.json")))
    assert {g["name"]: g["part"] for g in plan["groups"]} == {
        "deep_crosses_dim4": "deep", "dim4": "both", "dim8": "both", "wide_crosses": "wide", "dyn_wide": "wide"}


# -- a checkpoint made before crosses existed ---------------------------------------------------

BEFORE_CROSSES = Path(__file__).parent / "data" / "checkpoint-before-crosses"


def test_a_checkpoint_made_before_crosses_loads_and_predicts_as_it_did():
    """Saved by picasso at 902ba3c (make.py there says how): its spec reads as it did, with
    no crosses, and the restored model gives the probabilities that code gave."""
    path = BEFORE_CROSSES / "checkpoint"
    spec = load_checkpoint(path).spec
    assert spec.crosses == () and spec.id_features == spec.sparse
    assert spec.to_yaml() == (path / "spec.yaml").read_text()
    plan = PackingPlan.from_spec(spec)
    assert plan.for_part("deep") is plan and plan.for_part("wide") is plan
    trainer = Trainer(spec, TrainConfig(model="wide_deep", hidden=(4,), log_every=0, device="cpu", interleave=False,
                                          precision="fp32"))  # as the checkpoint was trained
    trainer.restore(path)
    rows = pa.Table.from_pylist(json.loads((BEFORE_CROSSES / "rows.json").read_text()))
    decoded = RecordDecoder(spec).decode_table(rows, "rows")
    assert decoded.dead_letters == []
    predicted = trainer.predict(pack(decoded.table, spec, trainer.plan))
    np.testing.assert_allclose(predicted, json.loads((BEFORE_CROSSES / "predictions.json").read_text()),
                               rtol=0, atol=1e-6)
